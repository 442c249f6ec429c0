#!/usr/bin/env python3
"""Count the rooms and climbs of five walks through condsearch, traced as they run (issue 60).

A walk is one job run in-process: a one-shot ``condsearch query``, ``condsearch index`` of a router
corpus, a server request under a condition the corpus has no index for (built on demand), a server
request under an indexed condition, and ``condsearch pairs``. The tiny random BERT of the tests
stands in for MiniLM, with an untrained router (``--router none``). Each walk runs in a fresh
process, so that no model, cache or thread of an earlier walk shortens it.

The rule. ``sys.setprofile`` and ``threading.setprofile`` see every Python call on every thread
started while tracing (the server's uvicorn, batcher and build threads included). A call counts when
its callee is condsearch code: its top-level package (``query`` for condsearch.query.search, ``model``
for condsearch.model.csr.encoder; a top-level module such as condsearch/errors.py is a room of its own,
``errors``, and condsearch/__init__.py is ``condsearch``) is a *room* entered. Its package as the import
graph layers it (:func:`tools.import_graph.package_of`: ``model.csr`` for the router, which keeps a layer of
its own inside model/) is a *unit* entered; transitions and climbs are counted between units. Its
caller is the nearest condsearch frame below it on the same thread's stack (through library frames:
click, torch's Module.__call__, FastAPI), none for a thread's first condsearch frame. A call from one
unit into another is a *transition*; the walk lists its distinct transitions in the order first
taken. A *climb* is a transition into a unit of a higher layer (a smaller
:func:`tools.import_graph.layer_of`); climbs count distinct (unit, unit) transitions. Rooms (and
units) above base leave out the bottom layer (base/, errors.py, progress.py, …), which every walk
enters. serve↔query *crossings* count the distinct call sites (caller function, callee
function) between serve and query, either way; *crossings back* are those from query into serve.

Import time is left out: every condsearch module is imported before tracing starts (so no module
body runs in a walk), and a call from or into a ``<module>`` frame is skipped besides.

    python tools/walks.py                                  # the five walks, a markdown table
    python tools/walks.py --walk pairs --json-out w.json   # one walk, and the counts as JSON
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tools.import_graph import LAYERS, ROOT, folder_of, layer_of, module_name, package_of  # noqa: E402

#: the bottom layer (base/, errors.py, progress.py, …): every walk enters it; ``rooms_above_base`` leaves it out
BASE = len(LAYERS) - 1
WALKS = ("query", "index", "serve-new", "pairs", "serve-known")
COLOUR = "color of the dress"
SPORT = "the sport being played"
QUERIES = ["a girl in a red dress", "two men play soccer"]
#: the environment of every walk's process: offline, one CPU kind and torch thread, caches under the work folder
_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@dataclass
class Walk:
    """What one walk did: its rooms, transitions, climbs and serve↔query crossings."""

    name: str
    #: the top-level packages entered (``model`` for every package under condsearch/model/)
    rooms: list[str] = field(default_factory=list)
    #: the packages entered, those nested in model/ counted apart (the layering's units: ``model.csr``)
    units: list[str] = field(default_factory=list)
    transitions: list[str] = field(default_factory=list)
    climbs: list[str] = field(default_factory=list)
    crossings: list[str] = field(default_factory=list)
    crossings_back: list[str] = field(default_factory=list)
    #: every call site from one package into another: 'caller function → callee function', in the order first called
    sites: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {
            "rooms": len(self.rooms),
            "rooms_above_base": len([r for r in self.rooms if layer_of(r) < BASE]),
            "units": len(self.units),
            "units_above_base": len([u for u in self.units if layer_of(u) < BASE]),
            "climbs": len(self.climbs),
            "crossings": len(self.crossings),
            "crossings_back": len(self.crossings_back),
        }


class Tracer:
    """A profile function for every thread that records condsearch calls while ``on``."""

    def __init__(self) -> None:
        self.on = False
        self._prefix = str(ROOT) + os.sep
        self._where: dict[str, tuple[str, str] | None] = {}  # co_filename: (module, package) or None
        self._lock = threading.Lock()
        self.rooms: dict[str, None] = {}
        self.edges: dict[tuple[str, str], int] = {}
        self.sites: dict[tuple[str, str], int] = {}

    def _place(self, frame: FrameType) -> tuple[str, str] | None:
        filename = frame.f_code.co_filename
        try:
            return self._where[filename]
        except KeyError:
            place = None
            if filename.startswith(self._prefix) and filename.endswith(".py"):
                module = module_name(Path(filename))
                place = (module, package_of(module))
            self._where[filename] = place
            return place

    def __call__(self, frame: FrameType, event: str, arg: object) -> None:
        if event != "call" or not self.on:
            return
        callee = self._place(frame)
        if callee is None or frame.f_code.co_name == "<module>":
            return
        caller_frame = frame.f_back
        caller = None
        while caller_frame is not None:
            if caller_frame.f_code.co_name == "<module>":
                return  # import time
            caller = self._place(caller_frame)
            if caller is not None:
                break
            caller_frame = caller_frame.f_back
        with self._lock:
            self.rooms.setdefault(callee[1])
            if caller is None or caller_frame is None or caller[1] == callee[1]:
                return
            edge = (caller[1], callee[1])
            self.edges[edge] = self.edges.get(edge, 0) + 1
            site = (f"{caller[0]}.{_name(caller_frame)}", f"{callee[0]}.{_name(frame)}")
            self.sites[site] = self.sites.get(site, 0) + 1

    @contextmanager
    def installed(self) -> Iterator[Tracer]:
        """Profile this thread and every thread started inside the block (recording only while ``on``)."""
        threading.setprofile(self)
        sys.setprofile(self)
        try:
            yield self
        finally:
            self.on = False
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]

    def walk(self, name: str) -> Walk:
        """Return what was recorded as the walk named name, by the rule of the module docstring."""
        edges = list(self.edges)
        return Walk(
            name=name,
            rooms=list(dict.fromkeys(folder_of(u) for u in self.rooms)),
            units=list(self.rooms),
            transitions=[f"{a}→{b}" for a, b in edges],
            climbs=[f"{a}→{b}" for a, b in edges if layer_of(b) < layer_of(a)],
            crossings=[f"{a} → {b}" for a, b in self.sites if {_pkg(a), _pkg(b)} == {"serve", "query"}],
            crossings_back=[f"{a} → {b}" for a, b in self.sites if (_pkg(a), _pkg(b)) == ("query", "serve")],
            sites=[f"{a} → {b}" for a, b in self.sites],
        )


def _name(frame: FrameType) -> str:
    """The frame's function, qualified by its class and enclosing functions (Python 3.11+), else its name."""
    return str(getattr(frame.f_code, "co_qualname", frame.f_code.co_name))


