"""What every benchmark script shares: run provenance, output files, progress, smoke data."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np

from condsearch.corpus.csts import CstsData
from condsearch.errors import CondsearchError, first_line
from condsearch.version import __version__

T = TypeVar("T")

PACKAGES = ("torch", "transformers", "faiss-cpu", "faiss-gpu-cu12", "numpy", "scipy", "sentence-transformers")


def exit_code(main: Callable[[], int], script: str) -> int:
    """Run a script's main; a condsearch error (a missing file, a foreign artifact) is one line on stderr, exit 1."""
    try:
        return main()
    except CondsearchError as exc:
        print(f"{script}: error: {first_line(exc)}", file=sys.stderr)
        return 1


def log(tag: str, msg: str) -> None:
    """Print a progress line on stderr."""
    print(f"[{tag}] {msg}", file=sys.stderr, flush=True)


def quiet_transformers() -> None:
    """Silence transformers' own progress bars and warnings (benchmarks print their own)."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def git_commit() -> str:
    """Return the checkout's commit, with ``-dirty`` when tracked files changed since."""
    here = Path(__file__).parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=here)
        dirty = subprocess.run(["git", "status", "--porcelain", "-uno"], capture_output=True, text=True, cwd=here)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


#: the CPU flags that decide which kernels run (int8 dot products, bfloat16, wide vectors)
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8")


def _isa_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                present = set(line.split(":", 1)[1].split())
                return [f for f in ISA_FLAGS if f in present]
    except OSError:
        pass
    return []


def last_level_cache_bytes() -> int | None:
    """Return the size of CPU 0's last-level cache (Linux sysfs), or None where it cannot be read."""
    best: tuple[int, int] | None = None
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            level = int((entry / "level").read_text())
            size = (entry / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:], 1)
        try:
            value = int(size.rstrip("KMG")) * unit
        except ValueError:
            continue
        if best is None or level > best[0]:
            best = (level, value)
    return best[1] if best else None


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def versions() -> dict[str, str]:
    """Return the installed versions of the packages the numbers depend on."""
    out = {"python": platform.python_version(), "condsearch": __version__}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def run_info(device: str | None = None) -> dict[str, object]:
    """Return where and with what a result was measured."""
    import torch

    try:
        import faiss

        faiss_gpus = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    except ImportError:  # scripts that search nothing run without FAISS
        faiss_gpus = None
    cuda = torch.cuda.is_available()
    info: dict[str, object] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "versions": versions(),
        "device": device or ("cuda" if cuda else "cpu"),
        "gpu": torch.cuda.get_device_name(0) if cuda else None,
        "faiss_gpus": faiss_gpus,
        "machine": {
            "cpu": _cpu_model(),
            "isa": _isa_flags(),
            "last_level_cache_bytes": last_level_cache_bytes(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "memory_gib": _memory_gib(),
            "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        },
    }
    # settings that make this CPU run as another kind (ONEDNN_MAX_CPU_ISA hides AMX from torch's bfloat16
    # products) or choose its path: a figure measured under them says so
    emulated = {
        k: os.environ[k] for k in ("ONEDNN_MAX_CPU_ISA", "CONDSEARCH_CPU_KIND", "OPENBLAS_CORETYPE") if k in os.environ
    }
    if emulated:
        info["environment"] = emulated
    return info


def timing_config(batch_size: int, repeats: int, smoke: bool) -> dict[str, object]:
    """Return the settings a speed measurement depends on beside its model: batch, repeats, versions, threads."""
    import torch

    return {
        "batch_size": batch_size,
        "repeats": repeats,
        "smoke": smoke,
        "condsearch_version": __version__,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
    }


def compare_systems(
    tag: str, systems: Sequence[str], evaluate: Callable[[str], T], *, log_results: bool = False
) -> tuple[dict[str, T], dict[str, object]]:
    """Evaluate each system in turn, logging its seconds (and its results with log_results).

    Return the results by system, and the block that ends the result's JSON: the results, each
    system's seconds (loading included) and :func:`run_info`.
    """
    results: dict[str, T] = {}
    timings: dict[str, float] = {}
    for system in systems:
        start = time.perf_counter()
        results[system] = evaluate(system)
        timings[system] = round(time.perf_counter() - start, 1)
        shown = f"{results[system]} in " if log_results else ""
        log(tag, f"{system}: {shown}{timings[system]} s")
    return results, {"results": results, "seconds": timings, "run": run_info()}


def write_json(result: dict[str, object], json_out: Path | None) -> None:
    """Print the result as JSON on stdout and write it to json_out, if asked for."""
    print(json.dumps(result, indent=2))
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result, indent=2) + "\n")


