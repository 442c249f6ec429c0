#!/usr/bin/env python3
"""Out-of-domain conditional retrieval: WordNet glosses searched under a category condition.

The corpus is WN18RR's entity texts ("name, definition"). Each condition names a category
("the kind of animal") and the WordNet synsets that root it (bird, fish, insect); its members are
their descendants through the *train* split's ``_hypernym`` edges only. Queries are members that
have at least one sibling (another child of one of their parents); a query's own gloss is searched
for and its own row is left out of the ranking. Reported per system and condition:

- ``sibling_p10``: the share of the top 10 that are siblings of the query (relevant);
- ``in_category``: the share of the top 10 that are members of the condition's category;
- ``top1`` / ``top10``: the mean score at rank 1 and 10, and ``spread`` their mean gap
  (a compressed score scale has a small spread and makes thresholds meaningless).

The conditions come in two splits that share no category: ``dev`` chooses (α of the WiSE-FT
sweep, a regulariser), ``report`` gives the figures quoted in benchmarks/README.

Systems: ``plain`` (all-MiniLM-L6-v2 mean-pooled, no condition), ``prefix`` (plain MiniLM on
"condition: text"), ``case:PROFILE`` (CASE vectors; a shipped profile name or a profile/adapter
folder, e.g. one written by benchmarks/studies/wise.py), ``csr`` (the default router tri-encoder),
``csr:ROUTER`` (a router folder) and ``blend:B:SYSTEM`` (ours: SYSTEM's cosine weighted B plus
plain MiniLM's weighted 1 − B).

    python -m benchmarks.studies.ood --data-dir ../shared/data/wn18rr --split report \
        --systems plain,prefix,case:full,case:lora,csr --json-out benchmarks/studies/results/ood_report.json
"""

from __future__ import annotations

import argparse
import hashlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np

from benchmarks._lib.common import compare_systems, log, quiet_transformers, write_outputs  # noqa: E402
from condsearch.metrics import best_k  # noqa: E402  (re-exported: heldout.py imports it from here)

#: condition -> root synsets (WN18RR ids with their names, for the reader)
CONDITIONS: dict[str, dict[str, dict[str, str]]] = {
    "report": {
        "the kind of animal": {"01503061": "bird", "02512053": "fish", "02159955": "insect"},
        "the kind of plant": {"13104059": "tree", "13112664": "shrub", "11669921": "flower"},
        "the kind of tool or instrument": {"04451818": "tool", "03800933": "musical instrument"},
        "the kind of vehicle": {"04524313": "vehicle"},
        "the kind of disease": {"14070360": "disease"},
    },
    "dev": {
        "the kind of food": {
            "07557434": "dish",
            "12212361": "vegetable",
            "13134947": "fruit",
            "07850329": "cheese",
            "07649854": "meat",
        },
        "the kind of feeling": {"07480068": "emotion"},
        "the kind of clothing": {"03419014": "garment"},
        "the kind of substance": {"14662574": "mineral", "03247620": "drug"},
        "the kind of job": {"09632518": "worker", "10560637": "scientist", "10794014": "writer", "09623038": "leader"},
        "the kind of body part": {"05220461": "body part"},
    },
}
SPLITS = ("report", "dev")
K = 10


class Taxonomy(NamedTuple):
    """Entity texts and the train split's hypernym edges."""

    ids: list[str]
    texts: list[str]
    children: dict[str, list[str]]
    parents: dict[str, list[str]]

    def descendants(self, roots: Sequence[str]) -> set[str]:
        seen: set[str] = set()
        todo = list(roots)
        while todo:
            for child in self.children.get(todo.pop(), []):
                if child not in seen:
                    seen.add(child)
                    todo.append(child)
        return seen

    def siblings(self, entity: str) -> set[str]:
        return {c for p in self.parents.get(entity, []) for c in self.children.get(p, [])} - {entity}


def read_taxonomy(data_dir: Path) -> Taxonomy:
    """Read entity2text.txt and the ``_hypernym`` edges of train.tsv (child -> parent)."""
    ids, texts = [], []
    for line in (data_dir / "entity2text.txt").read_text(encoding="utf-8").splitlines():
        entity, _, text = line.partition("\t")
        if text.strip():
            ids.append(entity)
            texts.append(text.strip())
    children: dict[str, list[str]] = defaultdict(list)
    parents: dict[str, list[str]] = defaultdict(list)
    for line in (data_dir / "train.tsv").read_text(encoding="utf-8").splitlines():
        head, relation, tail = line.split("\t")
        if relation == "_hypernym":
            children[tail].append(head)
            parents[head].append(tail)
    return Taxonomy(ids, texts, dict(children), dict(parents))


