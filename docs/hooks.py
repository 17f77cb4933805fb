"""mkdocs hook: the published site carries the leaderboard (the committed ``leaderboard/site``,
built from the exported results) under ``leaderboard/``, so one static site holds both. The copy
goes to a temporary folder first and is renamed into place (a build stopped half-way leaves no
half-copied leaderboard)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

LEADERBOARD = Path(__file__).resolve().parents[1] / "leaderboard" / "site"


def on_post_build(config: Any, **_: Any) -> None:
    if not (LEADERBOARD / "index.html").is_file():
        return  # a checkout without the published results: the docs alone
    target = Path(config["site_dir"]) / "leaderboard"
    partial = target.with_name(".leaderboard-partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(LEADERBOARD, partial)
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)
