"""The router variants' names, held once: the router, the context router, the loaders and the CLI read them here.

Free of imports beyond the standard library, so that the CLI lists the variants for --help (and a
one-shot query names the context router's caches) without loading torch.
"""

from __future__ import annotations

from typing import Final, Literal

#: eq. 1 of the router paper (:data:`condsearch.model.csr.router.PAPER`)
PAPER: Final = "paper"
#: ours: the paper's router with a trainable query copy, a learned gain, a condition-generated projection
EXTENDED: Final = "extended"
#: ours: the condition as attention context in the top k layers (:mod:`condsearch.model.csr.context`)
CONTEXT: Final = "context"

#: the variants of :class:`condsearch.model.csr.router.RouterConfig` (one routed multiplicative reweighting)
RoutedVariant = Literal["paper", "extended"]
ROUTED_VARIANTS: tuple[RoutedVariant, ...] = (PAPER, EXTENDED)
#: every router variant, in the order --help lists them
ROUTER_VARIANTS: tuple[str, ...] = (*ROUTED_VARIANTS, CONTEXT)
#: the variant of an untrained router when none is named (a trained router's folder names its own)
DEFAULT_VARIANT: RoutedVariant = PAPER
