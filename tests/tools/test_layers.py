"""condsearch's packages are layers: every import points down or across, never up, and no packages loop (issue 60).

Every import counts: those under ``if TYPE_CHECKING:`` and inside functions too. The layers are
``tools/import_graph.py``'s LAYERS, listed in docs/architecture.md. The front ends (cli/, serve/, api/)
reach other packages through their front doors, the names a package's ``__init__`` exports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tools import import_graph

ROOT = Path(__file__).resolve().parents[2]

#: packages whose front door is not yet the only way in: the front ends still import their modules (none since
#: issue 60, item 2, gave every package a front door)
INNER_IMPORTS_ALLOWED: set[str] = set()


@pytest.fixture(scope="module", params=[False, True], ids=["every-import", "module-level"])
def graph(request: pytest.FixtureRequest) -> dict[str, set[str]]:
    return import_graph.graph(module_level=request.param)


def test_every_package_and_top_level_module_has_a_layer(graph: dict[str, set[str]]) -> None:
    packages = {import_graph.package_of(m) for m in graph}
    assert len(packages) > 15  # the package was found
    for package in packages:
        import_graph.layer_of(package)  # raises, naming the fix, for a package in no layer
    listed = [p for _, _, layer in import_graph.LAYERS for p in layer]
    assert len(listed) == len(set(listed)) and set(listed) == packages  # each in one layer, none stale


def test_no_import_points_up_a_layer(graph: dict[str, set[str]]) -> None:
    assert import_graph.upward_imports(graph) == []


def test_no_package_loop(graph: dict[str, set[str]]) -> None:
    assert import_graph.circles(import_graph.package_graph(graph)) == []


def test_the_checks_see_an_upward_import_and_a_loop() -> None:
    # the same functions on a made-up graph: store imports query (up), and query imports store (a loop)
    made_up = {"condsearch.store.folder": {"condsearch.query.search"}, "condsearch.query.search": {"condsearch.store"}}
    made_up["condsearch.store"] = set()
    assert import_graph.upward_imports(made_up) == [("condsearch.store.folder", "condsearch.query.search")]
    assert import_graph.circles(import_graph.package_graph(made_up)) == [["query", "store"]]


def _named_modules(path: Path) -> list[str]:
    """Return the condsearch modules an import in path names: ``a.b`` of ``from a.b import c`` and of ``import a.b``."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return [n for n in names if n == "condsearch" or n.startswith("condsearch.")]


def test_every_import_names_a_module_that_exists() -> None:
    # a module moved without its importers updated would show here, even in a function no test calls
    modules = set(import_graph.graph())
    missing = {
        (import_graph.module_name(path), name)
        for path in sorted(import_graph.ROOT.rglob("*.py"))
        for name in _named_modules(path)
        if name not in modules
    }
    assert not missing, sorted(missing)


def _front_end(module: str) -> bool:
    return import_graph.package_of(module) in {"cli", "serve", "api"}


def test_front_ends_use_front_doors() -> None:
    graph = import_graph.graph()
    inner = sorted(
        (m, w)
        for m, targets in graph.items()
        if _front_end(m)
        for w in targets
        if (package := import_graph.package_of(w)) != import_graph.package_of(m)
        and w != f"condsearch.{package}"  # the package itself: its front door
        and import_graph.package_path(package).is_dir()  # a top-level module is its own front door
        and package not in INNER_IMPORTS_ALLOWED
    )
    assert inner == []


def test_the_allowed_list_holds_only_packages_still_entered_from_the_side() -> None:
    # a package whose front door became the only way in leaves the list, so that it stays that way
    graph = import_graph.graph()
    entered = {
        import_graph.package_of(w)
        for m, targets in graph.items()
        if _front_end(m)
        for w in targets
        if import_graph.package_of(w) != import_graph.package_of(m) and w != f"condsearch.{import_graph.package_of(w)}"
    }
    assert INNER_IMPORTS_ALLOWED <= entered


def test_architecture_doc_lists_the_layers() -> None:
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert import_graph.layers_markdown() in doc, "paste python tools/import_graph.py --layers-md into the doc"


FRONT_DOORS = [
    "ingest",
    "model",
    "model.csr",
    "serve",
    "query",
    "store",
    "corpus",
    "model.artifacts",
    "scale",
    "model.encoders",
    "train",
    "base",
]


@pytest.mark.parametrize("package", FRONT_DOORS)
def test_front_doors_hold_what_they_list(package: str) -> None:
    import importlib

    module = importlib.import_module(f"condsearch.{package}")
    assert module.__all__ and all(getattr(module, name) is not None for name in module.__all__)
    # each listed name has a home (a module of the package, or the __init__ itself), each home is listed
    assert set(module._HOMES) <= set(module.__all__) and all(
        n in vars(module) for n in module.__all__ if n not in module._HOMES
    )
    # a name that is also a module's would be that module once the module is imported (the package attribute wins)
    assert [n for n in module.__all__ if (import_graph.package_path(package) / f"{n}.py").exists()] == []


def test_front_doors_are_cheap_to_import() -> None:
    import subprocess
    import sys

    heavy = ("torch", "transformers", "faiss", "pyarrow", "fastapi", "uvicorn")
    code = f"import sys\nimport {', '.join(f'condsearch.{p}' for p in FRONT_DOORS)}\n"
    code += f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_tests_mirror_the_packages() -> None:
    """A test file sits in the folder of the package it tests (docs/architecture.md, "Tests mirror the packages").

    tests/query/ for condsearch/query/, tests/model/csr/ for condsearch/model/csr/; a top-level module's tests
    (tests/test_errors.py) sit at the top.
    """
    source = ROOT / "condsearch"
    packages = {p.relative_to(source) for p in source.rglob("__init__.py")}
    packages = {p.parent for p in packages if p.parent != Path(".")}
    top_level = {p.stem for p in source.glob("*.py")}
    outside = {Path("benchmarks"), Path("tools")}
    tests = ROOT / "tests"
    misplaced = [p.name for p in tests.glob("test_*.py") if p.stem.removeprefix("test_") not in top_level]
    folders = {p.parent.relative_to(tests) for p in tests.rglob("__init__.py")} - {Path(".")}
    assert misplaced == [], "test files outside a package's folder"
    assert folders - packages - outside == set(), "test folders that name no package"
    assert [p for p in tests.rglob("test_*.py") if p.parent.relative_to(tests) not in folders | {Path(".")}] == []
