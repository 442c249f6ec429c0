"""Router-CSR tri-encoder mode: condition-independent sentence caches, cheap new conditions.

Variants: ``paper`` (eq. 1 of the router paper), ``extended`` (ours, :mod:`condsearch.model.csr.router`)
and ``context`` (ours: the condition as attention context in the top k layers,
:mod:`condsearch.model.csr.context`).

The names below load on first use: a one-shot query (:mod:`condsearch.model.csr.one_shot`) imports this
package without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from condsearch.base.front_door import lazy_names

if TYPE_CHECKING:
    from condsearch.model.csr.context import CONTEXT, TRAIN_SCOPES, ContextConfig, ContextRouter
    from condsearch.model.csr.encoder import CsrEncoder, load_csr_encoder
    from condsearch.model.csr.router import PRESETS, Router, RouterConfig, SentenceStates
    from condsearch.model.csr.variants import DEFAULT_VARIANT, ROUTER_VARIANTS

__all__ = [
    "CONTEXT",
    "DEFAULT_VARIANT",
    "PRESETS",
    "ROUTER_VARIANTS",
    "TRAIN_SCOPES",
    "ContextConfig",
    "ContextRouter",
    "CsrEncoder",
    "Router",
    "RouterConfig",
    "SentenceStates",
    "load_csr_encoder",
]

_HOMES = {
    "CONTEXT": "context",
    "TRAIN_SCOPES": "context",
    "PRESETS": "router",
    "RouterConfig": "router",
    "DEFAULT_VARIANT": "variants",
    "ROUTER_VARIANTS": "variants",
    "ContextConfig": "context",
    "ContextRouter": "context",
    "CsrEncoder": "encoder",
    "load_csr_encoder": "encoder",
    "Router": "router",
    "SentenceStates": "router",
}


__getattr__ = lazy_names(__name__, _HOMES)
