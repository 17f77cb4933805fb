"""The claims ledger's registered plan and its amendments (``benchmarks/ledger_plan.yaml``,
``benchmarks/ledger_amendments.yaml``).

The plan fixes, before the runs, the point at which a run is read (and the sensitivity points that
mark a verdict fragile), alpha and the multiplicity rule, the seeds per suite, the convergence
criterion and the degeneracy rule. Every later change to a claim or to the plan is an amendment:
an append-only list of dated entries (before, after, reason, whether results had been seen), shown
on the site; a claim that an amendment names is badged "amended". The files' formats (the pydantic
models and the checks of their values) live in ``fl_lightning.records.plan_format``; here they are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml
from pydantic import ValidationError

from fl_lightning.records.errors import one_line
from fl_lightning.records.plan_format import (
    OVER_ROUNDS_LABELS,
    AmendmentSpec,
    ConvergenceSpec,
    DegeneracySpec,
    OverRoundsSpec,
    PlanSpec,
    SeedsSpec,
    window_of,
)
from fl_lightning.records.registration import (  # noqa: F401  (the registration, re-exported for the ledger's readers)
    AMENDMENTS_FILE,
    CONFIRMATORY,
    HASH_KEY,
    LEDGER_PASS_TAG,
    PLAN_FILE,
    PLAN_HASH_TAG,
    recorded_hash,
    registered_files,
    registration_hash,
    registration_problem,
    with_recorded_hash,
)
from leaderboard.papers import DEFAULT_ROOT
from leaderboard.runs import LeaderboardError


class RegistrationError(LeaderboardError):
    """A plan or amendments file that cannot be read: says which file, which key and what is wrong."""


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
    over_rounds_primary: str = "all"  # how a mean over rounds is read at the primary point
    over_rounds_sensitivity: tuple[str, ...] = ()  # ... and at each sensitivity point, paired by position
    scale: str = ""  # what every verdict was measured at (named on each verdict cell, the tally, the CSV)
    knife_edge: str = ""  # the rule that marks a verdict knife-edge, in words
    seeds_rule: str = ""  # which seeds each pass runs, in words
    timing: str = ""  # how timing claims are measured, in words
    registered_hash: str = ""  # the registration's content hash (``registration_hash``), "" before registration
    # the confirmatory pass's fresh seeds (``ledger_confirmatory.yaml``); set on the plan a confirmatory
    # verdict is decided under (``for_confirmatory``), where they are every suite's planned seeds
    fresh_seeds: tuple[int, ...] = ()

    def seeds_for(self, suite: str) -> int:
        return len(self.fresh_seeds) if self.fresh_seeds else int(self.suite_seeds.get(suite, self.default_seeds))

    def seed_names(self, suite: str) -> frozenset[str]:
        """A suite's planned seeds as runs name them: the fresh seeds of a confirmatory plan, else
        0, 1, ..., ``seeds_for(suite)`` - 1."""
        if self.fresh_seeds:
            return frozenset(map(str, self.fresh_seeds))
        return frozenset(str(k) for k in range(self.seeds_for(suite)))

    def for_confirmatory(self, seeds: tuple[int, ...]) -> LedgerPlan:
        """This plan deciding on the confirmatory pass's fresh ``seeds`` (every suite)."""
        return replace(self, fresh_seeds=tuple(seeds))

    def over_rounds_at(self, point: str) -> str:
        """The reading of a mean over rounds that pairs with an at-point reading of the plan: the
        primary one with the primary point, each sensitivity one with the sensitivity point at its
        position ("all" where the plan pairs none)."""
        if point == self.primary_point:
            return self.over_rounds_primary
        position = self.sensitivity_points.index(point) if point in self.sensitivity_points else None
        if position is not None and position < len(self.over_rounds_sensitivity):
            return self.over_rounds_sensitivity[position]
        return "all"

    def reading_label(self, point: str, over_rounds: bool = False) -> str:
        """'final evaluation', 'mean of the last 3 evaluations', or for a mean over rounds
        'mean over the second half of the rounds'."""
        return OVER_ROUNDS_LABELS[self.over_rounds_at(point)] if over_rounds else point_label(point)

    @property
    def points(self) -> tuple[str, ...]:
        return (self.primary_point, *self.sensitivity_points)


