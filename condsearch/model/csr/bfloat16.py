"""The router's two per-sentence passes in bfloat16: its own torch modules under CPU autocast.

On a CPU with bfloat16 dot products (AMX tiles, or AVX-512 BF16) the matrix products of the lower
layers and of the routed top layers run in bfloat16, while what autocast keeps in float32 (layer
norms, softmax) and what leaves the passes (the cached states, the pooled vector) stay float32.
Which kinds run it is :data:`condsearch.base.cpu_kind.PATHS`' choice; the condition's own pass
stays float32 (:meth:`condsearch.model.csr.encoder.CsrEncoder.condition_code`), so codes are shared with
every other path.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from condsearch.model.csr.context import ContextCode, ContextRouter
    from condsearch.model.csr.router import SentenceStates


def _float(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float()


class Bfloat16Router:
    """A context router's sentence pass and routed pass under bfloat16 autocast, with its own interface.

    The context router alone: the variant measured in bfloat16 (benchmarks/systems/indexing.md).
    """

    precision = "bfloat16"

    def __init__(self, router: ContextRouter) -> None:
        self.router = router

    def sentence_states(self, inputs: dict[str, torch.Tensor]) -> SentenceStates:
        """Run the lower layers on a tokenized batch of sentences; the states come back in float32."""
        with torch.autocast("cpu", dtype=torch.bfloat16):
            states = self.router.sentence_states(inputs)
        return replace(states, x=states.x.float(), k=_float(states.k), c=_float(states.c))

    def route(self, states: SentenceStates, code: ContextCode | None) -> torch.Tensor:
        """Finish each sentence's forward pass under its condition: (b, hidden) float32."""
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return self.router.route(states, code).float()
