"""The router on onnxruntime: its two passes as graphs, exported, checked and cached by the ONNX backend.

A :class:`~condsearch.model.csr.encoder.CsrEncoder` runs two passes per sentence: the lower layers once
(their states are cached) and the routed top layers plus pooling per (sentence, condition). Both are
built here on :class:`~condsearch.model.encoders.onnx.trace.PlainBert` with the router's weights, and the
ONNX backend (:mod:`condsearch.model.encoders.onnx.export`) writes, checks and caches them as it does CASE's
encoder: ``float32`` as they are, ``int8`` through onnxruntime's dynamic quantisation, the tokenizer
beside them, so that a one-shot query runs them without torch or transformers
(:mod:`condsearch.model.csr.onnx_run`, :mod:`condsearch.model.csr.one_shot`). A condition's code stays torch
float32: one pass per condition, kept in the query cache.

- :class:`LowerPass`: the embeddings and the layers below the router's first routed layer, on a
  tokenized batch of sentences: the states the state cache keeps (x; for the paper/extended router
  also layer t's keys k and attention context c).
- :class:`ContextRoute` and :class:`PaperRoute`: the routed layers and the mean pooling, from cached
  states (padded, with their mask) and a condition code (one per sentence, or a batch of 1 for all).

Masks cross the graphs as int64 (1 on real tokens). Nothing here runs at inference time in torch:
torch inference is :mod:`condsearch.model.csr.router` and :mod:`condsearch.model.csr.context`. An export is
cached beside CASE's, keyed by model, revision, router variant and config, the router's weights
(its checksum, or a digest of weights changed in memory) and precision
(:meth:`condsearch.model.csr.keys.RouterIdentity.export_folder`); its probe vectors are compared with
torch's before it is marked usable, and a refused export is recorded, not retried.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from condsearch.errors import ModelError
from condsearch.model.csr.context import ContextCode, ContextRouter
from condsearch.model.csr.keys import CSR_FILES, KIND, LOWER_FILE, ROUTE_FILE, RouterIdentity
from condsearch.model.csr.onnx_run import RouterSessions, read_router_sessions
from condsearch.model.csr.router import ConditionCode, Router, SentenceStates
from condsearch.model.encoders.onnx.cache import Precision, checked_meta, read_meta, refusal
from condsearch.model.encoders.onnx.export import Graph, export_graphs, write_checked, write_meta
from condsearch.model.encoders.onnx.export import disagreement as backend_disagreement
from condsearch.model.encoders.onnx.run import INPUTS
from condsearch.model.encoders.onnx.trace import PlainBert, heads, merge, plain_bert

log = logging.getLogger(__name__)

#: the router variants whose float32 export routed more pairs/s than torch float32 on this CPU, which
#: ``--backend auto`` therefore runs on onnxruntime: each of them, for new sentences and over cached states
#: (MiniLM, 2 loaded cores; 1 thread: 2.1x for the shipped context router; benchmarks/systems/results/csr_paths*.json)
FASTER_ON_ONNX = frozenset({"context", "paper", "extended"})
_PROBE_SENTENCES = [
    "A girl in an orange dress serves the ball.",
    "two dogs run on the beach",
    "short",
    "a probe sentence, with a comma, that is a little longer than the others are",
]
_PROBE_CONDITIONS = ["the colour of the dress", "sport", "the mood of the people in the picture"]


def _mean_pool(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    keep = mask.unsqueeze(-1).to(x.dtype)
    return (x * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1.0)


class LowerPass(nn.Module):
    """Embeddings and layers 0..t-1 of a sentence batch: x (b, L, hidden); with ``keys``, also layer t's k and c."""

    def __init__(self, plain: PlainBert, layer: int, *, keys: bool) -> None:
        super().__init__()
        self.plain, self.layer, self.keys = plain, layer, keys

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.plain.embed(input_ids, token_type_ids)
        keep = attention_mask.bool()[:, None, None, :]
        layers: Any = self.plain.encoder.layer
        for j in range(self.layer):
            x = layers[j](x, keep)
        if not self.keys:
            return x
        t = layers[self.layer]
        return x, t.attention.self.key(x), t.self_context(x, keep)


