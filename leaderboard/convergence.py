"""Whether a run converged: its value at a point (the mean of its last evaluations) and its
convergence status (converged, unconverged, too short to judge), as the pages and the claims
ledger read them."""

from __future__ import annotations

from fl_lightning.records.vocabulary import Metric
from leaderboard.runs import RunRecord

CONVERGENCE_WINDOW = 3  # evaluations per window of the convergence check (the ledger's plan may set another)
STILL_IMPROVING_PP = 1.0  # the last window's mean accuracy this far from the window before: unconverged
# A run's convergence status (``convergence_status``)
CONVERGED, UNCONVERGED, TOO_SHORT = "converged", "unconverged", "too short to judge"


def value_at(run: RunRecord, metric: str, window: int = 1) -> float | None:
    """The run's value of ``metric`` at a point: the mean of its last ``window`` logged values (1: the
    final evaluation); its final value when it has no history; NaN values skipped."""
    history = [value for _, value in run.histories.get(metric, []) if value == value]
    if not history:
        return run.final(metric)
    tail = history[-window:]
    return sum(tail) / len(tail)


def converged(run: RunRecord, metric: str) -> float | None:
    """The mean of the run's last CONVERGENCE_WINDOW logged values of ``metric`` (a sensitivity point
    of the claims ledger; its final value when it has no history)."""
    return value_at(run, metric, CONVERGENCE_WINDOW)


def accuracy_history(run: RunRecord) -> list[tuple[int, float]]:
    """(round, mean client accuracy) of each evaluation (the global accuracy where no mean was logged)."""
    for metric in (Metric.TEST_ACC_MEAN, Metric.GLOBAL_TEST_ACC):
        history = [(step, value) for step, value in run.histories.get(metric, []) if value == value]
        if history:
            return history
    return []


def convergence_change(run: RunRecord, window: int = CONVERGENCE_WINDOW) -> float | None:
    """The change in points of the mean accuracy from the ``window`` evaluations before the last
    ``window`` to the last ``window``; None when both windows do not fit in the second half of the
    run (the earlier one starting at or after half the last evaluated round): too short to judge."""
    history = accuracy_history(run)
    if len(history) < 2 * window:
        return None
    earlier, last = history[-2 * window:-window], history[-window:]
    if earlier[0][0] < last[-1][0] / 2:
        return None
    return 100 * (sum(v for _, v in last) - sum(v for _, v in earlier)) / window


def convergence_status(run: RunRecord, window: int = CONVERGENCE_WINDOW,
                       change_pp: float = STILL_IMPROVING_PP) -> str:
    """CONVERGED, UNCONVERGED or TOO_SHORT. Unconverged: the mean accuracy of the last ``window``
    evaluations differs from the ``window`` before by more than ``change_pp`` points, rising or
    falling. Both windows must lie in the second half of the run: else the run is too short to
    judge, never called converged (a window reaching back into the first rounds would flag a curve
    that is flat at its end)."""
    change = convergence_change(run, window)
    if change is None:
        return TOO_SHORT
    return UNCONVERGED if abs(change) > change_pp else CONVERGED


def still_improving(run: RunRecord) -> bool:
    """Whether the run is unconverged at its end (``convergence_status``: rising or falling)."""
    return convergence_status(run) == UNCONVERGED
