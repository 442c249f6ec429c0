"""Name the CPU's kind from its flags, and the path a committed measurement shows fastest on each kind.

One home for both: :func:`cpu_kind` reads ``/proc/cpuinfo`` once (``CONDSEARCH_CPU_KIND`` forces
a kind, for tests and benchmarks); :func:`kind_of_flags` is the pure rule; :data:`PATHS` is the
table ``--dtype auto`` and ``--backend auto`` follow on the CPU, each row with its provenance.
Free of torch, so that the CLI imports nothing heavy.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from condsearch.errors import ModelError

CpuKind = Literal["amx", "avx512", "avx512_fp16", "other"]
CPU_KINDS: tuple[CpuKind, ...] = ("amx", "avx512", "avx512_fp16", "other")
#: forces the kind (one of CPU_KINDS) instead of reading /proc/cpuinfo
CPU_KIND_ENV = "CONDSEARCH_CPU_KIND"

#: the flags a kind needs: AMX tiles with bf16 products; else AVX-512 with bf16 dot products and fp16
#: arithmetic (Intel's: a Xeon whose AMX the host hides); else AVX-512 with bf16 dot products (AMD's EPYC)
_AMX_FLAGS = frozenset({"amx_tile", "amx_bf16", "avx512_bf16"})
_AVX512_FP16_FLAGS = frozenset({"avx512f", "avx512_bf16", "avx512_fp16"})
_AVX512_FLAGS = frozenset({"avx512f", "avx512_bf16"})

#: the encoder record's key for a dtype that --dtype auto chose for the CPU (absent: float32). The spec
#: keeps ``auto``, so another CPU answers the index in its own choice; vectors differ from float32 within
#: the bound measured (docs/indexing.md), and the vectors' fingerprint leaves the key out
AUTO_DTYPE_KEY = "auto_dtype"

Dtype = Literal["float32", "bfloat16"]
Runner = Literal["torch", "onnxruntime"]
#: what ``index --quantize auto`` resolves to (condsearch.model.encoders.cpu's Quantize, without auto)
Quantized = Literal["none", "int8"]


@dataclass(frozen=True)
class CpuPath:
    """The fastest measured float path on one CPU kind, for CASE bulk encoding and the router's passes."""

    #: what runs CASE bulk encoding (`index`) under --backend auto, and the dtype torch runs CASE in
    case_runner: Runner
    case_dtype: Dtype
    #: what runs CASE for a long-running reader (`serve`, the Python API) under --backend auto: small
    #: batches, where latency counts. `query` loads a CASE index's model as they do (issue 58), so that
    #: their answers are equal; onnxruntime on every kind, whose one-shot query skips torch
    serve_runner: Runner
    #: how the context router's two passes run for bulk work (`index`, builds on demand) under --backend auto:
    #: bfloat16 is torch under autocast; float32 is its checked export where FASTER_ON_ONNX says. A
    #: long-running reader (`serve`, the Python API) routes its queries on the float32 export on every kind
    router_dtype: Dtype
    #: where the figures come from: machine, date, command, pairs/s, cosine to float32
    provenance: str
    #: what ``index --quantize auto`` takes on this kind, CASE and the router: int8 (onnxruntime's dynamic int8
    #: export; vectors within the int8 bound, not float32's) where it measured faster than the float path
    #: above, else none. Only asked for: the default --quantize stays none everywhere
    case_quantize: Quantized = "none"
    router_quantize: Quantized = "none"
    #: the figures behind the two fields above
    quantize_provenance: str = "not measured: none"


