"""Where the evidence lives: the committed exports the published site is built from (issue 52).

The repository keeps its results apart from its code, in ``evidence/`` at its root (no Python package):
``evidence/exploratory/<suite>/`` holds the ledger's exploratory runs, ``evidence/confirmatory/<suite>/``
the confirmatory pass's; each ``<suite>`` folder is the complete export of one finished suite
(``fl-leaderboard export --complete``). ``fl-leaderboard publish`` builds ``leaderboard_site/`` from
every one of them (:func:`published_exports`). Standard library only.
"""

from __future__ import annotations

from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[1]
EVIDENCE = REPOSITORY / "evidence"
EXPLORATORY = EVIDENCE / "exploratory"
CONFIRMATORY = EVIDENCE / "confirmatory"
PASSES = (EXPLORATORY, CONFIRMATORY)  # the order a build reads them in
PUBLISHED_SITE = REPOSITORY / "leaderboard_site"  # what the repository publishes, built from PASSES


def suite_exports(folder: Path) -> list[Path]:
    """The suite folders of one pass's folder, by name (its README and notes are not exports)."""
    return sorted(path for path in Path(folder).iterdir() if path.is_dir())


def published_exports(passes: tuple[Path, ...] | None = None) -> list[Path]:
    """Every export the published site is built from (``passes``, default PASSES): the exploratory
    suites, then the confirmatory ones. Raises ``FileNotFoundError`` (naming the folder) where a
    pass's folder is missing or holds no suite."""
    found: list[Path] = []
    for folder in PASSES if passes is None else passes:
        if not Path(folder).is_dir():
            raise FileNotFoundError(f"{shown(folder)}: no such folder (the committed exports the site is built from)")
        exports = suite_exports(folder)
        if not exports:
            raise FileNotFoundError(f"{shown(folder)} holds no export (one folder per suite)")
        found += exports
    return found


def shown(path: Path | str) -> str:
    """``path`` as a page names it: relative to the repository where it lies inside it (the same on
    every clone), else as given."""
    try:
        return Path(path).resolve().relative_to(REPOSITORY).as_posix()
    except ValueError:
        return str(path)
