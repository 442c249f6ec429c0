"""Training the CASE projection head on cached, frozen encoder outputs.

:func:`fit_head` trains a head on encoded pairs; :func:`fit_and_save_head` reads the C-STS files,
encodes them (through the cache), fits and writes the head folder.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from condsearch.base.output_cache import EmbeddingCache
from condsearch.corpus.csts import CstsData, scale_labels
from condsearch.metrics import correlations
from condsearch.model.encoders.base import ENCODE_BATCH_SIZE, Encoder
from condsearch.model.head import HeadConfig, ProjectionHead
from condsearch.train.best_epoch import BestEpoch, best_row
from condsearch.train.finite import check_finite_fields, finite_record
from condsearch.train.mixture import TrainData, describe_sources

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeadTrainConfig:
    """Hyper-parameters of the head (SPEC §2.1 reference values as defaults)."""

    dim: int = 256
    epochs: int = 30
    batch_size: int = 512
    lr: float = 1e-3
    dropout: float = 0.15
    seed: int = 0

    def __post_init__(self) -> None:
        check_finite_fields(self)


@dataclass(frozen=True)
class PairFeatures:
    """Raw CASE vectors of both sentences of each C-STS row, and the labels."""

    x1: np.ndarray  # (n, d) float32
    x2: np.ndarray  # (n, d) float32
    labels: np.ndarray  # (n,) float32, 1..5


def case_features(
    encoder: Encoder,
    data: CstsData,
    *,
    batch_size: int = ENCODE_BATCH_SIZE,
    cache: EmbeddingCache | None = None,
    progress: bool = False,
) -> PairFeatures:
    """Encode both sides of each row under its condition (one encoder pass for both)."""
    n = len(data)
    both = encoder.encode(
        data.sentence1 + data.sentence2,
        data.condition + data.condition,
        batch_size=batch_size,
        cache=cache,
        progress=progress,
    )
    return PairFeatures(both[:n], both[n:], data.labels)


def evaluate_head(
    head: ProjectionHead | None,
    features: PairFeatures,
    *,
    mix: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, float]:
    """Return Spearman/Pearson ×100 of cos(g(x1), g(x2)) (or of ``mix`` of it) against the labels."""
    a, b = features.x1, features.x2
    if head is not None:
        a, b = head.project(a), head.project(b)
    cos = nn.functional.cosine_similarity(torch.from_numpy(a), torch.from_numpy(b), dim=1)
    return correlations((mix(cos) if mix is not None else cos).numpy(), features.labels)


def fit_head(
    train: PairFeatures,
    config: HeadTrainConfig,
    *,
    dev: PairFeatures | None = None,
    head_config: HeadConfig | None = None,
    on_epoch: Callable[[int, float, dict[str, float] | None], None] | None = None,
) -> tuple[ProjectionHead, list[dict[str, float]]]:
    """Fit the head by MSE between cosine and the scaled label.

    With ``dev``, the weights of the epoch with the best dev Spearman are kept.
    Returns the head (in eval mode) and one history row per epoch.
    """
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    d_in = train.x1.shape[1]
    hc = head_config or HeadConfig(input_dim=d_in, dim=config.dim, dropout=config.dropout)
    head = ProjectionHead(hc)
    optim = torch.optim.Adam(head.parameters(), lr=config.lr)
    x1 = torch.from_numpy(train.x1)
    x2 = torch.from_numpy(train.x2)
    y = torch.from_numpy(scale_labels(train.labels))
    best = BestEpoch()
    for epoch in range(1, config.epochs + 1):
        head.train()
        order = torch.randperm(len(y), generator=generator)
        total = 0.0
        for start in range(0, len(y), config.batch_size):
            idx = order[start : start + config.batch_size]
            cos = nn.functional.cosine_similarity(head(x1[idx]), head(x2[idx]), dim=1)
            loss = nn.functional.mse_loss(cos, y[idx])
            optim.zero_grad()
            loss.backward()
            optim.step()
            total += loss.item() * len(idx)
        row: dict[str, float] = {"epoch": epoch, "loss": total / len(y)}
        dev_scores = evaluate_head(head.eval(), dev) if dev is not None else None
        if dev_scores is not None:
            row.update({f"dev_{k}": v for k, v in dev_scores.items() if k != "n"})
        best.offer(epoch, dev_scores["spearman"] if dev_scores else None, head.state_dict(), row)
        if on_epoch is not None:
            on_epoch(epoch, row["loss"], dev_scores)
    best.restore(head.state_dict())
    return head.eval(), best.history


def fit_and_save_head(
    train_csv: TrainData,
    out: Path,
    config: HeadTrainConfig,
    *,
    dev_csv: Path | None = None,
    model: str | None = None,
    device: str | None = None,
    batch_size: int = ENCODE_BATCH_SIZE,
    use_cache: bool = True,
    trust_remote_code: bool = False,
    on_epoch: Callable[[int, float, dict[str, float] | None], None] | None = None,
    **encoder_options: Any,
) -> dict[str, object]:
    """Encode the CSVs (through the cache), train a head, save it; return a summary.

    ``encoder_options`` (pooling, prompt_template, unconditional_template, dtype, max_length)
    go to :func:`condsearch.model.encoders.load_encoder`.
    """
    from condsearch.base.output_cache import default_cache_dir
    from condsearch.corpus.csts import read_csts
    from condsearch.model.encoders import load_encoder
    from condsearch.model.encoders.spec import EncoderSpec, Runtime
    from condsearch.model.head import save_head
    from condsearch.train.mixture import read_training

    train = read_training(train_csv, config.seed)
    dev = read_csts(dev_csv) if dev_csv is not None else None
    encoder = load_encoder(
        EncoderSpec(
            model,
            profile="none",
            **encoder_options,
            runtime=Runtime(device=device, trust_remote_code=trust_remote_code),
        )
    )
    cache = EmbeddingCache(default_cache_dir() / "features") if use_cache else None
    train_f = case_features(encoder, train, batch_size=batch_size, cache=cache, progress=True)
    dev_f = case_features(encoder, dev, batch_size=batch_size, cache=cache, progress=True) if dev else None
    hc = HeadConfig(
        input_dim=encoder.dim,
        dim=config.dim,
        dropout=config.dropout,
        model_id=encoder.model_id,
        model_revision=encoder.revision,
        encoder_pooling=str(encoder.describe().get("pooling", "")),
    )
    head, history = fit_head(train_f, config, dev=dev_f, head_config=hc, on_epoch=on_epoch)
    summary: dict[str, object] = {
        "out": str(out),
        "dim": config.dim,
        "train_rows": len(train),
        "config": asdict(config),
        "train_csv": describe_sources(train_csv),
    }
    described = encoder.describe()
    if "prompt_template" in described:  # prompted encoders: record the prompts the head was trained on
        summary["encoder"] = described
    best = best_row(history)
    if best is not None and dev_csv is not None:
        summary.update(
            {
                "dev_csv": Path(dev_csv).name,
                "dev_spearman": best["dev_spearman"],
                "best_epoch": int(best["epoch"]),
            }
        )
    summary = finite_record(summary)
    summary["checksum"] = save_head(head, out, extra={"training": summary})
    return summary
