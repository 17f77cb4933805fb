"""Closed sets of string settings as ``typing.Literal`` types: LightningCLI lists their values in
``--help`` and refuses others; ``check_choice`` gives Python callers the same refusal."""

from __future__ import annotations

import difflib
import typing
from typing import Any, Literal


def did_you_mean(name: str, known: list[str], prefix: str = "") -> str:
    """``; did you mean 'x'?`` for the names in ``known`` close to ``name``, else ``""``."""
    close = [f"{prefix}{c}" for c in difflib.get_close_matches(name, known, n=2)]
    return f"; did you mean {' or '.join(map(repr, close))}?" if close else ""


def choices_of(annotation: Any) -> list[Any]:
    """The values a ``Literal[...]`` (or ``Literal[...] | None``) type admits (None included)."""
    if typing.get_origin(annotation) is Literal:
        return list(typing.get_args(annotation))
    values: list[Any] = []
    for arg in typing.get_args(annotation):
        values += [None] if arg is type(None) else choices_of(arg)
    return values


def check_choice(name: str, value: Any, annotation: Any, null_means: str | None = None) -> None:
    """Refuses ``value`` when it is not one of ``annotation``'s, naming the valid ones
    (``null_means`` says what None stands for, e.g. "no attacker")."""
    valid = sorted(choices_of(annotation), key=lambda v: v is not None)  # null first
    if value not in valid:
        null = f"null ({null_means})" if null_means else "null"
        shown = ", ".join(null if v is None else repr(v) for v in valid)
        raise ValueError(f"unknown {name} {value!r}; valid: {shown}")
