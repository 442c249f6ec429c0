"""`condsearch adapt`: split by id, pairs, training from a start router, the report, resume, bad input as one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from condsearch.cli import main
from condsearch.cli.adapt import more_pairs_hint
from condsearch.errors import CorpusError
from condsearch.metrics import label_precision
from condsearch.train.adapt import AdaptConfig, choose_alpha, split_rows
from condsearch.train.adapt_score import plan_scoring
from condsearch.train.contrast import label_agreement

COLOURS = ["red", "blue", "green"]
ANIMALS = ["cat", "dog", "horse"]
FAST = ["--n-pairs", "24", "--train-batch-size", "8", "--report-rows", "40", "--queries", "10"]


def animals(n: int = 60) -> dict[str, list[object]]:
    """Return n rows with two label columns: every (colour, animal) pair present."""
    colour = [COLOURS[i % 3] for i in range(n)]
    animal = [ANIMALS[(i // 3) % 3] for i in range(n)]
    texts = [f"a {c} {a} runs in the park {i}" for i, (c, a) in enumerate(zip(colour, animal, strict=True))]
    return {"id": [f"r{i}" for i in range(n)], "text": texts, "colour": colour, "animal": animal}


def write(path: Path, table: dict[str, list[object]]) -> Path:
    pq.write_table(pa.table(table), path)
    return path


def run(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def adapt_args(table: Path, out: Path, model: Path, *labels: str) -> list[object]:
    labels = labels or ("colour=the colour", "animal=the kind of animal")
    return [
        "adapt",
        table,
        *[x for lab in labels for x in ("--label", lab)],
        "--out",
        out,
        "--model",
        model,
        "--router",
        "none",
        "--device",
        "cpu",
        *FAST,
    ]


# ----------------------------------------------------------------- pure parts


def test_split_is_by_id_seeded_and_independent_of_row_order() -> None:
    t = animals(200)
    labels = {c: [str(v) for v in t[c]] for c in ("colour", "animal")}
    keys = [str(k) for k in t["id"]]
    config = AdaptConfig()
    a = split_rows(keys, labels, config)  # type: ignore[arg-type]
    held = {keys[i] for i in a.held}
    rev = split_rows(keys[::-1], {c: v[::-1] for c, v in labels.items()}, config)  # type: ignore[arg-type]
    assert {keys[::-1][i] for i in rev.held} == held
    assert 20 < len(held) < 60  # about 20% of 200
    assert not held & {keys[i] for i in a.fit + a.validation}
    other = split_rows(keys, labels, AdaptConfig(seed=1))  # type: ignore[arg-type]
    assert {keys[i] for i in other.held} != held


def test_split_counts_nulls_and_refuses_too_few_rows_or_one_value() -> None:
    t = animals(60)
    labels: dict[str, list[str | None]] = {
        "colour": [str(v) for v in t["colour"]],
        "animal": [str(v) for v in t["animal"]],
    }
    labels["animal"][:5] = [None] * 5
    split = split_rows([str(k) for k in t["id"]], labels, AdaptConfig())
    assert split.nulls == {"colour": 0, "animal": 5}
    with pytest.raises(CorpusError, match="at least 20"):
        split_rows([str(i) for i in range(19)], {"colour": ["a", "b"] * 9 + ["a"]}, AdaptConfig())
    with pytest.raises(CorpusError, match="one value only"):
        split_rows([str(i) for i in range(30)], {"colour": ["a"] * 30}, AdaptConfig())


def test_config_refuses_a_holdout_of_0_or_1() -> None:
    for bad in (0.0, 1.0):
        with pytest.raises(ValueError, match="holdout"):
            AdaptConfig(holdout=bad)


def test_label_agreement_marks_shared_values_under_one_condition_only() -> None:
    values = {("c", "a"): "x", ("c", "b"): "x", ("c", "d"): "y", ("e", "a"): "z", ("e", "b"): "z"}
    mask = label_agreement(["a", "d", "a"], ["b", "b", "b"], ["c", "c", "e"], values)
    assert mask.tolist() == [[True, True, False], [False, False, False], [False, False, True]]


def test_label_precision_leaves_the_query_out_and_plans_share_rows() -> None:
    vectors = np.eye(4, dtype=np.float32)[[0, 0, 1, 1]]
    assert label_precision(vectors, ["a", "a", "b", "b"], [0, 2], k=1) == 1.0
    assert label_precision(vectors, ["a", "b", "a", "b"], [0, 2], k=1) == 0.0
    labels = {"x": ["a", "b"] * 10, "y": [None, "c", "d", "c"] * 5}
    plans = plan_scoring(
        [f"t{i}" for i in range(20)], labels, {"x": "X", "y": "Y"}, list(range(20)), max_rows=8, n_queries=5, seed=0
    )  # type: ignore[arg-type]
    assert [p.column for p in plans] == ["x", "y"]
    assert len(set(plans[0].texts) & set(plans[1].texts)) >= 4  # one seeded order for every column
    assert all(len(p.queries) <= 5 for p in plans)


def test_choose_alpha_takes_the_smallest_within_tolerance() -> None:
    assert choose_alpha({1.0: 0.50, 0.75: 0.499, 0.5: 0.45, 0.0: 0.40}, 0.005) == 0.75
    assert choose_alpha({1.0: 0.30, 0.5: 0.35, 0.0: 0.35}, 0.0) == 0.0


def test_choose_alpha_keeps_a_share_of_the_gain_over_the_start() -> None:
    scores = {1.0: 0.536, 0.75: 0.545, 0.5: 0.528, 0.25: 0.482, 0.0: 0.416}  # foldoc's validation rows
    assert choose_alpha(scores, 0.005) == 0.75  # keep=1: within the tolerance of the best
    assert choose_alpha(scores, 0.005, keep=0.8) == 0.5  # 0.416 + 0.8 * 0.129 = 0.519
    assert choose_alpha(scores, 0.005, keep=0.5) == 0.25
    assert choose_alpha(scores, 0.005, keep=0.0) == 0.0
    assert choose_alpha({1.0: 0.30, 0.5: 0.31, 0.0: 0.33}, 0.005, keep=0.8) == 0.0  # training lost: the start
    with pytest.raises(ValueError, match="wise_keep"):
        AdaptConfig(wise_keep=1.5)


def test_the_report_says_when_more_pairs_or_passes_may_pay() -> None:
    def report(drawn: int, asked: int, fit: int, contrast: int = 0, fill: bool = False) -> dict[str, object]:
        return {
            "pairs": {"pairs": drawn, "contrast": contrast},
            "config": {"n_pairs": asked, "epochs": 2, "fill_plain": fill},
            "rows": {"fit": fit},
        }

    assert "at most 4000 of the 10113 training rows" in more_pairs_hint(report(2000, 2000, 10113))  # edict's
    hint = more_pairs_hint(report(1497, 2000, 9000, contrast=1497))  # news: every contrast pair its columns had
    assert "--fill-plain" in hint and "--epochs" not in hint
    assert "--epochs 4" in more_pairs_hint(report(1497, 2000, 9000))  # one column: every pair the table had
    assert "--epochs 4" in more_pairs_hint(report(1800, 2000, 9000, contrast=1497, fill=True))  # filled, still short
    assert more_pairs_hint(report(2000, 2000, 3500)) == ""  # the pairs cover the table


# ----------------------------------------------------------------- the command, on a tiny model


def test_adapt_writes_a_router_folder_with_its_report_that_loads(tmp_path: Path, tiny_bert_dir: Path) -> None:
    table = write(tmp_path / "t.parquet", animals())
    out = tmp_path / "mine"
    r = run(*adapt_args(table, out, tiny_bert_dir))
    assert r.exit_code == 0, r.output
    assert sorted(os.listdir(out)) == ["report.json", "router.json", "router.safetensors"]
    report = json.loads((out / "report.json").read_text())
    assert set(report["held_p10"]) == {"colour", "animal"}
    for row in report["held_p10"].values():
        assert {"plain", "start_router", "adapted"} <= set(row)
    assert report["pairs"]["contrast"] > 0 and report["rows"]["held"] > 0
    assert "precision@10 on the held rows" in r.output and f"--router {out}" in r.output
    from condsearch import load_model

    model = load_model(str(tiny_bert_dir), mode="csr", router=out, device="cpu")
    vectors = model.encode(["a red cat"], "the colour")
    assert vectors.shape[0] == 1
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    (damaged / "router.json").write_text("{not json")
    with pytest.raises(Exception) as info:
        load_model(str(tiny_bert_dir), mode="csr", router=damaged, device="cpu")
    assert "\n" not in str(info.value)


def test_one_label_column_numbers_and_booleans_work_and_nulls_are_counted(tmp_path: Path, tiny_bert_dir: Path) -> None:
    t = animals()
    t["size"] = [i % 3 for i in range(60)]  # numbers are labels like any other
    t["size"][:4] = [None] * 4
    t["wild"] = [i % 2 == 0 for i in range(60)]
    table = write(tmp_path / "t.parquet", t)
    r = run(*adapt_args(table, tmp_path / "one", tiny_bert_dir, "size=the size"), "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.output.strip().splitlines()[-1])
    assert report["pairs"]["contrast"] == 0 and report["pairs"]["plain"] > 0
    assert report["nulls_skipped"] == {"size": 4}
    r = run(*adapt_args(table, tmp_path / "bool", tiny_bert_dir, "wild=whether it is wild"))
    assert r.exit_code == 0, r.output


def test_adapt_fills_with_alike_and_unlike_pairs_where_contrast_pairs_run_out(
    tmp_path: Path, tiny_bert_dir: Path
) -> None:
    t = animals()
    t["animal"] = [ANIMALS[COLOURS.index(c)] for c in t["colour"]]  # the animal follows the colour: no contrast
    table = write(tmp_path / "t.parquet", t)
    r = run(*adapt_args(table, tmp_path / "contrast", tiny_bert_dir), "--contrast-only")
    assert r.exit_code != 0 and "--fill-plain" in r.output and not (tmp_path / "contrast").exists()
    r = run(*adapt_args(table, tmp_path / "filled", tiny_bert_dir), "--json")  # filling is the default
    assert r.exit_code == 0, r.output
    report = json.loads(r.output.strip().splitlines()[-1])
    assert report["pairs"]["contrast"] == 0 and report["pairs"]["plain"] == 24 and report["config"]["fill_plain"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--holdout", "0"], "holdout"),
        (["--holdout", "1"], "holdout"),
    ],
)
def test_a_holdout_of_0_or_1_is_a_usage_error(
    tmp_path: Path, tiny_bert_dir: Path, change: list[str], message: str
) -> None:
    table = write(tmp_path / "t.parquet", animals())
    r = run(*adapt_args(table, tmp_path / "out", tiny_bert_dir), *change)
    assert r.exit_code == 2 and message in r.output
    assert not (tmp_path / "out").exists()


def test_bad_tables_and_outputs_are_one_line_and_write_nothing(
    tmp_path: Path, tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(table: Path, out: Path, *labels: str) -> str:
        r = run(*adapt_args(table, out, tiny_bert_dir, *labels))
        assert r.exit_code == 1, r.output
        lines = [line for line in r.output.splitlines() if line.startswith("Error")]
        assert len(lines) == 1 and "Traceback" not in r.output
        return lines[0]

    good = write(tmp_path / "t.parquet", animals())
    one = animals()
    one["colour"] = ["red"] * 60
    assert "one value" in refused(write(tmp_path / "one.parquet", one), tmp_path / "o1")
    few = {k: v[:15] for k, v in animals().items()}
    assert "at least 20" in refused(write(tmp_path / "few.parquet", few), tmp_path / "o2")
    r = run(*adapt_args(good, good, tiny_bert_dir))
    assert r.exit_code == 2 and "is a file" in r.output  # click refuses --out naming the table
    assert "holds it" in refused(good, tmp_path)  # a folder holding the table
    indexes = tmp_path / "indexes"
    indexes.mkdir()
    monkeypatch.setenv("CONDSEARCH_INDEX_DIR", str(indexes))
    assert "index folder" in refused(good, indexes / "mine")
    assert "no column" in refused(good, tmp_path / "o3", "nope=the nope")
    for name in ("o1", "o2", "o3"):
        assert not (tmp_path / name).exists()
    assert not (indexes / "mine").exists()


def test_an_interrupted_run_leaves_no_folder_and_the_same_command_continues(
    tmp_path: Path, tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import condsearch.train.router as router_mod

    table = write(tmp_path / "t.parquet", animals())
    out = tmp_path / "mine"
    original = router_mod.save_checkpoint
    calls = {"n": 0}

    def save_then_stop(*args: object, **kwargs: object) -> None:
        original(*args, **kwargs)  # type: ignore[arg-type]
        calls["n"] += 1
        raise KeyboardInterrupt

    monkeypatch.setattr(router_mod, "save_checkpoint", save_then_stop)
    args = [*adapt_args(table, out, tiny_bert_dir), "--epochs", "2"]
    r = run(*args)
    assert r.exit_code != 0 and calls["n"] == 1
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    monkeypatch.setattr(router_mod, "save_checkpoint", original)
    r = run(*args)
    assert r.exit_code == 0, r.output
    assert "continuing from the checkpoint" in r.output
    assert json.loads((out / "report.json").read_text())["history"][-1]["epoch"] == 2


def test_train_router_init_router_needs_the_context_variant(tmp_path: Path) -> None:
    csv = tmp_path / "p.csv"
    csv.write_text("sentence1,sentence2,condition,label\na,b,c,5\n")
    r = run("train", "router", csv, "--init", "router", "--variant", "paper", "--out", tmp_path / "r")
    assert r.exit_code == 2 and "context" in r.output


# ----------------------------------------------------------------- the real router


@pytest.mark.slow
def test_adapt_from_the_shipped_router(tmp_path: Path) -> None:
    table = write(tmp_path / "t.parquet", animals(120))
    out = tmp_path / "mine"
    r = run(
        "adapt",
        table,
        "--label",
        "colour=the colour",
        "--label",
        "animal=the kind of animal",
        "--out",
        out,
        "--n-pairs",
        "60",
        "--device",
        "cpu",
        "--json",
    )
    assert r.exit_code == 0, r.output
    report = json.loads(r.output.strip().splitlines()[-1])
    assert report["start_router"] == "default"
    assert all(np.isfinite(v["adapted"]) for v in report["held_p10"].values())
    r = run("index", table, "-c", "the colour", "--router", out, "--json")
    assert r.exit_code == 0, r.output
