"""CSR mode: cached sentence states + cached condition queries -> routed sentence vectors."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from condsearch.base.cpu_kind import AUTO_DTYPE_KEY
from condsearch.base.model_sources import ModelSource, resolve_model
from condsearch.base.output_cache import EmbeddingCache, default_cache_dir
from condsearch.errors import ModelError
from condsearch.model.artifacts.routers import resolve_router, router_model_id, router_name
from condsearch.model.csr.bfloat16 import Bfloat16Router
from condsearch.model.csr.cache import RequestStates, StateCache, collate, default_state_dtype, split, text_key
from condsearch.model.csr.context import CONTEXT, CONTEXT_DEFAULT, ContextCode, ContextConfig, ContextRouter
from condsearch.model.csr.context_weights import load_context_weights, saved_context_config
from condsearch.model.csr.keys import CODE_MEMORY_BYTES, QUERIES_SUBDIR, RouterIdentity
from condsearch.model.csr.onnx import OnnxRouter, load_onnx_router
from condsearch.model.csr.router import PRESETS, ConditionCode, Router, RouterConfig, SentenceStates
from condsearch.model.csr.variants import DEFAULT_VARIANT, ROUTER_VARIANTS
from condsearch.model.csr.weights import load_router_weights, saved_config
from condsearch.model.encoders.backbone import load_backbone
from condsearch.model.encoders.base import EncodeStats
from condsearch.model.encoders.bert import pick_device
from condsearch.model.encoders.cpu import check_quantize
from condsearch.progress import CACHING_SENTENCES, ROUTING, progress_bar

log = logging.getLogger(__name__)

AnyConfig = RouterConfig | ContextConfig
AnyCode = ConditionCode | ContextCode


def weights_digest(module: torch.nn.Module) -> str:
    """Return the sha256 of a module's parameters as they are now (names, shapes and float32 bytes)."""
    h = hashlib.sha256()
    for name, p in module.named_parameters():
        h.update(f"{name}{tuple(p.shape)}".encode())
        h.update(p.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class CsrEncoder:
    """Encode sentences under a condition with the router tri-encoder (SPEC §2.2).

    What runs its two per-sentence passes (:attr:`runner`): the torch router, its onnxruntime
    export (:meth:`use_onnx`; ``quantize="int8"`` always), or the torch router under bfloat16 autocast
    (:meth:`use_bfloat16`). A condition's code is torch float32 in every case.
    """

    pooling = "mean"

    def __init__(
        self,
        source: ModelSource,
        *,
        router: str | None = None,
        layer: int | None = None,
        variant: RouterConfig | ContextConfig | str | None = None,
        device: str | None = None,
        max_length: int | None = None,
        cache_dir: Path | None = None,
        state_dtype: torch.dtype | None = None,
        trust_remote_code: bool = False,
        quantize: str = "none",
        threads: int | None = None,
    ) -> None:
        # float32, as the CASE encoders load it (the router's arithmetic and its state cache are float32)
        self.tokenizer, model = load_backbone(source, trust_remote_code=trust_remote_code)
        folder = resolve_router(router, source.model_id)
        n_layers = int(getattr(model.config, "num_hidden_layers", 0))
        config = self._router_config(folder, variant, layer, n_layers)
        self.router: Router | ContextRouter
        try:
            self.router = ContextRouter(model, config) if isinstance(config, ContextConfig) else Router(model, config)
        except ValueError as exc:
            raise ModelError(f"{source.model_id}: {exc}") from exc
        n_layers = len(self.router.routed) + self.router.layer
        if layer is not None and (layer if layer >= 0 else n_layers + layer) != self.router.layer:
            raise ModelError(f"router {folder} routes from layer {self.router.layer}, not {layer}")
        checksum = ""  # the weights' sha256: an untrained router has none
        if folder is not None:
            meta_model = router_model_id(folder)
            if meta_model not in (None, source.model_id):
                raise ModelError(f"router {folder} was trained for {meta_model}, not {source.model_id}")
            if isinstance(self.router, ContextRouter):  # each checks the weights against router.json first
                checksum = load_context_weights(self.router, folder)
            else:
                checksum = load_router_weights(self.router, folder)
        self.router_name = router_name(folder)
        self.router_checksum = checksum
        self.device = pick_device(device)
        if check_quantize(quantize) == "int8" and self.device.type != "cpu":
            raise ModelError("--quantize int8 runs on the CPU from float32 weights; drop --device")
        self.router.to(self.device).eval()
        self.source = source
        self.model_id = source.model_id
        self.revision = source.revision
        self.dim = int(model.config.hidden_size)
        self.max_length = max_length or min(int(self.tokenizer.model_max_length), 512)
        self._root = cache_dir or default_cache_dir()
        self._state_dtype = state_dtype or default_state_dtype(self.router.config.variant)
        self._queries = EmbeddingCache(self._root / QUERIES_SUBDIR, max_bytes=CODE_MEMORY_BYTES)
        #: a server's encoder (:meth:`serve`) writes nothing a request makes: see :meth:`serve`
        self.transient = False
        #: what runs the lower layers and the routed layers: the torch router, its onnxruntime export, or the
        #: torch router in bfloat16
        self.runner: Router | ContextRouter | OnnxRouter | Bfloat16Router = self.router
        self.refresh_identity()
        self._truncations = EncodeStats()  # counted per thread, like every encoder's
        if quantize == "int8":
            self.use_onnx("int8", threads=threads or torch.get_num_threads())

    def serve(self) -> None:
        """Keep what requests make in memory only: a server's or a Python API store's encoder, whose weights are fixed.

        A query text's sentence states live for its request (:class:`~condsearch.model.csr.cache.RequestStates`), and a
        condition's code that the query cache lacks is held among the last codes used (at most
        :data:`~condsearch.model.csr.keys.CODE_MEMORY_BYTES`), not written: what a client sends leaves nothing on disk
        (issue 58). Both caches are still read: an indexed condition's code, a corpus row's states.
        """
        self.transient = True

    @property
    def backend(self) -> str:
        """Return what runs the router's passes: torch or onnxruntime."""
        return "onnxruntime" if isinstance(self.runner, OnnxRouter) else "torch"

    @property
    def precision(self) -> str:
        """Return the precision of the router's passes: float32, bfloat16 (torch autocast) or int8 (onnxruntime)."""
        return str(getattr(self.runner, "precision", "float32"))

    @property
    def cache_root(self) -> Path:
        """Return the cache folder this encoder's states, condition codes and exports live under."""
        return self._root

    def use_onnx(self, precision: str, *, threads: int) -> bool:
        """Run the router's passes on its onnxruntime export of precision (exported and checked the first time).

        Returns whether it does. A float32 export that cannot be made or was refused keeps torch (said
        in the log); int8 has no such fallback: a one-line ModelError.
        """
        if self.device.type != "cpu":
            raise ModelError("the router runs on onnxruntime on the CPU only")
        try:
            runner, refused = load_onnx_router(self, "int8" if precision == "int8" else "float32", threads=threads)
        except ModelError as exc:
            if precision == "int8":
                raise
            runner, refused = None, str(exc)
        if runner is None:
            if precision == "int8":
                raise ModelError(f"{self.model_id}: the router's int8 outputs stray from float32 ({refused})")
            log.warning("the router keeps torch: its float32 ONNX export was refused (%s)", refused)
            return False
        self.runner = runner
        self.refresh_identity()
        return True

    def use_bfloat16(self) -> bool:
        """Run the router's two passes in torch under bfloat16 autocast, on the CPU; return whether it does.

        Only the context router, the variant measured so, and only from float32: another variant, or an
        int8 export, keeps what it has. The cached states are shared with the
        float32 paths, as onnxruntime's are: they are stored at the state cache's precision either way, and
        bfloat16's vectors differ from float32's within the bound measured (docs/indexing.md).
        """
        if self.device.type != "cpu":
            raise ModelError("the router runs in bfloat16 on the CPU only")
        if self.precision == "int8" or not isinstance(self.router, ContextRouter):
            return False
        self.runner = Bfloat16Router(self.router)
        return True

    def refresh_identity(self) -> None:
        """Name the sentence and condition caches after the weights they depend on.

        Call it after changing the router's weights in place (training, an initial profile): a
        cache filled with other weights is then never read. The paper/extended router's cached
        states depend only on the frozen backbone below its layer t; the context router's on its
        whole backbone, so its state cache is named after the router's checksum (or, untrained or
        trained in memory, a digest of the weights themselves).
        """
        weights = self.router_checksum or f"params:{weights_digest(self.router)}"
        if getattr(self, "weights_ident", weights) != weights and self.runner is not self.router:
            # the export holds the weights it was made from: never run it for others
            if self.precision == "int8":
                raise ModelError("the router's weights changed under its int8 export; load the encoder again")
            self.runner = self.router
        self.weights_ident = weights
        self.identity = RouterIdentity(
            model_id=self.model_id,
            revision=self.revision,
            layer=self.router.layer,
            max_length=self.max_length,
            variant=self.router.config.variant,
            config=self.router.config.to_dict(),
            weights=weights,
            trainable=str(self.router.trainable) if isinstance(self.router, Router) else "top",
            state_dtype=str(self._state_dtype).removeprefix("torch."),
        )
        backbone = self.identity.backbone
        # onnxruntime's float32 states equal torch's up to rounding (tests/model/csr/test_csr_onnx.py), int8's do not
        self._state_ident = backbone + ("|pass=int8" if self.precision == "int8" else "")
        digest = hashlib.sha256(self._state_ident.encode()).hexdigest()[:16]
        self.states = StateCache(
            self._root / "csr-states" / digest, dtype=self._state_dtype, names=self.router.state_names
        )
        self._query_ident = self.identity.query_ident

    def describe(self) -> dict[str, object]:
        """Return what an index records of this encoder; int8 adds ``quantize``, as a CASE int8 encoder does."""
        described: dict[str, object] = {
            "model_id": self.model_id,
            "revision": self.revision,
            "dim": self.dim,
            "pooling": self.pooling,
            "max_length": self.max_length,
            "router_layer": self.router.layer,
            "router": self.router_name,
            "router_variant": self.router.config.variant,
            "router_config": self.router.config.to_dict(),
            "router_checksum": self.router_checksum,
        }
        if self.precision == "int8":  # never mixed with float32 vectors
            described |= {"quantize": "int8", "quantize_runtime": str(getattr(self.runner, "runtime", ""))}
        if self.precision == "bfloat16":  # what the CPU kind chose, as a CASE encoder records it; not fingerprinted
            described[AUTO_DTYPE_KEY] = "bfloat16"
        return described

    @property
    def variant(self) -> str:
        """Return the router variant: paper, extended or context."""
        return str(self.router.config.variant)

    def _tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        enc = self.tokenizer(
            list(texts), padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        lengths = self.tokenizer(list(texts), add_special_tokens=True)["input_ids"]
        self._truncations.note_many(sum(len(ids) > self.max_length for ids in lengths), [])
        return {k: v.to(self.device) for k, v in enc.items()}

    @torch.inference_mode()
    def cache_sentences(
        self,
        texts: Sequence[str],
        *,
        batch_size: int = 64,
        progress: bool = False,
        into: StateCache | RequestStates | None = None,
    ) -> list[str]:
        """Compute and store the states of every sentence not yet cached (in the state cache, or ``into``); return all
        keys."""
        states_of = self.states if into is None else into
        keys = [text_key(self._state_ident, t) for t in texts]
        todo = sorted(dict.fromkeys(keys[i] for i in states_of.missing(keys)))
        text_of = dict(zip(keys, texts, strict=True))
        todo.sort(key=lambda k: -len(text_of[k]))
        bar = progress_bar(total=len(todo), desc=CACHING_SENTENCES, unit="sent", enabled=progress and bool(todo))
        shard_keys: list[str] = []
        shard_states: list = []
        for start in range(0, len(todo), batch_size):
            chunk = todo[start : start + batch_size]
            states = self.runner.sentence_states(self._tokenize([text_of[k] for k in chunk]))
            shard_keys += chunk
            shard_states += split(states)
            if len(shard_keys) >= 4096:
                states_of.put(shard_keys, shard_states)
                shard_keys, shard_states = [], []
            bar.update(len(chunk))
        states_of.put(shard_keys, shard_states)
        bar.close()
        return keys

    @staticmethod
    def _router_config(
        folder: Path | None, variant: AnyConfig | str | None, layer: int | None, n_layers: int
    ) -> AnyConfig:
        """Return the config of a trained router folder, else of the named variant (default: paper).

        For the context variant a layer names the first layer that sees the condition: k = T - layer
        (or -layer when negative).
        """
        if folder is not None:
            config: AnyConfig = saved_context_config(folder) or saved_config(folder)
            if isinstance(variant, RouterConfig | ContextConfig) or (variant is not None and variant != config.variant):
                name = variant.variant if isinstance(variant, RouterConfig | ContextConfig) else variant
                raise ModelError(f"router {folder} is the {config.variant} variant, not {name}")
            return config  # a --router-layer that disagrees is refused once the layer count is known
        if isinstance(variant, RouterConfig | ContextConfig):
            config = variant
        else:
            name = variant or DEFAULT_VARIANT
            if name not in ROUTER_VARIANTS:
                raise ModelError(f"unknown router variant {name!r} (use {', '.join(ROUTER_VARIANTS)})")
            config = CONTEXT_DEFAULT if name == CONTEXT else PRESETS[name]  # type: ignore[index]
        if layer is None:
            return config
        if isinstance(config, ContextConfig):
            return replace(config, k=-layer if layer < 0 else n_layers - layer)
        return replace(config, layer=layer)

    @torch.inference_mode()
    def condition_code(self, condition: str) -> AnyCode:
        """Return the code of one condition (a batch of 1), through the query cache."""
        key = self.identity.condition_key(condition)
        found = self._queries.get(key)
        if found is None:
            found = self.router.condition_codes(self._tokenize([condition])).flat()[0].float().cpu().numpy()
            if self.transient:
                self._queries.keep(key, found)
            else:
                self._queries.put_many([key], found[None])
        flat = torch.from_numpy(np.asarray(found, dtype=np.float32)).to(self.device)[None]
        return self.router.code_from_flat(flat)

    @torch.inference_mode()
    def encode(
        self, texts: Sequence[str], conditions: Sequence[str] | str, *, batch_size: int = 64, progress: bool = False
    ) -> np.ndarray:
        """Return routed vectors of texts under one condition, or each under its own: (n, hidden) float32."""
        if isinstance(conditions, str):
            return self._encode_under(texts, conditions, batch_size=batch_size, progress=progress)
        return self._encode_rows(texts, conditions, batch_size=batch_size, progress=progress)

    def _encode_under(self, texts: Sequence[str], condition: str, *, batch_size: int, progress: bool) -> np.ndarray:
        # one condition code; each distinct text routed once
        held = self._states_of_request()
        keys = self.cache_sentences(texts, batch_size=batch_size, progress=progress, into=held)
        q = self.condition_code(condition)
        distinct = list(dict.fromkeys(keys))
        # length-sorted batches keep padding (and so the per-pair work) small
        length = dict(zip(distinct, held.lengths(distinct), strict=True))
        distinct.sort(key=lambda k: -length[k])
        out = np.empty((len(distinct), self.dim), dtype=np.float32)
        bar = progress_bar(total=len(distinct), desc=ROUTING, unit="sent", enabled=progress)
        for start in range(0, len(distinct), batch_size):
            chunk = distinct[start : start + batch_size]
            states = collate(held.get(chunk), device=self.device)
            out[start : start + len(chunk)] = self.route(states, q).float().cpu().numpy()
            bar.update(len(chunk))
        bar.close()
        row = {k: i for i, k in enumerate(distinct)}
        return out[[row[k] for k in keys]]

    def _states_of_request(self) -> StateCache | RequestStates:
        """Return where an encode call finds and puts sentence states: the cache, or (serving) memory over it."""
        return RequestStates(self.states) if self.transient else self.states

    def route(self, states: SentenceStates, code: AnyCode | None) -> torch.Tensor:
        """Finish the forward pass of cached sentence states under condition codes: (b, hidden)."""
        runner = self.runner
        if code is None or isinstance(runner, Router | ContextRouter):  # the plain forward pass is torch's alone
            return self.router.route(states, code)  # type: ignore[arg-type]  # each router makes its own codes
        return runner.route(states, code)  # type: ignore[arg-type]  # bfloat16 runs a context router: its codes

    def _encode_rows(
        self, texts: Sequence[str], conditions: Sequence[str], *, batch_size: int, progress: bool
    ) -> np.ndarray:
        # one condition code per distinct condition; each row routed under its own
        if len(texts) != len(conditions):
            raise ValueError("texts and conditions differ in length")
        held = self._states_of_request()
        keys = self.cache_sentences(texts, batch_size=batch_size, progress=progress, into=held)
        codes = {c: self.condition_code(c) for c in dict.fromkeys(conditions)}
        length = held.lengths(keys)
        order = sorted(range(len(keys)), key=lambda i: -length[i])
        out = np.empty((len(keys), self.dim), dtype=np.float32)
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            states = collate(held.get([keys[i] for i in rows]), device=self.device)
            batch = [codes[conditions[i]] for i in rows]
            code = type(batch[0]).cat(batch)  # type: ignore[arg-type]  # one router: one code type
            out[rows] = self.route(states, code).float().cpu().numpy()
        return out

    def report_truncation(self) -> str | None:
        n, _ = self._truncations.take_truncated()
        return f"{n} input(s) longer than {self.max_length} tokens were truncated" if n else None


def load_csr_encoder(model: str | None = None, **kwargs: object) -> CsrEncoder:
    """Resolve a model name or folder and build the CSR encoder on it (one load at a time per process:
    :func:`condsearch.model.encoders.first_use.loading`)."""
    from condsearch.model.encoders.first_use import loading

    with loading(model):
        return CsrEncoder(resolve_model(model), **kwargs)  # type: ignore[arg-type]
