"""README's "Where things are" table is generated from the docstrings, and stays so (issue 40)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tools import where_things_are as wta

ROOT = Path(__file__).resolve().parents[2]


MODULES = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "condsearch").rglob("*.py"))


def test_readme_table_is_current() -> None:
    message = wta.check(ROOT / "README.md")
    assert message is None, message  # the message names the fix: python tools/where_things_are.py README.md


@pytest.mark.parametrize("name", MODULES)
def test_every_module_has_a_docstring_first_line(name: str) -> None:
    doc = ast.get_docstring(ast.parse((ROOT / name).read_text(encoding="utf-8")))
    assert doc and doc.strip(), f"{name} has no docstring: its first line should say what it answers"
    first = doc.strip().splitlines()[0].strip()
    # The first line is the summary the table shows: a whole sentence, not one cut at the line's end.
    assert first and first[-1] in ".?!…", f"{name}: the docstring's first line is not a whole sentence: {first!r}"


def test_every_module_and_package_has_a_row() -> None:
    table = wta.render_table()
    base = ROOT / "condsearch"
    for path in base.glob("*.py"):
        assert f"| `{path.name}` |" in table
    for init in base.rglob("__init__.py"):
        package = init.parent
        if package != base:
            rel = package.relative_to(base).as_posix()
            assert f"| `{rel}/` |" in table
            for module in package.glob("*.py"):
                if module.name != "__init__.py":
                    assert f"`{module.name}`" in table.split(f"| `{rel}/` |")[1].splitlines()[0]


def _tree(tmp_path: Path) -> Path:
    """A tiny repository: condsearch/ with a module and a package, benchmarks/ with a group, tools/."""
    files = {
        "condsearch/__init__.py": '"""The package."""\n',
        "condsearch/zeta.py": '"""Zeta things: what ``zeta`` answers, e.g. this. More detail here."""\n',
        "condsearch/alpha/__init__.py": '"""Alpha: a package whose summary\nwraps a line.\n\nBody."""\n',
        "condsearch/alpha/one.py": '"""One."""\n',
        "condsearch/alpha/two.py": '"""Two: a|b, see :class:`~condsearch.alpha.two.Thing`."""\n',
        "benchmarks/__init__.py": '"""Benchmarks."""\n',
        "benchmarks/group/__init__.py": "",
        "benchmarks/group/README.md": "# Group\n\nThe group's first paragraph. Second sentence.\n\nMore.\n",
        "benchmarks/group/script.py": '"""A script."""\n',
        "tools/tool.py": '"""A tool."""\n',
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


def test_rows_are_first_sentences_sorted(tmp_path: Path) -> None:
    table = wta.render_table(_tree(tmp_path))
    rows = [line for line in table.splitlines() if line.startswith("| ") and line != "| module | answers |"]
    assert rows == [
        "| `__init__.py` | The package. |",
        "| `alpha/` | Alpha: a package whose summary wraps a line. Modules: `one.py`, `two.py`. |",
        "| `zeta.py` | Zeta things: what `zeta` answers, e.g. this. |",
        "| `benchmarks/` | Benchmarks. |",
        "| [`benchmarks/group/`](benchmarks/group/README.md) | The group's first paragraph. Modules: `script.py`. |",
        "| `tools/tool.py` | A tool. |",
    ]
    assert wta.first_sentence("Two: a|b, see :class:`~x.y.Thing`, :func:`~x.f` or :mod:`x.y`. Then more.") == (
        "Two: a\\|b, see `Thing`, `f` or `x.y`."
    )


def test_check_names_the_fix_and_update_rewrites_only_the_block(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    readme = root / "README.md"
    before, after = "# Title\n\n## Where things are\n\n", "\nDocuments: kept.\n\n### Development\n"
    readme.write_text(f"{before}{wta.START}\n| old | table |\n{wta.END}{after}", encoding="utf-8")
    message = wta.check(readme, root)
    assert message is not None and "\n" not in message and wta.FIX in message
    assert wta.update(readme, root) is True
    text = readme.read_text(encoding="utf-8")
    assert text.startswith(before + wta.START) and text.endswith(wta.END + after)
    assert "| old | table |" not in text and "| `zeta.py` |" in text
    assert wta.check(readme, root) is None
    assert wta.update(readme, root) is False
    (root / "condsearch" / "new.py").write_text('"""A module nobody listed."""\n', encoding="utf-8")
    assert wta.check(readme, root) is not None


def test_main_check_exits_1_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"{wta.START}\nstale\n{wta.END}\n", encoding="utf-8")
    assert wta.main([str(readme), "--check"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and wta.FIX in err
    assert readme.read_text(encoding="utf-8") == f"{wta.START}\nstale\n{wta.END}\n"  # --check changes nothing


def test_missing_markers_or_docstring_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# No markers\n", encoding="utf-8")
    assert wta.main([str(readme)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "markers" in err
    assert readme.read_text(encoding="utf-8") == "# No markers\n"
    assert wta.main([str(tmp_path / "absent.md"), "--check"]) == 1
    assert "no such file" in capsys.readouterr().err
    root = _tree(tmp_path)
    (root / "condsearch" / "bare.py").write_text("x = 1\n", encoding="utf-8")
    with pytest.raises(wta.TableError, match=r"bare\.py has no docstring"):
        wta.render_table(root)
