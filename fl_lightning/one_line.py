"""A user's mistake in one line: the command lines' parser and the first line of an error's text
(standard library only: the runner and the leaderboard use it where torch is not loaded)."""

from __future__ import annotations

import argparse


class OneLineParser(argparse.ArgumentParser):
    """A usage error in one line (what is wrong, where the help is), exit code 2, instead of
    argparse's usage block followed by the error."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def first_line(text: object, default: str = "") -> str:
    """The first non-empty line of ``str(text)``, stripped; ``default`` when it has none."""
    return next((line.strip() for line in str(text).splitlines() if line.strip()), default)
