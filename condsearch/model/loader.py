"""The one model loader: for each purpose, what runs the model, in which dtype and on how many threads.

:func:`load_model_for` decides, per purpose, the runner (torch or onnxruntime), the dtype and the threads.

The front ends (`cli/`, `serve/`, `api/`) and the jobs (`query/`, `ingest/`, `scale/`) load every model here,
so that each choice of runner and dtype is made in one place. The purposes:

- ``"one_shot"``: a `condsearch query` of an index in a folder (:class:`OneShotQuery`). A few queries
  (:data:`FEW_QUERIES`) of the index's own model on the CPU skip torch, whose import costs more than
  they do, where its checked export allows it (:mod:`condsearch.model.one_shot`), on one thread; a CASE
  index queried without --model or --profile loads as ``"resident"`` does, so that the query answers as
  the server does. After the answers, :meth:`OneShotQuery.cache_export` writes the export that lets the
  next such query of a router index skip torch.
- ``"bulk"``: a spec's model to encode a corpus with (`condsearch index`, a condition built on demand,
  `--ray`'s actors on the driver's CPU kind, :func:`condsearch.load_model`'s router): ``backend``
  ``auto`` runs the CPU kind's measured bulk path, onnxruntime from the float32 export or torch in
  bfloat16 (:mod:`condsearch.model.policy`).
- ``"resident"``: an index's model for a long-running reader, the server and the Python API's store:
  the CPU kind's measured serving path on every core, the same runner and precision a one-shot query
  of a CASE index takes.
- ``"plain"``: the torch model as it loads (``--dtype auto``'s choice): a spec's (training,
  :func:`condsearch.load_model`'s CASE model) or, given a manifest, the one an index records,
  refusing any other model, quantisation, adapter, head or router (a query of a Milvus store).

The implementation stays where it was: :func:`condsearch.model.vectorizer.load_vectorizer` (plain, a
spec), :func:`condsearch.model.policy.vectorizer_for` (plain, a manifest),
:func:`condsearch.model.policy.load_bulk_vectorizer` (bulk) and
:func:`condsearch.model.policy.load_index_model` (resident). Each is looked up when called, so that
what a test replaces there is what runs.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from condsearch.model.artifacts.profiles import MODE_CASE
from condsearch.model.encoders.cpu import Backend, CpuConfig
from condsearch.model.encoders.spec import EncoderSpec, Runtime

if TYPE_CHECKING:
    from condsearch.model.vectorizer import Vectorizer
    from condsearch.store.manifest import Manifest

#: what a model is loaded for (see the module's docstring)
Purpose = Literal["one_shot", "bulk", "resident", "plain"]
PURPOSES: tuple[Purpose, ...] = ("one_shot", "bulk", "resident", "plain")

#: up to this many queries, a one-shot query's forward pass is too small to share between threads
FEW_QUERIES = 16


@dataclass(frozen=True)
class OneShotQuery:
    """What a one-shot `condsearch query` asks of an index's model: how many queries, where, and any override.

    ``model``, ``profile`` (its --head spelling too) and ``quantize``, given, must be what the index records.
    """

    queries: int
    runtime: Runtime = Runtime()  # noqa: RUF009 - frozen
    model: str | None = None
    profile: str | None = None
    quantize: str | None = None

    @property
    def few(self) -> bool:
        return self.queries <= FEW_QUERIES

    @property
    def light(self) -> bool:
        """Whether onnxruntime may answer without torch: a few queries, on the CPU, of the index's own model."""
        overridden = self.model is not None or self.profile is not None or self.quantize is not None
        return self.few and not overridden and self.runtime.device in (None, "cpu")

    def as_served(self, manifest: Manifest) -> bool:
        """Whether the index's model loads as the server's (a CASE index, its own model and profile)."""
        return manifest.mode == MODE_CASE and self.model is None and self.profile is None

    def load(self, manifest: Manifest) -> Vectorizer:
        """Load the index's model for these queries (``load_model_for("one_shot", manifest, query=self)``)."""
        from condsearch.model.policy import load_index_model, vectorizer_for

        runtime = self.runtime
        if self.few and runtime.threads is None and not os.environ.get("OMP_NUM_THREADS"):
            # Waking torch's thread pool for a few short inputs costs more than the work, and on a busy
            # machine far more (1.9 s instead of 0.05 s for one query here). An explicit setting wins.
            runtime = replace(runtime, threads=1)
        if self.as_served(manifest):
            # a CASE index's model loads as the server and the Python API load it: the same runner and
            # precision on this CPU kind, so that the answers are equal (issue 58: first queries ran torch
            # in bfloat16 where the server ran the float32 export, or the reverse on AMX)
            if self.light:  # on the CPU (no torch to ask for CUDA), one onnxruntime thread unless asked for more
                from condsearch.model.one_shot import ONE_SHOT_THREADS

                runtime = replace(runtime, device="cpu", threads=runtime.threads or ONE_SHOT_THREADS)
            return load_index_model(manifest, runtime=runtime, quantize=self.quantize)
        return vectorizer_for(
            manifest,
            model=self.model,
            profile=self.profile,
            quantize=self.quantize,
            runtime=runtime,
            one_shot=self.light,
            one_condition=self.light,  # a query's vectors are under its condition alone
        )

    def cache_export(self, manifest: Manifest, vectorizer: Vectorizer) -> None:
        """After the answers: where torch answered what onnxruntime could not yet, write the export (checked
        against torch) that lets the next such query skip torch (:func:`condsearch.model.one_shot.cache_onnx_export`).
        """
        if self.light and vectorizer.backend == "torch" and not self.as_served(manifest):
            from condsearch.model.one_shot import cache_onnx_export

            cache_onnx_export(manifest, vectorizer)


