"""The router on onnxruntime: its two halves exported in float32 or int8, cached, checked against torch, run.

A :class:`~condsearch.csr.encoder.CsrEncoder` runs two passes per sentence: the lower layers once
(their states are cached) and the routed top layers plus pooling per (sentence, condition). Both are
exported here from the router's own torch modules (:mod:`condsearch.csr.onnx_graphs`), as
:mod:`condsearch.encoders.onnx_export` exports a CASE encoder: ``float32`` as they are, ``int8``
through onnxruntime's dynamic quantisation with CASE's settings (:func:`quantize_int8`). A condition's
code stays torch float32: one pass per condition, kept in the query cache. The export carries the
tokenizer too, so that a one-shot query runs it without torch or transformers (:mod:`condsearch.csr.onnx_run`,
:mod:`condsearch.csr.one_shot`).

An export is cached beside CASE's (the cache's ``onnx/``), keyed by model, revision, router variant
and config, the router's weights (its checksum, or a digest of weights changed in memory), precision
and the onnxruntime, onnx and torch versions (:meth:`condsearch.csr.keys.RouterIdentity.export_folder`).
Its ``export.json`` records each file's size and sha256,
checked on load (:func:`condsearch.encoders.onnx_files.checked_meta`): a damaged or swapped file is a
cache miss, said in one line, and the export is written again. It is written in a temporary folder
and renamed into place, so a reader never sees half of one and two exporters do not collide.

Before an export is marked usable, its routed vectors on probe sentences and conditions are compared
with torch's: float32 within :func:`~condsearch.encoders.onnx_export.probe_tolerance` (rounding at the
largest activation the probe reaches), int8 within a cosine of
:data:`~condsearch.encoders.onnx_export.MIN_INT8_COSINE`. A refused export is recorded, not retried.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from condsearch.csr.context import ContextCode, ContextRouter
from condsearch.csr.keys import CSR_FILES, KIND, LOWER_FILE, ROUTE_FILE, RouterIdentity
from condsearch.csr.onnx_graphs import ContextRoute, LowerPass, PaperRoute
from condsearch.csr.onnx_run import INPUTS, RouterSessions, read_router_sessions
from condsearch.csr.router import ConditionCode, Router, SentenceStates
from condsearch.encoders.onnx_export import (
    MIN_INT8_COSINE,
    _tokenizer_files,
    pooled_cosines,
    probe_tolerance,
    quantize_int8,
    root_quiet,
    weights_beside,
)
from condsearch.encoders.onnx_files import (
    FILES_KEY,
    FOLDER_KEY,
    FORMAT_VERSION,
    META_FILE,
    TOKENIZER_FILE,
    USABLE_KEY,
    Precision,
    checked_meta,
    file_records,
    publish_export,
    runtime_versions,
)
from condsearch.encoders.onnx_trace import as_plain, supports
from condsearch.errors import ModelError

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


class RouterEncoder(Protocol):
    """What exporting, checking and loading a router reads of its :class:`~condsearch.csr.encoder.CsrEncoder`.

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
    (runs of like length), as a one-shot query does (:mod:`condsearch.csr.one_shot`).
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


def _graphs(encoder: RouterEncoder) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Return the traceable (lower pass, routed pass) of an encoder's router; a one-line error if there are none."""
    router = encoder.router
    config: Any = router.model.config
    plain = as_plain(router.model) if supports(config.to_dict()) else None
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


def _export(
    module: torch.nn.Module, args: tuple[torch.Tensor, ...], names: dict[str, dict[int, str]], path: Path
) -> None:
    outputs = [n for n in names if n.startswith("out")]
    inputs = [n for n in names if not n.startswith("out")]
    torch.onnx.export(
        module,
        args,
        str(path),
        input_names=inputs,
        output_names=outputs,
        dynamic_axes=names,
        opset_version=17,
        dynamo=False,
    )


