"""Encoders turn (condition, sentence) pairs into vectors."""

from __future__ import annotations

from condsearch.encoders.base import Encoder, EncodeStats, Pair
from condsearch.encoders.bert import BertStyleEncoder
from condsearch.models import resolve_model


def load_encoder(
    model: str | None = None,
    *,
    device: str | None = None,
    max_length: int | None = None,
    trust_remote_code: bool = False,
) -> Encoder:
    """Resolve a model name or folder and return the encoder for its family."""
    source = resolve_model(model)
    return BertStyleEncoder(source, device=device, max_length=max_length, trust_remote_code=trust_remote_code)


__all__ = ["BertStyleEncoder", "EncodeStats", "Encoder", "Pair", "load_encoder"]