def load_model_for(
    purpose: Purpose,
    source: EncoderSpec | Manifest,
    *,
    runtime: Runtime | None = None,
    backend: Backend | None = None,
    model: str | None = None,
    profile: str | None = None,
    quantize: str | None = None,
    query: OneShotQuery | None = None,
    reindex: tuple[Manifest, str] | None = None,
) -> Vectorizer:
    """Load the model ``source`` names, a spec or an index's manifest, for ``purpose`` (see the module's docstring).

    ``"bulk"`` and ``"plain"`` take a spec (which carries its runtime), ``"plain"`` a manifest too;
    ``"resident"`` and ``"one_shot"`` a manifest. ``runtime``: where a manifest's model runs;
    ``backend`` (bulk, resident): ``auto`` or ``torch`` [default: ``CpuConfig.backend``];
    ``model``, ``profile``, ``quantize`` (plain, a manifest): must be what the index records, a
    quantisation ``resident`` too; ``query`` (one_shot, required): the queries and their runtime;
    ``reindex`` (bulk): the manifest of the index about to be re-indexed and its condition, whose own model
    runs without torch where it may (:func:`condsearch.model.policy.load_light_reindex`).
    An argument that does not apply to the purpose is a TypeError.
    """
    from condsearch.model.policy import load_bulk_vectorizer, load_index_model, load_light_reindex, vectorizer_for

    spec = source if isinstance(source, EncoderSpec) else None
    given = {
        "runtime": runtime is not None,
        "backend": backend is not None,
        "model": model is not None,
        "profile": profile is not None,
        "quantize": quantize is not None,
        "query": query is not None,
        "reindex": reindex is not None,
    }
    takes: dict[str, set[str]] = {
        "one_shot": {"query"},
        "bulk": {"backend", "reindex"},
        "resident": {"runtime", "backend", "quantize"},
        "plain": set() if spec is not None else {"runtime", "model", "profile", "quantize"},
    }
    if purpose not in takes:
        raise ValueError(f"unknown purpose {purpose!r}; one of {', '.join(PURPOSES)}")
    extra = sorted(name for name, there in given.items() if there and name not in takes[purpose])
    if extra:
        raise TypeError(f"load_model_for({purpose!r}) of {'a spec' if spec else 'a manifest'} takes no {extra}")
    if isinstance(source, EncoderSpec):
        if purpose == "bulk":
            if reindex is not None:
                light = load_light_reindex(source, *reindex, backend=backend or CpuConfig.backend)
                if light is not None:
                    return light
            return load_bulk_vectorizer(source, backend=backend or CpuConfig.backend)
        if purpose == "plain":
            from condsearch.model.vectorizer import load_vectorizer

            return load_vectorizer(source)
        raise TypeError(f"load_model_for({purpose!r}) loads an index's manifest, not a spec")
    if purpose == "bulk":
        raise TypeError("load_model_for('bulk') loads an EncoderSpec")
    if purpose == "resident":
        return load_index_model(
            source, runtime=runtime or Runtime(), backend=backend or CpuConfig.backend, quantize=quantize
        )
    if purpose == "one_shot":
        if query is None:
            raise TypeError("load_model_for('one_shot') needs query=OneShotQuery(...)")
        return query.load(source)
    return vectorizer_for(source, model=model, profile=profile, quantize=quantize, runtime=runtime or Runtime())
