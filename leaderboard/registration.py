"""The claims ledger's registered plan and its amendments (``benchmarks/ledger_plan.yaml``,
``benchmarks/ledger_amendments.yaml``).

The plan fixes, before the runs, the point at which a run is read (and the sensitivity points that
mark a verdict fragile), alpha and the multiplicity rule, the seeds per suite, the convergence
criterion and the degeneracy rule. Every later change to a claim or to the plan is an amendment:
an append-only list of dated entries (before, after, reason, whether results had been seen), shown
on the site; a claim that an amendment names is badged "amended".
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from leaderboard.papers import DEFAULT_ROOT
from leaderboard.runs import LeaderboardError

PLAN_FILE = "ledger_plan.yaml"
AMENDMENTS_FILE = "ledger_amendments.yaml"
POINT = re.compile(r"^(final|last([1-9][0-9]*))$")


class RegistrationError(LeaderboardError):
    """A plan or amendments file that cannot be read: says which file, which key and what is wrong."""


def window_of(point: str) -> int:
    """How many of a run's last evaluations a point averages: ``final`` 1, ``last<k>`` k."""
    match = POINT.match(point)
    if match is None:
        raise ValueError(f"unknown point {point!r}: use 'final' or 'last<k>' (e.g. last3)")
    return int(match.group(2) or 1)


def point_label(point: str) -> str:
    k = window_of(point)
    return "final evaluation" if k == 1 else f"mean of the last {k} evaluations"


@dataclass(frozen=True)
class Convergence:
    window: int = 3
    change_pp: float = 1.0


@dataclass(frozen=True)
class Degeneracy:
    constant_predictor: bool = True
    worst5_at_zero: bool = True


@dataclass(frozen=True)
class LedgerPlan:
    version: int = 1
    registered: str = ""
    primary_point: str = "final"
    sensitivity_points: tuple[str, ...] = ("last3",)
    alpha: float = 0.05
    multiplicity: str = "holm within a family"
    default_seeds: int = 10
    suite_seeds: Mapping[str, int] = field(default_factory=dict)
    min_seeds: int = 3
    star_min_seeds: int = 10
    margin_rule: str = ""
    convergence: Convergence = Convergence()
    degeneracy: Degeneracy = Degeneracy()

    def seeds_for(self, suite: str) -> int:
        return int(self.suite_seeds.get(suite, self.default_seeds))

    @property
    def points(self) -> tuple[str, ...]:
        return (self.primary_point, *self.sensitivity_points)


def _number(raw: Mapping, key: str, kind: type, where: str, default: object, positive: bool = True) -> object:
    value = raw.get(key, default)
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise RegistrationError(f"{where}: `{key}` must be an integer, got {value!r}")
    if kind is float and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise RegistrationError(f"{where}: `{key}` must be a number, got {value!r}")
    if positive and not value > 0:  # type: ignore[operator]
        raise RegistrationError(f"{where}: `{key}` must be positive, got {value!r}")
    return kind(value)


