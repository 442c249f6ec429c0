#!/usr/bin/env python3
"""A yardstick for `condsearch adapt` (ours, issue 57): how far a model trained for a label alone gets.

For each source of ``build/anytext/sources.json`` and each of its labelled columns, plain MiniLM's
vectors of the rows `adapt` trains on (the same split: rows kept aside and validation rows chosen by
a seeded hash of each id, :func:`condsearch.train.adapt.split_rows`) fit a multinomial logistic
regression on the column's values, its weight decay chosen on the validation rows' precision@10. A
text's vector is then the distribution over the values that the probe predicts for it, and the held
rows are scored exactly as `adapt` scores them (:func:`condsearch.train.adapt_score.plan_scoring`:
at most 1,000 rows and 200 queries a column; precision@10 of neighbours sharing the value).

This is a supervised classifier on the label, not a search model: it knows nothing of any other
condition, and it is not a bound on what fine-tuning the router's layers can reach. It says how
much of a label plain MiniLM's vectors carry, read by a model trained for that label only: where
it gains little over plain MiniLM's own neighbours, so will a router adapted on the same rows.

``--features words`` fits the same probe on words in place of MiniLM's vectors (TF-IDF of the
lower-cased words and word pairs seen in at least two training rows): whether the label is in the
text at all, read by a model that owes nothing to MiniLM. Plain MiniLM stays the baseline.

    python -m benchmarks.studies.probe --only speeches,edict --json-out benchmarks/studies/results/adapt_probe.json
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from benchmarks._lib.common import exit_code, log, quiet_transformers, run_info, write_outputs
from benchmarks.studies.heldout import read_sources, smoke_sources
from condsearch.errors import CorpusError
from condsearch.train.adapt import AdaptConfig

#: the weight decays tried, each chosen on the validation rows' precision@10
DECAYS = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
#: the most training rows a column's probe is fitted on (a seeded sample): 2,000 pairs name at most 4,000
MAX_FIT = 10_000


#: what a probe reads: plain MiniLM's vectors, or the words of the text
FEATURES = ("minilm", "words")
_WORD = re.compile(r"\w+")

Features = np.ndarray | sp.csr_matrix


class WordFeatures:
    """TF-IDF of lower-cased words and word pairs, the vocabulary taken from the training rows."""

    def __init__(self, texts: Sequence[str], min_rows: int = 2) -> None:
        seen: Counter[str] = Counter()
        for text in texts:
            seen.update(set(self._terms(text)))
        terms = sorted(t for t, n in seen.items() if n >= min_rows)
        self.vocabulary = {t: i for i, t in enumerate(terms)}
        self.idf = np.array([np.log((1 + len(texts)) / (1 + seen[t])) + 1.0 for t in terms], dtype=np.float32)

    @staticmethod
    def _terms(text: str) -> list[str]:
        words = _WORD.findall(text.lower())
        return words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]

    def __call__(self, texts: Sequence[str]) -> sp.csr_matrix:
        rows, cols, vals = [], [], []
        for r, text in enumerate(texts):
            counts = Counter(self.vocabulary[t] for t in self._terms(text) if t in self.vocabulary)
            for c, n in counts.items():
                rows.append(r)
                cols.append(c)
                vals.append((1.0 + np.log(n)) * self.idf[c])
        x = sp.csr_matrix((np.asarray(vals, dtype=np.float32), (rows, cols)), shape=(len(texts), len(self.idf)))
        norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).ravel())
        return sp.csr_matrix(sp.diags(1.0 / np.maximum(norms, 1e-12)) @ x, dtype=np.float32)


def _with_bias(x: Features) -> Features:
    if sp.issparse(x):
        return sp.hstack([x, np.ones((x.shape[0], 1), dtype=np.float32)], format="csr", dtype=np.float32)
    return np.hstack([x, np.ones((len(x), 1), dtype=np.float32)])


def fit_probe(x: Features, y: np.ndarray, n_values: int, decay: float, steps: int = 200) -> np.ndarray:
    """Return (d + 1, n_values) weights of a multinomial logistic regression of y on x (the last row: biases)."""
    import torch

    torch.manual_seed(0)
    xb = _with_bias(x)
    if sp.issparse(xb):
        coo = xb.tocoo()
        indices = torch.from_numpy(np.vstack([coo.row, coo.col]).astype(np.int64))
        xt = torch.sparse_coo_tensor(indices, torch.from_numpy(coo.data), coo.shape, check_invariants=True).coalesce()
    else:
        xt = torch.from_numpy(xb)
    yt = torch.from_numpy(y.astype(np.int64))
    w = torch.zeros(xt.shape[1], n_values, requires_grad=True)
    opt = torch.optim.LBFGS([w], max_iter=steps, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        logits = torch.sparse.mm(xt, w) if xt.is_sparse else xt @ w
        loss = torch.nn.functional.cross_entropy(logits, yt) + decay * (w[:-1] ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach().numpy()


def probe_vectors(x: Features, w: np.ndarray) -> np.ndarray:
    """Return each row's predicted distribution over the values, as a unit vector."""
    logits = np.asarray(_with_bias(x) @ w)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    return (p / np.linalg.norm(p, axis=1, keepdims=True)).astype(np.float32)