def synthetic_taxonomy() -> tuple[Taxonomy, dict[str, dict[str, str]]]:
    """Return a tiny made-up taxonomy (two categories, two parents each) and its conditions, for --smoke."""
    kinds = {
        "animal": {"bird": ["sparrow", "robin", "finch"], "fish": ["trout", "salmon", "carp"]},
        "vehicle": {"car": ["sedan", "coupe", "hatchback"], "boat": ["canoe", "kayak", "yacht"]},
    }
    ids, texts = [], []
    children: dict[str, list[str]] = defaultdict(list)
    parents: dict[str, list[str]] = defaultdict(list)
    for root, groups in kinds.items():
        ids.append(root)
        texts.append(f"{root}, a general kind of {root}")
        for parent, leaves in groups.items():
            ids.append(parent)
            texts.append(f"{parent}, a kind of {root}")
            children[root].append(parent)
            parents[parent].append(root)
            for leaf in leaves:
                ids.append(leaf)
                texts.append(f"{leaf}, a small {parent} often seen in the wild")
                children[parent].append(leaf)
                parents[leaf].append(parent)
    for i, word in enumerate(["run", "blue", "quickly", "tax", "idea", "sing"]):
        ids.append(f"x{i}")
        texts.append(f"{word}, an unrelated word")
    conditions = {"the kind of animal": {"animal": "animal"}, "the kind of vehicle": {"vehicle": "vehicle"}}
    return Taxonomy(ids, texts, dict(children), dict(parents)), conditions


Embed = Callable[[Sequence[str], str], np.ndarray]  # (texts, condition) -> (n, d) unit float32


def cached(embed: Embed, spec: str, cache_dir: Path | None) -> Embed:
    """Return embed, keeping its vectors in cache_dir by (system, condition, texts) when one is given."""
    if cache_dir is None:
        return embed

    def through_cache(texts: Sequence[str], condition: str) -> np.ndarray:
        key = hashlib.sha256("\x00".join([spec, condition, *texts]).encode()).hexdigest()[:24]
        path = cache_dir / f"{key}.npy"
        if path.is_file():
            return np.load(path, allow_pickle=False)
        vectors = embed(texts, condition)
        cache_dir.mkdir(parents=True, exist_ok=True)
        np.save(path, vectors, allow_pickle=False)
        return vectors

    return through_cache


def load_system(
    spec: str, batch_size: int, cache_dir: Path | None = None, model: str | None = None
) -> tuple[Embed, bool]:
    """Return (embed, conditional) for a system spec; unconditional systems embed once for every condition.

    ``blend:B:SYSTEM`` (ours) concatenates √B · SYSTEM's vector with √(1−B) · the plain MiniLM vector,
    so that its cosine is B · SYSTEM's cosine + (1 − B) · plain MiniLM's.
    """
    from condsearch.base.faiss_indexes import normalize
    from condsearch.model.encoders.spec import EncoderSpec
    from condsearch.model.vectorizer import load_vectorizer
    from condsearch.store.vectors import vector_fingerprint

    if spec.startswith("blend:"):
        _, weight, inner = spec.split(":", 2)
        beta = float(weight)
        inner_embed, _ = load_system(inner, batch_size, cache_dir, model)
        plain_embed, _ = load_system("plain", batch_size, cache_dir, model)

        def blend(texts: Sequence[str], condition: str) -> np.ndarray:
            parts = (np.sqrt(beta) * inner_embed(texts, condition), np.sqrt(1 - beta) * plain_embed(texts, ""))
            return np.concatenate(parts, axis=1).astype(np.float32)

        return blend, True
    if spec in ("plain", "prefix"):
        from condsearch.model.encoders import load_encoder

        encoder = load_encoder(EncoderSpec(model, profile="none"))

        def plain(texts: Sequence[str], condition: str) -> np.ndarray:
            if spec == "prefix":
                texts = [f"{condition}: {t}" for t in texts]
            return normalize(encoder.encode_pairs([(t, None) for t in texts], batch_size=batch_size, progress=True))

        key = f"{spec}:{model or ''}"
        return cached(plain, key, cache_dir) if spec == "prefix" else _plain_cached(
            plain, key, cache_dir
        ), spec == "prefix"
    if spec == "csr" or spec.startswith("csr:"):
        vec = load_vectorizer(EncoderSpec(model, mode="csr", router=spec[len("csr:") :] or None))
    elif spec.startswith("case:"):
        vec = load_vectorizer(EncoderSpec(model, profile=spec[len("case:") :]))
    else:
        raise SystemExit(f"unknown system {spec!r}: plain, prefix, case:PROFILE, csr or csr:ROUTER")

    def conditional(texts: Sequence[str], condition: str) -> np.ndarray:
        return vec.encode(list(texts), condition, batch_size=batch_size, progress=True)

    # keyed by what the vectors depend on (model, adapter and router checksums, head), not by the
    # spec alone: "csr" or "case:full" name other weights once a default changes
    described = vec.encoder.describe()
    fingerprint = vector_fingerprint(described, mode=vec.mode, head_checksum=vec.head_checksum, dim=vec.dim)
    return cached(conditional, f"{spec}:{fingerprint}", cache_dir), True


