"""Property-based tests of the CLI's inputs (issue 24): any k, query, condition or id column gets an
answer or a one-line error, exit 0, 1 or 2, never a traceback.

A hash encoder stands in for the model (the CLI's model loaders are patched), so each example costs
milliseconds; the FAISS index, the store, the corpus reader and the CLI are the real ones.
"""

from __future__ import annotations

import datetime
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from condsearch.cli import main
from condsearch.corpus.reader import read_corpus
from condsearch.ingest.chunks import index_corpus
from condsearch.model.vectorizer import Vectorizer
from condsearch.store.folder import IndexStore
from tests.conftest import SENTENCES, HashEncoder

CONDITION = "color of the dress"
IDS = [f"s{i}" for i in range(len(SENTENCES))]
#: every code point, lone surrogates (what undecodable argv bytes become) and NUL included
ANY_CHAR = st.characters(codec=None, categories=None)
SETTINGS = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _hash_vectorizer(*_: Any, **__: Any) -> Vectorizer:
    return Vectorizer(HashEncoder(), None, "none", "")


@pytest.fixture(scope="module")
def hashed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An index of the test sentences under one condition, and the CLI answering with the hash encoder."""
    root = tmp_path_factory.mktemp("hostile")
    path = root / "corpus.parquet"
    pq.write_table(pa.table({"id": IDS, "text": SENTENCES}), path)
    index_corpus(read_corpus(path), [CONDITION], _hash_vectorizer(), IndexStore(root / "indexes"), corpus_name="c")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("condsearch.model.vectorizer.load_vectorizer", _hash_vectorizer)
        patch.setattr("condsearch.model.policy.vectorizer_for", _hash_vectorizer)
        patch.setattr("condsearch.model.one_shot.cache_onnx_export", lambda *_: None)
        yield root / "indexes"


def _strict_json(line: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(line, parse_constant=refuse)


def check_outcome(result: Result) -> None:
    """Exit 0, 1 or 2; no exception but click's exit; a failure is one 'Error:' line, the last of stderr."""
    assert result.exit_code in (0, 1, 2), (result.exit_code, result.output, repr(result.exception))
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    if result.exit_code:
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1 and result.stderr.rstrip().splitlines()[-1] == errors[0], result.stderr


# ---------------------------------------------------------------- query: k, texts, conditions

K = st.one_of(
    st.integers(min_value=-3, max_value=len(SENTENCES) + 3),  # mostly a k that reaches the search
    st.integers(min_value=1, max_value=len(SENTENCES)),
    st.integers(),
    st.sampled_from(["99999999999999999999", "-99999999999999999999", "1e3", "5.0", "", " 5", "0x10", "٣"]),
    st.text(ANY_CHAR, max_size=8),
)
TEXT = st.one_of(
    st.text(ANY_CHAR, max_size=40),
    st.sampled_from(["", " ", "\t\n", "\x00", "-", "--json", "\ud800", "caf\udce9", "\u200b", "x" * 20_000]),
    st.just(SENTENCES[2]),
)


@given(
    k=K,
    queries=st.lists(TEXT, min_size=0, max_size=3),
    condition=st.one_of(st.just(CONDITION), st.just(CONDITION), st.just(f"  {CONDITION} "), TEXT),
    as_json=st.booleans(),
)
@example(k=1, queries=["caf\udce9"], condition=CONDITION, as_json=True)  # `query $'caf\xe9'` (issue 24)
@example(k=1, queries=["q"], condition="\udcff", as_json=False)
@example(k=10**20, queries=["q"], condition=CONDITION, as_json=True)
@example(k=len(SENTENCES), queries=["q\u2028r"], condition=CONDITION, as_json=True)
@SETTINGS
def test_any_k_query_and_condition_get_results_or_one_line(
    hashed: Path, k: object, queries: list[str], condition: str, as_json: bool
) -> None:
    argv = ["query", "-c", condition, "-k", str(k), "--index-dir", str(hashed), *(["--json"] if as_json else [])]
    result = CliRunner().invoke(main, [*argv, "--", *queries])  # after '--', '--json' is a query too
    check_outcome(result)
    if result.exit_code == 0 and as_json:
        answers = [_strict_json(line) for line in result.stdout.splitlines()]
        assert len(answers) == len([q for q in queries if q != "-"])  # '-' reads stdin, empty here
        for answer in answers:
            assert len(answer["results"]) == min(int(str(k)), len(SENTENCES))
            assert {hit["id"] for hit in answer["results"]} <= set(IDS)


