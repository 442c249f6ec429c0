"""Keep the weights of the best epoch on dev: the one keeper every trainer uses."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch


@dataclass
class BestEpoch:
    """The best epoch so far (its number, score and a copy of its tensors) and every epoch's history row.

    A later epoch replaces the kept one only with a strictly higher score, so ties keep the
    earlier epoch and a NaN score never wins. Epoch 0 may stand for the untrained start.
    """

    epoch: int = 0
    score: float = -math.inf
    state: dict[str, torch.Tensor] | None = None
    history: list[dict[str, float]] = field(default_factory=list)

    def offer(
        self, epoch: int, score: float | None, tensors: Mapping[str, torch.Tensor], row: dict[str, float] | None = None
    ) -> bool:
        """Record the epoch's row; keep a copy of tensors if score beats the best. Return whether it did.

        score None (no dev set) only records the row: the weights trained last are then the result.
        """
        if row is not None:
            self.history.append(row)
        if score is None or not score > self.score:
            return False
        self.epoch, self.score = epoch, score
        self.state = {k: v.detach().clone() for k, v in tensors.items()}
        return True

    @property
    def best_row(self) -> dict[str, float] | None:
        """Return the history row of the kept epoch (None before any epoch was kept)."""
        if self.state is None:
            return None
        return next((r for r in self.history if int(r["epoch"]) == self.epoch), None)

    def restore(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy the kept weights back into tensors, in place (nothing kept: leave them as trained)."""
        if self.state is None:
            return
        with torch.no_grad():
            for name, value in tensors.items():
                value.copy_(self.state[name])


def best_row(history: list[dict[str, float]], key: str = "dev_spearman") -> dict[str, float] | None:
    """Return the row the keeper would have kept from history, scored by key (None if no row has it)."""
    keeper = BestEpoch()
    for row in history:
        keeper.offer(int(row["epoch"]), row.get(key), {}, row)
    return keeper.best_row
