"""The search page at `/` of `condsearch serve`: its files and headers (fast), then the page in Chromium.

The browser tests (marked ``browser``; ``make test-browser``) drive Debian's Chromium through
Playwright: over the demo corpus indexed with the embedded default model, the page types a query,
picks two conditions and shows what ``POST /query`` answers, the two rankings differing; over the
tiny BERT's indexes with an API key, it asks for the key and shows hostile text as text. Where
Chromium or Playwright is missing they skip, saying which; with ``CONDSEARCH_BROWSER_REQUIRED=1``
(CI) they fail instead.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from condsearch.corpus.demo import write_demo_corpus
from condsearch.serve.page import CONTENT_SECURITY_POLICY, PAGE_FILES, read_page_file
from tests.conftest import SENTENCES
from tests.serve.test_serve import COLOUR, SPORT, index, run, serve

KEY = "s3cret-ключ"  # not ASCII: the page must send the key's UTF-8 bytes, as the server compares them
HOSTILE_TEXT = '<img src=x onerror="window.__pwned = 1"><b>bold</b> & "quotes"'
HOSTILE_CONDITION = "<script>window.__pwned = 2</script> colour"
CHROMIUM = os.environ.get("CONDSEARCH_CHROMIUM", "/usr/bin/chromium")


def test_page_files_ship_in_the_package_and_hold_no_html_injection() -> None:
    for name in ("search.js", "docs.js"):
        script = read_page_file(name).decode()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
            assert sink not in script, (name, sink)
        assert "new URLSearchParams(" not in script  # form decoding makes a key's "+" a space (the browser test)
    for name in ("index.html", "docs.html"):
        html = read_page_file(name).decode()
        assert not re.search(r"<script(?![^>]*\ssrc=)", html)  # no inline script
        assert not re.search(r"<[^>]*\son[a-z]+\s*=", html)  # no inline event handler
        assert not re.search(r"(src|href)=\"(https?:)?//", html)  # nothing from elsewhere: works offline


def test_the_page_files_are_package_data() -> None:
    """pyproject's package-data ships every file the page serves (a wheel without them would serve 500s)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = Path(__file__).resolve().parents[2]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["condsearch"]
    shipped = {path for pattern in globs for path in (root / "condsearch").glob(pattern)}
    assert {root / "condsearch" / "serve" / "static" / f.name for f in PAGE_FILES} <= shipped


def test_the_page_is_served_without_the_key_and_the_data_is_not(tmp_path: Path) -> None:
    (tmp_path / "idx").mkdir()
    with serve(tmp_path / "idx", api_key=KEY) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        for page_file in PAGE_FILES:
            got = http.get(page_file.path)
            assert got.status_code == 200, page_file
            assert got.headers["content-type"] == page_file.media_type
            assert got.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
            assert got.headers["x-content-type-options"] == "nosniff"
            assert got.content == read_page_file(page_file.name)
            # a query string changes nothing (no handler argument reads it)
            assert http.get(page_file.path, params={"body": "<script>"}).content == got.content
        for path in ("/indexes", "/openapi.json", "/redoc", "/static/", "/static/../indexes", "/index.html"):
            assert http.get(path).status_code == 401, path
        assert http.get("/health").status_code == 200  # a probe needs no secret (issue 59; --private-health: 401)
        assert http.post("/", json={}).status_code == 401  # only GET of the page's own files goes without the key
        assert http.get("/indexes", headers={"X-API-Key": KEY.encode()}).status_code == 200
        assert "/" not in http.get("/openapi.json", headers={"X-API-Key": KEY.encode()}).json()["paths"]


# ------------------------------------------------------------------ in a real browser


def _chromium() -> object:
    """Return Playwright's sync API, or skip (fail where CONDSEARCH_BROWSER_REQUIRED is set) saying what is missing."""
    missing = None
    try:
        from playwright import sync_api
    except ImportError:
        missing = "playwright is not installed (pip install 'condsearch[browser]')"
    if missing is None and not (os.access(CHROMIUM, os.X_OK) or shutil.which(CHROMIUM)):
        missing = f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium; or set CONDSEARCH_CHROMIUM)"
    if missing is not None:
        if os.environ.get("CONDSEARCH_BROWSER_REQUIRED"):
            pytest.fail(missing)
        pytest.skip(missing)
    return sync_api


