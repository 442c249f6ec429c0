"""Knowledge-graph completion with the router tri-encoder (SimKGC protocol): data, ranking, training."""

from __future__ import annotations

from .data import KgData, known_answers, link_graph, n_hop, read_kg, with_inverse
from .ranking import filtered_ranks, rank_metrics

__all__ = [
    "KgData",
    "filtered_ranks",
    "known_answers",
    "link_graph",
    "n_hop",
    "rank_metrics",
    "read_kg",
    "with_inverse",
]
