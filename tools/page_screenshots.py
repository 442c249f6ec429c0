"""Take screenshots of the search page (desktop, phone, dark) after the demo search, for docs/.

python tools/page_screenshots.py docs/page-after   # writes docs/page-after-{desktop,phone,dark}.png

The demo corpus is indexed under two conditions with the default model, and a small second
corpus (cars) under one, in build/page-shots (kept, so a second run does not index again); a
server over them is driven by Playwright in Debian's Chromium (``condsearch[browser]``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from click.testing import CliRunner

from condsearch.cli import main as cli
from condsearch.corpus.demo import write_demo_corpus
from condsearch.serve.config import ServeConfig
from condsearch.serve.server import BackgroundServer, build_app

FOLDER = Path("build/page-shots")
QUERY = "A girl in an orange dress plays tennis"
COLOUR, SPORT = "color of the dress", "the sport being played"
CARS = [
    "A red Ferrari parked outside a cafe.",
    "A blue Toyota pickup on a dirt road.",
    "A white Tesla charging at night.",
    "An old green Volkswagen beetle in the rain.",
]
CHROMIUM = os.environ.get("CONDSEARCH_CHROMIUM", "/usr/bin/chromium")
SHOTS = {  # name: (viewport, colour scheme)
    "desktop": ({"width": 1200, "height": 800}, "light"),
    "phone": ({"width": 390, "height": 844}, "light"),
    "dark": ({"width": 1200, "height": 800}, "dark"),
}


def _index(*args: object) -> None:
    result = CliRunner().invoke(cli, [str(a) for a in args])
    if result.exit_code != 0:
        sys.exit(f"indexing failed: {result.output}")


def _prepare() -> Path:
    indexes = FOLDER / "indexes"
    if not indexes.exists():
        demo, cars = FOLDER / "demo.parquet", FOLDER / "cars.parquet"
        write_demo_corpus(demo)
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"id": [f"c{i}" for i in range(len(CARS))], "text": CARS}), cars)
        _index("index", demo, "-c", COLOUR, "-c", SPORT, "--index-dir", indexes)
        _index("index", cars, "-c", "the car maker", "--index-dir", indexes)
    return indexes


def _shoot(browser: object, url: str, prefix: str) -> None:
    for name, (viewport, scheme) in SHOTS.items():
        page = browser.new_page(viewport=viewport, color_scheme=scheme)  # type: ignore[attr-defined]
        page.goto(f"{url}/")
        page.wait_for_selector("#left option", state="attached")
        if page.locator("#corpus").count():  # the page with a corpus picker
            page.select_option("#corpus", label="demo")
            page.wait_for_selector("#left option", state="attached")
        page.fill("#query", QUERY)
        for side, condition in (("left", COLOUR), ("right", SPORT)):
            labels = page.eval_on_selector_all(f"#{side} option", "os => os.map(o => o.textContent)")
            page.select_option(f"#{side}", label=next(label for label in labels if label.startswith(condition)))
        page.fill("#k", "10")
        page.click("#go")
        page.wait_for_selector("#left-results li")
        page.locator("#go").blur()
        path = f"{prefix}-{name}.png"
        page.screenshot(path=path, full_page=True)
        print(path, Path(path).stat().st_size // 1024, "KB")
        page.close()


def main() -> None:
    prefix = sys.argv[1] if len(sys.argv) > 1 else "docs/page-after"
    indexes = _prepare()
    from playwright.sync_api import sync_playwright

    config = ServeConfig(index_dir=indexes, device="cpu")
    with BackgroundServer(build_app(config)) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            _shoot(browser, server.url, prefix)
        finally:
            browser.close()


if __name__ == "__main__":
    main()