def add_system_options(p: argparse.ArgumentParser) -> None:
    """Add the options of a comparison of systems: load_system's model, cache and batch, the seed, the outputs."""
    p.add_argument("--model", default=None, help="model id or folder [default: all-MiniLM-L6-v2]")
    p.add_argument("--cache-dir", type=Path, default=None, help="keep each system's vectors here (reused by blend:)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--json-out", type=Path, default=None)
    p.add_argument("--md-out", type=Path, default=None)


def _plain_cached(plain: Embed, key: str, cache_dir: Path | None) -> Embed:
    """Plain vectors ignore the condition: cache them under the empty one."""
    inner = cached(plain, key, cache_dir)
    return lambda texts, condition: inner(texts, "")


def top_k(corpus: np.ndarray, queries: np.ndarray, exclude: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Return (scores, rows) of the k best corpus rows per query, leaving out row exclude[i] for query i."""
    scores = queries @ corpus.T
    scores[np.arange(len(queries)), exclude] = -np.inf
    return best_k(scores, k)


def query_sample(
    tax: Taxonomy, roots: Sequence[str], where: dict[str, int], n_queries: int, seed: int
) -> tuple[set[str], list[str]]:
    """Return (the category's members in the corpus, the seeded sample of members with a sibling there)."""
    members = tax.descendants(list(roots)) & set(where)
    candidates = sorted(e for e in members if tax.siblings(e) & set(where))
    rng = np.random.default_rng(seed)
    return members, [candidates[i] for i in sorted(rng.permutation(len(candidates))[:n_queries])]


def condition_metrics(
    tax: Taxonomy, scores: np.ndarray, hits: np.ndarray, chosen: list[str], members: set[str], corpus_ids: list[str]
) -> dict[str, float]:
    """Return one condition's figures from each query's top-K (scores, corpus rows), best first."""
    sib = [len({corpus_ids[h] for h in hit} & tax.siblings(e)) / K for e, hit in zip(chosen, hits, strict=True)]
    cat = [sum(corpus_ids[h] in members for h in hit) / K for hit in hits]
    return {
        "queries": len(chosen),
        "members": len(members),
        "sibling_p10": float(np.mean(sib)),
        "in_category": float(np.mean(cat)),
        "top1": float(scores[:, 0].mean()),
        "top10": float(scores[:, K - 1].mean()),
        "spread": float((scores[:, 0] - scores[:, K - 1]).mean()),
    }


def evaluate(
    tax: Taxonomy,
    conditions: dict[str, dict[str, str]],
    embed: Embed,
    conditional: bool,
    *,
    corpus_rows: np.ndarray,
    n_queries: int,
    seed: int,
) -> dict[str, dict[str, float]]:
    """Score one system on every condition; rows of the corpus are tax.ids[corpus_rows]."""
    corpus_ids = [tax.ids[i] for i in corpus_rows]
    corpus_texts = [tax.texts[i] for i in corpus_rows]
    where = {e: j for j, e in enumerate(corpus_ids)}
    shared: np.ndarray | None = None
    out: dict[str, dict[str, float]] = {}
    for condition, roots in conditions.items():
        members, chosen = query_sample(tax, list(roots), where, n_queries, seed)
        if conditional or shared is None:
            vectors = embed(corpus_texts, condition)
            if not conditional:
                shared = vectors
        else:
            vectors = shared
        rows = np.array([where[e] for e in chosen])
        scores, hits = top_k(vectors, vectors[rows], rows, K)
        out[condition] = condition_metrics(tax, scores, hits, chosen, members, corpus_ids)
    return out


def choose_corpus(tax: Taxonomy, conditions: dict[str, dict[str, str]], distractors: int | None, seed: int):
    """Return the corpus rows: every row (distractors None), else the categories' members and that many others."""
    if distractors is None:
        return np.arange(len(tax.ids))
    members = set().union(*(tax.descendants(list(r)) for r in conditions.values()))
    inside = [i for i, e in enumerate(tax.ids) if e in members]
    outside = np.array([i for i, e in enumerate(tax.ids) if e not in members])
    picked = np.random.default_rng(seed).permutation(len(outside))[:distractors]
    return np.sort(np.concatenate([np.array(inside, dtype=int), outside[picked]]))


def table(results: dict[str, dict[str, dict[str, float]]]) -> str:
    """Return markdown: per system, the means over conditions, then per condition."""
    lines = [
        "| system | sibling p@10 | in-category share | top-1 score | top-10 score | spread |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for system, per in results.items():
        mean = {m: np.mean([v[m] for v in per.values()]) for m in ("sibling_p10", "in_category", "top1", "top10")}
        spread = np.mean([v["spread"] for v in per.values()])
        lines.append(
            f"| {system} | {mean['sibling_p10']:.3f} | {mean['in_category']:.3f} | {mean['top1']:.3f} | "
            f"{mean['top10']:.3f} | {spread:.3f} |"
        )
    conditions = list(next(iter(results.values())))
    lines += ["", "| system | " + " | ".join(conditions) + " |", "|---|" + "---:|" * len(conditions)]
    for system, per in results.items():
        cells = [f"{per[c]['sibling_p10']:.3f} / {per[c]['in_category']:.3f}" for c in conditions]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("(per condition: sibling p@10 / in-category share)")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parents[3] / "shared/data/wn18rr")
    p.add_argument("--split", choices=SPLITS, default="report", help="dev: choose on it; report: the quoted figures")
    p.add_argument("--systems", default="plain,prefix,case:full,csr", help="comma-separated system specs")
    p.add_argument("--queries", type=int, default=200, help="queries per condition (seeded sample)")
    p.add_argument(
        "--distractors",
        type=int,
        default=None,
        help="corpus: the categories' members plus this many other glosses (seeded) [default: all 40,943 rows]",
    )
    add_system_options(p)
    p.add_argument("--smoke", action="store_true", help="a tiny made-up taxonomy; plain, prefix, case and a blend")
    args = p.parse_args(argv)
    quiet_transformers()
    if args.smoke:
        tax, conditions = synthetic_taxonomy()
        case = "case:full" if args.model is None else "case:none"  # the shipped profiles fit the default model
        systems = ["plain", "prefix", case, f"blend:0.5:{case}"]
    else:
        if not (args.data_dir / "entity2text.txt").is_file():
            p.error(f"--data-dir {args.data_dir}: no entity2text.txt (WN18RR with entity texts)")
        tax, conditions = read_taxonomy(args.data_dir), CONDITIONS[args.split]
        systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    corpus_rows = choose_corpus(tax, conditions, args.distractors, args.seed)
    log("ood", f"{len(corpus_rows)} corpus rows, {len(conditions)} conditions, systems {', '.join(systems)}")

    def run(system: str) -> dict[str, dict[str, float]]:
        embed, conditional = load_system(system, args.batch_size, args.cache_dir, args.model)
        return evaluate(
            tax, conditions, embed, conditional, corpus_rows=corpus_rows, n_queries=args.queries, seed=args.seed
        )

    results, record = compare_systems("ood", systems, run)
    result = {
        "benchmark": "ood",
        "split": "smoke" if args.smoke else args.split,
        "conditions": conditions,
        "corpus_rows": len(corpus_rows),
        "distractors": args.distractors,
        "queries_per_condition": args.queries,
        "k": K,
        **record,
    }
    write_outputs(result, table(results), args.json_out, args.md_out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