class ContextRoute(nn.Module):
    """The context router's top k layers with the condition's keys and values first, then mean pooling.

    forward(x (b, L, hidden), mask (b, L), h (b|1, k, Lc, hidden), condition_mask (b|1, Lc)) -> (b, hidden).
    """

    def __init__(self, plain: PlainBert, routed: Sequence[int]) -> None:
        super().__init__()
        layers: Any = plain.encoder.layer
        self.layers = nn.ModuleList(layers[j] for j in routed)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, h: torch.Tensor, condition_mask: torch.Tensor
    ) -> torch.Tensor:
        b = x.shape[0]
        h = h.expand(b, -1, -1, -1)
        keep = torch.cat([condition_mask.expand(b, -1), mask], dim=1).bool()[:, None, None, :]
        layer: Any
        for i, layer in enumerate(self.layers):
            att, n = layer.attention.self, layer.n_heads
            hc = h[:, i]
            k = torch.cat([heads(att.key(hc), n), heads(att.key(x), n)], dim=2)
            v = torch.cat([heads(att.value(hc), n), heads(att.value(x), n)], dim=2)
            context = merge(F.scaled_dot_product_attention(heads(att.query(x), n), k, v, keep))
            x = layer.finish(context, x)
        return _mean_pool(x, mask)


