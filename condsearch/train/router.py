"""Training a router on C-STS: MSE on the scaled label (the paper), optionally W-ACL (ours).

The paper/extended router trains layers t..T-1 after layer t's self-attention, with whatever its
config adds (query copies, gains, the condition projection), over cached sentence states; with
``train_backbone="all"`` it trains its whole backbone instead, as the paper does. The
context router (ours) trains its backbone: all of it (sentences then run the full forward pass
every step) or the top k layers (over cached states of the layers below), from the base model
or from the shipped ``full`` CASE profile's weights.
Rows are batched as (high, low) groups: the two rows of one sentence pair under its two
conditions, which W-ACL and the condition sensitivity need. Each epoch ends with a checkpoint
(:mod:`condsearch.train.checkpoint`) that ``resume`` continues from.

:func:`fit_router` trains a loaded router in place; :func:`fit_and_save_router` reads the C-STS
files, loads the backbone, fits and writes the router folder.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from condsearch.corpus.csts import CstsData, scale_labels
from condsearch.errors import ModelError
from condsearch.metrics import condition_sensitivity, correlations
from condsearch.model.csr.cache import collate
from condsearch.model.csr.context import CONTEXT, TRAIN_SCOPES, ContextConfig, ContextRouter
from condsearch.model.csr.encoder import CsrEncoder
from condsearch.model.csr.router import PAPER, RouterConfig, SentenceStates
from condsearch.progress import progress_bar
from condsearch.train.best_epoch import BestEpoch, best_row
from condsearch.train.checkpoint import TrainingState, data_digest, has_checkpoint, load_checkpoint, save_checkpoint
from condsearch.train.contrast import (
    HIGH_LABEL,
    agreement_mask,
    condition_batches,
    in_condition_loss,
    label_agreement,
)
from condsearch.train.finite import check_finite_fields, finite_record
from condsearch.train.losses import group_positions, pair_groups, wacl_loss
from condsearch.train.mixture import TrainData, describe_sources
from condsearch.train.schedule import linear_schedule

log = logging.getLogger(__name__)

LOSSES = ("mse", "wacl", "mse+wacl")
#: where the context router's backbone starts: the base model, the shipped full CASE profile merged in,
#: or the shipped router itself (issue 57: adapting it, as ``condsearch adapt`` does)
INITS = ("base", "full", "router")
#: the router folder init "router" starts from
INIT_ROUTER = "default"
#: the learning rate each variant trains at unless told: only the top layer trains for paper/extended
#: (ours: the paper's 1e-5–5e-5 barely moves it); the context router's 1e-4 is the issue-22 prototype's
DEFAULT_LR = {"paper": 3e-4, "extended": 3e-4, CONTEXT: 1e-4}
#: the context router's default train_backbone (paper/extended: top)
DEFAULT_SCOPE = "all"
#: paper/extended with the whole backbone training: within the paper's 1e-5–5e-5
WHOLE_BACKBONE_LR = 3e-5


@dataclass(frozen=True)
class RouterTrainConfig:
    """Hyper-parameters of router training; the single source of the CLI's csr defaults.

    epochs, batch size and loss follow the CSR paper on C-STS (3 epochs, batch 32, MSE).
    lr None is :data:`DEFAULT_LR` of the variant (:data:`WHOLE_BACKBONE_LR` for paper/extended
    with the whole backbone). train_backbone: all or top (None: :data:`DEFAULT_SCOPE` for the
    context router, top for paper/extended). init, base or full, applies to the context router only.
    """

    epochs: int = 3
    batch_size: int = 32
    lr: float | None = None
    weight_decay: float = 0.1
    warmup: float = 0.1
    loss: str = "mse"
    wacl_weight: float = 1.0
    gain_lr: float = 1e-2  # the learned gain of the extended router, log-parametrised
    seed: int = 0
    train_backbone: str | None = None
    init: str = "base"
    #: ours (issue 39): weight of the in-condition contrastive term (:mod:`condsearch.train.contrast`)
    #: beside the loss above; above 0, batches gather rows that share their high condition
    contrast_weight: float = 0.0
    #: ours (issue 57): weight of a term that keeps each batch text's plain vector (no condition) where the
    #: router put it before training, w · mean(1 − cos); an anchor on what the start router knows
    distill_weight: float = 0.0
    #: ours (issue 57): weight of the replay anchor (:mod:`condsearch.train.replay`): w · mean(1 − cos)
    #: between a sample of the bundled captions' conditioned vectors now and before training
    replay_weight: float = 0.0
    #: (caption, condition) rows the replay anchor routes per step
    replay_batch: int = 16

    def __post_init__(self) -> None:
        check_finite_fields(self)
        if self.contrast_weight < 0 or self.distill_weight < 0 or self.replay_weight < 0:
            raise ValueError("contrast_weight, distill_weight and replay_weight must be 0 or more")
        if self.replay_batch < 1:
            raise ValueError("replay_batch must be at least 1")

    def resolved(self, variant: str) -> RouterTrainConfig:
        """Return the config with lr and train_backbone filled in for variant; ValueError when it does not apply."""
        if self.loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}")
        lr = self.lr if self.lr is not None else DEFAULT_LR[variant]
        if variant != CONTEXT:
            scope = self.train_backbone or "top"
            if self.init != "base":
                raise ValueError("init applies to the context router")
            if scope not in TRAIN_SCOPES:
                raise ValueError(f"train_backbone must be one of {', '.join(TRAIN_SCOPES)}")
            if scope == "all" and self.lr is None:
                lr = WHOLE_BACKBONE_LR
            return replace(self, lr=lr, train_backbone=scope)
        scope = self.train_backbone or DEFAULT_SCOPE
        if scope not in TRAIN_SCOPES or self.init not in INITS:
            raise ValueError(f"train_backbone must be one of {', '.join(TRAIN_SCOPES)}, init one of {', '.join(INITS)}")
        return replace(self, lr=lr, train_backbone=scope)


class _Featurizer:
    """Routed vectors for C-STS rows, with gradients through the trainable parameters.

    cached: sentence states come from the encoder's state cache (valid while the layers below
    the routed ones are frozen); otherwise every call runs them.
    """

    def __init__(self, encoder: CsrEncoder, data: CstsData, *, cached: bool = True) -> None:
        self.encoder = encoder
        self.data = data
        self.cached = cached
        self.states = {}
        if cached:
            texts = list(dict.fromkeys(data.sentence1 + data.sentence2))
            keys = encoder.cache_sentences(texts, progress=True)
            # the whole set's states in memory: fine for C-STS (~0.5 GB at fp16, a third for the context router)
            self.states = dict(zip(texts, encoder.states.get(keys), strict=True))

    def _sentences(self, texts: list[str]) -> SentenceStates:
        enc = self.encoder
        if self.cached:
            return collate([self.states[t] for t in texts], device=enc.device)
        return enc.router.sentence_states(enc._tokenize(texts))

    def plain(self, texts: list[str]) -> torch.Tensor:
        """Return the texts' routed vectors without a condition (the plain forward pass): (n, hidden)."""
        return self.encoder.route(self._sentences(texts), None)

    def _codes(self, idx: list[int]) -> Any:
        d, enc = self.data, self.encoder
        conds = [d.condition[i] for i in idx]
        distinct = list(dict.fromkeys(conds))
        codes = enc.router.condition_codes(enc._tokenize(distinct))
        return codes.select(torch.tensor([distinct.index(c) for c in conds], device=enc.device))

    def rows(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        d, enc = self.data, self.encoder
        code = self._codes(idx)
        s1 = self._sentences([d.sentence1[i] for i in idx])
        s2 = self._sentences([d.sentence2[i] for i in idx])
        return enc.route(s1, code), enc.route(s2, code)

    def first(self, idx: list[int]) -> torch.Tensor:
        """Return the routed vectors of the rows' first sentences under their conditions: (len(idx), hidden)."""
        return self.encoder.route(self._sentences([self.data.sentence1[i] for i in idx]), self._codes(idx))


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


def merge_full_profile(encoder: CsrEncoder) -> None:
    """Merge the shipped full CASE profile's weight change into the context router's backbone, in place."""
    from condsearch.base.artifact_files import FULL_PROFILE_DIR
    from condsearch.model.artifacts.adapters import read_adapter
    from condsearch.model.encoders.lora import merge_adapter

    adapter = read_adapter(FULL_PROFILE_DIR)
    trained_for = adapter.meta.get("model_id")
    if trained_for not in (None, encoder.model_id):
        raise ModelError(f"init full: the full profile was trained for {trained_for}, not {encoder.model_id}")
    merge_adapter(encoder.router.model, adapter)
    encoder.refresh_identity()


def fit_router(
    encoder: CsrEncoder,
    train: CstsData,
    config: RouterTrainConfig,
    *,
    dev: CstsData | None = None,
    on_epoch: Callable[[int, float, dict[str, float] | None], None] | None = None,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    checkpoint_every: int = 0,
    progress: bool = False,
    values: Mapping[tuple[str, str], str] | None = None,
    replay: CstsData | None = None,
) -> list[dict[str, float]]:
    """Fine-tune the router in place; with dev, keep the epoch with the best dev Spearman
    (the untrained start included, so training never returns weights that score below it).

    With checkpoint_dir, the state after every epoch is written there, and every
    ``checkpoint_every`` optimiser steps within an epoch when it is positive (an epoch of the
    whole backbone of MiniLM takes about 7 minutes on a quiet 2-core CPU, several times that on a
    shared one); resume continues from the last one (same settings, model and data required),
    mid-epoch included. A context router with init full first gets the full profile merged into
    its backbone (init router: the encoder already holds the router it starts from).

    values: ``(condition, text) -> label value`` for the rows' texts, when they were drawn from a
    labelled table (``adapt``): the in-condition term then leaves out every candidate known to share
    the anchor's value, not only those the rows themselves connect. replay: the rows the replay
    anchor keeps (``config.replay_weight``; :func:`condsearch.train.replay.demo_replay`).
    """
    config = config.resolved(encoder.variant)
    assert config.lr is not None
    router = encoder.router
    router.trainable = "top" if config.train_backbone == "top" else "all"
    if isinstance(router, ContextRouter) and config.init == "full":
        merge_full_profile(encoder)
    router.freeze_backbone()
    named = router.trainable_parameters()
    params = [p for name, p in named.items() if name != "router_log_gain"]
    groups_: list[dict[str, object]] = [{"params": params}]
    if "router_log_gain" in named:
        groups_.append({"params": [named["router_log_gain"]], "lr": config.gain_lr, "weight_decay": 0.0})
    optim = torch.optim.AdamW(groups_, lr=config.lr, weight_decay=config.weight_decay)  # type: ignore[arg-type]
    # sentence states are cached unless the layers below the routed ones train
    cached = config.train_backbone == "top"
    train_f = _Featurizer(encoder, train, cached=cached)
    dev_f = _Featurizer(encoder, dev, cached=cached) if dev is not None else None
    groups = pair_groups(train)
    n_groups_per_batch = max(1, config.batch_size // 2)
    # each group's high condition: what the in-condition term's batches gather on
    group_keys = [train.condition[g[0]] for g in groups]
    if config.contrast_weight > 0:
        steps_per_epoch = len(condition_batches(group_keys, n_groups_per_batch, 0))  # the same for every seed
    else:
        steps_per_epoch = (len(groups) + n_groups_per_batch - 1) // n_groups_per_batch
    record: dict[str, object] = {
        **asdict(config),
        "router_config": router.config.to_dict(),
        "model": f"{encoder.model_id}@{encoder.revision}",
        "max_length": encoder.max_length,
        "train": data_digest(train),
        "dev": data_digest(dev),
    }
    state, kept = TrainingState(config=record), None
    if resume and checkpoint_dir is not None and has_checkpoint(checkpoint_dir):
        state, kept = load_checkpoint(checkpoint_dir, record, named, optim, steps_per_epoch=steps_per_epoch)
        log.info("resuming after epoch %d of %d from %s", state.epoch, config.epochs, checkpoint_dir)
    sched = linear_schedule(optim, config.epochs * steps_per_epoch, config.warmup, done_steps=state.step)
    y_all = torch.from_numpy(scale_labels(train.labels)).to(encoder.device)
    start_plain = _start_plain(train_f, train) if config.distill_weight > 0 else {}
    replay_f = _Featurizer(encoder, replay, cached=cached) if replay is not None and config.replay_weight > 0 else None
    start_replay = _start_routed(replay_f) if replay_f is not None else None
    best = BestEpoch(state.best_epoch, state.best_score, kept, state.history)

    def evaluate(epoch: int, loss: float | None) -> dict[str, float] | None:
        row: dict[str, float] = {"epoch": epoch, "loss": loss}  # type: ignore[dict-item]
        if gains := router.gains():
            row["gain"] = gains[0]
        scores = evaluate_router(encoder, dev_f) if dev_f is not None else None
        if scores is not None:
            row.update({f"dev_{k}": v for k, v in scores.items() if k != "n"})
        best.offer(epoch, scores["spearman"] if scores else None, named, row)
        if scores is not None:
            log.info(
                "epoch %d: dev spearman %.2f, sensitivity %.4f",
                epoch,
                scores["spearman"],
                scores["condition_sensitivity"],
            )
        state.epoch, state.best_epoch, state.best_score = epoch, best.epoch, best.score
        if checkpoint_dir is not None:
            save_checkpoint(checkpoint_dir, state, named, optim, best.state)
        return scores

    if dev_f is not None and not best.history:
        evaluate(0, None)
    for epoch in range(state.epoch + 1, config.epochs + 1):
        # seeded per epoch, so that a resumed run draws the same order and dropout masks
        torch.manual_seed(config.seed * 1000 + epoch)
        if config.contrast_weight > 0:
            # rows that share a condition meet in one batch, so that each has in-batch negatives under it
            batches = [
                [groups[j] for j in batch]
                for batch in condition_batches(group_keys, n_groups_per_batch, config.seed * 1000 + epoch)
            ]
        else:
            order = list(groups)
            random.Random(config.seed * 1000 + epoch).shuffle(order)
            batches = [order[s : s + n_groups_per_batch] for s in range(0, len(order), n_groups_per_batch)]
        router.train()
        if isinstance(router, ContextRouter):
            for module in router.frozen_below():
                module.eval()  # as their cached states were computed
        done, partial = state.epoch_step, dict(state.partial)  # batches of this epoch done before a resume
        if done and state.rng is not None:
            torch.set_rng_state(state.rng)  # the dropout masks go on as they would have
        total, count = partial.get("loss", 0.0), int(partial.get("n_rows", 0))
        desc = f"epoch {epoch}/{config.epochs}"
        bar = progress_bar(total=len(batches), initial=done, desc=desc, unit="step", enabled=progress)
        for i, batch in enumerate(batches[done:], start=done + 1):
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
            if config.contrast_weight > 0:
                conds = [train.condition[r] for r in idx]
                s1, s2 = [train.sentence1[r] for r in idx], [train.sentence2[r] for r in idx]
                if values is not None:
                    agree = label_agreement(s1, s2, conds, values)
                else:
                    agree = agreement_mask(s1, s2, conds, [bool(train.labels[r] >= HIGH_LABEL) for r in idx])
                loss = loss + config.contrast_weight * in_condition_loss(a, b, conds, agree)
            if config.distill_weight > 0:
                texts = list(dict.fromkeys([train.sentence1[r] for r in idx] + [train.sentence2[r] for r in idx]))
                now = nn.functional.normalize(train_f.plain(texts).float(), dim=-1)
                start = torch.stack([start_plain[t] for t in texts]).to(now.device)
                loss = loss + config.distill_weight * (1.0 - (now * start).sum(dim=1)).mean()
            if replay_f is not None and start_replay is not None:
                pick = torch.randperm(len(start_replay))[: config.replay_batch].tolist()
                now = nn.functional.normalize(replay_f.first(pick).float(), dim=-1)
                loss = loss + config.replay_weight * (1.0 - (now * start_replay[pick].to(now.device)).sum(dim=1)).mean()
            optim.zero_grad()
            loss.backward()
            optim.step()
            sched.step()
            state.step += 1
            total += loss.item() * len(idx)
            count += len(idx)
            bar.update(1)
            if checkpoint_dir is not None and checkpoint_every > 0 and i % checkpoint_every == 0 and i < len(batches):
                state.epoch_step, state.partial = i, {"loss": total, "n_rows": float(count)}
                save_checkpoint(checkpoint_dir, state, named, optim, best.state)
        bar.close()
        state.epoch_step, state.partial = 0, {}
        scores = evaluate(epoch, total / max(1, count))
        if on_epoch is not None:
            on_epoch(epoch, total / max(1, count), scores)
    best.restore(named)
    router.eval()
    encoder.refresh_identity()  # the caches now key on the trained weights
    return best.history


@torch.no_grad()
def _start_plain(feats: _Featurizer, data: CstsData, batch_size: int = 64) -> dict[str, torch.Tensor]:
    """Return every training text's unit plain vector as the router gives it before training (CPU)."""
    was_training = feats.encoder.router.training
    feats.encoder.router.eval()
    texts = sorted(dict.fromkeys(data.sentence1 + data.sentence2), key=len)
    out: dict[str, torch.Tensor] = {}
    for start in range(0, len(texts), batch_size):
        chunk = texts[start : start + batch_size]
        out.update(zip(chunk, nn.functional.normalize(feats.plain(chunk).float(), dim=-1).cpu(), strict=True))
    feats.encoder.router.train(was_training)
    return out


@torch.no_grad()
def _start_routed(feats: _Featurizer, batch_size: int = 64) -> torch.Tensor:
    """Return the unit routed vectors of every row's first sentence under its condition, before training (CPU)."""
    was_training = feats.encoder.router.training
    feats.encoder.router.eval()
    n = len(feats.data)
    parts = [
        nn.functional.normalize(feats.first(list(range(s, min(n, s + batch_size)))).float(), dim=-1).cpu()
        for s in range(0, n, batch_size)
    ]
    feats.encoder.router.train(was_training)
    return torch.cat(parts)


def fit_and_save_router(
    train_csv: TrainData,
    out: Path,
    config: RouterTrainConfig,
    *,
    router_config: RouterConfig | ContextConfig = PAPER,
    dev_csv: Path | None = None,
    model: str | None = None,
    device: str | None = None,
    max_length: int | None = None,
    trust_remote_code: bool = False,
    on_epoch: Callable[[int, float, dict[str, float] | None], None] | None = None,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    checkpoint_every: int = 0,
) -> dict[str, object]:
    """Train a router from the pre-trained backbone and save it; return a summary.

    Checkpoints go to checkpoint_dir (apart from out: checked before anything loads), by default
    to a folder under the cache named after out, which a successful save removes; the summary's
    checkpoint_dir names the folder kept (None: none). A failed or interrupted run keeps its
    checkpoints, for resume.
    """
    from condsearch.corpus.csts import read_csts
    from condsearch.model.csr.encoder import load_csr_encoder
    from condsearch.train.checkpoint import check_checkpoint_dir, default_checkpoint_dir, kept_checkpoint
    from condsearch.train.mixture import read_training

    keep = checkpoint_dir is not None
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else default_checkpoint_dir(out)
    check_checkpoint_dir(out, checkpoint_dir)
    train = read_training(train_csv, config.seed)
    dev = read_csts(dev_csv) if dev_csv is not None else None
    from_router = config.init == "router"
    if from_router and not isinstance(router_config, ContextConfig):
        raise ModelError("init router starts from the shipped context router: use the context variant")
    encoder = load_csr_encoder(
        model,
        router=INIT_ROUTER if from_router else "none",
        variant=None if from_router else router_config,
        device=device,
        max_length=max_length,
        trust_remote_code=trust_remote_code,
    )
    try:
        resolved = config.resolved(encoder.variant)
    except ValueError as exc:
        raise ModelError(str(exc)) from exc
    history = fit_router(
        encoder,
        train,
        config,
        dev=dev,
        on_epoch=on_epoch,
        checkpoint_dir=checkpoint_dir,
        resume=resume,
        checkpoint_every=checkpoint_every,
        progress=True,
    )
    summary: dict[str, object] = {
        "out": str(out),
        "layer": encoder.router.layer,
        "variant": router_config.variant,
        "router_config": router_config.to_dict(),
        "train_rows": len(train),
        "config": asdict(resolved),
        "train_csv": describe_sources(train_csv),
        "gains": [round(g, 4) for g in encoder.router.gains()],
        "history": history,
    }
    best = best_row(history)
    if best is not None and dev is not None and dev_csv is not None:
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
    summary = finite_record(summary)  # an undefined dev score (NaN) is written as null
    meta: dict[str, object] = {"model_id": encoder.model_id, "model_revision": encoder.revision, "training": summary}
    if isinstance(encoder.router, ContextRouter):
        summary["checksum"] = _save_context(encoder, out, meta, dev, trust_remote_code)
    else:
        from condsearch.model.csr.weights import save_router

        summary["checksum"] = save_router(encoder.router, out, meta)
    return {**summary, "checkpoint_dir": kept_checkpoint(checkpoint_dir, keep)}


def _save_context(
    encoder: CsrEncoder, out: Path, meta: dict[str, object], dev: CstsData | None, trust_remote_code: bool
) -> str:
    """Save a trained context router as its backbone's change from the base model; return the checksum.

    When the change is stored at reduced rank, the router is first given exactly what is saved and,
    with dev, scored again: the summary's dev_spearman_saved is what the saved router scores.
    """
    from condsearch.model.csr.context_weights import (
        apply_backbone_delta,
        backbone_delta,
        base_weights,
        save_context_router,
    )

    router = encoder.router
    assert isinstance(router, ContextRouter)
    base = base_weights(encoder.source.location, trust_remote_code)
    delta, rank = backbone_delta(base, router.model)
    if rank is not None and dev is not None:
        with torch.no_grad():
            for name, p in router.model.named_parameters():
                p.copy_(base[name].to(p.device, p.dtype))
        apply_backbone_delta(router, delta, "the trained router")
        encoder.refresh_identity()
        scores = evaluate_router(encoder, _Featurizer(encoder, dev))
        training = meta["training"]
        assert isinstance(training, dict)
        training["dev_spearman_saved"] = finite_record(scores["spearman"])
        log.info("dev spearman %.2f with the backbone change at rank %d, as saved", scores["spearman"], rank)
    return save_context_router(router, delta, rank, out, meta)
