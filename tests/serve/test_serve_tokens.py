"""The server cuts a long query before tokenising it: the model gets the same tokens, so the same vector.

Differential tests: a text cut by :class:`condsearch.query.tokens.TextCutter` against the text
whole, through the encoders' own inputs (:func:`condsearch.model.encoders.bert_inputs.case_inputs`,
token for token) and through a model (the vectors). Hypothesis draws texts from an alphabet of
what breaks naive cuts: white space BERT removes (\\x0b, \\x1c, \\x85), combining accents, CJK,
punctuation, words over WordPiece's 100 characters, a final sigma.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from condsearch.base.model_sources import resolve_model
from condsearch.model.encoders import load_encoder
from condsearch.model.encoders.base import EncodeStats
from condsearch.model.encoders.bert_inputs import case_inputs
from condsearch.model.encoders.spec import EncoderSpec, Runtime
from condsearch.query.tokens import CHARS_PER_TOKEN, TextCutter, estimate_tokens, text_cutter

CONDITION = "the color of the dress"
WORDS = "a girl in an orange dress serves the ball while the crowd watches from green seats".split()


def _tokenizer(folder: Path | str) -> Any:
    import transformers

    return transformers.AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="module")
def minilm_tokenizer() -> Any:
    """The bundled default model's tokenizer (all-MiniLM-L6-v2's WordPiece)."""
    return _tokenizer(resolve_model(None).location)


def _inputs(
    tokenizer: Any, text: str, max_length: int, condition: str = CONDITION
) -> tuple[dict[str, list[list[int]]], list[list[float]]]:
    batch, pool = case_inputs(tokenizer, [(condition, text)], max_length, EncodeStats())
    return {k: v.tolist() for k, v in batch.items()}, pool.tolist()


def _n_tokens(tokenizer: Any, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def _long_text(n_chars: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_chars // 3))[:n_chars]


def test_a_long_query_is_cut_to_what_the_model_reads(minilm_tokenizer: Any) -> None:
    cutter = TextCutter(minilm_tokenizer.backend_tokenizer, 256)
    long, short = _long_text(4000), "A girl in an orange dress serves the ball"
    (cut, kept), (n_cut, n_kept) = cutter.cut([long, short], CONDITION)
    assert len(cut) < len(long) / 2 and long.startswith(cut) and kept == short
    assert n_cut == 256 and n_kept == _n_tokens(minilm_tokenizer, short)
    assert _n_tokens(minilm_tokenizer, cut) >= 256  # more than the model reads
    assert _inputs(minilm_tokenizer, cut, 256) == _inputs(minilm_tokenizer, long, 256)


def test_a_text_with_few_tokens_per_character_is_counted_whole(minilm_tokenizer: Any) -> None:
    """A prefix of max_tokens * CHARS_PER_TOKEN characters holding too few tokens is not cut there."""
    cutter = TextCutter(minilm_tokenizer.backend_tokenizer, 32)
    spaced = " " * (32 * CHARS_PER_TOKEN) + _long_text(400)  # white space first: no tokens in the prefix
    unknown = "x" * 150 + " " + _long_text(400)  # a word past WordPiece's 100 characters: one [UNK]
    cuts, counts = cutter.cut([spaced, unknown], CONDITION)
    for text, cut, n in zip([spaced, unknown], cuts, counts, strict=True):
        assert text.startswith(cut) and n == 32
        assert _inputs(minilm_tokenizer, cut, 32) == _inputs(minilm_tokenizer, text, 32)


def test_cutting_does_not_change_the_vector(tiny_bert_dir: Path) -> None:
    encoder = load_encoder(EncoderSpec(str(tiny_bert_dir), max_length=48, runtime=Runtime(device="cpu")))
    cutter = text_cutter(encoder)
    assert cutter is not None and cutter.max_tokens == 48
    texts = [_long_text(3000, seed) for seed in range(3)]
    cuts, counts = cutter.cut(texts, CONDITION)
    assert all(len(c) < len(t) for c, t in zip(cuts, texts, strict=True)) and counts == [48] * 3
    whole = encoder.encode(texts, CONDITION, batch_size=1)
    cut = encoder.encode(cuts, CONDITION, batch_size=1)
    np.testing.assert_allclose(cut, whole, rtol=0, atol=1e-6)  # the same inputs, so the same vector


_ALPHABET = st.sampled_from(
    [
        *"abcdeΣσςİ",
        " ",
        "  ",
        "\t",
        "\n",
        "\r",
        "\x0b",
        "\x1c",
        "\x85",
        "\xa0",
        "\u3000",
        "\u0301",
        "\u200b",
        "é",
        "中",
        "文",
        ".",
        ",",
        "!",
        "-",
        "'",
        "x" * 120,
        "orange ",
        "dress ",
        "serves ",
    ]  # fmt: skip
)


_CUTTERS: dict[int, TextCutter] = {}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    parts=st.lists(_ALPHABET, min_size=0, max_size=120),
    condition=st.sampled_from([CONDITION, "colour", "the sport being played by the girl in the dress " * 2]),
    max_tokens=st.sampled_from([4, 8, 16]),
)
def test_any_cut_gives_the_model_the_same_tokens(
    minilm_tokenizer: Any, parts: list[str], condition: str, max_tokens: int
) -> None:
    text = "".join(parts)
    cutter = _CUTTERS.get(max_tokens) or _CUTTERS.setdefault(
        max_tokens, TextCutter(minilm_tokenizer.backend_tokenizer, max_tokens)
    )
    (cut,), (n,) = cutter.cut([text], condition)
    assert text.startswith(cut)
    assert n == min(max_tokens, _n_tokens(minilm_tokenizer, text))
    model_inputs = _inputs(minilm_tokenizer, text, max_tokens, condition)
    assert _inputs(minilm_tokenizer, cut, max_tokens, condition) == model_inputs
    (alone,), _ = cutter.cut([text])  # a text without condition
    assert _n_tokens(minilm_tokenizer, alone) >= min(max_tokens, _n_tokens(minilm_tokenizer, text))
    assert (
        minilm_tokenizer(alone, truncation=True, max_length=max_tokens)["input_ids"]
        == (minilm_tokenizer(text, truncation=True, max_length=max_tokens)["input_ids"])
    )


def test_only_encoders_known_to_cut_exactly_are_cut(hash_encoder: object) -> None:
    assert text_cutter(hash_encoder) is None
    assert estimate_tokens("x" * 10_000, 256) == 256 and estimate_tokens("short", 256) == 3
