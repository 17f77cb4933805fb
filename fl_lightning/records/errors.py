"""A user's mistake in one line: a setting refused before anything runs (``PreflightError``), a
mistyped command line (``OneLineParser``), pydantic's first refusal in a declared format (where, the
value, what is wrong, the closest key the model takes) and the did-you-mean for a name not in a list.
Standard library only when imported (the runner, the fit lock and the leaderboard use it where torch
is not loaded); pydantic is asked only about an error it raised."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError


class PreflightError(ValueError):
    """A setting that cannot work, found before anything ran: the CLI, the runner and the fit lock
    raise it, and the CLI says it in one line (what is wrong and what to do), with no traceback."""


def did_you_mean(name: object, known: Iterable[str], prefix: str = "") -> str:
    """``; did you mean 'x'?`` for the names in ``known`` close to ``name``, else ``""``; a name
    that differs only in case comes first (``fedlf`` -> ``FedLF``). ``prefix`` goes before each."""
    name, known = str(name), list(known)
    same_but_case = [k for k in known if k.lower() == name.lower() and k != name]
    close = same_but_case + [c for c in difflib.get_close_matches(name, known, n=2) if c not in same_but_case]
    if not close:  # compared without case: FEDAVG is close to FedAvg
        by_lower = {k.lower(): k for k in known}
        close = [by_lower[c] for c in difflib.get_close_matches(name.lower(), list(by_lower), n=2)]
    close = [f"{prefix}{c}" for c in close[:2]]
    return f"; did you mean {' or '.join(map(repr, close))}?" if close else ""


def unknown_key_message(key: str, known: Sequence[str]) -> str:
    """The refusal of a key a file format does not take (``key``: where it sits, dotted; the
    did-you-mean compares its last part): ``unknown key 'a.windw'; did you mean 'window'?; valid: ...``."""
    valid = f"; valid: {', '.join(known)}" if known else ""
    return f"unknown key {key!r}{did_you_mean(key.rpartition('.')[2], known)}{valid}"


# pydantic's errors whose message is a validator's own text, as written
OWN_TEXT = ("value_error", "assertion_error")


@dataclasses.dataclass(frozen=True)
class Refusal:
    """pydantic's first refusal, read: its type (``kind``), where (``loc``, without the tags pydantic
    puts in for a union's members), the value refused, the message (a validator's own text as it
    wrote it), and the keys the model there takes (for an unknown key)."""

    kind: str
    loc: tuple[str | int, ...]
    value: Any
    message: str
    known: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        """Where, as a file is written: ``seeds.suites.s``, ``items[0].x``."""
        text = ""
        for part in self.loc:
            text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
        return text

    @property
    def key(self) -> str:
        """The innermost key named (``x`` of ``items[0].x``); ``""`` at the top."""
        return next((str(part) for part in reversed(self.loc) if isinstance(part, str)), "")

    @property
    def own_text(self) -> bool:
        """Whether the message is a validator's own (a ValueError, a custom error), not pydantic's."""
        if self.kind in OWN_TEXT:
            return True
        from pydantic_core.core_schema import ErrorType

        return self.kind not in typing.get_args(ErrorType)

    def __str__(self) -> str:
        """The refusal in one line: an unknown key with its did-you-mean, a key missing, a validator's
        own text, or where, what pydantic expected and what it got."""
        if self.kind == "extra_forbidden":
            return unknown_key_message(self.path, self.known)
        if self.kind == "missing":
            return f"missing {self.path}"
        if self.own_text:
            return self.message
        if not self.path:
            return f"{self.message}, got {self.value!r}"
        return f"`{self.path}` {self.message[:1].lower()}{self.message[1:]}, got {self.value!r}"


def first_refusal(error: ValidationError, model: type[BaseModel] | None = None) -> Refusal:
    """The first of ``error``'s refusals, read (``model``: the one validated, to leave out a
    union's tags and to know the keys an unknown key could have meant)."""
    first = error.errors(include_url=False)[0]
    context = first.get("ctx") or {}
    message = str(context["error"]) if first["type"] in OWN_TEXT and "error" in context else first["msg"]
    loc, known = _walk(tuple(first["loc"]), model)
    return Refusal(first["type"], loc, first.get("input"), message,
                   known if first["type"] == "extra_forbidden" else ())


def one_line(error: ValidationError, model: type[BaseModel] | None = None) -> str:
    """``error`` as one line (see :class:`Refusal`)."""
    return str(first_refusal(error, model))


def _walk(loc: tuple[str | int, ...], model: type[BaseModel] | None) -> tuple[tuple[str | int, ...], tuple[str, ...]]:
    """``loc`` without a union's tags, and the fields of the model its last part sits in."""
    if model is None:
        return loc, ()
    kept: list[str | int] = []
    models: list[Any] = [model]
    parents = models
    tags: set[str] = set()  # how pydantic names the members of the union at this place
    for part in loc:
        if isinstance(part, str) and (part in tags or (tags and "[" in part)):
            models = [m for m in models if m.__name__ == part] or models
            tags = set()
            continue
        parents = models
        kept.append(part)
        field = next((m.model_fields[part] for m in models if isinstance(part, str) and part in m.model_fields), None)
        if field is None:  # a list's index or a mapping's key: its items are of the same types
            continue
        inside = _types_in(field.annotation)
        models = [t for t in inside if _is_model(t)]
        is_union = any(typing.get_origin(t) in (typing.Union, types.UnionType) for t in inside)
        tags = {getattr(t, "__name__", "") for t in inside} - {""} if is_union else set()
    return tuple(kept), tuple(parents[0].model_fields) if parents else ()


def _types_in(annotation: Any) -> list[Any]:
    """Every type inside an annotation (``list[X] | None`` -> the union, list[X], X, None)."""
    found, stack = [], [annotation]
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(typing.get_args(current))
    return found


def _is_model(annotation: Any) -> bool:
    """Whether an annotation is a pydantic model class (``list[X]`` passes as a type on Python 3.10)."""
    try:
        return isinstance(annotation, type) and hasattr(annotation, "model_fields") and not typing.get_args(annotation)
    except TypeError:
        return False


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