def write_outputs(result: dict[str, object], table: str, json_out: Path | None, md_out: Path | None) -> None:
    """Print the markdown table on stdout and write the JSON and markdown files asked for."""
    print(table, end="")
    if json_out:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result, indent=2) + "\n")
    if md_out:
        md_out.parent.mkdir(parents=True, exist_ok=True)
        md_out.write_text(table)


def rankings_agree(
    scores_a: np.ndarray, ids_a: np.ndarray, scores_b: np.ndarray, ids_b: np.ndarray, tol: float = 1e-6
) -> np.ndarray:
    """Return, per query, whether two top-k rankings agree up to ties: (n_queries,) bool.

    scores_*, ids_*: (n_queries, k), best first. They agree when their scores agree within tol, rank
    by rank, and so do their ids once those tied with the k-th score (within tol) are set aside: which
    of several equal rows make the cut, or in which order equal rows come, is the CPU's choice.
    """
    agree = np.all(np.abs(np.asarray(scores_a, np.float64) - np.asarray(scores_b, np.float64)) <= tol, axis=1)
    for q in np.flatnonzero(agree):
        # each side's rows clear of the k-th score are in the other's list (comparing the two "clear" sets
        # instead failed where a row's score sat tol above the k-th within float32 rounding on one side only)
        kept_a = set(ids_a[q][scores_a[q] > scores_a[q][-1] + tol].tolist())
        kept_b = set(ids_b[q][scores_b[q] > scores_b[q][-1] + tol].tolist())
        agree[q] = kept_a <= set(ids_b[q].tolist()) and kept_b <= set(ids_a[q].tolist())
    return agree


_SUBJECTS = ["A girl", "A man", "Two dogs", "A woman", "Three boys", "An old man"]
_COLORS = ["red", "blue", "green", "orange", "black", "white"]
_ACTIONS = ["plays tennis", "rides a bicycle", "walks on the beach", "plays soccer", "swims in a pool", "runs"]


def synthetic_csts(n: int = 48, seed: int = 0) -> CstsData:
    """Return a small C-STS-shaped set for smoke runs: sentence pairs judged under a colour
    condition (similar when the colours match) and an activity condition."""
    rng = np.random.default_rng(seed)
    s1, s2, cond, labels = [], [], [], []
    while len(labels) < n:
        a, b = rng.integers(0, 6, size=2), rng.integers(0, 6, size=2)
        subj = _SUBJECTS[int(rng.integers(0, 6))]
        x = f"{subj} in a {_COLORS[a[0]]} shirt {_ACTIONS[a[1]]}."
        y = f"{_SUBJECTS[int(rng.integers(0, 6))]} in a {_COLORS[b[0]]} shirt {_ACTIONS[b[1]]}."
        for condition, same in (("the color of the shirt", a[0] == b[0]), ("the activity", a[1] == b[1])):
            s1.append(x)
            s2.append(y)
            cond.append(condition)
            labels.append(5.0 if same else float(rng.integers(1, 3)))
    return CstsData(s1[:n], s2[:n], cond[:n], np.asarray(labels[:n], dtype=np.float32))


def write_csts_csv(data: CstsData, path: Path) -> Path:
    """Write a C-STS CSV (sentence1, sentence2, condition, label)."""
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["sentence1", "sentence2", "condition", "label"])
        for row in zip(data.sentence1, data.sentence2, data.condition, data.labels.tolist(), strict=True):
            writer.writerow(row)
    return path


#: real texts at hand for benchmarks that need many rows: WN18RR entity texts and C-STS sentences
REAL_TEXTS = [
    Path(__file__).resolve().parents[3] / "shared" / "data" / "wn18rr" / "entity2text.txt",
    Path(__file__).resolve().parents[3] / "shared" / "data" / "csts-reannotated" / "train.csv",
]


def read_texts(paths: list[Path]) -> list[str]:
    """Return the distinct texts of tab-separated ``id<TAB>text`` files and C-STS CSVs, in file order."""
    import csv

    seen: dict[str, None] = {}
    for path in paths:
        if path.suffix == ".csv":
            with open(path, newline="", encoding="utf-8") as fh:
                for row in csv.DictReader(fh):
                    for key in ("sentence1", "sentence2"):
                        if (row.get(key) or "").strip():
                            seen.setdefault(row[key].strip())
        else:
            for line in path.read_text(encoding="utf-8").splitlines():
                text = line.split("\t", 1)[-1].strip()
                if text:
                    seen.setdefault(text)
    return list(seen)
