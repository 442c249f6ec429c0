"""Training the router layers on C-STS: MSE on the scaled label (the paper), optionally W-ACL (ours).

Only layers t..T-1 after layer t's self-attention train, with whatever the router config adds
(query copies, gains, the condition projection), so the cached sentence states stay valid.
Rows are batched as (high, low) groups: the two rows of one sentence pair under its two
conditions, which W-ACL and the condition sensitivity need.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from condsearch.best_epoch import BestEpoch, best_row
from condsearch.csr.cache import collate
from condsearch.csr.encoder import CsrEncoder
from condsearch.csr.router import PAPER, RouterConfig
from condsearch.csts import CstsData, scale_labels
from condsearch.losses import group_positions, pair_groups, wacl_loss
from condsearch.metrics import condition_sensitivity, correlations
from condsearch.schedule import linear_schedule

log = logging.getLogger(__name__)

LOSSES = ("mse", "wacl", "mse+wacl")


@dataclass(frozen=True)
class RouterTrainConfig:
    """Hyper-parameters of router training; the single source of the CLI's csr defaults.

    epochs, batch size and loss follow the CSR paper on C-STS (3 epochs, batch 32, MSE);
    lr 3e-4 is ours: with only the top layer training, the paper's 1e-5–5e-5 barely moves it.
    """

    epochs: int = 3
    batch_size: int = 32
    lr: float = 3e-4
    weight_decay: float = 0.1
    warmup: float = 0.1
    loss: str = "mse"
    wacl_weight: float = 1.0
    gain_lr: float = 1e-2  # the learned gain of the extended router, log-parametrised
    seed: int = 0


class _Featurizer:
    """Routed vectors for C-STS rows, with gradients through the trainable parameters."""

    def __init__(self, encoder: CsrEncoder, data: CstsData) -> None:
        self.encoder = encoder
        texts = list(dict.fromkeys(data.sentence1 + data.sentence2))
        keys = encoder.cache_sentences(texts, progress=True)
        # the whole training set's states in memory: fine for C-STS (~0.5 GB at fp16)
        self.states = dict(zip(texts, encoder.states.get(keys), strict=True))
        self.data = data

    def rows(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        d, enc = self.data, self.encoder
        conds = [d.condition[i] for i in idx]
        distinct = list(dict.fromkeys(conds))
        codes = enc.router.condition_codes(enc._tokenize(distinct))
        code = codes.select(torch.tensor([distinct.index(c) for c in conds], device=enc.device))
        s1 = collate([self.states[d.sentence1[i]] for i in idx], device=enc.device)
        s2 = collate([self.states[d.sentence2[i]] for i in idx], device=enc.device)
        return enc.router.route(s1, code), enc.router.route(s2, code)


def pair_sensitivity(data: CstsData, v1: np.ndarray, v2: np.ndarray) -> float:
    """Condition sensitivity on C-STS: each sentence of a pair under the pair's two conditions."""
    groups = [g for g in pair_groups(data) if len(g) == 2]
    if not groups:
        return float("nan")
    a = np.array([g[0] for g in groups])
    b = np.array([g[1] for g in groups])
    return condition_sensitivity(np.concatenate([v1[a], v2[a]]), np.concatenate([v1[b], v2[b]]))


def evaluate_router(encoder: CsrEncoder, feats: _Featurizer, batch_size: int = 128) -> dict[str, float]:
    """Return Spearman/Pearson ×100 of cos(v1, v2) against the labels, and the condition sensitivity."""
    encoder.router.eval()
    n = len(feats.data)
    v1 = np.empty((n, encoder.dim), dtype=np.float32)
    v2 = np.empty((n, encoder.dim), dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, n, batch_size):
            idx = list(range(start, min(n, start + batch_size)))
            a, b = feats.rows(idx)
            v1[start : start + len(idx)] = a.float().cpu().numpy()
            v2[start : start + len(idx)] = b.float().cpu().numpy()
    cos = np.einsum("ij,ij->i", v1, v2) / np.maximum(np.linalg.norm(v1, axis=1) * np.linalg.norm(v2, axis=1), 1e-12)
    out = correlations(cos, feats.data.labels)
    out["condition_sensitivity"] = pair_sensitivity(feats.data, v1, v2)
    return out


