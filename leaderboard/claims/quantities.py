"""Quantities: a run -> one number, in the unit the papers print (mean client accuracy, spread,
worst 5 %, angle, rho, conflicts, server time, ...), read at a point of the run."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fl_lightning.records.vocabulary import Metric, agent_metric
from leaderboard.convergence import value_at
from leaderboard.registration import OVER_ROUNDS_LABELS
from leaderboard.runs import RunRecord
from leaderboard.tables import headline_value

# ---------------------------------------------------------------------------------------------
# Quantities: a run -> one number, in the unit the papers print
# ---------------------------------------------------------------------------------------------


def _headline(run: RunRecord, window: int, over: str = "all") -> float | None:
    value, derived = headline_value(run)
    if value is None:
        return None
    return value_at(run, Metric.GLOBAL_TEST_ACC if derived else Metric.TEST_ACC_MEAN, window)


def _times_1000(value: float | None) -> float | None:
    return None if value is None else 1000 * value


def _at(metric: str) -> Callable[[RunRecord, int, str], float | None]:
    """A quantity read at the point (the mean of the run's last ``window`` evaluations)."""
    return lambda run, window, over: value_at(run, metric, window)


OVER_ROUNDS_READINGS = tuple(OVER_ROUNDS_LABELS)
"""How a quantity that the paper averages over a run's rounds is read: ``all`` its mean over every
logged round (the papers' reduction), ``second_half`` its mean over the rounds in the second half of
the run, ``final`` its last logged value. The plan fixes the primary reading and the sensitivity ones."""


def over_rounds_value(run: RunRecord, metric: str, reading: str = "all") -> float | None:
    """A per-round series of the run reduced as ``reading`` says (``OVER_ROUNDS_READINGS``); NaN
    values skipped; None without a value."""
    history = [(step, value) for step, value in run.histories.get(metric, []) if value == value]
    if not history:
        return None
    if reading == "final":
        return history[-1][1]
    if reading == "second_half":
        half = history[-1][0] / 2
        history = [(step, value) for step, value in history if step >= half]
    elif reading != "all":
        raise ValueError(f"unknown reading over rounds {reading!r}: use one of {OVER_ROUNDS_READINGS}")
    return sum(value for _, value in history) / len(history)


def _over_rounds(metric: str) -> Callable[[RunRecord, int, str], float | None]:
    """A quantity that is a mean over the run's rounds, reduced as the plan's reading says."""
    return lambda run, window, over: over_rounds_value(run, metric, over)


@dataclass(frozen=True)
class Quantity:
    label: str
    unit: str  # of the displayed value and of paper numbers and margins in claims.yaml
    scale: float  # displayed value = scale * value
    value: Callable[[RunRecord, int, str], float | None]  # (run, window of the point, reading over rounds) -> value
    decimals: int = 2
    undefined: str = ""  # when a run's value is not a number, why (said where a seed is left out)
    over_rounds: bool = False  # a mean over the run's rounds (read by the plan's over-rounds readings)
    timing: bool = False  # a time: read from dedicated timing runs, whose convergence is not judged


QUANTITIES: dict[str, Quantity] = {
    "mean": Quantity("mean client accuracy", "%", 100, _headline),
    "global": Quantity("global accuracy", "%", 100, _at(Metric.GLOBAL_TEST_ACC)),
    "std": Quantity("std of client accuracies", "pp", 100, _at(Metric.TEST_ACC_STD)),
    "worst5": Quantity("worst 5 % of clients", "%", 100, _at(Metric.TEST_ACC_WORST5)),
    "worst10": Quantity("worst 10 % of clients", "%", 100, _at(Metric.TEST_ACC_WORST10)),
    "best5": Quantity("best 5 % of clients", "%", 100, _at(Metric.TEST_ACC_BEST5)),
    "worst_client": Quantity("worst client", "%", 100, _at(Metric.TEST_ACC_MIN)),
    "angle": Quantity("fairness angle", "rad", 1, _at(Metric.TEST_ACC_ANGLE), 3),
    "rho": Quantity("CGSV rho", "", 1, _at(Metric.CGSV_RHO),
                    undefined="every agent's standalone or final accuracy is the same: a correlation with a constant"),
    # CGSV runs with track_standalone: every agent's standalone model, trained in the same run on the
    # same minibatches, scored on the agents' test sets (CGSV Table 1's Standalone row)
    "standalone": Quantity("mean standalone accuracy of the agents", "%", 100, _at(Metric.STANDALONE_TEST_ACC_MEAN)),
    # CGSV App. B.3, Table 7: 100 x pearson(r_i,T, the agents' final test accuracies)
    "rho_r": Quantity("CGSV rho_r (reputation r against final accuracy)", "", 1, _at(Metric.CGSV_RHO_R),
                      undefined="every agent's final accuracy or reputation is the same: "
                                "a correlation with a constant"),
    "conflicts": Quantity(
        "conflicting clients per round (model level)", "clients", 1, _over_rounds(Metric.CONFLICTS_MODEL),
        over_rounds=True),
    Metric.CONFLICTS_LAYER: Quantity(
        "conflicting (client, layer) pairs per round (layer level)", "pairs", 1,
        _over_rounds(Metric.CONFLICTS_LAYER), over_rounds=True),
    "server_time": Quantity(
        "server time per round", "ms", 1,
        lambda run, window, over: _times_1000(over_rounds_value(run, Metric.SERVER_TIME_S, over)), 1,
        over_rounds=True, timing=True),
    "improved": Quantity("participants whose loss did not increase", "%", 100, _over_rounds(Metric.IMPROVED_FRACTION),
                         over_rounds=True),
    # CGSV Fig. 1 on the agents' uploads (CGSV shapley_check_every): means over the run's check rounds
    "shapley_l1_gap": Quantity(
        "l1 error from the exact CGSV: sampled minus psi", "", 1, _over_rounds(Metric.CGSV_SHAPLEY_L1_GAP), 4,
        over_rounds=True),
    "shapley_l2_gap": Quantity(
        "l2 error from the exact CGSV: sampled minus psi", "", 1, _over_rounds(Metric.CGSV_SHAPLEY_L2_GAP), 4,
        over_rounds=True),
    "shapley_time_ratio": Quantity(
        "time of the sampled approximation over psi's", "x", 1, _over_rounds(Metric.CGSV_SHAPLEY_TIME_RATIO), 2,
        over_rounds=True, timing=True),
    # per-agent series (CGSV Fig. 2 and Sec. 3.3): "agent_r:3" = agent 3's final reputation r
    "agent_r": Quantity("reputation r", "", 1, lambda run, window, over: None, 4),
    "agent_distance": Quantity("distance to the server model", "", 1, lambda run, window, over: None, 3),
    "agent_psi": Quantity("contribution psi, mean over rounds", "", 1, lambda run, window, over: None, 3,
                          over_rounds=True),
    "agent_sparsity": Quantity("download sparsity, mean over rounds", "%", 100, lambda run, window, over: None, 1,
                               over_rounds=True),
}


def _one_minus(reduce: Callable[[RunRecord, str, int, str], float | None],
               ) -> Callable[[RunRecord, str, int, str], float | None]:
    def value(run: RunRecord, name: str, window: int, over: str) -> float | None:
        reduced = reduce(run, name, window, over)
        return None if reduced is None else 1.0 - reduced
    return value


def _series_at(run: RunRecord, name: str, window: int, over: str) -> float | None:
    return value_at(run, name, window)


def _series_over_rounds(run: RunRecord, name: str, window: int, over: str) -> float | None:
    return over_rounds_value(run, name, over)


# per-agent quantity -> (the logged series ``<metric>/<agent>``, how a run's series becomes one number
# at a reading). CGSV Sec. 3.3 reports psi and the sparsity 1 - q_i/D averaged over the iterations.
AGENT_METRICS: dict[str, tuple[str, Callable[[RunRecord, str, int, str], float | None]]] = {
    "agent_r": (Metric.CGSV_R, _series_at),
    "agent_distance": (Metric.CGSV_DISTANCE, _series_at),
    "agent_psi": (Metric.CGSV_PSI, _series_over_rounds),
    "agent_sparsity": (Metric.CGSV_DENSITY, _one_minus(_series_over_rounds)),
}


def quantity_of(name: str) -> Quantity:
    base = name.split(":", 1)[0]
    if base not in QUANTITIES:
        raise KeyError(name)
    return QUANTITIES[base]


def quantity_value(run: RunRecord, name: str, window: int = 1, over: str = "all") -> float | None:
    """The run's value of a quantity at a reading, in the displayed unit: a quantity read at a point
    takes the mean of the run's last ``window`` evaluations (1 = the final evaluation); a mean over
    rounds is reduced as ``over`` says (``OVER_ROUNDS_READINGS``; ``all``: every round)."""
    base, _, agent = name.partition(":")
    quantity = QUANTITIES[base]
    if base in AGENT_METRICS:
        metric, reduce = AGENT_METRICS[base]
        value = reduce(run, agent_metric(metric, agent), window, over)
    else:
        value = quantity.value(run, window, over)
    return None if value is None or math.isnan(value) else quantity.scale * value
