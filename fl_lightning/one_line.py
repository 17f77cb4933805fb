"""A user's mistake in one line: the command lines' parser and the first line of an error's text
(standard library and ``fl_lightning.records.errors`` only: the runner and the leaderboard use it where
torch is not loaded)."""

from __future__ import annotations

import argparse
from typing import Any

from fl_lightning.records.errors import did_you_mean


class OneLineParser(argparse.ArgumentParser):
    """A usage error in one line (what is wrong, where the help is), exit code 2, instead of
    argparse's usage block followed by the error; a mistyped option gets a did-you-mean from the
    options of the command it was given to."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self._command_parser(parsed)
            options = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
            mistyped = next((a.split("=")[0] for a in extras if a.startswith("--")), None)
            hint = did_you_mean(mistyped, options) if mistyped else ""
            parser.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed

    def _command_parser(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The parser of the subcommand ``parsed`` chose (itself when it has none)."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
                if isinstance(chosen, argparse.ArgumentParser):
                    return chosen
        return self


def first_line(text: object, default: str = "") -> str:
    """The first non-empty line of ``str(text)``, stripped; ``default`` when it has none."""
    return next((line.strip() for line in str(text).splitlines() if line.strip()), default)
