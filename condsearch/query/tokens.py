"""What a request costs the model, in tokens: long texts cut to what the model reads, and counted.

A BERT-style model reads at most ``max_length`` tokens of a (sentence, condition) pair, the
sentence cut from the right. A query of 10,000 characters is tokenised whole (three times: to
sort, to note truncation and to encode) only for most of it to be thrown away, so the server cuts
it first. The cut is exact: the model gets the same tokens, so the same vector
(``tests/serve/test_serve_tokens.py``).

Why it is exact. Tokenizers (WordPiece, BPE, SentencePiece) normalise character by character and
split words at white space before they split words into tokens, so the tokens of a prefix that ends
where a word ends and ASCII white space follows are the first tokens of the whole text. The cut
keeps such a prefix holding at least ``max_length`` tokens and more than the condition: the pair
is truncated either way, and truncation (longest first, from the right) then cuts the sentence to
the same length whether it is whole or cut, since it depends only on the condition's length once
the sentence is the longer. Only encoders over
:func:`condsearch.model.encoders.bert_inputs.case_inputs` that truncate from the right are cut; for the
others the tokens are estimated (:func:`estimate_tokens`) and nothing is cut.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from condsearch.model.encoders.bert_inputs import DEFAULT_MAX_LENGTH, TokenSorted

#: characters first tried per token before a text is counted whole: English text runs 4-5 characters
#: a token in WordPiece; a text that holds fewer tokens there is counted whole (at most twice its length)
CHARS_PER_TOKEN = 6
#: where a word ends and ASCII white space follows; BERT's normaliser removes some other "space"
#: characters (\x0b, \x1c, \x85), which therefore do not end a word
_WORD_END = re.compile(r"[^ \t\n\r](?=[ \t\n\r])")


class TextCutter:
    """Cut texts to what a model reads and count their tokens, with its own copy of the model's tokenizer.

    The copy is the point: the encoder's tokenizer sets its truncation on every call, so it cannot be
    shared with the batching thread that encodes meanwhile. ``backend``: a ``tokenizers.Tokenizer``.
    """

    def __init__(self, backend: Any, max_tokens: int) -> None:
        from tokenizers import Tokenizer

        self.max_tokens = max_tokens
        self._tokenizer = Tokenizer.from_str(backend.to_str())
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def cut(self, texts: Sequence[str], condition: str | None = None) -> tuple[list[str], list[int]]:
        """Return texts cut past the tokens the model reads beside condition, and each one's tokens (at most
        ``max_tokens``).

        A cut text keeps ``max_tokens`` tokens and more than the condition has, so that truncating the
        pair (longest first) takes the same tokens from it as from the whole text. Each long text is
        counted on a prefix of ``max_tokens * CHARS_PER_TOKEN`` characters first, whole only where that
        prefix held too few tokens, so no text is tokenised past twice its length.
        """
        need = self.max_tokens
        if condition is not None:
            need = max(need, len(self._tokenizer.encode(condition, add_special_tokens=False).ids) + 1)
        out, counts = list(texts), [0] * len(texts)
        pending = {i: _prefix_at_word_end(t, need * CHARS_PER_TOKEN) for i, t in enumerate(texts)}
        while pending:
            order = list(pending)
            encodings = self._tokenizer.encode_batch([pending[i] for i in order], add_special_tokens=False)
            again = {}
            for i, encoding in zip(order, encodings, strict=True):
                n = len(encoding.ids)
                if n >= need:
                    # where the last token to keep ends (offsets are characters of the text)
                    end = max(stop for _, stop in encoding.offsets[:need])
                    out[i], counts[i] = _prefix_at_word_end(texts[i], end), self.max_tokens
                elif len(pending[i]) == len(texts[i]):
                    counts[i] = min(n, self.max_tokens)
                else:
                    again[i] = texts[i]  # too few tokens in the prefix: count the whole text
            pending = again
        return out, counts

    def unknown_shares(self, texts: Sequence[str]) -> list[float] | None:
        """Return the share of each text's tokens that are the model's unknown token ([UNK]), or None.

        None where the tokenizer names no unknown token. A query mostly of characters outside the
        vocabulary (Chinese or emoji for an English WordPiece model) reads as [UNK]s, and its
        results, however ordinary they look, answer nothing it said. Give texts already cut.
        """
        return _unknown_shares(self._tokenizer, texts)


class UnknownCounter:
    """Count the share of [UNK] in texts for a model whose texts are not cut (a router's, :func:`unknown_counter`).

    With its own copy of the model's tokenizer, as :class:`TextCutter`; each text is counted on its first
    ``max_tokens * CHARS_PER_TOKEN`` characters at most (what the model reads, and a bound on the work).
    """

    def __init__(self, backend: Any, max_tokens: int) -> None:
        from tokenizers import Tokenizer

        self.max_chars = max_tokens * CHARS_PER_TOKEN
        self._tokenizer = Tokenizer.from_str(backend.to_str())
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()

    def unknown_shares(self, texts: Sequence[str]) -> list[float] | None:
        """Return :meth:`TextCutter.unknown_shares` of texts (each its first ``max_chars``), or None."""
        return _unknown_shares(self._tokenizer, [_prefix_at_word_end(t, self.max_chars) for t in texts])


def _unknown_shares(tokenizer: Any, texts: Sequence[str]) -> list[float] | None:
    """Return the share of each text's tokens that are tokenizer's unknown token, or None where it names none."""
    unknown = getattr(tokenizer.model, "unk_token", None)
    unknown_id = tokenizer.token_to_id(unknown) if isinstance(unknown, str) else None
    if unknown_id is None:
        return None
    encodings = tokenizer.encode_batch(list(texts), add_special_tokens=False)
    return [sum(i == unknown_id for i in e.ids) / len(e.ids) if e.ids else 0.0 for e in encodings]


def unknown_counter(encoder: object) -> UnknownCounter | None:
    """Return a counter of [UNK] for encoder's queries where its tokenizer is a fast one (a router's, issue 59), or
    None: the share is then not counted."""
    tokenizer = getattr(encoder, "tokenizer", None)
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "backend", None)
    max_length = getattr(encoder, "max_length", None)
    if backend is None or not hasattr(backend, "to_str") or not isinstance(max_length, int) or max_length <= 0:
        return None
    try:
        return UnknownCounter(backend, max_length)
    except Exception:  # noqa: BLE001 - a tokenizer that cannot be copied: the share is not counted, the query is answered
        return None


def _prefix_at_word_end(text: str, at_least: int) -> str:
    """Return text up to the first word end at or past at_least characters (all of it when none)."""
    if len(text) <= at_least:
        return text
    found = _WORD_END.search(text, max(0, at_least - 1))
    return text[: found.end()] if found else text


def text_cutter(encoder: object) -> TextCutter | None:
    """Return a cutter for encoder's tokens, or None where cutting is not known to be exact for it."""
    if not isinstance(encoder, TokenSorted):
        return None
    tokenizer = encoder.tokenizer
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "backend", None)
    max_length = getattr(encoder, "max_length", None)
    if backend is None or not isinstance(max_length, int) or max_length <= 0:
        return None
    if getattr(tokenizer, "truncation_side", "right") != "right":
        return None  # the model reads a text's end: a prefix would not do
    return TextCutter(backend, max_length)


def estimate_tokens(text: str, max_tokens: int | None) -> int:
    """Return a bound on the tokens a model reads of text, without its tokenizer (for scheduling only)."""
    return min(max_tokens or DEFAULT_MAX_LENGTH, len(text) // 2 + 1)