#: kind -> fastest path at equal accuracy. int8 is never chosen by default: --quantize int8 asks for it, and
#: --quantize auto for it where it measured faster (case_quantize, router_quantize).
PATHS: dict[CpuKind, CpuPath] = {
    "amx": CpuPath(
        quantize_provenance=(
            "2026-11-29, 2 cores, quiet: CASE int8 337 pairs/s against torch bfloat16's 343 "
            "(encode_int8_amx.json), the router's int8 482 new sentences/s against bfloat16's 547 "
            "(csr_paths_amx_quiet.json): bfloat16 is as fast or faster, so none"
        ),
        case_runner="torch",
        case_dtype="bfloat16",
        serve_runner="onnxruntime",
        router_dtype="bfloat16",
        provenance=(
            "measured 2026-11-27 on the Intel Xeon with AMX (amx_tile, amx_bf16, amx_int8, avx512_bf16) that hosts "
            "a lent H200, on 2 of its 16 cores (taskset, 2 threads; torch 2.11, onnxruntime 1.30): python -m "
            "benchmarks.systems.cpu_paths --csv dev.csv -n 400 --repeats 5 --threads 2 --no-accuracy "
            "(benchmarks/systems/results/cpu_paths_amx_speed.json, load 1.0-1.35), medians of interleaved "
            "rounds: torch bfloat16 389 pairs/s, torch float32 183, onnxruntime float32 197 (2.1x); the "
            "accuracy run beside GPU work (cpu_paths_amx.json): bfloat16 351, float32 214, onnxruntime 177, "
            "cosine to float32 >= 0.9997 (median 0.99992), C-STS dev Spearman 66.69 against 66.67. Issue 42's "
            "reviewers saw 2.5-3x on a 2-core Xeon (2,170-2,570 against 850-868 pairs/s). The router's passes, "
            "measured 2026-11-29 on 2 cores of a 2-core Xeon with AMX (python -m benchmarks.systems.csr_paths --dev "
            "dev.csv --threads 2 --no-csts, medians of 5 interleaved rounds, nothing else running): torch bfloat16 547 "
            "new sentences/s and 1,716 new-condition pairs/s against torch float32's 306 and 948 (1.8x), onnxruntime "
            "float32 294 and 803 (csr_paths_amx_quiet.json; until then bfloat16 on this kind was inferred from "
            "CASE's). Serving CASE: "
            "onnxruntime float32, as a one-shot query answers, so that serve and query --json give equal "
            "scores (issue 58; torch bfloat16 before, unmeasured): measured 2026-11-28 on 2 cores of the same "
            "Xeon (load 4-5, beside other work), the index's model as the server loads it, medians of 40 "
            "interleaved rounds: 1 and 8 queries in 13.3 and 30.9 ms (onnxruntime, 1 thread) against 18.9 and "
            "24.2 (torch bfloat16); at 2 threads 17.7 and 25.2 against 80.1 and 153.1 (torch's pool, contended)"
        ),
    ),
    "avx512": CpuPath(
        router_quantize="int8",
        quantize_provenance=(
            "the AMD EPYC, quiet: the router's int8 1,049 new sentences/s against bfloat16's 856 (new-condition "
            "pairs 2,827 against 2,956; csr_paths_bf16_amd.json); CASE int8 656 pairs/s against bfloat16's 628-650, "
            "not faster beyond noise (encoding.md), so none"
        ),
        case_runner="torch",
        case_dtype="bfloat16",
        serve_runner="onnxruntime",
        router_dtype="bfloat16",
        provenance=(
            "measured here, 2026-11-27, on a 2-core AMD EPYC (avx512f, avx512_bf16, no AMX) with nothing else "
            "running (load 1.5-1.9): python -m benchmarks.systems.cpu_paths --csv dev.csv -n 400 --repeats 5 "
            "--threads 2 --no-accuracy, twice (the first: benchmarks/systems/results/cpu_paths_amd_quiet.json), "
            "medians of interleaved rounds: torch bfloat16 628 and 650 pairs/s, onnxruntime float32 436 and 451, "
            "torch float32 232 and 235; so torch bfloat16 for `index` (1.44x). The earlier figures beside a "
            "training job (cpu_paths_amd.json: bfloat16 17-23, onnxruntime 162-238) measured the contention, not "
            "the paths. Serving stays on onnxruntime float32: benchmarks/systems/serve.py at 100,000 rows gave "
            "p50 16.2 and 16.7 ms at 1 client, 199 and 231 queries/s at 32 clients, against 20.3 ms and 224 "
            "queries/s with torch bfloat16 (CONDSEARCH_CPU_KIND=amx). bfloat16's cosine to float32 >= 0.99967 "
            "(median 0.99992) over C-STS dev, Spearman 66.69 against 66.67 (cpu_paths_amd.json). The context router, "
            "2026-11-28, same machine: python -m benchmarks.systems.csr_paths --dev dev.csv --threads 2 "
            "(benchmarks/systems/results/csr_paths_bf16_amd.json, load 1.9-2.1), medians of 5 interleaved rounds: "
            "torch bfloat16 856 new sentences/s and 2,956 new-condition pairs/s against onnxruntime float32's 630 "
            "and 1,899 (1.36x, 1.56x), cosine to float32 >= 0.99987 over C-STS dev, Spearman 64.01 against 64.00"
        ),
    ),
    "avx512_fp16": CpuPath(
        case_quantize="int8",
        router_quantize="int8",
        quantize_provenance=(
            "int8 over float32 on that kind: CASE 1.54x float32 in issue 61's outside check there "
            "(encode_throughput.py --quantize int8). Here with AMX hidden from oneDNN: CASE int8 348 pairs/s "
            "against onnxruntime float32's 174 (encode_int8_amx_hidden.json), the router's new sentences 553 "
            "against 284-304 a second (csr_paths_amx_hidden.json); onnxruntime's own int8 kernels do not read "
            "that setting, so these two may include AMX's int8 products"
        ),
        case_runner="onnxruntime",
        case_dtype="float32",
        serve_runner="onnxruntime",
        router_dtype="float32",
        provenance=(
            "an Intel Xeon with AVX-512 BF16 and FP16 whose AMX the host hides (issue 61's outside check: `index` "
            "in torch bfloat16 at 0.69x torch float32, 42.9 s against 29.4 s for 16,000 sentences, and 0.71x / 0.50x "
            "at 500 / 4,000 rows). Measured 2026-11-29 on 2 cores of a Xeon with AMX, AMX hidden from torch's "
            "products by ONEDNN_MAX_CPU_ISA=AVX512_CORE_FP16 (oneDNN then runs avx512_core_bf16 kernels, as on that "
            "kind), nothing else running: python -m benchmarks.systems.cpu_paths --csv dev.csv -n 400 --repeats 5 "
            "--threads 2 --no-accuracy (benchmarks/systems/results/cpu_paths_amx_hidden.json), medians of "
            "interleaved rounds: torch float32 225 pairs/s, onnxruntime float32 212, torch bfloat16 149 (0.66x); "
            "python -m benchmarks.systems.csr_paths --dev dev.csv --threads 2 --no-csts "
            "(csr_paths_amx_hidden.json): the router's new sentences torch float32 304/s, onnxruntime float32 284, "
            "torch bfloat16 190 (0.67x); new-condition pairs 983, 1,028, 656. The same session with AMX: CASE "
            "bfloat16 324 against float32 198-221, the router's bfloat16 547 against 306. float32 here, on the "
            "checked onnxruntime export (within 6% of torch float32 both ways), which one-shot queries, serving "
            "and re-indexes without torch run too; a whole `index` of 50,000 rows there ran torch float32 1.16x "
            "faster (first_index_commands.json), a trade not yet resolved"
        ),
    ),
    "other": CpuPath(
        case_runner="onnxruntime",
        case_dtype="float32",
        serve_runner="onnxruntime",
        router_dtype="float32",
        provenance="no measurement: float32 as before issue 42 (bfloat16 without hardware support is emulated)",
    ),
}