def export_router(encoder: RouterEncoder, folder: Path, precision: Precision, cache_name: str | None) -> None:
    """Write the two graphs of an encoder's router and a meta file (not yet usable) into an empty folder."""
    lower, route = _graphs(encoder)
    inputs, codes = _probe(encoder)
    inputs.setdefault("token_type_ids", torch.zeros_like(inputs["input_ids"]))
    tokens = {0: "batch", 1: "tokens"}
    lower_names = {name: tokens for name in INPUTS} | {"out_x": tokens}
    with torch.inference_mode():
        states = encoder.router.sentence_states(inputs)
    mask = states.mask.long()
    code = codes[-1]  # one per sentence
    if isinstance(code, ContextCode):
        route_args: tuple[torch.Tensor, ...] = (states.x, mask, code.h, code.mask.long())
        route_names = {"x": tokens, "mask": tokens, "h": {0: "codes", 2: "condition_tokens"}}
        route_names |= {"condition_mask": {0: "codes", 1: "condition_tokens"}}
    else:
        assert states.k is not None and states.c is not None  # the paper/extended router caches them
        route_args = (states.x, states.k, states.c, mask, code.q, code.e)
        route_names = {"x": tokens, "k": tokens, "c": tokens, "mask": tokens, "q": {0: "codes"}, "e": {0: "codes"}}
        lower_names |= {"out_k": tokens, "out_c": tokens}
    route_names |= {"out_pooled": {0: "batch"}}
    try:
        # the TorchScript exporter's deprecation notice and the quantiser's advice concern no user
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings(), root_quiet():
            warnings.simplefilter("ignore")
            lower_args = tuple(inputs[name] for name in INPUTS)
            for module, args, names, name in (
                (lower, lower_args, lower_names, LOWER_FILE),
                (route, route_args, route_names, ROUTE_FILE),
            ):
                plain = folder / (f"{name}.float32" if precision == "int8" else name)
                _export(module, tuple(a.clone() for a in args), names, plain)
                if precision == "int8":
                    quantize_int8(plain, folder / name)
                weights_beside(folder / name, location=f"{name}.data")
    except Exception as exc:  # noqa: BLE001 - the exporter's and quantiser's errors have no common base
        raise ModelError(
            f"{encoder.model_id}: cannot export the router to {precision} ONNX ({type(exc).__name__}: {exc})"
        ) from exc
    text, tokenizer_meta = _tokenizer_files(encoder.tokenizer)
    (folder / TOKENIZER_FILE).write_text(text)
    meta = {
        "format_version": FORMAT_VERSION,
        "kind": KIND,
        "precision": precision,
        "variant": encoder.router.config.variant,
        USABLE_KEY: False,
        "tokenizer": tokenizer_meta,
        "runtime": runtime_versions(),
        FOLDER_KEY: cache_name,
        FILES_KEY: file_records(folder, CSR_FILES),
    }
    (folder / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")


def read_router_export(folder: Path, meta: dict[str, Any], threads: int) -> OnnxRouter | None:
    """Return the router of an export whose files were checked, or None if onnxruntime cannot read it."""
    sessions = read_router_sessions(folder, meta, threads)
    return OnnxRouter(sessions) if sessions is not None else None


@contextmanager
def _largest(model: torch.nn.Module) -> Iterator[list[float]]:
    """Record the largest |activation| any module of model produces while inside (in found[0])."""
    found = [0.0]

    def note(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
        for t in output if isinstance(output, tuple) else (output,):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                found[0] = max(found[0], float(t.detach().abs().max()))

    hooks = [m.register_forward_hook(note) for m in model.modules()]
    try:
        yield found
    finally:
        for hook in hooks:
            hook.remove()


def routed_pairs(
    runner: Router | ContextRouter | OnnxRouter, encoder: RouterEncoder
) -> tuple[np.ndarray, SentenceStates]:
    """Return the probe's routed vectors by runner, (n_codes * n_sentences, hidden), and its sentence states."""
    inputs, codes = _probe(encoder)
    with torch.inference_mode():
        states = runner.sentence_states(inputs)
        vectors = [runner.route(states, code).float().numpy() for code in codes]  # type: ignore[arg-type]
    return np.concatenate(vectors), states


def disagreement(encoder: RouterEncoder, runner: OnnxRouter) -> str | None:
    """Return why an export's probe vectors stray too far from the torch router's, or None if they agree."""
    with _largest(encoder.router.model) as largest:
        want, _ = routed_pairs(encoder.router, encoder)
    got, _ = routed_pairs(runner, encoder)
    if not np.isfinite(got).all():
        return "non-finite outputs"
    if runner.precision == "int8":
        cosine = float(pooled_cosines(want, got).min())
        return None if cosine >= MIN_INT8_COSINE else f"cosine {cosine:.3f} < {MIN_INT8_COSINE}"
    gap, bound = float(np.abs(want - got).max()), probe_tolerance(encoder.router.model, largest[0])
    return None if gap <= bound else f"max difference {gap:.3g} > {bound:.3g}"


def write_router_export(
    encoder: RouterEncoder, folder: Path | None, precision: Precision, *, threads: int
) -> tuple[OnnxRouter | None, str | None]:
    """Export an encoder's router, check it against torch and cache it in folder (None: not cached).

    Returns (router, None), or (None, why) when it was refused; a refusal is cached too.
    """
    parent = folder.parent if folder is not None else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=parent))
    try:
        export_router(encoder, tmp, precision, folder.name if folder is not None else None)
        meta = json.loads((tmp / META_FILE).read_text())
        runner = read_router_export(tmp, meta, threads)
        if runner is None:
            raise ModelError(f"{encoder.model_id}: the router's {precision} ONNX export cannot be read back")
        refused = disagreement(encoder, runner)
        publish_export(tmp, folder, refused, CSR_FILES, f"the router's {precision} ONNX export")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # the sessions hold the graphs in memory
    return (None, refused) if refused is not None else (runner, None)


def load_onnx_router(
    encoder: RouterEncoder, precision: Precision, *, threads: int
) -> tuple[OnnxRouter | None, str | None]:
    """Return (the router of an encoder on onnxruntime, None) or (None, why not), exporting it the first time.

    A cached, checked export is read; a cached refusal is not retried; anything else is exported now.
    """
    folder = router_export_folder(encoder, precision)
    meta = checked_meta(folder, CSR_FILES) if folder is not None else None
    if folder is not None and meta is not None and meta.get("kind") == KIND:
        if not meta.get(USABLE_KEY):
            return None, str(meta.get("refused", "refused"))
        runner = read_router_export(folder, meta, threads)
        if runner is not None:
            return runner, None
    return write_router_export(encoder, folder, precision, threads=threads)