class PaperRoute(nn.Module):
    """The paper/extended router's routed layers (eq. 1's ``c * (1 + g w)``), mean pooling and projection.

    forward(x, k, c (b, L, hidden), mask (b, L), q (b|1, n_routed, hidden), e (b|1, hidden)) -> (b, hidden).
    ``gains``: each routed layer's multiplier of w (the learned gain times the router's w scale).
    """

    def __init__(
        self, plain: PlainBert, routed: Sequence[int], gains: Sequence[float], projection: nn.Module | None
    ) -> None:
        super().__init__()
        layers: Any = plain.encoder.layer
        self.layers = nn.ModuleList(layers[j] for j in routed)
        self.gains = [float(g) for g in gains]
        self.projection = projection
        c: Any = plain.config
        self.scale = float(c.hidden_size // c.num_attention_heads) ** -0.5

    def forward(
        self,
        x: torch.Tensor,
        k: torch.Tensor,
        c: torch.Tensor,
        mask: torch.Tensor,
        q: torch.Tensor,
        e: torch.Tensor,
    ) -> torch.Tensor:
        real = mask.bool()
        keep = real[:, None, None, :]
        keys, context = k, c
        layer: Any
        for i, layer in enumerate(self.layers):
            n = layer.n_heads
            if i > 0:
                context = layer.self_context(x, keep)
                keys = layer.attention.self.key(x)
            qh = q[:, i].unsqueeze(1)  # (b|1, 1, hidden)
            scores = (heads(qh, n) @ heads(keys, n).transpose(-1, -2)).squeeze(2) * self.scale  # (b, H, L)
            w = scores.masked_fill(~real[:, None, :], float("-inf")).softmax(dim=-1).mean(dim=1)
            context = context * (1.0 + self.gains[i] * w).unsqueeze(-1)
            x = layer.finish(context, x)
        pooled = _mean_pool(x, mask)
        return self.projection(pooled, e) if self.projection is not None else pooled


class RouterEncoder(Protocol):
    """What exporting, checking and loading a router reads of its :class:`~condsearch.model.csr.encoder.CsrEncoder`.

    Named here, not imported: the encoder uses its export (:meth:`CsrEncoder.use_onnx`), not the reverse.
    """

    @property
    def model_id(self) -> str: ...
    @property
    def router(self) -> Router | ContextRouter: ...
    @property
    def tokenizer(self) -> Any: ...  # transformers' fast tokenizer of the model
    @property
    def max_length(self) -> int: ...
    @property
    def identity(self) -> RouterIdentity: ...
    @property
    def cache_root(self) -> Path: ...


def router_export_folder(encoder: RouterEncoder, precision: Precision) -> Path | None:
    """Return where the router export of an encoder is cached, or None if it is unsafe to cache (revision 'main')."""
    w_scale = float(getattr(encoder.router, "w_scale", 1.0))
    return encoder.identity.export_folder(encoder.cache_root, precision, w_scale=w_scale)


class OnnxRouter:
    """A router's sentence pass and routed pass on onnxruntime, with the torch router's interface.

    Both take and give torch tensors on the CPU; the passes run as :class:`RouterSessions` runs them
    (runs of like length), as a one-shot query does (:mod:`condsearch.model.csr.one_shot`).
    """

    backend = "onnxruntime"

    def __init__(self, sessions: RouterSessions) -> None:
        self.sessions = sessions
        self.precision: Precision = sessions.precision
        self.variant = sessions.variant
        self.runtime = sessions.runtime

    def sentence_states(self, inputs: dict[str, torch.Tensor]) -> SentenceStates:
        """Run the lower layers on a tokenized batch of sentences (torch tensors on the CPU)."""
        feeds = {name: inputs[name].cpu().numpy().astype(np.int64) for name in INPUTS if name in inputs}
        tensors = [torch.from_numpy(o) for o in self.sessions.sentence_states(feeds)]
        k, c = (tensors[1], tensors[2]) if len(tensors) == 3 else (None, None)
        return SentenceStates(tensors[0], k, c, torch.from_numpy(feeds["attention_mask"].astype(bool)))

    def route(self, states: SentenceStates, code: ContextCode | ConditionCode) -> torch.Tensor:
        """Finish cached states under condition codes (one per sentence, or a batch of 1): (b, hidden) float32."""
        named: dict[str, np.ndarray] = {"x": states.x.float().cpu().numpy()}
        if states.k is not None and states.c is not None:
            named |= {"k": states.k.float().cpu().numpy(), "c": states.c.float().cpu().numpy()}
        if isinstance(code, ContextCode):
            per_code = {"h": code.h.float().cpu().numpy(), "condition_mask": code.mask.cpu().numpy().astype(np.int64)}
        else:
            per_code = {"q": code.q.float().cpu().numpy(), "e": code.e.float().cpu().numpy()}
        mask = states.mask.cpu().numpy().astype(np.int64)
        return torch.from_numpy(self.sessions.route(named, mask, per_code))


def _passes(encoder: RouterEncoder) -> tuple[nn.Module, nn.Module]:
    """Return the traceable (lower pass, routed pass) of an encoder's router; a one-line error if there are none."""
    router = encoder.router
    plain = plain_bert(router.model)
    if plain is None:
        raise ModelError(f"{encoder.model_id}: the router runs on onnxruntime for plain BERT encoders only")
    if isinstance(router, ContextRouter):
        return LowerPass(plain, router.layer, keys=False), ContextRoute(plain, router.routed)
    gains = [router.w_scale * g for g in router.gains()]
    return LowerPass(plain, router.layer, keys=True), PaperRoute(plain, router.routed, gains, router.projection)


def _probe(encoder: RouterEncoder) -> tuple[dict[str, torch.Tensor], list[ContextCode | ConditionCode]]:
    """Return the probe's tokenized sentences and its condition codes: one per condition, then one per sentence."""
    tokenizer, router = encoder.tokenizer, encoder.router

    def tokenize(texts: list[str]) -> dict[str, torch.Tensor]:
        enc = tokenizer(texts, padding=True, truncation=True, max_length=encoder.max_length, return_tensors="pt")
        return {k: v.cpu() for k, v in enc.items()}

    codes: list[Any] = [router.condition_codes(tokenize([c])) for c in _PROBE_CONDITIONS]
    rows = [codes[i % len(codes)] for i in range(len(_PROBE_SENTENCES))]
    return tokenize(_PROBE_SENTENCES), [*codes, type(rows[0]).cat(rows)]


def _graphs(encoder: RouterEncoder) -> list[Graph]:
    """Return the router's two graphs, with the probe's sentences and states as their example inputs."""
    lower, route = _passes(encoder)
    inputs, codes = _probe(encoder)
    inputs.setdefault("token_type_ids", torch.zeros_like(inputs["input_ids"]))
    tokens = {0: "batch", 1: "tokens"}
    with torch.inference_mode():
        states = encoder.router.sentence_states(inputs)
    mask = states.mask.long()
    code = codes[-1]  # one per sentence
    lower_outputs = ["out_x"]
    if isinstance(code, ContextCode):
        route_args: tuple[torch.Tensor, ...] = (states.x, mask, code.h, code.mask.long())
        route_inputs = {"x": tokens, "mask": tokens, "h": {0: "codes", 2: "condition_tokens"}}
        route_inputs |= {"condition_mask": {0: "codes", 1: "condition_tokens"}}
    else:
        assert states.k is not None and states.c is not None  # the paper/extended router caches them
        route_args = (states.x, states.k, states.c, mask, code.q, code.e)
        route_inputs = {"x": tokens, "k": tokens, "c": tokens, "mask": tokens, "q": {0: "codes"}, "e": {0: "codes"}}
        lower_outputs += ["out_k", "out_c"]
    lower_axes = {name: tokens for name in (*INPUTS, *lower_outputs)}
    route_axes = route_inputs | {"out_pooled": {0: "batch"}}
    lower_args = tuple(inputs[name] for name in INPUTS)
    return [
        Graph(LOWER_FILE, lower, lower_args, INPUTS, lower_outputs, lower_axes),
        Graph(ROUTE_FILE, route, route_args, list(route_inputs), ["out_pooled"], route_axes),
    ]


def export_router(encoder: RouterEncoder, folder: Path, precision: Precision, cache_name: str | None) -> None:
    """Write an encoder's router's two graphs, its tokenizer and a meta file (not yet usable) into an empty folder."""
    failure = f"{encoder.model_id}: cannot export the router to {precision} ONNX"
    export_graphs(_graphs(encoder), folder, precision, failure)
    variant = encoder.router.config.variant
    write_meta(folder, encoder.tokenizer, precision, cache_name, CSR_FILES, kind=KIND, variant=variant)


def read_router_export(folder: Path, meta: dict[str, Any], threads: int) -> OnnxRouter | None:
    """Return the router of an export whose files were checked, or None if onnxruntime cannot read it."""
    sessions = read_router_sessions(folder, meta, threads)
    return OnnxRouter(sessions) if sessions is not None else None


class TensorPasses(Protocol):
    """What runs a router's two passes on torch tensors: the torch router, its export, or a bfloat16 runner."""

    def sentence_states(self, inputs: dict[str, torch.Tensor]) -> SentenceStates: ...
    def route(self, states: SentenceStates, code: Any) -> torch.Tensor: ...


def routed_pairs(runner: TensorPasses, encoder: RouterEncoder) -> tuple[np.ndarray, SentenceStates]:
    """Return the probe's routed vectors by runner, (n_codes * n_sentences, hidden), and its sentence states."""
    inputs, codes = _probe(encoder)
    with torch.inference_mode():
        states = runner.sentence_states(inputs)
        vectors = [runner.route(states, code).float().numpy() for code in codes]
    return np.concatenate(vectors), states


def disagreement(encoder: RouterEncoder, runner: OnnxRouter) -> str | None:
    """Return why an export's probe vectors stray too far from the torch router's, or None if they agree."""
    want, got = (lambda: routed_pairs(encoder.router, encoder)[0]), (lambda: routed_pairs(runner, encoder)[0])
    return backend_disagreement(encoder.router.model, want, got, runner.precision)


def write_router_export(
    encoder: RouterEncoder, folder: Path | None, precision: Precision, *, threads: int
) -> tuple[OnnxRouter | None, str | None]:
    """Export an encoder's router, check it against torch and cache it in folder (None: not cached).

    Returns (router, None), or (None, why) when it was refused; a refusal is cached too.
    """
    return write_checked(
        folder,
        write=lambda tmp, cache_name: export_router(encoder, tmp, precision, cache_name),
        read=lambda tmp: read_router_export(tmp, read_meta(tmp) or {}, threads),
        check=lambda runner: disagreement(encoder, runner),
        graphs=CSR_FILES,
        what=f"the router's {precision} ONNX export",
        model_id=encoder.model_id,
    )


def load_onnx_router(
    encoder: RouterEncoder, precision: Precision, *, threads: int
) -> tuple[OnnxRouter | None, str | None]:
    """Return (the router of an encoder on onnxruntime, None) or (None, why not), exporting it the first time.

    A cached, checked export is read; a cached refusal is not retried; anything else is exported now.
    """
    folder = router_export_folder(encoder, precision)
    meta = checked_meta(folder, CSR_FILES, KIND) if folder is not None else None
    if folder is not None and meta is not None:
        refused = refusal(meta)
        if refused is not None:
            return None, refused
        runner = read_router_export(folder, meta, threads)
        if runner is not None:
            return runner, None
    return write_router_export(encoder, folder, precision, threads=threads)
