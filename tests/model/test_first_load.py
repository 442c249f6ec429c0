"""Models loaded on several threads at once in a fresh process (issue 58, item 4).

The first builds on demand, several at once, failed with an ImportError (the server answered 500,
the Python API raised it): transformers' lazy modules imported on several threads at once. Loads
through transformers now take turns (:data:`condsearch.model.encoders.first_use.LOAD_LOCK`), builds under
way share one copy of their model, and an ImportError while loading is a one-line ModelError.
Each race runs in a fresh child process: in this one, transformers is imported already.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import condsearch
from condsearch.errors import CondsearchError, ModelError
from condsearch.model.encoders.first_use import LoadedOnce
from tests.csr_corpus import write_csr_corpus

THREADS = 6


def _fresh(code: str, *args: str) -> list[list[str]]:
    """Run code in a fresh python; return what it printed, one JSON list per line."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


RACE = """
    import json, sys, threading
    n, what = int(sys.argv[1]), sys.argv[2]
    start = threading.Barrier(n)
    out = []

    def go(i):
        start.wait()
        try:
            out.append(["ok", run(i)])
        except BaseException as exc:
            out.append([type(exc).__name__, str(exc)])

    if what == "encoders":
        from condsearch.model.encoders import load_encoder
        from condsearch.model.encoders.spec import EncoderSpec, Runtime
        from condsearch.model.csr import load_csr_encoder

        def run(i):
            if i % 2:
                return load_csr_encoder(sys.argv[3], router="none", device="cpu").dim
            return load_encoder(EncoderSpec(sys.argv[3], profile="none", runtime=Runtime(device="cpu"))).dim
    elif what == "default":
        from condsearch.model.encoders.spec import EncoderSpec, Runtime
        from condsearch.model.vectorizer import load_vectorizer

        def run(i):
            return load_vectorizer(EncoderSpec(mode="csr" if i % 2 else "case", runtime=Runtime(device="cpu"))).dim
    else:
        import condsearch
        import condsearch.model.policy as policy

        store, loads, load = condsearch.open(sys.argv[3], device="cpu"), [], policy.load_bulk_vectorizer

        def counted(*args, **kwargs):
            loads.append(1)
            return load(*args, **kwargs)

        policy.load_bulk_vectorizer = counted

        def run(i):
            return store.search("a girl in a red dress", condition=f"the kind of thing {i}", k=3)[0].id

    threads = [threading.Thread(target=go, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for row in out:
        print(json.dumps(row))
    if what == "builds":
        print(json.dumps(["loads", len(loads)]))
"""


def test_encoders_load_on_several_threads_at_once_in_a_fresh_process(tiny_bert_dir: Path) -> None:
    rows = _fresh(RACE, str(THREADS), "encoders", str(tiny_bert_dir))
    assert rows == [["ok", 32]] * THREADS


def _router_corpus(tmp_path: Path, tiny_bert_dir: Path) -> Path:
    from click.testing import CliRunner

    from condsearch.cli import main

    corpus, folder = write_csr_corpus(tmp_path / "c.parquet"), tmp_path / "idx"
    args = ["index", str(corpus), "-c", "color of the dress", "--mode", "csr", "--router", "none"]
    result = CliRunner().invoke(main, [*args, "--model", str(tiny_bert_dir), "--index-dir", str(folder)])
    assert result.exit_code == 0, result.output
    return folder


def test_first_builds_on_demand_several_at_once_succeed_in_a_fresh_process(tmp_path: Path, tiny_bert_dir: Path) -> None:
    folder = _router_corpus(tmp_path, tiny_bert_dir)
    rows = _fresh(RACE, str(THREADS), "builds", str(folder))
    answers, loads = rows[:-1], rows[-1]
    assert sorted(a[0] for a in answers) == ["ok"] * THREADS, answers
    assert loads[0] == "loads" and 1 <= loads[1] <= THREADS
    built = {m.condition for _, m in condsearch.open(folder)._store.manifests()}  # type: ignore[union-attr]
    assert {f"the kind of thing {i}" for i in range(THREADS)} <= built


def test_builds_under_way_share_one_load_per_key() -> None:
    models = LoadedOnce[object]()
    asked, loads, got = threading.Barrier(THREADS + 1), [], []
    release = threading.Event()

    class Model:
        pass

    def load() -> object:
        loads.append(1)
        release.wait(10)  # every other thread asks while this load runs
        return Model()

    def use(key: str) -> None:
        asked.wait()
        got.append((key, models.get(key, load)))

    threads = [threading.Thread(target=use, args=("a" if i else "b",)) for i in range(THREADS)]
    for t in threads:
        t.start()
    asked.wait()
    release.set()
    for t in threads:
        t.join()
    assert len(loads) == 2  # one per key
    assert len({id(m) for k, m in got if k == "a"}) == 1
    got.clear()  # the last users let go: the next to ask loads again
    models.get("a", load)
    assert len(loads) == 3


def test_a_model_is_kept_for_keep_s_after_its_last_ask_then_freed() -> None:
    models = LoadedOnce[object](keep_s=0.2)
    loads: list[int] = []

    class Model:
        pass

    def load() -> object:
        loads.append(1)
        return Model()

    first = id(models.get("a", load))  # nobody holds it: only the kept reference
    assert id(models.get("a", load)) == first and len(loads) == 1  # a build soon after shares it
    deadline = time.monotonic() + 10
    while len(models._kept) and time.monotonic() < deadline:  # a deadline guards a hang, not a timing
        time.sleep(0.05)
    models.get("a", load)  # let go: loaded again
    assert len(loads) == 2


def test_a_failed_load_keeps_nothing() -> None:
    models = LoadedOnce[object]()

    def broken() -> object:
        raise ModelError("cannot load model 'x': no")

    for _ in range(2):
        with pytest.raises(ModelError):
            models.get("x", broken)

    class Model:
        pass

    assert isinstance(models.get("x", Model), Model)


def test_an_import_error_while_loading_is_one_line_in_the_api_and_the_cli(
    tmp_path: Path, tiny_bert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import transformers
    from click.testing import CliRunner

    from condsearch.cli import main

    folder = _router_corpus(tmp_path, tiny_bert_dir)

    def missing(*args: object, **kwargs: object) -> None:
        raise ImportError("this model needs the package sentencepiece, which is not installed\nmore detail")

    monkeypatch.setattr(transformers.AutoModel, "from_pretrained", missing)
    with pytest.raises(CondsearchError, match="cannot load model .*sentencepiece") as exc:
        condsearch.open(folder, device="cpu").search("a girl", condition="the sport being played")
    assert "\n" not in str(exc.value)
    result = CliRunner().invoke(main, ["query", "a girl", "-c", "the weather", "--index-dir", str(folder)])
    assert result.exit_code == 1 and "cannot load model" in result.stderr and "Traceback" not in result.output
    assert not isinstance(result.exception, ImportError)


@pytest.mark.slow
def test_the_default_model_loads_on_several_threads_at_once_in_a_fresh_process() -> None:
    rows = _fresh(RACE, "4", "default")
    assert sorted(r[0] for r in rows) == ["ok"] * 4, rows
