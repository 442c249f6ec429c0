#!/usr/bin/env python3
"""condsearch's import graph: circles, layers, imports that point up, the longest chains (issues 40, 60).

Every ``import condsearch…`` / ``from condsearch… import`` in the package counts, those under
``if TYPE_CHECKING:`` and inside functions included (``--module-level`` counts only those run at
import time). A circle is a strongly connected group of two or more modules; a package loop, one of
two or more packages (a top-level module counts as a package of its own). :data:`LAYERS` orders the
packages from the front ends down; an import from a package into a layer above its own points up.

    python tools/import_graph.py                # a summary
    python tools/import_graph.py --json         # the same as JSON
    python tools/import_graph.py --layers-md    # the layer list of docs/architecture.md
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "condsearch"

#: condsearch's layers, top first: (name, what it holds, its packages and top-level modules). A package may
#: import its own layer's packages (without a loop) and any layer below; docs/architecture.md says why.
LAYERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("front ends", "parse, call one job, print or answer", ("condsearch", "__main__", "api", "cli", "serve")),
    ("jobs", "answer a query, ingest a corpus, train, run past one machine", ("query", "ingest", "train", "scale")),
    ("model", "which model answers an index, and how it runs", ("model",)),
    ("csr", "the router's tri-encoder: sentence caches, cheap new conditions", ("model.csr",)),
    ("encoders", "(condition, sentence) pairs into vectors; the encoder spec", ("model.encoders",)),
    ("data on disk", "indexes, trained artifacts, corpora", ("store", "model.artifacts", "corpus")),
    (
        "base",
        "files, digests, atomic writes, model sources, caches, FAISS primitives; errors, defaults, progress",
        ("base", "errors", "defaults", "progress", "version", "metrics", "environment"),
    ),
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module_level(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return False
    return True


def imports(path: Path, modules: set[str], module_level: bool) -> set[str]:
    """Return the condsearch modules that path imports (a name imported from a package counts as its module)."""
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if module_level and not _is_module_level(node, parents):
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != me:
                found.add(name)
    return found


def graph(module_level: bool = False) -> dict[str, set[str]]:
    paths = sorted(ROOT.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports(p, modules, module_level) for p in paths}


def circles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def longest_chain(g: dict[str, set[str]]) -> list[str]:
    """The longest import path that visits no module twice (on the graph with circles collapsed)."""
    memo: dict[str, list[str]] = {}

    def depth(v: str, seen: frozenset[str]) -> list[str]:
        if v in memo:
            return memo[v]
        best: list[str] = []
        for w in sorted(g[v]):
            if w not in seen:
                path = depth(w, seen | {w})
                if len(path) > len(best):
                    best = path
        memo[v] = [v, *best]
        return memo[v]

    return max((depth(v, frozenset({v})) for v in sorted(g)), key=len)


#: packages inside a top-level package that keep a layer of their own: model/ holds everything that turns
#: text into vectors (its loader and policy above the router, the router above the encoders, the trained
#: artifacts below both), so that a job enters one folder for its model
NESTED = ("model.csr", "model.encoders", "model.artifacts")


def package_of(module: str) -> str:
    """Return the package a module belongs to: ``query`` for condsearch.query.search, ``errors`` for condsearch.errors.

    A module of a :data:`NESTED` package belongs to it (``model.csr`` for condsearch.model.csr.encoder).
    The package root itself (``condsearch/__init__.py``) is ``condsearch``.
    """
    parts = module.split(".")
    if len(parts) > 2 and f"{parts[1]}.{parts[2]}" in NESTED:
        return f"{parts[1]}.{parts[2]}"
    return parts[1] if len(parts) > 1 else parts[0]


def folder_of(package: str) -> str:
    """Return the top-level folder (or module) a package lies in: ``model`` for ``model.csr``."""
    return package.partition(".")[0]


def package_path(package: str) -> Path:
    """Return the folder of a package: ROOT/model/csr for ``model.csr``."""
    return ROOT.joinpath(*package.split("."))


def package_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    """Collapse a module graph to its packages (an import inside one package is no edge)."""
    out: dict[str, set[str]] = {package_of(m): set() for m in g}
    for m, targets in g.items():
        out[package_of(m)] |= {package_of(w) for w in targets} - {package_of(m)}
    return out


def layer_of(package: str) -> int:
    """Return the package's layer, 0 for the front ends; ValueError for a package that no layer names."""
    for i, (_, _, packages) in enumerate(LAYERS):
        if package in packages:
            return i
    raise ValueError(f"condsearch.{package} is in no layer: add it to tools/import_graph.py LAYERS")


def upward_imports(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Return (importer, imported) for every import into a layer above the importer's, sorted."""
    return sorted(
        (m, w) for m, targets in g.items() for w in targets if layer_of(package_of(w)) < layer_of(package_of(m))
    )


def _shown(package: str) -> str:
    if package == "condsearch":
        return "`__init__.py`"
    return f"`{package.replace('.', '/')}/`" if package_path(package).is_dir() else f"`{package}.py`"


def layers_markdown() -> str:
    """Return :data:`LAYERS` as the numbered list docs/architecture.md holds."""
    rows = []
    for i, (name, holds, packages) in enumerate(LAYERS, 1):
        shown = ", ".join(_shown(p) for p in packages)
        rows.append(f"{i}. **{name}**: {holds}. {shown}")
    return "\n".join(rows) + "\n"


def summary(module_level: bool = False) -> dict[str, object]:
    g = graph(module_level)
    packages = package_graph(g)
    top = sorted(m for m in g if m.count(".") == 1 and not (ROOT / m.split(".")[1]).is_dir())
    return {
        "modules": len(g),
        "top_level_modules": len(top),
        "top_level": top,
        "circles": circles(g),
        "package_loops": circles(packages),
        "upward_imports": [f"{m} -> {w}" for m, w in upward_imports(g)],
        "longest_chain": longest_chain(g),
        "imports": sum(len(v) for v in g.values()),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true")
    p.add_argument("--module-level", action="store_true", help="only imports run at import time")
    p.add_argument("--layers-md", action="store_true", help="print the layer list of docs/architecture.md")
    args = p.parse_args()
    if args.layers_md:
        print(layers_markdown(), end="")
        return 0
    s = summary(args.module_level)
    if args.json:
        print(json.dumps(s, indent=2))
        return 0
    print(f"modules {s['modules']}, top-level {s['top_level_modules']}, imports {s['imports']}")
    for group in s["circles"]:  # type: ignore[attr-defined]
        print(f"circle of {len(group)}: {', '.join(group)}")
    for group in s["package_loops"]:  # type: ignore[attr-defined]
        print(f"package loop of {len(group)}: {', '.join(group)}")
    print(f"upward imports {len(s['upward_imports'])}")  # type: ignore[arg-type]
    for line in s["upward_imports"]:  # type: ignore[attr-defined]
        print(f"  {line}")
    chain = s["longest_chain"]
    print(f"longest chain ({len(chain)}): {' -> '.join(chain)}")  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
