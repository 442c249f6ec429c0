"""Which model answers an index, and how it runs: the loader, with the router, encoders and artifacts inside.

Holds the vectorizer (encoder, head, prompts), the one-shot ONNX twin, the torch-or-onnxruntime
policy every front end shares, a model's identity and heads; and, each a package with a layer and a
front door of its own, the router (:mod:`condsearch.model.csr`), the encoders and the encoder spec
(:mod:`condsearch.model.encoders`) and the trained artifacts (:mod:`condsearch.model.artifacts`). Model
sources are :mod:`condsearch.base.model_sources`. Front door: the
names below, each loaded on first use; :func:`load_model_for` (:mod:`condsearch.model.loader`) is the
one way to load a model, its purpose (``one_shot``, ``bulk``, ``resident``, ``plain``) deciding the
runner and dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from condsearch.base.front_door import lazy_names

if TYPE_CHECKING:
    from condsearch.model.identity import ModelIdentity
    from condsearch.model.loader import OneShotQuery, Purpose, load_model_for
    from condsearch.model.one_shot import ONE_SHOT_THREADS, cache_onnx_export
    from condsearch.model.policy import backend_of, resolve_quantize
    from condsearch.model.vectorizer import Vectorizer

__all__ = [
    "ONE_SHOT_THREADS",
    "ModelIdentity",
    "OneShotQuery",
    "Purpose",
    "Vectorizer",
    "backend_of",
    "cache_onnx_export",
    "load_model_for",
    "resolve_quantize",
]

#: public name -> the module of this package it is imported from, when first asked for (so importing stays cheap)
_HOMES = {
    "ONE_SHOT_THREADS": "one_shot",
    "ModelIdentity": "identity",
    "OneShotQuery": "loader",
    "Purpose": "loader",
    "Vectorizer": "vectorizer",
    "backend_of": "policy",
    "cache_onnx_export": "one_shot",
    "load_model_for": "loader",
    "resolve_quantize": "policy",
}


__getattr__ = lazy_names(__name__, _HOMES)
