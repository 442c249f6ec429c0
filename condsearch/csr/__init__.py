"""Router-CSR tri-encoder mode: condition-independent sentence caches, cheap new conditions.

Variants: ``paper`` (eq. 1 of the router paper), ``extended`` (ours, :mod:`condsearch.csr.router`)
and ``context`` (ours: the condition as attention context in the top k layers,
:mod:`condsearch.csr.context`).
"""

from __future__ import annotations

from condsearch.csr.context import ContextConfig, ContextRouter
from condsearch.csr.encoder import CsrEncoder, load_csr_encoder
from condsearch.csr.router import Router, SentenceStates

__all__ = ["ContextConfig", "ContextRouter", "CsrEncoder", "Router", "SentenceStates", "load_csr_encoder"]
