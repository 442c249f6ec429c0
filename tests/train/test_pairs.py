"""`condsearch pairs`: contrast rows, balance, seed, phrasings, every bad input as one line; its rows train."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from condsearch.cli import main
from condsearch.corpus.csts import read_csts
from condsearch.errors import CorpusError
from condsearch.train.pairs import LabelSpec, PairsConfig, PairsResult, make_pairs, parse_label_spec

KINDS = ["shoe", "shirt", "hat", "bag"]
MAKERS = ["acme", "zenith", "nova"]


def catalogue(n: int = 48, *, skew: bool = False) -> dict[str, list[object]]:
    """Return a table of n products: every (kind, maker) present; with skew, most products are shoes."""
    kinds, makers, texts = [], [], []
    for i in range(n):
        kind = "shoe" if skew and i % 5 else KINDS[i % len(KINDS)]
        maker = MAKERS[(i // len(KINDS)) % len(MAKERS)] if not skew else MAKERS[i % len(MAKERS)]
        kinds.append(kind)
        makers.append(maker)
        texts.append(f"item {i}: a {maker} {kind}, model {i}")
    return {"id": list(range(n)), "text": texts, "category": kinds, "brand": makers}


def write_table(path: Path, table: dict[str, list[object]]) -> Path:
    if path.suffix == ".csv":
        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(list(table))
            writer.writerows(zip(*table.values(), strict=True))
    elif path.suffix == ".jsonl":
        rows = [dict(zip(table, values, strict=True)) for values in zip(*table.values(), strict=True)]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    else:
        pq.write_table(pa.table(table), path)
    return path


SPECS = [LabelSpec("category", ("the kind of product", "the product's category")), LabelSpec("brand", ("the maker",))]
CONDITION_OF = {p: s.column for s in SPECS for p in s.phrasings}


def labels_of(table: dict[str, list[object]]) -> dict[str, list[str | None]]:
    return {c: [None if v is None else str(v) for v in table[c]] for c in ("category", "brand")}


def draw(table: dict[str, list[object]] | None = None, **config: object):
    table = table or catalogue()
    texts = [str(t) for t in table["text"]]
    return make_pairs(texts, labels_of(table), SPECS, PairsConfig(**config))  # type: ignore[arg-type]


def pairs_of(result) -> list[list[int]]:
    """Group the rows by sentence pair, in order."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i, key in enumerate(zip(result.rows.sentence1, result.rows.sentence2, strict=True)):
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def run(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


# ----------------------------------------------------------------- the pairs drawn


def test_every_contrast_pair_is_alike_under_its_high_condition_and_unlike_under_its_low_one() -> None:
    table = catalogue()
    value = {str(t): {c: table[c][i] for c in ("category", "brand")} for i, t in enumerate(table["text"])}
    result = draw(table, n_pairs=40)
    assert result.n_contrast == 40 and result.n_plain == 0 and len(result.rows) == 80
    groups = pairs_of(result)
    assert len(groups) == 40 and all(len(g) == 2 for g in groups)  # every pair twice, as C-STS gives it
    rows = result.rows
    for high, low in groups:
        assert (rows.labels[high], rows.labels[low]) == (5.0, 1.0)
        a, b = value[rows.sentence1[high]], value[rows.sentence2[high]]
        alike, unlike = CONDITION_OF[rows.condition[high]], CONDITION_OF[rows.condition[low]]
        assert alike != unlike
        assert a[alike] == b[alike] and a[unlike] != b[unlike]
        assert rows.sentence1[high] != rows.sentence2[high]
    # both columns take turns as the shared one
    assert {CONDITION_OF[rows.condition[g[0]]] for g in groups} == {"category", "brand"}


def test_no_pair_is_drawn_twice_in_either_order() -> None:
    result = draw(n_pairs=5000)  # far more than there are: it stops when none is left
    keys = [frozenset(k) for k in zip(result.rows.sentence1, result.rows.sentence2, strict=True)]
    assert len(set(keys)) == result.n_pairs and result.n_pairs < 5000


def test_labels_high_and_low_are_the_ones_asked() -> None:
    result = draw(n_pairs=10, high=4.5, low=1.5)
    assert set(result.rows.labels.tolist()) == {4.5, 1.5}


def test_no_value_is_shared_by_more_pairs_than_its_cap() -> None:
    table = catalogue(200, skew=True)  # four products in five are shoes
    result = draw(table, n_pairs=400, max_per_value=6)
    assert max(result.per_value["category"].values()) <= 6
    assert max(result.per_value["brand"].values()) <= 6
    counts = Counter(CONDITION_OF[c] for c, y in zip(result.rows.condition, result.rows.labels, strict=True) if y == 5)
    assert counts == Counter({c: sum(result.per_value[c].values()) for c in ("category", "brand")})


def test_the_default_cap_keeps_a_common_value_from_dominating() -> None:
    table = catalogue(400, skew=True)
    texts_per_kind = Counter(table["category"])
    assert texts_per_kind["shoe"] > 3 * sum(n for k, n in texts_per_kind.items() if k != "shoe")
    result = draw(table, n_pairs=80)
    shared = result.per_value["category"]
    # shoes hold over 80% of the texts but are the shared value of at most twice an even share (80 / 2 / 4)
    assert shared["shoe"] <= result.max_per_value["category"] == 20
    assert len(shared) == len(KINDS) and shared["shoe"] < sum(shared.values()) / 2


def test_the_same_seed_gives_the_same_rows_and_another_seed_others() -> None:
    first, again, other = draw(n_pairs=30, seed=3), draw(n_pairs=30, seed=3), draw(n_pairs=30, seed=4)

    def as_rows(r: PairsResult) -> list[tuple[str, str, str, float]]:
        return list(zip(r.rows.sentence1, r.rows.sentence2, r.rows.condition, r.rows.labels.tolist(), strict=True))

    assert as_rows(first) == as_rows(again)
    assert as_rows(first) != as_rows(other)


def test_every_phrasing_of_a_condition_is_used() -> None:
    result = draw(n_pairs=60)
    used = Counter(result.rows.condition)
    assert set(used) == {"the kind of product", "the product's category", "the maker"}


def test_plain_pairs_fill_what_contrast_leaves_only_when_asked() -> None:
    # category and brand say the same thing here: no contrast pair exists
    table = {"text": [f"text {i}" for i in range(12)], "category": ["a", "b"] * 6, "brand": ["x", "y"] * 6}
    with pytest.raises(CorpusError, match="no-contrast-only"):
        draw(table, n_pairs=10)
    result = draw(table, n_pairs=10, contrast_only=False)
    assert result.n_contrast == 0 and result.n_plain == 10 and len(result.rows) == 10
    assert set(result.rows.labels.tolist()) == {5.0, 1.0}


def test_rows_without_a_label_take_no_part_under_that_label() -> None:
    table = catalogue()
    table["brand"] = [None if i % 2 else b for i, b in enumerate(table["brand"])]
    value = {str(t): table["brand"][i] for i, t in enumerate(table["text"])}
    result = draw(table, n_pairs=40)
    for s1, s2, cond in zip(result.rows.sentence1, result.rows.sentence2, result.rows.condition, strict=True):
        if CONDITION_OF[cond] == "brand":
            assert value[s1] is not None and value[s2] is not None


# ----------------------------------------------------------------- the command


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".jsonl"])
def test_command_reads_what_index_reads_and_writes_rows_that_train_reads(tmp_path: Path, suffix: str) -> None:
    table = write_table(tmp_path / f"catalogue{suffix}", catalogue())
    out = tmp_path / "pairs.csv"
    result = run(
        "pairs", table, "--label", "category=the kind of product|the product's category",
        "--label", "brand=the maker", "--out", out, "--n-pairs", 20, "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["rows"] == 40 and summary["contrast_pairs"] == 20 and summary["texts"] == 48
    assert sum(summary["per_value"]["category"].values()) + sum(summary["per_value"]["brand"].values()) == 20
    data = read_csts(out)  # what condsearch train reads
    assert len(data) == 40 and set(data.labels.tolist()) == {1.0, 5.0}
    assert set(data.condition) <= {"the kind of product", "the product's category", "the maker"}


def test_command_writes_parquet_and_json_lines_by_extension(tmp_path: Path) -> None:
    table = write_table(tmp_path / "catalogue.parquet", catalogue())
    labels = ["--label", "category=the kind", "--label", "brand=the maker", "--n-pairs", 8, "--seed", 1]
    assert run("pairs", table, *labels, "--out", tmp_path / "p.csv").exit_code == 0
    assert run("pairs", table, *labels, "--out", tmp_path / "p.parquet").exit_code == 0
    assert run("pairs", table, *labels, "--out", tmp_path / "p.jsonl").exit_code == 0
    expected = read_csts(tmp_path / "p.csv")
    parquet = pq.read_table(tmp_path / "p.parquet").to_pydict()
    lines = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text(encoding="utf-8").splitlines()]
    assert parquet["sentence1"] == expected.sentence1 == [r["sentence1"] for r in lines]
    assert parquet["condition"] == expected.condition == [r["condition"] for r in lines]
    assert np.allclose(parquet["label"], expected.labels) and [r["label"] for r in lines] == parquet["label"]


