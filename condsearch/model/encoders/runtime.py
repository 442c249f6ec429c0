"""Where and how a large model runs: devices, dtype, attention kernel, out-of-memory back-off."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
import torch

from condsearch.errors import ModelError

log = logging.getLogger(__name__)

T = TypeVar("T")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# transformers renamed from_pretrained's ``torch_dtype`` to ``dtype`` in 4.56.
# (read from the installed metadata: importing transformers costs a second that most commands do not need)
_TRANSFORMERS = tuple(int(p) for p in importlib.metadata.version("transformers").split(".")[:2])
_DTYPE_KW = "dtype" if _TRANSFORMERS >= (4, 56) else "torch_dtype"


def parse_devices(spec: str | None) -> list[torch.device]:
    """Return the devices of ``cpu``, ``cuda:0`` or ``cuda:0,cuda:1`` (default: CUDA when present)."""
    if not spec:
        return [torch.device("cuda" if torch.cuda.is_available() else "cpu")]
    try:
        devices = [torch.device(part.strip()) for part in spec.split(",") if part.strip()]
    except RuntimeError as exc:
        raise ModelError(f"--device {spec!r}: {exc}") from exc
    if not devices:
        raise ModelError(f"--device {spec!r} names no device")
    for device in devices:
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise ModelError(f"--device {spec!r}: CUDA is not available on this machine")
            if device.index is not None and device.index >= torch.cuda.device_count():
                raise ModelError(f"--device {spec!r}: only {torch.cuda.device_count()} CUDA device(s)")
        elif device.type not in ("cpu", "mps"):
            raise ModelError(f"--device {spec!r}: unsupported device type {device.type!r}")
    return devices


def resolve_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """Return the torch dtype for a --dtype value; auto is bfloat16 on CUDA where supported, else float32."""
    if name and name != "auto":
        if name not in _DTYPES:
            raise ModelError(f"unknown dtype {name!r} (choose from auto, {', '.join(_DTYPES)})")
        return _DTYPES[name]
    if device.type == "cuda" and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    """Return the --dtype spelling of a torch dtype."""
    return str(dtype).removeprefix("torch.")


def attention_candidates(device: torch.device, dtype: torch.dtype) -> list[str | None]:
    """Return attention implementations to try, fastest first (None: the model's default)."""
    candidates: list[str | None] = []
    half = dtype in (torch.float16, torch.bfloat16)
    if device.type == "cuda" and half and importlib.util.find_spec("flash_attn") is not None:
        candidates.append("flash_attention_2")
    return [*candidates, "sdpa", None]


def load_pretrained(loader: Callable[..., T], location: str, **kwargs: Any) -> T:
    """Call ``loader(location, ...)`` such as ``AutoModel.from_pretrained``, spelling ``dtype`` as it expects."""
    from transformers.utils import logging as hf_logging

    if "dtype" in kwargs:
        kwargs[_DTYPE_KW] = kwargs.pop("dtype")
    # transformers draws a "Loading weights" bar on stderr: noise in a library call (issue 59)
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return loader(location, **kwargs)
    finally:
        if shown:
            hf_logging.enable_progress_bar()


def load_fastest(loader: Callable[..., T], location: str, device: torch.device, dtype: torch.dtype, **kwargs: Any) -> T:
    """Load a model with the fastest attention implementation it accepts."""
    error: Exception | None = None
    for impl in attention_candidates(device, dtype):
        extra = {"attn_implementation": impl} if impl else {}
        try:
            model = load_pretrained(loader, location, dtype=dtype, **kwargs, **extra)
        except (ValueError, ImportError) as exc:  # the model or this install lacks that kernel
            error = exc
            continue
        log.info("loaded %s with attention %s", location, impl or "default")
        return model
    assert error is not None
    raise error


class OomBackoff:
    """Run batches through a function, halving the batch whenever CUDA runs out of memory.

    The size that fitted is remembered, so later batches start there instead of failing again.
    """

    def __init__(self) -> None:
        self.limit: int | None = None

    def run(self, fn: Callable[[Sequence[T]], np.ndarray], items: Sequence[T]) -> np.ndarray:
        """Return ``fn`` applied to consecutive slices of items, concatenated along rows."""
        parts: list[np.ndarray] = []
        start = 0
        while start < len(items):
            size = min(len(items) - start, self.limit or len(items))
            try:
                parts.append(fn(items[start : start + size]))
            except torch.cuda.OutOfMemoryError as exc:
                if size == 1:
                    raise ModelError(
                        "out of GPU memory on a single input; lower --max-length, choose a smaller "
                        "--dtype or use a larger GPU"
                    ) from exc
                self.limit = size // 2
                log.warning("out of GPU memory at batch %d; retrying at %d", size, self.limit)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                continue
            start += size
        return np.concatenate(parts) if parts else np.empty((0, 0), dtype=np.float32)
