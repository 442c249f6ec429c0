"""Corpora as CSV and JSON lines: the parquet file's rows and vectors, streamed, and the same bad-input rules."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from condsearch.corpus import read_corpus, scan_corpus
from condsearch.corpus_formats import format_of
from condsearch.errors import CorpusError
from condsearch.store import IndexStore
from tests.conftest import SENTENCES
from tests.test_cli import assert_clean_error, ok, run

COLOUR = "color of the dress"
IDS = [f"s{i}" for i in range(len(SENTENCES))]


def write_all(folder: Path, ids: list, texts: list, stem: str = "corpus") -> dict[str, Path]:
    """Write the same rows as parquet, CSV, JSON lines (.jsonl and .ndjson); return the paths by extension."""
    table = pa.table({"id": ids, "text": texts})
    paths = {ext: folder / f"{stem}.{ext}" for ext in ("parquet", "csv", "jsonl", "ndjson")}
    pq.write_table(table, paths["parquet"])
    pacsv.write_csv(table, paths["csv"])
    lines = "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in zip(ids, texts, strict=True))
    paths["jsonl"].write_text(lines, encoding="utf-8")
    paths["ndjson"].write_text(lines, encoding="utf-8")
    return paths


def test_format_is_named_or_told_by_the_extension() -> None:
    assert [format_of(Path(f"c.{e}")) for e in ("parquet", "PQ", "csv", "jsonl", "ndjson")] == [
        "parquet",
        "parquet",
        "csv",
        "jsonl",
        "jsonl",
    ]
    assert format_of(Path("corpus.data")) == "parquet"  # as every corpus was before the others
    assert format_of(Path("c.parquet"), "csv") == "csv"
    with pytest.raises(CorpusError, match="unknown corpus format 'xml'"):
        format_of(Path("c.xml"), "xml")


@pytest.mark.parametrize("ids", [IDS, list(range(100, 100 + len(SENTENCES)))])
def test_every_format_reads_the_same_rows_streamed_or_whole(tmp_path: Path, ids: list) -> None:
    texts = [*SENTENCES[:-1], "1234"]  # digits in the text column are still text in a CSV
    paths = write_all(tmp_path, ids, texts)
    for path in paths.values():
        whole, streamed = read_corpus(path), scan_corpus(path)
        assert whole.ids == ids and whole.texts == texts, path
        assert [(i, t) for b_ids, b_texts in streamed.batches(3) for i, t in zip(b_ids, b_texts, strict=True)] == [
            *zip(ids, texts, strict=True)
        ]
        assert streamed.checksum == whole.checksum and len(streamed) == len(ids)


def test_index_csv_and_jsonl_give_the_parquet_files_vectors(tmp_path: Path, tiny_bert_dir: Path) -> None:
    paths = write_all(tmp_path, IDS, SENTENCES)
    where = tmp_path / "idx"
    common = ["-c", COLOUR, "--model", tiny_bert_dir, "--head", "none", "--index-dir", where]
    for ext, path in paths.items():
        ok(run("index", path, "--name", ext, *common))
    store = IndexStore(where)
    stored = {m.corpus_name: store.load(name) for name, m in store.manifests()}
    assert set(stored) == set(paths)
    vectors = {ext: np.load(where / s.name / "vectors.npy") for ext, s in stored.items()}
    for ext in ("csv", "jsonl", "ndjson"):
        assert stored[ext].ids == IDS and stored[ext].texts == list(SENTENCES)
        np.testing.assert_array_equal(vectors[ext], vectors["parquet"])
    ask = ["query", SENTENCES[2], "-c", COLOUR, "--json", "--index-dir", where]
    answers = {ext: json.loads(ok(run(*ask, "--corpus", ext)).stdout) for ext in paths}
    assert all(a["results"] == answers["parquet"]["results"] for a in answers.values())


def test_format_option_overrides_the_extension(tmp_path: Path, tiny_bert_dir: Path) -> None:
    paths = write_all(tmp_path, IDS, SENTENCES)
    renamed = paths["csv"].rename(tmp_path / "corpus.txt")
    common = ["-c", COLOUR, "--model", tiny_bert_dir, "--head", "none", "--index-dir", tmp_path / "idx"]
    assert_clean_error(run("index", renamed, *common), match="not a readable parquet file")
    ok(run("index", renamed, "--format", "csv", *common))
    assert_clean_error(run("index", renamed, "--format", "xml", *common), code=2, match="'xml' is not one of")


@pytest.mark.parametrize(
    "name,content,match",
    [
        ("c.csv", "id,caption\na,hello\n", "no column 'text'; columns are id, caption"),
        ("c.csv", "text\n", "no non-empty texts in column 'text'"),
        ("c.csv", "id,text\n", "column 'id' holds null"),  # typed from no rows at all
        ("c.csv", "", "not a readable csv file"),
        ("c.csv", "id,text\na,one\na,two\n", "duplicate id 'a' in column 'id'"),
        ("c.csv", "id,text\n1.5,one\n", "ids must be strings or integers"),
        ("c.jsonl", '{"id": "a", "text": "one"}\n{"id": "a", "text": "two"}\n', "duplicate id 'a'"),
        ("c.jsonl", '{"id": "a", "body": "one"}\n', "no column 'text'; columns are id, body"),
        ("c.jsonl", '{"id": "a", "text": "one"}\n{not json\n', "not a readable jsonl file"),
        ("c.jsonl", '{"id": "a", "text": 5}\n', "column 'text' does not hold strings"),
        ("c.ndjson", '{"id": null, "text": "one"}\n', "column 'id' holds null"),
        ("c.ndjson", '{"id": "a", "text": "one"}\n{"id": null, "text": "two"}\n', "column 'id' has null ids"),
        ("c.jsonl", "", "not a readable jsonl file"),
    ],
)
def test_bad_csv_and_jsonl_files_are_one_line_errors(
    tmp_path: Path, tiny_bert_dir: Path, name: str, content: str, match: str
) -> None:
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(CorpusError, match=match.replace("(", r"\(")):
        scan_corpus(path)
    with pytest.raises(CorpusError, match=match.replace("(", r"\(")):
        read_corpus(path)
    result = run("index", path, "-c", COLOUR, "--model", tiny_bert_dir, "--head", "none", "--index-dir", tmp_path / "i")
    assert_clean_error(result, match=match)
