"""Case-only variants of an indexed condition (issue 59, item 3), and builds and deletions in the log.

Conditions are compared after NFC and whitespace folding (issue 58); an uncased model's are lower-cased into one
index. A cased model's "color of the dress" beside an indexed "Color of the dress" would be a second, permanent
index that a typo built: `index` and `query` ask first (--yes skips; without a terminal, one line and exit 1,
nothing built), the server answers 409 naming the existing one unless the request says ``"force": true``.
A copy of the tiny BERT whose tokenizer says it is cased stands in for a cased model.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from fastapi.testclient import TestClient

import condsearch
from condsearch.base.model_sources import model_lowercases
from condsearch.cli import main
from condsearch.errors import CaseVariant
from condsearch.model.vectorizer import Vectorizer
from condsearch.query.on_demand import build_on_demand
from condsearch.query.resident import Resident
from condsearch.serve.app import create_app
from condsearch.serve.config import ServeConfig
from condsearch.store.folder import IndexStore
from condsearch.store.listing import case_variant
from tests.conftest import HashEncoder
from tests.csr_corpus import write_csr_corpus
from tests.query.test_on_demand import snapshot

INDEXED, VARIANT = "Color of the dress", "color of the dress"
TEXTS = [f"a girl in a {c} dress plays {s}" for c in ("red", "blue", "green", "pink") for s in ("tennis", "golf")]


@pytest.fixture(scope="module")
def cased_bert_dir(tiny_bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny BERT, its tokenizer marked cased: conditions that differ in case name two indexes."""
    folder = tmp_path_factory.mktemp("cased-bert") / "model"
    shutil.copytree(tiny_bert_dir, folder)
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "do_lower_case": False}))
    assert not model_lowercases(str(folder)) and model_lowercases(str(tiny_bert_dir))
    return folder


def invoke(*args: object, input: str | None = None) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def conditions(folder: Path) -> list[str]:
    return sorted(m.condition for _, m in IndexStore(folder).manifests())


def one_line_refusal(result: Result) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


# ---------------------------------------------------------------- which conditions are variants


def test_a_variant_differs_only_in_case_after_nfc_and_whitespace_folding(tmp_path: Path) -> None:
    store = condsearch.open(tmp_path, model=condsearch.Model(Vectorizer(HashEncoder(), None, "none", "")))
    store.index(TEXTS, [INDEXED, "Caf\u00e9 style"], name="c")  # HashEncoder's test/hash is cased
    listing = IndexStore(tmp_path).manifests()
    assert case_variant(listing, "c", VARIANT) == INDEXED
    assert case_variant(listing, "c", "  COLOR\u00a0of the   dress ") == INDEXED
    assert case_variant(listing, "c", "CAFE\u0301 STYLE") == "Caf\u00e9 style"  # decomposed é: NFC first
    assert case_variant(listing, "c", f" {INDEXED}\u200b") is None  # the same condition: its own index
    assert case_variant(listing, "c", "color of the hat") is None
    assert case_variant(listing, "other", VARIANT) is None  # another corpus's conditions are not compared


# ---------------------------------------------------------------- condsearch index


def index(corpus: Path, folder: Path, model: Path, condition: str, *flags: str, input: str | None = None) -> Result:
    args = ("index", corpus, "-c", condition, "--model", model, "--head", "none", "--index-dir", folder, *flags)
    return invoke(*args, input=input)


