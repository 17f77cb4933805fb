"""mkdocs hook: the published site carries the leaderboard (the committed ``leaderboard/site``,
built from the exported results) under ``leaderboard/``, so one static site holds both and the
docs' links into it are checked like any other. Its files are static files of the build; its
Markdown twins (``*.md``, for reading on GitHub) are left out, or mkdocs would render them as pages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

LEADERBOARD = Path(__file__).resolve().parents[1] / "leaderboard" / "site"


def on_files(files: Files, config: Any) -> Files:
    if not (LEADERBOARD / "index.html").is_file():
        return files  # a checkout without the published results: the docs alone
    for path in sorted(LEADERBOARD.rglob("*")):
        if path.is_file() and path.suffix != ".md":
            uri = f"leaderboard/{path.relative_to(LEADERBOARD).as_posix()}"
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files