DEMO_QUERY = "A girl in an orange dress plays tennis"  # the Makefile's demo query


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Chromium, launched once for the module's tests."""
    sync_api = _chromium()
    with sync_api.sync_playwright() as playwright:  # type: ignore[attr-defined]
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def demo_server(browser: object, tmp_path: Path) -> Iterator[str]:
    """A server over the demo corpus indexed under two conditions with the embedded default model."""
    corpus = tmp_path / "demo.parquet"
    write_demo_corpus(corpus)
    folder = tmp_path / "indexes"
    run("index", corpus, "-c", COLOUR, "-c", SPORT, "--index-dir", folder)
    with serve(folder) as server:
        yield server.url


@pytest.fixture
def hostile_server(browser: object, tiny_bert_dir: Path, write_corpus, tmp_path: Path) -> Iterator[str]:
    """A server with an API key over the tiny BERT's indexes of the test sentences (a hostile row and condition)."""
    texts = [*SENTENCES, HOSTILE_TEXT]
    corpus = write_corpus({"id": [f"s{i}" for i in range(len(texts))], "text": texts})
    folder = tmp_path / "indexes"
    index(corpus, folder, tiny_bert_dir, COLOUR, HOSTILE_CONDITION)
    with serve(folder, api_key=KEY) as server:
        yield server.url


def _expect(locator: object) -> object:
    # Playwright waits on its side: the page's CSP forbids evaluating strings in it (wait_for_function)
    return _chromium().expect(locator)  # type: ignore[attr-defined]


def _pick(page: object, side: str, condition: str) -> None:
    page.fill(f"#{side}", condition)  # type: ignore[attr-defined]  # free text, the indexed ones suggested


def _search(page: object, query: str, left: str, right: str, k: int) -> None:
    page.wait_for_selector("#corpus option", state="attached")  # type: ignore[attr-defined]  # the listing is read
    page.fill("#query", query)  # type: ignore[attr-defined]
    _pick(page, "left", left)
    _pick(page, "right", right)
    page.fill("#k", str(k))  # type: ignore[attr-defined]
    page.click("#go")  # type: ignore[attr-defined]
    for side in ("left", "right"):
        _expect(page.locator(f"#{side}-results li")).to_have_count(k)  # type: ignore[attr-defined]


def _column(page: object, side: str) -> list[dict[str, str]]:
    items = page.locator(f"#{side}-results li")  # type: ignore[attr-defined]
    return [
        {
            "id": items.nth(i).locator(".id").text_content(),
            "score": items.nth(i).locator(".score").text_content(),
            "text": items.nth(i).locator(".text").text_content(),
        }
        for i in range(items.count())
    ]


def _api(url: str, query: str, condition: str, k: int, **headers: bytes) -> list[dict[str, str]]:
    body = {"query": query, "condition": condition, "k": k}
    got = httpx.post(f"{url}/query", json=body, headers=headers, timeout=60)
    assert got.status_code == 200, got.text
    hits = got.json()["results"][0]["results"]
    return [{"id": str(h["id"]), "score": f"{h['score']:.4f}", "text": h["text"]} for h in hits]


@pytest.mark.browser
def test_the_page_ranks_one_query_under_two_conditions(browser, demo_server: str) -> None:
    """The demo query under the dress's colour and under the sport: two columns, as /query answers, not the same."""
    page = browser.new_page(viewport={"width": 1200, "height": 800})  # type: ignore[attr-defined]
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{demo_server}/")
    _expect(page.locator("#conditions option")).to_have_count(2)
    assert page.input_value("#left") != page.input_value("#right")  # two different conditions to start with

    _search(page, DEMO_QUERY, COLOUR, SPORT, 5)
    left, right = _column(page, "left"), _column(page, "right")
    assert left == _api(demo_server, DEMO_QUERY, COLOUR, 5)
    assert right == _api(demo_server, DEMO_QUERY, SPORT, 5)
    assert [r["id"] for r in left] != [r["id"] for r in right]  # the same query, different neighbours
    assert page.text_content("#left-results h2") == COLOUR and page.text_content("#right-results h2") == SPORT
    shared = {r["id"] for r in left} & {r["id"] for r in right}
    assert page.locator("#left-results li.shared").count() == len(shared) < 5
    assert f"{len(shared)} of 5 results appear under both conditions" in page.text_content("#status")
    assert not errors
    if os.environ.get("CONDSEARCH_PAGE_SCREENSHOT"):  # README's picture: make page-screenshot
        page.locator("#go").blur()
        page.screenshot(path=os.environ["CONDSEARCH_PAGE_SCREENSHOT"], full_page=True)


