"""Reasons: a claim's reason is a Jinja2 template filled from the runs at build time, so every
number in it is computed from the data (``render_reason``)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import jinja2

from leaderboard.claims.quantities import quantity_of, quantity_value
from leaderboard.claims.results import (
    ClaimResult,
    ComparisonResult,
    RunIndex,
    difference_text,
    planned,
)
from leaderboard.claims.spec import REASONS, Claim, ClaimsError
from leaderboard.convergence import (
    UNCONVERGED,
    convergence_change,
    convergence_status,
)
from leaderboard.registration import LedgerPlan, window_of

# ---------------------------------------------------------------------------------------------
# Reasons: templates filled from the runs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    """One configuration's values of a quantity over the planned seeds, at the primary point."""

    values: tuple[float, ...]
    statuses: tuple[str, ...] = ()
    changes: tuple[float, ...] = ()  # convergence changes (pp) of the runs that could be judged

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def sd(self) -> float | None:
        return statistics.stdev(self.values) if len(self.values) >= 2 else None

    @property
    def min(self) -> float | None:
        return min(self.values) if self.values else None

    @property
    def max(self) -> float | None:
        return max(self.values) if self.values else None

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    def count(self, value: float, tolerance: float = 1e-9) -> int:
        return sum(1 for v in self.values if abs(v - value) <= tolerance)

    @property
    def unconverged(self) -> int:
        return sum(1 for s in self.statuses if s == UNCONVERGED)

    @property
    def improving(self) -> int:
        """Runs whose accuracy still rose by more than the plan's change at their end."""
        return sum(1 for s, c in zip(self.statuses, self.changes) if s == UNCONVERGED and c > 0)

    @property
    def falling(self) -> int:
        return sum(1 for s, c in zip(self.statuses, self.changes) if s == UNCONVERGED and c < 0)


class ReasonError(ClaimsError):
    pass


class ReasonNeedsRuns(ReasonError):
    """A reason names runs the store does not hold (a store with only some of the suites)."""


@dataclass(frozen=True)
class ComparisonNumbers:
    """A comparison's numbers as a reason template reads them."""

    entry: ComparisonResult
    claim: Claim

    def __getattr__(self, name: str) -> object:
        result = self.entry.result
        if name in ("mean", "sd", "n", "low", "high", "level"):
            return None if result is None else getattr(result, name)
        if name == "verdict":
            return self.entry.verdict
        if name == "text":
            return difference_text(self.entry, self.claim)
        raise AttributeError(name)


def render_reason(result: ClaimResult, index: RunIndex, plan: LedgerPlan) -> str:
    """The claim's reason with every number filled from the runs (``arm``, ``comparison``, ``ablation``)."""
    claim = result.claim
    if not claim.reason:
        return ""
    window = window_of(plan.primary_point)

    def arm(suite: str, benchmark: str, config: str, quantity: str) -> Arm:
        try:
            quantity_of(quantity)
        except KeyError:
            raise ReasonError(f"{claim.file}: claim {claim.id}: reason: unknown quantity {quantity!r}") from None
        runs = index.get((suite, benchmark, config))
        if runs is None:
            raise ReasonNeedsRuns(f"no runs of {config!r} on {suite} / {benchmark}")
        seeds = planned(runs, plan.seed_names(suite))
        chosen = [runs[s] for s in sorted(seeds, key=int)]
        values = tuple(v for run in chosen if (v := quantity_value(run, quantity, window)) is not None)
        statuses = tuple(convergence_status(run, plan.convergence.window, plan.convergence.change_pp) for run in chosen)
        changes = tuple(convergence_change(run, plan.convergence.window) or 0.0 for run in chosen)
        return Arm(values, statuses, changes)

    def comparison(k: int) -> ComparisonNumbers:
        if not 1 <= k <= len(result.comparisons):
            raise ReasonError(f"{claim.file}: claim {claim.id}: reason: comparison({k}) of {len(result.comparisons)}")
        return ComparisonNumbers(result.comparisons[k - 1], claim)

    def ablation(i: int, k: int) -> ComparisonNumbers:
        if not 1 <= i <= len(result.ablations) or not 1 <= k <= len(result.ablations[i - 1].comparisons):
            raise ReasonError(f"{claim.file}: claim {claim.id}: reason: ablation({i}, {k}) does not exist")
        return ComparisonNumbers(result.ablations[i - 1].comparisons[k - 1], claim)

    try:
        text = REASONS.from_string(claim.reason).render(arm=arm, comparison=comparison, ablation=ablation)
    except ReasonError:
        raise
    except jinja2.TemplateError as error:
        raise ReasonError(f"{claim.file}: claim {claim.id}: reason template: {error}") from None
    return " ".join(text.split())
