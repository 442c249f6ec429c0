"""One-shot router queries without torch: the index's router run by onnxruntime with a cached condition code.

A router (``--mode csr``) index's query runs three things: the condition through the backbone (its
code), the query's lower layers and the routed top layers. The code was computed when the index was
built and is kept in the query cache (``csr-queries/`` under the cache dir, checksummed); the two
passes have a checked ONNX export, which a build on the onnxruntime path writes (float32, or int8 for
an int8 index) and which carries its tokenizer. Where both are cached under the names the
:class:`~condsearch.model.csr.encoder.CsrEncoder` that wrote them used
(:class:`~condsearch.model.csr.keys.RouterIdentity`, computed here from the manifest's encoder record
and the router folder's checked checksum), a query is tokenized with ``tokenizers``, run through both
graphs by onnxruntime, its states rounded as the state cache stores them, and pooled by the routed
graph, as the bulk onnxruntime path does. Anything
else (no trained router, a changed router, a missing or damaged code or export) is None: the caller
loads torch.

A re-index of an index built in torch bfloat16 (the router's path on AMX) runs the same way on the
router's plain copy instead of the export (:mod:`condsearch.model.csr.plain_copy`): torch, but not
transformers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from condsearch.base.cpu_kind import AUTO_DTYPE_KEY
from condsearch.base.model_sources import resolve_model
from condsearch.base.output_cache import EmbeddingCache, default_cache_dir
from condsearch.errors import CondsearchError, ModelError
from condsearch.model.artifacts.routers import checked_router_checksum, read_router_config, resolve_router, router_name
from condsearch.model.csr.keys import (
    CONTEXT,
    CSR_FILES,
    KIND,
    PLAIN_FILES,
    PLAIN_KIND,
    QUERIES_SUBDIR,
    RouterIdentity,
    state_dtype_name,
)
from condsearch.model.csr.onnx_run import read_router_sessions
from condsearch.model.encoders.base import ENCODE_BATCH_SIZE, EncodeStats
from condsearch.model.encoders.bert_inputs import case_inputs
from condsearch.model.encoders.onnx.cache import USABLE_KEY, Precision, checked_meta
from condsearch.model.encoders.onnx.run import BackendTokenizer, read_tokenizer
from condsearch.model.encoders.spec import EncoderSpec

log = logging.getLogger(__name__)


def round_as_stored(states: np.ndarray, state_dtype: str) -> np.ndarray:
    """Return states (…, tokens, hidden) float32 as the state cache gives them back: float16, or int8 per token.

    int8 is :func:`condsearch.model.csr.cache.quantize` then ``dequantize``: a float32 scale per token row,
    symmetric about zero.
    """
    if state_dtype == "float16":
        return states.astype(np.float16).astype(np.float32)
    if state_dtype == "int8":
        scale = np.maximum(np.abs(states).max(axis=-1), np.float32(1e-12)) / np.float32(127.0)
        values = np.clip(np.round(states / scale[..., None]), -127, 127).astype(np.int8)
        return values.astype(np.float32) * scale[..., None]
    return states


@dataclass(frozen=True)
class RouterRecord:
    """What a router index records of its encoder, checked against the router folder it names."""

    identity: RouterIdentity
    folder: Path
    precision: Precision
    described: dict[str, object]


def router_record(model_id: str, revision: str, described: dict[str, object], spec: EncoderSpec) -> RouterRecord | None:
    """Return the router an index records, or None where a one-shot query cannot run it without torch.

    None for an untrained router (its identity is a digest of tensors), a model that resolves to
    another revision, or a router folder whose weights (checked against ``router.json``), layer,
    config or model differ from the record: torch loads it and says why.
    """
    checksum, config = described.get("router_checksum"), described.get("router_config")
    layer, max_length = described.get("router_layer"), described.get("max_length")
    variant = described.get("router_variant")
    if not checksum or not isinstance(config, dict) or not isinstance(layer, int) or not isinstance(max_length, int):
        return None
    if described.get("pooling") != "mean" or not isinstance(variant, str) or "dtype" in described:
        return None
    if resolve_model(model_id).revision != revision or revision == "main":
        return None
    profile = spec.resolve_profile()
    folder = resolve_router(str(profile.router) if profile.router is not None else "none", model_id)
    if folder is None or router_name(folder) != described.get("router"):
        return None
    meta = read_router_config(folder)
    saved = meta.get("router_config")
    if meta.get("layer") != layer or meta.get("model_id") not in (None, model_id) or not isinstance(saved, dict):
        return None
    if any(config.get(k) != v for k, v in saved.items() if k != "layer"):
        return None
    if checked_router_checksum(folder, meta) != checksum:  # a changed router: torch refuses the index
        return None
    identity = RouterIdentity(
        model_id=model_id,
        revision=revision,
        layer=layer,
        max_length=max_length,
        variant=variant,
        config=config,
        weights=str(checksum),
        trainable="top" if variant == CONTEXT else str(meta.get("train_backbone", "top")),
        state_dtype=state_dtype_name(variant),
    )
    precision: Precision = "int8" if described.get("quantize") == "int8" else "float32"
    return RouterRecord(identity, folder, precision, described)


def cached_code(identity: RouterIdentity, condition: str, root: Path | None = None) -> np.ndarray | None:
    """Return a condition's code from the query cache (flat float32), or None where it is not cached (or damaged)."""
    return EmbeddingCache((root or default_cache_dir()) / QUERIES_SUBDIR).get(identity.condition_key(condition))


