"""CASE inputs for BERT-style encoders: the sentence steers, the condition is pooled."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from condsearch.encoders.base import Encoder, Pair
from condsearch.errors import ModelError
from condsearch.models import ModelSource

# all-MiniLM-L6-v2 was trained at 256 tokens; its tokenizer claims 512.
_DEFAULT_MAX_LENGTH = 512


def pick_device(device: str | None) -> torch.device:
    """Return the requested torch device, or CUDA when present, else the CPU."""
    from condsearch.encoders.runtime import parse_devices

    return parse_devices(device)[0]


def _max_length(folder: str, tokenizer_limit: int, override: int | None, config: object) -> int:
    """Return the token limit: the override, else the sentence-transformers setting or the
    tokenizer's, never more than the model has position embeddings for."""
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        # RoBERTa-family models offset positions past the padding index
        if "roberta" in str(getattr(config, "model_type", "")) or "camembert" in str(getattr(config, "model_type", "")):
            positions -= 2
        cap = positions
    else:
        cap = _DEFAULT_MAX_LENGTH
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
    return min(tokenizer_limit, _DEFAULT_MAX_LENGTH, cap)


class BertStyleEncoder(Encoder):
    """Encode ``[CLS] s [SEP] c [SEP]`` and mean-pool the condition's tokens only.

    With no sentence, the condition alone (``[CLS] c [SEP]``) is encoded and its
    tokens mean-pooled. Special tokens are never pooled. The sentence is the one
    truncated when a pair exceeds the model's length limit.
    """

    pooling = "condition-mean"
    #: sha256 of a LoRA adapter loaded onto the model ("" when none; see condsearch.finetune.adapter)
    adapter_checksum = ""

    def __init__(
        self,
        source: ModelSource,
        *,
        device: str | None = None,
        max_length: int | None = None,
        trust_remote_code: bool = False,
        dtype: torch.dtype | None = None,
        loaded: tuple[Any, torch.nn.Module] | None = None,
    ) -> None:
        """``loaded``: (tokenizer, model) read already, e.g. by condsearch.encoders.bert_inference."""
        super().__init__()
        if loaded is not None:
            self.tokenizer, model = loaded
        else:
            from transformers import AutoModel, AutoTokenizer

            try:
                self.tokenizer = AutoTokenizer.from_pretrained(source.location, trust_remote_code=trust_remote_code)
                model = AutoModel.from_pretrained(source.location, trust_remote_code=trust_remote_code)
            except (OSError, ValueError, KeyError) as exc:
                raise ModelError.cannot_load(source.model_id, exc) from exc
        if not getattr(self.tokenizer, "is_fast", False):
            raise ModelError(f"{source.model_id}: a fast tokenizer (tokenizer.json) is required")
        self.device = pick_device(device)
        self.dtype = dtype or torch.float32
        self.model = model.to(self.device, self.dtype).eval()
        self.model_id = source.model_id
        self.revision = source.revision
        self.dim = int(model.config.hidden_size)
        self.max_length = _max_length(source.location, self.tokenizer.model_max_length, max_length, model.config)

    def describe(self) -> dict[str, object]:
        info = {**super().describe(), "pooling": self.pooling, "max_length": self.max_length}
        if self.dtype != torch.float32:  # float32 records nothing, so existing caches and manifests still match
            info["dtype"] = str(self.dtype).removeprefix("torch.")
        if self.adapter_checksum:  # likewise: no adapter, no key
            info["adapter_checksum"] = self.adapter_checksum
        return info

    def _tokenize(self, pairs: Sequence[Pair]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Tokenize a batch and return model inputs and the float mask of pooled tokens."""
        with_sentence = [s is not None for _, s in pairs]
        # Pairs put the sentence first so that the condition is the pooled second segment.
        firsts = [s if s is not None else c for c, s in pairs]
        seconds = [c if s is not None else None for c, s in pairs]
        pooled_segment = [1 if has else 0 for has in with_sentence]
        lengths = self._lengths(firsts, seconds)
        for (c, s), n in zip(pairs, lengths, strict=True):
            if n > self.max_length:
                self.stats.note_truncated(s if s is not None else c)
        # Singles and pairs cannot share one tokenizer call; run the two groups separately.
        rows: list[dict[str, list[int]]] = [{} for _ in pairs]
        masks: list[list[int]] = [[] for _ in pairs]
        for is_pair in (True, False):
            idx = [i for i, has in enumerate(with_sentence) if has == is_pair]
            if not idx:
                continue
            enc = self.tokenizer(
                [firsts[i] for i in idx],
                [seconds[i] for i in idx] if is_pair else None,  # type: ignore[arg-type]
                truncation="longest_first",
                max_length=self.max_length,
            )
            for j, i in enumerate(idx):
                rows[i] = {k: enc[k][j] for k in enc.keys()}
                seq = enc.sequence_ids(j)
                masks[i] = [1 if sid == pooled_segment[i] else 0 for sid in seq]
        width = max(len(r["input_ids"]) for r in rows)
        pad_id = self.tokenizer.pad_token_id or 0
        batch: dict[str, torch.Tensor] = {}
        for key in rows[0]:
            fill = pad_id if key == "input_ids" else 0
            batch[key] = torch.tensor([r[key] + [fill] * (width - len(r[key])) for r in rows])
        pool = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)
        return batch, pool

    def _lengths(self, firsts: list[str], seconds: list[str | None]) -> list[int]:
        """Return untruncated token counts, special tokens included."""
        n_special_pair = self.tokenizer.num_special_tokens_to_add(pair=True)
        n_special = self.tokenizer.num_special_tokens_to_add(pair=False)
        first_ids = self.tokenizer(firsts, add_special_tokens=False)["input_ids"]
        distinct = list({s for s in seconds if s is not None})
        second_len = {}
        if distinct:
            second_ids = self.tokenizer(distinct, add_special_tokens=False)["input_ids"]
            second_len = {s: len(ids) for s, ids in zip(distinct, second_ids, strict=True)}
        return [
            len(ids) + (n_special if s is None else second_len[s] + n_special_pair)
            for ids, s in zip(first_ids, seconds, strict=True)
        ]

    def forward_pairs(self, pairs: Sequence[Pair]) -> torch.Tensor:
        """Return pooled f(c; I(s)) as a float32 tensor on the model's device: (len(pairs), dim).

        Differentiable: gradients reach the weights unless the caller disables them, so
        fine-tuning and :meth:`embed_batch` share one forward pass. Dropout follows the
        model's train/eval mode.
        """
        batch, pool = self._tokenize(pairs)
        batch = {k: v.to(self.device) for k, v in batch.items()}
        pool = pool.to(self.device)
        hidden = self.model(**batch).last_hidden_state.float()
        summed = (hidden * pool.unsqueeze(-1)).sum(dim=1)
        counts = pool.sum(dim=1, keepdim=True).clamp_min(1.0)
        return summed / counts

    @torch.inference_mode()
    def embed_batch(self, pairs: Sequence[Pair]) -> np.ndarray:
        return self.forward_pairs(pairs).cpu().numpy().astype(np.float32, copy=False)
