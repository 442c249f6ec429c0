"""Filtered link-prediction ranking over a FAISS index of entity vectors, and its metrics.

The rank of the gold entity is 1 + the number of other candidates scoring strictly higher,
where candidates that are known true answers of the same (head, relation) are removed
("filtered setting"). Optionally a bonus is added to the scores of some candidates per query
first (SimKGC's graph re-ranking). FAISS returns each query's top k; the rank is read from
that list when no candidate outside it could still outscore the gold, and is counted over
all entities otherwise, so the result is exact either way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from condsearch.base.faiss_indexes import search

HITS = (1, 3, 10)


def rank_metrics(ranks: np.ndarray) -> dict[str, float]:
    """Return MRR and Hit@1/3/10 (×100), the mean rank and the number of queries."""
    ranks = np.asarray(ranks, dtype=np.float64)
    if ranks.size == 0:
        return {"mrr": float("nan"), **{f"hit@{k}": float("nan") for k in HITS}, "mr": float("nan"), "n": 0}
    out = {"mrr": float(100 * np.mean(1.0 / ranks))}
    out.update({f"hit@{k}": float(100 * np.mean(ranks <= k)) for k in HITS})
    out["mr"] = float(np.mean(ranks))
    out["n"] = int(ranks.size)
    return out


def average_metrics(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """Return the mean of two directions' metrics, as SimKGC reports them (n is summed)."""
    out = {k: (a[k] + b[k]) / 2 for k in a if k != "n"}
    out["n"] = a["n"] + b["n"]
    return out


def dense_filtered_ranks(
    scores: np.ndarray,
    golds: np.ndarray,
    filters: Sequence[np.ndarray],
    bonus_sets: Sequence[np.ndarray] | None = None,
    bonus: float = 0.0,
) -> np.ndarray:
    """Reference ranking from a full (n_queries, n_entities) score matrix: (n,) int64."""
    ranks = np.empty(len(golds), dtype=np.int64)
    for i, gold in enumerate(golds):
        row = scores[i].astype(np.float64, copy=True)
        if bonus_sets is not None:
            row[bonus_sets[i]] += bonus
        gold_score = row[gold]
        row[filters[i]] = -np.inf
        row[gold] = -np.inf
        ranks[i] = 1 + int(np.count_nonzero(row > gold_score))
    return ranks


def filtered_ranks(
    index: object,
    entity_vectors: np.ndarray,
    queries: np.ndarray,
    golds: np.ndarray,
    filters: Sequence[np.ndarray],
    *,
    bonus_sets: Sequence[np.ndarray] | None = None,
    bonus: float = 0.0,
    k: int = 100,
    chunk: int = 256,
) -> np.ndarray:
    """Return the filtered rank of each query's gold entity: (n,) int64.

    index: a FAISS inner-product index (or ``condsearch.base.faiss_indexes.TorchFlatIndex``) over ``entity_vectors``
    (n_entities, d); queries (n, d) float32; golds (n,) entity rows; filters[i]: entity rows
    to remove for query i (the gold among them is kept); bonus_sets[i]: rows that get
    ``bonus`` added to their score before ranking.
    """
    n_entities = entity_vectors.shape[0]
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    k = min(k, n_entities)
    top = search(index, queries, k)  # type: ignore[arg-type]
    gold_raw = np.einsum("ij,ij->i", queries, entity_vectors[golds])
    ranks = np.zeros(len(golds), dtype=np.int64)
    deep: list[int] = []
    for i, gold in enumerate(golds.tolist()):
        extra = bonus_sets[i] if bonus_sets is not None else np.empty(0, dtype=np.int64)
        gold_score = gold_raw[i] + (bonus if np.isin(gold, extra) else 0.0)
        ids, scores = top.ids[i], top.scores[i].astype(np.float64)
        if len(extra):
            scores = scores + bonus * np.isin(ids, extra)
        floor = float(top.scores[i, -1]) + (bonus if len(extra) else 0.0)
        if k < n_entities and floor > gold_score:
            deep.append(i)  # something outside the top k may still outscore the gold
            continue
        keep = (ids >= 0) & (ids != gold) & ~np.isin(ids, filters[i])
        ranks[i] = 1 + int(np.count_nonzero(keep & (scores > gold_score)))
    for start in range(0, len(deep), chunk):
        rows = deep[start : start + chunk]
        block = queries[rows] @ entity_vectors.T
        sets = [bonus_sets[i] for i in rows] if bonus_sets is not None else None
        ranks[rows] = dense_filtered_ranks(block, golds[rows], [filters[i] for i in rows], sets, bonus)
    return ranks


def query_filters(heads: np.ndarray, relations: np.ndarray, golds: np.ndarray, answers: dict) -> list[np.ndarray]:
    """Return, per query, the known answers of its (head, relation) other than its gold."""
    out = []
    for h, r, g in zip(heads.tolist(), relations.tolist(), golds.tolist(), strict=True):
        known = answers.get((h, r), ())
        out.append(np.fromiter((e for e in known if e != g), dtype=np.int64))
    return out
