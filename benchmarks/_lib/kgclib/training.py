"""Training the router tri-encoder for link prediction with SimKGC's contrastive objective.

Each example (h, r, t) — training triples and their inverses — scores the routed query of
(h, r) against the plain vectors of every tail in the batch (in-batch negatives), minus an
additive margin on the positive, times a learnable inverse temperature; the head's own plain
vector is one more negative (self-negative); optionally the tails of the last few batches too
(pre-batch negatives, :class:`PreBatch`). Negatives that are known answers are masked.
Tails and heads-as-negatives are plain passes through the candidate tower (the router
itself, or a separate tail tower).

What moves is what the router names trainable. Given entity token ids (:class:`EntityTokens`),
a context router trains its whole backbone, as SimKGC trains every layer: each batch runs every
layer, and the entities are encoded afresh with the trained weights for evaluation. Given
cached states (:class:`CachedStates`), only the layers above the cache train (the frozen
lower layers option, and the only one for the paper/extended router), so the cache stays valid.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from condsearch.errors import ModelError
from condsearch.model.artifacts.weights import load_weights
from condsearch.model.csr.encoder import CsrEncoder
from condsearch.train.checkpoint import (
    BEST_FILE,
    STATE_FILE,
    TRAINABLE_FILE,
    TrainingState,
    has_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from condsearch.train.schedule import linear_schedule

from .data import Answers, KgData, LinkedTexts, known_answers, with_inverse
from .encoding import EntitySource, EntityTokens, Tower, encode_states, relation_codes

log = logging.getLogger(__name__)

MASKED = -1e4


@dataclass(frozen=True)
class KgcTrainConfig:
    """Hyper-parameters (SimKGC's WN18RR recipe where it applies; lr and budget are ours)."""

    epochs: int = 1
    batch_size: int = 1024
    lr: float = 1e-4
    gain_lr: float = 1e-2
    weight_decay: float = 1e-4
    warmup_steps: int = 400  # capped at a tenth of all steps
    grad_clip: float = 10.0
    margin: float = 0.02
    temperature: float = 0.05
    learn_temperature: bool = True
    self_negatives: bool = True
    #: SimKGC's --pre-batch: previous batches whose tail vectors (detached) join each batch's
    #: negatives, masked where they are known answers (0: off, SimKGC's WN18RR setting)
    pre_batch: int = 0
    pre_batch_weight: float = 0.5  # SimKGC's --pre-batch-weight: scales the pre-batch logits
    max_examples: int | None = None  # examples drawn per epoch (forward + inverse), None: all
    bf16: bool = False  # autocast the encoder passes to bfloat16 (fast on CPUs with AVX512-BF16)
    checkpoint_every: int = 20  # optimiser steps between checkpoints (with a checkpoint folder)
    seed: int = 0
    #: ours: every N optimiser steps (and before each dev check) put the weights back into the form
    #: the committed artifact stores (``project``), so that dev scores what would be saved; 0: never
    project_every: int = 0
    #: ours: the input token table does not train (projection keeps its rows' signs and mean sizes,
    #: so it loses an update there almost whole: benchmarks/paper/results/kgc_projection_probe.json)
    freeze_token_table: bool = False


def batch_masks(
    batch: np.ndarray, train_answers: Answers, pre_tails: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Return which logits count as negatives for a batch of (h, r, t) rows.

    mask (B, B): row i, column j is False when tail j is tail i (j != i) or a known training
    answer of (h_i, r_i); the diagonal (the positive) stays True. self_mask (B,): False when
    the head is itself a known answer of (h_i, r_i). With ``pre_tails`` (K,), the entity ids of
    stored pre-batch tails, mask is (B, B + K): its last K columns are masked the same way.
    """
    heads, rels, tails = batch[:, 0], batch[:, 1], batch[:, 2]
    columns = tails if pre_tails is None else np.concatenate([tails, pre_tails])
    mask = tails[:, None] != columns[None, :]
    self_mask = np.ones(len(batch), dtype=bool)
    for i, (h, r) in enumerate(zip(heads.tolist(), rels.tolist(), strict=True)):
        known = train_answers.get((h, r), ())
        if len(known) > 1:
            mask[i] &= ~np.isin(columns, np.fromiter(known, dtype=np.int64))
        self_mask[i] = h not in known
    np.fill_diagonal(mask, True)  # (B, B + K): the in-batch diagonal only
    return mask, self_mask


class PreBatch:
    """SimKGC's pre-batch negatives: a ring buffer of the last ``batches`` batches' tail vectors
    (detached, so no gradient reaches back) and their entity ids; memory is at most ``batches``
    batches of (B, d) vectors. Not checkpointed: a resumed run starts with it empty."""

    def __init__(self, batches: int) -> None:
        if batches < 1:
            raise ValueError("PreBatch keeps at least one batch")
        self._kept: deque[tuple[torch.Tensor, np.ndarray]] = deque(maxlen=batches)

    def __len__(self) -> int:
        return sum(len(ids) for _, ids in self._kept)

    def stored(self) -> tuple[torch.Tensor, np.ndarray] | None:
        """Return the stored tail vectors (K, d) and entity ids (K,), oldest first; None when empty."""
        if not self._kept:
            return None
        return torch.cat([v for v, _ in self._kept]), np.concatenate([ids for _, ids in self._kept])

    def push(self, vectors: torch.Tensor, ids: np.ndarray) -> None:
        """Keep a batch's tail vectors and entity ids, dropping the oldest batch when full."""
        self._kept.append((vectors.detach(), np.asarray(ids, dtype=np.int64).copy()))


def simkgc_loss(
    hr: torch.Tensor,
    tails: torch.Tensor,
    heads: torch.Tensor | None,
    log_inv_t: torch.Tensor,
    *,
    margin: float,
    mask: torch.Tensor,
    self_mask: torch.Tensor | None = None,
    pre: torch.Tensor | None = None,
    pre_mask: torch.Tensor | None = None,
    pre_weight: float = 0.5,
) -> torch.Tensor:
    """SimKGC's loss for unit vectors hr, tails, heads: (B, d); mask (B, B), self_mask (B,).

    Cross-entropy of each query over [in-batch tails; pre-batch tails; its own head] plus the
    reverse direction (each tail over the in-batch queries); the margin is subtracted from the
    positive logit only, before scaling by exp(log_inv_t). ``pre`` (K, d) are stored tails of
    earlier batches, their logits also scaled by ``pre_weight`` and masked where ``pre_mask``
    (B, K) is False, as SimKGC does.
    """
    b = hr.shape[0]
    scale = log_inv_t.exp()
    logits = hr @ tails.T - margin * torch.eye(b, device=hr.device, dtype=hr.dtype)
    logits = (logits * scale).masked_fill(~mask, MASKED)
    full = logits
    if pre is not None:
        pre_logits = hr @ pre.to(hr.dtype).T * (scale * pre_weight)
        if pre_mask is not None:
            pre_logits = pre_logits.masked_fill(~pre_mask, MASKED)
        full = torch.cat([full, pre_logits], dim=1)
    if heads is not None:
        self_logits = (hr * heads).sum(dim=1) * scale
        if self_mask is not None:
            self_logits = self_logits.masked_fill(~self_mask, MASKED)
        full = torch.cat([full, self_logits[:, None]], dim=1)
    labels = torch.arange(b, device=hr.device)
    return nn.functional.cross_entropy(full, labels) + nn.functional.cross_entropy(logits.T, labels)


def _unit(x: torch.Tensor) -> torch.Tensor:
    return nn.functional.normalize(x.float(), dim=-1)


def batch_loss(
    encoder: CsrEncoder,
    states: EntitySource,
    batch: np.ndarray,
    conditions: Sequence[str],
    train_answers: Answers,
    log_inv_t: torch.Tensor,
    config: KgcTrainConfig,
    tail: Tower | None = None,
    chunk_rows: int | None = None,
    linked: LinkedTexts | None = None,
    pre_batch: PreBatch | None = None,
) -> torch.Tensor:
    """Return the loss of one batch of (h, r, t) rows, with gradients.

    The batch's texts run in length-sorted chunks of ``chunk_rows`` (default: :func:`train_chunk_rows`),
    each padded to its own longest text; the loss does not depend on the chunking. With
    ``linked`` (SimKGC's link-graph texts), each head is read without its tail among its
    neighbours and each tail without its head. With ``pre_batch``, its stored tails join the
    negatives (masked by entity id as in-batch tails are) and this batch's tails are then stored.
    """
    device = encoder.device
    router = encoder.router
    chunk = chunk_rows or train_chunk_rows(device)
    heads, rels, tails = batch[:, 0], batch[:, 1], batch[:, 2]
    if linked is None:  # one plain pass per distinct entity serves as both tail and self-negative
        source: EntitySource = states
        entities, where = np.unique(np.concatenate([tails, heads]), return_inverse=True)
    else:
        source, where = _linked_batch(encoder, linked, heads, tails)
        entities = np.arange(len(source))
    with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=config.bf16):
        codes = relation_codes(encoder, conditions).select(torch.from_numpy(rels).to(device))
        query_rows = heads if linked is None else entities[where[len(batch) :]]
        hr = _unit(encode_states(router, source, query_rows, codes, device=device, chunk=chunk))
        plain = _unit(encode_states(tail or router, source, entities, device=device, chunk=chunk))
    where_t = torch.from_numpy(where).to(device)
    tail_v, head_v = plain[where_t[: len(batch)]], plain[where_t[len(batch) :]]
    stored = pre_batch.stored() if pre_batch is not None else None
    with torch.profiler.record_function("kgc.batch_masks"):
        mask, self_mask = batch_masks(batch, train_answers, None if stored is None else stored[1])
    mask_t = torch.from_numpy(mask).to(device)
    b = len(batch)
    loss = simkgc_loss(
        hr,
        tail_v,
        head_v if config.self_negatives else None,
        log_inv_t,
        margin=config.margin,
        mask=mask_t[:, :b],
        self_mask=torch.from_numpy(self_mask).to(device),
        pre=None if stored is None else stored[0],
        pre_mask=None if stored is None else mask_t[:, b:],
        pre_weight=config.pre_batch_weight,
    )
    if pre_batch is not None:
        pre_batch.push(tail_v, tails)
    return loss


def _linked_batch(
    encoder: CsrEncoder, linked: LinkedTexts, heads: np.ndarray, tails: np.ndarray
) -> tuple[EntityTokens, np.ndarray]:
    """Return the token ids of a batch's distinct link-graph texts, and where each of
    ``tails`` then ``heads`` finds its text among them (a head read without its tail, a tail
    without its head: the query and self-negative share a head's text, as in SimKGC)."""
    keys = np.concatenate([np.stack([tails, heads], axis=1), np.stack([heads, tails], axis=1)])
    distinct, where = np.unique(keys, axis=0, return_inverse=True)
    texts = [linked.text(row, leave_out) for row, leave_out in distinct.tolist()]
    with torch.profiler.record_function("kgc.linked_tokens"):
        return EntityTokens(encoder.tokenizer, texts, encoder.max_length), where.reshape(-1)


#: rows per length-sorted chunk of a training batch: on a CPU the cost is the padded tokens. At batch
#: 256, chunks of 64 pad WN18RR's texts to 1.28 tokens per real one (1.13 in the plain pass, about
#: 512 texts) where one chunk of 256 padded them to 2.3; a step is 1.5x faster under bf16
#: (benchmarks/paper/wn18rr-training.md, issue 38). A GPU runs larger chunks at the same cost.
TRAIN_CHUNK_ROWS = {"cpu": 64}
GPU_CHUNK_ROWS = 256


def train_chunk_rows(device: torch.device) -> int:
    """Return the rows per length-sorted chunk of a training batch on this device."""
    return TRAIN_CHUNK_ROWS.get(device.type, GPU_CHUNK_ROWS)


Evaluate = Callable[[], dict[str, float]]


def _frozen_tables(router: nn.Module, tail: Tower | None, trainable: dict[str, nn.Parameter]) -> set[str]:
    """Return the checkpoint keys of the towers' input token tables (``tail.`` for the tail tower's)."""
    from condsearch.model.csr.context_weights import token_table

    towers = [("", router)] if tail is None else [("", router), ("tail.", tail)]
    names = {prefix + str(token_table(getattr(tower, "model", tower))) for prefix, tower in towers}
    if not names <= set(trainable):
        raise ValueError("freeze_token_table: the towers do not train their input token tables")
    return names


def train_kgc(
    encoder: CsrEncoder,
    states: EntitySource,
    data: KgData,
    config: KgcTrainConfig,
    *,
    evaluate: Evaluate | None = None,
    eval_every: int = 0,
    tail: Tower | None = None,
    on_step: Callable[[int, int, float], None] | None = None,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    on_best: Callable[[dict[str, float]], None] | None = None,
    chunk_rows: int | None = None,
    project: Callable[[], None] | None = None,
    linked: LinkedTexts | None = None,
) -> list[dict[str, float]]:
    """Fine-tune the router (and the candidate tower ``tail``, if any) in place.

    ``states`` are the entities as token ids (every layer the router names trainable moves) or
    as cached states (valid only when the layers below the routed ones do not train).

    ``evaluate`` returns dev metrics with an "mrr" (maximised) and a "condition_sensitivity";
    it runs before training, every ``eval_every`` steps and after each epoch, and the
    best-scoring weights are kept — the start included, so the result never scores below it.
    With ``checkpoint_dir``, the run is checkpointed every ``config.checkpoint_every`` steps
    and ``resume`` continues it (same config) from the last checkpoint. ``on_best`` is called
    with the history row each time dev improves, the weights in place being the best so far (to
    save them as the run goes). With ``config.project_every`` and ``project`` (which puts the
    weights in place into the saved artifact's form), training is projected: ``project`` runs every
    that many steps and before each dev check, so what dev scores is what saving keeps. With
    ``linked``, training reads SimKGC's link-graph texts (:func:`batch_loss`); ``states`` and
    ``evaluate`` should then hold the same texts as evaluation reads them. Returns one history
    row per evaluation.
    """
    if config.project_every and project is None:
        raise ValueError("project_every needs a projection")
    router = encoder.router
    whole = getattr(router, "trainable", "top") == "all"
    if whole and not isinstance(states, EntityTokens):
        raise ValueError("training the whole backbone needs the entities as token ids, not cached states")
    router.freeze_backbone()
    trainable = dict(router.trainable_parameters())
    if tail is not None:
        tail.freeze_backbone()
        trainable.update({f"tail.{n}": p for n, p in tail.trainable_parameters().items()})
    log_inv_t = nn.Parameter(
        torch.tensor(math.log(1.0 / config.temperature), device=encoder.device),
        requires_grad=config.learn_temperature,
    )
    trainable["log_inv_t"] = log_inv_t
    frozen = _frozen_tables(router, tail, trainable) if config.freeze_token_table else set()
    for name in frozen:  # still checkpointed, as every trainable parameter is, but not optimised
        trainable[name].requires_grad_(False)
    gain = [p for n, p in trainable.items() if n == "router_log_gain"]
    main = [p for n, p in trainable.items() if n not in ("router_log_gain", "log_inv_t", *frozen)]
    groups = [
        {"params": main},
        {"params": gain, "lr": config.gain_lr, "weight_decay": 0.0},
        {"params": [log_inv_t], "weight_decay": 0.0},
    ]
    optim = torch.optim.AdamW([g for g in groups if g["params"]], lr=config.lr, weight_decay=config.weight_decay)
    train = data.splits["train"]
    answers = known_answers([train], data.n_relations)
    examples = with_inverse(train, data.n_relations)
    n_epoch = min(len(examples), config.max_examples or len(examples))
    steps_per_epoch = math.ceil(n_epoch / config.batch_size)
    total = max(1, config.epochs * steps_per_epoch)
    params = [p for g in groups for p in g["params"]]
    run_config = {
        **asdict(config),
        "router": router.config.to_dict(),
        "towers": 2 if tail is not None else 1,
        "backbone": "whole" if whole else "frozen below the routed layers",
        "max_length": encoder.max_length,
    }
    if linked is not None:  # recorded only when on, so that earlier runs' checkpoints still resume
        if not whole:
            raise ValueError("link-graph texts train the whole backbone (cached states hold one text per entity)")
        run_config["link_graph"] = True
    if not config.freeze_token_table:  # likewise recorded only when on
        del run_config["freeze_token_table"]
    if not config.pre_batch:  # likewise
        del run_config["pre_batch"], run_config["pre_batch_weight"]
    state = TrainingState(config=run_config)
    best_state: dict[str, torch.Tensor] | None = None
    if checkpoint_dir is not None and resume and has_checkpoint(checkpoint_dir):
        state, best_state = load_checkpoint(checkpoint_dir, run_config, trainable, optim)
        log.info("resumed at step %d of %d", state.step, total)
    # SimKGC's warm-up: 400 steps, here at most a tenth of the run
    sched = linear_schedule(optim, total, min(config.warmup_steps, total // 10) / total, done_steps=state.step)
    done = float(state.history[-1].get("seconds", 0.0)) if state.history else 0.0
    started = time.perf_counter() - done

    def keep(step: int, loss: float) -> None:
        nonlocal best_state
        if evaluate is None:
            return
        if config.project_every and project is not None:
            project()
        scores = evaluate()
        row = {"step": step, "examples": step * config.batch_size, "loss": loss}
        row.update({f"dev_{k}": float(v) for k, v in scores.items() if isinstance(v, (int, float))})
        row["dev"] = float(scores["mrr"])
        row["seconds"] = round(time.perf_counter() - started, 1)
        row["temperature"] = float(1.0 / log_inv_t.exp().item())
        if gains := router.gains():
            row["gain"] = gains[0]
        state.history.append(row)
        log.info("step %d: dev MRR %.2f, sensitivity %.4f", step, row["dev"], row.get("dev_condition_sensitivity", 0))
        if row["dev"] > state.best_score:
            state.best_score, state.best_epoch = row["dev"], step
            best_state = {k: v.detach().clone() for k, v in trainable.items()}
            if on_best is not None and step > 0:
                on_best(row)

    def save(step: int) -> None:
        state.step = step
        state.epoch = step // steps_per_epoch
        if checkpoint_dir is not None:
            save_checkpoint(checkpoint_dir, state, trainable, optim, best_state)

    if state.step == 0 and not state.history:
        keep(0, float("nan"))
        save(0)
    step, running = state.step, []
    # pre-batch negatives are not checkpointed: after a resume the buffer starts empty (the first
    # config.pre_batch batches see fewer negatives than an uninterrupted run's would)
    pre_batch = PreBatch(config.pre_batch) if config.pre_batch else None
    for epoch in range(state.step // steps_per_epoch, config.epochs):
        # one permutation per epoch from (seed, epoch): a resumed run draws the same batches
        order = np.random.default_rng(config.seed + epoch).permutation(len(examples))[:n_epoch]
        for start in range((step - epoch * steps_per_epoch) * config.batch_size, n_epoch, config.batch_size):
            batch = examples[order[start : start + config.batch_size]]
            torch.manual_seed(config.seed * 1_000_003 + step)  # dropout per step, so a resumed run matches
            router.train()
            if tail is not None:
                tail.train()
            if len(batch) >= 2:
                loss = batch_loss(
                    encoder,
                    states,
                    batch,
                    data.conditions,
                    answers,
                    log_inv_t,
                    config,
                    tail,
                    chunk_rows,
                    linked,
                    pre_batch,
                )
                optim.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(params, config.grad_clip)
                optim.step()
                running.append(loss.item())
                if config.project_every and project is not None and (step + 1) % config.project_every == 0:
                    project()
            sched.step()
            step += 1
            if on_step is not None:
                on_step(step, total, running[-1] if running else float("nan"))
            end_of_epoch = step % steps_per_epoch == 0
            if (eval_every and step % eval_every == 0) or end_of_epoch:
                keep(step, float(np.mean(running[-(eval_every or steps_per_epoch) :])) if running else float("nan"))
            if end_of_epoch or step % max(1, config.checkpoint_every) == 0:
                save(step)
    if best_state is not None:
        with torch.no_grad():
            for name, p in trainable.items():
                p.copy_(best_state[name])
    router.eval()
    if tail is not None:
        tail.eval()
    if evaluate is None:
        last = float(np.mean(running[-steps_per_epoch:])) if running else math.nan
        state.history.append({"step": step, "loss": last})
    return state.history


def load_best_weights(folder: Path, router: Tower, tail: Tower | None) -> tuple[dict[str, float], object]:
    """Copy a training checkpoint's best dev weights (its latest, when none is marked best) into the
    towers in place; return that weights' history row (step and dev metrics) and the run's config.

    Raises ModelError when the checkpoint's tensors are not these towers' trainable parameters.
    """
    folder = Path(folder)
    if not (folder / STATE_FILE).is_file():
        raise ModelError(f"{folder}: no training checkpoint here")
    name = BEST_FILE if (folder / BEST_FILE).is_file() else TRAINABLE_FILE
    saved = load_weights(folder / name, "checkpoint tensors")
    params = dict(router.trainable_parameters())  # keyed as train_kgc checkpoints them
    if tail is not None:
        params.update({f"tail.{n}": p for n, p in tail.trainable_parameters().items()})
    if set(saved) - {"log_inv_t"} != set(params):
        raise ModelError(f"{folder}: the checkpoint does not hold these towers' trainable parameters")
    with torch.no_grad():
        for key, p in params.items():
            p.copy_(saved[key].to(p.device, p.dtype))
    info = json.loads((folder / STATE_FILE).read_text())
    history = info.get("history") or [{}]
    scored = [row for row in history if isinstance(row.get("dev"), float) and math.isfinite(row["dev"])]
    row = max(scored, key=lambda r: r["dev"]) if name == BEST_FILE and scored else history[-1]
    return row, info.get("config")
