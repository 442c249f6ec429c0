"""CPU speed settings: int8 quantisation, what runs the model, threads (the single home of their defaults).

Kept free of torch so that the CLI's choices and ``--help`` import nothing heavy.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Literal

Quantize = Literal["none", "int8"]
#: --quantize choices: none is float32 as loaded; int8 is onnxruntime's dynamic int8 (see .onnx.bert)
QUANTIZE_CHOICES: tuple[Quantize, ...] = ("none", "int8")
#: `index --quantize` also takes auto: int8 where the CPU kind measured it faster, else none
#: (condsearch.base.cpu_kind.auto_quantize); an index records what it resolved to
QUANTIZE_AUTO = "auto"

#: what runs a float32 encoder for bulk work (`serve`, `index`): ``auto`` is onnxruntime on the CPU wherever
#: a one-shot `query` of the index would run it (BERT-style, condition-mean pooling, its checked ONNX
#: export; see :mod:`condsearch.model.policy`), else transformers (torch); ``torch`` is always transformers
Backend = Literal["auto", "torch"]
BACKEND_CHOICES: tuple[Backend, ...] = ("auto", "torch")


@dataclass(frozen=True)
class CpuConfig:
    """How an encoder runs on the CPU."""

    #: weights and activations of the encoder's linear layers
    quantize: Quantize = "none"
    #: intra-op threads for torch and onnxruntime; None keeps torch's default, one per physical core
    threads: int | None = None
    #: what runs the encoder for bulk work (see ``Backend``)
    backend: Backend = "auto"


#: OpenMP's wait policy for torch's intra-op threads where the environment names none (``OMP_WAIT_POLICY``).
#: PASSIVE: a thread that waits for the others sleeps. The default lets it spin, which on a busy CPU (readers
#: beside an `index`) keeps the core another process needs, so that every parallel region waits for a
#: thread the spinning keeps off its core: `index` of 1,000 rows beside other work ran 76 s spinning,
#: 21-25 s passive, at 2 threads on 2 cores (issue 58, item 12; benchmarks/systems/hostile.md)
OMP_WAIT_POLICY = "PASSIVE"


def passive_waits() -> None:
    """Make torch's OpenMP threads sleep while they wait (OMP_WAIT_POLICY), unless the environment says otherwise.

    Read once, when torch's OpenMP runtime loads: so only before torch is imported, as the CLI does first.
    """
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", OMP_WAIT_POLICY)


def check_quantize(value: str) -> Quantize:
    """Return a --quantize value, refusing unknown ones."""
    from condsearch.errors import ModelError

    if value not in QUANTIZE_CHOICES:
        raise ModelError(f"unknown quantisation {value!r} (choose from {', '.join(QUANTIZE_CHOICES)})")
    return value  # type: ignore[return-value]


def apply_threads(threads: int | None) -> int:
    """Set torch's intra-op thread count when given (>= 1); return the count now in force."""
    import torch

    from condsearch.errors import ModelError

    if threads is not None:
        if threads < 1:
            raise ModelError(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def available_cores() -> int:
    """Return the cores this process may run on (its affinity, else the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