def test_index_asks_before_a_case_only_variant_and_builds_nothing_unasked(
    cased_bert_dir: Path, corpus_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "ix"
    assert index(corpus_file, folder, cased_bert_dir, INDEXED).exit_code == 0
    before = snapshot(folder)
    line = one_line_refusal(index(corpus_file, folder, cased_bert_dir, VARIANT))  # no terminal: no question
    assert f"indexed under {INDEXED!r}" in line and "only in case" in line and "--yes" in line
    assert snapshot(folder) == before
    monkeypatch.setattr("condsearch.cli.common.stdin_is_terminal", lambda: True)
    said_no = index(corpus_file, folder, cased_bert_dir, VARIANT, input="n\n")
    assert said_no.exit_code == 1 and "Build a second index under 'color of the dress'?" in said_no.stderr
    assert snapshot(folder) == before
    said_yes = index(corpus_file, folder, cased_bert_dir, VARIANT, input="y\n")
    assert said_yes.exit_code == 0, said_yes.output
    assert conditions(folder) == [INDEXED, VARIANT]


def test_index_yes_builds_the_variant_and_an_uncased_model_asks_nothing(
    cased_bert_dir: Path, tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    cased, uncased = tmp_path / "cased", tmp_path / "uncased"
    assert index(corpus_file, cased, cased_bert_dir, INDEXED).exit_code == 0
    assert index(corpus_file, cased, cased_bert_dir, VARIANT, "--yes").exit_code == 0
    assert conditions(cased) == [INDEXED, VARIANT]
    again = index(corpus_file, cased, cased_bert_dir, INDEXED)  # re-indexing an indexed condition asks nothing
    assert again.exit_code == 0, again.output
    # an uncased model reads both alike: one index, re-indexed, no question
    assert index(corpus_file, uncased, tiny_bert_dir, INDEXED).exit_code == 0
    result = index(corpus_file, uncased, tiny_bert_dir, VARIANT)
    assert result.exit_code == 0, result.output
    assert conditions(uncased) == [VARIANT]


# ---------------------------------------------------------------- a build on demand: query and the server


@pytest.fixture
def router_folder(cased_bert_dir: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "csr"
    corpus = write_csr_corpus(tmp_path / "c.parquet")
    flags = ("--mode", "csr", "--router", "none")
    result = index(corpus, folder, cased_bert_dir, INDEXED, *flags)
    assert result.exit_code == 0, result.output
    return folder


def test_query_asks_before_building_a_case_only_variant(router_folder: Path) -> None:
    before = snapshot(router_folder)
    ask = ("query", "a girl in a red dress", "-c", VARIANT, "-k", 3, "--index-dir", router_folder)
    line = one_line_refusal(invoke(*ask))
    assert f"indexed under {INDEXED!r}" in line and "--yes" in line
    assert snapshot(router_folder) == before
    built = invoke(*ask, "--yes")
    assert built.exit_code == 0, built.output
    assert conditions(router_folder) == [INDEXED, VARIANT]
    assert invoke(*ask).exit_code == 0  # indexed now: found, nothing asked


def test_the_library_refuses_only_when_asked_to(router_folder: Path) -> None:
    store = IndexStore(router_folder)
    with pytest.raises(CaseVariant) as info:
        build_on_demand(store, VARIANT, case_variants=False)
    assert info.value.existing == INDEXED and info.value.condition == VARIANT
    assert conditions(router_folder) == [INDEXED]


def test_the_server_answers_409_with_the_existing_condition_unless_forced(router_folder: Path) -> None:
    before = snapshot(router_folder)
    resident = Resident(IndexStore(router_folder), device="cpu")
    with TestClient(create_app(resident, ServeConfig(index_dir=router_folder))) as http:
        asked = {"query": "a girl in a red dress", "condition": VARIANT, "k": 3}
        refused = http.post("/query", json=asked)
        assert refused.status_code == 409, refused.text
        body = refused.json()
        assert body["existing"] == INDEXED and "only in case" in body["error"] and '"force": true' in body["error"]
        assert "\n" not in body["error"]
        assert snapshot(router_folder) == before
        assert http.post("/query", json={**asked, "condition": INDEXED}).status_code == 200  # the indexed one
        forced = http.post("/query", json={**asked, "force": True})
        assert forced.status_code == 200, forced.text
        assert [r["rank"] for r in forced.json()["results"][0]["results"]] == [1, 2, 3]
    assert conditions(router_folder) == [INDEXED, VARIANT]


# ---------------------------------------------------------------- builds and deletions are logged


def test_builds_changes_and_drops_are_logged_with_rows_and_seconds(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="condsearch")
    store = condsearch.open(tmp_path, model=condsearch.Model(Vectorizer(HashEncoder(), None, "none", "")))
    store.index(TEXTS, [INDEXED], ids=[f"r{i}" for i in range(len(TEXTS))], name="c")
    store.delete(["r0"], corpus="c")
    store.drop("c")
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("condsearch")]
    built = [m for m in lines if m.startswith("built index")]
    assert len(built) == 1 and "corpus 'c'" in built[0] and repr(INDEXED) in built[0] and "8 rows" in built[0]
    assert built[0].endswith(" s")
    changed = [m for m in lines if m.startswith("changed index")]
    assert len(changed) == 1 and "7 rows now, 1 deleted" in changed[0] and changed[0].endswith(" s")
    dropped = [m for m in lines if m.startswith("dropped index")]
    assert len(dropped) == 1 and "corpus 'c'" in dropped[0] and "7 rows" in dropped[0] and dropped[0].endswith(" s")
    assert all(r.levelno == logging.INFO for r in caplog.records if r.getMessage() in built + changed + dropped)