def kind_of_flags(flags: Iterable[str]) -> CpuKind:
    """Return the kind a CPU with these /proc/cpuinfo flags is."""
    present = set(flags)
    if _AMX_FLAGS <= present:
        return "amx"
    if _AVX512_FP16_FLAGS <= present:
        return "avx512_fp16"
    if _AVX512_FLAGS <= present:
        return "avx512"
    return "other"


def read_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """Return the first CPU's flags in a cpuinfo file (empty where it cannot be read: not Linux)."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def check_kind(value: str) -> CpuKind:
    """Return a kind's name, refusing unknown ones in one line."""
    if value not in CPU_KINDS:
        raise ModelError(f"{CPU_KIND_ENV}={value!r} is no CPU kind (choose from {', '.join(CPU_KINDS)})")
    return value  # type: ignore[return-value]


def cpu_kind() -> CpuKind:
    """Return this machine's kind: ``CONDSEARCH_CPU_KIND`` when set, else its flags' (read once)."""
    forced = os.environ.get(CPU_KIND_ENV)
    if forced:
        return check_kind(forced)
    return _flags_kind()


@functools.cache
def _flags_kind() -> CpuKind:
    return kind_of_flags(read_flags())


def cpu_path(kind: CpuKind | None = None) -> CpuPath:
    """Return the measured fastest path on ``kind`` [default: this machine's]."""
    return PATHS[kind or cpu_kind()]


def auto_case_dtype() -> Dtype:
    """Return what ``--dtype auto`` means for a BERT-style CASE encoder run by torch on this CPU."""
    return cpu_path().case_dtype


def auto_router_dtype() -> Dtype:
    """Return how ``--backend auto`` runs the context router's passes for bulk work on this CPU."""
    return cpu_path().router_dtype


def auto_quantize(mode: str) -> Quantized:
    """Return what ``index --quantize auto`` means on this CPU for ``mode`` (case or csr): int8 where it measured
    faster than the kind's float path, else none."""
    path = cpu_path()
    return path.router_quantize if mode == "csr" else path.case_quantize


def auto_case_runner(*, serving: bool = False) -> Runner:
    """Return what ``--backend auto`` runs CASE with on this CPU (float32 models): for bulk encoding,
    or ``serving`` a long-running reader's small batches."""
    path = cpu_path()
    return path.serve_runner if serving else path.case_runner
