"""The HTML report of two real runs, opened in headless Chromium (Debian's ``/usr/bin/chromium``
driven by playwright, never a downloaded browser): no console error, no request leaves the file,
every plot decodes, every internal link has its target and following one scrolls there, the
candidate's script is text, and a screenshot of the page is not blank.

Without Chromium the test fails saying how to install it (``make browser``); set
``KERNELJUDGE_NO_BROWSER=1`` to skip it on a machine that cannot have one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from kerneljudge.suite.htmlreport import write_report
from kerneljudge.suite.store import ResultsStore

from .report_runs import EPISODE, SCRIPT_IN_SOURCE

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1280, "height": 900}


def _browser_or_fail() -> Any:
    """playwright's sync API, when Chromium and playwright are there; else fail (or skip
    under KERNELJUDGE_NO_BROWSER=1)."""
    problem = ""
    if not CHROMIUM.exists():
        problem = f"{CHROMIUM} is missing: run `make browser` (apt-get install chromium)"
    else:
        try:
            from playwright.sync_api import sync_playwright

            return sync_playwright
        except ImportError:
            problem = "playwright is missing: pip install -e '.[dev]'"
    if os.environ.get("KERNELJUDGE_NO_BROWSER") == "1":
        pytest.skip(f"KERNELJUDGE_NO_BROWSER=1 and {problem}")
    pytest.fail(f"the browser test needs Chromium and playwright: {problem}", pytrace=False)


def _pixels_spread(png: bytes) -> tuple[tuple[int, int], float]:
    """The image's size and the standard deviation of its grey levels (0-255)."""
    import io

    from PIL import Image, ImageStat

    with Image.open(io.BytesIO(png)) as im:
        return im.size, ImageStat.Stat(im.convert("L")).stddev[0]


def test_the_report_in_headless_chromium(report_store: Path, tmp_path: Path) -> None:
    sync_playwright = _browser_or_fail()
    with ResultsStore(report_store) as store:
        path = write_report(store, "a", "b", tmp_path / "report.html")
        episode = next(r for r in store.verdicts("a") if (r.problem, r.sample) == EPISODE)
    url = path.resolve().as_uri()
    console: list[str] = []
    requests: list[str] = []
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a fresh user-data-dir
            executable_path=str(CHROMIUM),
            headless=True,
            args=ARGS,
            viewport=VIEWPORT,
        )
        try:
            context.route(
                "**/*",
                lambda route: (
                    requests.append(route.request.url),
                    route.continue_() if route.request.url == url else route.abort(),
                ),
            )
            page = context.new_page()
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
            page.goto(url, wait_until="load")

            # nothing but the file itself was asked for (images are data: URIs)
            assert [r for r in requests if not r.startswith("data:")] == [url]

            # every plot is there and decoded
            images = page.evaluate(
                "Array.from(document.images).map(i => [i.closest('figure').id, i.complete,"
                " i.naturalWidth, i.naturalHeight])"
            )
            assert sorted(i[0] for i in images) == sorted(
                f"plot-{k}" for k in ("distribution", "fastp", "speedups", "roofline", "statuses")
            )
            assert all(ok and w > 0 and h > 0 for _, ok, w, h in images), images

            # the source that tries to end the <pre> and run a script stays text
            assert page.evaluate("typeof window.__pwned") == "undefined"
            assert page.evaluate("document.scripts.length") == 0
            assert page.locator("pre", has_text=SCRIPT_IN_SOURCE).count() == 2  # relu/same a, b

            # every internal link has its target
            hrefs = page.evaluate(
                "Array.from(document.querySelectorAll('a[href]')).map(a => a.getAttribute('href'))"
            )
            assert hrefs and all(h.startswith("#") for h in hrefs), hrefs
            missing = page.evaluate(
                "hs => hs.filter(h => !document.getElementById(decodeURIComponent(h.slice(1))))",
                hrefs,
            )
            assert missing == []

            # following the index's link to the episode's candidate scrolls to its section
            anchor = f"run1-v{episode.id}"
            page.click(f'#run1-candidates + table a[href="#{anchor}"]')
            page.wait_for_function(f"location.hash === '#{anchor}'")
            top = page.evaluate(f"document.getElementById('{anchor}').getBoundingClientRect().top")
            assert -2 <= top < VIEWPORT["height"] and page.evaluate("window.scrollY") > 0, top
            section = page.locator(f"#{anchor}")
            assert section.locator(".msg").count() == 6  # the transcript's records
            assert "correct: 5/5" in section.inner_text()

            # screenshots: the top of the page, and one plot
            page.evaluate("window.scrollTo(0, 0)")
            shot = page.screenshot(path=str(tmp_path / "report.png"))
            size, spread = _pixels_spread(shot)
            assert size == (VIEWPORT["width"], VIEWPORT["height"]) and spread > 20, spread
            figure = page.locator("#plot-fastp img").screenshot()
            size, spread = _pixels_spread(figure)
            assert size[0] > 300 and size[1] > 150 and spread > 20, (size, spread)
        finally:
            context.close()
    errors = [c for c in console if c.startswith(("error", "pageerror"))]
    assert errors == [], console
