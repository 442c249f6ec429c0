"""Reading corpora (parquet) and C-STS files (CSV)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from condsearch.corpus import read_corpus
from condsearch.csts import read_csts, scale_labels
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
