"""The Python API: README's lines on the demo corpus, in-memory and file inputs, models shared, bad input."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import condsearch
from condsearch.corpus.demo import read_demo_rows
from condsearch.errors import CondsearchError, CorpusError
from condsearch.query.hits import Hits
from condsearch.store.folder import IndexStore
from tests.tolerance import assert_rows_close, vector_tolerance

COLOUR = "color of the dress"
README = Path(__file__).resolve().parents[2] / "README.md"


def readme_python() -> str:
    """Return the code block of README's "From Python" section."""
    section = README.read_text(encoding="utf-8").split("## From Python", 1)[1]
    block = re.search(r"```python\n(.*?)```", section, re.S)
    assert block, "README's From Python section lacks its code block"
    return block.group(1)


def run_readme(folder: Path, texts: object, model: condsearch.Model | None) -> dict:
    """Run README's lines with texts (and model, when given) in place of its own, indexing into folder."""
    code = readme_python()
    assert 'condsearch.open("indexes")' in code and re.search(r"^texts = ", code, re.M)
    code = re.sub(r"^texts = .*$", "texts = DEMO", code, flags=re.M)
    code = code.replace('condsearch.open("indexes")', "condsearch.open(FOLDER, model=MODEL)")
    space = {"DEMO": texts, "FOLDER": folder, "MODEL": model}
    exec(compile(code, str(README), "exec"), space)  # noqa: S102 - the README's own lines
    return space


@pytest.fixture(scope="module")
def tiny_model(tiny_bert_dir: Path) -> condsearch.Model:
    # a CASE model whatever the default mode (tests/api/test_api_csr.py: the router's)
    return condsearch.load_model(str(tiny_bert_dir), mode="case", profile="none", device="cpu")


@pytest.fixture(scope="module")
def demo() -> tuple[list[str], list[str]]:
    return read_demo_rows()


def _check_readme_run(space: dict, texts: list[str]) -> None:
    hits = space["hits"]
    assert isinstance(hits, Hits) and len(hits) == 5 and hits.condition == COLOUR
    assert all(h.text == texts[h.row] and h.id == h.row for h in hits)  # no ids given: row numbers
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    frame = space["hits"].to_pandas()
    assert frame["id"].tolist() == [h.id for h in hits]


def test_readme_lines_on_the_demo_corpus_as_a_list_and_as_a_dataframe(
    tmp_path: Path, tiny_model: condsearch.Model, demo: tuple[list[str], list[str]]
) -> None:
    pd = pytest.importorskip("pandas")
    _, texts = demo
    as_list = run_readme(tmp_path / "a", texts, tiny_model)
    _check_readme_run(as_list, texts)
    as_frame = run_readme(tmp_path / "b", pd.DataFrame({"text": texts}), tiny_model)
    _check_readme_run(as_frame, texts)
    assert as_list["hits"].to_dicts() == as_frame["hits"].to_dicts()  # the same rows give the same index
    vectors = [np.load(next((tmp_path / d).glob("color-of-the-dress-*")) / "vectors.npy") for d in "ab"]
    np.testing.assert_array_equal(*vectors)


@pytest.mark.slow
def test_readme_lines_with_the_default_model(tmp_path: Path, demo: tuple[list[str], list[str]]) -> None:
    """The README as written: the embedded all-MiniLM-L6-v2 with its default profile."""
    pd = pytest.importorskip("pandas")
    _, texts = demo
    for i, data in enumerate([texts, pd.DataFrame({"text": texts})]):
        space = run_readme(tmp_path / str(i), data, None)
        _check_readme_run(space, texts)
        assert "orange dress" in space["hits"][0].text


