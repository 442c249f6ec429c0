"""Benchmark-only features: both sentences of each C-STS row encoded without their condition (the baseline)."""

from __future__ import annotations

from typing import Any

from condsearch.corpus.csts import CstsData
from condsearch.model.encoders.base import Encoder
from condsearch.train.head import PairFeatures


def plain_features(encoder: Encoder, data: CstsData, **encode: Any) -> PairFeatures:
    """Encode both sentences of each row without their condition (the unconditional baseline).

    encode: batch_size, cache, progress, as for :func:`condsearch.train.head.case_features`.
    """
    n = len(data)
    both = encoder.encode_pairs([(t, None) for t in data.sentence1 + data.sentence2], **encode)
    return PairFeatures(both[:n], both[n:], data.labels)
