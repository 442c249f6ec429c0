"""CASE inputs for BERT-style encoders: the sentence steers, the condition is pooled."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch

from condsearch.base.cpu_kind import AUTO_DTYPE_KEY, auto_case_dtype
from condsearch.base.model_sources import ModelSource
from condsearch.errors import ModelError
from condsearch.model.encoders.backbone import load_backbone
from condsearch.model.encoders.base import Encoder, Pair
from condsearch.model.encoders.bert_inputs import TokenSorted, case_inputs, max_length_for
from condsearch.model.encoders.pooling import mean_pool


def auto_dtype(device: torch.device) -> torch.dtype:
    """Return the dtype ``--dtype auto`` runs a BERT-style encoder in: the CPU kind's measured choice, else float32."""
    if device.type != "cpu":
        return torch.float32  # BERT-style models stay float32 on accelerators under auto, as they always were
    return torch.bfloat16 if auto_case_dtype() == "bfloat16" else torch.float32


def pick_device(device: str | None) -> torch.device:
    """Return the requested torch device, or CUDA when present, else the CPU."""
    from condsearch.model.encoders.runtime import parse_devices

    return parse_devices(device)[0]


class BertStyleEncoder(TokenSorted, Encoder):
    """Encode ``[CLS] s [SEP] c [SEP]`` and mean-pool the condition's tokens only.

    With no sentence, the condition alone (``[CLS] c [SEP]``) is encoded and its
    tokens mean-pooled. Special tokens are never pooled. The sentence is the one
    truncated when a pair exceeds the model's length limit.
    """

    pooling = "condition-mean"
    #: sha256 of a LoRA adapter loaded onto the model ("" when none; see condsearch.model.encoders.lora)
    adapter_checksum = ""

    def __init__(
        self,
        source: ModelSource,
        *,
        device: str | None = None,
        max_length: int | None = None,
        trust_remote_code: bool = False,
        dtype: torch.dtype | Literal["auto"] | None = None,
        loaded: tuple[Any, torch.nn.Module] | None = None,
    ) -> None:
        """``loaded``: (tokenizer, model) read already (a CPU twin of another encoder's, for its ONNX export).

        ``dtype``: None is float32; ``"auto"`` is what ``--dtype auto`` means here (:func:`auto_dtype`).
        """
        super().__init__()
        self.tokenizer, model = loaded or load_backbone(source, trust_remote_code=trust_remote_code)
        if not getattr(self.tokenizer, "is_fast", False):
            raise ModelError(f"{source.model_id}: a fast tokenizer (tokenizer.json) is required")
        self.device = pick_device(device)
        #: the dtype was chosen by --dtype auto for this CPU, not asked for (see describe())
        self.dtype_auto = dtype == "auto"
        self.dtype = auto_dtype(self.device) if dtype == "auto" else dtype or torch.float32
        self.model = model.to(self.device, self.dtype).eval()
        self.model_id = source.model_id
        self.revision = source.revision
        config: Any = model.config  # a transformers config: its fields are untyped here
        self.dim = int(config.hidden_size)
        self.max_length = max_length_for(source.location, self.tokenizer.model_max_length, max_length, model.config)

    def describe(self) -> dict[str, object]:
        info = {**super().describe(), "pooling": self.pooling, "max_length": self.max_length}
        if self.dtype != torch.float32:  # float32 records nothing, so existing caches and manifests still match
            # a dtype auto chose is recorded apart: the spec keeps auto, so another CPU answers in its own
            info[AUTO_DTYPE_KEY if self.dtype_auto else "dtype"] = str(self.dtype).removeprefix("torch.")
        if self.adapter_checksum:  # likewise: no adapter, no key
            info["adapter_checksum"] = self.adapter_checksum
        return info

    def _tokenize(self, pairs: Sequence[Pair]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Tokenize a batch and return model inputs and the float mask of pooled tokens."""
        batch, pool = case_inputs(self.tokenizer, pairs, self.max_length, self.stats)
        return {k: torch.from_numpy(v) for k, v in batch.items()}, torch.from_numpy(pool)

    def forward_pairs(self, pairs: Sequence[Pair]) -> torch.Tensor:
        """Return pooled f(c; I(s)) as a float32 tensor on the model's device: (len(pairs), dim).

        Differentiable: gradients reach the weights unless the caller disables them, so
        fine-tuning and :meth:`encode_batch` share one forward pass. Dropout follows the
        model's train/eval mode.
        """
        batch, pool = self._tokenize(pairs)
        batch = {k: v.to(self.device) for k, v in batch.items()}
        pool = pool.to(self.device)
        hidden = self.model(**batch).last_hidden_state.float()
        return mean_pool(hidden, pool)

    @torch.inference_mode()
    def encode_batch(self, pairs: Sequence[Pair]) -> np.ndarray:
        return self.forward_pairs(pairs).cpu().numpy().astype(np.float32, copy=False)
