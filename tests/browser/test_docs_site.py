"""The documentation site in a real headless Chromium (tox env ``browser``; no torch needed:
mkdocstrings reads the docstrings from the source).

The site is built with ``mkdocs build --strict`` and served over HTTP (the search runs in a web
worker, which ``file://`` does not allow). Checked: the home page, an algorithm page with its
equations, the API reference with FedLF's class and its parameters, the search finding FedLF,
and the leaderboard reached from the home page; every algorithm page's formulas rendered with no
TeX macro left as text; no script error. Screenshots go to
``$BROWSER_SCREENSHOT_DIR`` (or the test's temporary folder).
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from chromium import CHROMIUM_FLAGS, MISSING, chromium_path

ROOT = Path(__file__).resolve().parents[2]
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the Python package 'playwright' is not installed (pip install playwright)"
)
CHROMIUM = chromium_path()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=MISSING)


@pytest.fixture(scope="module")
def site_url(tmp_path_factory):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    if mkdocs is None:
        pytest.fail("mkdocs is not installed (pip install mkdocs-material 'mkdocstrings[python]')")
    site = tmp_path_factory.mktemp("docs") / "site"
    built = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(site)], cwd=ROOT, capture_output=True,
                           text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=600)
    assert built.returncode == 0, built.stderr[-4000:]
    handler = functools.partial(QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # no request lines in the test output
        pass


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1280, "height": 900})
        yield context
        context.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    folder = Path(os.environ.get("BROWSER_SCREENSHOT_DIR") or tmp_path_factory.mktemp("docs-screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def visit(browser, url: str):
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("response", lambda response: errors.append(f"{response.status} {response.url}")
            if response.status >= 400 else None)
    page.goto(url, wait_until="networkidle")
    return page, errors


def test_home_page_gives_the_two_commands_and_links_every_guide(browser, site_url, shots):
    page, errors = visit(browser, f"{site_url}/")
    assert page.title().startswith("fl-lightning")
    code = page.locator("pre code").first.inner_text()
    assert "pip install -e ." in code and "tox" in code
    for guide in ("Getting started", "Writing an algorithm", "Suites and the runner", "API reference"):
        assert page.get_by_role("link", name=guide).count() > 0, guide
    page.screenshot(path=str(shots / "docs_home.png"), full_page=True)
    assert not errors


def test_an_algorithm_page_renders_its_equations(browser, site_url, shots):
    page, errors = visit(browser, f"{site_url}/algorithms/fedlf/")
    assert "FedLF" in page.locator("h1").first.inner_text()
    formulas = page.locator(".arithmatex math")
    assert formulas.count() > 10, "the FedLF page's equations are not rendered (MathML)"
    assert page.locator(".arithmatex", has_text="\\(").count() == 0, "a formula is left as raw TeX"
    box = formulas.first.bounding_box()
    assert box is not None and box["width"] > 0 and box["height"] > 0
    page.screenshot(path=str(shots / "docs_fedlf.png"), full_page=True)
    assert not errors


ALGORITHM_PAGES = sorted(p.stem for p in (ROOT / "docs" / "algorithms").glob("*.md") if p.stem != "index")
# the page's rendered text outside code (MathML included); a backslash followed by letters there
# is a TeX macro the math renderer did not know (issue 50: "\\lVert" shown on three pages)
RENDERED_TEXT = """() => {
  const article = document.querySelector("article").cloneNode(true);
  article.querySelectorAll("pre, code, script, style").forEach(e => e.remove());
  return article.textContent;
}"""


@pytest.mark.parametrize("name", ALGORITHM_PAGES)
def test_every_algorithm_page_shows_no_raw_tex(browser, site_url, name):
    page, errors = visit(browser, f"{site_url}/algorithms/{name}/")
    assert page.locator(".arithmatex math").count() > 0, f"{name}: no formula rendered as MathML"
    raw = sorted(set(re.findall(r"\\[A-Za-z]+|\\[|{}()\[\]]", page.evaluate(RENDERED_TEXT))))
    assert not raw, f"algorithms/{name}: the page shows TeX source: {raw}"
    page.close()
    assert not errors


def test_the_api_reference_documents_the_classes_from_their_docstrings(browser, site_url, shots):
    page, errors = visit(browser, f"{site_url}/reference/algorithms/")
    heading = page.locator("[id='fl_lightning.algorithms.fedlf.FedLF']")
    assert heading.count() == 1, "FedLF's class is not in the API reference"
    heading.scroll_into_view_if_needed()
    assert page.get_by_text("server_lr").count() > 0
    page.screenshot(path=str(shots / "docs_api.png"))
    assert not errors


def test_search_finds_an_algorithm(browser, site_url):
    page, errors = visit(browser, f"{site_url}/")
    page.locator("input.md-search__input").click()
    page.locator("input.md-search__input").press_sequentially("FedLF")
    results = page.locator(".md-search-result__item")
    results.first.wait_for(timeout=15_000)
    assert results.count() > 0
    assert any("FedLF" in text for text in results.all_inner_texts())
    assert not errors


def test_the_leaderboard_is_part_of_the_site(browser, site_url, shots):
    if not (ROOT / "leaderboard_site" / "index.html").is_file():
        pytest.skip("this checkout has no published leaderboard (leaderboard_site)")
    page, errors = visit(browser, f"{site_url}/")
    page.locator("a[data-leaderboard]").click()
    page.wait_for_load_state("load")
    assert "/leaderboard/" in page.url
    assert page.locator("#claims").count() == 1, "the leaderboard's claims ledger is missing"
    assert not errors