def _code_feeds(flat: np.ndarray, identity: RouterIdentity, hidden: int) -> dict[str, np.ndarray] | None:
    """Return a flat code as the routed graph's inputs (a batch of 1), or None where its size does not fit."""
    flat = np.asarray(flat, dtype=np.float32)
    if identity.variant == CONTEXT:
        k = identity.config.get("k")
        if not isinstance(k, int) or k <= 0 or flat.size == 0 or flat.size % (k * hidden):
            return None
        length = flat.size // (k * hidden)
        return {"h": flat.reshape(1, k, length, hidden), "condition_mask": np.ones((1, length), dtype=np.int64)}
    if flat.size % hidden or flat.size // hidden < 2:
        return None
    n_routed = flat.size // hidden - 1
    split = n_routed * hidden
    return {"q": flat[:split].reshape(1, n_routed, hidden), "e": flat[split:].reshape(1, hidden)}


class Passes(Protocol):
    """A router's two passes on numpy arrays: its export on onnxruntime, or its plain copy in torch bfloat16."""

    @property
    def backend(self) -> str: ...
    @property
    def precision(self) -> str: ...
    @property
    def runtime(self) -> str: ...

    def hidden_size(self) -> int: ...
    def fits(self, code: Mapping[str, np.ndarray]) -> bool: ...
    def sentence_states(self, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]: ...
    def route(
        self, states: Mapping[str, np.ndarray], mask: np.ndarray, code: Mapping[str, np.ndarray]
    ) -> np.ndarray: ...


