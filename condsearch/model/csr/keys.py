"""The names of a router's caches and exports, computed without torch.

A :class:`~condsearch.model.csr.encoder.CsrEncoder` names its sentence-state cache, its condition codes
(the query cache) and its ONNX exports after the weights they depend on. The names are computed
here from plain values, so that a one-shot query (:mod:`condsearch.model.csr.one_shot`) finds the same
cached code and export from what an index records (its manifest's encoder record, the router
folder's checksum) as the encoder that wrote them, without importing torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from condsearch.base.output_cache import pair_key
from condsearch.model.csr.variants import CONTEXT
from condsearch.model.encoders.onnx.cache import TOKENIZER_FILE, Precision, cache_folder

#: in an export's meta file: what it exports (CASE's exports have no such key)
KIND = "csr-router"
#: 2: the export carries its tokenizer (a one-shot query tokenizes without transformers)
EXPORT_VERSION = 2
LOWER_FILE = "lower.onnx"
ROUTE_FILE = "route.onnx"
#: the files of a usable router export, each recorded in its meta file (size and sha256)
CSR_FILES = (LOWER_FILE, LOWER_FILE + ".data", ROUTE_FILE, ROUTE_FILE + ".data", TOKENIZER_FILE)
#: in a meta file: the router's plain torch copy, its bfloat16 passes without transformers (:mod:`.plain_copy`)
PLAIN_KIND = "csr-router-plain"
#: the plain copy's weights: the backbone as PlainBert names them, float32
PLAIN_FILE = "backbone.safetensors"
#: the files of a usable plain copy, each recorded in its meta file (size and sha256)
PLAIN_FILES = (PLAIN_FILE, TOKENIZER_FILE)
#: the query cache's folder under the cache root (condition codes, one row each)
QUERIES_SUBDIR = "csr-queries"
#: bytes of condition codes a router encoder keeps in memory at most (a short condition's code is about 28 KB
#: for MiniLM's context router: some 1,200 codes); older ones are read again from the query cache, or computed
CODE_MEMORY_BYTES = 32 << 20


def state_dtype_name(variant: str) -> str:
    """Return how a router variant's sentence states are stored by default: int8 for context, else float16.

    See :func:`condsearch.model.csr.cache.default_state_dtype`, which reads it.
    """
    return "int8" if variant == CONTEXT else "float16"


@dataclass(frozen=True)
class RouterIdentity:
    """What a router's cached states, condition codes and exports depend on.

    ``weights``: the router's checksum (its weights file's sha256), or for an untrained router or
    one changed in memory a digest of its parameters; ``trainable``: what its training changed
    ("top", or "all" when the whole backbone trained); ``state_dtype``: how states are cached.
    """

    model_id: str
    revision: str
    layer: int
    max_length: int
    variant: str
    config: Mapping[str, object] = field(hash=False)
    weights: str
    trainable: str = "top"
    state_dtype: str = "float16"

    @property
    def backbone(self) -> str:
        """Return the identity of the lower layers' states (before the precision of the pass that made them)."""
        ident = f"{self.model_id}|{self.revision}|layer={self.layer}|max_length={self.max_length}"
        if self.state_dtype != "float16":  # float16 caches keep the names they had before the option
            ident += f"|states={self.state_dtype}"
        if self.variant == CONTEXT:  # the states depend on the whole (trained) backbone
            ident += f"|{CONTEXT}|weights={self.weights}"
        elif self.trainable == "all":  # eq. 1 with its whole backbone trained: the states move with it
            ident += f"|backbone=trained|weights={self.weights}"
        return ident

    @property
    def query_ident(self) -> str:
        """Return the identity of the condition codes (a code is torch float32 whatever runs the passes)."""
        return f"{self.backbone}|router={self.weights}|{sorted(self.config.items())}"

    def condition_key(self, condition: str) -> str:
        """Return the query cache's key of one condition's code."""
        return pair_key(self.query_ident, condition, None)

    def export_folder(self, root: Path, precision: Precision, *, w_scale: float = 1.0, kind: str = KIND) -> Path | None:
        """Return where the router's ONNX export of precision (``kind``: or its plain copy) is cached under root,
        or None for revision 'main'.

        Keyed by what it is, model, revision, router config, w scale, weights, precision and the onnxruntime,
        onnx and torch versions (read from package metadata).
        """
        if self.revision == "main":
            return None
        config = sorted(self.config.items())
        key = [kind, EXPORT_VERSION, self.model_id, self.revision, config, float(w_scale), self.weights]
        return cache_folder(root, key, precision)
