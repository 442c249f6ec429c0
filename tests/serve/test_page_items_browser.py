"""The search page's items of issue 59, each in Chromium (marked ``browser``; skipped without it, as in
tests/serve/test_search_page.py): the command that adds a condition to this corpus, a build's progress within a
chunk, k at most 1,000, the query box focused on load, focus rings for the keyboard only, HEAD of the page,
the same condition refused on both sides, a long refusal wrapped in its column.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from condsearch.serve.refusals import MAX_K
from tests.conftest import SENTENCES
from tests.query.test_on_demand import index as index_csr
from tests.serve.test_search_page import _expect, _search, browser, two_corpora  # noqa: F401 - fixtures
from tests.serve.test_serve import COLOUR, SPORT, serve

pytestmark = pytest.mark.browser

SAME = "Conditions A and B are the same condition: pick two different ones to compare."


@pytest.fixture
def router_server(browser: object, tiny_bert_dir: Path, write_corpus, tmp_path: Path) -> Iterator[str]:  # noqa: F811
    """A server over a router (--mode csr) corpus of 200 rows named "my corpus", indexed under COLOUR; every build
    answers 202 (the page follows it)."""
    texts = [f"{SENTENCES[i % len(SENTENCES)]} ({i})" for i in range(200)]
    corpus = write_corpus({"id": [f"r{i}" for i in range(len(texts))], "text": texts})
    folder = tmp_path / "indexes"
    index_csr(corpus, folder, tiny_bert_dir, COLOUR, name="my corpus")
    with serve(folder, build_inline_rows=0) as server:
        yield server.url


def _open(browser: object, url: str) -> object:  # noqa: F811
    page = browser.new_page(viewport={"width": 1200, "height": 800})  # type: ignore[attr-defined]
    page.goto(f"{url}/")
    _expect(page.locator("#conditions option")).not_to_have_count(0)
    return page


def test_the_add_command_names_this_corpus_and_the_servers_folder(browser, router_server: str) -> None:  # noqa: F811
    page = _open(browser, router_server)
    command = page.text_content("#add-command")  # type: ignore[attr-defined]
    assert (
        command == "condsearch index FILE -c \"the new condition\" --mode csr --name 'my corpus' --index-dir INDEX_DIR"
    )
    assert "INDEX_DIR" in page.text_content("#add-index")  # type: ignore[attr-defined]  # said what it stands for


def test_a_build_shows_rows_within_its_chunk(
    browser,  # noqa: F811
    router_server: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The build is held at its first report strictly within the chunk: the page shows that count, not 0."""
    from condsearch.query import on_demand

    real, reached, release = on_demand._IndexedRows.heard, threading.Event(), threading.Event()

    def held(self: on_demand._IndexedRows, bar: str, done: int, total: int) -> None:
        real(self, bar, done, total)
        if 0 < done < total and not reached.is_set():
            reached.set()
            assert release.wait(60)

    monkeypatch.setattr(on_demand._IndexedRows, "heard", held)
    page = _open(browser, router_server)
    page.fill("#query", "a girl in a red dress")  # type: ignore[attr-defined]
    page.fill("#left", COLOUR)  # type: ignore[attr-defined]
    page.fill("#right", SPORT)  # type: ignore[attr-defined]
    page.fill("#k", "3")  # type: ignore[attr-defined]
    page.click("#go")  # type: ignore[attr-defined]
    try:
        # a routing batch of 64 of the chunk's 200 rows
        _expect(page.locator("#status")).to_have_text(f"Building “{SPORT}” for corpus my corpus: 64 of 200 rows…")  # type: ignore[attr-defined]
    finally:
        release.set()
    _expect(page.locator("#right-results li")).to_have_count(3)  # type: ignore[attr-defined]