@pytest.mark.browser
def test_the_page_asks_for_the_key_and_shows_hostile_text_as_text(browser, hostile_server: str) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))

    # without the key the page loads, says it needs one, and opens the key field
    page.goto(f"{hostile_server}/")
    page.wait_for_selector("#status.error")
    assert "API key" in page.text_content("#status")
    page.fill("#key", KEY)
    page.press("#key", "Tab")  # change: the conditions are read with the key
    _expect(page.locator("#conditions option")).to_have_count(2)
    labels = page.eval_on_selector_all("#conditions option", "options => options.map(o => o.textContent)")
    assert sorted(labels) == sorted([COLOUR, HOSTILE_CONDITION])

    # a hostile row under a hostile condition is shown as text: nothing it holds runs or renders
    n = len(SENTENCES) + 1  # every row, the hostile one included
    _search(page, "a girl in a red dress", COLOUR, HOSTILE_CONDITION, n)
    with_key = {"X-API-Key": KEY.encode()}
    assert _column(page, "left") == _api(hostile_server, "a girl in a red dress", COLOUR, n, **with_key)
    assert page.text_content("#right-results h2") == HOSTILE_CONDITION
    assert HOSTILE_TEXT in [r["text"] for r in _column(page, "right")]
    assert page.locator("#results img, #results b, #results script").count() == 0
    assert page.evaluate("window.__pwned") is None and not errors

    # the key from the URL fragment: used, then taken out of the address bar
    fresh = browser.new_page()  # type: ignore[attr-defined]
    fresh.goto(f"{hostile_server}/#key={KEY}")
    _expect(fresh.locator("#conditions option")).to_have_count(2)
    assert fresh.url == f"{hostile_server}/" and fresh.input_value("#key") == KEY


BASE64_KEY = "q+Zr/9w+AbC=="  # base64's '+', '/' and '=' (issue 37)


@pytest.fixture
def base64_key_server(browser: object, tmp_path: Path) -> Iterator[str]:
    """A server with a base64 API key over an empty index folder: the page lists nothing, or asks for the key."""
    (tmp_path / "idx").mkdir()
    with serve(tmp_path / "idx", api_key=BASE64_KEY) as server:
        yield server.url


@pytest.mark.browser
@pytest.mark.parametrize(
    "fragment",
    [
        f"key={BASE64_KEY}",  # as the docs say: the key as it is, '+' and all
        "key=q%2BZr%2F9w%2BAbC%3D%3D",  # percent-encoded, as encodeURIComponent writes it
        f"other=1&key={BASE64_KEY}",
    ],
)
def test_the_key_from_the_fragment_keeps_plus_signs(browser, base64_key_server: str, fragment: str) -> None:
    """`/#key=KEY` reads the key as written: a '+' stays a '+' (form decoding made it a space)."""
    page = browser.new_page()  # type: ignore[attr-defined]
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{base64_key_server}/#{fragment}")
    _expect(page.locator("#status")).to_contain_text("No indexes to search yet")  # the key was accepted
    assert page.input_value("#key") == BASE64_KEY
    # the key leaves the address bar; the rest of the fragment (a search) stays
    assert page.url == f"{base64_key_server}/" + ("#other=1" if fragment.startswith("other") else "") and not errors


# ------------------------------------------------------------------ issue 41: the page as a user meets it

CAR = "the car maker"
NEW_CONDITION = "the weather outside"
UNREADABLE = "🎾👗🏀 🎾👗"  # all [UNK] to the tiny BERT's (and MiniLM's) WordPiece vocabulary


def test_the_icon_and_the_docs_page_are_served_without_anything_from_elsewhere(tmp_path: Path) -> None:
    """/favicon.ico is an icon (not a 404); /docs is the page's own, no CDN (Swagger UI's was blank offline)."""
    (tmp_path / "idx").mkdir()
    with serve(tmp_path / "idx", api_key=KEY) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        icon = http.get("/favicon.ico")
        assert icon.status_code == 200 and icon.headers["content-type"] == "image/x-icon"
        assert icon.content[:4] == b"\x00\x00\x01\x00"  # an ICO header
        docs = http.get("/docs")
        assert docs.status_code == 200 and "cdn" not in docs.text.lower()
        assert not re.search(r"(src|href)=\"(https?:)?//", docs.text)
        assert http.get("/redoc").status_code == 401  # no other docs page from a CDN (404 with the key)
        assert http.get("/redoc", headers={"X-API-Key": KEY.encode()}).status_code == 404


