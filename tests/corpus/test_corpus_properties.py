"""Property-based tests of corpus files and the Python API (issue 37): whatever the rows, a CSV or
JSON lines file, a list of texts or a call to the API is read exactly or refused in one line.

Never a traceback: only condsearch.errors exceptions escape. Never a silent change: every id and
text read back is the one written (a CSV id column of plainly written integers comes back as those
integers, which print as written). A hash encoder stands in for the model, so each example costs
milliseconds.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import condsearch
from condsearch.corpus.memory import memory_corpus
from condsearch.corpus.prescan import MAX_JSON_DEPTH
from condsearch.corpus.reader import Corpus, is_plain_integer, read_corpus, scan_corpus
from condsearch.errors import CondsearchError, CorpusError
from condsearch.model.vectorizer import Vectorizer
from condsearch.store.folder import IndexStore
from tests.conftest import HashEncoder

SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
#: what a UTF-8 file can hold: every code point but lone surrogates
FILE_CHAR = st.characters(codec="utf-8")
#: what a Python string can hold: lone surrogates too
ANY_CHAR = st.characters(codec=None, categories=None)
#: texts and ids that look like what the readers guess at: numbers, dates, nulls, quotes, separators
TRICKY = st.sampled_from(
    ["00001", "1", "-1", "0", "-0", "1.5", "1e3", "2020-01-01", "NA", "null", "true", "", " ", "a,b", 'say "hi"',
     '"', '""', "\\", "a\\\"b", "x\ny", "x\r\ny", "\r", "[", "{}", "\ufeff", "\x00", "\u2028", "9223372036854775808"]
)  # fmt: skip
_RUNS = itertools.count()


def kept(ids: list[Any], texts: list[Any]) -> list[tuple[Any, str]]:
    """Return the (id, text) rows a reader keeps: those whose text is a string that is not blank."""
    return [(i, t) for i, t in zip(ids, texts, strict=True) if isinstance(t, str) and t.strip()]


def read_both(path: Path) -> tuple[Corpus | CorpusError, list[tuple[Any, str]] | CorpusError]:
    """Return the file read whole and streamed, or the CorpusError each raised (nothing else may escape)."""
    whole: Corpus | CorpusError
    streamed: list[tuple[Any, str]] | CorpusError
    try:
        whole = read_corpus(path)
    except CorpusError as exc:
        assert "\n" not in str(exc), str(exc)
        whole = exc
    try:
        scanned = scan_corpus(path)
        streamed = [(i, t) for ids, texts in scanned.batches(3) for i, t in zip(ids, texts, strict=True)]
    except CorpusError as exc:
        assert "\n" not in str(exc), str(exc)
        streamed = exc
    return whole, streamed


def assert_read_exactly(path: Path, rows: list[tuple[Any, str]], *, csv: bool = False) -> None:
    """Read path both ways: the same outcome, and on success the rows as written (a CSV's ids as its strings)."""
    whole, streamed = read_both(path)
    assert isinstance(whole, CorpusError) == isinstance(streamed, CorpusError), (whole, streamed)
    if isinstance(whole, CorpusError):
        return
    got = list(zip(whole.ids, whole.texts, strict=True))
    assert got == streamed
    if csv:  # ids come back as written: all strings, or all plain integers printed as written
        assert all(isinstance(i, str) for i, _ in got) or all(isinstance(i, int) for i, _ in got), got
        got = [(str(i), t) for i, t in got]
    assert got == rows


# ---------------------------------------------------------------- CSV


def _csv_field(value: str, quote_all: bool) -> str:
    if quote_all or any(c in value for c in ',"\r\n') or value.startswith("\ufeff"):
        return '"' + value.replace('"', '""') + '"'
    return value


CSV_VALUE = st.one_of(st.text(FILE_CHAR, max_size=12), TRICKY)


@given(
    rows=st.lists(st.tuples(CSV_VALUE, CSV_VALUE), min_size=1, max_size=8),
    quote_all=st.booleans(),
    newline=st.sampled_from(["\n", "\r\n"]),
    final_newline=st.booleans(),
)
@example(rows=[("00001", "a"), ("00002", "b")], quote_all=False, newline="\n", final_newline=True)
@example(rows=[("2020-01-01", "1234")], quote_all=False, newline="\n", final_newline=True)
@example(rows=[("1", "x\r\ny"), ("2", '"')], quote_all=False, newline="\r\n", final_newline=False)
@SETTINGS
def test_any_csv_rows_are_read_exactly_or_refused_in_one_line(
    tmp_path: Path, rows: list[tuple[str, str]], quote_all: bool, newline: str, final_newline: bool
) -> None:
    path = tmp_path / f"{next(_RUNS)}.csv"
    lines = ["id,text", *(f"{_csv_field(i, quote_all)},{_csv_field(t, quote_all)}" for i, t in rows)]
    path.write_bytes((newline.join(lines) + (newline if final_newline else "")).encode("utf-8"))
    expected = kept([i for i, _ in rows], [t for _, t in rows])
    whole, _ = read_both(path)
    ids = [i for i, _ in expected]
    if expected and "" not in ids and len(set(ids)) == len(ids):
        assert not isinstance(whole, CorpusError), whole  # nothing to refuse: it must be read
    assert_read_exactly(path, expected, csv=True)
    if not isinstance(whole, CorpusError) and all(is_plain_integer(i) for i in ids):
        assert whole.ids == [int(i) for i in ids]


@given(head=st.lists(st.tuples(CSV_VALUE, CSV_VALUE), max_size=4), tail=st.text(FILE_CHAR, max_size=12))
@SETTINGS
def test_a_csv_file_ending_in_an_open_quote_is_refused(tmp_path: Path, head: list[tuple[str, str]], tail: str) -> None:
    path = tmp_path / f"{next(_RUNS)}.csv"
    lines = ["id,text", *(f"{_csv_field(i, True)},{_csv_field(t, True)}" for i, t in head)]
    before = "\n".join(lines) + "\n"
    path.write_text(before + 'x,"' + tail.replace('"', '""'), encoding="utf-8", newline="")
    line = before.count("\n") + 1  # lines as an editor counts them: quoted values may hold some
    for read in (read_corpus, scan_corpus):
        with pytest.raises(CorpusError, match=f"a quote opened on line {line} is never closed"):
            read(path)


# ---------------------------------------------------------------- JSON lines

JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(FILE_CHAR, max_size=6)
)