def train_router(
    encoder: CsrEncoder,
    train: CstsData,
    config: RouterTrainConfig,
    *,
    dev: CstsData | None = None,
    on_epoch: Callable[[int, float, dict[str, float] | None], None] | None = None,
) -> list[dict[str, float]]:
    """Fine-tune the router in place; with dev, keep the epoch with the best dev Spearman
    (the untrained start included, so training never returns weights that score below it)."""
    if config.loss not in LOSSES:
        raise ValueError(f"loss must be one of {', '.join(LOSSES)}")
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    router = encoder.router
    router.freeze_backbone()
    named = router.trainable_parameters()
    params = [p for name, p in named.items() if name != "router_log_gain"]
    groups_: list[dict[str, object]] = [{"params": params}]
    if "router_log_gain" in named:
        groups_.append({"params": [named["router_log_gain"]], "lr": config.gain_lr, "weight_decay": 0.0})
    optim = torch.optim.AdamW(groups_, lr=config.lr, weight_decay=config.weight_decay)  # type: ignore[arg-type]
    train_f = _Featurizer(encoder, train)
    dev_f = _Featurizer(encoder, dev) if dev is not None else None
    groups = pair_groups(train)
    n_groups_per_batch = max(1, config.batch_size // 2)
    steps = config.epochs * ((len(groups) + n_groups_per_batch - 1) // n_groups_per_batch)
    sched = linear_schedule(optim, steps, config.warmup)
    y_all = torch.from_numpy(scale_labels(train.labels)).to(encoder.device)
    best = BestEpoch()

    def evaluate(epoch: int, loss: float | None) -> dict[str, float] | None:
        row: dict[str, float] = {"epoch": epoch, "loss": loss}  # type: ignore[dict-item]
        row["gain"] = router.gains()[0]
        scores = evaluate_router(encoder, dev_f) if dev_f is not None else None
        if scores is not None:
            row.update({f"dev_{k}": v for k, v in scores.items() if k != "n"})
        best.offer(epoch, scores["spearman"] if scores else None, router.trainable_parameters(), row)
        if scores is not None:
            log.info(
                "epoch %d: dev spearman %.2f, sensitivity %.4f", epoch, best.score, scores["condition_sensitivity"]
            )
        return scores

    if dev_f is not None:
        evaluate(0, None)
    for epoch in range(1, config.epochs + 1):
        router.train()
        rng.shuffle(groups)
        total, count = 0.0, 0
        for start in range(0, len(groups), n_groups_per_batch):
            batch = groups[start : start + n_groups_per_batch]
            idx = [i for g in batch for i in g]
            a, b = train_f.rows(idx)
            cos = nn.functional.cosine_similarity(a, b)
            y = y_all[idx]
            loss = torch.zeros((), device=encoder.device)
            if config.loss in ("mse", "mse+wacl"):
                loss = loss + nn.functional.mse_loss(cos, y)
            if config.loss in ("wacl", "mse+wacl"):
                pairs = [p for p in group_positions(batch) if p is not None]
                if pairs:
                    hi = torch.tensor([p[0] for p in pairs], device=encoder.device)
                    lo = torch.tensor([p[1] for p in pairs], device=encoder.device)
                    loss = loss + config.wacl_weight * wacl_loss(cos[hi], cos[lo], y[hi], y[lo])
            optim.zero_grad()
            loss.backward()
            optim.step()
            sched.step()
            total += loss.item() * len(idx)
            count += len(idx)
        scores = evaluate(epoch, total / max(1, count))
        if on_epoch is not None:
            on_epoch(epoch, total / max(1, count), scores)
    best.restore(router.trainable_parameters())
    router.eval()
    return best.history


def train_router_and_save(
    train_csv: Path,
    out: Path,
    config: RouterTrainConfig,
    *,
    router_config: RouterConfig = PAPER,
    dev_csv: Path | None = None,
    model: str | None = None,
    device: str | None = None,
    max_length: int | None = None,
    trust_remote_code: bool = False,
    on_epoch: Callable[[int, float, dict[str, float] | None], None] | None = None,
) -> dict[str, object]:
    """Train the router layers from the pre-trained backbone and save them; return a summary."""
    from condsearch.csr.encoder import load_csr_encoder
    from condsearch.csr.weights import save_router
    from condsearch.csts import read_csts

    train = read_csts(train_csv)
    dev = read_csts(dev_csv) if dev_csv is not None else None
    encoder = load_csr_encoder(
        model,
        router="none",
        variant=router_config,
        device=device,
        max_length=max_length,
        trust_remote_code=trust_remote_code,
    )
    history = train_router(encoder, train, config, dev=dev, on_epoch=on_epoch)
    summary: dict[str, object] = {
        "out": str(out),
        "layer": encoder.router.layer,
        "variant": router_config.variant,
        "router_config": router_config.to_dict(),
        "train_rows": len(train),
        "config": asdict(config),
        "train_csv": Path(train_csv).name,
        "gains": [round(g, 4) for g in encoder.router.gains()],
        "history": history,
    }
    best = best_row(history)
    if best is not None and dev_csv is not None:
        summary.update(
            {
                "dev_csv": Path(dev_csv).name,
                "dev_spearman": best["dev_spearman"],
                "dev_condition_sensitivity": best["dev_condition_sensitivity"],
                "dev_spearman_untrained": history[0]["dev_spearman"],
                "dev_condition_sensitivity_untrained": history[0]["dev_condition_sensitivity"],
                "best_epoch": int(best["epoch"]),
            }
        )
    meta: dict[str, object] = {"model_id": encoder.model_id, "model_revision": encoder.revision, "training": summary}
    summary["checksum"] = save_router(encoder.router, out, meta)
    return summary
