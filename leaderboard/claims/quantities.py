"""Quantities: a run -> one number, in the unit the papers print (mean client accuracy, spread,
worst 5 %, angle, rho, conflicts, server time, ...), read at a point of the run."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from fl_lightning.run_schema import Metric
from leaderboard.convergence import value_at
from leaderboard.runs import RunRecord
from leaderboard.tables import headline_value

# ---------------------------------------------------------------------------------------------
# Quantities: a run -> one number, in the unit the papers print
# ---------------------------------------------------------------------------------------------


def _headline(run: RunRecord, window: int) -> float | None:
    value, derived = headline_value(run)
    if value is None:
        return None
    return value_at(run, Metric.GLOBAL_TEST_ACC if derived else Metric.TEST_ACC_MEAN, window)


def _times_1000(value: float | None) -> float | None:
    return None if value is None else 1000 * value


def _at(metric: str) -> Callable[[RunRecord, int], float | None]:
    """A quantity read at the point (the mean of the run's last ``window`` evaluations)."""
    return lambda run, window: value_at(run, metric, window)


def _over_rounds(metric: str) -> Callable[[RunRecord, int], float | None]:
    """A quantity that is a mean over the run's rounds: the same at every point."""
    return lambda run, window: run.mean_over_rounds(metric)


@dataclass(frozen=True)
class Quantity:
    label: str
    unit: str  # of the displayed value and of paper numbers and margins in claims.yaml
    scale: float  # displayed value = scale * value
    value: Callable[[RunRecord, int], float | None]  # (run, window of the point) -> value
    decimals: int = 2
    undefined: str = ""  # when a run's value is not a number, why (said where a seed is left out)


QUANTITIES: dict[str, Quantity] = {
    "mean": Quantity("mean client accuracy", "%", 100, _headline),
    "global": Quantity("global accuracy", "%", 100, _at(Metric.GLOBAL_TEST_ACC)),
    "std": Quantity("std of client accuracies", "pp", 100, _at(Metric.TEST_ACC_STD)),
    "worst5": Quantity("worst 5 % of clients", "%", 100, _at(Metric.TEST_ACC_WORST5)),
    "worst10": Quantity("worst 10 % of clients", "%", 100, _at(Metric.TEST_ACC_WORST10)),
    "best5": Quantity("best 5 % of clients", "%", 100, _at(Metric.TEST_ACC_BEST5)),
    "worst_client": Quantity("worst client", "%", 100, _at(Metric.TEST_ACC_MIN)),
    "angle": Quantity("fairness angle", "rad", 1, _at(Metric.TEST_ACC_ANGLE), 3),
    "rho": Quantity("CGSV rho", "", 1, lambda run, window: run.final(Metric.CGSV_RHO),
                    undefined="every agent's standalone or final accuracy is the same: a correlation with a constant"),
    "conflicts": Quantity(
        "conflicting clients per round (model level)", "clients", 1, _over_rounds(Metric.CONFLICTS_MODEL)
    ),
    Metric.CONFLICTS_LAYER: Quantity(
        "conflicting (client, layer) pairs per round (layer level)", "pairs", 1, _over_rounds(Metric.CONFLICTS_LAYER)
    ),
    "server_time": Quantity(
        "server time per round", "ms", 1, lambda run, window: _times_1000(run.mean_over_rounds("server_time_s")), 1
    ),
    "improved": Quantity("participants whose loss did not increase", "%", 100, _over_rounds(Metric.IMPROVED_FRACTION)),
    # CGSV Fig. 1 on the agents' uploads (CGSV shapley_check_every): means over the run's check rounds
    "shapley_l1_gap": Quantity(
        "l1 error from the exact CGSV: sampled minus psi", "", 1, _over_rounds("cgsv_shapley_l1_gap"), 4
    ),
    "shapley_l2_gap": Quantity(
        "l2 error from the exact CGSV: sampled minus psi", "", 1, _over_rounds("cgsv_shapley_l2_gap"), 4
    ),
    "shapley_time_ratio": Quantity(
        "time of the sampled approximation over psi's", "x", 1, _over_rounds("cgsv_shapley_time_ratio"), 2
    ),
    # per-agent series (CGSV Fig. 2 and Sec. 3.3): "agent_r:3" = agent 3's final reputation r
    "agent_r": Quantity("reputation r", "", 1, lambda run, window: None, 4),
    "agent_distance": Quantity("distance to the server model", "", 1, lambda run, window: None, 3),
    "agent_psi": Quantity("contribution psi, mean over rounds", "", 1, lambda run, window: None, 3),
    "agent_sparsity": Quantity("download sparsity, mean over rounds", "%", 100, lambda run, window: None, 1),
}


def _one_minus_mean(run: RunRecord, name: str) -> float | None:
    value = run.mean_over_rounds(name)
    return None if value is None else 1.0 - value


# per-agent quantity -> (the logged series ``<metric>/<agent>``, how a run's series becomes one number).
# CGSV Sec. 3.3 reports psi and the sparsity 1 - q_i/D averaged over the iterations.
AGENT_METRICS: dict[str, tuple[str, Callable[[RunRecord, str], float | None]]] = {
    "agent_r": ("cgsv_r", RunRecord.final),
    "agent_distance": ("cgsv_distance", RunRecord.final),
    "agent_psi": ("cgsv_psi", RunRecord.mean_over_rounds),
    "agent_sparsity": ("cgsv_density", _one_minus_mean),
}


def quantity_of(name: str) -> Quantity:
    base = name.split(":", 1)[0]
    if base not in QUANTITIES:
        raise KeyError(name)
    return QUANTITIES[base]


def quantity_value(run: RunRecord, name: str, window: int = 1) -> float | None:
    """The run's value of a quantity at a point (``window``: the mean of the last ``window``
    evaluations; 1 = the final evaluation), in the displayed unit."""
    base, _, agent = name.partition(":")
    quantity = QUANTITIES[base]
    if base in AGENT_METRICS:
        metric, reduce = AGENT_METRICS[base]
        value = reduce(run, f"{metric}/{agent}")
    else:
        value = quantity.value(run, window)
    return None if value is None or math.isnan(value) else quantity.scale * value
