"""Which model answers an index, and how it runs.

Holds the vectorizer (encoder, head, prompts), the one-shot ONNX twin, the torch-or-onnxruntime
policy every front end shares, a model's identity and heads. The encoder spec is
:mod:`condsearch.encoders.spec`, model sources :mod:`condsearch.base.model_sources`. Front door: the
names below (:func:`load_index_model` first), each loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from condsearch.base.front_door import lazy_names

if TYPE_CHECKING:
    from condsearch.model.identity import ModelIdentity
    from condsearch.model.one_shot import ONE_SHOT_THREADS, cache_onnx_export
    from condsearch.model.policy import backend_of, load_bulk_vectorizer, load_index_model, vectorizer_for
    from condsearch.model.vectorizer import Vectorizer, load_vectorizer

__all__ = [
    "ONE_SHOT_THREADS",
    "ModelIdentity",
    "Vectorizer",
    "backend_of",
    "cache_onnx_export",
    "load_bulk_vectorizer",
    "load_index_model",
    "load_vectorizer",
    "vectorizer_for",
]

#: public name -> the module of this package it is imported from, when first asked for (so importing stays cheap)
_HOMES = {
    "ONE_SHOT_THREADS": "one_shot",
    "ModelIdentity": "identity",
    "Vectorizer": "vectorizer",
    "backend_of": "policy",
    "cache_onnx_export": "one_shot",
    "load_bulk_vectorizer": "policy",
    "load_index_model": "policy",
    "load_vectorizer": "vectorizer",
    "vectorizer_for": "policy",
}


__getattr__ = lazy_names(__name__, _HOMES)
