"""Closed sets of string settings as ``typing.Literal`` types: LightningCLI lists their values in
``--help`` and refuses others; ``check_choice`` gives Python callers the same refusal."""

from __future__ import annotations

import typing
from typing import Any, Literal

from fl_lightning.records.errors import did_you_mean


def unknown_algorithm(args: list[str], known: typing.Collection[str]) -> str | None:
    """The value of ``--model`` on a command line when it names no algorithm of ``known`` and
    is a bare name (a class path, a file or an inline dict is LightningCLI's to check)."""
    for i, arg in enumerate(args):
        if arg == "--model" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--model="):
            value = arg.split("=", 1)[1]
        else:
            continue
        is_path = "." in value or "/" in value or value.startswith("{")
        if not is_path and value not in known:
            return value
    return None


def unknown_algorithm_message(name: str, known: typing.Collection[str]) -> str:
    """The refusal of an unknown algorithm name: the valid names, the class-path form, a did-you-mean."""
    return (f"unknown algorithm {name!r}; valid: {', '.join(sorted(known))} "
            f"(or the class path of a FederatedModule subclass, e.g. mypackage.MyAlgorithm)"
            f"{did_you_mean(name, list(known))}")


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
