"""How much adapting paid: label precision@10 on rows kept aside, under each labelled condition.

A scoring plan (:func:`plan_scoring`) fixes, once per run, which rows are searched and which of
them are queries, per labelled column: the rows that carry a value (at most ``max_rows``, a seeded
sample) and up to ``n_queries`` of them whose value another row shares. Every system is then
scored on the same plan (:func:`score_plan`): its vectors of those rows under the column's
condition, each query's 10 nearest rows (itself left out), the share with its value
(:func:`condsearch.metrics.label_precision`, which ``benchmarks/studies/heldout.py`` uses too).

The router's vectors come from :func:`routed_vectors`, in memory: each text's sentence states are
computed once and routed under the conditions of the columns it is scored under, and nothing goes
to the on-disk caches, as the weights it scores (the start, the trained ones, an interpolation)
are not the saved router's.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from condsearch.metrics import label_precision

#: the neighbours counted per query
K = 10
#: a system's vectors of texts under each condition: condition -> (n, d) unit rows
Embed = Callable[[Sequence[str], Sequence[str]], dict[str, np.ndarray]]


@dataclass(frozen=True)
class ColumnPlan:
    """One labelled column's scored rows: texts, their values, the query positions, its condition."""

    column: str
    condition: str
    texts: list[str]
    values: list[str]
    queries: list[int]


def plan_scoring(
    texts: Sequence[str],
    labels: Mapping[str, Sequence[str | None]],
    conditions: Mapping[str, str],
    rows: Sequence[int],
    *,
    max_rows: int,
    n_queries: int,
    seed: int,
    query_values: Mapping[str, Collection[str]] | None = None,
) -> list[ColumnPlan]:
    """Return each column's plan over rows (positions in texts); a column with no possible query is left out.

    conditions: column -> the condition it is searched under (its first phrasing); query_values:
    column -> the only values its queries may hold (values never trained on), where given.
    """
    plans = []
    # one seeded order for every column: each takes the first max_rows rows of it that carry its value,
    # so the columns share rows where they can and each text is encoded once
    order = [rows[i] for i in np.random.default_rng(seed).permutation(len(rows))]
    for column, condition in conditions.items():
        rng = np.random.default_rng(seed)
        with_value = sorted([r for r in order if labels[column][r] is not None][:max_rows])
        values = [str(labels[column][r]) for r in with_value]
        counts: dict[str, int] = {}
        for v in values:
            counts[v] = counts.get(v, 0) + 1
        only = (query_values or {}).get(column)
        candidates = [i for i, v in enumerate(values) if counts[v] >= 2 and (only is None or v in only)]
        if not candidates:
            continue
        picked = rng.permutation(len(candidates))[:n_queries]
        queries = sorted(candidates[i] for i in picked)
        plans.append(ColumnPlan(column, condition, [texts[r] for r in with_value], values, queries))
    return plans


def score_plan(plans: Sequence[ColumnPlan], embed: Embed) -> dict[str, float]:
    """Return column -> label precision@10 of one system on every plan (each plan's texts under its condition)."""
    out = {}
    for plan in plans:
        vectors = embed(plan.texts, [plan.condition])[plan.condition]
        out[plan.column] = label_precision(vectors, plan.values, plan.queries, K)
    return out


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)).astype(np.float32)


@torch.inference_mode()
def routed_vectors(
    encoder: object,
    texts: Sequence[str],
    conditions: Sequence[str],
    batch_size: int = 64,
    states: dict[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """Return a CSR encoder's unit vectors of texts under each condition, computed in memory: condition -> (n, d).

    encoder: a :class:`condsearch.model.csr.encoder.CsrEncoder` (typed loosely: this module loads no model).
    states: text -> its sentence states, kept for later calls; valid while the layers below the
    routed ones do not change (the wise anchor's interpolations of the top layers, several columns).
    """
    from condsearch.model.csr.cache import collate, split

    enc: Any = encoder
    router = enc.router
    was_training = router.training
    router.eval()
    states = {} if states is None else states
    todo = sorted(dict.fromkeys(t for t in texts if t not in states), key=len)  # similar lengths: little padding
    for start in range(0, len(todo), batch_size):
        chunk = todo[start : start + batch_size]
        states.update(zip(chunk, split(router.sentence_states(enc._tokenize(chunk))), strict=True))
    codes = {c: router.condition_codes(enc._tokenize([c])) for c in conditions}
    out = {c: np.empty((len(texts), enc.dim), dtype=np.float32) for c in conditions}
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        batch = collate([states[texts[i]] for i in rows], device=enc.device)
        for c, code in codes.items():
            out[c][rows] = router.route(batch, code).float().cpu().numpy()
    router.train(was_training)
    return {c: _unit(v) for c, v in out.items()}


def plain_embed(encoder: object, batch_size: int = 64) -> Embed:
    """Return an Embed for an unconditioned encoder: each text encoded once, whatever the condition."""
    enc: Any = encoder
    kept: dict[str, np.ndarray] = {}

    def embed(texts: Sequence[str], conditions: Sequence[str]) -> dict[str, np.ndarray]:
        todo = list(dict.fromkeys(t for t in texts if t not in kept))
        if todo:
            vectors = _unit(np.asarray(enc.encode_pairs([(t, None) for t in todo], batch_size=batch_size)))
            kept.update(zip(todo, vectors, strict=True))
        return dict.fromkeys(conditions, np.stack([kept[t] for t in texts]))

    return embed


def router_embed(encoder: object, batch_size: int = 64, states: dict[str, Any] | None = None) -> Embed:
    """Return an Embed for a CSR encoder as its weights are when it is called.

    Its calls share the sentence states of the texts they meet (states: a dict to share them with other
    embeds too; see :func:`routed_vectors`).
    """
    kept = {} if states is None else states
    return lambda texts, conditions: routed_vectors(encoder, texts, conditions, batch_size, kept)


def mean(scores: Mapping[str, float]) -> float:
    """Return the mean over columns of a system's scores (NaN when there are none)."""
    return float(np.mean(list(scores.values()))) if scores else float("nan")
