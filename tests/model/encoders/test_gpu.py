"""CUDA runs give the CPU's vectors (run with -m gpu; skipped where CUDA is absent)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from condsearch.model.encoders import load_encoder
from condsearch.model.encoders.spec import EncoderSpec, Runtime

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

PAIRS = [
    ("color of the dress", "A girl in an orange dress serves the ball on a tennis court."),
    ("the sport being played", "Two men play soccer."),
    ("color of the dress", None),
    ("mood", "A boy rides a bicycle down a quiet street on a sunny day, and his dog runs after him."),
]


def test_tiny_bert_on_cuda_equals_cpu(tiny_bert_dir: Path) -> None:
    cpu = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cpu")))
    gpu = load_encoder(EncoderSpec(str(tiny_bert_dir), runtime=Runtime(device="cuda")))
    assert next(gpu.model.parameters()).device.type == "cuda"
    np.testing.assert_allclose(gpu.encode_batch(PAIRS), cpu.encode_batch(PAIRS), rtol=1e-4, atol=1e-4)
    sentences = [s for _, s in PAIRS if s is not None]
    np.testing.assert_allclose(
        gpu.encode(sentences, "color of the dress"),
        cpu.encode(sentences, "color of the dress"),
        rtol=1e-4,
        atol=1e-4,
    )


def test_default_model_on_cuda_equals_cpu() -> None:
    cpu = load_encoder(EncoderSpec(None, profile="none", runtime=Runtime(device="cpu")))
    gpu = load_encoder(EncoderSpec(None, profile="none", runtime=Runtime(device="cuda")))
    a, b = gpu.encode_batch(PAIRS), cpu.encode_batch(PAIRS)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert (cos > 0.9999).all(), cos
    np.testing.assert_allclose(a, b, atol=1e-3)


def test_cli_default_device_is_cuda_and_matches_cpu(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    import json

    from condsearch.cli import main

    runner = CliRunner()
    for device, folder in ((None, "gpu"), ("cpu", "cpu")):
        args = [
            "index",
            str(corpus_file),
            "-c",
            "colour",
            "--model",
            str(tiny_bert_dir),
            "--index-dir",
            str(tmp_path / folder),
        ]
        assert runner.invoke(main, args + (["--device", device] if device else [])).exit_code == 0
    hits = {}
    for folder in ("gpu", "cpu"):
        result = runner.invoke(
            main,
            [
                "query",
                "a girl in an orange dress",
                "-c",
                "colour",
                "-k",
                "3",
                "--json",
                "--index-dir",
                str(tmp_path / folder),
                "--device",
                "cpu",
            ],
        )
        assert result.exit_code == 0, result.output
        hits[folder] = json.loads(result.stdout)["results"]
    assert [h["id"] for h in hits["gpu"]] == [h["id"] for h in hits["cpu"]]
    np.testing.assert_allclose([h["score"] for h in hits["gpu"]], [h["score"] for h in hits["cpu"]], atol=1e-3)


def test_gpu_search_benchmark_agrees_with_the_cpu() -> None:
    from benchmarks.systems.gpu_search import measure

    cell = measure(rows=5000, dim=32, queries=5, batch=16, repeats=1, seed=0)
    assert cell["top10_agree"] == 1.0
    assert cell["gpu_batch1_p50_ms"] > 0 and cell["cpu_batch1_p50_ms"] > 0


faiss_gpu = pytest.mark.skipif(
    not __import__("condsearch.base.faiss_indexes", fromlist=["gpu_available"]).gpu_available(),
    reason="needs FAISS's GPU build",
)


def _clustered(rows: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    from benchmarks.systems.gpu_search import clustered

    return clustered(rows, dim, clusters=64, n_queries=32, seed=0)


@faiss_gpu
def test_faiss_gpu_flat_and_ivf_through_the_store_path_agree_with_the_cpu() -> None:
    from benchmarks._lib.common import rankings_agree
    from condsearch.base.faiss_indexes import build_index, on_gpu, search, to_search_device

    corpus, queries = _clustered(20_000, 64)
    for factory, params in (("Flat", ""), ("IVF64,Flat", "nprobe=8")):
        cpu = build_index(corpus, factory, search_params=params)
        gpu = to_search_device(cpu)
        assert on_gpu(gpu), (factory, type(gpu).__name__)
        a, b = search(cpu, queries, 10), search(gpu, queries, 10)
        agree = rankings_agree(a.scores, a.ids, b.scores, b.ids, tol=1e-4)
        assert agree.mean() >= 0.95, (factory, agree.mean())  # the same lists probed: the same rows


@faiss_gpu
def test_a_k_beyond_the_gpus_selection_searches_the_cpu_copy() -> None:
    from condsearch.base.faiss_indexes import GPU_MAX_K, build_index, to_search_device
    from condsearch.store.searchable import FaissIndex, StoredIndex

    corpus, queries = _clustered(3000, 32)
    cpu = build_index(corpus, "Flat")
    stored = StoredIndex("t", None, cpu, list(range(3000)), [str(i) for i in range(3000)])  # type: ignore[arg-type]
    found = FaissIndex(stored, to_search_device(cpu)).search(queries[:2], GPU_MAX_K + 1)
    assert found.result.ids.shape == (2, GPU_MAX_K + 1)
    assert (found.result.ids >= 0).all()
