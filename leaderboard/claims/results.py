"""The ledger's results: per comparison, per ablation and per claim, and how a result reads in
words (the interval at its true level, the paper's effect inside, above or below it)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from leaderboard.claims.quantities import quantity_of
from leaderboard.claims.spec import (
    BY_CONSTRUCTION,
    NO_RUNS,
    NOT_IMPLEMENTED,
    NOT_TESTABLE,
    NOT_TESTED,
    WITHDRAWN,
    Ablation,
    Claim,
    Comparison,
)
from leaderboard.convergence import UNCONVERGED
from leaderboard.registration import Amendment, LedgerPlan
from leaderboard.runs import FAILED, RunRecord
from leaderboard.stats import (
    CONTRADICTED,
    INCONCLUSIVE,
    REPRODUCED,
    TOO_FEW,
    PairedResult,
)
from leaderboard.tables import pick_used_runs

# ---------------------------------------------------------------------------------------------
# Verdicts from the runs
# ---------------------------------------------------------------------------------------------


@dataclass
class ComparisonResult:
    comparison: Comparison
    suite: str
    result: PairedResult | None  # at the plan's primary point, on the planned seeds; None: no paired seeds
    treatment_values: dict[str, float]
    baseline_values: dict[str, float]
    convergence: dict[str, int] = field(default_factory=dict)  # status -> runs, both arms, each run once
    withdrawn: str = ""  # why the benchmark cannot rank (degenerate)
    versions: tuple[str, ...] = ()  # code versions of the runs paired
    at_points: dict[str, str] = field(default_factory=dict)  # sensitivity point -> verdict
    extension: PairedResult | None = None  # on every seed present, when there are more than planned
    planned_seeds: int = 0
    detectable: float | None = None  # the test actually used: MDE (greater/less) or equivalence margin (equal)
    unpaired: dict[str, str] = field(default_factory=dict)  # planned seed left out of the pairs -> why
    holm_not_reached: bool = False  # judged after Holm's first non-rejection: inconclusive, its interval no test
    knife_edge: tuple[str, ...] = ()  # seeds whose leaving out alone changes the verdict
    convergence_arms: dict[str, dict[str, str]] = field(default_factory=dict)  # arm -> run id -> status

    @property
    def unconverged(self) -> int:
        return self.convergence.get(UNCONVERGED, 0)

    @property
    def verdict(self) -> str:
        if self.withdrawn:
            return WITHDRAWN
        if self.result is None:
            return NO_RUNS
        return self.result.verdict

    @property
    def paper_position(self) -> str:
        """Where the paper's own effect lies against our interval: inside, above or below ("" unknown)."""
        paper = self.comparison.paper_difference
        result = self.result
        if paper is None or result is None or result.low is None or result.high is None or self.withdrawn:
            return ""
        return "above" if paper > result.high else "below" if paper < result.low else "inside"

    @property
    def paper_side(self) -> str:
        """The paper's effect against ours in the claim's own direction: "inside" our interval; for a
        "greater" or "less" claim, ours "weaker" (the paper's effect lies further in the claimed
        direction than our interval) or "stronger"; for an "equal" claim, the paper's difference lies
        "above" or "below" our interval ("" unknown)."""
        position = self.paper_position
        direction = self.comparison.direction
        if position in ("", "inside") or direction == "equal":
            return position
        further = position == ("above" if direction == "greater" else "below")
        return "weaker" if further else "stronger"


@dataclass
class AblationResult:
    ablation: Ablation
    comparisons: list[ComparisonResult]

    @property
    def verdict(self) -> str:
        return combine([c.verdict for c in judged(self.comparisons)])


def judged(entries: list[ComparisonResult]) -> list[ComparisonResult]:
    """The comparisons a verdict is combined from: all but those that hold by construction (shown on
    their rows, never counted)."""
    return [entry for entry in entries if not entry.comparison.by_construction]


