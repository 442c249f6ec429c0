"""Router-CSR tri-encoder mode: condition-independent sentence caches, cheap new conditions."""

from __future__ import annotations

from condsearch.csr.encoder import CsrEncoder, load_csr_encoder
from condsearch.csr.router import Router, SentenceStates

__all__ = ["CsrEncoder", "Router", "SentenceStates", "load_csr_encoder"]