def test_search_one_query_or_several_and_k_capped(tmp_path: Path, tiny_model: condsearch.Model, demo) -> None:
    ids, texts = demo
    store = condsearch.open(tmp_path, model=tiny_model)
    assert store.index(pa.table({"id": ids[:20], "text": texts[:20]}), COLOUR, name="demo")
    one = store.search(texts[3], condition=COLOUR, k=3)
    assert isinstance(one, Hits) and one[0].id == ids[3] and one[0].text == texts[3]
    several = store.search([texts[3], texts[7]], condition=COLOUR, k=50)  # more than the 20 rows
    assert isinstance(several, list) and [len(h) for h in several] == [20, 20]
    assert [h[0].id for h in several] == [ids[3], ids[7]]
    with pytest.raises(CondsearchError, match="a query is empty"):
        store.search(["fine", " "], condition=COLOUR)
    with pytest.raises(CondsearchError, match="k must be positive"):
        store.search("fine", condition=COLOUR, k=0)
    with pytest.raises(CondsearchError, match="no index for condition 'mood'"):
        store.search("fine", condition="mood")


def test_the_store_shares_loaded_models(tmp_path: Path, tiny_model, demo, monkeypatch: pytest.MonkeyPatch) -> None:
    import condsearch.model.policy as vectorizer

    _, texts = demo
    condsearch.open(tmp_path, model=tiny_model).index(texts[:12], [COLOUR, "the sport"], name="c")
    loads: list[object] = []
    real = vectorizer.vectorizer_for

    def counting(manifest, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        loads.append(manifest)
        return real(manifest, *args, **kwargs)

    monkeypatch.setattr(vectorizer, "vectorizer_for", counting)
    store = condsearch.open(tmp_path)  # a fresh store: loads the model the indexes record, once for both
    first = store.search(texts[1], condition=COLOUR, k=2)
    store.search(texts[1], condition="the sport", k=2)
    store.search(texts[2], condition=COLOUR, k=2)
    assert len(loads) == 1 and first[0].row == 1
    indexer = condsearch.open(tmp_path, model=tiny_model)  # the store that indexes searches with that model
    indexer.index(texts[:12], [COLOUR], name="c")
    indexer.search(texts[1], condition=COLOUR, k=2)
    assert len(loads) == 1


def test_reindexing_the_same_rows_in_memory_encodes_nothing(tmp_path: Path, tiny_model, demo) -> None:
    from condsearch.corpus.memory import memory_corpus

    ids, texts = demo
    a, b = memory_corpus(texts[:30], ids=ids[:30]), memory_corpus(pa.table({"id": ids[:30], "text": texts[:30]}))
    assert a.checksum == b.checksum and a.ids == b.ids
    assert memory_corpus(texts[:29], ids=ids[:29]).checksum != a.checksum
    store = condsearch.open(tmp_path, model=tiny_model)
    [name] = store.index(texts[:30], COLOUR, ids=ids[:30])
    manifest = IndexStore(tmp_path).read_manifest(name)
    assert manifest.corpus_checksum == a.checksum and manifest.corpus_name == "corpus"
    vectors = np.load(tmp_path / name / "vectors.npy")
    encoded = []
    vec = tiny_model.vectorizer
    real = vec.encoder.encode

    def counting(texts, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        encoded.extend(texts)
        return real(texts, *args, **kwargs)

    object.__setattr__(vec.encoder, "encode", counting)
    try:
        store.index(pa.table({"id": ids[:30], "text": texts[:30]}), COLOUR)
    finally:
        object.__delattr__(vec.encoder, "encode")
    assert encoded == []
    np.testing.assert_array_equal(np.load(tmp_path / name / "vectors.npy"), vectors)


@pytest.mark.numerics
def test_model_encodes_unit_vectors(tiny_model: condsearch.Model) -> None:
    out = tiny_model.encode(["a girl in a red dress", "a dog"], condition=COLOUR)
    assert out.shape == (2, tiny_model.dim) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    # alone or in a padded batch of two: the same vector up to float32 rounding at its magnitudes
    alone = tiny_model.encode(["a dog"], condition=COLOUR)
    assert_rows_close(alone, out[1:], vector_tolerance(tiny_model.vectorizer, ["a dog"], COLOUR))
    with pytest.raises(CondsearchError, match="list of texts"):
        tiny_model.encode("a dog", condition=COLOUR)  # type: ignore[arg-type]
    with pytest.raises(CondsearchError, match="the condition is empty"):
        tiny_model.encode(["a dog"], condition=" ")


@pytest.mark.parametrize(
    "data,kwargs,match",
    [
        ([], {}, "texts: no non-empty texts in column 'text'"),
        (["", "  ", None], {}, "no non-empty texts"),
        (["a", "b"], {"ids": ["x", "x"]}, "texts: duplicate id 'x'"),
        (["a", "b"], {"ids": ["x"]}, "1 ids for 2 texts"),
        (["a", 5], {}, "must be strings"),
        (pa.table({"txt": ["a"]}), {}, "Table: no column 'text'; columns are txt"),
        (pa.table({"text": ["a"], "id": [1]}), {"ids": [1]}, "ids= goes with a list of texts"),
        (pa.table({"text": ["a", "b"], "key": [1, 1]}), {"id_column": "key"}, "duplicate id 1 in column 'key'"),
        (pa.table({"text": ["a"]}), {"format": "csv"}, "format= names a file's format"),
        (["a"], {"text_column": "body"}, "a list of texts has none"),
        ("missing.csv", {}, "missing.csv: no such file"),
        (42, {}, "not int"),
    ],
)
def test_bad_inputs_are_one_line_errors(tmp_path: Path, tiny_model, data, kwargs, match: str) -> None:
    store = condsearch.open(tmp_path / "idx", model=tiny_model)
    with pytest.raises(CondsearchError, match=re.escape(match)) as info:
        store.index(data, COLOUR, **kwargs)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "idx").exists() or not IndexStore(tmp_path / "idx").names()


def test_a_dataframe_missing_its_column_is_a_corpus_error(tmp_path: Path, tiny_model) -> None:
    pd = pytest.importorskip("pandas")
    with pytest.raises(CorpusError, match="DataFrame: no column 'text'; columns are body"):
        condsearch.open(tmp_path, model=tiny_model).index(pd.DataFrame({"body": ["a"]}), COLOUR)


def test_a_milvus_store_is_searched_not_indexed_into(tmp_path: Path, tiny_model) -> None:
    store = condsearch.open(f"milvus-lite:{tmp_path / 'm.db'}", model=tiny_model)
    with pytest.raises(CondsearchError, match="a Milvus store is searched here"):
        store.index(["a"], COLOUR)


def test_import_is_lazy() -> None:
    import subprocess
    import sys

    code = "import condsearch, sys; print(sorted(m for m in ('torch', 'faiss', 'pyarrow') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert {"open", "load_model", "Hits"} <= set(dir(condsearch))


# ---------------------------------------------------------------- edges (issue 37)


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory, tiny_model: condsearch.Model) -> condsearch.Store:
    store = condsearch.open(tmp_path_factory.mktemp("edges"), model=tiny_model)
    store.index(["a girl in a red dress", "a dog on the beach", "two men play soccer"], COLOUR, ids=["a", "b", "c"])
    return store


