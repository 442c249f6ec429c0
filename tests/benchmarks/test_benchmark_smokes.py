"""Every benchmark script (a module under benchmarks/ with a top-level ``main``) has a ``--smoke`` flag.

Read from the source with ``ast`` (no import, no run: milliseconds); tests/benchmarks/test_benchmarks.py and .ci/run
run the smokes themselves.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"

#: scripts with a ``main`` that have no --smoke, each with the reason; keep it short
NO_SMOKE = {
    "benchmarks/studies/anytext/build_data.py": "builds a data set from registry packages (network); measures nothing",
}


def _scripts() -> list[Path]:
    found = []
    for path in sorted(BENCHMARKS.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        if any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
            found.append(path)
    return found


def _flags(path: Path) -> set[str]:
    """Every string literal starting with -- passed to an ``add_argument`` call in path."""
    flags = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
    return flags


SCRIPTS = _scripts()


def test_the_scripts_are_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in SCRIPTS}
    assert {"benchmarks/paper/csts.py", "benchmarks/systems/gpu_search.py", "benchmarks/studies/wise.py"} <= names
    assert len(names) >= 30
    assert set(NO_SMOKE) <= names, "an exemption names a script that is gone or has no main"


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.relative_to(BENCHMARKS).as_posix())
def test_every_benchmark_script_accepts_smoke(path: Path) -> None:
    name = path.relative_to(REPO).as_posix()
    if name in NO_SMOKE:
        assert "--smoke" not in _flags(path), f"{name} has --smoke now: drop it from NO_SMOKE"
        pytest.skip(NO_SMOKE[name])
    assert "--smoke" in _flags(path), f"{name} has a main but no --smoke flag (tiny data, seconds, on the CPU)"
