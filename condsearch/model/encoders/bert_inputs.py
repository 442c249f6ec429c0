"""BERT's CASE inputs without torch: the token limit and the padded ``[CLS] s [SEP] c [SEP]`` arrays.

Shared by the torch encoder (:class:`~condsearch.model.encoders.bert.BertStyleEncoder`) and the ONNX
one (:class:`~condsearch.model.encoders.onnx.bert.OnnxBertEncoder`), so that both see the same tokens.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from condsearch.model.encoders.base import EncodeStats, Pair

# all-MiniLM-L6-v2 was trained at 256 tokens; its tokenizer claims 512.
DEFAULT_MAX_LENGTH = 512


def max_length_for(folder: str, tokenizer_limit: int, override: int | None, config: object) -> int:
    """Return the token limit: the override, else the sentence-transformers setting or the
    tokenizer's, never more than the model has position embeddings for."""
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        # RoBERTa-family models offset positions past the padding index
        if "roberta" in str(getattr(config, "model_type", "")) or "camembert" in str(getattr(config, "model_type", "")):
            positions -= 2
        cap = positions
    else:
        cap = DEFAULT_MAX_LENGTH
    if override:
        return min(override, cap)
    st_config = Path(folder) / "sentence_bert_config.json"
    if st_config.is_file():
        try:
            limit = int(json.loads(st_config.read_text()).get("max_seq_length", 0))
        except (ValueError, json.JSONDecodeError):
            limit = 0
        if limit > 0:
            return min(limit, cap)
    return min(tokenizer_limit, DEFAULT_MAX_LENGTH, cap)


def case_inputs(
    tokenizer: Any, pairs: Sequence[Pair], max_length: int, stats: EncodeStats
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Tokenize a batch of pairs; return the model inputs and the float mask of the tokens to pool.

    Inputs: name -> (n, width) int64, right-padded; mask: (n, width) float32, 1 on the condition's
    tokens (the sentence is the first segment, the condition the second) or, for a pair without a
    sentence, on the condition's own tokens. Truncated inputs are noted in ``stats``.
    """
    with_sentence = [s is not None for _, s in pairs]
    firsts, seconds = _segments(pairs)
    pooled_segment = [1 if has else 0 for has in with_sentence]
    lengths = _lengths(tokenizer, firsts, seconds)
    for (c, s), n in zip(pairs, lengths, strict=True):
        if n > max_length:
            stats.note_truncated(s if s is not None else c)
    # Singles and pairs cannot share one tokenizer call; run the two groups separately.
    rows: list[dict[str, list[int]]] = [{} for _ in pairs]
    masks: list[list[int]] = [[] for _ in pairs]
    for is_pair in (True, False):
        idx = [i for i, has in enumerate(with_sentence) if has == is_pair]
        if not idx:
            continue
        enc = tokenizer(
            [firsts[i] for i in idx],
            [seconds[i] for i in idx] if is_pair else None,
            truncation="longest_first",
            max_length=max_length,
        )
        for j, i in enumerate(idx):
            rows[i] = {k: enc[k][j] for k in enc.keys()}
            seq = enc.sequence_ids(j)
            masks[i] = [1 if sid == pooled_segment[i] else 0 for sid in seq]
    width = max(len(r["input_ids"]) for r in rows)
    pad_id = tokenizer.pad_token_id or 0
    batch: dict[str, np.ndarray] = {}
    for key in rows[0]:
        fill = pad_id if key == "input_ids" else 0
        batch[key] = np.array([r[key] + [fill] * (width - len(r[key])) for r in rows], dtype=np.int64)
    pool = np.array([m + [0] * (width - len(m)) for m in masks], dtype=np.float32)
    return batch, pool


def token_lengths(tokenizer: Any, pairs: Sequence[Pair]) -> list[int]:
    """Return each pair's untruncated token count as :func:`case_inputs` would encode it, special tokens included."""
    return _lengths(tokenizer, *_segments(pairs)) if pairs else []  # a tokenizer refuses an empty batch


class TokenSorted:
    """For encoders over :func:`case_inputs`: batches are formed by token count, not characters.

    Characters left 1.20 padded tokens per real token in batches of 64 C-STS pairs, token counts
    1.04 (benchmarks/systems/results/int8_study.md): less padding on every backend and device.
    """

    tokenizer: Any

    def sort_lengths(self, pairs: Sequence[Pair]) -> list[int]:
        return token_lengths(self.tokenizer, pairs)


def _segments(pairs: Sequence[Pair]) -> tuple[list[str], list[str | None]]:
    """Return the first and second segments: the sentence first, so the condition is the pooled second."""
    firsts = [s if s is not None else c for c, s in pairs]
    seconds = [c if s is not None else None for c, s in pairs]
    return firsts, seconds


def _lengths(tokenizer: Any, firsts: list[str], seconds: list[str | None]) -> list[int]:
    """Return untruncated token counts, special tokens included."""
    n_special_pair = tokenizer.num_special_tokens_to_add(pair=True)
    n_special = tokenizer.num_special_tokens_to_add(pair=False)
    first_ids = tokenizer(firsts, add_special_tokens=False)["input_ids"]
    distinct = list({s for s in seconds if s is not None})
    second_len = {}
    if distinct:
        second_ids = tokenizer(distinct, add_special_tokens=False)["input_ids"]
        second_len = {s: len(ids) for s, ids in zip(distinct, second_ids, strict=True)}
    return [
        len(ids) + (n_special if s is None else second_len[s] + n_special_pair)
        for ids, s in zip(first_ids, seconds, strict=True)
    ]