# ---------------------------------------------------------------- index: id columns of any arrow type


def _column(kind: str, values: st.SearchStrategy[Any], arrow: pa.DataType | None = None) -> st.SearchStrategy:
    nullable = st.one_of(st.none(), values)
    return st.lists(nullable, min_size=1, max_size=6).map(lambda v: (kind, pa.array(v, type=arrow)))


_INT_TYPES = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64()]
_ARROW_TEXT = st.text(st.characters(codec="utf-8"), max_size=6)
ID_COLUMNS = st.one_of(
    *(
        _column(str(t), st.integers(-(2 ** (t.bit_width - 1)), 2 ** (t.bit_width - 1) - 1), t)
        if pa.types.is_signed_integer(t)
        else _column(str(t), st.integers(0, 2**t.bit_width - 1), t)
        for t in _INT_TYPES
    ),
    _column("string", _ARROW_TEXT, pa.string()),
    _column("large_string", _ARROW_TEXT, pa.large_string()),
    st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=1, max_size=6).map(
        lambda v: ("dictionary", pa.array(v).dictionary_encode())
    ),
    _column("double", st.floats(allow_nan=True, allow_infinity=True), pa.float64()),
    _column("bool", st.booleans(), pa.bool_()),
    _column("binary", st.binary(max_size=4), pa.binary()),
    _column("timestamp", st.integers(0, 2**31), pa.timestamp("s")),
    _column("date", st.dates(min_value=datetime.date(1970, 1, 1)), pa.date32()),
    _column("decimal", st.decimals(-999, 999, places=2), pa.decimal128(5, 2)),
    _column("list", st.lists(st.integers(-3, 3), max_size=2), pa.list_(pa.int64())),
    _column("struct", st.fixed_dictionaries({"a": st.integers(-3, 3)}), pa.struct([("a", pa.int64())])),
    st.integers(1, 6).map(lambda n: ("null", pa.nulls(n))),
)


_RUNS = itertools.count()


@given(column=ID_COLUMNS, condition=st.one_of(st.just(CONDITION), st.just(CONDITION), TEXT), data=st.data())
@SETTINGS
def test_any_id_column_and_condition_are_indexed_or_refused_in_one_line(
    tmp_path: Path, hashed: Path, column: tuple[str, pa.Array], condition: str, data: st.DataObject
) -> None:
    kind, ids = column
    texts = data.draw(st.lists(st.sampled_from([*SENTENCES, "", None]), min_size=len(ids), max_size=len(ids)))
    run = next(_RUNS)
    path, index_dir = tmp_path / f"{run}.parquet", tmp_path / f"indexes-{run}"
    pq.write_table(pa.table({"id": ids, "text": texts}), path)
    result = CliRunner().invoke(main, ["index", str(path), "-c", condition, "--index-dir", str(index_dir)])
    check_outcome(result)
    kept = [(i, t) for i, t in zip(ids.to_pylist(), texts, strict=True) if t]
    plain = ids.type.value_type if pa.types.is_dictionary(ids.type) else ids.type
    json_safe = pa.types.is_integer(plain) or pa.types.is_string(plain) or pa.types.is_large_string(plain)
    if result.exit_code == 0:
        assert json_safe, (kind, ids)
        answer = CliRunner().invoke(
            main, ["query", SENTENCES[0], "-c", condition, "-k", "3", "--index-dir", str(index_dir), "--json"]
        )
        check_outcome(answer)
        assert answer.exit_code == 0, answer.output
        [row] = [_strict_json(line) for line in answer.stdout.splitlines()]
        assert [h["id"] for h in row["results"]] and all(h["id"] in {i for i, _ in kept} for h in row["results"])
    elif condition != CONDITION:
        pass  # a blank or undecodable condition: any one-line refusal will do
    elif not json_safe:  # refused by type, before any row is read
        assert "ids must be strings or integers" in result.stderr, (kind, result.stderr)
    else:
        reasons = ("null ids", "duplicate id", "64-bit", "no non-empty texts")
        assert any(r in result.stderr for r in reasons), (kind, ids, result.stderr)


# ---------------------------------------------------------------- index: factory strings and search parameters

