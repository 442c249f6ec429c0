"""Fine-tuning a CASE encoder on C-STS: LoRA adapters or all weights.

The CASE vector ``f(c; I(s)) - f(c; I(∅))`` is computed with gradients through the
encoder's pooling (``forward_pairs`` of a BERT-style encoder's condition segment, or of a
decoder embedder's prompt, bidirectional top layers included), optionally followed by a
projection head trained jointly. Batches hold whole sentence pairs (both of a
pair's conditions, :func:`condsearch.train.losses.pair_groups`); the epoch with the best dev
Spearman is kept. Each epoch ends with a checkpoint that ``resume`` continues from.

:func:`fit_encoder` trains an encoder in place; :func:`condsearch.train.finetune_save.fit_and_save_encoder`
reads the C-STS files, fits, and writes an adapter folder (lora) or a model folder (full).
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from condsearch.corpus.csts import CstsData, scale_labels
from condsearch.errors import ModelError
from condsearch.model.encoders.base import ENCODE_BATCH_SIZE
from condsearch.model.encoders.bert import BertStyleEncoder
from condsearch.model.encoders.decoder import PromptEncoder
from condsearch.model.head import HeadConfig, ProjectionHead, load_head
from condsearch.progress import progress_bar
from condsearch.train.adapter import encoder_settings
from condsearch.train.anchor import Anchor
from condsearch.train.best_epoch import BestEpoch
from condsearch.train.blend import Blend
from condsearch.train.checkpoint import (
    TrainingState,
    data_digest,
    has_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from condsearch.train.finite import check_finite_fields
from condsearch.train.head import case_features, evaluate_head
from condsearch.train.lora import LoraConfig, add_lora
from condsearch.train.losses import BCL_TEMPERATURE, LossSettings, combined_loss, group_positions, pair_groups
from condsearch.train.schedule import linear_schedule

log = logging.getLogger(__name__)

KINDS = ("lora", "full")
#: the learning rates that worked here for each kind (see benchmarks/README.md, Fine-tuning)
DEFAULT_LR = {"lora": 3e-4, "full": 3e-5}

EpochCallback = Callable[[int, dict[str, float]], None]
#: what fine-tuning trains: a BERT-style encoder (condition-mean) or a decoder embedder (prompted)
TrainableEncoder = BertStyleEncoder | PromptEncoder


class ContrastiveProjection(nn.Module):
    """The projection g into CCL's contrastive space: ``tanh(W x + b)``, d -> d, for training only.

    CCL names g (its eq. 10) without giving its form; this is SimCSE's training-time MLP
    (the shape of BERT's pooler), our choice. It starts as the identity map before the tanh
    (W = I, b = 0), so C-MSE starts close to MSE on squashed vectors rather than on noise.
    Trained beside the model and dropped afterwards: what is indexed never passes through it.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)
        with torch.no_grad():
            self.linear.weight.copy_(torch.eye(dim))
            self.linear.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


