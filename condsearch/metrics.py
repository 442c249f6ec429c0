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
