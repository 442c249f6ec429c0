"""Benchmark-only features: both sentences of each C-STS row encoded without their condition (the baseline)."""

from __future__ import annotations

from condsearch.cache import EmbeddingCache
from condsearch.csts import CstsData
from condsearch.encoders.base import Encoder
from condsearch.training import ENCODE_BATCH_SIZE, PairFeatures


def plain_features(
    encoder: Encoder,
    data: CstsData,
    *,
    batch_size: int = ENCODE_BATCH_SIZE,
    cache: EmbeddingCache | None = None,
    progress: bool = False,
) -> PairFeatures:
    """Encode both sentences of each row without their condition (the unconditional baseline)."""
    n = len(data)
    both = encoder.encode_plain(data.sentence1 + data.sentence2, batch_size=batch_size, cache=cache, progress=progress)
    return PairFeatures(both[:n], both[n:], data.labels)
