#!/usr/bin/env python3
"""C-STS training rows with self-distilled pairs mixed in (ours, issue 25's "mixing unconditional pairs").

Issue 25 asks whether mixing unconditional pairs into training keeps what the base model knows out
of domain. This writes the training CSV with extra rows: pairs of the training set's own sentences
(each row's own pair, and as many random pairs, so that the targets span low and high similarity)
under a *generic* condition (the overall meaning, the kind of thing described, ...), labelled with
plain all-MiniLM-L6-v2's cosine on the 1..5 scale (1 + 4 · cos, clipped). Training on it asks CASE
to keep the sentence's whole meaning when the condition asks for it. No WordNet text is used, and
no condition names a category of ``benchmarks/studies/ood.py``.

    python -m benchmarks.studies.distill_pairs --train ../shared/data/csts-reannotated/train.csv \\
        --rows 4000 --out build/train-distill.csv
    condsearch train full build/train-distill.csv --dev ../shared/data/csts-reannotated/dev.csv \\
        --loss mse --lr 1.5e-4 --epochs 5 --out build/full-distill
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from benchmarks._lib.common import exit_code, log, quiet_transformers, synthetic_csts, write_csts_csv  # noqa: E402
from condsearch.corpus.csts import LABEL_MAX, LABEL_MIN, CstsData, read_csts  # noqa: E402

#: generic conditions: each asks for the sentence's whole meaning, none names an ood.py category
GENERIC_CONDITIONS = (
    "the overall meaning",
    "what the sentence is about",
    "the kind of thing described",
    "the main subject",
    "the general topic",
    "the situation described",
)


def distilled_rows(data: CstsData, n_rows: int, seed: int, model: str | None) -> CstsData:
    """Return n_rows self-distilled rows: half the data's own pairs, half random pairs of its sentences."""
    from condsearch.base.faiss_indexes import normalize
    from condsearch.model.encoders import load_encoder
    from condsearch.model.encoders.spec import EncoderSpec

    rng = np.random.default_rng(seed)
    sentences = sorted(set(data.sentence1) | set(data.sentence2))
    where = {s: i for i, s in enumerate(sentences)}
    own = sorted({(where[a], where[b]) for a, b in zip(data.sentence1, data.sentence2, strict=True)})
    half = n_rows // 2
    picked = [own[i] for i in rng.permutation(len(own))[:half]]
    while len(picked) < n_rows:
        i, j = rng.integers(0, len(sentences), size=2)
        if i != j:
            picked.append((int(i), int(j)))
    encoder = load_encoder(EncoderSpec(model, profile="none"))
    vectors = normalize(encoder.encode_pairs([(s, None) for s in sentences], progress=True))
    cos = np.array([float(vectors[i] @ vectors[j]) for i, j in picked])
    labels = np.clip(LABEL_MIN + (LABEL_MAX - LABEL_MIN) * cos, LABEL_MIN, LABEL_MAX).astype(np.float32)
    conditions = [GENERIC_CONDITIONS[k] for k in rng.integers(0, len(GENERIC_CONDITIONS), size=len(picked))]
    return CstsData([sentences[i] for i, _ in picked], [sentences[j] for _, j in picked], conditions, labels)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--train", type=Path, default=None, help="C-STS training CSV (required but in --smoke)")
    p.add_argument("--rows", type=int, default=4000, help="self-distilled rows to add")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default=None, help="the model whose plain cosines are the targets [default: MiniLM]")
    p.add_argument("--out", type=Path, required=True, help="the CSV to write: the training rows, then the new ones")
    p.add_argument("--smoke", action="store_true", help="48 synthetic rows and 16 distilled")
    args = p.parse_args(argv)
    if not args.smoke and args.train is None:
        p.error("--train is required (except with --smoke)")
    quiet_transformers()
    data = synthetic_csts(48) if args.smoke else read_csts(args.train)
    extra = distilled_rows(data, 16 if args.smoke else args.rows, args.seed, args.model)
    both = CstsData(
        data.sentence1 + extra.sentence1,
        data.sentence2 + extra.sentence2,
        data.condition + extra.condition,
        np.concatenate([data.labels, extra.labels]),
    )
    write_csts_csv(both, args.out)
    log("distill", f"{len(data)} training rows + {len(extra)} distilled -> {args.out}")
    read_csts(args.out)  # read back: the trainer's reader must accept every row
    return 0


if __name__ == "__main__":
    raise SystemExit(exit_code(main, "distill_pairs.py"))
