"""Change by id and index lifecycle (issue 59): upsert, delete, get, count, list, drop; CLI rm/delete, server DELETE."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import condsearch
from condsearch.cli import main
from condsearch.errors import CondsearchError, UnknownCondition
from condsearch.model.vectorizer import Vectorizer
from condsearch.store.folder import INDEX_FILE, ROWS_FILE, VECTORS_FILE, VERSIONS, IndexStore
from condsearch.store.lifecycle import CorpusBusy, UnknownCorpus, UnknownIds, quiet_locks
from tests.conftest import HashEncoder

COLOUR, SPORT = "color of the dress", "the sport"
TEXTS = [f"a girl in a {c} dress plays {s}" for c in ("red", "blue", "green", "pink") for s in ("tennis", "golf")]


def _store(root: Path) -> tuple[condsearch.Store, HashEncoder]:
    encoder = HashEncoder()
    return condsearch.open(root, model=condsearch.Model(Vectorizer(encoder, None, "none", ""))), encoder


def _indexed(root: Path, texts: list[str] = TEXTS, name: str = "c") -> tuple[condsearch.Store, HashEncoder]:
    store, encoder = _store(root)
    store.index(texts, [COLOUR, SPORT], ids=[f"r{i}" for i in range(len(texts))], name=name)
    encoder.batches.clear()
    return store, encoder


def _rows(root: Path, condition: str) -> tuple[list, np.ndarray]:
    store = IndexStore(root)
    loaded = store.load(store.find(condition, "c"))
    return loaded.ids, np.load(root / loaded.name / VECTORS_FILE)


def test_upsert_and_delete_equal_a_rebuild_and_encode_only_what_changed(tmp_path: Path) -> None:
    store, encoder = _indexed(tmp_path / "a")
    report = store.upsert(["a boy in a red coat", "a dog on the beach"], ids=["r1", "new"], corpus="c")
    # two texts under two conditions, nothing else (a pair without a sentence is the condition's own vector)
    assert report.n_encoded == 4 and len([p for p in encoder.seen if p[1] is not None]) == 4
    encoder.batches.clear()
    store.delete(["r0", "r5"], corpus="c")
    assert encoder.seen == []  # a delete encodes nothing
    assert store.count("c") == len(TEXTS) - 1
    expected_texts = [t for i, t in enumerate(TEXTS) if i not in (0, 5)]
    expected_texts[0] = "a boy in a red coat"
    expected_ids = [f"r{i}" for i in range(len(TEXTS)) if i not in (0, 5)] + ["new"]
    rebuilt, _ = _store(tmp_path / "b")
    rebuilt.index([*expected_texts, "a dog on the beach"], [COLOUR, SPORT], ids=expected_ids, name="c")
    for condition in (COLOUR, SPORT):
        ids_a, vec_a = _rows(tmp_path / "a", condition)
        ids_b, vec_b = _rows(tmp_path / "b", condition)
        assert ids_a == ids_b == expected_ids
        np.testing.assert_array_equal(vec_a, vec_b)
        hits_a = store.search("a red coat", condition=condition, k=5, corpus="c")
        hits_b = rebuilt.search("a red coat", condition=condition, k=5, corpus="c")
        assert [h.id for h in hits_a] == [h.id for h in hits_b]
    assert store.get(["new", "r1"], corpus="c") == [
        {"id": "new", "text": "a dog on the beach"},
        {"id": "r1", "text": "a boy in a red coat"},
    ]
    [info] = store.list()
    assert (info.name, info.count, sorted(info.conditions)) == ("c", len(TEXTS) - 1, [COLOUR, SPORT])


def test_bad_ids_are_one_line_and_change_nothing(tmp_path: Path) -> None:
    store, _ = _indexed(tmp_path)
    before = {n: os.readlink(tmp_path / n) for n in IndexStore(tmp_path).names()}
    with pytest.raises(UnknownIds, match=r"1 of 2 ids are not in corpus 'c': 'nope'"):
        store.delete(["r1", "nope"], corpus="c")
    with pytest.raises(UnknownIds, match="not in corpus"):
        store.get(["nope"], corpus="c")
    with pytest.raises(UnknownCorpus, match="no corpus 'other'"):
        store.delete(["r1"], corpus="other")
    with pytest.raises(CondsearchError, match="more than once"):
        store.upsert(["x", "y"], ids=["r1", "r1"], corpus="c")
    with pytest.raises(CondsearchError, match="one id per text"):
        store.upsert(["x"], ids=["r1", "r2"], corpus="c")
    with pytest.raises(CondsearchError, match="every row"):
        store.delete([f"r{i}" for i in range(len(TEXTS))], corpus="c")
    assert {n: os.readlink(tmp_path / n) for n in IndexStore(tmp_path).names()} == before


def test_drop_one_condition_then_the_corpus_returns_the_space_and_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, _ = _indexed(tmp_path)
    index_store = IndexStore(tmp_path)
    sport = index_store.find(SPORT, "c")
    caplog.set_level(logging.INFO, logger="condsearch")
    assert store.drop("c", SPORT) == [sport]
    assert not (tmp_path / sport).exists() and not (tmp_path / VERSIONS / sport).exists()
    with pytest.raises(UnknownCondition):
        store.search("red", condition=SPORT, corpus="c", build=False)
    assert len(store.drop("c")) == 1
    assert IndexStore(tmp_path).names() == [] and store.list() == []
    left = [p for p in (tmp_path / VERSIONS).iterdir() if not p.name.endswith("lock")]
    assert left == []  # every version folder gone: only empty lock files stay
    assert sum(p.stat().st_size for p in (tmp_path / VERSIONS).iterdir()) == 0
    assert "dropped index" in caplog.text


def test_drop_is_refused_while_a_build_holds_the_corpus(tmp_path: Path) -> None:
    store, _ = _indexed(tmp_path)
    names = IndexStore(tmp_path).names()
    with quiet_locks(IndexStore(tmp_path), names[:1], "c"):  # as a build under way holds its writer lock
        with pytest.raises(CorpusBusy, match="being built or changed"):
            store.drop("c")
    assert IndexStore(tmp_path).names() == names


def test_a_reader_mid_query_during_rm_finishes_on_the_old_files(tmp_path: Path) -> None:
    store, _ = _indexed(tmp_path)
    index_store = IndexStore(tmp_path)
    name = index_store.find(COLOUR, "c")
    expected = [h.id for h in store.search("a red dress", condition=COLOUR, corpus="c", k=3)]
    # a reader that opened the version's files (as a load does) before the drop reads them whole after it
    with index_store._open(name, (INDEX_FILE, ROWS_FILE)) as files:  # noqa: SLF001 - the reader's own step
        store.drop("c")
        assert not (tmp_path / name).exists()
        assert all(len(fh.read()) > 0 for fh in files.opened.values())
    # readers querying in threads while the corpus is dropped: each query answers whole, or is told it is gone
    errors: list[BaseException] = []
    answers: list[list[str]] = []
    store, _ = _indexed(tmp_path)
    start = threading.Barrier(5)

    def query() -> None:
        reader = condsearch.open(tmp_path, model=store._model)  # noqa: SLF001 - the same model
        reader._models.update(store._models)  # noqa: SLF001 - no model load for the hash encoder
        start.wait()
        for _ in range(30):
            try:
                answers.append([h.id for h in reader.search("a red dress", condition=COLOUR, corpus="c", k=3)])
            except (UnknownCondition, UnknownCorpus, CondsearchError) as exc:
                if "no index" not in str(exc) and "not an index" not in str(exc):
                    errors.append(exc)
            except BaseException as exc:  # noqa: BLE001 - any other failure is the test's
                errors.append(exc)

    threads = [threading.Thread(target=query) for _ in range(4)]
    for t in threads:
        t.start()
    start.wait()
    store.drop("c")
    for t in threads:
        t.join()
    assert errors == []
    assert all(a == expected for a in answers)


def test_cli_rm_and_delete(tmp_path: Path) -> None:
    store, _ = _indexed(tmp_path)
    runner = CliRunner()
    ids = tmp_path / "ids.txt"
    ids.write_text("r1\nr2\n\n", encoding="utf-8")
    done = runner.invoke(main, ["delete", "c", "--ids", str(ids), "--index-dir", str(tmp_path)])
    assert done.exit_code == 0, done.output
    assert store.count("c") == len(TEXTS) - 2
    ids.write_text("zz\n", encoding="utf-8")
    bad = runner.invoke(main, ["delete", "c", "--ids", str(ids), "--index-dir", str(tmp_path)])
    assert bad.exit_code != 0 and "not in corpus 'c'" in bad.output and len(bad.output.strip().splitlines()) == 1
    refused = runner.invoke(main, ["rm", "c", "--index-dir", str(tmp_path)])  # not a terminal and no --yes
    assert refused.exit_code != 0 and "--yes" in refused.output and len(refused.output.strip().splitlines()) == 1
    assert len(IndexStore(tmp_path).names()) == 2
    one = runner.invoke(main, ["rm", "c", "-c", SPORT, "--yes", "--index-dir", str(tmp_path)])
    assert one.exit_code == 0, one.output
    assert len(IndexStore(tmp_path).names()) == 1
    unknown = runner.invoke(main, ["rm", "nope", "--yes", "--index-dir", str(tmp_path)])
    assert unknown.exit_code != 0 and "no corpus 'nope'" in unknown.output
    assert runner.invoke(main, ["rm", "c", "--yes", "--index-dir", str(tmp_path)]).exit_code == 0
    assert IndexStore(tmp_path).names() == []


def test_server_delete_route(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from condsearch.query.resident import Resident
    from condsearch.serve.app import create_app
    from condsearch.serve.config import ServeConfig

    store, _ = _indexed(tmp_path)
    resident = Resident(IndexStore(tmp_path), lambda m: store._models[next(iter(store._models))])  # noqa: SLF001
    config = ServeConfig(api_key="k", build=False)
    with TestClient(create_app(resident, config)) as client:
        assert client.delete("/indexes/c").status_code == 401
        key = {"X-API-Key": "k"}
        assert client.delete("/indexes/nope", headers=key).status_code == 404
        with quiet_locks(IndexStore(tmp_path), IndexStore(tmp_path).names()[:1], "c"):
            busy = client.delete("/indexes/c", headers=key)
        assert busy.status_code == 409 and "being built" in busy.json()["error"]
        one = client.delete("/indexes/c", params={"condition": SPORT}, headers=key)
        assert one.status_code == 200 and len(one.json()["deleted"]) == 1
        assert client.delete("/indexes/c", params={"condition": "mood"}, headers=key).status_code == 404
        assert client.delete("/indexes/c", headers=key).status_code == 200
        assert client.get("/indexes", headers=key).json()["indexes"] == []
