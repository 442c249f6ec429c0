"""Reading corpora (parquet) and C-STS files (CSV)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from condsearch.corpus.csts import read_csts, scale_labels
from condsearch.corpus.reader import read_corpus
from condsearch.errors import CorpusError


def test_read_corpus_with_id_column(write_corpus) -> None:
    path = write_corpus({"id": ["a", "b"], "text": ["one", "two"], "extra": [1, 2]})
    corpus = read_corpus(path)
    assert corpus.ids == ["a", "b"] and corpus.texts == ["one", "two"]
    assert len(corpus) == 2 and corpus.n_skipped == 0
    assert corpus.path == str(path.resolve())
    assert corpus.checksum == hashlib.sha256(path.read_bytes()).hexdigest()


def test_read_corpus_row_numbers_without_id_column(write_corpus) -> None:
    corpus = read_corpus(write_corpus(text=["one", "two", "three"]))
    assert corpus.ids == [0, 1, 2]


def test_read_corpus_int_ids(write_corpus) -> None:
    corpus = read_corpus(write_corpus(id=[10, 7, 3], text=["a", "b", "c"]))
    assert corpus.ids == [10, 7, 3]
    assert all(isinstance(i, int) for i in corpus.ids)


def test_read_corpus_other_columns(write_corpus) -> None:
    path = write_corpus(key=["x", "y"], caption=["one", "two"], id=["i", "j"])
    corpus = read_corpus(path, text_column="caption", id_column="key")
    assert corpus.ids == ["x", "y"] and corpus.texts == ["one", "two"]


def test_null_and_blank_texts_are_skipped_and_counted(write_corpus) -> None:
    path = write_corpus(id=["a", "b", "c", "d", "e"], text=["one", None, "  ", "\t\n", "five"])
    corpus = read_corpus(path)
    assert corpus.ids == ["a", "e"] and corpus.texts == ["one", "five"]
    assert corpus.n_skipped == 3


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="no such file"):
        read_corpus(tmp_path / "nope.parquet")


def test_directory_is_not_a_corpus(tmp_path: Path) -> None:
    with pytest.raises(CorpusError):
        read_corpus(tmp_path)


@pytest.mark.parametrize("content", [b"id,text\n1,hello\n", b"", b"PAR1garbagePAR1", b"\x00" * 100])
def test_non_parquet_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "corpus.parquet"
    path.write_bytes(content)
    with pytest.raises(CorpusError, match="not a readable parquet file"):
        read_corpus(path)


def test_missing_text_column_names_existing_columns(write_corpus) -> None:
    path = write_corpus(id=["a"], caption=["hello"])
    with pytest.raises(CorpusError) as info:
        read_corpus(path)
    msg = str(info.value)
    assert "'text'" in msg and "id" in msg and "caption" in msg


def test_missing_id_column(write_corpus) -> None:
    with pytest.raises(CorpusError, match="'key'.*columns are text"):
        read_corpus(write_corpus(text=["a"]), id_column="key")


def test_text_column_of_numbers(write_corpus) -> None:
    with pytest.raises(CorpusError, match="does not hold strings"):
        read_corpus(write_corpus(text=[1, 2]))


@pytest.mark.parametrize("texts", [[], [None, None], ["", "   "]])
def test_empty_corpus(write_corpus, texts) -> None:
    import pyarrow as pa

    path = write_corpus({"text": pa.array(texts, type=pa.string())})
    with pytest.raises(CorpusError, match="no non-empty texts"):
        read_corpus(path)


@pytest.mark.parametrize("ids", [["a", "b", "a"], [1, 2, 2]])
def test_duplicate_ids(write_corpus, ids) -> None:
    with pytest.raises(CorpusError, match=f"duplicate id {ids[-1]!r}"):
        read_corpus(write_corpus(id=ids, text=["x", "y", "z"]))


def test_duplicate_ids_on_skipped_rows_are_fine(write_corpus) -> None:
    corpus = read_corpus(write_corpus(id=["a", "a"], text=["x", None]))
    assert corpus.ids == ["a"]


def test_null_ids(write_corpus) -> None:
    with pytest.raises(CorpusError, match="null ids"):
        read_corpus(write_corpus(id=["a", None], text=["x", "y"]))


def _write_arrow(tmp_path: Path, columns: dict) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "typed.parquet"
    pq.write_table(pa.table(columns), path)
    return path


def _refused_id_columns() -> list:
    import datetime
    import decimal

    import pyarrow as pa

    return [
        pytest.param(pa.array([[1], [2], [3]]), "list", id="list"),
        pytest.param(pa.array([{"a": 1}, {"a": 2}, {"a": 3}]), "struct", id="struct"),
        pytest.param(pa.array([1, 2, 2**63], type=pa.uint64()), "signed 64-bit", id="uint64-too-big"),
        pytest.param(pa.array([b"a", b"b", b"c"]), "binary", id="bytes"),
        pytest.param(pa.array([b"a", b"b", b"c"], type=pa.large_binary()), "binary", id="large-bytes"),
        pytest.param(pa.array([decimal.Decimal(v) for v in ("1.5", "2", "3")]), "decimal", id="dec"),
        pytest.param(pa.array([datetime.datetime(2020, 1, d) for d in (1, 2, 3)]), "timestamp", id="timestamp"),
        pytest.param(pa.array([datetime.date(2020, 1, d) for d in (1, 2, 3)]), "date", id="date"),
        pytest.param(pa.array([float("nan"), float("nan"), 1.0]), "double", id="nan"),
        pytest.param(pa.array([1.0, 2.0, 3.0]), "double", id="float"),
        pytest.param(pa.array([True, False, None]), "bool", id="bool"),
        pytest.param(pa.array([None, None, None], type=pa.null()), "null", id="null-type"),
    ]


@pytest.mark.parametrize("ids, named", _refused_id_columns())
def test_id_columns_that_do_not_round_trip_through_json_are_refused_up_front(
    tmp_path: Path, ids: object, named: str
) -> None:
    from condsearch.corpus.reader import scan_corpus

    path = _write_arrow(tmp_path, {"id": ids, "text": ["x", "y", "z"]})
    for read in (read_corpus, scan_corpus):
        with pytest.raises(CorpusError) as caught:
            read(path)
        message = str(caught.value)
        assert "\n" not in message and named in message and "'id'" in message, message


def _accepted_id_columns() -> dict:
    import pyarrow as pa

    columns = {
        "s": pa.array(["a", "b", "c"]),
        "ls": pa.array(["a", "b", "c"], type=pa.large_string()),
        "i8": pa.array([-1, 0, 1], type=pa.int8()),
        "u64": pa.array([0, 1, 2**63 - 1], type=pa.uint64()),
        "i64": pa.array([-(2**63), 0, 2**63 - 1]),
        "cat": pa.array(["a", "b", "c"]).dictionary_encode(),
    }
    return columns


@pytest.mark.parametrize("column", ["s", "ls", "i8", "u64", "i64", "cat"])
def test_string_and_integer_id_columns_are_accepted(tmp_path: Path, column: str) -> None:
    from condsearch.corpus.reader import scan_corpus

    columns = _accepted_id_columns()
    path = _write_arrow(tmp_path, {**columns, "text": ["x", "y", "z"]})
    expected = columns[column].to_pylist()
    assert read_corpus(path, id_column=column).ids == expected
    scanned = scan_corpus(path, id_column=column)
    assert [i for ids, _ in scanned.batches(10) for i in ids] == expected


def test_dictionary_encoded_text_column_is_read(tmp_path: Path) -> None:
    # pandas writes a `category` column as dictionary<values=string, indices=int8>
    import pyarrow as pa

    from condsearch.corpus.reader import scan_corpus

    texts = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0, None], type=pa.int8()), pa.array(["red", "blue"]))
    path = _write_arrow(tmp_path, {"id": ["a", "b", "c", "d"], "text": texts})
    assert read_corpus(path).texts == ["red", "blue", "red"]
    scanned = scan_corpus(path)
    assert len(scanned) == 3 and scanned.n_skipped == 1
    assert [t for _, batch in scanned.batches(10) for t in batch] == ["red", "blue", "red"]


@pytest.mark.parametrize("kind", ["large_string", "string_view"])
def test_other_string_text_columns_are_read(tmp_path: Path, kind: str) -> None:
    import pyarrow as pa

    from condsearch.corpus.reader import scan_corpus

    if not hasattr(pa, kind):
        pytest.skip(f"pyarrow {pa.__version__} has no {kind}")
    path = _write_arrow(tmp_path, {"text": pa.array(["one", "two"], type=getattr(pa, kind)())})
    assert read_corpus(path).texts == ["one", "two"] and len(scan_corpus(path)) == 2


def test_dictionary_of_numbers_is_not_a_text_column(tmp_path: Path) -> None:
    import pyarrow as pa

    from condsearch.corpus.reader import scan_corpus

    path = _write_arrow(tmp_path, {"text": pa.array([1, 2]).dictionary_encode()})
    for read in (read_corpus, scan_corpus):
        with pytest.raises(CorpusError, match="does not hold strings"):
            read(path)


# ---------------------------------------------------------------- C-STS


def _csv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "csts.csv"
    path.write_text(text, encoding="utf-8")
    return path


def test_read_csts_drops_invalid_labels(tmp_path: Path) -> None:
    path = _csv(
        tmp_path,
        "sentence1,sentence2,condition,label\n"
        "a red dress,a blue dress,colour,1\n"
        "x,y,colour,-1\n"
        "x,y,,3\n"
        '"tennis, clay",soccer,sport,4.5\n',
    )
    data = read_csts(path)
    assert len(data) == 2 and data.n_dropped == 2
    assert data.sentence1 == ["a red dress", "tennis, clay"]
    assert data.condition == ["colour", "sport"]
    np.testing.assert_array_equal(data.labels, np.array([1.0, 4.5], dtype=np.float32))
    assert data.head(1).sentence2 == ["a blue dress"]


def test_read_csts_missing_columns(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="missing column.*condition.*label.*columns are sentence1, sentence2"):
        read_csts(_csv(tmp_path, "sentence1,sentence2\na,b\n"))


def test_read_csts_empty_file(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="missing column"):
        read_csts(_csv(tmp_path, ""))


def test_read_csts_bad_label(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match=":2: label 'high'"):
        read_csts(_csv(tmp_path, "sentence1,sentence2,condition,label\na,b,c,high\n"))


def test_read_csts_only_invalid_rows(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="no labelled rows"):
        read_csts(_csv(tmp_path, "sentence1,sentence2,condition,label\na,b,c,-1\n"))


def test_read_csts_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="cannot read"):
        read_csts(tmp_path / "nope.csv")


def test_read_csts_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_bytes(b"sentence1,sentence2,condition,label\n\xff\xfe,b,c,1\n")
    with pytest.raises(CorpusError, match="cannot read"):
        read_csts(path)


def test_scale_labels() -> None:
    np.testing.assert_allclose(scale_labels(np.array([1.0, 3.0, 5.0])), [0.0, 0.5, 1.0])