@dataclass(frozen=True)
class FinetuneConfig:
    """Hyper-parameters of encoder fine-tuning (C-STS bi-encoder settings as defaults)."""

    kind: str = "lora"
    epochs: int = 3
    batch_size: int = 32  # rows per step; a pair's two rows always share a batch
    lr: float | None = None  # None: DEFAULT_LR[kind]
    head_lr: float = 1e-3
    weight_decay: float = 0.01
    warmup: float = 0.1  # fraction of steps with a linear warm-up, then linear decay to 0
    layer_decay: float = 1.0  # layer-wise lr decay: each layer below the top learns at this times its upper's rate
    max_grad_norm: float = 1.0
    losses: tuple[tuple[str, float], ...] = (("mse", 1.0),)
    margin: float = 1.0
    bcl_temperature: float = BCL_TEMPERATURE
    bcl_sigma: float = 0.5
    head_on_top: bool = False
    head_dim: int = 256
    head_dropout: float = 0.15
    init_head: str | None = None  # a trained head folder to start the jointly trained head from
    anchor_weight: float = 0.0  # ours (issue 25): pull plain vectors toward the base model's (condsearch.train.anchor)
    blend: float = 1.0  # ours (issue 25): fit B × the CASE cosine + (1 − B) × the base model's plain cosine
    lora: LoraConfig = field(default_factory=LoraConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        check_finite_fields(self)
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}")
        if self.lr is None:
            object.__setattr__(self, "lr", DEFAULT_LR[self.kind])
        if self.epochs < 1 or self.batch_size < 2:
            raise ValueError("epochs must be >= 1 and batch_size >= 2")
        if self.init_head is not None and not self.head_on_top:
            raise ValueError("init_head needs head_on_top")
        if not 0.0 < self.layer_decay <= 1.0:
            raise ValueError("layer_decay must be in (0, 1]")
        if self.anchor_weight < 0:
            raise ValueError("anchor_weight must be >= 0")
        if not 0.0 < self.blend <= 1.0:
            raise ValueError("blend must be in (0, 1]")

    @property
    def loss_settings(self) -> LossSettings:
        return LossSettings(dict(self.losses), self.margin, self.bcl_temperature, self.bcl_sigma)

    def record(self) -> dict[str, object]:
        """Return the config as plain JSON values (what checkpoints compare on resume)."""
        out = asdict(self)
        out["losses"] = {name: weight for name, weight in self.losses}
        out["lora"]["targets"] = list(self.lora.targets)
        if self.kind != "lora":
            out.pop("lora")
        for name, default in _ADDED_FIELDS.items():  # at their defaults, older checkpoints still resume
            if out[name] == default:
                out.pop(name)
        return out


#: fields added after checkpoints were first written, with the value those checkpoints imply
_ADDED_FIELDS: dict[str, object] = {"layer_decay": 1.0, "anchor_weight": 0.0, "blend": 1.0}
_LAYER = re.compile(r"\blayers?\.(\d+)\.")


def layer_lr_scales(names: Sequence[str], decay: float) -> dict[str, float]:
    """Return each encoder parameter's learning-rate factor under layer-wise decay.

    Layer i of L (``layer.i.`` / ``layers.i.`` in the name, from 0) gets ``decay ** (L - 1 - i)``,
    the embeddings ``decay ** L``, anything above the layers (a pooler, a final norm) 1.
    """
    depth = {n: int(m.group(1)) for n in names if (m := _LAYER.search(n))}
    n_layers = max(depth.values(), default=-1) + 1
    scales = {}
    for n in names:
        if n in depth:
            scales[n] = decay ** (n_layers - 1 - depth[n])
        elif "embed" in n:
            scales[n] = decay**n_layers
        else:
            scales[n] = 1.0
    return scales


@dataclass
class FinetuneResult:
    """The trained head (None without --head-on-top), one history row per epoch, the best epoch."""

    head: ProjectionHead | None
    history: list[dict[str, float]]
    best_epoch: int
    resumed_from: int = 0


def case_forward(encoder: TrainableEncoder, sentences: Sequence[str], conditions: Sequence[str]) -> torch.Tensor:
    """Return CASE vectors f(c; I(s)) - f(c; I(∅)) with gradients: (n, dim) float32."""
    distinct = list(dict.fromkeys(conditions))
    row = {c: i for i, c in enumerate(distinct)}
    base = encoder.forward_pairs([(c, None) for c in distinct])
    cond = encoder.forward_pairs(list(zip(conditions, sentences, strict=True)))
    return cond - base[torch.tensor([row[c] for c in conditions], device=cond.device)]


def length_grouped_batches(
    groups: list[list[int]], lengths: Sequence[int], per_batch: int, rng: random.Random, window: int = 50
) -> list[list[list[int]]]:
    """Shuffle groups into batches of ``per_batch`` groups, similar lengths together, in random order.

    Groups are shuffled, sorted by length within windows of ``window`` batches, cut into
    batches, and the batches shuffled: far less padding than random batches, still random.
    """
    order = list(range(len(groups)))
    rng.shuffle(order)
    batches = []
    span = per_batch * window
    for w in range(0, len(order), span):
        chunk = sorted(order[w : w + span], key=lambda i: lengths[i])
        batches += [[groups[i] for i in chunk[b : b + per_batch]] for b in range(0, len(chunk), per_batch)]
    rng.shuffle(batches)
    return batches