def test_k_past_the_max_is_refused_on_the_page(browser, two_corpora) -> None:  # noqa: F811
    url, _ = two_corpora
    page = _open(browser, url)
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if r.url.endswith("/query") else None)  # type: ignore[attr-defined]
    page.fill("#query", "a girl")  # type: ignore[attr-defined]
    page.fill("#left", COLOUR)  # type: ignore[attr-defined]
    page.fill("#right", SPORT)  # type: ignore[attr-defined]
    page.fill("#k", str(MAX_K + 1))  # type: ignore[attr-defined]
    page.click("#go")  # type: ignore[attr-defined]
    _expect(page.locator("#status")).to_have_text("k must be a whole number from 1 to 1,000.")  # type: ignore[attr-defined]
    assert not asked and page.locator("#results li").count() == 0  # type: ignore[attr-defined]
    assert page.get_attribute("#k", "max") == str(MAX_K)  # type: ignore[attr-defined]
    _search(page, "a girl", COLOUR, SPORT, 3)  # within it: answered


def test_the_query_box_has_the_focus_on_load_and_rings_are_for_the_keyboard(browser, two_corpora) -> None:  # noqa: F811
    url, _ = two_corpora
    page = _open(browser, url)
    assert page.eval_on_selector("body", "() => document.activeElement.id") == "query"  # type: ignore[attr-defined]
    page.fill("#query", "a girl")  # type: ignore[attr-defined]
    page.click("#go")  # type: ignore[attr-defined]
    _expect(page.locator("#left-results li")).not_to_have_count(0)  # type: ignore[attr-defined]
    assert page.eval_on_selector("body", "() => document.activeElement.id") == "go"  # type: ignore[attr-defined]
    assert page.eval_on_selector("#go", "e => getComputedStyle(e).outlineStyle") == "none"  # type: ignore[attr-defined]
    page.focus("#k")  # type: ignore[attr-defined]
    page.keyboard.press("Tab")  # type: ignore[attr-defined]
    assert page.eval_on_selector("body", "() => document.activeElement.id") == "go"  # type: ignore[attr-defined]
    assert page.eval_on_selector("#go", "e => getComputedStyle(e).outlineStyle") == "solid"  # type: ignore[attr-defined]


def test_head_of_the_page_answers_200(browser, two_corpora) -> None:  # noqa: F811
    url, _ = two_corpora
    page = _open(browser, url)
    got = page.request.head(f"{url}/")  # type: ignore[attr-defined]
    assert got.status == 200 and got.headers["content-type"].startswith("text/html")


@pytest.mark.parametrize("right", [COLOUR, f"  {COLOUR.replace(' ', '  ')} "])
def test_the_same_condition_on_both_sides_is_refused(browser, two_corpora, right: str) -> None:  # noqa: F811
    url, _ = two_corpora
    page = _open(browser, url)
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if r.url.endswith("/query") else None)  # type: ignore[attr-defined]
    page.fill("#query", "a girl")  # type: ignore[attr-defined]
    page.fill("#left", COLOUR)  # type: ignore[attr-defined]
    page.fill("#right", right)  # type: ignore[attr-defined]
    page.click("#go")  # type: ignore[attr-defined]
    _expect(page.locator("#status")).to_have_text(SAME)  # type: ignore[attr-defined]
    assert "error" in (page.get_attribute("#status", "class") or "")  # type: ignore[attr-defined]
    assert not asked and page.locator("#results li").count() == 0  # type: ignore[attr-defined]


def test_a_long_refusal_wraps_in_its_column(browser, two_corpora) -> None:  # noqa: F811
    url, _ = two_corpora
    page = _open(browser, url)
    long_condition = "x" * 190  # one word: no space to break at
    page.fill("#query", "a girl")  # type: ignore[attr-defined]
    page.fill("#left", long_condition)  # type: ignore[attr-defined]  # not indexed; a CASE corpus builds nothing
    page.fill("#right", SPORT)  # type: ignore[attr-defined]
    page.click("#go")  # type: ignore[attr-defined]
    error = page.locator("#left-results .error")  # type: ignore[attr-defined]
    _expect(error).to_contain_text("no index for condition")
    _expect(page.locator("#right-results li")).not_to_have_count(0)  # type: ignore[attr-defined]
    box, other = error.bounding_box(), page.locator("#right-results").bounding_box()  # type: ignore[attr-defined]
    assert box is not None and other is not None
    assert box["x"] + box["width"] <= other["x"]  # not over column B
    assert error.evaluate("e => e.scrollWidth <= e.clientWidth")