@dataclass
class ClaimResult:
    claim: Claim
    comparisons: list[ComparisonResult] = field(default_factory=list)
    ablations: list[AblationResult] = field(default_factory=list)
    amendments: tuple[Amendment, ...] = ()
    reason_text: str = ""  # the reason template, filled from the runs
    plan: LedgerPlan | None = None

    @property
    def data_verdict(self) -> str:
        """What the runs say at the primary point, before the claim's own labels."""
        return combine([c.verdict for c in judged(self.comparisons)])

    @property
    def verdict(self) -> str:
        """The claim's verdict: its own label first (not testable, not implemented, not tested), else
        what the runs say (``data_verdict``), shown as "holds by construction" where the claim is one."""
        if self.claim.not_testable:
            return NOT_TESTABLE
        if self.claim.not_implemented:
            return NOT_IMPLEMENTED
        if self.claim.not_tested:
            return NOT_TESTED
        verdict = self.data_verdict
        if self.claim.by_construction and verdict == REPRODUCED:
            return BY_CONSTRUCTION
        return verdict

    def verdict_at(self, point: str) -> str:
        return combine([c.at_points.get(point, c.verdict) for c in judged(self.comparisons)])

    @property
    def fragile_points(self) -> list[tuple[str, str]]:
        """(sensitivity point, verdict) where the verdict differs from the primary point's."""
        if self.claim.stand_ins_only or self.claim.not_tested or not self.comparisons or self.plan is None:
            return []
        primary = self.data_verdict
        return [(p, v) for p in self.plan.sensitivity_points if (v := self.verdict_at(p)) != primary]

    @property
    def fragile(self) -> bool:
        return bool(self.fragile_points)

    @property
    def amended(self) -> bool:
        return bool(self.amendments)

    @property
    def extension_verdict(self) -> str:
        """The verdict on every seed present, where some comparison has more seeds than planned ("" none)."""
        if not any(c.extension is not None for c in self.comparisons):
            return ""
        return combine([(c.extension.verdict if c.extension is not None else c.verdict)
                        for c in judged(self.comparisons)])

    @property
    def seeds(self) -> int:
        counts = [c.result.n for c in self.comparisons if c.result is not None]
        return min(counts) if counts else 0

    @property
    def seeds_planned(self) -> int:
        return max((c.planned_seeds for c in self.comparisons), default=0)

    @property
    def mixed_versions(self) -> tuple[str, ...]:
        versions = sorted({v for c in self.comparisons if len(c.versions) > 1 for v in c.versions})
        return tuple(versions)

    @property
    def paper_positions(self) -> list[str]:
        return [c.paper_position for c in self.comparisons]

    @property
    def reason(self) -> str:
        """The ledger's reason (filled from the runs), then what the ablations showed for a claim that
        does not hold offline."""
        parts = [self.reason_text] if self.reason_text else []
        if self.verdict in (REPRODUCED, NOT_TESTED, BY_CONSTRUCTION):
            return " ".join(parts)
        changed = [a for a in self.ablations if a.verdict != self.data_verdict and a.verdict not in (NO_RUNS, TOO_FEW)]
        if self.ablations and not changed and all(a.verdict not in (NO_RUNS, TOO_FEW) for a in self.ablations):
            parts.append("None of the factors tried changes the verdict.")
        elif changed and not self.claim.stand_ins_only:
            parts.append("Changes the verdict: " + "; ".join(
                f"{a.ablation.factor} ({self.data_verdict} → {a.verdict})" for a in changed) + ".")
        elif not self.ablations and not self.claim.stand_ins_only:
            parts.append("No ablation run yet.")
        return " ".join(parts)


def combine(verdicts: list[str]) -> str:
    """A claim holds when every comparison reproduces it; one contradicted comparison contradicts it."""
    if not verdicts:
        return NO_RUNS
    for special in (WITHDRAWN, NO_RUNS, TOO_FEW):
        if special in verdicts:
            return special
    if all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    if CONTRADICTED in verdicts:
        return CONTRADICTED
    return INCONCLUSIVE


RunIndex = dict[tuple[str, str, str], dict[str, RunRecord]]  # (suite, benchmark, config) -> seed -> run


def index_runs(runs: Iterable[RunRecord]) -> RunIndex:
    """The newest FINISHED run per (suite, benchmark, configuration, seed)."""
    groups: dict[tuple[str, str, str], list[RunRecord]] = {}
    for run in runs:
        groups.setdefault((run.suite, run.benchmark, run.config), []).append(run)
    return {key: {run.seed: run for run in pick_used_runs(group)[0]} for key, group in groups.items()}


def index_failed_runs(runs: Iterable[RunRecord]) -> RunIndex:
    """The FAILED runs per (suite, benchmark, configuration, seed): why a seed may have no finished
    run (a partition that cannot be drawn on it fails every arm alike, before any training)."""
    failed: RunIndex = {}
    for run in runs:
        if run.status == FAILED:
            failed.setdefault((run.suite, run.benchmark, run.config), {})[run.seed] = run
    return failed