def trainable_parameters(
    encoder: TrainableEncoder, head: ProjectionHead | None, contrastive: ContrastiveProjection | None = None
) -> dict[str, nn.Parameter]:
    """Name every parameter that trains: the adapters (lora) or all encoder weights (full), the head, then g."""
    params = {f"encoder.{n}": p for n, p in encoder.model.named_parameters() if p.requires_grad}
    if head is not None:
        params.update({f"head.{n}": p for n, p in head.named_parameters()})
    if contrastive is not None:
        params.update({f"contrastive.{n}": p for n, p in contrastive.named_parameters()})
    return params


def evaluate_encoder(
    encoder: TrainableEncoder,
    head: ProjectionHead | None,
    data: CstsData,
    *,
    batch_size: int = ENCODE_BATCH_SIZE,
    blend: Blend | None = None,
) -> dict[str, float]:
    """Return dev Spearman/Pearson ×100 of the current weights (eval mode, no cache), of the blended
    score with ``blend``."""
    encoder.model.eval()
    features = case_features(encoder, data, batch_size=batch_size, cache=None)
    return evaluate_head(head, features, mix=blend.mix if blend is not None else None)


def prepare(encoder: TrainableEncoder, config: FinetuneConfig) -> ProjectionHead | None:
    """Set up what trains: adapters on the encoder (lora) or every weight (full); return the head, if any."""
    torch.manual_seed(config.seed)
    if config.kind == "lora":
        add_lora(encoder.model, config.lora)
        encoder.model.to(encoder.device)
    else:
        for p in encoder.model.parameters():
            p.requires_grad_(True)
    if not config.head_on_top:
        return None
    hc = HeadConfig(
        input_dim=encoder.dim,
        dim=config.head_dim,
        dropout=config.head_dropout,
        model_id=encoder.model_id,
        model_revision=encoder.revision,
        encoder_pooling=encoder.pooling,
    )
    head = ProjectionHead(hc)
    if config.init_head is not None:
        # Adapters start as the identity, so encoder + this head start where the frozen pair was.
        start = load_head(Path(config.init_head))
        if (start.config.input_dim, start.config.dim) != (hc.input_dim, hc.dim):
            raise ModelError(
                f"--init-head {config.init_head} maps {start.config.input_dim}->{start.config.dim}, "
                f"not {hc.input_dim}->{hc.dim} (set --dim to match)"
            )
        head.load_state_dict(start.state_dict())
    return head.to(encoder.device)


