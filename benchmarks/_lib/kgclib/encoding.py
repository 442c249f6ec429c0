"""Entity and query vectors for link prediction with the router tri-encoder, and evaluation.

A query is the head entity's text routed under the relation's text (the condition); a
candidate is the entity's plain forward pass (routing off). Candidates go either through
the same router (one tower) or through their own copy (two towers, like SimKGC's separate
query and tail encoders).

Entities reach a tower in one of two forms (:data:`EntitySource`):

- :class:`CachedStates`: each entity's states below the routed layers, computed once and read
  from the state cache. Valid only while those layers stay frozen (the frozen-lower-layers
  option: training then recomputes only the layers above the cache).
- :class:`EntityTokens`: each entity's token ids; every batch runs the tower's own lower
  layers, with gradients when training. This is what whole-backbone training uses, and what
  evaluates its result with the trained weights.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from condsearch.base.faiss_indexes import DEFAULT_FACTORY, build_index, normalize, to_search_device
from condsearch.metrics import condition_sensitivity
from condsearch.model.csr.cache import Tensors, collate
from condsearch.model.csr.context import ContextCode, ContextRouter
from condsearch.model.csr.encoder import CsrEncoder
from condsearch.model.csr.router import PAPER, ConditionCode, Router, SentenceStates
from condsearch.model.csr.weights import load_router_weights

from .data import Answers, KgData, n_hop
from .ranking import average_metrics, filtered_ranks, query_filters, rank_metrics

RERANK_HOPS = 5
RERANK_BONUS = 0.05
TAIL_FOLDER = "tail"  # a two-tower router folder keeps the candidate tower here
TAIL_ROLE = "candidate tower"  # what the tail's router.json records as its role (save_towers)


Tower = Router | ContextRouter


def tail_tower(router: Tower) -> Tower:
    """Return a candidate tower: a copy of the router's backbone that trains on its own.

    For the paper/extended router only its layers from the router layer up train (the layers
    below stay shared in value and frozen); a context router's copy trains what the router
    trains (the whole backbone, or its top k layers).
    """
    if isinstance(router, ContextRouter):
        return ContextRouter(copy.deepcopy(router.model), router.config, trainable=router.trainable)
    return Router(copy.deepcopy(router.model), replace(PAPER, layer=router.layer))


def load_tail_tower(router: Tower, folder: Path, base: dict[str, torch.Tensor] | None = None) -> Tower | None:
    """Return the candidate tower saved in ``folder/tail``, or None for a one-tower router.

    A context router's tower is saved as its own change from the base model: ``base`` holds the
    base model's weights (:func:`condsearch.model.csr.context_weights.base_weights`). Each tower's
    weights must match its router.json (sha256 and shapes), and the query tower's router.json must
    not record the candidate tower's role: towers swapped, in part or whole, are a one-line ModelError.
    """
    from condsearch.errors import ModelError
    from condsearch.model.artifacts.routers import read_router_config

    sub = Path(folder) / TAIL_FOLDER
    if not sub.is_dir():
        return None
    # save_towers records the tail's role (a tail saved without one is taken as it is)
    if read_router_config(Path(folder)).get("role") == TAIL_ROLE or read_router_config(sub).get("role") not in (
        None,
        TAIL_ROLE,
    ):
        raise ModelError(f"{folder}: the query tower and the {TAIL_ROLE} ({TAIL_FOLDER}/) are swapped")
    tail = tail_tower(router)
    if isinstance(tail, ContextRouter):
        from condsearch.model.csr.context_weights import load_context_weights

        if base is None:
            raise ValueError("a context router's candidate tower needs the base model's weights")
        with torch.no_grad():
            for name, p in tail.model.named_parameters():
                p.copy_(base[name].to(p.device, p.dtype))
        load_context_weights(tail, sub)
    else:
        load_router_weights(tail, sub)
    return tail.to(next(router.parameters()).device).eval()


def save_towers(
    encoder: Any, tail: Any, base: dict[str, Any] | None, out: Path, meta: dict[str, object], keep_weights: bool = False
) -> str:
    """Save the trained router (and its candidate tower) into out; return the router's checksum.

    A context router is saved as its backbone's change from the base model, each tower within
    an equal share of 10 MB (at reduced rank when it does not fit); both towers are then given
    exactly what was saved, so what is evaluated next is the saved router (unless
    ``keep_weights``: mid-training, the exact weights stay).
    """
    from condsearch.model.csr.context import ContextRouter
    from condsearch.model.csr.context_weights import MAX_DELTA_BYTES, backbone_delta, save_context_router
    from condsearch.model.csr.weights import save_router

    if not isinstance(encoder.router, ContextRouter):
        checksum = save_router(encoder.router, out, meta)
        if tail is not None:
            save_router(tail, out / TAIL_FOLDER, {**meta, "role": TAIL_ROLE})
        return checksum
    assert base is not None
    towers = [(encoder.router, out, meta)]
    if tail is not None:
        towers.append((tail, out / TAIL_FOLDER, {**meta, "role": TAIL_ROLE}))
    checksum = ""
    for router, folder, info in towers:
        delta, rank = backbone_delta(base, router.model, max_bytes=MAX_DELTA_BYTES // len(towers))
        if not keep_weights:
            _set_delta(router, base, delta)
        saved = save_context_router(router, delta, rank, folder, {**info, "delta_rank": rank})
        checksum = checksum or saved  # the query tower's
    return checksum


def _set_delta(router: Any, base: dict[str, Any], delta: dict[str, torch.Tensor]) -> None:
    """Give a context router's backbone the base weights plus a saved change, in place."""
    from condsearch.model.csr.context_weights import apply_backbone_delta

    with torch.no_grad():
        for name, p in router.model.named_parameters():
            p.copy_(base[name].to(p.device, p.dtype))
    apply_backbone_delta(router, delta, "the trained router")