def failure_text(error: str) -> str:
    """A run's error tag as one short line: its ``error:`` line (the CLI's refusal, without the log's
    path before it), to the end of its first sentence; else the tag's first line."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    said = next((line.removeprefix("error:").strip() for line in lines if line.startswith("error:")),
                lines[0] if lines else "no error recorded")
    sentence, dot, _ = said.partition(". ")
    return sentence + (dot.strip() if dot else "")


def planned(seeds: Iterable[str], wanted: frozenset[str]) -> set[str]:
    """The plan's seeds among ``seeds`` (``wanted``: ``LedgerPlan.seed_names`` of the suite)."""
    return {seed for seed in seeds if seed in wanted}


# ---------------------------------------------------------------------------------------------
# Text for the page and the exports
# ---------------------------------------------------------------------------------------------


def _signed(value: float, decimals: int) -> str:
    return f"{value:+.{decimals}f}"


def level_text(level: float) -> str:
    """'95 %', '97.5 %', '98.3 %': a confidence level as the page labels it."""
    text = f"{100 * level:.1f}".rstrip("0").rstrip(".")
    return f"{text} %"


SIDE_TEXT = {"inside": "inside our interval",
             "weaker": "beyond our interval in the claimed direction: ours is weaker",
             "stronger": "short of our interval in the claimed direction: ours is stronger",
             "above": "above our interval", "below": "below our interval"}
"""The paper's effect against our interval (``ComparisonResult.paper_side``), in words."""


def unpaired_text(unpaired: dict[str, str]) -> str:
    """'seeds 2, 6, 7 left out: CGSV(beta=1.5)'s CGSV rho is undefined in its run (...)'."""
    by_reason: dict[str, list[str]] = {}
    for seed, why in unpaired.items():
        by_reason.setdefault(why, []).append(seed)
    return "; ".join(f"seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)} left out: {why}"
                     for why, seeds in by_reason.items())


def difference_text(entry: ComparisonResult, claim: Claim) -> str:
    """'+2.17 pp [+1.41, +2.93] (97.5 % CI), 10 seeds; paper +3.57, above' for one comparison."""
    quantity = quantity_of(entry.comparison.treatment.quantity)
    unit = "pp" if quantity.unit == "%" else quantity.unit
    decimals = quantity.decimals
    result = entry.result
    if entry.withdrawn:
        return f"withdrawn: {entry.withdrawn}"
    if result is None:
        return "no paired runs"
    text = f"{_signed(result.mean, decimals)}{(' ' + unit) if unit else ''}"
    if entry.holm_not_reached:  # its own interval would read as a test Holm did not make
        text += " (no interval: not reached by Holm, which stopped at an earlier comparison of the claim)"
    elif result.low is not None and result.high is not None:
        text += f" [{_signed(result.low, decimals)}, {_signed(result.high, decimals)}] ({level_text(result.level)} CI)"
    text += f", {result.n} seed{'s' if result.n != 1 else ''}"
    if entry.unpaired:
        text += f" of {result.n + len(entry.unpaired)} with runs ({unpaired_text(entry.unpaired)})"
    if result.verdict == INCONCLUSIVE and entry.detectable is not None and not entry.holm_not_reached:
        if entry.comparison.direction == "equal":
            text += (
                f"; equivalence detectable within ±{entry.detectable:.{decimals}f} (margin {entry.comparison.margin:g})"
            )
        else:
            text += f"; detectable ≥ {entry.detectable:.{decimals}f}"
    paper = entry.comparison.paper_difference
    if paper is not None:
        text += f"; paper {_signed(paper, decimals)}"
        if entry.paper_side:
            text += f" ({SIDE_TEXT[entry.paper_side]})"
    if entry.knife_edge:
        seeds = entry.knife_edge
        text += (f"; knife-edge: leaving out seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)} alone "
                 f"changes the verdict")
    if entry.unconverged:
        text += f"; {entry.unconverged} of {sum(entry.convergence.values())} runs unconverged"
    if entry.extension is not None:
        ext = entry.extension
        text += (f"; extension beyond the plan: {ext.n} seeds {_signed(ext.mean, decimals)}"
                 f" → {ext.verdict} (not the verdict)")
    if len(entry.versions) > 1:
        text += f"; ⚠ runs of {len(entry.versions)} code versions"
    return text
