"""Conditions on demand (issue 41): a query under a condition a router corpus has no index for builds it first.

The index built on demand is the one `condsearch index -c` gives on the same rows: the same vectors,
rows, files and answers. Refused in one line, with the store untouched: --no-build, a CASE corpus,
an empty or over-long condition or one with control characters, a router that changed since the
corpus was indexed, a corpus indexed with several models, several corpora and none named. Two builds
of one condition publish once; a cleared state cache still builds, saying so. The tiny BERT stands
in for MiniLM, with an untrained router and with a saved one moved off its start.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

import condsearch
from condsearch.cli import main
from condsearch.errors import CondsearchError, UnknownCondition
from condsearch.model.encoders.spec import Runtime
from condsearch.query.on_demand import build_on_demand
from condsearch.store.conditions import MAX_CONDITION_CHARS
from condsearch.store.folder import IndexStore
from tests.conftest import SENTENCES, assert_same_ranking
from tests.csr_corpus import move_router, write_csr_corpus

COLOUR = "color of the dress"
SPORT = "the sport being played"
QUERIES = ["a girl in a red dress", "two men play soccer", SENTENCES[4]]
#: what differs between two writes of one index: when, and the file times
VOLATILE = ("created_at", "index_mtime_ns")


def invoke(*args: object) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def run(*args: object) -> Result:
    result = invoke(*args)
    assert result.exit_code == 0, f"{result.output}\n{result.exception!r}"
    return result


def refused(*args: object, code: int = 1) -> str:
    """Run a command that must fail in one line without a traceback; return that line."""
    result = invoke(*args)
    assert result.exit_code == code, result.output
    assert not isinstance(result.exception, AssertionError | TypeError | ValueError | KeyError), result.exception
    lines = [line for line in result.stderr.splitlines() if line.startswith(("Error:", "Usage:"))]
    assert lines, result.stderr
    assert "Traceback" not in result.output
    return lines[-1]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Return every path under folder (links as their targets) with its bytes: what a refusal must leave as it was."""
    out: dict[str, bytes] = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink():
            out[rel] = str(path.readlink()).encode()
        elif path.is_file():
            out[rel] = path.read_bytes()
        else:
            out[rel] = b"<dir>"
    return out