def parse_plan(raw: object, where: str = PLAN_FILE) -> LedgerPlan:
    """The plan ``raw`` (the plan file's YAML) as a :class:`LedgerPlan`, defaults filled
    in; a malformed plan, or one whose over-rounds sensitivity readings do not pair one to
    one with its sensitivity points, raises :class:`RegistrationError` naming ``where``."""
    if not isinstance(raw, Mapping):
        raise RegistrationError(f"{where}: expected a mapping of the plan's keys")
    try:
        spec = PlanSpec.model_validate(raw)
    except ValidationError as error:
        raise RegistrationError(f"{where}: {one_line(error, PlanSpec)}") from None
    seeds = spec.seeds or SeedsSpec()
    convergence = spec.convergence or ConvergenceSpec()
    degeneracy = spec.degeneracy or DegeneracySpec()
    over = spec.over_rounds or OverRoundsSpec()
    sensitivity = tuple(spec.sensitivity_points or ())
    over_sensitivity = tuple(over.sensitivity or ())
    if spec.over_rounds is not None and len(over_sensitivity) != len(sensitivity):
        raise RegistrationError(
            f"{where}: over_rounds.sensitivity has {len(over_sensitivity)} reading(s) and sensitivity_points "
            f"{len(sensitivity)}: give one reading over rounds for each sensitivity point, in the same order")
    return LedgerPlan(
        version=spec.version,
        registered=spec.registered or "",
        primary_point=spec.primary_point,
        sensitivity_points=sensitivity,
        alpha=float(spec.alpha),
        multiplicity=spec.multiplicity or "holm within a family",
        default_seeds=seeds.default,
        suite_seeds=dict(seeds.suites or {}),
        min_seeds=spec.min_seeds,
        star_min_seeds=spec.star_min_seeds,
        margin_rule=spec.margin_rule or "",
        convergence=Convergence(convergence.window, float(convergence.change_pp)),
        degeneracy=Degeneracy(degeneracy.constant_predictor, degeneracy.worst5_at_zero),
        over_rounds_primary=over.primary,
        over_rounds_sensitivity=over_sensitivity,
        scale=spec.scale or "",
        knife_edge=spec.knife_edge or "",
        seeds_rule=spec.seeds_rule or "",
        timing=spec.timing or "",
        registered_hash=spec.registered_hash or "",
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
        if isinstance(entry, Mapping) and "id" in entry and str(entry["id"]) != f"A{number}":
            raise RegistrationError(f"{here}: id {entry['id']!r} should be A{number} (append new entries at the end; "
                                    "never renumber or remove one)")
        try:
            spec = AmendmentSpec.model_validate(entry)
        except ValidationError as error:
            if error.errors()[0]["loc"] == ("results_seen",) and error.errors()[0]["type"] != "missing":
                raise RegistrationError(f"{here}: `results_seen` must be true or false") from None
            missing = [str(e["loc"][0]) for e in error.errors() if e["type"] == "missing"]
            said = f"missing {', '.join(missing)}" if missing else one_line(error, AmendmentSpec)
            raise RegistrationError(f"{here}: {said}") from None
        if result and spec.date < result[-1].date:
            raise RegistrationError(f"{here}: dated {spec.date}, before entry {number - 1} ({result[-1].date}); "
                                    "amendments are appended in time order")
        result.append(Amendment(f"A{number}", spec.date, spec.target, spec.before, spec.after,
                                " ".join(spec.reason.split()), spec.results_seen))
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


CONFIRMATORY_FILE = "ledger_confirmatory.yaml"


def load_fresh_seeds(root: Path = DEFAULT_ROOT) -> tuple[int, ...]:
    """The confirmatory pass's fresh seeds (``seeds.values`` of ``<root>/ledger_confirmatory.yaml``,
    part of the registration); () where the file is missing."""
    path = Path(root) / CONFIRMATORY_FILE
    if not path.exists():
        return ()
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        raise RegistrationError(f"{path}: not valid YAML ({error})") from None
    values = (raw.get("seeds") or {}).get("values") if isinstance(raw, Mapping) else None
    if not (isinstance(values, list) and values and all(type(v) is int and v >= 0 for v in values)
            and len(set(values)) == len(values)):
        raise RegistrationError(f"{path}: `seeds.values` must list the pass's distinct seeds (integers >= 0)")
    return tuple(values)


def register(root: Path = DEFAULT_ROOT, again: bool = False) -> tuple[str, bool]:
    """Record the registration hash of the files under ``root`` in its plan (``registered_hash:``,
    written beside and renamed): (the hash, whether the plan changed). The plan and the amendments
    must read cleanly first. A plan that records another hash is re-registered only with ``again``
    (a change after registration is an amendment first); one that records this hash is left as it is."""
    root = Path(root)
    path = root / PLAN_FILE
    if not path.exists():
        raise RegistrationError(f"{path} does not exist: write the plan before registering it")
    plan = load_plan(root)  # refuses a plan that does not read
    load_amendments(root)
    if not plan.registered:
        raise RegistrationError(f"{path}: `registered:` (the date) is missing: date the plan before registering it")
    digest = registration_hash(root)
    recorded = recorded_hash(root)
    if recorded == digest:
        return digest, False
    if recorded and not again:
        raise RegistrationError(
            f"{path} records another registration ({recorded[:12]}; the files now hash to {digest[:12]}): record "
            f"the change in {AMENDMENTS_FILE} and register again with --again")
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(with_recorded_hash(path.read_text(), digest))
        partial.replace(path)
    except OSError as error:  # a full disk: the plan stays as it was, our partial copy goes
        partial.unlink(missing_ok=True)
        raise RegistrationError(f"{path}: could not record the hash ({error.strerror or error}); "
                                "the plan is unchanged: free space and register again") from None
    return digest, True
