"""Verdicts from the runs: each claim's comparisons paired by seed over the plan's seeds, at the
plan's primary point and its sensitivity points (fragile when they disagree), Holm-corrected
within the claim (``leaderboard.stats.decide``), with convergence and degeneracy checked."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from leaderboard.claims.quantities import quantity_of, quantity_value
from leaderboard.claims.reasons import ReasonError, ReasonNeedsRuns, render_reason
from leaderboard.claims.results import (
    AblationResult,
    ClaimResult,
    ComparisonResult,
    RunIndex,
    failure_text,
    index_failed_runs,
    index_runs,
    planned,
)
from leaderboard.claims.spec import NO_RUNS, WITHDRAWN, Claim, Comparison, Side
from leaderboard.convergence import convergence_status
from leaderboard.registration import Amendment, LedgerPlan, window_of
from leaderboard.runs import RunRecord
from leaderboard.stats import (
    INCONCLUSIVE,
    TOO_FEW,
    PairedResult,
    decide,
    equivalence_detectable,
    holm_adjust,
    paired_differences,
)


def degenerate(index: RunIndex, suite: str, benchmark: str, plan: LedgerPlan) -> str:
    """Why a benchmark cannot rank anything under the plan's degeneracy rule, "" otherwise: every
    run of every configuration at one accuracy (a constant predictor), or the worst 5 % of clients
    at 0 in every run of every configuration."""
    window = window_of(plan.primary_point)
    runs = [run for (s, b, _), seeds in index.items() if (s, b) == (suite, benchmark) for run in seeds.values()]
    if plan.degeneracy.constant_predictor:
        present = [v for run in runs if (v := quantity_value(run, "mean", window)) is not None]
        if len(present) >= 4 and max(present) - min(present) < 1e-6:
            return f"every run of every configuration ends at {present[0]:.2f} %: a constant predictor"
    if plan.degeneracy.worst5_at_zero:
        worst = [quantity_value(run, "worst5", window) for run in runs]
        if len(worst) >= 4 and all(v is not None and v == 0.0 for v in worst):
            configs = len({key for key in index if key[:2] == (suite, benchmark)})
            mean = [v for run in runs if (v := quantity_value(run, "mean", window)) is not None]
            span = f"; mean client accuracy {min(mean):.1f}-{max(mean):.1f} %" if mean else ""
            return (f"the worst 5 % of clients are at 0 % in all {len(worst)} runs of its {configs} "
                    f"configurations{span}: a degenerate benchmark")
    return ""


Reading = tuple[int, str]  # (window of an at-point quantity, reading of a mean over rounds)


def reading_of(plan: LedgerPlan, point: str) -> Reading:
    """How every quantity is read at one of the plan's points: a quantity at a point as the mean of
    the last k evaluations, a mean over rounds by the reading the plan pairs with that point."""
    return window_of(point), plan.over_rounds_at(point)


def _values(index: RunIndex, suite: str, side: Side, reading: Reading,
            seeds: set[str] | None) -> tuple[dict[str, float], dict[str, RunRecord]]:
    runs = {seed: run for seed, run in index.get((suite, side.benchmark, side.config), {}).items()
            if seeds is None or seed in seeds}
    values = {seed: v for seed, run in runs.items()
              if (v := quantity_value(run, side.quantity, *reading)) is not None}
    return values, runs


def _pairs(comparison: Comparison, suite: str, index: RunIndex, reading: Reading, seeds: set[str] | None,
           ) -> tuple[dict[str, float], dict[str, float], list[RunRecord]]:
    """Treatment and baseline values by seed, and every run they come from (both arms, each once)."""
    treatment, treatment_runs = _values(index, suite, comparison.treatment, reading, seeds)
    if comparison.baseline is not None:
        baseline, baseline_runs = _values(index, suite, comparison.baseline, reading, seeds)
    else:
        baseline = {seed: float(comparison.threshold) for seed in treatment}  # type: ignore[arg-type]
        baseline_runs = {}
    common = set(treatment) & set(baseline)
    used = {run.run_id: run for seed, run in treatment_runs.items() if seed in common}
    used.update({run.run_id: run for seed, run in baseline_runs.items() if seed in common})
    return treatment, baseline, list(used.values())


def _unpaired(comparison: Comparison, suite: str, index: RunIndex, seeds: set[str],
              treatment: dict[str, float], baseline: dict[str, float], failed: RunIndex | None = None,
              ) -> dict[str, str]:
    """Why each planned seed that has runs is left out of the pairs: an arm whose run of it FAILED
    (its error, from ``failed``), an arm with no run of it, or a run whose quantity is undefined (a
    NaN rho). A seed with no run in either arm is not listed."""
    why: dict[str, str] = {}
    sides = [(comparison.treatment, treatment)] + ([(comparison.baseline, baseline)] if comparison.baseline else [])
    for seed in sorted(seeds - (set(treatment) & set(baseline)), key=lambda s: (len(s), s)):
        for side, values in sides:
            if seed in values:
                continue
            run = index.get((suite, side.benchmark, side.config), {}).get(seed)
            failure = (failed or {}).get((suite, side.benchmark, side.config), {}).get(seed)
            quantity = quantity_of(side.quantity)
            if run is None and failure is not None:
                why[seed] = f"{side.config}'s run FAILED: {failure_text(failure.error)}"
            elif run is None:
                why[seed] = f"{side.config} has no run of it"
            else:
                why[seed] = (f"{side.config}'s {quantity.label} is undefined in its run"
                             + (f" ({quantity.undefined})" if quantity.undefined else ""))
            break
    return why


def _decide_family(comparisons: list[Comparison], differences: list[list[float]],
                   alpha: float) -> list[PairedResult | None]:
    """Each comparison's verdict in its Holm family (``holm_family``)."""
    return holm_family(comparisons, differences, alpha)[0]