@pytest.fixture(scope="module")
def moved_router(tiny_bert_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return move_router(tiny_bert_dir, tmp_path_factory.mktemp("router"), seed=0)


@pytest.fixture(params=["none", "moved"])
def router(request: pytest.FixtureRequest, moved_router: Path) -> str:
    return "none" if request.param == "none" else str(moved_router)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_csr_corpus(tmp_path / "c.parquet")


def index(corpus: Path, folder: Path, model: Path, *conditions: str, router: str = "none", **flags: str) -> None:
    more = [x for flag, value in flags.items() for x in (f"--{flag.replace('_', '-')}", value)]
    cs = [x for c in conditions for x in ("-c", c)]
    run("index", corpus, *cs, "--mode", "csr", "--router", router, "--model", model, "--index-dir", folder, *more)


def cli_answers(folder: Path, condition: str, *flags: object) -> tuple[list[dict], str]:
    result = run("query", *QUERIES, "-c", condition, "-k", 5, "--json", "--index-dir", folder, *flags)
    return [json.loads(line) for line in result.stdout.splitlines()], result.stderr


def version_of(folder: Path, name: str) -> tuple[dict, np.ndarray, pa.Table, bytes]:
    """Return an index's manifest (less its times), vectors, rows and index file."""
    version = folder / name
    manifest = json.loads((version / "manifest.json").read_text())
    for field in VOLATILE:
        manifest.pop(field)
    rows = pq.read_table(version / "rows.parquet")
    return manifest, np.load(version / "vectors.npy"), rows, (version / "index.faiss").read_bytes()


def test_a_condition_built_on_demand_is_the_index_that_index_builds(
    tmp_path: Path, corpus: Path, tiny_bert_dir: Path, router: str
) -> None:
    on_demand, indexed = tmp_path / "on-demand", tmp_path / "indexed"
    index(corpus, on_demand, tiny_bert_dir, COLOUR, router=router)
    built, stderr = cli_answers(on_demand, SPORT)
    assert "is not indexed for corpus 'c'" in stderr and "indexed 40 rows under 'the sport being played'" in stderr
    assert "not in the cache" not in stderr  # indexing COLOUR cached every row's states
    index(corpus, indexed, tiny_bert_dir, COLOUR, SPORT, router=router)
    name = IndexStore(indexed).find(SPORT, "c")
    assert IndexStore(on_demand).find(SPORT, "c") == name
    a, b = version_of(on_demand, name), version_of(indexed, name)
    assert a[0] == b[0]  # every file's sha256 and size, the spec, factory, fingerprint and background
    np.testing.assert_array_equal(a[1], b[1])
    assert a[2].equals(b[2]) and a[3] == b[3]
    assert built == cli_answers(indexed, SPORT)[0] == cli_answers(on_demand, SPORT)[0]
    assert [r["id"] for r in built[2]["results"]][0] == "r4"  # a row's own text finds it first


def test_no_build_keeps_the_refusal(tmp_path: Path, corpus: Path, tiny_bert_dir: Path) -> None:
    folder = tmp_path / "idx"
    index(corpus, folder, tiny_bert_dir, COLOUR)
    before = snapshot(folder)
    line = refused("query", "a girl", "-c", SPORT, "--index-dir", folder, "--no-build")
    assert "no index for condition 'the sport being played'" in line and "indexed: 'color of the dress'" in line
    assert snapshot(folder) == before


def test_a_case_corpus_is_refused_in_one_line(tmp_path: Path, corpus: Path, tiny_bert_dir: Path) -> None:
    folder = tmp_path / "idx"
    run("index", corpus, "-c", COLOUR, "--mode", "case", "--profile", "none", "--model", tiny_bert_dir,
        "--index-dir", folder)  # fmt: skip
    before = snapshot(folder)
    line = refused("query", "a girl", "-c", SPORT, "--index-dir", folder)
    assert line.startswith("Error: no index for condition 'the sport being played'")  # the list of what is indexed
    assert "indexed: 'color of the dress'; corpus 'c' was indexed with --mode case" in line
    assert "only for --mode csr corpora" in line
    assert f"condsearch index {corpus}" in line and "-c 'the sport being played'" in line
    assert snapshot(folder) == before
    with pytest.raises(CondsearchError, match="only for --mode csr"):
        condsearch.open(folder).search("a girl", condition=SPORT)
    assert snapshot(folder) == before


@pytest.mark.parametrize(
    ("condition", "says"),
    [
        ("   ", "the condition is empty"),
        ("the\tsport", "control character (U+0009) at position 4"),
        ("colour\x1b[31m", "control character (U+001B)"),
        ("x" * (MAX_CONDITION_CHARS + 1), f"at most {MAX_CONDITION_CHARS} are allowed"),
    ],
)
def test_bad_conditions_are_refused_and_nothing_is_written(
    tmp_path: Path, corpus: Path, tiny_bert_dir: Path, condition: str, says: str
) -> None:
    folder = tmp_path / "idx"
    index(corpus, folder, tiny_bert_dir, COLOUR)
    before = snapshot(folder)
    assert says in refused("query", "a girl", "-c", condition, "--index-dir", folder)
    assert says in refused("index", corpus, "-c", condition, "--mode", "csr", "--router", "none", "--model",
                           tiny_bert_dir, "--index-dir", folder)  # fmt: skip
    store = condsearch.open(folder)
    with pytest.raises(CondsearchError, match=re.escape(says)):
        store.search("a girl", condition=condition)
    with pytest.raises(CondsearchError, match=re.escape(says)):
        store.index(["a text"], condition, mode="csr", router="none")
    assert snapshot(folder) == before


def test_a_condition_at_the_limit_is_built(tmp_path: Path, corpus: Path, tiny_bert_dir: Path) -> None:
    folder = tmp_path / "idx"
    index(corpus, folder, tiny_bert_dir, COLOUR)
    longest = "the sport " + "y" * (MAX_CONDITION_CHARS - 10)
    answers, _ = cli_answers(folder, f"  {longest} ")
    assert answers[0]["condition"] == longest and len(answers[0]["results"]) == 5


def test_index_without_a_condition_is_a_usage_error_naming_on_demand(tmp_path: Path, corpus: Path) -> None:
    for mode in ("csr", "case"):
        line = refused("index", corpus, "--mode", mode, "--index-dir", tmp_path / "idx", code=2)
        assert "give at least one --condition" in line and "on demand" in line
    assert not (tmp_path / "idx").exists()


def test_two_builds_of_one_condition_publish_once(
    tmp_path: Path, corpus: Path, tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from condsearch.store.folder import Draft

    folder = tmp_path / "idx"
    index(corpus, folder, tiny_bert_dir, COLOUR)
    published: list[str] = []
    publish = Draft.publish

    def counted(self: Draft, *args: object, **kwargs: object) -> str:
        published.append(self.name)
        return publish(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Draft, "publish", counted)
    start = threading.Barrier(2)
    made: list[object] = []

    def build() -> None:
        start.wait()
        made.append(build_on_demand(IndexStore(folder), SPORT, runtime=Runtime(device="cpu")))

    threads = [threading.Thread(target=build) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 2
    assert sorted(m.built for m in made) == [False, True]  # type: ignore[attr-defined]
    assert len(published) == 1 and {m.name for m in made} == {published[0]}  # type: ignore[attr-defined]
    assert IndexStore(folder).read_manifest(published[0]).n_vectors == 40


def test_a_cleared_state_cache_is_encoded_again_with_a_notice(
    tmp_path: Path, corpus: Path, tiny_bert_dir: Path, moved_router: Path
) -> None:
    import os

    on_demand, indexed = tmp_path / "on-demand", tmp_path / "indexed"
    index(corpus, on_demand, tiny_bert_dir, COLOUR, router=str(moved_router))
    shutil.rmtree(Path(os.environ["CONDSEARCH_CACHE_DIR"]) / "csr-states")
    built, stderr = cli_answers(on_demand, SPORT)
    assert "the sentence states of 40 of 40 rows of corpus 'c' are not in the cache" in stderr
    assert "encoding them again" in stderr
    index(corpus, indexed, tiny_bert_dir, COLOUR, SPORT, router=str(moved_router))
    assert built == cli_answers(indexed, SPORT)[0]
    name = IndexStore(indexed).find(SPORT, "c")
    np.testing.assert_array_equal(version_of(on_demand, name)[1], version_of(indexed, name)[1])


def _scores_ids(answers: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(scores, ids) of `query --json`-shaped answers, as assert_same_ranking takes them."""
    scores = np.array([[r["score"] for r in a["results"]] for a in answers])
    ids = np.array([[str(r["id"]) for r in a["results"]] for a in answers])
    return scores, ids


def test_the_python_api_builds_on_demand(tmp_path: Path, corpus: Path, tiny_bert_dir: Path, router: str) -> None:
    from condsearch.query.as_json import query_answer

    on_demand, indexed = tmp_path / "on-demand", tmp_path / "indexed"
    index(corpus, on_demand, tiny_bert_dir, COLOUR, router=router)
    store = condsearch.open(on_demand, device="cpu")
    with pytest.raises(UnknownCondition, match="no index for condition 'the sport being played'"):
        store.search(QUERIES, condition=SPORT, build=False)
    assert [m.condition for _, m in IndexStore(on_demand).manifests()] == [COLOUR]
    built = [query_answer(h) for h in store.search(QUERIES, condition=SPORT, k=5)]
    assert sorted(m.condition for _, m in IndexStore(on_demand).manifests()) == [COLOUR, SPORT]
    index(corpus, indexed, tiny_bert_dir, COLOUR, SPORT, router=router)
    assert built == [
        query_answer(h) for h in condsearch.open(indexed, device="cpu").search(QUERIES, condition=SPORT, k=5)
    ]
    # the CLI (a one-shot query, onnxruntime without torch) answers the API's build alike, up to float32 rounding
    one_shot = cli_answers(on_demand, SPORT)[0]
    assert [a["query"] for a in one_shot] == [a["query"] for a in built]
    assert_same_ranking(_scores_ids(built), _scores_ids(one_shot), 2e-3)  # an int8 state may round either way
    with pytest.raises(CondsearchError, match="build must be True or False"):
        store.search("a girl", condition=SPORT, build="no")  # type: ignore[call-overload]


def test_a_router_changed_since_the_corpus_was_indexed_is_refused(
    tmp_path: Path, corpus: Path, tiny_bert_dir: Path
) -> None:
    routers = tmp_path / "routers"
    router = move_router(tiny_bert_dir, routers, seed=0)
    folder = tmp_path / "idx"
    index(corpus, folder, tiny_bert_dir, COLOUR, router=str(router))
    move_router(tiny_bert_dir, routers, seed=1)  # retrained in place: router.json records the new weights
    before = snapshot(folder)
    line = refused("query", "a girl", "-c", SPORT, "--index-dir", folder)
    assert f"corpus 'c' was indexed with router {router}" in line and "which has changed since" in line
    with pytest.raises(CondsearchError, match="which has changed since"):
        condsearch.open(folder, device="cpu").search("a girl", condition=SPORT)
    assert snapshot(folder) == before


def test_a_corpus_indexed_with_several_models_is_refused_naming_them(
    tmp_path: Path, corpus: Path, tiny_bert_dir: Path, moved_router: Path
) -> None:
    folder = tmp_path / "idx"
    index(corpus, folder, tiny_bert_dir, COLOUR)
    index(corpus, folder, tiny_bert_dir, SPORT, router=str(moved_router))
    before = snapshot(folder)
    line = refused("query", "a girl", "-c", "the place", "--index-dir", folder)
    assert "corpus 'c' is indexed with several models" in line
    assert "router none: 'color of the dress'" in line and f"router {moved_router}" in line
    assert snapshot(folder) == before


def test_several_corpora_ask_for_one(tmp_path: Path, corpus: Path, tiny_bert_dir: Path) -> None:
    folder = tmp_path / "idx"
    index(corpus, folder, tiny_bert_dir, COLOUR, name="a")
    index(corpus, folder, tiny_bert_dir, COLOUR, name="b")
    before = snapshot(folder)
    line = refused("query", "a girl", "-c", SPORT, "--index-dir", folder)
    assert "several corpora could build it (a, b): choose one with --corpus" in line
    assert snapshot(folder) == before
    with pytest.raises(CondsearchError, match="choose one with corpus="):
        condsearch.open(folder).search("a girl", condition=SPORT)
    answers, _ = cli_answers(folder, SPORT, "--corpus", "b")
    assert len(answers) == 3
    assert sorted((m.corpus_name, m.condition) for _, m in IndexStore(folder).manifests()) == [
        ("a", COLOUR), ("b", COLOUR), ("b", SPORT)
    ]  # fmt: skip


def test_no_index_at_all_names_the_command(tmp_path: Path) -> None:
    line = refused("query", "a girl", "-c", SPORT, "--index-dir", tmp_path / "empty")
    assert "no index of any corpus" in line and "condsearch index CORPUS --mode csr -c 'the sport being played'" in line
    assert not (tmp_path / "empty").exists()


def test_the_manifest_of_an_index_built_on_demand_names_the_corpus_it_came_from(
    tmp_path: Path, corpus: Path, tiny_bert_dir: Path
) -> None:
    folder = tmp_path / "idx"
    index(corpus, folder, tiny_bert_dir, COLOUR)
    store = IndexStore(folder)
    made = build_on_demand(store, SPORT, "c", runtime=Runtime(device="cpu"))
    sibling, new = store.read_manifest(store.find(COLOUR)), store.read_manifest(made.name)
    same = ("corpus_name", "corpus_path", "corpus_checksum", "spec", "fingerprint", "factory", "n_vectors", "mode")
    assert {f: asdict(new)[f] for f in same} == {f: asdict(sibling)[f] for f in same}
    assert made.built and made.n_states_encoded == 0 and new.condition == SPORT
    again = build_on_demand(store, SPORT, "c", runtime=Runtime(device="cpu"))
    assert (again.built, again.name) == (False, made.name)


def test_the_benchmark_runs_in_smoke_mode(tiny_bert_dir: Path, tmp_path: Path) -> None:
    import importlib

    module = importlib.import_module("benchmarks.systems.on_demand")
    out = tmp_path / "out.json"
    argv = ["--smoke", "--model", str(tiny_bert_dir), "--router", "none", "--work-dir", str(tmp_path / "w")]
    assert module.main([*argv, "--json-out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["config"]["rows"] == 40 and result["cold_notice_printed"]
    assert set(result["seconds"]) >= {"cli_warm", "api_warm", "index_new_condition", "cli_cold", "api_cold"}
    equal = result["equal_to_index"]
    assert equal["cli_answers_equal"] and equal["api_ids_equal"]
    assert all(v["vectors_equal"] for v in equal["vectors"].values())


def test_the_benchmark_reads_c_sts_beside_the_repository_and_names_a_missing_folder(tmp_path: Path) -> None:
    import importlib

    module = importlib.import_module("benchmarks.systems.on_demand")
    repo = Path(__file__).resolve().parents[2]
    assert module.CSTS == repo.parent / "shared" / "data" / "csts-reannotated"  # ../shared/data, as documented
    with pytest.raises(SystemExit, match=r"^no C-STS file .*train\.csv \(give --csts the folder"):
        module.corpus_texts(10, False, tmp_path / "absent")
