"""`--mode auto`, the default (issue 39): the router for the default model, CASE for others, and a re-index keeps
the mode its corpus's indexes were built in, so it stays incremental whatever the default is now."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import condsearch
from condsearch.cli import main
from condsearch.store.folder import IndexStore
from condsearch.store.listing import kept_mode
from condsearch.store.manifest import Manifest
from tests.conftest import SENTENCES

COLOUR = "color of the dress"


def run(*args: object) -> Result:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    return result


def _index(corpus: Path, index_dir: Path, *flags: object) -> dict[str, object]:
    out = run("index", corpus, "-c", COLOUR, "--index-dir", index_dir, "--json", "--device", "cpu", *flags)
    [line] = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    return line


def test_a_reindex_keeps_the_mode_its_index_was_built_in(
    tiny_bert_dir: Path, write_corpus: object, tmp_path: Path
) -> None:
    ids = [f"s{i}" for i in range(len(SENTENCES))]
    first = write_corpus({"id": ids[:-1], "text": list(SENTENCES[:-1])})  # type: ignore[operator]
    built = _index(first, tmp_path / "ix", "--model", tiny_bert_dir, "--mode", "csr", "--router", "none")
    assert built["mode"] == "csr" and built["encoded"] == len(SENTENCES) - 1
    # the tiny model has no shipped router, so auto alone would be CASE: the kept index's mode wins
    grown = write_corpus({"id": ids, "text": list(SENTENCES)})  # type: ignore[operator]
    again = _index(grown, tmp_path / "ix", "--model", tiny_bert_dir)
    assert again["mode"] == "csr" and again["index"] == built["index"]
    assert (again["encoded"], again["reused"]) == (1, len(SENTENCES) - 1)  # incremental: one new row
    # a fresh store, or a mode named, does not look back
    assert _index(grown, tmp_path / "fresh", "--model", tiny_bert_dir)["mode"] == "case"
    assert _index(grown, tmp_path / "ix", "--model", tiny_bert_dir, "--mode", "case")["mode"] == "case"


@pytest.mark.slow
def test_the_python_api_keeps_the_mode_as_index_does(tmp_path: Path) -> None:
    # the default model: auto would be the router, but a CASE corpus stays CASE
    store = condsearch.open(tmp_path / "api", device="cpu")
    [name] = store.index(list(SENTENCES), conditions=[COLOUR], name="c", mode="case")
    assert store.index(list(SENTENCES), conditions=[COLOUR], name="c") == [name]
    assert IndexStore(tmp_path / "api").read_manifest(name).mode == "case"
    assert kept_mode(IndexStore(tmp_path / "api").manifests(), "c", [COLOUR]) == "case"


def _manifest(corpus: str, condition: str, mode: str) -> Manifest:
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(Manifest)}
    values: dict[str, object] = {}
    for name, field in fields.items():
        if field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING:
            continue
        values[name] = "" if field.type in ("str", str) else 0
    return dataclasses.replace(Manifest(**values), corpus_name=corpus, condition=condition, mode=mode)  # type: ignore[arg-type]


def test_kept_mode_is_the_one_mode_of_the_corpus_indexes_under_those_conditions() -> None:
    listing = [
        ("a", _manifest("c", COLOUR, "csr")),
        ("b", _manifest("c", "the sport", "case")),
        ("d", _manifest("other", COLOUR, "case")),
        ("e", ValueError("damaged")),
    ]
    assert kept_mode(listing, "c", [COLOUR]) == "csr"  # type: ignore[arg-type]
    assert kept_mode(listing, "c", [f" {COLOUR} "]) == "csr"  # type: ignore[arg-type]  # as conditions are matched
    assert kept_mode(listing, "c", ["the sport"]) == "case"  # type: ignore[arg-type]
    assert kept_mode(listing, "c", [COLOUR, "the sport"]) is None  # type: ignore[arg-type]  # two modes: the default
    assert kept_mode(listing, "c", ["new"]) is None  # type: ignore[arg-type]
    assert kept_mode(listing, "nobody", [COLOUR]) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "mode"),
    [
        ({}, "csr"),
        ({"kept": "case"}, "case"),
        ({"kept": "case", "router": True}, "csr"),
        ({"kept": "csr", "case_settings": True}, "case"),
    ],
)
def test_auto_takes_named_settings_then_the_kept_mode_then_the_model(kwargs: dict[str, object], mode: str) -> None:
    from condsearch.model.artifacts.profiles import resolve_mode

    assert resolve_mode("auto", **kwargs) == mode  # type: ignore[arg-type]
