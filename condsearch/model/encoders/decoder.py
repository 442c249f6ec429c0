"""CASE inputs for instruction-tuned embedders: one rendered prompt per pair, pooled."""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch

from condsearch.base.model_sources import ModelSource
from condsearch.errors import ModelError
from condsearch.model.encoders.base import Encoder, Pair
from condsearch.model.encoders.bidirectional import config_is_bidirectional, decoder_layers, make_bidirectional
from condsearch.model.encoders.family import Family, PromptTemplates
from condsearch.model.encoders.pooling import last_token_pool, mean_pool
from condsearch.model.encoders.runtime import OomBackoff, dtype_name, load_fastest
from condsearch.model.encoders.serial_tokenizer import SerialTokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Limits of 32k+ tokens are position-embedding limits, not useful batch shapes.
_DEFAULT_MAX_LENGTH_CAP = 8192
# Qwen3-Embedding ends every input with this token and pools it.
_QWEN_EOD = "<|endoftext|>"


def default_max_length(tokenizer_limit: int, config: Mapping[str, object]) -> int:
    """Return the smallest of the tokenizer's limit, the position embeddings and the cap."""
    limits = [_DEFAULT_MAX_LENGTH_CAP]
    if 0 < tokenizer_limit < 1_000_000:
        limits.append(tokenizer_limit)
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and positions > 0:
        limits.append(positions)
    return min(limits)


def _end_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int | None, int | None]:
    """Return (the end-of-text id last-token pooling uses, the end id the tokenizer appends itself or None)."""
    eos_id = tokenizer.eos_token_id
    eod = tokenizer.get_vocab().get(_QWEN_EOD, eos_id)
    if eod is None:
        return None, None
    probe = tokenizer("x")["input_ids"]
    appended = probe[-1] if probe and probe[-1] in {eod, eos_id} else None
    return int(eod), appended