class OneShotRouterEncoder:
    """A router index's query encoder without transformers: a tokenizer, two passes and cached condition codes.

    The passes are the router's export on onnxruntime (no torch at all), or for a re-index of an index built
    in bfloat16 its plain copy (:mod:`condsearch.model.csr.plain_copy`). Encodes under conditions whose code
    is in the query cache (the index's own, checked when loaded); another condition's missing code is a
    one-line ModelError.
    """

    pooling = "mean"

    def __init__(self, record: RouterRecord, tokenizer: BackendTokenizer, sessions: Passes, root: Path) -> None:
        self.record, self.identity = record, record.identity
        self.tokenizer, self.sessions, self._root = tokenizer, sessions, root
        self.model_id, self.revision = record.identity.model_id, record.identity.revision
        self.max_length = record.identity.max_length
        self.dim = sessions.hidden_size()
        self.backend = sessions.backend
        self.precision = sessions.precision
        self._codes: dict[str, dict[str, np.ndarray]] = {}
        self._stats = EncodeStats()

    def describe(self) -> dict[str, object]:
        """Return what the torch encoder's describe() gives for this router at its precision (int8: its runtime too)."""
        skip = ("quantize", "quantize_runtime", AUTO_DTYPE_KEY)  # a bfloat16 build's record: the export runs float32
        described = {k: v for k, v in self.record.described.items() if k not in skip}
        described["dim"] = self.dim
        if self.precision == "int8":
            described |= {"quantize": "int8", "quantize_runtime": self.sessions.runtime}
        if self.precision == "bfloat16":  # the plain copy runs the bfloat16 path the index records
            described[AUTO_DTYPE_KEY] = "bfloat16"
        return described

    def code(self, condition: str) -> dict[str, np.ndarray]:
        """Return a condition's code as the routed graph's inputs, from the query cache."""
        if condition not in self._codes:
            self.remember(condition, cached_code(self.identity, condition, self._root))
        return self._codes[condition]

    def remember(self, condition: str, flat: np.ndarray | None) -> None:
        """Keep a condition's code (flat, as the query cache holds it); a one-line ModelError if it does not fit."""
        feeds = _code_feeds(flat, self.identity, self.dim) if flat is not None else None
        if feeds is None or not self.sessions.fits(feeds):
            raise ModelError(f"the code of condition {condition!r} is not cached; query it with torch")
        self._codes[condition] = feeds

    def _tokenize(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """Return right-padded (b, L) int64 inputs, truncated to max_length as the torch encoder's are."""
        # texts alone are single segments: case_inputs pads and notes truncation as it does for CASE's pairs
        feeds, _ = case_inputs(self.tokenizer, [(text, None) for text in texts], self.max_length, self._stats)
        feeds.setdefault("token_type_ids", np.zeros_like(feeds["input_ids"]))
        return feeds

    def encode(
        self,
        texts: Sequence[str],
        conditions: Sequence[str] | str,
        *,
        batch_size: int = ENCODE_BATCH_SIZE,
        progress: bool = False,
    ) -> np.ndarray:
        """Return routed vectors of texts under one condition: (n, hidden) float32, pooled, not normalised."""
        if not isinstance(conditions, str):
            raise ModelError("a one-shot router query encodes under one condition")
        code = self.code(conditions)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        # longest first, as the torch encoder batches a corpus: a re-index's rows come in corpus order, and
        # batches of like length re-indexed 5,000 changed rows 1.25x faster (benchmarks/systems/indexing.md)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        for start in range(0, len(order), max(1, batch_size)):
            rows = order[start : start + max(1, batch_size)]
            chunk = [texts[i] for i in rows]
            feeds = self._tokenize(chunk)
            names = ("x", "k", "c")
            states = self.sessions.sentence_states(feeds)
            real = feeds["attention_mask"][:, :, None].astype(np.float32)  # padding is zeros, as collate pads
            dtype = self.identity.state_dtype
            stored = {n: round_as_stored(s * real, dtype) for n, s in zip(names, states, strict=False)}
            out[rows] = self.sessions.route(stored, feeds["attention_mask"], code)
        return out

    def report_truncation(self) -> str | None:
        n, _ = self._stats.take_truncated()
        return f"{n} input(s) longer than {self.max_length} tokens were truncated" if n else None


def _read_passes(folder: Path, meta: dict[str, Any], threads: int, *, plain: bool) -> Passes | None:
    if not plain:
        return read_router_sessions(folder, meta, threads)
    from condsearch.model.csr.plain_copy import read_plain_sessions  # imports torch, not transformers

    return read_plain_sessions(folder, meta, threads)


def load_one_shot_router(
    model_id: str,
    revision: str,
    described: dict[str, object],
    spec: EncoderSpec,
    condition: str,
    *,
    threads: int,
    plain: bool = False,
) -> OneShotRouterEncoder | None:
    """Return the router an index was built with on onnxruntime, able to encode under condition, or None.

    None (the caller loads torch) unless the router is trained and unchanged, condition's code is in
    the query cache, and the router's export of the index's precision is cached, checked and usable.
    ``plain``: its plain copy in torch bfloat16 instead (:mod:`condsearch.model.csr.plain_copy`), for a
    re-index of an index built on that path; None unless the index records it and the copy is usable.
    """
    try:
        record = router_record(model_id, revision, described, spec)
        if record is None:
            return None
        if plain and (record.precision != "float32" or described.get(AUTO_DTYPE_KEY) != "bfloat16"):
            return None
        root = default_cache_dir()
        flat = cached_code(record.identity, condition, root)
        if flat is None:
            return None
        kind, files = (PLAIN_KIND, PLAIN_FILES) if plain else (KIND, CSR_FILES)
        folder = record.identity.export_folder(root, record.precision, kind=kind)
        meta = checked_meta(folder, files, kind) if folder is not None else None
        if folder is None or meta is None or not meta.get(USABLE_KEY):
            return None
        tokenizer = read_tokenizer(folder, meta)
        sessions = _read_passes(folder, meta, threads, plain=plain) if tokenizer is not None else None
        if tokenizer is None or sessions is None:
            return None
        encoder = OneShotRouterEncoder(record, tokenizer, sessions, root)
        encoder.remember(condition, flat)  # its size fits this router
    except (CondsearchError, OSError):
        return None
    # the export runs float32 whatever the index was built in; the plain copy, the bfloat16 it records
    want = described if plain else {k: v for k, v in described.items() if k != AUTO_DTYPE_KEY}
    if encoder.describe() != want:
        return None
    return encoder