def _pkg(qualified: str) -> str:
    """The package of a 'condsearch.package.module.function' site."""
    parts = qualified.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def import_everything() -> None:
    """Import every condsearch module that imports here, so that no module body runs inside a walk."""
    import condsearch

    for info in pkgutil.walk_packages(condsearch.__path__, "condsearch."):
        if info.name.endswith(".__main__"):
            continue  # it runs the command line
        try:
            importlib.import_module(info.name)
        except Exception:  # noqa: BLE001 - an optional dependency missing: that module is imported lazily, if at all
            pass


# ------------------------------------------------------------------------------------------- the walks


def _cli(*args: object) -> None:
    from click.testing import CliRunner

    from condsearch.cli import main

    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exit_code != 0:
        raise RuntimeError(f"condsearch {args[0]} failed: {result.output}\n{result.exception!r}")


def _model(work: Path) -> Path:
    from tests.conftest import make_tiny_bert

    folder = work / "tiny-bert"
    return folder if (folder / "config.json").exists() else make_tiny_bert(folder)


def _router_corpus(work: Path) -> Path:
    from tests.csr_corpus import write_csr_corpus

    path = work / "c.parquet"
    return path if path.exists() else write_csr_corpus(path)


def _index_args(work: Path, folder: Path) -> list[object]:
    model, corpus = _model(work), _router_corpus(work)
    return ["index", corpus, "-c", COLOUR, "--mode", "csr", "--router", "none", "--model", model, "--index-dir", folder]


def _indexed(work: Path) -> Path:
    """Return a folder holding the router corpus indexed under COLOUR (built untraced when missing)."""
    folder = work / "indexes"
    if not folder.exists():
        _cli(*_index_args(work, folder))
    return folder


def _serve_request(tracer: Tracer, folder: Path, condition: str) -> None:
    import httpx

    from condsearch.serve.config import ServeConfig
    from condsearch.serve.server import BackgroundServer, build_app

    # the store is not re-read on a timer during the walk: that thread's reads are no part of the request
    config = ServeConfig(index_dir=folder, reload_interval_s=3600, device="cpu")
    with tracer.installed(), BackgroundServer(build_app(config)) as server:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            tracer.on = True
            response = http.post("/query", json={"queries": QUERIES, "condition": condition, "k": 5})
            tracer.on = False
    if response.status_code != 200:
        raise RuntimeError(f"the server answered {response.status_code}: {response.text}")