def eos_to_append(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """Return the id to end each input with for last-token pooling, or None when the tokenizer already does.

    Qwen3-Embedding pools ``<|endoftext|>``; other models pool their EOS token.
    """
    eod, appended = _end_ids(tokenizer)
    return None if appended is not None else eod


def appended_end(tokenizer: PreTrainedTokenizerBase) -> int | None:
    """Return the end-of-text id the tokenizer appends to every input itself (Qwen3-Embedding's), or None."""
    return _end_ids(tokenizer)[1]


def resolve_bidirectional(config: Mapping[str, object], n_layers: int, requested: int, model_id: str) -> int:
    """Return how many top layers attend both ways: ``requested``, or all of them when the config says so.

    Raises ModelError when requested exceeds the layers, or contradicts an ``is_causal: false`` config.
    """
    if config_is_bidirectional(config):
        if requested not in (0, n_layers):
            raise ModelError(
                f"{model_id} attends both ways in every layer (is_causal: false in its config); "
                f"--bidirectional-layers must be 0 or {n_layers}"
            )
        return n_layers
    if requested > n_layers:
        raise ModelError(f"--bidirectional-layers {requested}: {model_id} has {n_layers} layers")
    return requested


class PromptEncoder(Encoder):
    """Encode each pair as one prompt (SPEC §2.1) and pool the final hidden states.

    ``last`` pooling takes the final real token (the appended end-of-text token), ``mean``
    averages every real token, instruction included, as the reference code does;
    ``prompt-last`` takes the prompt's own last token with no end-of-text token after it
    (BeLLM's representative-word position). Decoders are padded on the left with position
    ids counted from each row's first real token, so a text gives the same vector alone or
    in a padded batch. With ``bidirectional_layers`` N > 0 the top N layers of a decoder
    attend in both directions (:mod:`condsearch.model.encoders.bidirectional`).
    """

    #: sha256 of a LoRA adapter loaded onto the model ("" when none; see condsearch.model.encoders.lora)
    adapter_checksum = ""

    def __init__(
        self,
        source: ModelSource,
        config: Mapping[str, object],
        *,
        family: Family,
        pooling: Literal["last", "mean", "prompt-last"],
        templates: PromptTemplates,
        device: torch.device,
        dtype: torch.dtype,
        max_length: int | None = None,
        trust_remote_code: bool = False,
        bidirectional_layers: int = 0,
    ) -> None:
        super().__init__()
        from transformers import AutoModel, AutoTokenizer

        if "condition" not in templates.conditional or "condition" not in templates.unconditional:
            raise ModelError("prompt templates for this model need a {condition} placeholder in both")
        try:
            self.tokenizer = SerialTokenizer(
                AutoTokenizer.from_pretrained(source.location, trust_remote_code=trust_remote_code)
            )
            model = load_fastest(
                AutoModel.from_pretrained, source.location, device, dtype, trust_remote_code=trust_remote_code
            )
        except (OSError, ValueError, KeyError) as exc:
            raise ModelError.cannot_load(source.model_id, exc) from exc
        self.model = model.to(device).eval()
        if family == "decoder":
            n_layers = len(decoder_layers(self.model))
            self.bidirectional_layers = resolve_bidirectional(config, n_layers, bidirectional_layers, source.model_id)
            make_bidirectional(self.model, self.bidirectional_layers)
        elif bidirectional_layers:
            raise ModelError("--bidirectional-layers applies to decoder embedders; this one attends both ways already")
        else:
            self.bidirectional_layers = 0
        self.device = device
        self.dtype = dtype
        self.model_id = source.model_id
        self.revision = source.revision
        self.dim = int(model.config.hidden_size)
        self.family = family
        self.pooling = pooling
        self.templates = templates
        self.max_length = max_length or default_max_length(int(self.tokenizer.model_max_length or 0), config)
        self.padding_side = "left" if family == "decoder" else "right"
        self.eos_id = eos_to_append(self.tokenizer.unwrapped) if pooling == "last" else None
        # prompt-last pools the prompt's own last token, so an end token the tokenizer adds comes off.
        self.strip_id = appended_end(self.tokenizer.unwrapped) if pooling == "prompt-last" else None
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (self.tokenizer.eos_token_id or 0))
        self._accepts = set(inspect.signature(self.model.forward).parameters)
        self._backoff = OomBackoff()

    def describe(self) -> dict[str, object]:
        info: dict[str, object] = {
            **super().describe(),
            "family": self.family,
            "pooling": self.pooling,
            "prompt_template": self.templates.conditional,
            "unconditional_template": self.templates.unconditional,
            "max_length": self.max_length,
            "dtype": dtype_name(self.dtype),
        }
        if self.bidirectional_layers:  # causal records nothing, so existing caches and manifests still match
            info["bidirectional_layers"] = self.bidirectional_layers
        if self.adapter_checksum:
            info["adapter_checksum"] = self.adapter_checksum
        return info

    def render(self, pairs: Sequence[Pair]) -> list[str]:
        """Return the prompt text of each pair."""
        return [self.templates.render(c, s) for c, s in pairs]

    def tokenize(self, pairs: Sequence[Pair]) -> list[list[int]]:
        """Return each pair's token ids, truncated to max_length (counted in stats), EOS appended."""
        texts = self.render(pairs)
        room = self.max_length - (1 if self.eos_id is not None else 0)
        rows: list[list[int]] = self.tokenizer(texts, verbose=False)["input_ids"]
        over = [i for i, row in enumerate(rows) if len(row) > room]
        if over:
            # Re-tokenize with the tokenizer's own truncation so that its special tokens survive.
            cut = self.tokenizer([texts[i] for i in over], truncation=True, max_length=room)["input_ids"]
            for i, row in zip(over, cut, strict=True):
                condition, sentence = pairs[i]
                self.stats.note_truncated(sentence if sentence is not None else condition)
                rows[i] = row
        if self.eos_id is not None:
            rows = [[*row, self.eos_id] for row in rows]
        if self.strip_id is not None:
            rows = [row[:-1] if len(row) > 1 and row[-1] == self.strip_id else row for row in rows]
        return rows

    def collate(self, rows: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        """Pad token rows into model inputs on ``self.padding_side``."""
        width = max(len(r) for r in rows)
        ids, mask, positions = [], [], []
        for row in rows:
            pad = width - len(row)
            real = list(range(len(row)))
            if self.padding_side == "left":
                ids.append([self.pad_id] * pad + list(row))
                mask.append([0] * pad + [1] * len(row))
                positions.append([0] * pad + real)
            else:
                ids.append(list(row) + [self.pad_id] * pad)
                mask.append([1] * len(row) + [0] * pad)
        batch = {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}
        if self.padding_side == "left" and "position_ids" in self._accepts:
            batch["position_ids"] = torch.tensor(positions)
        return batch

    def encode_batch(self, pairs: Sequence[Pair]) -> np.ndarray:
        return self._backoff.run(self._forward, self.tokenize(pairs))

    def forward_pairs(self, pairs: Sequence[Pair]) -> torch.Tensor:
        """Return pooled f(c; I(s)) as a float32 tensor on the model's device: (len(pairs), dim).

        Differentiable (fine-tuning uses it); dropout follows the model's train/eval mode.
        """
        return self._pooled(self.tokenize(pairs))

    def _pooled(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        batch = {k: v.to(self.device) for k, v in self.collate(rows).items()}
        extra = {"use_cache": False} if "use_cache" in self._accepts else {}
        hidden = self.model(**batch, **extra)[0].float()
        pool = mean_pool if self.pooling == "mean" else last_token_pool
        return pool(hidden, batch["attention_mask"])

    @torch.inference_mode()
    def _forward(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        return self._pooled(rows).cpu().numpy().astype(np.float32, copy=False)