def test_texts_with_commas_quotes_and_newlines_survive_the_csv(tmp_path: Path) -> None:
    table = catalogue(24)
    table["text"] = [f'item {i}, "quoted"\nsecond line' for i in range(24)]
    path = write_table(tmp_path / "c.parquet", table)
    out = tmp_path / "pairs.csv"
    assert run("pairs", path, "--label", "category=kind", "--label", "brand=maker", "--out", out).exit_code == 0
    data = read_csts(out)
    assert set(data.sentence1) <= set(table["text"]) and set(data.sentence2) <= set(table["text"])


def _one_line_error(result: Result, match: str, code: int = 1) -> None:
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    message = result.output.strip()
    assert message.count("\n") == 0 or message.startswith("Usage:"), message
    assert match in message, message
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("labels", "match", "code"),
    [
        (["category=kind", "size=the size"], "no column 'size'", 1),
        (["category=kind", "shop=the shop"], "holds one value only ('main')", 1),
        (["category=kind", "blank=nothing"], "column 'blank' has no values", 1),
        (["category=kind"], "contrast pairs need two labelled columns", 2),
        (["category"], "no '='", 2),
        (["=kind"], "names no column", 2),
        (["category="], "empty condition", 2),
        (["category=kind||type"], "empty condition", 2),
        (["category=kind|kind", "brand=maker"], "repeats a condition", 2),
        (["category=kind", "category=type"], "labelled twice", 2),
        (["category=kind", "brand=kind"], "given to two columns", 2),
        (["text=kind", "brand=maker"], "holds the texts", 2),
    ],
)
def test_bad_labels_are_one_line_errors_and_write_nothing(
    tmp_path: Path, labels: list[str], match: str, code: int
) -> None:
    table = catalogue()
    table["shop"] = ["main"] * len(table["text"])
    table["blank"] = [None] * len(table["text"])
    path = write_table(tmp_path / "c.parquet", table)
    out = tmp_path / "pairs.csv"
    args = [a for label in labels for a in ("--label", label)]
    _one_line_error(run("pairs", path, *args, "--out", out), match, code)
    assert list(tmp_path.iterdir()) == [path]  # no output, no temporary left


