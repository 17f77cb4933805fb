"""What a row ran with, shown beside its numbers: participation, the local optimiser, FedMGDA+'s
improvement share, CGSV's rho, the seeds."""

from __future__ import annotations

from fl_lightning.records import vocabulary as schema
from fl_lightning.records.vocabulary import Metric
from leaderboard.runs import RunRecord
from leaderboard.tables import (
    BEST_MARK,
    NO_FAIRNESS_NOTE,
    TIE_MARK,
    BenchmarkTable,
    Column,
    ConfigRow,
    Stat,
)
from leaderboard.view_cells import Header

# --- what a row ran with: participation, local optimiser, FedMGDA+'s improvement share -------------

IMPROVEMENT = Column(
    Metric.IMPROVED_FRACTION, "Loss not increased (%)",
    "Share of the round's participants whose training loss did not increase after the server step "
    "(FedMGDA+ Fig. 4, footnote 6; logged with track_improvement), mean over rounds, in % "
    "(a diagnostic: not judged)", None, 100, 1)
OPTIMISER_KEY = "optimiser"
CGSV_RHO_KEYS = (Metric.CGSV_RHO, Metric.CGSV_RHO_R)
CGSV_MATCHED_NOTE = (
    "CGSV ρ under client test matched: each agent is scored on the shared pool weighted by its own "
    "training label distribution, not on one shared test set as in the paper (Xu et al., NeurIPS 2021, "
    "Sec. 4). An agent that holds a single class then scores about 100 % standalone, which can flip "
    "the sign of ρ (e.g. on CLA); this ρ is not the paper's quantity.")


def _float(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if number != number else number


def participation_text(fraction: float) -> str:
    """``all clients each round`` / ``20% of the clients each round``."""
    return "all clients each round" if fraction >= 1 else f"{100 * fraction:g}% of the clients each round"


def task_fraction(table: BenchmarkTable | None) -> float | None:
    """The share of clients sampled per round in the table's task (None when not recorded)."""
    return None if table is None or table.task is None else _float(table.task.fields.get(schema.FRACTION))


def row_fraction(row: ConfigRow, table: BenchmarkTable | None = None) -> float | None:
    """The share of clients the row's runs sampled per round: their ``fraction`` param where all
    agree, else the task's."""
    runs = row.used_runs or row.runs
    logged = {_float(r.params.get(schema.FRACTION)) for r in runs} - {None}
    if len(logged) == 1:
        return logged.pop()
    return task_fraction(table)


def differs(fraction: float | None, reference: float | None) -> bool:
    return fraction is not None and reference is not None and abs(fraction - reference) > 1e-9


def marked_config(config: str, fraction: float | None, reference: float | None) -> str:
    """``AFL · all clients each round`` where the row's participation is not the reference's."""
    return f"{config} · {participation_text(fraction)}" if differs(fraction, reference) else config


OTHER_TASK = "Those values come from runs of that other task (never ranked with these rows)."
SAME_TABLE = ("Its runs sampled otherwise than this table's task records: its rank here is not a "
              "like-for-like comparison.")


def participation_note(marked: dict[str, float], reference: float, tail: str = OTHER_TASK) -> str:
    names = ", ".join(f"{config} ({participation_text(fraction)})" for config, fraction in marked.items())
    return f"Participation differs: {names}; the other rows sample {participation_text(reference)}. {tail}"


def optimiser_text(run: RunRecord) -> str:
    """``lr 0.05 × 0.999^t, momentum 0.9``: the run's local SGD from its MLflow params ("" without lr)."""
    lr = _float(run.params.get(schema.LR))
    if lr is None:
        return ""
    text = f"lr {lr:g}"
    decay = _float(run.params.get(schema.LR_DECAY))
    if decay not in (None, 0.0, 1.0):
        text += f" × {decay:g}^t"
    for name, label in (("momentum", "momentum"), ("weight_decay", "weight decay")):
        value = _float(run.params.get(name))
        if value:
            text += f", {label} {value:g}"
    return text


def row_optimiser(row: ConfigRow) -> tuple[str, float | None]:
    """(the row's local SGD in words, its lr for sorting); several texts when its runs differ."""
    runs = row.used_runs or row.runs
    texts = list(dict.fromkeys(t for t in (optimiser_text(r) for r in runs) if t))
    rates = [lr for r in runs if (lr := _float(r.params.get(schema.LR))) is not None]
    return "; ".join(texts), (min(rates) if rates else None)


def improvement_stat(row: ConfigRow) -> Stat | None:
    """Mean over seeds of each run's mean over rounds of ``improved_fraction`` (its history)."""
    return Stat.of([r.mean_over_rounds(IMPROVEMENT.key) for r in row.used_runs])


def cgsv_rho_shown(table: BenchmarkTable) -> bool:
    """A CGSV-family ρ is shown in the table (CGSV, DW, RR, EU log it)."""
    return any(row.stats.get(key) for row in table.rows for key in CGSV_RHO_KEYS)


def num_text(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def metric_header(column: Column, hidden: bool = False) -> Header:
    direction = {"max": "higher is better", "min": "lower is better"}.get(column.better or "", "")
    title = column.title + (f" ({direction}; {BEST_MARK} / {TIE_MARK}: see the rules)" if direction else "")
    if hidden:
        title += f" — {NO_FAIRNESS_NOTE} not shown: the clients share one test set"
    return Header(column.label, title, "num", "desc" if column.better == "max" else "asc", column.key)


def seeds_text(n: int) -> str:
    return f"n={n}"
