"""Training steps of the WN18RR towers timed per setting (float32 or bfloat16, rows per chunk), and
what a step spends outside the model, by torch's profiler (``kgc.py --profile-steps``)."""

from __future__ import annotations

import resource
import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from benchmarks._lib.common import log

from .training import train_kgc


def profile_steps(
    encoder: Any, entities: Any, data: Any, config: Any, tail: Any, steps: int, chunks: list[int]
) -> dict[str, object]:
    """Time training steps at float32 and under bfloat16 autocast, per chunk size; return medians.

    Each setting (dtype × rows per length-sorted chunk) trains ``steps + 1`` steps in one run (the
    first, which builds the optimiser's state and warms up the kernels, is not counted), twice,
    the settings interleaved so that other load on the machine falls on all alike. Then one more
    step of the last setting runs under torch's profiler, which gives the time of the work that is
    not the model's: building a batch's inputs, its masks, tokenising the conditions.
    """
    settings = [(bf16, chunk) for bf16 in (False, True) for chunk in chunks]
    seconds: dict[tuple[bool, int], list[float]] = {k: [] for k in settings}
    for rep in range(2):
        for bf16, chunk in settings:
            times: list[float] = []
            last = [time.perf_counter()]

            def tick(step: int, total: int, loss: float, times: list[float] = times, last: list[float] = last) -> None:
                now = time.perf_counter()
                times.append(now - last[0])
                last[0] = now

            one = replace(config, epochs=1, max_examples=(steps + 1) * config.batch_size, bf16=bf16)
            train_kgc(encoder, entities, data, one, tail=tail, on_step=tick, chunk_rows=chunk)
            seconds[(bf16, chunk)] += times[1:]
            log("kgc", f"profile round {rep}, bf16 {bf16}, chunk {chunk}: " + ", ".join(f"{t:.1f}s" for t in times))
    n_train = 2 * data.splits["train"].shape[0]  # triples and their inverses
    out: dict[str, object] = {
        "steps_timed_per_setting": 2 * steps,
        "batch_size": config.batch_size,
        "threads": torch.get_num_threads(),
        "settings": {},
    }
    for (bf16, chunk), times in seconds.items():
        median = float(np.median(times))
        out["settings"][f"{'bf16' if bf16 else 'float32'}, chunks of {chunk}"] = {  # type: ignore[index]
            "bf16": bf16,
            "chunk_rows": chunk,
            "seconds_per_step_median": round(median, 2),
            "examples_per_second": round(config.batch_size / median, 1),
            "epoch_hours": round(n_train / (config.batch_size / median) / 3600, 2),
        }
    bf16, chunk = settings[-1]
    one = replace(config, epochs=1, max_examples=2 * config.batch_size, bf16=bf16)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        train_kgc(encoder, entities, data, one, tail=tail, chunk_rows=chunk)
        wall = time.perf_counter() - started
    spent = {e.key: e.cpu_time_total / 1e6 for e in prof.key_averages() if e.key.startswith("kgc.")}
    out["profiled"] = {
        "setting": f"{'bf16' if bf16 else 'float32'}, chunks of {chunk}",
        "steps": 2,
        "wall_seconds": round(wall, 2),
        "seconds_outside_the_model": {k: round(v, 4) for k, v in sorted(spent.items())},
        "share_outside_the_model": round(sum(spent.values()) / wall, 4),
    }
    out["max_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    lengths = entities.lengths()
    out["entity_tokens"] = {
        "mean": round(float(lengths.mean()), 1),
        "p90": float(np.percentile(lengths, 90)),
        "at_max_length": round(float((lengths >= encoder.max_length).mean()), 4),
    }
    return out