@pytest.mark.parametrize(
    ("table", "match"),
    [
        ({"text": ["one text"], "category": ["a"], "brand": ["x"]}, "pairs need at least two"),
        ({"text": list("abcd"), "category": list("aabb"), "brand": list("xxyy")}, "no two texts"),
        ({"text": ["", "  ", None], "category": ["a", "b", "c"], "brand": ["x", "y", "z"]}, "no non-empty texts"),
        ({"text": [1, 2, 3], "category": ["a", "b", "c"], "brand": ["x", "y", "z"]}, "does not hold strings"),
        ({"text": ["a", "b"], "category": [["a"], ["b"]], "brand": ["x", "y"]}, "labels are single values"),
    ],
)
def test_a_table_that_cannot_give_pairs_is_a_one_line_error(
    tmp_path: Path, table: dict[str, list[object]], match: str
) -> None:
    path = write_table(tmp_path / "c.parquet", table)
    out = tmp_path / "pairs.csv"
    _one_line_error(run("pairs", path, "--label", "category=kind", "--label", "brand=maker", "--out", out), match)
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--n-pairs", "0"], "--n-pairs"),
        (["--max-per-value", "0"], "--max-per-value"),
        (["--high", "nan"], "is not a finite number"),
        (["--low", "inf"], "--low"),
        (["--high", "6"], "--high"),
        (["--high", "2", "--low", "3"], "must exceed the low one"),
        (["--format", "xml"], "--format"),
    ],
)
def test_bad_options_are_usage_errors(tmp_path: Path, args: list[str], match: str) -> None:
    path = write_table(tmp_path / "c.parquet", catalogue())
    labels = ["--label", "category=kind", "--label", "brand=maker"]
    result = run("pairs", path, *labels, "--out", tmp_path / "p.csv", *args)
    _one_line_error(result, match, 2)
    assert not (tmp_path / "p.csv").exists()


def test_bad_paths_are_one_line_errors_and_an_old_output_stays_whole(tmp_path: Path) -> None:
    path = write_table(tmp_path / "c.parquet", catalogue())
    labels = ["--label", "category=kind", "--label", "brand=maker"]
    _one_line_error(run("pairs", tmp_path / "none.parquet", *labels, "--out", tmp_path / "p.csv"), "no such file")
    _one_line_error(run("pairs", path, *labels, "--out", tmp_path / "no" / "p.csv"), "no folder")
    _one_line_error(run("pairs", path, *labels, "--out", path), "is the input table")
    assert pq.read_table(path).num_rows == 48
    old = tmp_path / "old.csv"
    old.write_text("kept\n")
    _one_line_error(run("pairs", path, "--label", "category=kind", "--label", "shop=x", "--out", old), "no column")
    assert old.read_text() == "kept\n"