FACTORY_SCRIPT = """
import sys
import numpy as np
from hypothesis import given, settings, strategies as st
from condsearch.base.ann import check_factory
from condsearch.base.faiss_indexes import build_index, normalize, search

near_valid = st.from_regex(
    r"(HNSW|IVF|PQ|SQ|Flat|NSG|IDMap2?|OPQ)[0-9]{0,12}(x[0-9]{0,3})?(,(Flat|PQ[0-9]{0,3}(x[0-9]{0,3})?|SQ[0-9a-z]{0,4}|RFlat))?",
    fullmatch=True,
)
def compose(structure, size, codes, m, bits):
    head = structure.format(size)
    tail = codes.format(m, bits)
    return ",".join(p for p in (head, tail) if p) or "Flat"

structured = st.builds(
    compose,
    st.sampled_from(["", "HNSW{}", "IVF{}"]),
    st.one_of(st.integers(-1, 40), st.just(10**12)),  # (IVF with as many lists as rows trains for seconds)
    st.sampled_from(["", "Flat", "PQ{}", "PQ{}x{}", "SQ4", "SQ8", "SQfp16", "SQ3"]),
    st.sampled_from([0, 1, 2, 3, 4, 5, 8, 16, 32]),
    st.one_of(st.integers(0, 5), st.just(17)),
)
params = st.one_of(
    st.just(""),
    st.just(""),
    st.from_regex(r"(efSearch|nprobe|max_codes|ht)=-?[0-9]{1,22}", fullmatch=True),
    st.builds("{}={}".format, st.sampled_from(["efSearch", "nprobe", "max_codes"]), st.integers(0, 70000)),
)
x = normalize(np.random.default_rng(0).standard_normal((260, 16)).astype(np.float32))
built = []

def build(factory, search_params):
    try:
        if check_factory(factory, len(x), 16).pq_m:
            return  # PQ forms are built in test_ann.py: training each sub-vector's codebook takes seconds
        index = build_index(x, factory, search_params=search_params)
    except ValueError as exc:
        assert "\\n" not in str(exc), str(exc)
        return
    found = search(index, x[:2], 300)  # every row, from any index type
    assert found.ids.shape == (2, 260) and (found.ids >= 0).all(), factory
    built.append(factory)

examples = settings(max_examples=int(sys.argv[1]), deadline=None, database=None)
examples(given(factory=structured, search_params=params)(build))()
examples(given(factory=st.one_of(near_valid, st.text(max_size=12)), search_params=params)(build))()
print(len(built), "built")
"""


def test_any_factory_and_search_params_build_or_are_refused_without_ending_the_process() -> None:
    # FAISS ends the process on some factory strings (HNSW0: SIGABRT, HNSW1: SIGSEGV, PQ4x0: SIGFPE):
    # generated strings are built in a child process, whose death the test sees
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", FACTORY_SCRIPT, "150"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    assert done.stdout.strip().endswith("built")


# ---------------------------------------------------------------- query -f: special files (issue 37)

_QUERY_FILE_SCRIPT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a reader that never ends fails here, not the machine
from condsearch.cli import main
main(["query", "-c", "c", "-f", sys.argv[1], "--index-dir", sys.argv[2]])
"""


@pytest.mark.parametrize("kind", ["/dev/zero", "fifo"])
def test_query_file_that_is_a_device_or_a_fifo_is_refused_without_reading(tmp_path: Path, kind: str) -> None:
    """`query -f /dev/zero` read 1 GB a second without end; a FIFO with no writer blocked for ever."""
    import os
    import subprocess
    import sys

    if kind == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs here")
        os.mkfifo(tmp_path / "queries")
    path, named = (
        (Path(kind), "a character device") if kind == "/dev/zero" else (tmp_path / "queries", "a FIFO (named pipe)")
    )
    argv = [sys.executable, "-c", _QUERY_FILE_SCRIPT, str(path), str(tmp_path / "idx")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    expected = f"Error: cannot read queries from {path}: {named}, not a regular file; refusing to read it"
    assert done.stderr.strip().splitlines() == [expected]


def test_query_file_dash_reads_stdin_and_a_missing_file_is_one_line(hashed: Path, tmp_path: Path) -> None:
    argv = ["query", "-c", CONDITION, "-k", "1", "--json", "--index-dir", str(hashed)]
    result = CliRunner().invoke(main, [*argv, "-f", "-"], input=f"{SENTENCES[1]}\n\n{SENTENCES[3]}\n")
    check_outcome(result)
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["results"][0]["id"] for line in result.stdout.splitlines()] == ["s1", "s3"]
    missing = CliRunner().invoke(main, [*argv, "-f", str(tmp_path / "none.txt")])
    check_outcome(missing)
    assert missing.exit_code == 1 and "none.txt: no such file" in missing.stderr