def test_the_server_says_how_much_of_a_query_its_model_cannot_read(
    tiny_bert_dir: Path, corpus_file: Path, tmp_path: Path
) -> None:
    """POST /query gives each query's share of [UNK] tokens: a query of emoji reads as nothing but [UNK]."""
    index(corpus_file, tmp_path / "indexes", tiny_bert_dir, COLOUR)
    with serve(tmp_path / "indexes") as server:
        body = {"queries": [UNREADABLE, "a girl in a red dress"], "condition": COLOUR, "k": 2}
        got = httpx.post(f"{server.url}/query", json=body, timeout=60)
    assert got.status_code == 200, got.text
    unreadable, plain = got.json()["unknown_tokens"]
    assert unreadable == 1.0 and plain == 0.0


@pytest.fixture
def two_corpora(browser: object, tiny_bert_dir: Path, write_corpus, tmp_path: Path) -> Iterator[tuple[str, object]]:
    """A server over two corpora of the tiny BERT (corpus: colour, sport; cars: the car maker); and a function
    that indexes corpus under one more condition while the server runs."""
    corpus = write_corpus({"id": [f"s{i}" for i in range(len(SENTENCES))], "text": SENTENCES})
    cars = write_corpus({"id": ["c0", "c1", "c2"], "text": SENTENCES[:3]}, name="cars.parquet")
    folder = tmp_path / "indexes"
    index(cars, folder, tiny_bert_dir, CAR)  # first: the listing's first index is not the default corpus's
    index(corpus, folder, tiny_bert_dir, COLOUR, SPORT)
    with serve(folder) as server:
        yield server.url, lambda condition: index(corpus, folder, tiny_bert_dir, condition)


def _options(page: object, select: str) -> list[str]:
    return page.eval_on_selector_all(f"{select} option", "os => os.map(o => o.textContent)")  # type: ignore[attr-defined]


def _colour(page: object, selector: str, prop: str = "color") -> tuple[float, float, float]:
    css = page.eval_on_selector(selector, f"e => getComputedStyle(e)['{prop}']")  # type: ignore[attr-defined]
    r, g, b = (float(x) for x in re.findall(r"[\d.]+", css)[:3])
    return r, g, b


