"""What the leaderboard's browser tests share: one headless Chromium per test module."""

from __future__ import annotations

import pytest
from chromium import CHROMIUM_FLAGS, chromium_path


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory):
    """A fresh headless Chromium (Debian's, driven by playwright) at 1,400 x 900 px."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="the Python package 'playwright' is not installed")
    executable = chromium_path()
    if executable is None:
        pytest.skip("Chromium is missing")
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),  # a fresh --user-data-dir
            executable_path=executable, headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 900},
        )
        yield context
        context.close()
