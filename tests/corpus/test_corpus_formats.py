"""Corpora as CSV and JSON lines: the parquet file's rows and vectors, streamed, and the same bad-input rules."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from condsearch.corpus.formats import format_of
from condsearch.corpus.reader import read_corpus, scan_corpus
from condsearch.errors import CorpusError
from condsearch.store.folder import IndexStore
from tests.cli.test_cli import assert_clean_error, ok, run
from tests.conftest import SENTENCES

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
        ("c.csv", "id,text\n,one\n", "column 'id' has null ids"),  # an empty id is no id
        ("c.csv", "", "not a readable csv file"),
        ("c.csv", "id,text\na,one\na,two\n", "duplicate id 'a' in column 'id'"),
        ("c.csv", 'id,text\n1,"one\n', "a quote opened on line 2 is never closed"),
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


# ---------------------------------------------------------------- hostile files (issue 37)


def _run_apart(code: str, *args: object) -> subprocess.CompletedProcess[str]:
    """Run code in a fresh interpreter (argv[1:] = args): a crash there ends only that process."""
    argv = [sys.executable, "-c", code, *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2])


def _nested(depth: int, opening: str = "[") -> str:
    closing = {"[": "]", "{": "}"}[opening]
    inner = '{"a": ' if opening == "{" else "["
    return inner * depth + "1" + closing * depth


@pytest.mark.parametrize("opening", ["[", "{"])
def test_a_json_line_nested_20000_deep_is_refused_before_pyarrow_parses_it(tmp_path: Path, opening: str) -> None:
    """pyarrow's JSON reader ends the process (SIGSEGV) on such a line, even in a column never read."""
    path = tmp_path / "deep.jsonl"
    path.write_text('{"id": "a", "text": "one"}\n{"id": "b", "text": "two", "x": ' + _nested(20_000, opening) + "}\n")
    code = """if True:
        import sys
        import condsearch
        from condsearch.corpus.reader import read_corpus, scan_corpus
        from condsearch.errors import CorpusError
        for read in (scan_corpus, read_corpus, lambda p: condsearch.open(sys.argv[2]).index(p, "c")):
            try:
                read(sys.argv[1])
            except CorpusError as exc:
                print("refused:", exc)
    """
    done = _run_apart(code, path, tmp_path / "idx")
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all("line 2 nests arrays and objects deeper than 64 levels" in line for line in lines)
    cli = _run_apart("from condsearch.cli import main; main()", "index", path, "-c", "c", "--index-dir", tmp_path / "i")
    assert cli.returncode == 1 and "deeper than 64 levels" in cli.stderr and "Traceback" not in cli.stderr
    assert not (tmp_path / "idx").exists() or not IndexStore(tmp_path / "idx").names()


def test_json_nesting_up_to_the_limit_and_brackets_in_strings_are_read(tmp_path: Path) -> None:
    from condsearch.corpus.prescan import MAX_JSON_DEPTH

    texts = ["[" * 500 + '{ a \\" [ quoted', "}" * 500 + "]", "plain"]
    rows = [{"id": i, "text": t, "x": json.loads(_nested(MAX_JSON_DEPTH - 1))} for i, t in enumerate(texts)]
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert read_corpus(path).texts == texts and len(scan_corpus(path)) == 3
    path.write_text(json.dumps({"id": 0, "text": "a", "x": json.loads(_nested(MAX_JSON_DEPTH))}) + "\n")
    with pytest.raises(CorpusError, match=f"line 1 nests arrays and objects deeper than {MAX_JSON_DEPTH} levels"):
        scan_corpus(path)


def test_invalid_utf8_in_a_json_line_is_a_one_line_error(tmp_path: Path, tiny_bert_dir: Path) -> None:
    import condsearch

    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"id": "a", "text": "fine"}\n{"id": "b", "text": "caf\xe9"}\n')
    for read in (scan_corpus, read_corpus):
        with pytest.raises(CorpusError, match=r"c.jsonl: line 2 is not valid UTF-8 \(byte 52\)"):
            read(path)
    model = condsearch.load_model(str(tiny_bert_dir), profile="none", device="cpu")
    with pytest.raises(CorpusError, match="line 2 is not valid UTF-8"):
        condsearch.open(tmp_path / "idx", model=model).index(path, COLOUR)
    common = ["-c", COLOUR, "--model", tiny_bert_dir, "--head", "none", "--index-dir", tmp_path / "idx"]
    assert_clean_error(run("index", path, *common), match="line 2 is not valid UTF-8")
    assert not (tmp_path / "idx").exists() or not IndexStore(tmp_path / "idx").names()


def test_invalid_utf8_in_a_parquet_text_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "c.parquet"
    texts = pa.array([b"fine", b"caf\xe9"], pa.binary()).view(pa.string())  # pyarrow writes what it is given
    pq.write_table(pa.table({"text": texts}), path)
    for read in (scan_corpus, read_corpus):
        with pytest.raises(CorpusError, match="column 'text' holds text that is not valid UTF-8"):
            read(path)


