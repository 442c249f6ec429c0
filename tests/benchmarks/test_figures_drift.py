"""Headline figures quoted in several documents agree with benchmarks/figures.json and its results files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tools import figures

REPO = Path(__file__).resolve().parents[2]


def test_every_place_quotes_the_one_value() -> None:
    assert figures.check() == []


def test_each_value_is_its_committed_results_files() -> None:
    for fid, fig in figures.load().items():
        assert (REPO / fig["source"]["file"]).is_file(), f"{fid}: {fig['source']['file']} is not committed"
        assert figures.rounded(figures.source_value(fig), fig["digits"]) == figures.quoted(fig), fid
        module = fig["command"].split()[2]
        assert (REPO / (module.replace(".", "/") + ".py")).is_file(), f"{fid}: no script for {fig['command']!r}"


def test_headline_figures_are_quoted_in_the_readme_and_the_map() -> None:
    places = {q.file for q in figures.quotes(figures.load())}
    assert {"README.md", "benchmarks/README.md"} <= places
    both = [
        f for f in figures.load().values() if {"README.md", "benchmarks/README.md"} <= {q["file"] for q in f["quotes"]}
    ]
    assert len(both) >= 6


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    """The figures file and every file it names, copied under tmp_path."""
    names = {figures.FIGURES} | {q.file for q in figures.quotes(figures.load())}
    names |= {f["source"]["file"] for f in figures.load().values()}
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    return tmp_path


def test_a_figure_edited_in_one_place_only_fails(copy: Path) -> None:
    readme = copy / "README.md"
    readme.write_text(readme.read_text().replace("test MRR 57.04 with", "test MRR 57.40 with"))
    problems = figures.check(copy)
    assert len(problems) == 1 and "README.md quotes 57.40" in problems[0]
    # --fix writes figures.json's value back
    assert figures.fix(copy) == ["README.md"] and figures.check(copy) == []


def test_a_value_changed_in_figures_json_alone_fails(copy: Path) -> None:
    path = copy / figures.FIGURES
    path.write_text(path.read_text().replace('"value": 15.9,', '"value": 7.5,'))
    problems = figures.check(copy)
    assert any("on_demand.json" in p and "7.5" in p for p in problems)  # the results file says 15.9
    places = len(figures.load(copy)["on_demand_query_warm"]["quotes"])
    assert places >= 2 and sum("quotes 15.9 where" in p for p in problems) == places  # every place still quotes it


def test_a_reworded_quote_is_reported(copy: Path) -> None:
    bench = copy / "benchmarks/README.md"
    bench.write_text(bench.read_text().replace("median **0.59 s** without torch", "median 0.59 s, no torch"))
    assert any("one_shot_router_query" in p and "no text" in p for p in figures.check(copy))
