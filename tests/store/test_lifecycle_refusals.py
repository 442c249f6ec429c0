"""Issue 59's refusals of change by id and of removal: each bad input is one line and a 4xx (or a non-zero exit).

Ids not in the corpus (delete and get: how many, and the first few), a corpus in use by a build (a
server's build on demand of a condition not indexed yet: DELETE answers 409; `condsearch rm` while a
build holds the corpus: one line, exit 1), and the existing ones: no ids file, an empty one, an unknown
corpus or condition, `rm` without --yes off a terminal.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result

import condsearch
from condsearch.cli import main
from condsearch.model.vectorizer import Vectorizer
from condsearch.store.folder import VERSIONS, IndexStore
from condsearch.store.lifecycle import CorpusBusy, UnknownIds
from tests.conftest import HashEncoder
from tests.csr_corpus import write_csr_corpus
from tests.query.test_on_demand import COLOUR, SPORT, index
from tests.serve.test_serve_builds import ask, one_line_error, poll, serve

TEXTS = [f"a girl in a {c} dress plays {s}" for c in ("red", "blue", "green", "pink") for s in ("tennis", "golf")]
MOOD = "the mood of the scene"


@pytest.fixture
def hashed(tmp_path: Path) -> condsearch.Store:
    store = condsearch.open(tmp_path / "idx", model=condsearch.Model(Vectorizer(HashEncoder(), None, "none", "")))
    store.index(TEXTS, [COLOUR, SPORT], ids=[f"r{i}" for i in range(len(TEXTS))], name="c")
    return store


def cli(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def refused(result: Result, *words: str) -> str:
    """Return the one line of a refusal: exit 1 (or 2), no traceback, each word in it."""
    assert result.exit_code in (1, 2), result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, AssertionError | TypeError)
    [line] = result.output.strip().splitlines()
    for word in words:
        assert word in line, line
    return line


# ---------------------------------------------------------------- ids not in the corpus


def test_unknown_ids_say_how_many_and_the_first_few(hashed: condsearch.Store, tmp_path: Path) -> None:
    asked = ["r1", *[f"x{i}" for i in range(7)], "r2"]
    for call in (hashed.delete, hashed.get):
        with pytest.raises(UnknownIds) as caught:
            call(asked, corpus="c")
        message = str(caught.value)
        assert "\n" not in message
        assert message == "7 of 9 ids are not in corpus 'c': 'x0', 'x1', 'x2', 'x3', 'x4' and 2 more"
    assert hashed.count("c") == len(TEXTS)  # nothing deleted
    ids = tmp_path / "ids.txt"
    ids.write_text("r1\nx0\nx1\n", encoding="utf-8")
    line = refused(cli("delete", "c", "--ids", ids, "--index-dir", tmp_path / "idx"))
    assert line == "Error: 2 of 3 ids are not in corpus 'c': 'x0', 'x1'"
    assert hashed.count("c") == len(TEXTS)


def test_bad_ids_files_and_unknown_names_are_one_line(hashed: condsearch.Store, tmp_path: Path) -> None:
    folder = tmp_path / "idx"
    refused(cli("delete", "c", "--ids", tmp_path / "none.txt", "--index-dir", folder), "cannot read ids")
    (tmp_path / "blank.txt").write_text("\n \n", encoding="utf-8")
    refused(cli("delete", "c", "--ids", tmp_path / "blank.txt", "--index-dir", folder), "no ids in it")
    (tmp_path / "one.txt").write_text("r1\n", encoding="utf-8")
    refused(cli("delete", "nope", "--ids", tmp_path / "one.txt", "--index-dir", folder), "no corpus 'nope'", "'c'")
    refused(cli("rm", "nope", "--yes", "--index-dir", folder), "no corpus 'nope'", "'c'")
    refused(cli("rm", "c", "-c", MOOD, "--yes", "--index-dir", folder), repr(MOOD))
    refused(cli("rm", "c", "--index-dir", folder), "--yes")  # not a terminal
    assert hashed.count("c") == len(TEXTS) and len(IndexStore(folder).names()) == 2


# ---------------------------------------------------------------- a corpus in use by a build


def test_rm_while_a_build_of_a_new_condition_holds_the_corpus_is_refused(
    hashed: condsearch.Store, tmp_path: Path
) -> None:
    folder = tmp_path / "idx"
    names = IndexStore(folder).names()
    # a build of a condition nobody indexed yet (`condsearch index -c MOOD`) holds this while it encodes
    with IndexStore(folder).writing("c", MOOD):
        line = refused(cli("rm", "c", "--yes", "--index-dir", folder), "corpus 'c' is being built or changed")
        assert line.startswith("Error: ") and "try again" in line
        refused(cli("rm", "c", "-c", SPORT, "--yes", "--index-dir", folder), "being built")
        with pytest.raises(CorpusBusy, match="being built or changed"):
            hashed.drop("c")
        assert IndexStore(folder).names() == names  # nothing removed
        other = condsearch.open(tmp_path / "other", model=hashed._model)  # noqa: SLF001 - the same model
        other.index(TEXTS, COLOUR, name="d")
        assert other.drop("d")  # another corpus's drop is not held up
    assert cli("rm", "c", "--yes", "--index-dir", folder).exit_code == 0
    assert IndexStore(folder).names() == []
    assert not [p for p in (folder / VERSIONS).iterdir() if "claim" in p.name]  # the build's claim is gone


def test_a_claim_left_by_a_killed_build_does_not_block_a_drop(hashed: condsearch.Store, tmp_path: Path) -> None:
    from condsearch.store.claims import _digest

    stale = tmp_path / "idx" / VERSIONS / f"gone-0123456789.{_digest('c')}.deadbeef0000.claim.lock"
    stale.touch()  # its builder died: nobody holds the lock
    assert len(hashed.drop("c")) == 2
    assert not stale.exists()


@pytest.fixture
def router_folder(tmp_path: Path, tiny_bert_dir: Path) -> Path:
    out = tmp_path / "router"
    index(write_csr_corpus(tmp_path / "c.parquet"), out, tiny_bert_dir, COLOUR)
    return out


@pytest.fixture
def held_inside(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, threading.Event]]:
    """Hold a build on demand once it has claimed the corpus and holds its build lock (before it encodes)."""
    import condsearch.query.on_demand as on_demand

    started, release = threading.Event(), threading.Event()
    original = on_demand._uncached_states  # noqa: SLF001 - the step inside the build's locks

    def held(*args: object, **kwargs: object) -> int:
        started.set()
        assert release.wait(60)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(on_demand, "_uncached_states", held)
    yield started, release
    release.set()


def test_delete_while_a_build_on_demand_of_the_corpus_runs_is_409(
    router_folder: Path, held_inside: tuple[threading.Event, threading.Event]
) -> None:
    started, release = held_inside
    with serve(router_folder, build_inline_rows=0) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        accepted = ask(http, SPORT)  # SPORT is not indexed: a build on demand starts
        assert accepted.status_code == 202, accepted.text
        assert started.wait(60)
        error = one_line_error(http.delete("/indexes/c"), 409)
        assert error.startswith("corpus 'c' is being built or changed (index the-sport-being-played-")
        assert "try again" in error
        one_line_error(http.delete("/indexes/c", params={"condition": COLOUR}), 409)
        assert ask(http, COLOUR).status_code == 200  # still there, still answering
        release.set()
        assert poll(http, accepted.json()["job"], {"done", "failed"})["status"] == "done"
        dropped = http.delete("/indexes/c")
        assert dropped.status_code == 200 and len(dropped.json()["deleted"]) == 2
        assert http.get("/indexes").json()["indexes"] == []
        one_line_error(http.delete("/indexes/c"), 404)
    assert IndexStore(router_folder).names() == []


def test_a_build_on_demand_that_finds_its_corpus_removed_is_a_404(
    router_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import condsearch.query.on_demand as on_demand

    started, release = threading.Event(), threading.Event()
    original = on_demand._load_model  # noqa: SLF001 - after the plan, before the build claims the corpus

    def held(*args: object, **kwargs: object) -> object:
        started.set()
        assert release.wait(60)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(on_demand, "_load_model", held)
    with serve(router_folder) as server, httpx.Client(base_url=server.url, timeout=60) as http:
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(ask, http, SPORT)  # a small corpus: answered once built
            assert started.wait(60)
            removed = cli("rm", "c", "--yes", "--index-dir", router_folder)  # from the CLI side, meanwhile
            assert removed.exit_code == 0, removed.output
            release.set()
            error = one_line_error(waiting.result(), 404)
        assert "corpus 'c' was removed before 'the sport being played' could be built from it" in error
        assert http.get("/indexes").json()["indexes"] == []
    assert IndexStore(router_folder).names() == []
