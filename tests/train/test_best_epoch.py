"""The best-epoch keeper and the learning-rate schedule that every trainer shares."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import get_linear_schedule_with_warmup

from condsearch.train.best_epoch import BestEpoch, best_row
from condsearch.train.schedule import linear_schedule


def test_keeper_keeps_the_strictly_best_epoch_and_restores_it() -> None:
    weight = torch.nn.Parameter(torch.zeros(3))
    keeper = BestEpoch()
    for epoch, score in enumerate([0.2, 0.5, 0.5, math.nan, 0.1], start=1):
        with torch.no_grad():
            weight.fill_(epoch)
        keeper.offer(epoch, score, {"w": weight}, {"epoch": epoch, "dev_spearman": score})
    assert (keeper.epoch, keeper.score) == (2, 0.5)  # a tie keeps the earlier epoch, NaN never wins
    assert [int(r["epoch"]) for r in keeper.history] == [1, 2, 3, 4, 5]
    assert keeper.best_row == {"epoch": 2, "dev_spearman": 0.5}
    keeper.restore({"w": weight})
    assert weight.tolist() == [2.0, 2.0, 2.0] and weight.requires_grad


def test_keeper_without_scores_leaves_the_last_weights() -> None:
    weight = torch.ones(2)
    keeper = BestEpoch()
    assert not keeper.offer(1, None, {"w": weight}, {"epoch": 1, "loss": 0.3})
    keeper.restore({"w": weight.fill_(7.0)})
    assert weight.tolist() == [7.0, 7.0] and keeper.best_row is None and len(keeper.history) == 1


def test_best_row_applies_the_keepers_rule() -> None:
    rows = [{"epoch": 0, "dev_spearman": 1.0}, {"epoch": 1, "dev_spearman": 3.0}, {"epoch": 2, "dev_spearman": 3.0}]
    assert best_row(rows) == rows[1]
    assert best_row([{"epoch": 1, "loss": 0.1}]) is None


def _optimizer(lrs: tuple[float, ...] = (1e-2, 1e-3)) -> torch.optim.Optimizer:
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr} for lr in lrs]
    return torch.optim.AdamW(groups)


def _rates(optim: torch.optim.Optimizer) -> list[float]:
    return [g["lr"] for g in optim.param_groups]


def test_schedule_is_transformers_linear_warmup() -> None:
    ours, theirs = _optimizer(), _optimizer()
    sched = linear_schedule(ours, 20, 0.1)
    ref = get_linear_schedule_with_warmup(theirs, 2, 20)
    for _ in range(20):
        assert _rates(ours) == pytest.approx(_rates(theirs))
        ours.step(), theirs.step(), sched.step(), ref.step()
    assert _rates(ours) == [0.0, 0.0]


@pytest.mark.parametrize("done", [1, 2, 7])
def test_a_resumed_schedule_continues_where_the_run_stopped(done: int) -> None:
    straight = _optimizer()
    sched = linear_schedule(straight, 10, 0.3)
    for _ in range(done):
        straight.step()
        sched.step()
    resumed = _optimizer()  # built afresh, as a resumed run builds it, with the step count from the checkpoint
    again = linear_schedule(resumed, 10, 0.3, done_steps=done)
    for _ in range(10 - done):
        assert _rates(resumed) == pytest.approx(_rates(straight))
        straight.step(), resumed.step(), sched.step(), again.step()