def holm_family(comparisons: list[Comparison], differences: list[list[float]],
                alpha: float) -> tuple[list[PairedResult | None], set[int]]:
    """Each comparison decided alone, then Holm's step-down over those with a p (Holm 1979): the
    comparison with the k-th smallest p (0-based) is judged at alpha / (m - k), none after the first
    that is not rejected. Done here rather than by one ``decide`` because a claim's comparisons may
    differ in direction and margin (FedMGDA+ unchanged by an attack while q-FedAvg falls). Also the
    comparisons Holm did not reach (judged after the first non-rejection): inconclusive whatever
    their own interval says. A comparison that holds by construction is decided alone, outside the family."""
    not_reached: set[int] = set()
    results: list[PairedResult | None] = [
        decide([d], c.direction, c.margin, alpha)[0] if d else None for c, d in zip(comparisons, differences)]
    tested = [k for k, r in enumerate(results) if r is not None and r.verdict != TOO_FEW and r.p is not None
              and not comparisons[k].by_construction]  # shown alone, kept out of the claim's verdict and family
    if len(tested) > 1:
        adjusted = holm_adjust([results[k].p for k in tested])  # type: ignore[union-attr, misc]
        order = sorted(range(len(tested)), key=lambda j: results[tested[j]].p)  # type: ignore[union-attr, return-value, arg-type]
        stopped = False
        for rank, j in enumerate(order):
            k = tested[j]
            step = decide([differences[k]], comparisons[k].direction, comparisons[k].margin,
                          alpha / (len(tested) - rank))[0]
            verdict = INCONCLUSIVE if stopped else step.verdict
            if stopped:
                not_reached.add(k)
            stopped = stopped or step.verdict == INCONCLUSIVE
            results[k] = PairedResult(step.n, step.mean, step.sd, step.low, step.high, step.level, step.p,
                                      adjusted[j], verdict, step.mde)
    return results, not_reached


def knife_edge_seeds(comparisons: list[Comparison], arms: list[tuple[dict[str, float], dict[str, float]]],
                     alpha: float) -> list[list[str]]:
    """For each comparison, the seeds whose leaving out alone changes its verdict (the family
    re-decided without that seed in any comparison): a verdict that one seed decides is knife-edge."""
    full = _decide_family(comparisons, [paired_differences(t, b) for t, b in arms], alpha)
    seeds = sorted({seed for t, b in arms for seed in set(t) & set(b)}, key=lambda s: (len(s), s))
    flips: list[list[str]] = [[] for _ in comparisons]
    for seed in seeds:
        without = [({s: v for s, v in t.items() if s != seed}, {s: v for s, v in b.items() if s != seed})
                   for t, b in arms]
        again = _decide_family(comparisons, [paired_differences(t, b) for t, b in without], alpha)
        for k, (before, after) in enumerate(zip(full, again)):
            if before is not None and before.verdict != TOO_FEW and (after is None or after.verdict != before.verdict):
                flips[k].append(seed)
    return flips


def _detectable(comparison: Comparison, result: PairedResult | None) -> float | None:
    """The smallest effect the test actually used could detect at 80 % power: the t-test's MDE for
    greater/less; for equal, the smallest margin two one-sided tests at the step's level would show."""
    if result is None or result.sd is None or result.n < 2:
        return None
    if comparison.direction == "equal":
        return equivalence_detectable(result.n, result.sd, (1.0 - result.level) / 2.0)
    return result.mde