def _contrast(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    """WCAG 2 contrast ratio of two sRGB colours (0-255)."""

    def luminance(rgb: tuple[float, float, float]) -> float:
        lin = [c / 255 / 12.92 if c / 255 <= 0.04045 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]

    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.browser
def test_errors_are_red_and_a_refused_search_clears_the_results(browser, hostile_server: str) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(f"{hostile_server}/")
    page.wait_for_selector("#status.error")  # no key
    red = _colour(page, "#status")
    assert red != _colour(page, "header p")  # not the muted grey of other text
    assert red[0] > red[1] + 60 and red[0] > red[2] + 60  # red
    page.fill("#key", KEY)
    page.press("#key", "Tab")
    _search(page, "a girl in a red dress", COLOUR, HOSTILE_CONDITION, 3)
    assert "a girl in a red dress" in page.text_content("#answered")  # results say which query they answer
    page.fill("#query", "   ")
    page.click("#go")
    _expect(page.locator("#status")).to_have_text("Type a query.")
    assert _colour(page, "#status") == red
    assert page.locator("#results li").count() == 0 and not page.text_content("#answered")
    _search(page, "a girl in a red dress", COLOUR, HOSTILE_CONDITION, 3)
    page.fill("#k", "0")
    page.click("#go")
    _expect(page.locator("#status")).to_contain_text("k must be")
    assert page.locator("#results li").count() == 0


@pytest.mark.browser
def test_one_corpus_at_a_time_labelled_results_and_scores_explained(browser, two_corpora) -> None:
    url, _ = two_corpora
    page = browser.new_page(viewport={"width": 1200, "height": 800})  # type: ignore[attr-defined]
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{url}/")
    _expect(page.locator("#conditions option")).to_have_count(2)
    assert sorted(_options(page, "#corpus")) == ["cars", "corpus"]
    assert page.input_value("#corpus") == "corpus"  # the corpus that has two conditions to compare
    assert sorted(_options(page, "#conditions")) == sorted([COLOUR, SPORT])  # suggested to both boxes
    page.select_option("#corpus", "cars")
    _expect(page.locator("#conditions option")).to_have_count(1)
    assert _options(page, "#conditions") == [CAR]
    page.select_option("#corpus", "corpus")

    _search(page, "a girl in a red dress", COLOUR, SPORT, 3)
    answered = page.text_content("#answered")
    assert "a girl in a red dress" in answered and "corpus" in answered
    assert "corpus" in page.text_content("#status")  # which corpus answered
    assert "within a column" in page.text_content("#score-note")
    assert page.locator(".z").count() == 0
    page.check("#calibrated")
    page.click("#go")
    _expect(page.locator("#left-results .z")).to_have_count(3)
    body = {"query": "a girl in a red dress", "condition": COLOUR, "k": 3, "calibrated": True}
    want = httpx.post(f"{url}/query", json=body, timeout=60)
    zs = [f"z {h['z']:.2f}" for h in want.json()["results"][0]["results"]]
    assert page.locator("#left-results .z").all_text_contents() == zs

    page.fill("#query", UNREADABLE)  # the model reads none of it: said, not ten ordinary-looking results
    page.click("#go")
    _expect(page.locator("#left-results .unreadable")).to_be_visible()
    assert "cannot read" in page.text_content("#left-results .unreadable")
    assert not errors


@pytest.mark.browser
def test_how_to_add_a_condition_and_a_new_one_appears_without_a_reload(browser, two_corpora) -> None:
    url, add_condition = two_corpora
    page = browser.new_page()  # type: ignore[attr-defined]
    page.goto(f"{url}/")
    _expect(page.locator("#conditions option")).to_have_count(2)
    command = page.text_content("#add-command")
    assert command.startswith("condsearch index ") and '-c "' in command
    add_condition(NEW_CONDITION)
    page.focus("#right")  # the lists are read again when a condition box gets focus
    _expect(page.locator("#conditions option")).to_have_count(3)
    assert NEW_CONDITION in _options(page, "#conditions")


@pytest.mark.browser
def test_the_docs_page_lists_the_api_offline(browser, hostile_server: str) -> None:
    page = browser.new_page()  # type: ignore[attr-defined]
    elsewhere: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(hostile_server) else elsewhere.append(r.url))
    page.goto(f"{hostile_server}/#key={KEY}")  # the key is kept for the tab: the docs page uses it
    _expect(page.locator("#conditions option")).to_have_count(2)
    page.goto(f"{hostile_server}/docs")
    _expect(page.locator(".operation")).not_to_have_count(0)
    listed = page.locator(".operation h2").all_text_contents()
    assert "POST /query" in listed and "GET /indexes" in listed
    assert "calibrated" in page.text_content("main")
    assert not elsewhere


@pytest.mark.browser
def test_the_search_button_reads_in_dark_mode(browser, demo_server: str) -> None:
    for scheme in ("dark", "light"):
        page = browser.new_page(color_scheme=scheme)  # type: ignore[attr-defined]
        page.goto(f"{demo_server}/")
        assert _contrast(_colour(page, "#go"), _colour(page, "#go", "backgroundColor")) >= 4.5, scheme
        page.close()


@pytest.mark.browser
def test_on_a_phone_both_columns_are_in_reach_and_targets_are_44px(browser, demo_server: str) -> None:
    page = browser.new_page(viewport={"width": 390, "height": 844}, has_touch=True, is_mobile=True)  # type: ignore[attr-defined]
    page.goto(f"{demo_server}/")
    _expect(page.locator("#conditions option")).to_have_count(2)
    _search(page, DEMO_QUERY, COLOUR, SPORT, 10)
    first_a = page.locator("#left-results li").first.bounding_box()
    page.click("#tab-right")
    first_b = page.locator("#right-results li").first.bounding_box()
    assert first_b is not None and first_a is not None
    assert first_b["y"] <= first_a["y"] + 1  # B starts where A does, not after A's ten results
    assert page.locator("#right-results li").first.is_visible()
    page.click("#tab-left")
    assert page.locator("#left-results li").first.is_visible()
    assert not page.locator("#right-results li").first.is_visible()
    small = page.eval_on_selector_all(
        'input:not([type="checkbox"]), select, button, summary, label.check',  # a checkbox: its label is the target
        "es => es.filter(e => e.offsetParent !== null && e.getBoundingClientRect().height < 44)"
        ".map(e => e.id || e.tagName)",
    )
    assert not small