def _traced_cli(tracer: Tracer, *args: object) -> None:
    with tracer.installed():
        tracer.on = True
        _cli(*args)


def walk_query(tracer: Tracer, work: Path) -> None:
    folder = _indexed(work)
    _traced_cli(tracer, "query", *QUERIES, "-c", COLOUR, "-k", 5, "--json", "--index-dir", folder)


def walk_index(tracer: Tracer, work: Path) -> None:
    _traced_cli(tracer, *_index_args(work, work / "index-walk"))


def walk_serve_new(tracer: Tracer, work: Path) -> None:
    _serve_request(tracer, _indexed(work), SPORT)


def walk_serve_known(tracer: Tracer, work: Path) -> None:
    _serve_request(tracer, _indexed(work), COLOUR)


def walk_pairs(tracer: Tracer, work: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    kinds, makers = ["shoe", "shirt", "hat", "bag"], ["acme", "zenith", "nova"]
    rows = range(48)
    table = {
        "id": list(rows),
        "text": [f"item {i}: a {makers[i % 3]} {kinds[i % 4]}" for i in rows],
        "category": [kinds[i % 4] for i in rows],
        "brand": [makers[i % 3] for i in rows],
    }
    pq.write_table(pa.table(table), work / "catalogue.parquet")
    labels = ["--label", "category=the kind of product", "--label", "brand=the maker"]
    _traced_cli(tracer, "pairs", work / "catalogue.parquet", *labels, "--out", work / "pairs.csv")


RUN: dict[str, Callable[[Tracer, Path], None]] = {
    "query": walk_query,
    "index": walk_index,
    "serve-new": walk_serve_new,
    "pairs": walk_pairs,
    "serve-known": walk_serve_known,
}


def run_here(name: str, work: Path) -> Walk:
    """Run one walk in this process (its setup untraced) and return what it did."""
    os.environ.update(_ENV)
    os.environ.setdefault("CONDSEARCH_CPU_KIND", "other")
    os.environ.setdefault("CONDSEARCH_CACHE_DIR", str(work / "cache"))
    os.environ.setdefault("CONDSEARCH_INDEX_DIR", str(work / "indexes-env"))
    import torch

    torch.set_num_threads(1)
    import_everything()
    tracer = Tracer()
    RUN[name](tracer, work)
    return tracer.walk(name)


def run_apart(name: str, work: Path) -> Walk:
    """Run one walk in a fresh process (each walk starts cold) and return what it did."""
    out = work / f"{name}.json"
    command = [sys.executable, __file__, "--here", "--walk", name, "--work", str(work), "--json-out", str(out)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    (data,) = json.loads(out.read_text(encoding="utf-8"))
    data.pop("counts")
    return Walk(**data)


def table(walks: list[Walk]) -> str:
    rows = [
        "| walk | rooms | above base | units above base | climbs | serve↔query crossings | back | rooms entered "
        "| climbs taken |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w in walks:
        c = w.counts()
        rooms, climbs = ", ".join(w.rooms), ", ".join(w.climbs) or "none"
        rows.append(
            f"| {w.name} | {c['rooms']} | {c['rooms_above_base']} | {c['units_above_base']} | {c['climbs']} "
            f"| {c['crossings']} "
            f"| {c['crossings_back']} | {rooms} | {climbs} |"
        )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--walk", action="append", choices=WALKS, help="a walk to run (repeatable; default: all five)")
    p.add_argument("--work", type=Path, help="a folder for the model, corpora and indexes (default: a temporary one)")
    p.add_argument("--json-out", type=Path, help="write every walk (rooms, transitions, climbs, crossings) as JSON")
    p.add_argument("--here", action="store_true", help="run the walks in this process, one after another")
    args = p.parse_args(argv)
    names = args.walk or list(WALKS)
    with tempfile.TemporaryDirectory(prefix="walks-") as tmp:
        work = (args.work or Path(tmp)).resolve()
        work.mkdir(parents=True, exist_ok=True)
        walks = [(run_here if args.here else run_apart)(name, work) for name in names]
    if args.json_out:
        data: list[dict[str, Any]] = [{**asdict(w), "counts": w.counts()} for w in walks]
        args.json_out.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(table(walks), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
