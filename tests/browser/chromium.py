"""Debian's chromium for the browser tests: where it is, and the flags it runs headless with as root."""

from __future__ import annotations

import os
import shutil

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MISSING = "no chromium installed (Debian: apt-get update && apt-get install -y chromium; or set $CHROMIUM)"


def chromium_path() -> str | None:
    """``$CHROMIUM``, else the first chromium on the PATH, else None."""
    for candidate in (os.environ.get("CHROMIUM"), "chromium", "chromium-browser", "/usr/bin/chromium"):
        if candidate and (found := shutil.which(candidate)):
            return found
    return None