def parse_plan(raw: object, where: str = PLAN_FILE) -> LedgerPlan:
    if not isinstance(raw, Mapping):
        raise RegistrationError(f"{where}: expected a mapping of the plan's keys")
    known = {"version", "registered", "primary_point", "sensitivity_points", "alpha", "multiplicity", "seeds",
             "min_seeds", "star_min_seeds", "margin_rule", "convergence", "degeneracy"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise RegistrationError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    points = [str(raw.get("primary_point", "final"))] + [str(p) for p in raw.get("sensitivity_points") or []]
    for point in points:
        try:
            window_of(point)
        except ValueError as error:
            raise RegistrationError(f"{where}: {error}") from None
    alpha = float(_number(raw, "alpha", float, where, 0.05))  # type: ignore[arg-type]
    if not alpha < 0.5:
        raise RegistrationError(f"{where}: `alpha` must lie in (0, 0.5), got {alpha}")
    seeds = raw.get("seeds") or {}
    if not isinstance(seeds, Mapping):
        raise RegistrationError(f"{where}: `seeds` is {{default: N, suites: {{suite: N}}}}")
    suites = seeds.get("suites") or {}
    for name, count in suites.items():
        _number({"n": count}, "n", int, f"{where}: seeds of suite {name}", 0)
    convergence = raw.get("convergence") or {}
    degeneracy = raw.get("degeneracy") or {}
    return LedgerPlan(
        version=int(_number(raw, "version", int, where, 1)),  # type: ignore[call-overload]
        registered=str(raw.get("registered") or ""),
        primary_point=points[0],
        sensitivity_points=tuple(points[1:]),
        alpha=alpha,
        multiplicity=str(raw.get("multiplicity") or "holm within a family"),
        default_seeds=int(_number(seeds, "default", int, f"{where}: seeds", 10)),  # type: ignore[call-overload]
        suite_seeds={str(k): int(v) for k, v in suites.items()},
        min_seeds=int(_number(raw, "min_seeds", int, where, 3)),  # type: ignore[call-overload]
        star_min_seeds=int(_number(raw, "star_min_seeds", int, where, 10)),  # type: ignore[call-overload]
        margin_rule=str(raw.get("margin_rule") or ""),
        convergence=Convergence(int(_number(convergence, "window", int, f"{where}: convergence", 3)),  # type: ignore[call-overload]
                                float(_number(convergence, "change_pp", float, f"{where}: convergence", 1.0))),  # type: ignore[arg-type]
        degeneracy=Degeneracy(bool(degeneracy.get("constant_predictor", True)),
                              bool(degeneracy.get("worst5_at_zero", True))),
    )


def load_plan(root: Path = DEFAULT_ROOT) -> LedgerPlan:
    """``<root>/ledger_plan.yaml``; the defaults of ``LedgerPlan`` where the file is missing."""
    path = Path(root) / PLAN_FILE
    if not path.exists():
        return LedgerPlan()
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise RegistrationError(f"{path}: not valid YAML ({error})") from None
    return parse_plan(raw, str(path))


@dataclass(frozen=True)
class Amendment:
    id: str
    date: str
    target: str  # a claim id, or "plan:<key>"
    before: str
    after: str
    reason: str
    results_seen: bool

    @property
    def on_plan(self) -> bool:
        return self.target.startswith("plan")


def _date(value: object, where: str) -> str:
    if isinstance(value, dt.date):
        return value.isoformat()
    try:
        return dt.date.fromisoformat(str(value)).isoformat()
    except ValueError:
        raise RegistrationError(f"{where}: `date` must be YYYY-MM-DD, got {value!r}") from None


def parse_amendments(raw: object, where: str = AMENDMENTS_FILE) -> list[Amendment]:
    """The amendments in file order. Append-only: ids run A1, A2, ... without gaps and dates never go
    back, so an entry edited or removed in the middle, or one inserted out of order, is refused."""
    if raw is None:
        return []
    entries = raw.get("amendments") if isinstance(raw, Mapping) else raw
    if not isinstance(entries, list):
        raise RegistrationError(f"{where}: expected `amendments:` with a list of entries")
    result: list[Amendment] = []
    for number, entry in enumerate(entries, start=1):
        here = f"{where}: entry {number}"
        if not isinstance(entry, Mapping):
            raise RegistrationError(f"{here}: expected a mapping")
        missing = [k for k in ("id", "date", "target", "before", "after", "reason", "results_seen") if k not in entry]
        if missing:
            raise RegistrationError(f"{here}: missing {', '.join(missing)}")
        if str(entry["id"]) != f"A{number}":
            raise RegistrationError(f"{here}: id {entry['id']!r} should be A{number} (append new entries at the end; "
                                    "never renumber or remove one)")
        if not isinstance(entry["results_seen"], bool):
            raise RegistrationError(f"{here}: `results_seen` must be true or false")
        date = _date(entry["date"], here)
        if result and date < result[-1].date:
            raise RegistrationError(f"{here}: dated {date}, before entry {number - 1} ({result[-1].date}); "
                                    "amendments are appended in time order")
        result.append(Amendment(f"A{number}", date, str(entry["target"]), str(entry["before"]).strip(),
                                str(entry["after"]).strip(), " ".join(str(entry["reason"]).split()),
                                entry["results_seen"]))
    return result


def load_amendments(root: Path = DEFAULT_ROOT) -> list[Amendment]:
    path = Path(root) / AMENDMENTS_FILE
    if not path.exists():
        return []
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise RegistrationError(f"{path}: not valid YAML ({error})") from None
    return parse_amendments(raw, str(path))
