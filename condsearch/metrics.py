"""How good it is: Spearman and Pearson on C-STS style predictions, and condition sensitivity."""

from __future__ import annotations

import numpy as np
from scipy import stats


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return the cosine similarity of matching rows of a and b: (n,) float32."""
    na = np.linalg.norm(a, axis=1)
    nb = np.linalg.norm(b, axis=1)
    denom = np.maximum(na * nb, 1e-12)
    return ((a * b).sum(axis=1) / denom).astype(np.float32)


def correlations(predictions: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Return Spearman and Pearson correlations ×100 and the number of items."""
    if len(predictions) < 2 or np.ptp(predictions) == 0:
        return {"spearman": float("nan"), "pearson": float("nan"), "n": int(len(predictions))}
    return {
        "spearman": float(100 * stats.spearmanr(predictions, labels).statistic),
        "pearson": float(100 * stats.pearsonr(predictions, labels).statistic),
        "n": int(len(predictions)),
    }


def condition_sensitivity(a: np.ndarray, b: np.ndarray) -> float:
    """Return the mean of 1 − cos over matching rows of a and b.

    a[i] and b[i] are one item's vectors under two different conditions; 0 means the
    conditions change nothing, larger means the encoder conditions more.
    """
    if len(a) == 0:
        return float("nan")
    # float32 rounding can put 1 − cos of identical directions a hair below 0
    return float(np.mean(np.clip(1.0 - cosine_rows(np.asarray(a, np.float64), np.asarray(b, np.float64)), 0, 2)))


def best_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (scores, columns) of each row's k best columns, best first: two (n_rows, k) arrays."""
    rows = (
        np.argpartition(-scores, k, axis=1)[:, :k]
        if k < scores.shape[1]
        else np.tile(np.arange(scores.shape[1]), (scores.shape[0], 1))
    )
    part = np.take_along_axis(scores, rows, axis=1)
    order = np.argsort(-part, axis=1, kind="stable")
    return np.take_along_axis(part, order, axis=1), np.take_along_axis(rows, order, axis=1)


def label_hits(values: list[str], hits: np.ndarray, queries: list[int]) -> np.ndarray:
    """Return each query's share of its found rows that hold its value: (n_queries,) float.

    hits: (n_queries, k) corpus positions found for each query (its own row left out).
    """
    return np.array([np.mean([values[h] == values[q] for h in hit]) for q, hit in zip(queries, hits, strict=True)])


def label_precision(vectors: np.ndarray, values: list[str], queries: list[int], k: int = 10) -> float:
    """Return label precision@k: the mean share of each query's k nearest rows (itself left out) with its value.

    vectors: (n, d) unit rows, one per corpus row; values: (n,) each row's label; queries:
    positions in the corpus. k shrinks to n - 1 on a corpus too small for it.
    """
    k = min(k, len(values) - 1)
    if not queries or k < 1:
        return float("nan")
    scores = vectors[queries] @ vectors.T
    scores[np.arange(len(queries)), queries] = -np.inf
    _, hits = best_k(scores, k)
    return float(label_hits(values, hits, queries).mean())
