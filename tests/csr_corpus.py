"""A small router corpus and a moved router for the tiny BERT, shared by the csr parity, on-demand and build tests."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.conftest import SENTENCES

WORDS = "girl dress red blue tennis court dog beach man park golf ball shirt horse".split()


def csr_texts(n: int = 40) -> list[str]:
    """Return n texts: the suite's sentences, then made-up word runs."""
    made = [" ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 3 + i % 5)) + f" {i}" for i in range(n)]
    return [*SENTENCES, *made[len(SENTENCES) :]]


def write_csr_corpus(path: Path) -> Path:
    """Write csr_texts() as a parquet corpus with ids r0, r1, …; return its path."""
    texts = csr_texts()
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(len(texts))], "text": texts}), path)
    return path


def move_router(tiny_bert_dir: Path, folder: Path, seed: int) -> Path:
    """Save a router for the tiny BERT whose weights are moved off their start by a seeded step, into folder/r."""
    import shutil

    import torch

    from condsearch.model.csr import load_csr_encoder
    from condsearch.model.csr.weights import save_router

    encoder = load_csr_encoder(str(tiny_bert_dir), router="none", variant="extended", cache_dir=folder / "cache")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in encoder.router.trainable_parameters().values():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    if (folder / "r").exists():
        shutil.rmtree(folder / "r")
    save_router(encoder.router, folder / "r", {"model_id": encoder.model_id}, dtype=torch.float32)
    return folder / "r"