def run_source(
    source: dict[str, object],
    model: str | None,
    config: AdaptConfig,
    max_fit: int = MAX_FIT,
    features: str = "minilm",
) -> dict[str, object]:
    """Score plain MiniLM and the probe on one source's held rows; return its row of the table."""
    from condsearch.metrics import label_precision
    from condsearch.model.encoders import load_encoder
    from condsearch.model.encoders.spec import EncoderSpec
    from condsearch.train.adapt import _row_keys, split_rows
    from condsearch.train.adapt_score import K, plain_embed, plan_scoring
    from condsearch.train.pairs_files import read_labelled

    conditions_of: dict[str, list[str]] = source["conditions"]  # type: ignore[assignment]
    table = Path(str(source["table"]))
    data = read_labelled(table, list(conditions_of), "text")
    keys = _row_keys(table, "text", "id", None, data.texts)
    split = split_rows(keys, data.labels, config)
    conditions = {c: p[0] for c, p in conditions_of.items()}
    plan = dict(max_rows=config.report_rows, n_queries=config.queries, seed=config.seed)
    held = {p.column: p for p in plan_scoring(data.texts, data.labels, conditions, split.held, **plan)}  # type: ignore[arg-type]
    validation = {
        p.column: p
        for p in plan_scoring(
            data.texts,
            data.labels,
            conditions,
            split.validation,
            **{**plan, "max_rows": config.validation_rows},  # type: ignore[arg-type]
        )
    }
    embed = plain_embed(load_encoder(EncoderSpec(model, profile="none")))

    def vectors(texts: Sequence[str]) -> np.ndarray:
        return embed(texts, ["-"])["-"]

    columns: dict[str, dict[str, object]] = {}
    for column, held_plan in held.items():
        fit = [i for i in split.fit if data.labels[column][i] is not None]
        if len(fit) > max_fit:
            fit = sorted(np.random.default_rng(config.seed).choice(fit, size=max_fit, replace=False).tolist())
        values = sorted({str(data.labels[column][i]) for i in fit})
        index = {v: n for n, v in enumerate(values)}
        fit_texts = [data.texts[i] for i in fit]
        read = vectors if features == "minilm" else WordFeatures(fit_texts)
        x = read(fit_texts)
        y = np.array([index[str(data.labels[column][i])] for i in fit])
        val = validation.get(column)
        val_x = read(val.texts) if val is not None else None  # read once, scored under each decay
        by_decay = {}
        for decay in DECAYS:
            w = fit_probe(x, y, len(values), decay)
            score = (
                label_precision(probe_vectors(val_x, w), val.values, val.queries, K)
                if val is not None and val_x is not None
                else float("nan")
            )
            by_decay[decay] = (score, w)
        decay = max(DECAYS, key=lambda d: (np.nan_to_num(by_decay[d][0], nan=-1.0), -d))
        w = by_decay[decay][1]
        plain_x = vectors(held_plan.texts)
        probe_x = probe_vectors(plain_x if features == "minilm" else read(held_plan.texts), w)
        predicted = [values[i] for i in probe_x.argmax(axis=1)]
        columns[column] = {
            "condition": held_plan.condition,
            "rows": len(held_plan.texts),
            "queries": len(held_plan.queries),
            "fit_rows": len(fit),
            "features": features if features == "minilm" else f"words ({x.shape[1]} terms)",
            "plain": label_precision(plain_x, held_plan.values, held_plan.queries, K),
            "probe": label_precision(probe_x, held_plan.values, held_plan.queries, K),
            "probe_accuracy": float(np.mean([p == v for p, v in zip(predicted, held_plan.values, strict=True)])),
            "decay": decay,
            "validation_p10_by_decay": {f"{d:g}": by_decay[d][0] for d in DECAYS},
        }
    plain = float(np.mean([c["plain"] for c in columns.values()]))
    probe = float(np.mean([c["probe"] for c in columns.values()]))
    return {"source": source["name"], "columns": columns, "mean": {"plain": plain, "probe": probe}}


