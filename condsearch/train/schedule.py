"""The learning-rate schedule of every trainer: linear warm-up, then linear decay to 0 (transformers')."""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR


def linear_schedule(
    optimizer: torch.optim.Optimizer, total_steps: int, warmup: float, *, done_steps: int = 0
) -> LambdaLR:
    """Return the scheduler for total_steps optimiser steps, the first ``warmup`` fraction warming up.

    done_steps > 0 resumes the schedule after that many steps: the rates are those of an
    uninterrupted run at that point (they follow from the step count alone, so a checkpoint
    that records its step needs no scheduler state). Call ``step()`` after each batch.
    """
    from transformers import get_linear_schedule_with_warmup

    for group in optimizer.param_groups:
        # the rates the optimiser was built with; a resumed schedule scales these, not the last ones
        group.setdefault("initial_lr", group["lr"])
    n_warmup = max(1, int(warmup * total_steps))
    return get_linear_schedule_with_warmup(optimizer, n_warmup, total_steps, last_epoch=done_steps - 1)