def nested(depth: int, leaf: Any = 1) -> Any:
    """Return a value nested depth levels deep in alternating arrays and objects."""
    for level in range(depth):
        leaf = [leaf] if level % 2 else {"k": leaf}
    return leaf


def json_depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((json_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((json_depth(v) for v in value.values()), default=0)
    return 0


JSON_ID = st.one_of(st.text(FILE_CHAR, max_size=8), TRICKY, st.integers(-(2**63), 2**63 - 1), st.integers())
JSON_TEXT = st.one_of(st.text(FILE_CHAR, max_size=16), TRICKY, st.none(), st.integers(0, 3))


@given(
    rows=st.lists(
        st.tuples(JSON_ID, JSON_TEXT, st.integers(0, MAX_JSON_DEPTH + 40), st.one_of(JSON_LEAF, st.just("[{"))),
        min_size=1,
        max_size=6,
    ),
    ascii_only=st.booleans(),
)
@example(rows=[("a", "one", MAX_JSON_DEPTH - 1, 1)], ascii_only=True)  # the row is one level deeper than x
@example(rows=[("a", "one", MAX_JSON_DEPTH, 1)], ascii_only=True)
@example(rows=[("a", "[[[[", 0, "]]]]")], ascii_only=False)
@SETTINGS
def test_any_json_lines_are_read_exactly_or_refused_in_one_line(
    tmp_path: Path, rows: list[tuple[Any, Any, int, Any]], ascii_only: bool
) -> None:
    path = tmp_path / f"{next(_RUNS)}.jsonl"
    objects = [{"id": i, "text": t, "x": nested(d, leaf)} for i, t, d, leaf in rows]
    path.write_text("".join(json.dumps(o, ensure_ascii=ascii_only) + "\n" for o in objects), encoding="utf-8")
    deepest = max(json_depth(o) for o in objects)
    whole, _ = read_both(path)
    if deepest > MAX_JSON_DEPTH:
        assert isinstance(whole, CorpusError) and f"deeper than {MAX_JSON_DEPTH} levels" in str(whole), whole
        return
    assert not (isinstance(whole, CorpusError) and "deeper than" in str(whole)), whole
    ids, texts = [i for i, *_ in rows], [t for _, t, *_ in rows]
    if all(t is None or isinstance(t, str) for t in texts):  # a text of another JSON type is refused, by type
        assert_read_exactly(path, kept(ids, texts))
    else:
        assert isinstance(whole, CorpusError)


FIRST_ROW = {"csv": b"id,text\n0,first\n", "jsonl": b'{"id": 0, "text": "first"}\n'}


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
@given(
    lines=st.lists(st.one_of(st.binary(max_size=12), st.sampled_from([b'"', b'1,"a', b"\xff", b"[" * 80])), max_size=4)
)
@example(lines=[b'{"text": "caf\xe9"}'])
@example(lines=[b'{"text": "' + b"[" * 100 + b'"}'])
@example(lines=[b"1,caf\xe9"])
@SETTINGS
def test_any_bytes_after_a_good_row_are_read_or_refused_in_one_line(
    tmp_path: Path, fmt: str, lines: list[bytes]
) -> None:
    path = tmp_path / f"{next(_RUNS)}.{fmt}"
    path.write_bytes(FIRST_ROW[fmt] + b"\n".join(lines))
    whole, streamed = read_both(path)
    assert isinstance(whole, CorpusError) == isinstance(streamed, CorpusError), (whole, streamed)
    if not isinstance(whole, CorpusError):
        assert list(zip(whole.ids, whole.texts, strict=True)) == streamed
        assert whole.texts[0] == "first" and all(t.encode("utf-8") for t in whole.texts)


# ---------------------------------------------------------------- the Python API

PY_TEXT = st.one_of(
    st.text(ANY_CHAR, max_size=12), TRICKY, st.none(), st.integers(), st.floats(), st.binary(max_size=3)
)
PY_ID = st.one_of(
    st.text(ANY_CHAR, max_size=8),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(),
    st.none(),
    st.booleans(),
    st.floats(),
    st.integers(0, 5).map(np.int64),
)


def _valid_text(t: Any) -> bool:
    return isinstance(t, str) and not (set(t) & {chr(c) for c in range(0xD800, 0xE000)})


@given(data=st.data())
@SETTINGS
def test_any_lists_of_texts_and_ids_are_a_corpus_exactly_or_a_corpus_error(data: st.DataObject) -> None:
    texts = data.draw(st.lists(PY_TEXT, max_size=6), "texts")
    ids = data.draw(st.one_of(st.none(), st.lists(PY_ID, min_size=len(texts), max_size=len(texts))), "ids")
    try:
        corpus = memory_corpus(texts, ids=ids)
    except CorpusError as exc:
        assert "\n" not in str(exc)
        return
    rows = kept(list(range(len(texts))) if ids is None else ids, texts)
    assert all(_valid_text(t) for _, t in rows)
    assert list(zip(corpus.ids, corpus.texts, strict=True)) == rows
    assert all(type(i) in (int, str) or isinstance(i, np.integer) for i in corpus.ids)


@given(data=st.data())
@SETTINGS
def test_any_dataframe_is_a_corpus_exactly_or_a_corpus_error(data: st.DataObject) -> None:
    pd = pytest.importorskip("pandas")
    texts = data.draw(st.lists(PY_TEXT, min_size=1, max_size=5), "texts")
    ids = data.draw(st.lists(PY_ID, min_size=len(texts), max_size=len(texts)), "ids")
    frame = pd.DataFrame({"id": pd.Series(ids, dtype=object), "text": pd.Series(texts, dtype=object)})
    try:
        corpus = memory_corpus(frame)
    except CorpusError as exc:
        assert "\n" not in str(exc)
        return
    rows = kept([int(i) if isinstance(i, np.integer) else i for i in ids], texts)
    assert list(zip(corpus.ids, corpus.texts, strict=True)) == rows


def _hash_store(folder: Path) -> condsearch.Store:
    return condsearch.open(folder, model=condsearch.Model(Vectorizer(HashEncoder(), None, "none", "")))


@given(data=st.data())
@SETTINGS
def test_any_store_index_and_search_answers_exactly_or_raises_one_condsearch_error(
    tmp_path: Path, data: st.DataObject
) -> None:
    folder = tmp_path / f"store-{next(_RUNS)}"
    store = _hash_store(folder)
    texts = data.draw(st.lists(st.one_of(st.text(FILE_CHAR, min_size=1, max_size=8), PY_TEXT), max_size=5), "texts")
    ids = data.draw(st.one_of(st.none(), st.lists(PY_ID, min_size=len(texts), max_size=len(texts))), "ids")
    conditions = data.draw(
        st.one_of(st.just("colour"), st.lists(st.sampled_from(["colour", "sport", " ", "\ud800"]), max_size=2)),
        "conditions",
    )
    try:
        names = store.index(texts, conditions, ids=ids)
    except CondsearchError as exc:
        assert "\n" not in str(exc)
        assert not folder.exists() or not IndexStore(folder).names()
        return
    rows = kept(
        list(range(len(texts))) if ids is None else [int(i) if isinstance(i, np.integer) else i for i in ids], texts
    )
    wanted = [conditions] if isinstance(conditions, str) else conditions
    assert len(names) == len(set(wanted))
    for name in names:
        stored = IndexStore(folder).load(name)
        assert list(zip(stored.ids, stored.texts, strict=True)) == rows
    k = data.draw(st.one_of(st.integers(-2, 8), st.sampled_from([np.int64(2), np.uint8(1), True, 2.0, "3", None])), "k")
    query = data.draw(st.one_of(st.text(ANY_CHAR, max_size=8), st.sampled_from([t for _, t in rows])), "query")
    try:
        hits = store.search(query, condition=wanted[0], k=k)
    except CondsearchError as exc:
        assert "\n" not in str(exc)
        return
    assert not isinstance(k, bool | float | str) and k is not None and int(k) > 0 and _valid_text(query)
    assert len(hits) == min(int(k), len(rows))
    assert {(h.id, h.text) for h in hits} <= set(rows)