def table(rows: list[dict[str, object]]) -> str:
    """Return markdown: one line per (source, column), then the source's mean."""
    lines = [
        "| source | column | plain MiniLM | probe | vs plain | probe accuracy | decay |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cols: dict[str, dict[str, float]] = r["columns"]  # type: ignore[assignment]
        for name, c in cols.items():
            lines.append(
                f"| {r['source']} | {name} | {c['plain']:.3f} | {c['probe']:.3f} | {c['probe'] / c['plain'] - 1:+.1%} "
                f"| {c['probe_accuracy']:.3f} | {c['decay']:g} |"
            )
        m: dict[str, float] = r["mean"]  # type: ignore[assignment]
        lines.append(
            f"| {r['source']} | mean | {m['plain']:.3f} | {m['probe']:.3f} | {m['probe'] / m['plain'] - 1:+.1%} | | |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sources", type=Path, default=Path("build/anytext/sources.json"), help="sources file")
    p.add_argument("--only", default=None, help="comma-separated source names (default all)")
    p.add_argument("--model", default=None, help="model (default: the default model)")
    p.add_argument("--max-fit", type=int, default=MAX_FIT, help="most training rows a probe is fitted on")
    p.add_argument("--features", choices=FEATURES, default="minilm", help="what the probe reads (default: minilm)")
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--md-out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true", help="a tiny made-up table and a tiny model (--model)")
    args = p.parse_args(argv)
    quiet_transformers()
    config = AdaptConfig()
    if args.smoke:
        import tempfile

        args.sources = smoke_sources(Path(tempfile.mkdtemp(prefix="probe-smoke-")))
        config = AdaptConfig(report_rows=72, validation_rows=72)
    elif not args.sources.is_file():
        raise CorpusError(
            f"{args.sources}: no sources file (build it with python -m benchmarks.studies.anytext.build_data)"
        )
    sources = read_sources(args.sources)
    if args.only:
        wanted = [s.strip() for s in args.only.split(",")]
        sources = sorted((s for s in sources if s["name"] in wanted), key=lambda s: wanted.index(str(s["name"])))
    rows = []
    for source in sources:
        row = run_source(source, args.model, config, args.max_fit, args.features)
        log("probe", f"{row['source']}: {row['mean']}")
        rows.append(row)
    result = {
        "benchmark": "probe",
        "smoke": args.smoke,
        "config": {
            "decays": list(DECAYS),
            "max_fit": args.max_fit,
            "features": args.features,
            "report_rows": config.report_rows,
            "queries": config.queries,
        },
        "sources": str(args.sources),
        "rows": rows,
        "run": run_info("cpu"),
    }
    write_outputs(result, table(rows), args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(exit_code(main, "probe.py"))