def test_parse_label_spec_splits_at_the_first_equals_sign() -> None:
    assert parse_label_spec(" field = a=b | c ") == LabelSpec("field", ("a=b", "c"))


# ----------------------------------------------------------------- training on several CSVs, each with a weight


def _csts(path: Path, n_pairs: int, tag: str) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["sentence1", "sentence2", "condition", "label"])
        for i in range(n_pairs):
            writer.writerow([f"{tag} a{i}", f"{tag} b{i}", "the colour", 5.0])
            writer.writerow([f"{tag} a{i}", f"{tag} b{i}", "the sport", 1.0])
    return path


def test_weighted_sources_take_whole_copies_and_a_seeded_share_of_pairs(tmp_path: Path) -> None:
    from condsearch.train.losses import pair_groups
    from condsearch.train.mixture import TrainSource, read_training

    base, extra = _csts(tmp_path / "base.csv", 10, "base"), _csts(tmp_path / "extra.csv", 8, "extra")
    assert len(read_training(base, seed=0)) == 20  # one file at weight 1: as read_csts reads it
    half = read_training([TrainSource(base), TrainSource(extra, 0.5)], seed=0)
    assert len(half) == 20 + 8 and Counter(s.split()[0] for s in half.sentence1) == {"base": 20, "extra": 8}
    groups = pair_groups(half)
    assert len(groups) == 14 and all(len(g) == 2 for g in groups)  # both rows of a pair, or neither
    sources = [TrainSource(base), TrainSource(extra, 0.5)]
    again, other = read_training(sources, seed=0), read_training(sources, seed=1)
    assert again.sentence1 == half.sentence1 and other.sentence1 != half.sentence1
    twice = read_training([TrainSource(base), TrainSource(extra, 2.5)], seed=0)
    assert len(twice) == 20 + 2 * 16 + 8
    # a pair repeated is still batched as [high, low] pairs, as the contrastive losses need
    groups = pair_groups(twice)
    assert len(groups) == 10 + 2 * 8 + 4
    assert all(len(g) == 2 and twice.labels[g[0]] == 5.0 and twice.labels[g[1]] == 1.0 for g in groups)


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ("train.csv:0", "above 0"),
        ("train.csv:-1", "above 0"),
        ("train.csv:nan", "finite"),
        ("train.csv:inf", "finite"),
        ("train.csv:1e9", "over 100"),
    ],
)
def test_a_bad_weight_is_a_usage_error(tmp_path: Path, source: str, match: str) -> None:
    _csts(tmp_path / "train.csv", 2, "t")
    result = run("train", "head", tmp_path / source, "--out", tmp_path / "head")
    _one_line_error(result, match, 2)
    assert not (tmp_path / "head").exists()


def test_a_tiny_weight_that_takes_no_pair_is_a_one_line_error(tmp_path: Path) -> None:
    from condsearch.train.mixture import TrainSource, read_training

    with pytest.raises(CorpusError, match="takes none of its 2 pairs"):
        read_training([TrainSource(_csts(tmp_path / "t.csv", 2, "t"), 0.01)], seed=0)


def test_train_takes_the_pairs_beside_c_sts_with_a_weight(tiny_bert_dir: Path, tmp_path: Path) -> None:
    table = write_table(tmp_path / "catalogue.parquet", catalogue())
    pairs = tmp_path / "pairs.csv"
    labels = ["--label", "category=kind", "--label", "brand=maker", "--n-pairs", 6]
    assert run("pairs", table, *labels, "--out", pairs).exit_code == 0
    base = _csts(tmp_path / "base.csv", 4, "base")
    out = tmp_path / "head"
    common = ["--out", out, "--model", tiny_bert_dir, "--dim", 4, "--epochs", 1, "--json", "--no-cache"]
    result = run("train", "head", base, f"{pairs}:0.5", *common)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["train_rows"] == 8 + 6  # half of the 6 pairs, two rows each
    assert summary["train_csv"] == "base.csv + pairs.csv:0.5"


def test_full_fine_tuning_takes_a_weighted_file_with_the_contrastive_losses(
    tiny_bert_dir: Path, tmp_path: Path
) -> None:
    base, extra = _csts(tmp_path / "base.csv", 3, "base"), _csts(tmp_path / "extra.csv", 2, "extra")
    out = tmp_path / "model"
    args = ["--out", out, "--model", tiny_bert_dir, "--epochs", 1, "--loss", "mse+quad", "--json"]
    result = run("train", "full", base, f"{extra}:2", *args, "--checkpoint-dir", tmp_path / "ckpt")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["train_rows"] == 6 + 2 * 4 and summary["train_csv"] == "base.csv + extra.csv:2"
