"""The benchmark docs stay reference pages: each at most 400 lines; links into the split pages land."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
MAX_LINES = 400

#: pages over the limit that are not yet split into topic pages (issue 60); each leaves this list when it is
NOT_YET_SPLIT: set[str] = set()

PAGES = sorted(p for p in BENCHMARKS.rglob("*.md") if "results" not in p.parts)  # results/: generated tables
LINK = re.compile(r"\]\(([^)\s]+\.md)#([^)\s]+)\)")
ANY_LINK = re.compile(r"\]\(([^)\s]+)\)")
SKIP = {".venv", "build", "node_modules"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_each_benchmarks_page_is_at_most_400_lines(page: Path) -> None:
    name = page.relative_to(REPO).as_posix()
    lines = len(page.read_text(encoding="utf-8").splitlines())
    if name in NOT_YET_SPLIT:
        assert lines > MAX_LINES, f"{name} is {lines} lines now: drop it from NOT_YET_SPLIT"
        pytest.skip(f"not yet split: {lines} lines")
    assert lines <= MAX_LINES, f"{name}: {lines} lines; split it by topic (see benchmarks/paper/README.md)"


def test_not_yet_split_names_existing_pages() -> None:
    assert all((REPO / name).is_file() for name in NOT_YET_SPLIT)


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def without_code(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


@functools.cache
def anchors(page: Path) -> frozenset[str]:
    """Every heading's anchor on page, a repeated heading's with GitHub's -1, -2, … after the first."""
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6} (.+)$", without_code(page.read_text(encoding="utf-8")), flags=re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def test_slug_is_githubs() -> None:
    assert slug("C-STS (CASE paper Table 3/4 setting, frozen encoder + head)") == (
        "c-sts-case-paper-table-34-setting-frozen-encoder--head"
    )
    assert (
        slug("Latency against dimension (SPEC §5; CASE Figure 4)") == "latency-against-dimension-spec-5-case-figure-4"
    )


def test_links_into_the_benchmarks_pages_land_on_a_heading() -> None:
    """Every markdown file's links to a benchmarks/ page's #anchor (paper, systems, studies, the map) land."""
    sources = [p for p in REPO.rglob("*.md") if not SKIP & set(p.relative_to(REPO).parts)]
    broken = []
    for source in sources:
        for m in LINK.finditer(without_code(source.read_text(encoding="utf-8"))):
            target = (source.parent / m.group(1)).resolve()
            if target.is_relative_to(BENCHMARKS) and (not target.is_file() or m.group(2) not in anchors(target)):
                broken.append(f"{source.relative_to(REPO)}: {m.group(1)}#{m.group(2)}")
    assert broken == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_each_link_on_a_benchmarks_page_lands(page: Path) -> None:
    """A relative link names a file or folder that exists, and its #anchor, on a markdown page, a heading."""
    broken = []
    for m in ANY_LINK.finditer(without_code(page.read_text(encoding="utf-8"))):
        link = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", link):  # https:, mailto:
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in anchors(target):
            broken.append(f"{link}: no such heading")
    assert broken == []
