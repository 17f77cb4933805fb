"""The command line, read once: ``sys.argv`` becomes a :class:`CommandLine` that the console
script, LightningCLI's subclass and the settings reader all take, so no part of the command line
reads ``sys.argv`` again (a test or ``replay`` gives the words in-process instead)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CommandLine:
    """What the command line says: the program's name (``fl-lightning``, ``__main__.py``: the
    help's ``usage:`` line), the words after it, and whether they came from the process's own
    command line (the console script, whose process ends with the fit) or were given in-process."""

    program: str
    words: tuple[str, ...]
    from_process: bool


def read_command_line(args: Sequence[object] | None = None) -> CommandLine:
    """The command line: ``args`` when given (in-process: a test, ``replay``), else ``sys.argv``."""
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    if args is None:
        return CommandLine(program, tuple(str(word) for word in sys.argv[1:]), True)
    return CommandLine(program, tuple(str(word) for word in args), False)
