"""The fl-lightning cache folder (standard library only: the console script reads it before
importing torch): parsed sources, the MLflow store template, the running fits, the help text."""

from __future__ import annotations

import os
import sys
from pathlib import Path

CACHE_ENV = "FL_LIGHTNING_CACHE"  # where parsed text sources are kept as .npz (default: the user cache)


def cache_dir() -> Path:
    """Where parsed sources are kept: ``$FL_LIGHTNING_CACHE``, else the platform's user cache
    (``$XDG_CACHE_HOME`` or ``~/.cache`` on Linux, ``~/Library/Caches`` on macOS,
    ``%LOCALAPPDATA%`` on Windows), in a ``fl-lightning`` folder."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "fl-lightning"