def project_towers(encoder: Any, tail: Any, base: dict[str, Any]) -> None:
    """Put both towers' weights into the form :func:`save_towers` keeps (ours: projected training).

    Each tower's change from the base model becomes what its saved artifact holds (int8
    low-rank factors and the token table's rows as signs, within an equal share of 10 MB), so
    that saving the weights afterwards loses nothing.
    """
    from condsearch.model.csr.context_weights import MAX_DELTA_BYTES, backbone_delta

    towers = [encoder.router] if tail is None else [encoder.router, tail]
    for router in towers:
        delta, _ = backbone_delta(base, router.model, max_bytes=MAX_DELTA_BYTES // len(towers))
        _set_delta(router, base, delta)


@dataclass(frozen=True)
class CachedStates:
    """Every entity's cached states below the routed layers (valid while those layers are frozen)."""

    states: Sequence[Tensors]

    def __len__(self) -> int:
        return len(self.states)

    def __getitem__(self, row: int) -> Tensors:
        return self.states[row]

    def lengths(self) -> np.ndarray:
        return np.array([s[0].shape[0] for s in self.states], dtype=np.int64)

    def batch(self, tower: Tower, rows: Sequence[int], device: torch.device | None) -> SentenceStates:
        del tower  # the cache stands for the layers every tower shares
        return collate([self.states[r] for r in rows], device=device)


class EntityTokens:
    """Every entity's token ids; each batch runs the tower's own layers below the routed ones."""

    def __init__(self, tokenizer: object, texts: Sequence[str], max_length: int) -> None:
        encoded = tokenizer(list(texts), truncation=True, max_length=max_length)  # type: ignore[operator]
        self.pad_id = int(getattr(tokenizer, "pad_token_id", None) or 0)
        self._lengths = np.array([len(ids) for ids in encoded["input_ids"]], dtype=np.int64)
        # one padded matrix, so that a batch's inputs are a slice of it rather than a Python loop
        self.ids = np.full((len(self._lengths), int(self._lengths.max(initial=1))), self.pad_id, dtype=np.int64)
        for i, ids in enumerate(encoded["input_ids"]):
            self.ids[i, : len(ids)] = ids

    def __len__(self) -> int:
        return len(self._lengths)

    def lengths(self) -> np.ndarray:
        return self._lengths

    def batch(self, tower: Tower, rows: Sequence[int], device: torch.device | None) -> SentenceStates:
        with torch.profiler.record_function("kgc.batch_inputs"):
            rows = np.asarray(rows, dtype=np.int64)
            lengths = self._lengths[rows]
            n = int(lengths.max())
            ids = torch.from_numpy(np.ascontiguousarray(self.ids[rows, :n]))
            mask = (torch.arange(n)[None, :] < torch.from_numpy(lengths)[:, None]).long()
            inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
        return tower.sentence_states({k: v.to(device) for k, v in inputs.items()})


#: how entities reach a tower: cached lower-layer states, or token ids run through the tower
EntitySource = CachedStates | EntityTokens


def load_entity_states(
    encoder: CsrEncoder, texts: Sequence[str], *, batch_size: int = 128, progress: bool = False
) -> CachedStates:
    """Cache (once) and read the layer-t states of every entity text, in order."""
    keys = encoder.cache_sentences(texts, batch_size=batch_size, progress=progress)
    return CachedStates(encoder.states.get(keys))


def entity_tokens(encoder: CsrEncoder, texts: Sequence[str]) -> EntityTokens:
    """Return the token ids of every entity text at the encoder's max length."""
    return EntityTokens(encoder.tokenizer, texts, encoder.max_length)


def encode_states(
    router: Tower,
    source: EntitySource,
    rows: np.ndarray,
    codes: object | None = None,
    *,
    device: torch.device | None = None,
    chunk: int = 256,
) -> torch.Tensor:
    """Return pooled vectors (len(rows), hidden) of the entities at ``rows``.

    codes: one condition code per row (the router's own kind), or None for the plain forward
    pass. Rows are run in length-sorted chunks to keep padding small; gradients flow when the
    caller is not in inference mode.
    """
    rows = np.asarray(rows, dtype=np.int64)
    device = device or next(router.parameters()).device
    order = np.argsort(source.lengths()[rows], kind="stable")
    outs = []
    for start in range(0, len(order), chunk):
        part = order[start : start + chunk]
        batch = source.batch(router, rows[part].tolist(), device)
        code = None if codes is None else codes.select(torch.from_numpy(part).to(device))  # type: ignore[attr-defined]
        outs.append(router.route(batch, code))  # type: ignore[arg-type]  # each router makes its own codes
    out = torch.cat(outs)
    inverse = torch.from_numpy(np.argsort(order, kind="stable")).to(out.device)
    return out[inverse]


def relation_codes(encoder: CsrEncoder, conditions: Sequence[str]) -> ConditionCode | ContextCode:
    """Return the code of each condition text (a batch of len(conditions))."""
    with torch.profiler.record_function("kgc.condition_tokens"):
        inputs = encoder.tokenizer(
            list(conditions), padding=True, truncation=True, max_length=encoder.max_length, return_tensors="pt"
        )
    return encoder.router.condition_codes({k: v.to(encoder.device) for k, v in inputs.items()})


@torch.inference_mode()
def entity_vectors(
    encoder: CsrEncoder, states: EntitySource, *, tail: Tower | None = None, chunk: int = 512
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
    encoder: CsrEncoder, states: EntitySource, heads: np.ndarray, relations: np.ndarray, conditions: Sequence[str]
) -> np.ndarray:
    """Return the routed vector of each (head, relation) query, unit length: (n, hidden) float32."""
    encoder.router.eval()
    codes = relation_codes(encoder, conditions)
    codes = codes.select(torch.from_numpy(np.asarray(relations, dtype=np.int64)).to(encoder.device))
    vecs = encode_states(encoder.router, states, heads, codes, device=encoder.device)
    return normalize(vecs.float().cpu().numpy())


def relation_sensitivity(encoder: CsrEncoder, states: EntitySource, data: KgData, triples: np.ndarray) -> float:
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
    states: EntitySource,
    data: KgData,
    triples: np.ndarray,
    answers: Answers,
    *,
    rerank_graph: list[np.ndarray] | None = None,
    factory: str = DEFAULT_FACTORY,
    k: int = 100,
    tail: Tower | None = None,
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