def test_k_may_be_any_integer_but_not_a_bool_or_a_float(small_store: condsearch.Store) -> None:
    for k in (np.int64(2), np.int32(2), np.uint8(2), 2):
        hits = small_store.search("a girl in a red dress", condition=COLOUR, k=k)  # type: ignore[arg-type]
        assert len(hits) == 2 and hits[0].id == "a"
    for k in (True, 2.0, np.float64(2), "2", None):
        with pytest.raises(CondsearchError, match=r"^k must be an integer, not ") as info:
            small_store.search("a red dress", condition=COLOUR, k=k)  # type: ignore[arg-type]
        assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "data,kwargs,match",
    [
        (
            ["fine", "a \ud800 text"],
            {},
            "texts: text 1 is not valid UTF-8 (it holds a lone surrogate: 'a \\ud800 text')",
        ),
        (["a"], {"ids": ["\udcff"]}, "texts: id 0 is not valid UTF-8 (it holds a lone surrogate: '\\udcff')"),
        (["a"], {"ids": [2**64]}, "texts: id 18446744073709551616 is beyond the signed 64-bit range"),
        (["a", "b"], {"ids": [1, 2**63]}, "texts: id 9223372036854775808 is beyond the signed 64-bit range"),
        (["a"], {"ids": [-(2**63) - 1]}, "is beyond the signed 64-bit range"),
        (pa.table([pa.array(["a"]), pa.array(["b"])], names=["text", "text"]), {}, "Table: column 'text' appears 2"),
        (
            pa.table([pa.array(["a"]), pa.array(["x"]), pa.array(["y"])], names=["text", "id", "id"]),
            {},
            "Table: column 'id' appears 2 times",
        ),
        (pa.table({"text": pa.array([b"caf\xe9"]).view(pa.string())}), {}, "holds text that is not valid UTF-8"),
    ],
)
def test_hostile_texts_ids_and_columns_are_corpus_errors(tmp_path: Path, tiny_model, data, kwargs, match) -> None:
    store = condsearch.open(tmp_path / "idx", model=tiny_model)
    with pytest.raises(CorpusError, match=re.escape(match)) as info:
        store.index(data, COLOUR, **kwargs)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "idx").exists() or not IndexStore(tmp_path / "idx").names()


