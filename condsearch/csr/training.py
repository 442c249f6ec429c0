"""Training the router layers on C-STS: MSE on the scaled label, optionally W-ACL.

Only the router query and layers t..T-1 after layer t's self-attention train, so the
cached sentence states stay valid. Rows are batched as (high, low) groups: the two rows of
one sentence pair under its two conditions, which W-ACL needs.
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

from condsearch.csr.cache import collate
from condsearch.csr.encoder import CsrEncoder
from condsearch.csts import CstsData, scale_labels
from condsearch.losses import group_positions, pair_groups, wacl_loss
from condsearch.metrics import correlations

log = logging.getLogger(__name__)

LOSSES = ("mse", "wacl", "mse+wacl")


@dataclass(frozen=True)
class RouterTrainConfig:
    """Hyper-parameters of router training (CSR paper settings as defaults)."""

    epochs: int = 3
    batch_size: int = 32
    lr: float = 3e-5
    weight_decay: float = 0.1
    warmup: float = 0.1
    loss: str = "mse"
    wacl_weight: float = 1.0
    gain_lr: float = 1e-2
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
        q = enc.router.condition_queries(enc._tokenize(distinct))
        qi = q[[distinct.index(c) for c in conds]]
        s1 = collate([self.states[d.sentence1[i]] for i in idx], device=enc.device)
        s2 = collate([self.states[d.sentence2[i]] for i in idx], device=enc.device)
        return enc.router.route(s1, qi), enc.router.route(s2, qi)


def evaluate_router(encoder: CsrEncoder, feats: _Featurizer, batch_size: int = 128) -> dict[str, float]:
    """Return Spearman/Pearson ×100 of cos(v1, v2) against the labels."""
    encoder.router.eval()
    n = len(feats.data)
    cos = np.empty(n, dtype=np.float32)
    with torch.inference_mode():
        for start in range(0, n, batch_size):
            idx = list(range(start, min(n, start + batch_size)))
            a, b = feats.rows(idx)
            cos[start : start + len(idx)] = nn.functional.cosine_similarity(a, b).float().cpu().numpy()
    return correlations(cos, feats.data.labels)


def train_router(
    encoder: CsrEncoder,
    train: CstsData,
    config: RouterTrainConfig,
    *,
    dev: CstsData | None = None,
    on_epoch: Callable[[int, float, dict[str, float] | None], None] | None = None,
) -> list[dict[str, float]]:
    """Fine-tune the router in place; with dev, keep the epoch with the best dev Spearman."""
    if config.loss not in LOSSES:
        raise ValueError(f"loss must be one of {', '.join(LOSSES)}")
    torch.manual_seed(config.seed)
    rng = random.Random(config.seed)
    router = encoder.router
    router.freeze_backbone()
    params = [p for name, p in router.trainable_parameters().items() if name != "router_log_gain"]
    optim = torch.optim.AdamW(
        [
            {"params": params},
            {"params": [router.log_gain], "lr": config.gain_lr, "weight_decay": 0.0},
        ],
        lr=config.lr,
        weight_decay=config.weight_decay,
    )
    train_f = _Featurizer(encoder, train)
    dev_f = _Featurizer(encoder, dev) if dev is not None else None
    groups = pair_groups(train)
    n_groups_per_batch = max(1, config.batch_size // 2)
    steps = config.epochs * ((len(groups) + n_groups_per_batch - 1) // n_groups_per_batch)
    warm = max(1, int(config.warmup * steps))
    sched = torch.optim.lr_scheduler.LambdaLR(
        optim, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1, steps - warm)))
    )
    y_all = torch.from_numpy(scale_labels(train.labels)).to(encoder.device)
    history: list[dict[str, float]] = []
    best_state, best = None, -float("inf")
    if dev_f is not None:
        base = evaluate_router(encoder, dev_f)
        history.append({"epoch": 0, "loss": None, **{f"dev_{k}": v for k, v in base.items() if k != "n"}})
        best = base["spearman"]
        best_state = {k: v.detach().clone() for k, v in router.trainable_parameters().items()}
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
        row: dict[str, float] = {"epoch": epoch, "loss": total / max(1, count)}
        dev_scores = evaluate_router(encoder, dev_f) if dev_f is not None else None
        row["gain"] = router.log_gain.exp().item()
        if dev_scores is not None:
            row.update({f"dev_{k}": v for k, v in dev_scores.items() if k != "n"})
            if dev_scores["spearman"] > best:
                best = dev_scores["spearman"]
                best_state = {k: v.detach().clone() for k, v in router.trainable_parameters().items()}
        history.append(row)
        if on_epoch is not None:
            on_epoch(epoch, row["loss"], dev_scores)
    if best_state is not None:
        with torch.no_grad():
            for name, p in router.trainable_parameters().items():
                p.copy_(best_state[name])
    router.eval()
    return history


def train_router_and_save(
    train_csv: Path,
    out: Path,
    config: RouterTrainConfig,
    *,
    dev_csv: Path | None = None,
    model: str | None = None,
    layer: int | None = None,
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
        model, router="none", layer=layer, device=device, max_length=max_length, trust_remote_code=trust_remote_code
    )
    history = train_router(encoder, train, config, dev=dev, on_epoch=on_epoch)
    summary: dict[str, object] = {
        "out": str(out),
        "layer": encoder.router.layer,
        "train_rows": len(train),
        "config": asdict(config),
        "train_csv": Path(train_csv).name,
        "gain": round(encoder.router.log_gain.exp().item(), 4),
        "history": history,
    }
    if dev is not None:
        best = max(history, key=lambda r: r["dev_spearman"])
        summary.update(
            {
                "dev_csv": Path(dev_csv).name,  # type: ignore[arg-type]
                "dev_spearman": best["dev_spearman"],
                "dev_spearman_untrained": history[0]["dev_spearman"],
                "best_epoch": int(best["epoch"]),
            }
        )
    meta = {"model_id": encoder.model_id, "model_revision": encoder.revision, "training": summary}
    summary["checksum"] = save_router(encoder.router, out, meta)
    return summary