def evaluate_family(comparisons: Iterable[Comparison], suite: str, index: RunIndex,
                    plan: LedgerPlan | None = None, failed: RunIndex | None = None) -> list[ComparisonResult]:
    """One family (a claim's comparisons on one suite, or one ablation's) under the plan: at the
    primary point on the planned seeds, Holm-corrected; the verdicts at the sensitivity points; and,
    where more seeds than planned exist, the extension on every seed (shown, never the verdict).
    ``failed``: the FAILED runs (``index_failed_runs``), which say why a seed has no run."""
    plan = plan or LedgerPlan()
    comparisons = list(comparisons)
    count = plan.seeds_for(suite)
    primary = reading_of(plan, plan.primary_point)
    present = {seed for c in comparisons for side in (c.treatment, c.baseline) if side is not None
               for runs in (index, failed or {}) for seed in runs.get((suite, side.benchmark, side.config), {})}
    seeds = planned(present, plan.seed_names(suite))
    arms = [_pairs(c, suite, index, primary, seeds) for c in comparisons]
    decided, not_reached = holm_family(comparisons, [paired_differences(t, b) for t, b, _ in arms], plan.alpha)
    flips = knife_edge_seeds(comparisons, [(t, b) for t, b, _ in arms], plan.alpha)
    withdrawn: dict[str, str] = {}
    results = []
    for k, (comparison, (treatment, baseline, used), result) in enumerate(zip(comparisons, arms, decided)):
        benchmark = comparison.treatment.benchmark
        if benchmark not in withdrawn:
            withdrawn[benchmark] = degenerate(index, suite, benchmark, plan)
        common = set(treatment) & set(baseline)
        arms_read = {"treatment": comparison.treatment, "baseline": comparison.baseline}
        convergence_arms = {
            arm: {run.run_id: convergence_status(run, plan.convergence.window, plan.convergence.change_pp)
                  for seed, run in index.get((suite, side.benchmark, side.config), {}).items() if seed in common}
            for arm, side in arms_read.items() if side is not None}
        # both arms, each run once (the runs ``used``): one status per run id
        statuses = Counter({run_id: status for arm in convergence_arms.values()
                            for run_id, status in arm.items()}.values())
        results.append(ComparisonResult(
            comparison, suite, result, treatment, baseline, dict(statuses), withdrawn[benchmark],
            tuple(sorted({run.code_version for run in used})), planned_seeds=count,
            detectable=_detectable(comparison, result),
            unpaired=_unpaired(comparison, suite, index, seeds, treatment, baseline, failed),
            holm_not_reached=k in not_reached, knife_edge=tuple(flips[k]), convergence_arms=convergence_arms))
    for point in plan.sensitivity_points:
        at = [_pairs(c, suite, index, reading_of(plan, point), seeds) for c in comparisons]
        for entry, verdict in zip(results, _decide_family(comparisons, [paired_differences(t, b) for t, b, _ in at],
                                                          plan.alpha)):
            entry.at_points[point] = (WITHDRAWN if entry.withdrawn else NO_RUNS if verdict is None
                                      else verdict.verdict)
    if present - seeds:
        every = [_pairs(c, suite, index, primary, None) for c in comparisons]
        for entry, extended in zip(results, _decide_family(
                comparisons, [paired_differences(t, b) for t, b, _ in every], plan.alpha)):
            if extended is not None and entry.result is not None and extended.n > entry.result.n:
                entry.extension = extended
    return results


def evaluate(claims: Iterable[Claim], runs: Iterable[RunRecord], plan: LedgerPlan | None = None,
             amendments: Iterable[Amendment] = (), strict: bool = False) -> list[ClaimResult]:
    """Every claim's verdicts and reason. A reason that names runs the store lacks says so in its
    place (a store with some of the suites still builds), unless ``strict`` (the published site,
    built from every suite: there a missing run is a mistake in a reason, and it is refused)."""
    plan = plan or LedgerPlan()
    amendments = list(amendments)
    runs = list(runs)
    index, failed = index_runs(runs), index_failed_runs(runs)
    results = []
    for claim in claims:
        result = ClaimResult(claim, plan=plan, amendments=tuple(a for a in amendments if a.target == claim.id))
        if not claim.not_tested and claim.offline is not None and claim.comparisons:
            result.comparisons = evaluate_family(claim.comparisons, claim.offline.suite, index, plan, failed)
        result.ablations = [AblationResult(a, evaluate_family(a.comparisons, a.location.suite, index, plan, failed))
                            for a in claim.ablations]
        try:
            result.reason_text = render_reason(result, index, plan)
        except ReasonNeedsRuns as missing:  # a partial store: the verdicts stand, the reason waits for its runs
            if strict:
                raise ReasonError(f"{claim.file}: claim {claim.id}: reason: {missing}") from None
            result.reason_text = f"(The reason is written from runs this store lacks: {missing}.)"
        results.append(result)
    return results