def batch_loss(
    encoder: TrainableEncoder,
    head: ProjectionHead | None,
    data: CstsData,
    batch: list[list[int]],
    settings: LossSettings,
    labels: torch.Tensor,
    contrastive: ContrastiveProjection | None = None,
    blend: Blend | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Return the objective on one batch of pair groups (with gradients) and each term's value.

    labels: (len(data),) scaled labels on the encoder's device. With ``contrastive`` (g),
    C-MSE and BCL compare in g's space, as CCL does; without it BCL compares the vectors
    themselves. With ``blend``, the cosine losses see the blended score.
    """
    idx = [i for g in batch for i in g]
    conds = [data.condition[i] for i in idx]
    s1 = [data.sentence1[i] for i in idx]
    vecs = case_forward(encoder, s1 + [data.sentence2[i] for i in idx], conds + conds)
    positive = case_forward(encoder, s1, conds) if settings.needs_second_pass else None
    if head is not None:
        vecs = head(vecs)
        positive = head(positive) if positive is not None else None
    first, second = vecs[: len(idx)], vecs[len(idx) :]
    cos = nn.functional.cosine_similarity(first, second, dim=1)
    if blend is not None:
        cos = blend.mix(cos, idx)
    anchor, negative, pair = first, second, None
    if contrastive is not None:
        anchor, negative = contrastive(first), contrastive(second)
        positive = contrastive(positive) if positive is not None else None
        pair = (anchor, negative)
    return combined_loss(
        settings,
        cos,
        labels[idx],
        group_positions(batch),
        anchor=anchor,
        positive=positive,
        negative=negative,
        contrastive=pair,
    )


def fit_encoder(
    encoder: TrainableEncoder,
    train: CstsData,
    config: FinetuneConfig,
    *,
    dev: CstsData | None = None,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    eval_batch_size: int = ENCODE_BATCH_SIZE,
    progress: bool = False,
    on_epoch: EpochCallback | None = None,
    checkpoint_every: int = 0,
    keep_epochs: bool = False,
) -> FinetuneResult:
    """Fine-tune the encoder in place (and a head, with ``head_on_top``); keep the best dev epoch.

    With ``checkpoint_dir``, the state after every epoch is written there, and also every
    ``checkpoint_every`` optimiser steps within an epoch (0: at epoch ends only; for epochs that
    take hours); ``resume`` continues from it (same config required) instead of starting over.
    ``keep_epochs`` keeps every epoch's weights in the checkpoint folder (``epoch-N.safetensors``).
    """
    head = prepare(encoder, config)
    anchor = None
    if config.anchor_weight > 0:  # before any checkpoint is loaded: the model is still the base here
        anchor = Anchor.of(encoder, train.sentence1 + train.sentence2, config.anchor_weight, eval_batch_size)
    blend = blend_dev = None
    if config.blend < 1.0:  # likewise: the plain cosines are the base model's
        texts = train.sentence1 + train.sentence2 + (dev.sentence1 + dev.sentence2 if dev is not None else [])
        base = Anchor.of(encoder, texts, 1.0, eval_batch_size).vectors
        blend = Blend.of(config.blend, base, train)
        blend_dev = Blend.of(config.blend, base, dev) if dev is not None else None
    settings = config.loss_settings
    contrastive = None
    if settings.needs_projection:
        contrastive = ContrastiveProjection(head.config.dim if head is not None else encoder.dim).to(encoder.device)
    params = trainable_parameters(encoder, head, contrastive)
    encoder_names = [n for n in params if n.startswith("encoder.")]
    scales = layer_lr_scales(encoder_names, config.layer_decay)
    assert config.lr is not None  # set by FinetuneConfig.__post_init__
    param_groups = [
        {"params": [params[n] for n in encoder_names if scales[n] == scale], "lr": config.lr * scale}
        for scale in sorted(set(scales.values()), reverse=True)
    ]
    if head is not None:
        param_groups.append({"params": list(head.parameters()), "lr": config.head_lr})
    if contrastive is not None:  # new like a head, so it learns at the head's rate
        param_groups.append({"params": list(contrastive.parameters()), "lr": config.head_lr})
    optim = torch.optim.AdamW(param_groups, weight_decay=config.weight_decay)

    groups = pair_groups(train)
    lengths = [len(train.sentence1[g[0]]) + len(train.sentence2[g[0]]) for g in groups]
    per_batch = max(1, config.batch_size // 2)
    steps_per_epoch = (len(groups) + per_batch - 1) // per_batch

    # what a resumed run must share with the checkpoint: the settings, the model and the data
    record = {
        **config.record(),
        "model": f"{encoder.model_id}@{encoder.revision}",
        **({"encoder": encoder_settings(encoder)} if encoder_settings(encoder) else {}),
        "train": data_digest(train),
    }
    state, kept = TrainingState(config=record), None
    if resume and checkpoint_dir is not None and has_checkpoint(checkpoint_dir):
        state, kept = load_checkpoint(checkpoint_dir, record, params, optim, steps_per_epoch=steps_per_epoch)
        log.info("resuming after epoch %d of %d from %s", state.epoch, config.epochs, checkpoint_dir)
    resumed_from = state.epoch
    # the checkpoint records the step count, from which the schedule's rates follow
    sched = linear_schedule(optim, config.epochs * steps_per_epoch, config.warmup, done_steps=state.step)
    # state.history is the keeper's history: what it records, the next checkpoint saves
    best = BestEpoch(state.best_epoch, state.best_score, kept, state.history)
    y_all = torch.from_numpy(scale_labels(train.labels)).to(encoder.device)

    for epoch in range(state.epoch + 1, config.epochs + 1):
        # Seeding per epoch makes a resumed run draw the same order and dropout masks.
        torch.manual_seed(config.seed * 1000 + epoch)
        batches = length_grouped_batches(groups, lengths, per_batch, random.Random(config.seed * 1000 + epoch))
        done, partial = state.epoch_step, dict(state.partial)  # batches of this epoch done before a resume
        if done and state.rng is not None:
            torch.set_rng_state(state.rng)
        encoder.model.train()
        if head is not None:
            head.train()
        if contrastive is not None:
            contrastive.train()
        n_rows, before = int(partial.pop("n_rows", 0)), partial.pop("seconds", 0.0)
        sums: dict[str, float] = partial
        start = time.perf_counter()
        desc = f"epoch {epoch}/{config.epochs}"
        bar = progress_bar(total=steps_per_epoch, initial=done, desc=desc, unit="step", enabled=progress)
        for i, batch in enumerate(batches[done:], start=done + 1):
            loss, terms = batch_loss(encoder, head, train, batch, settings, y_all, contrastive, blend)
            if anchor is not None:
                rows = [i for g in batch for i in g]
                pull = anchor.loss(encoder, [train.sentence1[i] for i in rows] + [train.sentence2[i] for i in rows])
                loss, terms = loss + pull, {**terms, "anchor": float(pull.detach())}
            optim.zero_grad(set_to_none=True)
            if loss.requires_grad:  # quad/wacl alone have nothing to learn from a batch with no (high, low) group
                loss.backward()
                if config.max_grad_norm > 0:
                    nn.utils.clip_grad_norm_(list(params.values()), config.max_grad_norm)
            optim.step()  # leaves parameters without a gradient alone
            sched.step()
            state.step += 1
            n = sum(len(g) for g in batch)
            n_rows += n
            for name, value in {"loss": float(loss.detach()), **terms}.items():
                sums[name] = sums.get(name, 0.0) + value * n
            bar.update(1)
            bar.set_postfix(loss=f"{sums['loss'] / n_rows:.4f}")
            if checkpoint_dir is not None and checkpoint_every > 0 and i % checkpoint_every == 0 and i < len(batches):
                state.epoch_step = i
                state.partial = {**sums, "n_rows": n_rows, "seconds": before + time.perf_counter() - start}
                save_checkpoint(checkpoint_dir, state, params, optim, best.state)
        bar.close()
        state.epoch_step, state.partial = 0, {}
        row: dict[str, float] = {"epoch": epoch, **{k: v / max(1, n_rows) for k, v in sums.items()}}
        row["train_seconds"] = round(before + time.perf_counter() - start, 1)
        if dev is not None:
            scores = evaluate_encoder(encoder, head, dev, batch_size=eval_batch_size, blend=blend_dev)
            row.update({f"dev_{k}": v for k, v in scores.items() if k != "n"})
        best.offer(epoch, row.get("dev_spearman", float(epoch)), params, row)  # no dev: the last epoch is best
        state.epoch, state.best_epoch, state.best_score = epoch, best.epoch, best.score
        if checkpoint_dir is not None:
            save_checkpoint(checkpoint_dir, state, params, optim, best.state, keep_epoch=keep_epochs)
        if on_epoch is not None:
            on_epoch(epoch, row)
    best.restore(params)
    encoder.model.eval()
    for p in encoder.model.parameters():
        p.requires_grad_(False)
    return FinetuneResult(
        head.eval() if head is not None else None, best.history, best.epoch, resumed_from=resumed_from
    )
