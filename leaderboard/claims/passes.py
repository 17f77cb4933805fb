"""The ledger's two passes side by side. The exploratory pass reads the seeds that had been run and
seen when the plan was written (runs without a ``ledger_pass`` tag); the confirmatory pass reads the
plan's registered fresh seeds (runs tagged ``ledger_pass: confirmatory`` with the registration hash
they ran under). Each claim gets both verdicts, whether they agree and, where they do not, what
differs between them. Only a confirmatory verdict counts in the tally, and only when its runs carry
one registration and no amendment to the claim (or to the plan) came after the confirmatory runs
began; otherwise the claim reads exploratory and says why."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from leaderboard.claims.evaluation import evaluate
from leaderboard.claims.quantities import quantity_of
from leaderboard.claims.results import ClaimResult, ComparisonResult, judged, level_text
from leaderboard.claims.spec import Claim
from leaderboard.convergence import CONVERGED
from leaderboard.registration import CONFIRMATORY, LEDGER_PASS_TAG, PLAN_HASH_TAG, Amendment, LedgerPlan
from leaderboard.runs import RunRecord

EXPLORATORY = "exploratory"
NO_CONFIRMATORY_RUNS = "no confirmatory runs yet"
AMENDED_AFTER = "exploratory (amended after confirmatory runs began)"
SEVERAL_REGISTRATIONS = "exploratory (its confirmatory runs carry {count} registration hashes)"
CHANGED_FILES = "exploratory (the registered files changed after registration)"
UNEXPLAINED_HASH = ("exploratory (its confirmatory runs carry registration {runs}, the plan records {plan}, "
                    "and no amendment since the confirmatory runs began says why)")


def is_confirmatory(run: RunRecord) -> bool:
    """A run of the confirmatory pass: tagged with it (the runner also tags the registration hash)."""
    return run.tags.get(LEDGER_PASS_TAG) == CONFIRMATORY


@dataclass
class ClaimPasses:
    """One claim under both passes. ``status`` is "" when the confirmatory verdict counts, else why
    the claim reads exploratory (no confirmatory runs yet, amended after they began, ...)."""

    exploratory: ClaimResult
    confirmatory: ClaimResult | None
    status: str
    difference: str = ""  # where the two verdicts disagree: what differs between the passes

    @property
    def claim(self) -> Claim:
        return self.exploratory.claim

    @property
    def counted(self) -> bool:
        """Whether the tally counts this claim's confirmatory verdict."""
        return self.confirmatory is not None and not self.status

    @property
    def agree(self) -> bool | None:
        """Whether the passes give one verdict (None: no confirmatory verdict to compare)."""
        if self.confirmatory is None:
            return None
        return self.confirmatory.verdict == self.exploratory.verdict


def amended_after(amendments: Iterable[Amendment], began: str) -> list[Amendment]:
    """The amendments dated on or after ``began`` (the first confirmatory run's UTC date, YYYY-MM-DD):
    a change on the day the runs began counts as after them (an amendment's date has no hour)."""
    return [a for a in amendments if began and a.date >= began]


def first_start(runs: Iterable[RunRecord]) -> str:
    """The UTC date (YYYY-MM-DD) the earliest of ``runs`` started, "" when none records a start."""
    starts = [run.start_time for run in runs if run.start_time is not None]
    return min(starts).date().isoformat() if starts else ""


def _status(claim: Claim, hashes: set[str], plan: LedgerPlan, late: list[Amendment], changed: bool) -> str:
    """Why a claim with confirmatory runs still reads exploratory ("": its confirmatory verdict counts)."""
    if changed:
        return CHANGED_FILES
    if len(hashes) > 1:
        return SEVERAL_REGISTRATIONS.format(count=len(hashes))
    if any(a.on_plan or a.target == claim.id for a in late):
        return AMENDED_AFTER
    (run_hash,) = hashes
    if run_hash != plan.registered_hash and not late:
        return UNEXPLAINED_HASH.format(runs=run_hash[:12] or "(none)", plan=plan.registered_hash[:12] or "(none)")
    return ""


def _suites(claim: Claim) -> set[str]:
    return {claim.offline.suite} if claim.offline is not None else set()