@pytest.mark.browser
def test_the_search_is_in_the_url_and_back_returns_to_it(browser, two_corpora) -> None:
    url, _ = two_corpora
    page = browser.new_page()  # type: ignore[attr-defined]
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{url}/#key=unused")
    _search(page, "a girl + a dress & more", SPORT, COLOUR, 2)
    shared = page.url
    assert "#" in shared and "?" not in shared and "key=" not in shared
    _search(page, "two men play soccer", COLOUR, SPORT, 3)
    page.go_back()
    _expect(page.locator("#query")).to_have_value("a girl + a dress & more")
    _expect(page.locator("#left-results li")).to_have_count(2)
    assert page.text_content("#left-results h2") == SPORT

    fresh = browser.new_page()  # type: ignore[attr-defined]
    fresh.goto(shared)  # a shared link restores the search and runs it
    _expect(fresh.locator("#right-results li")).to_have_count(2)
    assert fresh.input_value("#query") == "a girl + a dress & more" and fresh.input_value("#k") == "2"
    assert fresh.input_value("#corpus") == "corpus"
    assert fresh.text_content("#right-results h2") == COLOUR
    assert not errors


MOOD = "the mood of the scene"  # never indexed


@pytest.fixture
def router_corpus(browser: object, tiny_bert_dir: Path, write_corpus, tmp_path: Path) -> Path:
    """An index folder of a router (--mode csr) corpus of the tiny BERT, indexed under COLOUR only."""
    from tests.query.test_on_demand import index as index_csr

    corpus = write_corpus({"id": [f"s{i}" for i in range(len(SENTENCES))], "text": SENTENCES})
    folder = tmp_path / "indexes"
    index_csr(corpus, folder, tiny_bert_dir, COLOUR)
    return folder


@pytest.mark.browser
def test_a_condition_typed_on_a_router_corpus_is_built_and_answered(browser, router_corpus: Path) -> None:
    with serve(router_corpus) as server:  # a small corpus: built in the request
        page = browser.new_page()  # type: ignore[attr-defined]
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{server.url}/")
        _expect(page.locator("#conditions option")).to_have_count(1)
        assert _options(page, "#conditions") == [COLOUR]
        assert page.get_attribute("#add-typed", "hidden") is None  # "type any condition", said for a router corpus
        _search(page, "a girl in a red dress", COLOUR, MOOD, 3)
        assert page.text_content("#right-results h2") == MOOD
        assert _column(page, "right") == _api(server.url, "a girl in a red dress", MOOD, 3)
        _expect(page.locator("#conditions option")).to_have_count(2)  # the built condition is offered now
        assert not errors


@pytest.mark.browser
def test_a_large_build_shows_its_progress_then_the_results(
    browser, router_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import condsearch.serve.builds as builds_module
    from tests.serve.test_serve_builds import HeldBuild

    held = HeldBuild()
    monkeypatch.setattr(builds_module, "build_on_demand", held)
    with serve(router_corpus, build_inline_rows=0) as server:  # every build answers 202: the page polls it
        page = browser.new_page()  # type: ignore[attr-defined]
        page.goto(f"{server.url}/")
        _expect(page.locator("#conditions option")).to_have_count(1)
        page.fill("#query", "a girl in a red dress")
        page.fill("#left", COLOUR)
        page.fill("#right", MOOD)
        page.fill("#k", "3")
        page.click("#go")
        status = page.locator("#status")
        _expect(status).to_have_text(f"Building “{MOOD}” for corpus corpus: 0 of {len(SENTENCES)} rows…")
        assert page.locator("#results li").count() == 0  # no column shown before both answer
        held.release.set()
        _expect(page.locator("#right-results li")).to_have_count(3)
        assert _column(page, "right") == _api(server.url, "a girl in a red dress", MOOD, 3)
        assert "error" not in (page.get_attribute("#status", "class") or "")
    assert held.calls == 1
