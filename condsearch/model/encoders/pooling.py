"""Pooling token states into one vector per input: pure functions on tensors."""

from __future__ import annotations

import torch


def last_token_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Return each row's state at its last real token, under left or right padding.

    hidden: (n, length, dim); mask: (n, length), 1 for real tokens. Returns (n, dim).
    """
    positions = torch.arange(mask.shape[1], device=mask.device)
    # The highest position holding a real token; taking [:, -1] or mask.sum()-1 is right for
    # only one padding side.
    last = (mask.long() * positions).argmax(dim=1)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]


def mean_pool(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Return the mean of each row's real-token states: (n, dim).

    Pads are zeroed with ``masked_fill`` rather than multiplied by 0, so a non-finite state
    at a padded position (possible with fully masked attention rows) cannot leak in.
    """
    keep = mask.bool().unsqueeze(-1)
    summed = hidden.masked_fill(~keep, 0.0).sum(dim=1)
    counts = keep.sum(dim=1).clamp_min(1).to(hidden.dtype)
    return summed / counts
