"""End-to-end CLI runs with the tiny BERT: indexing, listing, querying, training, and every bad input."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import click
import pyarrow as pa
import pytest
import torch
from click.testing import CliRunner, Result

from condsearch.base.artifact_files import HEAD_CONFIG as CONFIG_FILE
from condsearch.base.artifact_files import HEAD_WEIGHTS as WEIGHTS_FILE
from condsearch.cli import main
from condsearch.model.artifacts.heads import HeadConfig
from condsearch.model.head import ProjectionHead, save_head
from condsearch.store.folder import INDEX_FILE, MANIFEST, IndexStore
from condsearch.version import __version__
from tests.conftest import SENTENCES

COLOUR = "color of the dress"
SPORT = "the sport being played"


def run(*args: object, input: str | None = None) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def ok(result: Result) -> Result:
    assert result.exit_code == 0, f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    return result


def assert_clean_error(result: Result, code: int = 1, match: str | None = None) -> str:
    """Check a failure is a one-line message with the right exit code and no traceback."""
    assert result.exit_code == code, f"exit {result.exit_code}\n{result.output}\n{result.exception!r}"
    assert isinstance(result.exception, SystemExit), f"traceback: {result.exception!r}"
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    assert result.stderr.rstrip().splitlines()[-1] == errors[0], result.stderr  # nothing follows the one line
    message = errors[0].removeprefix("Error:").strip()
    assert message
    if match is not None:
        assert match in message, message
    return message


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def index_dir(tmp_path: Path) -> Path:
    return tmp_path / "indexes"


@pytest.fixture
def indexed(tiny_bert_dir: Path, corpus_file: Path, index_dir: Path) -> Path:
    """The small corpus indexed under two conditions with the tiny BERT and no head."""
    ok(
        run(
            "index",
            corpus_file,
            "-c",
            COLOUR,
            "-c",
            SPORT,
            "--model",
            tiny_bert_dir,
            "--head",
            "none",
            "--index-dir",
            index_dir,
        )
    )
    return index_dir


def query(index_dir: Path, *args: object, input: str | None = None) -> Result:
    return run("query", *args, "--index-dir", index_dir, input=input)


# ---------------------------------------------------------------- the main job


def test_index_two_conditions(tiny_bert_dir: Path, corpus_file: Path, index_dir: Path) -> None:
    result = ok(
        run(
            "index",
            corpus_file,
            "-c",
            COLOUR,
            "-c",
            SPORT,
            "--model",
            tiny_bert_dir,
            "--head",
            "none",
            "--index-dir",
            index_dir,
        )
    )
    lines = result.stdout.splitlines()
    assert len(lines) == 2
    assert f"indexed {len(SENTENCES)} rows under '{COLOUR}'" in lines[0]
    assert f"under '{SPORT}'" in lines[1] and "(32-d)" in lines[1]
    assert "pairs in" in result.stderr  # the rate goes to stderr, not stdout
    store = IndexStore(index_dir)
    assert len(store.names()) == 2
    stored = store.load(store.find(COLOUR))
    m = stored.manifest
    assert m.model_id == str(tiny_bert_dir.resolve()) and m.head == "none" and m.dim == 32
    assert m.corpus_name == "corpus" and m.n_vectors == len(SENTENCES) and m.factory == "Flat"
    assert stored.ids == [f"s{i}" for i in range(len(SENTENCES))] and stored.texts == SENTENCES


def test_index_json_output(tiny_bert_dir: Path, corpus_file: Path, index_dir: Path) -> None:
    result = ok(
        run(
            "index",
            corpus_file,
            "-c",
            COLOUR,
            "--model",
            tiny_bert_dir,
            "--head",
            "none",
            "--index-dir",
            index_dir,
            "--json",
        )
    )
    [row] = json_lines(result.stdout)
    assert set(row) == {
        *("index", "condition", "rows", "dim", "model", "mode", "head", "path"),
        *("factory", "search_params", "encoded", "reused", "backend", "precision"),
    }
    assert row["backend"] == ("onnxruntime" if not torch.cuda.is_available() else "torch")
    assert row["precision"] == "float32"  # the tests pin the CPU kind with no bfloat16 products
    assert (row["factory"], row["search_params"], row["encoded"], row["reused"]) == ("Flat", "", len(SENTENCES), 0)
    assert row["condition"] == COLOUR and row["rows"] == len(SENTENCES) and row["dim"] == 32
    assert Path(row["path"]) == index_dir / row["index"]


def test_index_dir_from_environment(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONDSEARCH_INDEX_DIR", str(tmp_path / "from-env"))
    ok(run("index", corpus_file, "-c", COLOUR, "--model", tiny_bert_dir, "--head", "none"))
    assert len(IndexStore(tmp_path / "from-env").names()) == 1
    assert "rows=8" in ok(run("list")).stdout


def test_list(indexed: Path, tiny_bert_dir: Path) -> None:
    lines = ok(run("list", "--index-dir", indexed)).stdout.splitlines()
    assert len(lines) == 2
    assert any(line.startswith(f"'{COLOUR}'") for line in lines)
    assert all("rows=8" in line and "head=none" in line and "dim=32" in line for line in lines)


def test_list_json(indexed: Path, tiny_bert_dir: Path) -> None:
    rows = json_lines(ok(run("list", "--json", "--index-dir", indexed)).stdout)
    assert len(rows) == 2
    assert {r["condition"] for r in rows} == {COLOUR, SPORT}
    for r in rows:
        keys = {"index", "condition", "corpus", "mode", "rows", "model", "head", "router", "dim", "factory"}
        assert set(r) == keys | {"score_background"} and r["router"] is None  # a CASE index has no router
        assert r["score_background"]["sample_rows"] == 8 and r["score_background"]["pairs"] == 28
        assert (r["corpus"], r["rows"], r["model"], r["head"], r["dim"], r["factory"]) == (
            "corpus",
            8,
            str(tiny_bert_dir.resolve()),
            "none",
            32,
            "Flat",
        )


def test_list_empty(tmp_path: Path) -> None:
    result = ok(run("list", "--index-dir", tmp_path / "none"))
    assert result.stdout == "" and "no indexes" in result.stderr
    assert ok(run("list", "--json", "--index-dir", tmp_path / "none")).stdout == ""


def test_list_reports_unreadable_index(indexed: Path) -> None:
    victim = sorted(p for p in indexed.iterdir() if not p.name.startswith("."))[0]
    (victim / MANIFEST).write_text("{garbage")
    text = ok(run("list", "--index-dir", indexed)).stdout
    assert f"{victim.name}: unreadable" in text
    rows = json_lines(ok(run("list", "--json", "--index-dir", indexed)).stdout)
    assert sum("error" in r for r in rows) == 1 and sum("condition" in r for r in rows) == 1


def test_query_json_shape(indexed: Path) -> None:
    result = ok(query(indexed, "A girl in an orange dress serves the ball", "-c", COLOUR, "-k", 3, "--json"))
    [row] = json_lines(result.stdout)
    assert set(row) == {"query", "condition", "results"}
    assert row["query"] == "A girl in an orange dress serves the ball" and row["condition"] == COLOUR
    assert len(row["results"]) == 3
    for i, hit in enumerate(row["results"]):
        assert set(hit) == {"rank", "id", "score", "text"}
        assert hit["rank"] == i + 1
        assert hit["text"] == SENTENCES[int(hit["id"][1:])]
        assert isinstance(hit["score"], float) and -1.0001 <= hit["score"] <= 1.0001
    scores = [hit["score"] for hit in row["results"]]
    assert scores == sorted(scores, reverse=True)
    assert len({hit["id"] for hit in row["results"]}) == 3


@pytest.mark.parametrize("condition", [COLOUR, SPORT])
def test_corpus_sentence_finds_itself(indexed: Path, condition: str) -> None:
    result = ok(query(indexed, SENTENCES[2], SENTENCES[6], "-c", condition, "-k", len(SENTENCES), "--json"))
    rows = json_lines(result.stdout)
    assert [r["query"] for r in rows] == [SENTENCES[2], SENTENCES[6]]
    assert [r["results"][0]["id"] for r in rows] == ["s2", "s6"]
    assert all(r["results"][0]["score"] == pytest.approx(1.0, abs=1e-4) for r in rows)
    assert all(len(r["results"]) == len(SENTENCES) for r in rows)


def test_conditions_rank_differently(indexed: Path) -> None:
    q = "A girl in an orange dress serves the ball"
    colour = json_lines(ok(query(indexed, q, "-c", COLOUR, "-k", 8, "--json")).stdout)[0]
    sport = json_lines(ok(query(indexed, q, "-c", SPORT, "-k", 8, "--json")).stdout)[0]
    assert [h["score"] for h in colour["results"]] != [h["score"] for h in sport["results"]]


def test_query_text_output(indexed: Path) -> None:
    out = ok(query(indexed, SENTENCES[0], "-c", COLOUR, "-k", 2)).stdout.splitlines()
    assert out[0] == f"query: {SENTENCES[0]}" and out[1] == f"condition: {COLOUR}"
    rank, score, id_, text = out[2].split(None, 3)
    assert (rank, id_, text) == ("1", "s0", SENTENCES[0]) and float(score) == pytest.approx(1.0, abs=1e-3)
    assert out[3].split()[0] == "2" and len(out) == 4


def test_queries_from_stdin(indexed: Path) -> None:
    stdin = f"{SENTENCES[1]}\n\n   \n{SENTENCES[4]}\n"
    rows = json_lines(ok(query(indexed, "-", "-c", COLOUR, "-k", 1, "--json", input=stdin)).stdout)
    assert [r["query"] for r in rows] == [SENTENCES[1], SENTENCES[4]]
    assert [r["results"][0]["id"] for r in rows] == ["s1", "s4"]


def test_queries_from_file(indexed: Path, tmp_path: Path) -> None:
    qfile = tmp_path / "queries.txt"
    qfile.write_text(f"{SENTENCES[3]}\n\n{SENTENCES[7]}\n", encoding="utf-8")
    rows = json_lines(ok(query(indexed, SENTENCES[5], "--file", qfile, "-c", SPORT, "-k", 1, "--json")).stdout)
    assert [r["query"] for r in rows] == [SENTENCES[5], SENTENCES[3], SENTENCES[7]]
    assert [r["results"][0]["id"] for r in rows] == ["s5", "s3", "s7"]


def test_int_ids_come_back_as_ints(tiny_bert_dir: Path, write_corpus, index_dir: Path) -> None:
    path = write_corpus({"key": [100, 200, 300], "caption": SENTENCES[:3]}, name="ints.parquet")
    ok(
        run(
            "index",
            path,
            "-c",
            COLOUR,
            "--text-column",
            "caption",
            "--id-column",
            "key",
            "--model",
            tiny_bert_dir,
            "--index-dir",
            index_dir,
        )
    )
    [row] = json_lines(ok(query(index_dir, SENTENCES[1], "-c", COLOUR, "-k", 1, "--json")).stdout)
    assert row["results"][0]["id"] == 200


def test_skipped_texts_are_reported(tiny_bert_dir: Path, write_corpus, index_dir: Path) -> None:
    path = write_corpus(text=["a red dress", None, " ", "a blue dress"])
    result = ok(run("index", path, "-c", COLOUR, "--model", tiny_bert_dir, "--index-dir", index_dir))
    assert "skipped 2 null or blank text(s)" in result.stderr
    assert "indexed 2 rows" in result.stdout


def test_reindex_replaces(tiny_bert_dir: Path, write_corpus, indexed: Path) -> None:
    write_corpus({"id": ["n0", "n1"], "text": ["a green hat", "a pink coat"]})  # same file name: same corpus
    ok(run("index", indexed.parent / "corpus.parquet", "-c", COLOUR, "--model", tiny_bert_dir, "--index-dir", indexed))
    rows = {r["condition"]: r for r in json_lines(ok(run("list", "--json", "--index-dir", indexed)).stdout)}
    assert rows[COLOUR]["rows"] == 2 and rows[SPORT]["rows"] == 8
    assert sorted(p.name for p in indexed.iterdir() if p.name.startswith(".")) == [".versions"]  # no temporaries
    assert all(len(list(v.iterdir())) == 1 for v in (indexed / ".versions").iterdir() if v.is_dir())  # no old versions


def test_same_condition_in_two_corpora(tiny_bert_dir: Path, write_corpus, index_dir: Path) -> None:
    a = write_corpus(text=SENTENCES[:3], name="a.parquet")
    b = write_corpus(text=SENTENCES[3:], name="b.parquet")
    for path in (a, b):
        ok(run("index", path, "-c", COLOUR, "--model", tiny_bert_dir, "--index-dir", index_dir))
    assert_clean_error(query(index_dir, "q", "-c", COLOUR, "-k", 1), match="several corpora")
    [row] = json_lines(ok(query(index_dir, SENTENCES[4], "-c", COLOUR, "--corpus", "b", "-k", 1, "--json")).stdout)
    assert row["results"][0]["text"] == SENTENCES[4]


def test_path_shaped_condition_stays_inside_index_dir(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    index_dir = tmp_path / "a" / "b" / "indexes"
    condition = "../../etc/passwd"
    result = ok(
        run("index", corpus_file, "-c", condition, "--model", tiny_bert_dir, "--index-dir", index_dir, "--json")
    )
    [row] = json_lines(result.stdout)
    [entry] = [p for p in index_dir.iterdir() if not p.name.startswith(".")]
    assert entry.is_dir() and Path(row["path"]).parent.resolve() == index_dir.resolve()
    assert entry.resolve().is_relative_to(index_dir.resolve())  # its versions live inside index_dir too
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b"]
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["indexes"]
    assert not (tmp_path / "etc").exists()
    [hit] = json_lines(ok(query(index_dir, SENTENCES[0], "-c", condition, "-k", 1, "--json")).stdout)
    assert hit["condition"] == condition and hit["results"][0]["id"] == "s0"


def test_non_ascii_condition_and_query(tiny_bert_dir: Path, corpus_file: Path, index_dir: Path) -> None:
    condition = "Farbe des Kleides — 颜色"
    ok(run("index", corpus_file, "-c", condition, "--model", tiny_bert_dir, "--index-dir", index_dir))
    q = "Ein Mädchen im orangefarbenen Kleid schlägt auf 🎾"
    result = ok(query(index_dir, q, "-c", condition, "-k", 2, "--json"))
    assert q in result.stdout and condition.lower() in result.stdout  # JSON keeps the characters
    [row] = json_lines(result.stdout)
    assert row["query"] == q and len(row["results"]) == 2
    assert row["condition"] == "farbe des kleides — 颜色"  # its normal form: the tiny BERT is uncased (issue 58)


def test_very_long_query_is_truncated_with_a_notice(indexed: Path, caplog: pytest.LogCaptureFixture) -> None:
    q = " ".join(["a girl in an orange dress serves the ball"] * 300)
    [row] = json_lines(ok(query(indexed, q, "-c", COLOUR, "-k", 3, "--json")).stdout)
    assert len(row["results"]) == 3
    assert "truncated" in caplog.text


def test_query_uses_the_index_max_length(tiny_bert_dir: Path, corpus_file: Path, index_dir: Path) -> None:
    ok(run("index", corpus_file, "-c", COLOUR, "--model", tiny_bert_dir, "--max-length", 16, "--index-dir", index_dir))
    # the sentence is longer than 16 tokens; it only finds itself with cosine 1 if cut the same way
    [row] = json_lines(ok(query(index_dir, SENTENCES[0], "-c", COLOUR, "-k", 2, "--json")).stdout)
    assert row["results"][0]["id"] == "s0"
    assert row["results"][0]["score"] == pytest.approx(1.0, abs=1e-4)


def test_query_with_the_same_model_spelled_differently(indexed: Path, tiny_bert_dir: Path, monkeypatch) -> None:
    monkeypatch.chdir(tiny_bert_dir.parent)
    for spelling in (tiny_bert_dir, f"{tiny_bert_dir}/", tiny_bert_dir.name, f"./{tiny_bert_dir.name}"):
        [row] = json_lines(
            ok(query(indexed, SENTENCES[1], "-c", COLOUR, "-k", 1, "--json", "--model", spelling)).stdout
        )
        assert row["results"][0]["id"] == "s1"
    ok(query(indexed, SENTENCES[1], "-c", COLOUR, "-k", 1, "--head", "none"))


def test_index_dir_that_is_a_file_is_usage_error(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert_clean_error(
        run("index", corpus_file, "-c", COLOUR, "--model", tiny_bert_dir, "--index-dir", tmp_path / "file"), code=2
    )
    assert_clean_error(run("list", "--index-dir", tmp_path / "file"), code=2)


def test_train_then_index_with_the_head(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    rows = [
        ("a girl in a red dress", "a woman in a red dress", COLOUR, 5),
        ("a girl in a red dress", "a woman in a blue dress", COLOUR, 1),
        ("a man in a green hat", "a boy in a green shirt", "the color", 4),
        ("a man in a green hat", "a man in a black hat", "the color", 2),
        ("two men play soccer", "a boy plays soccer", SPORT, 5),
        ("two men play soccer", "a girl plays tennis", SPORT, 1),
        ("a dog runs on the beach", "a dog walks in the park", "the animal", 4),
        ("a dog runs on the beach", "a cat runs on the beach", "the animal", 2),
        ("a girl plays golf", "a man plays golf", SPORT, 5),
        ("a girl plays golf", "a girl swims in the pool", SPORT, 2),
        ("a red car", "a blue bus", "the vehicle", -1),
        ("a yellow dress", "a yellow skirt", COLOUR, 4),
    ]
    csv_path = tmp_path / "train.csv"
    csv_path.write_text("sentence1,sentence2,condition,label\n" + "".join(f"{a},{b},{c},{y}\n" for a, b, c, y in rows))
    head_dir = tmp_path / "head"
    result = ok(
        run(
            "train",
            csv_path,
            "--out",
            head_dir,
            "--dev",
            csv_path,
            "--dim",
            8,
            "--epochs",
            3,
            "--train-batch-size",
            4,
            "--model",
            tiny_bert_dir,
            "--json",
        )
    )
    summary = json.loads(result.stdout)
    assert summary["dim"] == 8 and summary["train_rows"] == 11 and 1 <= summary["best_epoch"] <= 3
    assert len(summary["checksum"]) == 64
    assert result.stderr.count("epoch ") >= 3
    assert sorted(p.name for p in head_dir.iterdir()) == [CONFIG_FILE, WEIGHTS_FILE]
    meta = json.loads((head_dir / CONFIG_FILE).read_text())
    assert (meta["input_dim"], meta["dim"], meta["model_id"]) == (32, 8, str(tiny_bert_dir.resolve()))

    index_dir = tmp_path / "indexes"
    [row] = json_lines(
        ok(
            run(
                "index",
                corpus_file,
                "-c",
                COLOUR,
                "--model",
                tiny_bert_dir,
                "--head",
                head_dir,
                "--index-dir",
                index_dir,
                "--json",
            )
        ).stdout
    )
    assert row["dim"] == 8 and row["head"] == str(head_dir.resolve())
    m = IndexStore(index_dir).read_manifest(row["index"])
    assert m.head_checksum == summary["checksum"]
    # the query picks up model and head from the manifest
    [hit] = json_lines(ok(query(index_dir, SENTENCES[0], "-c", COLOUR, "-k", 1, "--json")).stdout)
    assert hit["results"][0]["id"] == "s0"

    # a second training run reads the encoder outputs from the cache and gives the same head
    again = json.loads(
        ok(
            run(
                "train",
                csv_path,
                "--out",
                tmp_path / "head2",
                "--dev",
                csv_path,
                "--dim",
                8,
                "--epochs",
                3,
                "--train-batch-size",
                4,
                "--model",
                tiny_bert_dir,
                "--json",
            )
        ).stdout
    )
    assert again["checksum"] == summary["checksum"]


def test_train_text_output(tiny_bert_dir: Path, tmp_path: Path) -> None:
    csv_path = tmp_path / "t.csv"
    csv_path.write_text(
        "sentence1,sentence2,condition,label\na red dress,a blue dress,colour,2\na red hat,a red coat,colour,5\n"
    )
    out = ok(
        run(
            "train",
            csv_path,
            "--out",
            tmp_path / "h",
            "--dim",
            4,
            "--epochs",
            1,
            "--model",
            tiny_bert_dir,
            "--no-cache",
        )
    ).stdout
    assert out.startswith(f"wrote {tmp_path / 'h'} (4-d head)")


def test_demo_corpus(tmp_path: Path) -> None:
    from condsearch.corpus.reader import read_corpus

    out = tmp_path / "sub" / "demo.parquet"
    result = ok(run("demo-corpus", out))
    corpus = read_corpus(out)
    assert result.stdout.strip() == f"wrote {len(corpus)} rows to {out}"
    assert len(corpus) >= 20 and corpus.n_skipped == 0
    assert any("orange dress" in t for t in corpus.texts) and any("tennis" in t for t in corpus.texts)


# ---------------------------------------------------------------- bad input: one line, exit 1 (2 for usage)


def test_missing_corpus_file(tiny_bert_dir: Path, tmp_path: Path) -> None:
    assert_clean_error(
        run("index", tmp_path / "nope.parquet", "-c", COLOUR, "--model", tiny_bert_dir, "--index-dir", tmp_path / "i"),
        match="no such file",
    )


def test_non_parquet_corpus(tiny_bert_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "corpus.parquet"  # a CSV file read as what its extension says (corpus.csv is read as CSV)
    path.write_text("id,text\n1,hello\n")
    assert_clean_error(
        run("index", path, "-c", COLOUR, "--model", tiny_bert_dir, "--index-dir", tmp_path / "i"),
        match="not a readable parquet file",
    )


def test_missing_text_column(tiny_bert_dir: Path, write_corpus, tmp_path: Path) -> None:
    path = write_corpus(id=["a"], caption=["hello"])
    msg = assert_clean_error(
        run("index", path, "-c", COLOUR, "--model", tiny_bert_dir, "--index-dir", tmp_path / "i"),
        match="no column 'text'",
    )
    assert "caption" in msg


def test_empty_corpus(tiny_bert_dir: Path, write_corpus, tmp_path: Path) -> None:
    path = write_corpus({"text": pa.array([], type=pa.string())})
    assert_clean_error(
        run("index", path, "-c", COLOUR, "--model", tiny_bert_dir, "--index-dir", tmp_path / "i"),
        match="no non-empty texts",
    )


def test_duplicate_ids(tiny_bert_dir: Path, write_corpus, tmp_path: Path) -> None:
    path = write_corpus(id=["a", "b", "a"], text=["x", "y", "z"])
    assert_clean_error(
        run("index", path, "-c", COLOUR, "--model", tiny_bert_dir, "--index-dir", tmp_path / "i"),
        match="duplicate id 'a'",
    )


@pytest.mark.parametrize("condition", ["", "   "])
def test_empty_condition_when_indexing(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, condition: str) -> None:
    assert_clean_error(
        run(
            "index", corpus_file, "-c", COLOUR, "-c", condition, "--model", tiny_bert_dir, "--index-dir", tmp_path / "i"
        ),
        match="condition is empty",
    )
    assert not (tmp_path / "i").exists()  # refused before any work


def test_missing_condition_option_is_usage_error(corpus_file: Path) -> None:
    assert_clean_error(run("index", corpus_file), code=2)


@pytest.mark.parametrize(
    "factory, match",
    [
        ("NotAFactory", "not supported"),
        ("IVF64,Flat", "too few"),
        ("IDMap2,Flat", "not supported"),  # a traceback from FAISS once every row was encoded
        ("NSG4", "not supported"),
        # HNSW0, HNSW1 and PQ4x0 ended the process inside FAISS: tested in a subprocess in test_ann.py
        ("HNSW32,PQ5", "must divide"),
    ],
)
def test_bad_index_factory(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, factory: str, match: str) -> None:
    assert_clean_error(
        run(
            "index",
            corpus_file,
            "-c",
            COLOUR,
            "--model",
            tiny_bert_dir,
            "--index-factory",
            factory,
            "--index-dir",
            tmp_path / "i",
        ),
        match=match,
    )
    assert not (tmp_path / "i").exists() or not any((tmp_path / "i").iterdir())


@pytest.mark.parametrize(
    "factory, params, match",
    [
        ("HNSW8", "efSearch=99999999999999999999", "at most"),  # wrapped negative: one result per query
        ("HNSW8", "efSearch=1000000000", "at most"),  # every later query failed with bad_alloc
        ("IVF4,Flat", "nprobe=5", "only 4 lists"),
        ("HNSW8", "ht=4", "name among"),
    ],
)
def test_search_params_out_of_range_are_one_line(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path, factory: str, params: str, match: str
) -> None:
    argv = ["index", corpus_file, "-c", COLOUR, "--model", tiny_bert_dir, "--index-dir", tmp_path / "i"]
    assert_clean_error(run(*argv, "--index-factory", factory, "--search-params", params), match=match)


def test_k_of_every_row_from_an_approximate_index_returns_every_row(
    tiny_bert_dir: Path, write_corpus, index_dir: Path
) -> None:
    # IVF probing one of 4 lists found ~10 of 40 rows, yet the notice said "returning all 40"
    texts = [f"{s} number {i}" for i, s in enumerate(SENTENCES * 5)]
    path = write_corpus(id=[f"r{i}" for i in range(40)], text=texts)
    argv = ["--model", tiny_bert_dir, "--index-dir", index_dir, "--index-factory", "IVF4,Flat"]
    ok(run("index", path, "-c", COLOUR, *argv, "--search-params", "nprobe=1"))
    for k in (40, 100, 25):
        result = ok(query(index_dir, SENTENCES[0], "-c", COLOUR, "-k", k, "--json"))
        [row] = json_lines(result.stdout)
        ids = [r["id"] for r in row["results"]]
        assert len(ids) == len(set(ids)) == min(k, 40)
        assert ("returning all 40" in result.stderr) == (k > 40)


def _typed_corpus(tmp_path: Path, ids: pa.Array) -> Path:
    import pyarrow.parquet as pq

    path = tmp_path / "typed.parquet"
    pq.write_table(pa.table({"id": ids, "text": SENTENCES[:3]}), path)
    return path


@pytest.mark.parametrize(
    "ids, named",
    [
        (pa.array([[1], [2], [3]]), "list"),
        (pa.array([{"a": 1}, {"a": 2}, {"a": 3}]), "struct"),
        (pa.array([1, 2, 2**64 - 1], type=pa.uint64()), "64-bit"),  # crashed once every row was encoded
        (pa.array([b"a", b"b", b"c"]), "binary"),  # indexed, then broke query --json
        (pa.array([float("nan"), float("nan"), 1.0]), "double"),  # passed the duplicate check, printed NaN
        (pa.array([1, 2, 3], type=pa.timestamp("s")), "timestamp"),
    ],
)
def test_id_columns_of_other_types_are_one_line_errors(
    tiny_bert_dir: Path, tmp_path: Path, ids: pa.Array, named: str
) -> None:
    argv = ["index", _typed_corpus(tmp_path, ids), "-c", COLOUR, "--model", tiny_bert_dir]
    message = assert_clean_error(run(*argv, "--index-dir", tmp_path / "i"), match=named)
    assert "strings or integers" in message or "64-bit" in message
    assert not (tmp_path / "i").exists()


def test_dictionary_encoded_texts_and_ids_are_indexed(tiny_bert_dir: Path, tmp_path: Path, index_dir: Path) -> None:
    # pandas writes its `category` dtype as a dictionary column; it was refused as "does not hold strings"
    import pyarrow.parquet as pq

    path = tmp_path / "category.parquet"
    table = pa.table({"id": pa.array(["a", "b", "c"]).dictionary_encode(), "text": pa.array(SENTENCES[:3])})
    pq.write_table(table.set_column(1, "text", pa.array(SENTENCES[:3]).dictionary_encode()), path)
    ok(run("index", path, "-c", COLOUR, "--model", tiny_bert_dir, "--index-dir", index_dir))
    [row] = json_lines(ok(query(index_dir, SENTENCES[1], "-c", COLOUR, "-k", 1, "--json")).stdout)
    assert row["results"][0]["id"] == "b" and row["results"][0]["text"] == SENTENCES[1]


@pytest.mark.parametrize(
    "where",
    ["query", "condition", "corpus", "index-condition", "model"],
)
def test_arguments_that_are_not_utf8_are_usage_errors(
    indexed: Path, corpus_file: Path, tiny_bert_dir: Path, where: str
) -> None:
    # `condsearch query $'\xff' ...`: Python hands an undecodable byte over as a lone surrogate
    bad = "caf\udce9"
    argv = {
        "query": ["query", bad, "-c", COLOUR, "--index-dir", indexed],
        "condition": ["query", "q", "-c", bad, "--index-dir", indexed],
        "corpus": ["query", "q", "-c", COLOUR, "--corpus", bad, "--index-dir", indexed],
        "index-condition": ["index", corpus_file, "-c", bad, "--model", tiny_bert_dir, "--index-dir", indexed],
        "model": ["index", corpus_file, "-c", COLOUR, "--model", bad, "--index-dir", indexed],
    }[where]
    assert_clean_error(run(*argv), code=2, match="not valid UTF-8")


def test_queries_from_stdin_that_are_not_utf8_are_one_line(indexed: Path) -> None:
    result = CliRunner().invoke(main, ["query", "-", "-c", COLOUR, "--index-dir", str(indexed)], input=b"caf\xe9\n")
    assert_clean_error(result, match="UTF-8")


def test_missing_model_folder(corpus_file: Path, tmp_path: Path) -> None:
    assert_clean_error(
        run("index", corpus_file, "-c", COLOUR, "--model", tmp_path / "no-model", "--index-dir", tmp_path / "i"),
        match="no such model folder",
    )


def test_unknown_hub_model_offline(corpus_file: Path, tmp_path: Path) -> None:
    assert_clean_error(
        run(
            "index",
            corpus_file,
            "-c",
            COLOUR,
            "--model",
            "no-such-org/no-such-model-xyz",
            "--index-dir",
            tmp_path / "i",
        ),
        match="cannot load model",
    )


def test_head_folder_that_is_not_a_head(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    (tmp_path / "not-a-head").mkdir()
    assert_clean_error(
        run(
            "index",
            corpus_file,
            "-c",
            COLOUR,
            "--model",
            tiny_bert_dir,
            "--head",
            tmp_path / "not-a-head",
            "--index-dir",
            tmp_path / "i",
        ),
        match="not a condsearch head",
    )


@pytest.mark.parametrize(
    ("head", "match"),
    [("default", "trained for sentence-transformers/all-MiniLM-L6-v2"), ("frozen", "384-d inputs")],
)
def test_shipped_heads_on_another_model(
    head: str, match: str, tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    # the default carries a LoRA adapter (refused for another model), frozen only a head (wrong width)
    assert_clean_error(
        run(
            "index", corpus_file, "-c", COLOUR, "--model", tiny_bert_dir, "--head", head, "--index-dir", tmp_path / "i"
        ),
        match=match,
    )


def test_unknown_condition(indexed: Path) -> None:
    msg = assert_clean_error(query(indexed, "q", "-c", "the mood"), match="no index for condition 'the mood'")
    assert COLOUR in msg and SPORT in msg


def test_query_with_no_indexes(tmp_path: Path) -> None:
    assert_clean_error(query(tmp_path / "empty", "q", "-c", COLOUR), match="indexed: none")


@pytest.mark.parametrize("k", [0, -3])
def test_non_positive_k_is_usage_error(indexed: Path, k: int) -> None:
    assert_clean_error(query(indexed, "q", "-c", COLOUR, "-k", k), code=2, match="positive")


def test_k_larger_than_corpus_returns_every_row_with_a_notice(indexed: Path) -> None:
    # as sentence-transformers' semantic_search does (and the server, which marks it in its JSON)
    result = ok(query(indexed, "q", "-c", COLOUR, "-k", 9, "--json"))
    [row] = json_lines(result.stdout)
    assert len(row["results"]) == len(SENTENCES)
    assert "k=9 is larger than the index (8 rows); returning all 8" in result.stderr


def test_k_not_a_number_is_usage_error(indexed: Path) -> None:
    assert_clean_error(query(indexed, "q", "-c", COLOUR, "-k", "many"), code=2)


@pytest.mark.parametrize("condition", ["", "  "])
def test_empty_condition_when_querying(indexed: Path, condition: str) -> None:
    assert_clean_error(query(indexed, "q", "-c", condition), match="condition is empty")


def test_empty_query(indexed: Path) -> None:
    assert_clean_error(query(indexed, "   ", "-c", COLOUR, "-k", 1), match="query is empty")


def test_no_query_is_usage_error(indexed: Path) -> None:
    assert_clean_error(query(indexed, "-c", COLOUR), code=2)
    assert_clean_error(query(indexed, "-", "-c", COLOUR, input="\n\n"), code=2)


def test_missing_query_file(indexed: Path, tmp_path: Path) -> None:
    assert_clean_error(query(indexed, "--file", tmp_path / "nope.txt", "-c", COLOUR), match="cannot read queries")


def test_query_file_not_utf8(indexed: Path, tmp_path: Path) -> None:
    path = tmp_path / "q.txt"
    path.write_bytes(b"\xff\xfe\xfa bad bytes\n")
    assert_clean_error(query(indexed, "--file", path, "-c", COLOUR), match="cannot read queries")


def test_corrupted_index_file(indexed: Path) -> None:
    store = IndexStore(indexed)
    path = indexed / store.find(COLOUR) / INDEX_FILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    assert_clean_error(query(indexed, "q", "-c", COLOUR, "-k", 1), match="damaged")
    ok(query(indexed, "q", "-c", SPORT, "-k", 1))  # the other index is untouched


def test_garbage_manifest(indexed: Path) -> None:
    store = IndexStore(indexed)
    name = store.find(COLOUR)
    (indexed / name / MANIFEST).write_text("not json at all")
    # the condition is now unknown (its manifest cannot be read), said in one line
    assert_clean_error(query(indexed, "q", "-c", COLOUR, "-k", 1))
    assert_clean_error(query(indexed, "q", "-c", COLOUR, "--corpus", "corpus", "-k", 1), match="corrupt manifest")


def test_query_with_another_model(indexed: Path, other_bert_dir: Path) -> None:
    assert_clean_error(
        query(indexed, "q", "-c", COLOUR, "-k", 1, "--model", other_bert_dir), match="was built with model"
    )


def test_query_after_model_folder_changed(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, model)
    index_dir = tmp_path / "i"
    ok(run("index", corpus_file, "-c", COLOUR, "--model", model, "--index-dir", index_dir))
    config = json.loads((model / "config.json").read_text())
    config["layer_norm_eps"] = 1e-3
    (model / "config.json").write_text(json.dumps(config))
    assert_clean_error(query(index_dir, "q", "-c", COLOUR, "-k", 1), match="re-index")


def test_query_after_weights_replaced_in_place(
    tiny_bert_dir: Path, other_bert_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, model)
    index_dir = tmp_path / "i"
    ok(run("index", corpus_file, "-c", COLOUR, "--model", model, "--index-dir", index_dir))
    shutil.copy(other_bert_dir / "model.safetensors", model / "model.safetensors")  # retrained: same size
    assert_clean_error(query(index_dir, "q", "-c", COLOUR, "-k", 1), match="re-index")


def test_query_after_model_folder_removed(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_bert_dir, model)
    index_dir = tmp_path / "i"
    ok(run("index", corpus_file, "-c", COLOUR, "--model", model, "--index-dir", index_dir))
    shutil.rmtree(model)
    assert_clean_error(query(index_dir, "q", "-c", COLOUR, "-k", 1), match="no such model folder")


def test_query_with_default_head_on_index_without_head(indexed: Path) -> None:
    assert_clean_error(query(indexed, "q", "-c", COLOUR, "-k", 1, "--head", "default"))


def test_query_with_a_head_the_index_was_not_built_with(indexed: Path, tiny_bert_dir: Path, tmp_path: Path) -> None:
    save_head(ProjectionHead(HeadConfig(input_dim=32, dim=4)), tmp_path / "head32")
    assert_clean_error(
        query(indexed, "q", "-c", COLOUR, "-k", 1, "--head", tmp_path / "head32"), match="was built with head none"
    )
    save_head(ProjectionHead(HeadConfig(input_dim=64, dim=4)), tmp_path / "head64")
    assert_clean_error(query(indexed, "q", "-c", COLOUR, "-k", 1, "--head", tmp_path / "head64"), match="64-d inputs")


def test_query_after_head_retrained(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    save_head(ProjectionHead(HeadConfig(input_dim=32, dim=4)), tmp_path / "head")
    index_dir = tmp_path / "i"
    ok(
        run(
            "index",
            corpus_file,
            "-c",
            COLOUR,
            "--model",
            tiny_bert_dir,
            "--head",
            tmp_path / "head",
            "--index-dir",
            index_dir,
        )
    )
    torch.manual_seed(1)
    save_head(ProjectionHead(HeadConfig(input_dim=32, dim=4)), tmp_path / "head")
    assert_clean_error(query(index_dir, "q", "-c", COLOUR, "-k", 1), match="sha256")


def test_indexing_killed_half_way_keeps_earlier_index(
    tiny_bert_dir: Path, write_corpus, indexed: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_corpus({"id": ["n0", "n1", "n2"], "text": ["a green hat", "a pink coat", "a man plays golf"]})
    import condsearch.store.folder as store_module

    real_write = store_module.pq.write_table
    calls = []

    def write_table(*args, **kwargs):
        calls.append(args)
        if len(calls) == 2:  # the second condition's rows: the process dies here
            raise KeyboardInterrupt
        return real_write(*args, **kwargs)

    monkeypatch.setattr(store_module.pq, "write_table", write_table)
    result = run(
        "index",
        indexed.parent / "corpus.parquet",
        "-c",
        COLOUR,
        "-c",
        SPORT,
        "--model",
        tiny_bert_dir,
        "--index-dir",
        indexed,
    )
    monkeypatch.undo()
    assert result.exit_code != 0 and len(calls) == 2
    store = IndexStore(indexed)
    assert sorted(p.name for p in indexed.iterdir() if not p.name.startswith(".")) == store.names()  # no stray ones
    assert store.load(store.find(COLOUR)).ids == ["n0", "n1", "n2"]  # written before the kill
    assert store.load(store.find(SPORT)).ids == [f"s{i}" for i in range(8)]  # the earlier index survives
    [row] = json_lines(ok(query(indexed, SENTENCES[3], "-c", SPORT, "-k", 1, "--json")).stdout)
    assert row["results"][0]["id"] == "s3"


def test_crash_recovery_through_the_cli_with_corpus(indexed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = IndexStore(indexed)
    name = store.find(COLOUR)
    (indexed / name).rename(indexed / f".trash-{name}-1-1")  # an older condsearch killed between its two renames
    ok(query(indexed, "q", "-c", COLOUR, "--corpus", "corpus", "-k", 1))
    assert not (indexed / name).exists()  # read where it lies: readers never rename


def test_crash_recovery_through_the_cli(indexed: Path) -> None:
    store = IndexStore(indexed)
    name = store.find(COLOUR)
    (indexed / name).rename(indexed / f".trash-{name}-1-1")
    ok(query(indexed, "q", "-c", COLOUR, "-k", 1))


def test_train_missing_csv(tiny_bert_dir: Path, tmp_path: Path) -> None:
    assert_clean_error(
        run("train", tmp_path / "nope.csv", "--out", tmp_path / "h", "--model", tiny_bert_dir),
        match="cannot read C-STS file",
    )


def test_train_csv_missing_columns(tiny_bert_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("s1,s2,label\na,b,1\n")
    assert_clean_error(run("train", path, "--out", tmp_path / "h", "--model", tiny_bert_dir), match="missing column")
    assert not (tmp_path / "h").exists()


def test_train_bad_option_values_are_usage_errors(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("sentence1,sentence2,condition,label\na,b,c,1\n")
    for bad in (["--dim", "0"], ["--epochs", "0"], ["--lr", "0"], ["--dropout", "1"]):
        assert_clean_error(run("train", path, "--out", tmp_path / "h", *bad), code=2)


def test_unknown_device(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    result = run(
        "index", corpus_file, "-c", COLOUR, "--model", tiny_bert_dir, "--device", "bogus", "--index-dir", tmp_path / "i"
    )
    assert "bogus" in assert_clean_error(result)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda(tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path) -> None:
    result = run(
        "index", corpus_file, "-c", COLOUR, "--model", tiny_bert_dir, "--device", "cuda", "--index-dir", tmp_path / "i"
    )
    assert isinstance(result.exception, SystemExit) and result.exit_code in (1, 2)


# ---------------------------------------------------------------- help (STYLE item 9)


def _commands() -> list[str]:
    return sorted(main.commands)


def test_group_help_and_version() -> None:
    for flag in ("-h", "--help"):
        out = ok(run(flag)).stdout
        assert "Conditional semantic search" in out
        for name in _commands():
            assert name in out
    assert ok(run("--version")).stdout.strip() == f"condsearch, version {__version__}"


def test_expected_commands_exist() -> None:
    assert {"index", "query", "list", "train"} <= set(_commands())


@pytest.mark.parametrize("name", _commands())
def test_every_command_has_help(name: str) -> None:
    command = main.commands[name]
    assert command.help and command.help.strip(), f"{name} has no docstring"
    for flag in ("--help", "-h"):
        out = ok(run(name, flag)).stdout
        assert out.startswith(f"Usage: main {name}") or out.startswith(f"Usage: condsearch {name}")
        first_line = " ".join(command.help.strip().splitlines()[0].split())
        assert first_line in " ".join(out.split())  # click re-wraps the text


@pytest.mark.parametrize("name", _commands())
def test_every_option_has_help(name: str) -> None:
    command = main.commands[name]
    missing = [p.opts[-1] for p in command.params if isinstance(p, click.Option) and not (p.help or "").strip()]
    assert missing == [], f"{name}: {missing}"


def test_cli_reference_is_current() -> None:
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("cli_reference", root / "tools" / "cli_reference.py")
    assert spec is not None and spec.loader is not None
    docs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(docs)
    assert docs.DEFAULT_PATH == "docs/cli.md"
    reference = (root / docs.DEFAULT_PATH).read_text(encoding="utf-8")
    block = reference.partition(docs.START)[2].partition(docs.END)[0]
    assert block, "docs/cli.md lacks the cli-reference markers"
    assert block.strip() == docs.render_cli_reference().strip(), (
        "docs/cli.md is stale: run python tools/cli_reference.py docs/cli.md"
    )
    assert "[CLI reference](docs/cli.md)" in (root / "README.md").read_text(encoding="utf-8")


def test_query_json_is_one_line_per_query_whatever_the_text(indexed: Path) -> None:
    # U+0085, U+2028 and U+2029 may stand raw in JSON, but str.splitlines() and some readers end lines there
    text = "a girl\x85in\u2028an orange\u2029dress"
    result = ok(query(indexed, text, "-c", COLOUR, "-k", 1, "--json"))
    [line] = result.stdout.splitlines()
    assert json.loads(line)["query"] == text
