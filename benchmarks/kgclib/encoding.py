"""Entity and query vectors for link prediction with the router tri-encoder, and evaluation.

A query is the head entity's text routed under the relation's text (the condition); a
candidate is the entity's plain forward pass (routing off). Candidates go either through
the same router layers (one tower) or through their own copy of the layers from the
router layer up (two towers, like SimKGC's separate query and tail encoders); both towers
share the frozen layers below, so both start from the entity's cached layer-t states and
after training only the layers above the cache are recomputed for all candidates.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from condsearch.csr.cache import Tensors, collate
from condsearch.csr.encoder import CsrEncoder
from condsearch.csr.router import PAPER, ConditionCode, Router
from condsearch.csr.weights import load_router_weights
from condsearch.index import DEFAULT_FACTORY, build_index, normalize, to_search_device
from condsearch.metrics import condition_sensitivity

from .data import Answers, KgData, n_hop
from .ranking import average_metrics, filtered_ranks, query_filters, rank_metrics

RERANK_HOPS = 5
RERANK_BONUS = 0.05
TAIL_FOLDER = "tail"  # a two-tower router folder keeps the candidate tower here


def tail_tower(router: Router) -> Router:
    """Return a candidate tower: a copy of the router's backbone whose layers from the router
    layer up train on their own (the layers below stay shared in value and frozen)."""
    return Router(copy.deepcopy(router.model), replace(PAPER, layer=router.layer))


def load_tail_tower(router: Router, folder: Path) -> Router | None:
    """Return the candidate tower saved in ``folder/tail``, or None for a one-tower router."""
    sub = Path(folder) / TAIL_FOLDER
    if not sub.is_dir():
        return None
    tail = tail_tower(router)
    load_router_weights(tail, sub)
    return tail.to(next(router.parameters()).device).eval()


def load_entity_states(
    encoder: CsrEncoder, texts: Sequence[str], *, batch_size: int = 128, progress: bool = False
) -> list[Tensors]:
    """Cache (once) and read the layer-t states of every entity text, in order."""
    keys = encoder.cache_sentences(texts, batch_size=batch_size, progress=progress)
    return encoder.states.get(keys)


def encode_states(
    router: Router,
    states: Sequence[Tensors],
    rows: np.ndarray,
    codes: ConditionCode | None = None,
    *,
    device: torch.device | None = None,
    chunk: int = 256,
) -> torch.Tensor:
    """Return pooled vectors (len(rows), hidden) of the entities at ``rows``.

    codes: one condition code per row, or None for the plain forward pass. Rows are run in
    length-sorted chunks to keep padding small; gradients flow when the caller is not in
    inference mode.
    """
    rows = np.asarray(rows, dtype=np.int64)
    order = np.argsort([states[r][0].shape[0] for r in rows.tolist()], kind="stable")
    outs = []
    for start in range(0, len(order), chunk):
        part = order[start : start + chunk]
        batch = collate([states[r] for r in rows[part].tolist()], device=device)
        code = None if codes is None else codes.select(torch.from_numpy(part).to(codes.q.device))
        outs.append(router.route(batch, code))
    out = torch.cat(outs)
    inverse = torch.from_numpy(np.argsort(order, kind="stable")).to(out.device)
    return out[inverse]


def relation_codes(encoder: CsrEncoder, conditions: Sequence[str]) -> ConditionCode:
    """Return the code of each condition text (a batch of len(conditions))."""
    inputs = encoder.tokenizer(
        list(conditions), padding=True, truncation=True, max_length=encoder.max_length, return_tensors="pt"
    )
    return encoder.router.condition_codes({k: v.to(encoder.device) for k, v in inputs.items()})


@torch.inference_mode()
def entity_vectors(
    encoder: CsrEncoder, states: Sequence[Tensors], *, tail: Router | None = None, chunk: int = 512
) -> np.ndarray:
    """Return every entity's candidate vector, unit length: (n_entities, hidden) float32.

    tail: the candidate tower of a two-tower model (default: the encoder's router itself).
    """
    tower = tail or encoder.router
    tower.eval()
    out = np.empty((len(states), encoder.dim), dtype=np.float32)
    for start in range(0, len(states), 8192):
        rows = np.arange(start, min(len(states), start + 8192))
        vecs = encode_states(tower, states, rows, device=encoder.device, chunk=chunk)
        out[rows] = vecs.float().cpu().numpy()
    return normalize(out)


@torch.inference_mode()
def query_vectors(
    encoder: CsrEncoder, states: Sequence[Tensors], heads: np.ndarray, relations: np.ndarray, conditions: Sequence[str]
) -> np.ndarray:
    """Return the routed vector of each (head, relation) query, unit length: (n, hidden) float32."""
    encoder.router.eval()
    codes = relation_codes(encoder, conditions)
    codes = codes.select(torch.from_numpy(np.asarray(relations, dtype=np.int64)).to(codes.q.device))
    vecs = encode_states(encoder.router, states, heads, codes, device=encoder.device)
    return normalize(vecs.float().cpu().numpy())


def relation_sensitivity(encoder: CsrEncoder, states: Sequence[Tensors], data: KgData, triples: np.ndarray) -> float:
    """Condition sensitivity on a KG: each triple's head routed under its relation and under
    the inverse of that relation (mean of 1 − cos)."""
    heads, rels = triples[:, 0], triples[:, 1]
    forward = query_vectors(encoder, states, heads, rels, data.conditions)
    backward = query_vectors(encoder, states, heads, rels + data.n_relations, data.conditions)
    return condition_sensitivity(forward, backward)


def direction_queries(triples: np.ndarray, n_relations: int, forward: bool) -> tuple[np.ndarray, ...]:
    """Return (heads, relations, golds) for tail prediction (forward) or head prediction."""
    if forward:
        return triples[:, 0], triples[:, 1], triples[:, 2]
    return triples[:, 2], triples[:, 1] + n_relations, triples[:, 0]


def evaluate_link_prediction(
    encoder: CsrEncoder,
    states: Sequence[Tensors],
    data: KgData,
    triples: np.ndarray,
    answers: Answers,
    *,
    rerank_graph: list[np.ndarray] | None = None,
    factory: str = DEFAULT_FACTORY,
    k: int = 100,
    tail: Router | None = None,
) -> dict[str, object]:
    """Rank every entity for each triple in both directions (filtered setting).

    Candidates are all entities, searched through a FAISS index; with ``rerank_graph``
    (the training graph), entities within 5 hops of the query's head get +0.05 first.
    ``tail`` is the candidate tower of a two-tower model. Returns {"forward": metrics,
    "backward": metrics, **their average}.
    """
    cands = entity_vectors(encoder, states, tail=tail)
    index = to_search_device(build_index(cands, factory))
    out: dict[str, object] = {}
    for name, forward in (("forward", True), ("backward", False)):
        heads, rels, golds = direction_queries(triples, data.n_relations, forward)
        queries = query_vectors(encoder, states, heads, rels, data.conditions)
        filters = query_filters(heads, rels, golds, answers)
        bonus_sets = None
        if rerank_graph is not None:
            bonus_sets = [n_hop(rerank_graph, h, RERANK_HOPS) for h in heads.tolist()]
        ranks = filtered_ranks(index, cands, queries, golds, filters, bonus_sets=bonus_sets, bonus=RERANK_BONUS, k=k)
        out[name] = rank_metrics(ranks)
    out.update(average_metrics(out["forward"], out["backward"]))  # type: ignore[arg-type]
    out["condition_sensitivity"] = relation_sensitivity(encoder, states, data, triples)
    return out
