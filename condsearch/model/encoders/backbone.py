"""The one loader of a transformers encoder backbone (tokenizer and model), for the CASE and CSR encoders."""

from __future__ import annotations

from typing import Any

import torch

from condsearch.base.model_sources import ModelSource
from condsearch.errors import ModelError
from condsearch.model.encoders.first_use import loading
from condsearch.model.encoders.runtime import load_pretrained
from condsearch.model.encoders.serial_tokenizer import SerialTokenizer


def load_backbone(source: ModelSource, *, trust_remote_code: bool = False) -> tuple[Any, Any]:
    """Return (tokenizer, model) of a model folder or hub id: transformers' own, the model in float32 on the CPU.

    The tokenizer tokenizes for one thread at a time (:class:`.serial_tokenizer.SerialTokenizer`): the
    server runs one model from two threads.

    float32 whatever dtype the folder was saved in: a float16 folder loaded as saved mixed Half
    and Float in the CSR router's arithmetic (02982a7); an encoder casts to its own dtype after.
    """
    with loading(source.model_id):  # one load through transformers at a time: its lazy imports race
        from transformers import AutoModel, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(source.location, trust_remote_code=trust_remote_code)
            model = load_pretrained(
                AutoModel.from_pretrained, source.location, dtype=torch.float32, trust_remote_code=trust_remote_code
            )
        except (OSError, ValueError, KeyError) as exc:
            raise ModelError.cannot_load(source.model_id, exc) from exc
    return SerialTokenizer(tokenizer), model
