"""The Python API's model: ``condsearch.load_model`` and the :class:`Model` it returns."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from condsearch.api.arguments import _condition, _mode, _router, _strings
from condsearch.errors import CondsearchError, ModelError
from condsearch.model.artifacts import MODE_CASE, MODE_CSR, Mode
from condsearch.model.encoders import ENCODE_BATCH_SIZE, CpuConfig, Quantize, check_quantize

if TYPE_CHECKING:
    import numpy as np

    from condsearch.model import Vectorizer


class Model:
    """A loaded encoder in its mode: CASE with its profile (adapter, head), or csr with its router.

    Texts under a condition become unit vectors (:meth:`encode`).
    """

    def __init__(self, vectorizer: Vectorizer) -> None:
        self.vectorizer = vectorizer

    def __repr__(self) -> str:
        return f"condsearch.Model({self.model_id!r}, mode={self.mode!r})"

    @property
    def dim(self) -> int:
        """Return the vectors' dimension."""
        return self.vectorizer.dim

    @property
    def model_id(self) -> str:
        return self.vectorizer.encoder.model_id

    @property
    def mode(self) -> Mode:
        """Return how the vectors are made: 'case' (the CASE bi-encoder) or 'csr' (the router tri-encoder)."""
        return MODE_CSR if self.vectorizer.mode == MODE_CSR else MODE_CASE

    @property
    def router(self) -> str | None:
        """Return the router as an index records it ('none', 'default' or its folder); None in CASE mode."""
        if self.mode != MODE_CSR:
            return None
        return str(self.vectorizer.encoder.describe().get("router"))

    def encode(
        self,
        texts: Sequence[str],
        condition: str,
        *,
        batch_size: int = ENCODE_BATCH_SIZE,
        show_progress_bar: bool = False,
        normalize_embeddings: bool = True,
    ) -> np.ndarray:
        """Return the vectors of texts under condition: (n, dim) float32, unit length.

        batch_size, show_progress_bar: as sentence-transformers' ``encode`` spells them.
        normalize_embeddings: the vectors are always unit length (the index's cosine); False is refused.
        """
        if isinstance(texts, str):
            raise CondsearchError("encode takes a list of texts; wrap one text in a list")
        if not normalize_embeddings:
            raise CondsearchError("normalize_embeddings=False: condsearch's vectors are always unit length")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise CondsearchError(f"batch_size must be a positive integer, not {batch_size!r}")
        from condsearch.store import condition_key

        # in the form that names an index of this model, as the server's /v1/embeddings encodes it
        return self.vectorizer.encode(
            _strings(texts, "texts", "text"),
            condition_key(_condition(condition), self.model_id),
            batch_size=batch_size,
            progress=show_progress_bar,
        )


def load_model(
    model: str | None = None,
    *,
    mode: str | None = None,
    profile: str | None = None,
    router: str | Path | None = None,
    device: str | None = None,
    quantize: Quantize = CpuConfig.quantize,
    threads: int | None = CpuConfig.threads,
    trust_remote_code: bool = False,
) -> Model:
    """Load a model as `condsearch index` does with the same flags (--model, --mode, --profile, --router, …).

    ``model``: a model id or folder [default: the embedded all-MiniLM-L6-v2]; ``mode``: 'case'
    (the CASE bi-encoder: one forward pass per pair), 'csr' (the router tri-encoder over cached
    sentence states) or 'auto' (csr for the default model unless ``profile`` is given, case for
    other models) [default: `condsearch index`'s --mode,
    :data:`condsearch.model.artifacts.profiles.DEFAULT_MODE`]; ``profile`` (case): 'full', 'lora',
    'frozen', 'none', 'auto' or a folder from `condsearch train` [default: auto, the default model's
    'full']; ``router`` (csr): 'default' (shipped for the default model), 'none' (untrained), 'auto'
    or a folder from `condsearch train router` [default: auto, 'default' for the default model, else
    'none']; ``device``: a torch device [default: CUDA where present]; ``quantize`` (case): 'none'
    (float32) or 'int8'; ``threads``: the CPU's intra-op threads [default: all]. A keyword that does
    not apply to the mode, or a value that names nothing, raises a one-line CondsearchError.
    """
    from condsearch.model import load_model_for
    from condsearch.model.encoders import EncoderSpec, Runtime

    router, quantize = _router(router), check_quantize(quantize)
    mode = _mode(mode, model, profile=profile is not None, router=router is not None)
    # the mode's own keywords only, refused as `condsearch index` refuses its flags (a dropped one is a defect)
    if mode == MODE_CSR and profile is not None:
        raise ModelError("profile= applies to mode='case'; mode='csr' routes with router=")
    if mode == MODE_CASE and router is not None:
        raise ModelError("router= applies to mode='csr'")
    runtime = Runtime(device=device, threads=threads, trust_remote_code=trust_remote_code)
    spec = EncoderSpec(model=model, mode=mode, profile=profile, router=router, quantize=quantize, runtime=runtime)
    # the router's passes as `index` runs them on this CPU (its float32 export, or bfloat16 where measured
    # faster); CASE as torch loads it, in --dtype auto's choice for the CPU
    vec = load_model_for("bulk" if mode == MODE_CSR else "plain", spec)
    if quantize != CpuConfig.quantize and vec.encoder.describe().get("quantize") != quantize:
        # an encoder that cannot run so loads as float32: refused, never indexed as if quantised
        raise ModelError(f"quantize={quantize!r} does not apply to mode={mode!r} here: its model runs in float32")
    return Model(vec)
