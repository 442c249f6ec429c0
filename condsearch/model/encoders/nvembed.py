"""CASE inputs for NV-Embed: the pair goes into the instruction, the condition is the text.

NV-Embed's own ``encode(prompts, instruction=..., max_length=...)`` is used as is: it
concatenates instruction, text and EOS, masks the instruction's tokens out of its
latent-attention pooling and returns one vector per prompt.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from condsearch.base.model_sources import ModelSource
from condsearch.errors import ModelError
from condsearch.model.encoders.base import Encoder, Pair
from condsearch.model.encoders.decoder import default_max_length
from condsearch.model.encoders.family import PromptTemplates
from condsearch.model.encoders.runtime import OomBackoff, dtype_name, load_pretrained


def load_remote_model(location: str, dtype: torch.dtype) -> Any:
    """Load a model whose class is defined by the folder's own code."""
    from transformers import AutoModel

    return load_pretrained(AutoModel.from_pretrained, location, dtype=dtype, trust_remote_code=True)


def _hidden_size(config: Mapping[str, object]) -> int | None:
    for key, sub in (("latent_attention_config", "hidden_dim"), ("text_config", "hidden_size")):
        nested = config.get(key)
        if isinstance(nested, Mapping) and isinstance(nested.get(sub), int):
            return int(nested[sub])
    size = config.get("hidden_size")
    return int(size) if isinstance(size, int) else None


class NVEmbedEncoder(Encoder):
    """Encode pairs with an NV-Embed model's own ``encode``, grouped by instruction.

    The conditional instruction holds the sentence, so every pair has its own instruction and
    is encoded alone (as the reference code does); the unconditional inputs of all conditions
    share one instruction and go through in one call.
    """

    pooling = "latent-attention"

    def __init__(
        self,
        source: ModelSource,
        config: Mapping[str, object],
        *,
        templates: PromptTemplates,
        device: torch.device,
        dtype: torch.dtype,
        max_length: int | None = None,
        trust_remote_code: bool = False,
    ) -> None:
        super().__init__()
        if not trust_remote_code:
            raise ModelError(
                f"{source.model_id} is an NV-Embed model, which runs its own code: pass --trust-remote-code"
            )
        try:
            model = load_remote_model(source.location, dtype)
        except (OSError, ValueError, KeyError, ImportError, AttributeError) as exc:
            raise ModelError.cannot_load(source.model_id, exc) from exc
        if not callable(getattr(model, "encode", None)) or getattr(model, "tokenizer", None) is None:
            raise ModelError(f"{source.model_id}: the model has no encode() and tokenizer as NV-Embed does")
        self.model = model.to(device).eval()
        self.tokenizer = model.tokenizer
        # its encode() tokenizes with the model's own tokenizer, whose settings change per call: one encode at a
        # time (the server runs one model from two threads; :mod:`.serial_tokenizer`)
        self._encode_lock = threading.Lock()
        self.device = device
        self.dtype = dtype
        self.model_id = source.model_id
        self.revision = source.revision
        self.templates = templates
        self.max_length = max_length or default_max_length(int(self.tokenizer.model_max_length or 0), {})
        self.dim = _hidden_size(config) or int(self._encode_group("", ["x"]).shape[1])
        self._backoff = OomBackoff()

    def describe(self) -> dict[str, object]:
        return {
            **super().describe(),
            "family": "nvembed",
            "pooling": self.pooling,
            "prompt_template": self.templates.conditional,
            "unconditional_template": self.templates.unconditional,
            "max_length": self.max_length,
            "dtype": dtype_name(self.dtype),
        }

    def instruction(self, condition: str, sentence: str | None) -> str:
        """Return the instruction for a pair; the text encoded under it is the condition."""
        return self.templates.render(condition, sentence)

    def encode_batch(self, pairs: Sequence[Pair]) -> np.ndarray:
        groups: dict[str, list[int]] = {}
        for i, (condition, sentence) in enumerate(pairs):
            groups.setdefault(self.instruction(condition, sentence), []).append(i)
        out = np.empty((len(pairs), self.dim), dtype=np.float32)
        for instruction, rows in groups.items():
            texts = [pairs[i][0] for i in rows]
            self._count_truncation(instruction, [pairs[i] for i in rows])
            out[rows] = self._backoff.run(partial(self._encode_group, instruction), texts)
        return out

    def _count_truncation(self, instruction: str, pairs: Sequence[Pair]) -> None:
        # encode() tokenizes instruction + text + EOS and truncates silently; count it here.
        eos = self.tokenizer.eos_token or ""
        texts = [instruction + c + eos for c, _ in pairs]
        with self._encode_lock:
            rows = self.tokenizer(texts, verbose=False)["input_ids"]
        for (c, s), ids in zip(pairs, rows, strict=True):
            if len(ids) > self.max_length:
                self.stats.note_truncated(s if s is not None else c)

    @torch.inference_mode()
    def _encode_group(self, instruction: str, texts: Sequence[str]) -> np.ndarray:
        with self._encode_lock:
            vecs = self.model.encode(list(texts), instruction=instruction, max_length=self.max_length)
        if isinstance(vecs, torch.Tensor):
            vecs = vecs.float().cpu().numpy()
        return np.asarray(vecs, dtype=np.float32)
