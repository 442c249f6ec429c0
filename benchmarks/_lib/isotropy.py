"""How evenly embeddings spread over directions: CASE's isotropy measure (Appendix C), for benchmarks/paper/csts.py."""

from __future__ import annotations

import numpy as np


def isotropy(vectors: np.ndarray, n_directions: int = 1000, seed: int = 0) -> float:
    """Return the approximate isotropy I_iso of a set of embeddings (CASE, Appendix C).

    Rows are scaled to unit length; for ``n_directions`` unit vectors u drawn uniformly on
    the sphere, F(u) = sum_j exp(e_j . u); I_iso = min F / max F (1: isotropic, near 0: the
    vectors crowd into a few directions).
    """
    e = np.asarray(vectors, dtype=np.float64)
    e = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
    u = np.random.default_rng(seed).standard_normal((n_directions, e.shape[1]))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    f = np.exp(e @ u.T).sum(axis=0)
    return float(f.min() / f.max())


def cosine_to_mean(vectors: np.ndarray) -> dict[str, float]:
    """Return the mean and standard deviation of each vector's cosine to the mean vector."""
    e = np.asarray(vectors, dtype=np.float64)
    mu = e.mean(axis=0)
    cos = (e @ mu) / np.maximum(np.linalg.norm(e, axis=1) * np.linalg.norm(mu), 1e-12)
    return {"mean": float(cos.mean()), "std": float(cos.std())}