def evaluate_passes(claims: Iterable[Claim], runs: Iterable[RunRecord], plan: LedgerPlan,
                    amendments: Iterable[Amendment] = (), fresh_seeds: tuple[int, ...] = (),
                    registration_changed: bool = False, strict: bool = False) -> list[ClaimPasses]:
    """Every claim under both passes: the exploratory verdict on the plan's seeds of the runs
    without the pass's tag, the confirmatory verdict on ``fresh_seeds`` of the pass's runs.
    ``registration_changed``: the registered files differ from the hash the plan records today
    (no confirmatory verdict counts until that is registered as an amendment)."""
    claims, runs, amendments = list(claims), list(runs), list(amendments)
    confirmatory_runs = [run for run in runs if is_confirmatory(run)]
    exploratory_runs = [run for run in runs if not is_confirmatory(run)]
    exploratory = evaluate(claims, exploratory_runs, plan, amendments, strict=strict)
    if not confirmatory_runs:
        return [ClaimPasses(result, None, NO_CONFIRMATORY_RUNS) for result in exploratory]
    confirmatory = evaluate(claims, confirmatory_runs, plan.for_confirmatory(fresh_seeds), amendments)
    late = amended_after(amendments, first_start(confirmatory_runs))
    by_id = {run.run_id: run for run in runs}
    passes = []
    for seen, fresh in zip(exploratory, confirmatory):
        claim = seen.claim
        hashes = {run.tags.get(PLAN_HASH_TAG, "") for run in confirmatory_runs if run.suite in _suites(claim)}
        if claim.offline is not None and not hashes:
            passes.append(ClaimPasses(seen, None, NO_CONFIRMATORY_RUNS))
            continue
        status = _status(claim, hashes or {plan.registered_hash}, plan, late, registration_changed)
        entry = ClaimPasses(seen, fresh, status)
        if entry.agree is False:
            entry.difference = difference_text(seen, fresh, by_id)
        passes.append(entry)
    return passes


def _rounds(entries: Iterable[ComparisonResult], by_id: dict[str, RunRecord]) -> list[int]:
    """The run lengths (``num_rounds``) of the runs a family read, each length once, sorted."""
    lengths = {int(float(by_id[run_id].params["num_rounds"])) for entry in entries
               for arm in entry.convergence_arms.values() for run_id in arm
               if run_id in by_id and by_id[run_id].params.get("num_rounds")}
    return sorted(lengths)


def _converged(entries: Iterable[ComparisonResult]) -> tuple[int, int]:
    """(converged runs, runs judged) over a family's arms, each run once."""
    statuses = {run_id: status for entry in entries for arm in entry.convergence_arms.values()
                for run_id, status in arm.items()}
    return sum(status == CONVERGED for status in statuses.values()), len(statuses)


def _effect(entry: ComparisonResult) -> str:
    result = entry.result
    if entry.withdrawn:
        return "withdrawn"
    if result is None:
        return "no paired runs"
    quantity = quantity_of(entry.comparison.treatment.quantity)
    unit = " pp" if quantity.unit == "%" else f" {quantity.unit}" if quantity.unit else ""
    places = quantity.decimals
    text = f"{result.mean:+.{places}f}{unit}"
    if result.low is not None and result.high is not None and not entry.holm_not_reached:
        text += f" [{result.low:+.{places}f}, {result.high:+.{places}f}] ({level_text(result.level)} CI)"
    return f"{text}, {entry.verdict}"


def difference_text(seen: ClaimResult, fresh: ClaimResult, by_id: dict[str, RunRecord]) -> str:
    """What differs between a claim's exploratory and confirmatory verdicts, from the runs: the run
    lengths, each comparison's paired difference and verdict, the converged share and the seeds."""
    parts = [f"exploratory {seen.verdict} on {seen.seeds} seeds, confirmatory {fresh.verdict} on {fresh.seeds}"]
    before, after = _rounds(seen.comparisons, by_id), _rounds(fresh.comparisons, by_id)
    if before != after:
        parts.append("run length " + "/".join(map(str, before)) + " → " + "/".join(map(str, after)) + " rounds")
    for old, new in zip(judged(seen.comparisons), judged(fresh.comparisons)):
        if old.verdict != new.verdict:
            parts.append(f"{old.comparison.label}: {_effect(old)} → {_effect(new)}")
    (c_old, n_old), (c_new, n_new) = _converged(seen.comparisons), _converged(fresh.comparisons)
    if n_old and n_new and c_old * n_new != c_new * n_old:
        parts.append(f"converged runs {c_old}/{n_old} → {c_new}/{n_new}")
    return "; ".join(parts)


def tally(passes: Iterable[ClaimPasses]) -> tuple[Counter[str], Counter[str]]:
    """(confirmatory verdicts counted, claims not counted by why): active claims only."""
    counted: Counter[str] = Counter()
    waiting: Counter[str] = Counter()
    for entry in passes:
        if entry.claim.retired is not None:
            continue
        if entry.counted and entry.confirmatory is not None:
            counted[entry.confirmatory.verdict] += 1
        else:
            waiting[entry.status] += 1
    return counted, waiting
