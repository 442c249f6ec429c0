"""The benchmark docs stay reference pages: each at most 400 lines; links into the split pages land."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO / "benchmarks"
MAX_LINES = 400

#: pages over the limit that are not yet split into topic pages (issue 60); each leaves this list when it is
NOT_YET_SPLIT = {
    "benchmarks/systems/README.md",
}

PAGES = sorted(p for p in BENCHMARKS.rglob("*.md") if "results" not in p.parts)  # results/: generated tables
LINK = re.compile(r"\]\(([^)\s]+\.md)#([^)\s]+)\)")


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


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_slug_is_githubs() -> None:
    assert slug("C-STS (CASE paper Table 3/4 setting, frozen encoder + head)") == (
        "c-sts-case-paper-table-34-setting-frozen-encoder--head"
    )
    assert (
        slug("Latency against dimension (SPEC §5; CASE Figure 4)") == "latency-against-dimension-spec-5-case-figure-4"
    )


def test_links_into_the_paper_pages_land_on_a_heading() -> None:
    sources = [p for p in REPO.rglob("*.md") if not {".venv", "build", "node_modules"} & set(p.parts)]
    broken = []
    for source in sources:
        for m in LINK.finditer(source.read_text(encoding="utf-8")):
            target = (source.parent / m.group(1)).resolve()
            if target.parent == (BENCHMARKS / "paper").resolve() and m.group(2) not in anchors(target):
                broken.append(f"{source.relative_to(REPO)}: {m.group(1)}#{m.group(2)}")
    assert broken == []
