"""The formats of the claims ledger's registered plan and its amendments (``benchmarks/ledger_plan.yaml``,
``benchmarks/ledger_amendments.yaml``), declared: pydantic models of what each file may hold
(``extra="forbid"``: a misspelt key is refused with a did-you-mean, not ignored) and the checks of
their values (a reading point, a reading over rounds, a date). Torch-free and beside
``registration``; the leaderboard's ``registration`` turns the validated models into its plan and
amendments (defaults, the checks across keys, the append-only rule)."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
)

POINT = re.compile(r"^(final|last([1-9][0-9]*))$")


def window_of(point: str) -> int:
    """How many of a run's last evaluations a point averages: ``final`` 1, ``last<k>`` k."""
    match = POINT.match(point)
    if match is None:
        raise ValueError(f"unknown point {point!r}: use 'final' or 'last<k>' (e.g. last3)")
    return int(match.group(2) or 1)


OVER_ROUNDS_LABELS = {"all": "mean over every round", "second_half": "mean over the second half of the rounds",
                      "final": "last round"}
"""The readings of a quantity the papers average over rounds (the leaderboard's
``claims.quantities.OVER_ROUNDS_READINGS``)."""


def _over_reading(reading: Any) -> str:
    if str(reading) not in OVER_ROUNDS_LABELS:
        raise ValueError(f"unknown reading over rounds {reading!r}: use one of {', '.join(OVER_ROUNDS_LABELS)}")
    return str(reading)


Positive = Annotated[StrictInt, Field(gt=0)]


class _Declared(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SeedsSpec(_Declared):
    default: Positive = 10
    suites: dict[str, Positive] | None = None


class ConvergenceSpec(_Declared):
    window: Positive = 3
    change_pp: Annotated[StrictFloat | StrictInt, Field(gt=0)] = 1.0


class DegeneracySpec(_Declared):
    constant_predictor: StrictBool = True
    worst5_at_zero: StrictBool = True


def _point(point: Any) -> str:
    window_of(str(point))  # refuses anything but final / last<k>
    return str(point)


Point = Annotated[str, BeforeValidator(_point)]
OverReading = Annotated[str, BeforeValidator(_over_reading)]


class OverRoundsSpec(_Declared):
    primary: OverReading = "all"
    sensitivity: list[OverReading] | None = None


class PlanSpec(_Declared):
    """``ledger_plan.yaml`` as declared (``extra="forbid"``: a misspelt key is refused)."""

    version: Positive = 1
    registered: Annotated[str, BeforeValidator(lambda v: v.isoformat() if isinstance(v, dt.date) else v)] = ""
    primary_point: Point = "final"
    sensitivity_points: list[Point] | None = None
    alpha: Annotated[StrictFloat | StrictInt, Field(gt=0, lt=0.5)] = 0.05
    multiplicity: str | None = None
    seeds: SeedsSpec | None = None
    min_seeds: Positive = 3
    star_min_seeds: Positive = 10
    margin_rule: str | None = None
    convergence: ConvergenceSpec | None = None
    degeneracy: DegeneracySpec | None = None
    over_rounds: OverRoundsSpec | None = None
    scale: str | None = None
    knife_edge: str | None = None
    registered_hash: str | None = None
    seeds_rule: str | None = None
    timing: str | None = None


def _date(value: Any) -> str:
    if isinstance(value, dt.date):
        return value.isoformat()
    try:
        return dt.date.fromisoformat(str(value)).isoformat()
    except ValueError:
        raise ValueError(f"`date` must be YYYY-MM-DD, got {value!r}") from None


def _stripped(value: Any) -> Any:
    return str(value).strip() if isinstance(value, str | int | float) and not isinstance(value, bool) else value


Stripped = Annotated[str, BeforeValidator(_stripped)]


class AmendmentSpec(_Declared):
    """One entry of ``ledger_amendments.yaml`` as declared (``extra="forbid"``)."""

    id: Stripped
    date: Annotated[str, BeforeValidator(_date)]
    target: Stripped
    before: Stripped
    after: Stripped
    reason: Stripped
    results_seen: StrictBool
