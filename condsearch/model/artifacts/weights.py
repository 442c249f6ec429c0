"""An artifact's tensors on disk: written and read only when every value is finite.

A head, adapter, router, model or checkpoint whose weights hold NaN or inf (training diverged, or
a label was NaN) would load fine and then score every pair NaN, so that queries come back empty
with nothing said. Every writer saves through :func:`save_weights` (or checks a state it hands to
another library with :func:`check_finite`), and every loader reads through :func:`load_weights`.
torch and safetensors are imported by the calls that need them, not by this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np

from condsearch.base.regular_files import open_regular_file
from condsearch.errors import ModelError


def _non_finite(tensor: Any) -> bool:
    """Return whether a floating-point torch tensor or numpy array holds NaN or inf (integers never do)."""
    if hasattr(tensor, "is_floating_point"):  # torch, without importing it here
        return bool(tensor.is_floating_point() and not tensor.isfinite().all())
    array = np.asarray(tensor)
    return array.dtype.kind in "fc" and not bool(np.isfinite(array).all())


def non_finite_tensor(state: Mapping[str, Any]) -> str | None:
    """Return the name of the first tensor in state (sorted) that holds NaN or inf, or None."""
    return next((name for name in sorted(state) if _non_finite(state[name])), None)


def check_finite(state: Mapping[str, Any], what: str) -> None:
    """Raise ModelError if a tensor of state holds NaN or inf; ``what`` names the artifact (folder first)."""
    name = non_finite_tensor(state)
    if name is not None:
        raise ModelError(
            f"{what}: {name} holds NaN or inf, so nothing was saved (training diverged: check the labels, lower --lr)"
        )


def save_weights(state: Mapping[str, Any], path: Path, what: str) -> None:
    """Write torch tensors to a safetensors file, refusing (ModelError) any state with NaN or inf."""
    from safetensors.torch import save_file

    check_finite(state, what)
    save_file(dict(state), str(path), metadata={"format": "pt"})


def load_weights(path: Path, what: str, *, framework: Literal["pt", "numpy"] = "pt") -> dict[str, Any]:
    """Read a safetensors file as torch tensors or numpy arrays; a one-line ModelError if damaged or non-finite.

    Only a regular file is read: a FIFO would block the load, a device would never end.
    """
    try:
        with open_regular_file(path, ModelError):
            pass  # safetensors opens the path itself; this refuses anything but a regular file first
        if framework == "numpy":
            from safetensors.numpy import load_file as load_numpy

            state: dict[str, Any] = dict(load_numpy(str(path)))
        else:
            from safetensors.torch import load_file as load_torch

            state = dict(load_torch(str(path)))
    except ModelError:
        raise
    except Exception as exc:  # safetensors raises several types for damaged or missing files
        raise ModelError(f"{Path(path).parent}: {what} unreadable ({type(exc).__name__})") from exc
    name = non_finite_tensor(state)
    if name is not None:
        raise ModelError(f"{path}: {what} {name} holds NaN or inf; refusing to use it (retrain it)")
    return state