def test_a_dataframe_with_repeated_columns_or_lone_surrogates_is_a_corpus_error(tmp_path: Path, tiny_model) -> None:
    pd = pytest.importorskip("pandas")
    store = condsearch.open(tmp_path / "idx", model=tiny_model)
    frames = {
        "Duplicate column names": pd.DataFrame([["a", "b"]], columns=["text", "text"]),
        # pandas' own string type refuses it; an object column holds it
        "not valid UTF-8": pd.DataFrame({"text": pd.Series(["fine", "caf\udce9"], dtype=object)}),
    }
    for match, frame in frames.items():
        with pytest.raises(CorpusError, match=match) as info:
            store.index(frame, COLOUR)
        assert "\n" not in str(info.value)
    assert not (tmp_path / "idx").exists() or not IndexStore(tmp_path / "idx").names()


@pytest.mark.parametrize(
    "conditions,match",
    [
        ([], "no condition given"),
        ((), "no condition given"),
        ([COLOUR, 5], "conditions must be strings, not int"),
        (None, "conditions must be strings, not NoneType"),
        ("mo\ud800od", "the condition 'mo\\ud800od' is not valid UTF-8"),
        (["  "], "the condition is empty"),
    ],
)
def test_index_refuses_no_conditions_and_bad_ones(tmp_path: Path, tiny_model, conditions, match: str) -> None:
    store = condsearch.open(tmp_path / "idx", model=tiny_model)
    with pytest.raises(CondsearchError, match=re.escape(match)):
        store.index(["a dog"], conditions)
    assert not (tmp_path / "idx").exists() or not IndexStore(tmp_path / "idx").names()


def test_queries_and_encoded_texts_must_be_valid_strings(small_store: condsearch.Store, tiny_model) -> None:
    for queries in ("do\ud800g", ["fine", "do\udcffg"]):
        with pytest.raises(
            CorpusError, match=r"query \d is not valid UTF-8 \(it holds a lone surrogate: 'do\\ud[8c]..g'\)"
        ):
            small_store.search(queries, condition=COLOUR)
    for queries in ([None], ["fine", 5], [b"bytes"]):
        with pytest.raises(CondsearchError, match="queries must be strings, not"):
            small_store.search(queries, condition=COLOUR)  # type: ignore[arg-type]
    for queries in (5, None, b"bytes"):
        with pytest.raises(CondsearchError, match="queries must be a list of strings, not"):
            small_store.search(queries, condition=COLOUR)  # type: ignore[arg-type]
    with pytest.raises(CondsearchError, match="the condition must be a string, not NoneType"):
        small_store.search("fine", condition=None)  # type: ignore[arg-type]
    for texts, match in (
        ([None], "texts must be strings, not NoneType"),
        (["a", 5], "texts must be strings, not int"),
        (["a \ud800"], r"text 0 is not valid UTF-8 \(it holds a lone surrogate"),
    ):
        with pytest.raises(CondsearchError, match=match):
            tiny_model.encode(texts, condition=COLOUR)  # type: ignore[arg-type]
    with pytest.raises(CondsearchError, match="not valid UTF-8"):
        tiny_model.encode(["a dog"], condition="mo\ud800od")
