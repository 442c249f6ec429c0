"""`condsearch adapt`: a labelled table to a router of one's own, and a report of whether it paid (issue 57).

One call (:func:`adapt_router`) reads the table's labelled columns, splits its rows by a seeded hash of
their id into *held* rows (``holdout``: never trained on, scored at the end), *validation* rows
(a share of the rest: choose the interpolation) and *fit* rows (the pairs are drawn from these
alone), draws pairs as ``condsearch pairs`` does (contrast pairs from two or more columns, alike
and unlike pairs from one), and fine-tunes the shipped router on them with
:func:`condsearch.train.router.fit_router`: MSE on the scaled label plus the in-condition
contrastive term, whose candidates leave out every text known to share the anchor's value.

What it keeps of the start (the anchor, ``anchor``): ``wise`` interpolates the trained weights
with the start's, ``θ₀ + α (θ₁ − θ₀)``, at the smallest α of :data:`WISE_ALPHAS` whose
validation precision keeps ``wise_keep`` of the best gain over the start (α 0) and lies within
``wise_tolerance`` of the best (:func:`choose_alpha`); ``distill_weight`` adds a term
that keeps each text's plain vector where the start router put it; ``none`` keeps the trained
weights. The router is saved as any trained context router is (its backbone's change from the
base model), then loaded back from what was written and scored on the held rows beside plain
MiniLM and the start router: the report is of the saved router. The folder (router + report.json)
is written beside ``out`` and moved into place whole.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from condsearch.errors import CorpusError, ModelError
from condsearch.train.pairs import LabelSpec, NoContrastPairs, PairsConfig, check_label_values, make_pairs

if TYPE_CHECKING:  # torch loads only when adapting runs: `condsearch --help` stays light
    import torch

    from condsearch.model.csr.encoder import CsrEncoder
    from condsearch.train.adapt_score import ColumnPlan

log = logging.getLogger(__name__)

Anchor = Literal["wise", "none"]
ANCHORS: tuple[Anchor, ...] = ("wise", "none")
#: the interpolation weights tried by the wise anchor (1: the trained weights, 0: the start), largest first
WISE_ALPHAS = (1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0)
#: fewest rows with a text and a label that adapting accepts
MIN_ROWS = 20
#: the column whose value keys the split, where the table has it (else the text)
ID_COLUMN = "id"


@dataclass(frozen=True)
class AdaptConfig:
    """How ``adapt`` splits, draws, trains and scores; the single home of the CLI's defaults."""

    #: share of rows kept aside (by id) and scored at the end, never trained on
    holdout: float = 0.2
    #: share of the other rows kept to choose the interpolation (wise), never trained on
    validation: float = 0.1
    #: sentence pairs drawn from the fit rows (a contrast pair gives two C-STS rows)
    n_pairs: int = 2000
    #: with two or more label columns, fill what contrast pairs leave of n_pairs with pairs alike or unlike
    #: under one column (a table with one column draws those only, whatever this says). It changes only tables
    #: short of contrast pairs: news (1,497 of 2,000) +22.6% over plain MiniLM where contrast pairs alone gave
    #: +10.8%; speeches (298) +0.3% on party, α 0.125, where they gave -0.7% (α 0)
    fill_plain: bool = True
    #: 2 epochs at 5e-4: on news' validation rows 0.421 at α 1, where 1 epoch at 1e-4 left 0.333 (the start: 0.336)
    epochs: int = 2
    lr: float = 5e-4
    batch_size: int = 32
    #: the in-condition contrastive term's weight beside MSE
    contrast_weight: float = 1.0
    #: the plain-vector distillation term's weight (0: off). 1 kept C-STS dev within 2.0 of the shipped router's
    #: where 0 lost 4-5 (held rows against plain MiniLM, distill 1 / 0: fortunes +16.9% / +19.0%, C-STS dev 62.38 /
    #: 59.20; gcide +19.9% / +17.7%, 62.69 / 59.43; tweets +16.4% / +22.4%, 63.22 / 60.04); 2 kept the same
    #: gains within a point and C-STS dev 0.02-0.64 higher on each of the seven sources (distill 2 / 1: fortunes
    #: +17.2% / +16.9%, 62.67 / 62.38; foldoc +25.0% / +25.9%, 63.06 / 62.44; news, filled, +22.6% / +22.2%,
    #: 62.28 / 61.64, the one that 1 left more than 2.0 below)
    distill_weight: float = 2.0
    #: the replay anchor's weight: the start router's vectors of the bundled captions under their conditions (0: off)
    replay_weight: float = 0.0
    #: which weights train: the top k layers that see the condition, over cached states, or all
    train_backbone: Literal["top", "all"] = "top"
    anchor: Anchor = "wise"
    #: how far below the best validation precision (absolute) the chosen α may be
    wise_tolerance: float = 0.005
    #: the share of the best validation gain over the start router that the chosen α keeps (1: all of it)
    wise_keep: float = 1.0
    #: most held rows scored per column
    report_rows: int = 1000
    #: most validation rows scored per column (once per interpolation weight)
    validation_rows: int = 500
    #: queries per column
    queries: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.holdout < 1:
            raise ValueError(f"holdout {self.holdout:g} must lie strictly between 0 and 1")
        if not 0 <= self.validation < 1:
            raise ValueError(f"validation {self.validation:g} must lie in [0, 1)")
        if self.anchor not in ANCHORS:
            raise ValueError(f"anchor must be one of {', '.join(ANCHORS)}")
        if not 0 <= self.wise_keep <= 1:
            raise ValueError(f"wise_keep {self.wise_keep:g} must lie in [0, 1]")
        if self.anchor == "wise" and self.validation == 0:
            raise ValueError("the wise anchor chooses on validation rows: give validation above 0")
        for name in ("n_pairs", "epochs", "batch_size", "report_rows", "validation_rows", "queries"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


@dataclass
class Split:
    """Row positions of the three parts, and the nulls skipped per column."""

    fit: list[int]
    validation: list[int]
    held: list[int]
    nulls: dict[str, int] = field(default_factory=dict)


def _fraction(seed: int, salt: str, key: str) -> float:
    digest = hashlib.sha256(f"{seed}\x00{salt}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_rows(
    keys: Sequence[str],
    labels: dict[str, list[str | None]],
    config: AdaptConfig,
    held_values: Mapping[str, Collection[str]] | None = None,
) -> Split:
    """Split the rows that carry at least one label into fit, validation and held, by a seeded hash of each key.

    keys: each row's id (its text when the table has no id column): a row lands on the same side
    whatever the table's order. held_values: column -> values whose rows are all held besides
    (whole values never trained on). CorpusError for fewer than :data:`MIN_ROWS` usable rows, or a
    column with fewer than two values among them or among the fit rows.
    """
    usable = [i for i in range(len(keys)) if any(v[i] is not None for v in labels.values())]
    nulls = {c: sum(v[i] is None for i in range(len(keys))) for c, v in labels.items()}
    if len(usable) < MIN_ROWS:
        raise CorpusError(f"{len(usable)} row(s) with a text and a label: adapting needs at least {MIN_ROWS}")
    for column, values in labels.items():
        check_label_values(column, [values[i] for i in usable])
    split = Split([], [], [], nulls)
    held_values = held_values or {}
    for i in usable:
        unseen = any(labels[c][i] in vs for c, vs in held_values.items())
        if unseen or _fraction(config.seed, "held", keys[i]) < config.holdout:
            split.held.append(i)
        elif _fraction(config.seed, "validation", keys[i]) < config.validation:
            split.validation.append(i)
        else:
            split.fit.append(i)
    for column, values in labels.items():
        if len({values[i] for i in split.fit} - {None}) < 2:
            raise CorpusError(f"column {column!r}: fewer than two values among the rows left to train on")
    if not split.held:
        raise CorpusError("no row fell in the held part: raise --holdout or give more rows")
    return split


def _trainable(encoder: CsrEncoder, scope: Literal["top", "all"]) -> dict[str, torch.nn.Parameter]:
    router = encoder.router
    router.trainable = scope
    return router.trainable_parameters()


def _interpolate(
    params: dict[str, torch.nn.Parameter], start: dict[str, torch.Tensor], end: dict[str, torch.Tensor], alpha: float
) -> None:
    import torch

    with torch.no_grad():
        for name, p in params.items():
            p.copy_(start[name] + alpha * (end[name] - start[name]))


def choose_alpha(scores: dict[float, float], tolerance: float, keep: float = 1.0) -> float:
    """Return the smallest α whose validation score is within tolerance of the best and keeps ``keep`` of the
    best gain over the start (α 0, else the lowest score); ties: the smaller α."""
    best = max(scores.values())
    start = scores.get(0.0, min(scores.values()))
    floor = min(best - tolerance, start + keep * (best - start))
    return min(a for a, s in scores.items() if s >= floor)


def adapt_router(
    table: Path,
    specs: Sequence[LabelSpec],
    out: Path,
    config: AdaptConfig = AdaptConfig(),
    *,
    model: str | None = None,
    router: str | None = None,
    device: str | None = None,
    text_column: str = "text",
    id_column: str = ID_COLUMN,
    table_format: str | None = None,
    csts_dev: Path | None = None,
    checkpoint_dir: Path | None = None,
    restart: bool = False,
    score_only: Sequence[LabelSpec] = (),
    held_values: Mapping[str, Collection[str]] | None = None,
    say: Callable[[str], None] = log.info,
) -> dict[str, object]:
    """Adapt a router to a table's labels, save it with its report into out; return the report.

    router: the router to start from [default: the shipped one]. score_only: columns the report
    scores but training never sees (conditions never seen); held_values: see :func:`split_rows`.
    A run whose checkpoint folder holds a checkpoint of the same settings continues from it
    (restart: start over). Bad input is a CorpusError or ModelError before anything is written.
    """
    from condsearch.model.csr.context import CONTEXT, ContextRouter
    from condsearch.model.csr.encoder import load_csr_encoder
    from condsearch.train.adapt_score import mean, plain_embed, plan_scoring, router_embed, score_plan
    from condsearch.train.checkpoint import default_checkpoint_dir, has_checkpoint, remove_checkpoint
    from condsearch.train.pairs_files import read_labelled
    from condsearch.train.replay import demo_replay
    from condsearch.train.router import INIT_ROUTER, RouterTrainConfig, fit_router

    started = time.monotonic()
    check_adapt_paths(table, out)
    checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else default_checkpoint_dir(out)
    data = read_labelled(table, [s.column for s in (*specs, *score_only)], text_column, format=table_format)
    keys = _row_keys(table, text_column, id_column, table_format, data.texts)
    split = split_rows(keys, data.labels, config, held_values)
    say(
        f"{len(split.fit) + len(split.validation) + len(split.held)} labelled rows: {len(split.fit)} to train on, "
        f"{len(split.validation)} to choose on, {len(split.held)} kept aside"
        + "".join(f"; {n} rows without a {c!r} value skipped under it" for c, n in split.nulls.items() if n)
    )
    contrast = len(specs) >= 2
    pairs_config = PairsConfig(
        n_pairs=config.n_pairs, contrast_only=contrast and not config.fill_plain, seed=config.seed
    )
    fit_texts = [data.texts[i] for i in split.fit]
    fit_labels = {s.column: [data.labels[s.column][i] for i in split.fit] for s in specs}
    try:
        pairs = make_pairs(fit_texts, fit_labels, specs, pairs_config)
    except NoContrastPairs as exc:
        raise NoContrastPairs(exc.columns, "--fill-plain draws pairs alike or unlike under one column") from exc
    values = {
        (phrasing, text): value
        for spec in specs
        for phrasing in spec.phrasings
        for text, value in zip(fit_texts, fit_labels[spec.column], strict=True)
        if value is not None
    }
    say(f"{pairs.n_pairs} pairs ({pairs.n_contrast} contrast, {pairs.n_plain} alike/unlike): {len(pairs.rows)} rows")

    # "none" (an untrained context router) serves models that ship no router
    encoder = load_csr_encoder(model, router=router or INIT_ROUTER, variant=CONTEXT, device=device)
    assert isinstance(encoder.router, ContextRouter)
    conditions = {s.column: s.phrasings[0] for s in (*specs, *score_only)}
    plan = dict(max_rows=config.report_rows, n_queries=config.queries, seed=config.seed)
    held_plans = plan_scoring(data.texts, data.labels, conditions, split.held, query_values=held_values, **plan)  # type: ignore[arg-type]
    val_plans = plan_scoring(
        data.texts,
        data.labels,
        conditions,
        split.validation,
        **{**plan, "max_rows": config.validation_rows},  # type: ignore[arg-type]
    )
    if not held_plans:
        raise CorpusError("no labelled column has two held rows that share a value: raise --holdout or give more rows")
    say("scoring the start router on the held rows")
    start_held = score_plan(held_plans, router_embed(encoder))
    params = _trainable(encoder, config.train_backbone)
    start = {n: p.detach().clone() for n, p in params.items()}

    train_config = RouterTrainConfig(
        epochs=config.epochs,
        batch_size=config.batch_size,
        lr=config.lr,
        seed=config.seed,
        train_backbone=config.train_backbone,
        init="router",
        contrast_weight=config.contrast_weight,
        distill_weight=config.distill_weight,
        replay_weight=config.replay_weight,
    )
    if restart and has_checkpoint(checkpoint_dir):
        remove_checkpoint(checkpoint_dir)
    resume = has_checkpoint(checkpoint_dir)
    if resume:
        say(f"continuing from the checkpoint in {checkpoint_dir}")
    try:
        history = fit_router(
            encoder,
            pairs.rows,
            train_config,
            checkpoint_dir=checkpoint_dir,
            resume=resume,
            checkpoint_every=20,
            progress=True,
            values=values,
            replay=demo_replay() if config.replay_weight > 0 else None,
        )
    except ModelError as exc:
        if resume:
            raise ModelError(f"{exc} (or pass --restart to start over)".replace("; drop --resume", "")) from exc
        raise
    trained_seconds = time.monotonic() - started
    params = _trainable(encoder, config.train_backbone)
    end = {n: p.detach().clone() for n, p in params.items()}

    alpha, val_scores = 1.0, {}
    val_plain = None
    if config.anchor == "wise" and val_plans:
        from condsearch.model.encoders import load_encoder
        from condsearch.model.encoders.spec import EncoderSpec, Runtime

        plain = load_encoder(EncoderSpec(model, profile="none", runtime=Runtime(device=device)))
        val_plain = mean(score_plan(val_plans, plain_embed(plain)))
        say(f"plain MiniLM: validation precision@10 {val_plain:.3f}")
        # the layers below the trained ones do not move: their states serve every α
        kept: dict[str, object] | None = {} if config.train_backbone == "top" else None
        for a in WISE_ALPHAS:
            _interpolate(params, start, end, a)
            val_scores[a] = mean(score_plan(val_plans, router_embed(encoder, states=kept)))
            say(f"interpolation α {a:g}: validation precision@10 {val_scores[a]:.3f}")
        alpha = choose_alpha(val_scores, config.wise_tolerance, config.wise_keep)
        _interpolate(params, start, end, alpha)
    encoder.refresh_identity()

    summary: dict[str, object] = {
        "table": Path(table).name,
        "labels": {s.column: list(s.phrasings) for s in specs},
        "scored_only": {s.column: list(s.phrasings) for s in score_only},
        "held_values": {c: sorted(v) for c, v in (held_values or {}).items()},
        "config": asdict(config),
        "rows": {"fit": len(split.fit), "validation": len(split.validation), "held": len(split.held)},
        "nulls_skipped": split.nulls,
        "pairs": {
            "pairs": pairs.n_pairs,
            "contrast": pairs.n_contrast,
            "plain": pairs.n_plain,
            "rows": len(pairs.rows),
        },
        "start_router": encoder.router_name,
        "alpha": alpha,
        "validation_p10_by_alpha": {f"{a:g}": s for a, s in val_scores.items()},
        "validation_p10_plain": val_plain,
        "history": history,
        "train_seconds": round(trained_seconds, 1),
    }
    return _save_and_report(
        encoder, out, summary, held_plans, start_held, model, device, csts_dev, checkpoint_dir, say, started
    )


def _save_and_report(
    encoder: CsrEncoder,
    out: Path,
    summary: dict[str, object],
    held_plans: list[ColumnPlan],
    start_held: dict[str, float],
    model: str | None,
    device: str | None,
    csts_dev: Path | None,
    checkpoint_dir: Path,
    say: Callable[[str], None],
    started: float,
) -> dict[str, object]:
    """Write the router beside out, score it as saved, add report.json, move the folder into place whole."""
    from condsearch.base.artifact_files import ADAPT_REPORT, write_json
    from condsearch.base.atomic import check_replaceable, replacing_dir, temporary_name
    from condsearch.model.csr.context import ContextRouter
    from condsearch.model.csr.context_weights import backbone_delta, base_weights, save_context_router
    from condsearch.model.csr.encoder import load_csr_encoder
    from condsearch.model.encoders import load_encoder
    from condsearch.model.encoders.spec import EncoderSpec, Runtime
    from condsearch.train.adapt_score import mean, plain_embed, router_embed, score_plan
    from condsearch.train.checkpoint import remove_checkpoint
    from condsearch.train.finite import finite_record

    enc = encoder
    router = enc.router
    assert isinstance(router, ContextRouter)
    out = Path(os.path.abspath(out))
    check_replaceable(out, "router")
    staging = temporary_name(out, "adapt")
    try:
        say(f"saving the router (its backbone's change from {enc.model_id})")
        delta, rank = backbone_delta(base_weights(enc.source.location), router.model)
        meta = {
            "model_id": enc.model_id,
            "model_revision": enc.revision,
            "training": finite_record({"adapt": summary}),
        }
        save_context_router(router, delta, rank, staging, meta)
        say("scoring plain MiniLM and the adapted router, as saved, on the held rows")
        saved = load_csr_encoder(model, router=str(staging), device=device)
        adapted = score_plan(held_plans, router_embed(saved))
        plain = load_encoder(EncoderSpec(model, profile="none", runtime=Runtime(device=device)))
        plain_held = score_plan(held_plans, plain_embed(plain))
        columns = {}
        for p in held_plans:
            columns[p.column] = {
                "condition": p.condition,
                "rows": len(p.texts),
                "queries": len(p.queries),
                "plain": plain_held[p.column],
                "start_router": start_held[p.column],
                "adapted": adapted[p.column],
            }
        report: dict[str, object] = {
            "held_p10": columns,
            "mean": {"plain": mean(plain_held), "start_router": mean(start_held), "adapted": mean(adapted)},
            **summary,
        }
        if csts_dev is not None:
            say(f"C-STS dev ({Path(csts_dev).name}) of the adapted router")
            report["csts_dev_spearman"] = csts_spearman(saved, csts_dev)
        report["seconds"] = round(time.monotonic() - started, 1)
        report = finite_record(report)
        write_json(staging / ADAPT_REPORT, report)
        with replacing_dir(out, "router") as tmp:
            os.rmdir(tmp)
            os.replace(staging, tmp)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    remove_checkpoint(checkpoint_dir)
    return report


def csts_spearman(encoder: CsrEncoder, dev_csv: Path) -> float:
    """Return C-STS Spearman ×100 of a CSR encoder on a dev file."""
    from condsearch.corpus.csts import read_csts
    from condsearch.train.router import _Featurizer, evaluate_router

    scores = evaluate_router(encoder, _Featurizer(encoder, read_csts(dev_csv), cached=False))
    return float(scores["spearman"])


def check_adapt_paths(table: Path, out: Path) -> None:
    """Refuse an out that is the table, holds it, or lies inside the index folder (ModelError; nothing written)."""
    from condsearch.base.atomic import check_replaceable
    from condsearch.defaults import default_index_dir

    real_out = Path(os.path.realpath(out))
    real_table = Path(os.path.realpath(table))
    if real_out == real_table or real_out in real_table.parents:
        raise CorpusError(f"--out {out}: is the table or holds it; name a new folder")
    index_dir = Path(os.path.realpath(default_index_dir()))
    if real_out == index_dir or index_dir in real_out.parents:
        raise CorpusError(f"--out {out}: lies inside the index folder {index_dir}; name a folder elsewhere")
    check_replaceable(out, "router")


def _row_keys(table: Path, text_column: str, id_column: str, table_format: str | None, texts: list[str]) -> list[str]:
    """Return each kept row's id as text when the table has id_column, else its text (read_labelled's rows)."""
    from condsearch.corpus.formats import format_of, read_table

    path = Path(table)
    raw = read_table(path, format_of(path, table_format), text_column)
    if id_column not in raw.column_names:
        return list(texts)
    ids = raw.column(id_column).to_pylist()
    text = raw.column(text_column).to_pylist()
    keys = [str(i) for i, t in zip(ids, text, strict=True) if t is not None and t.strip()]
    return keys