@pytest.mark.parametrize(
    "ids,expected",
    [
        (["00001", "00002"], ["00001", "00002"]),  # were the integers 1 and 2
        (["2020-01-01", "2020-01-02"], ["2020-01-01", "2020-01-02"]),  # were refused as dates
        (["1", "-2", "30"], [1, -2, 30]),  # integers written as integers stay integers
        (["1", "01"], ["1", "01"]),  # one id that is not: the column is strings
        (["1.5", "2"], ["1.5", "2"]),
        (["true", "false"], ["true", "false"]),
        (["9223372036854775807", "1"], [9223372036854775807, 1]),
        (["9223372036854775808", "1"], ["9223372036854775808", "1"]),  # past int64: as written
        (["1e3", "-0", "+5", " 7", "NaN", "null"], ["1e3", "-0", "+5", " 7", "NaN", "null"]),
        (["-0", "1"], ["-0", "1"]),  # -0 would print as 0
    ],
)
def test_csv_ids_are_read_as_the_file_writes_them(tmp_path: Path, ids: list[str], expected: list) -> None:
    path = tmp_path / "c.csv"
    texts = [f"text {i}" for i in range(len(ids))]
    path.write_text("id,text\n" + "".join(f"{i},{t}\n" for i, t in zip(ids, texts, strict=True)), encoding="utf-8")
    whole, streamed = read_corpus(path), scan_corpus(path)
    assert whole.ids == expected and whole.texts == texts
    assert [i for b_ids, _ in streamed.batches(2) for i in b_ids] == expected
    assert [type(i) for i in whole.ids] == [type(i) for i in expected]


def test_csv_texts_are_read_as_written_and_an_empty_id_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text('id,text\na,00001\nb,2020-01-01\nc,NA\nd,null\ne,"quoted, ""comma"""\nf,\n', encoding="utf-8")
    corpus = read_corpus(path)
    assert corpus.texts == ["00001", "2020-01-01", "NA", "null", 'quoted, "comma"'] and corpus.n_skipped == 1
    path.write_text("id,text\na,one\n,two\n", encoding="utf-8")
    for read in (scan_corpus, read_corpus):
        with pytest.raises(CorpusError, match="column 'id' has null ids"):
            read(path)


@pytest.mark.parametrize(
    "content,line",
    [
        ('id,text\n1,"hello\n2,world\n3,foo\n', 2),
        ('id,text\n1,one\n2,"two ""quoted"" and never closed', 3),
        ('id,"text\n1,one\n', 1),
        ('\ufeffid,text\n1,one\r\n2,"a\r\nb"\r\n3,"open', 5),
    ],
)
def test_a_quote_left_open_at_the_end_of_a_csv_file_is_an_error(
    tmp_path: Path, tiny_bert_dir: Path, content: str, line: int
) -> None:
    path = tmp_path / "c.csv"
    path.write_text(content, encoding="utf-8", newline="")
    match = f"c.csv: a quote opened on line {line} is never closed"
    for read in (scan_corpus, read_corpus):
        with pytest.raises(CorpusError, match=match):
            read(path)
    common = ["-c", COLOUR, "--model", tiny_bert_dir, "--head", "none", "--index-dir", tmp_path / "idx"]
    assert_clean_error(run("index", path, *common), match=match)


def test_quotes_that_close_and_quotes_inside_unquoted_values_are_read(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text('id,text\n1,a 5" screen\n2,"x ""y"""\n3,"multi\nline"\n4,"ab"cd\n5,last', encoding="utf-8")
    assert read_corpus(path).texts == ['a 5" screen', 'x "y"', "multi\nline", "abcd", "last"]


@pytest.mark.parametrize(
    "header,column",
    [("id,text,text", "text"), ("id,id,text", "id"), ("text,text", "text")],
)
def test_duplicate_csv_header_names_are_a_one_line_error(
    tmp_path: Path, tiny_bert_dir: Path, header: str, column: str
) -> None:
    import condsearch

    path = tmp_path / "c.csv"
    path.write_text(header + "\n" + ",".join(["1", "a", "b"][: header.count(",") + 1]) + "\n", encoding="utf-8")
    match = f"c.csv: column {column!r} appears 2 times"
    for read in (scan_corpus, read_corpus):
        with pytest.raises(CorpusError, match=match):
            read(path)
    model = condsearch.load_model(str(tiny_bert_dir), profile="none", device="cpu")
    with pytest.raises(CorpusError, match=match):
        condsearch.open(tmp_path / "idx", model=model).index(path, COLOUR)
    common = ["-c", COLOUR, "--model", tiny_bert_dir, "--head", "none", "--index-dir", tmp_path / "idx"]
    assert_clean_error(run("index", path, *common), match=match)


def test_other_duplicate_columns_are_not_read_and_do_not_matter(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text("id,text,x,x\na,one,1,2\n", encoding="utf-8")
    assert read_corpus(path).texts == ["one"] and len(scan_corpus(path)) == 1


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_or_a_folder_corpus_is_named_for_what_it_is(tmp_path: Path, tiny_bert_dir: Path) -> None:
    fifo = tmp_path / "corpus.csv"
    os.mkfifo(fifo)
    common = ["-c", COLOUR, "--model", tiny_bert_dir, "--head", "none", "--index-dir", tmp_path / "idx"]
    for path, kind in [
        (fifo, "a FIFO (named pipe)"),
        (tmp_path, "a folder"),
        (Path("/dev/zero"), "a character device"),
    ]:
        match = f"{path}: {kind}, not a regular file; refusing to read it"
        for read in (scan_corpus, read_corpus):
            with pytest.raises(CorpusError, match=re.escape(match)):
                read(path)
        assert_clean_error(run("index", path, "--format", "csv", *common), match=match)
    with pytest.raises(CorpusError, match="missing.csv: no such file"):
        scan_corpus(tmp_path / "missing.csv")
