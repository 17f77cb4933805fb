"""Reading an export back (``python -m leaderboard build --from-export DIR ...``): the runs as the
leaderboard reads them, without the store; and the table that makes an export complete.

A complete export (``python -m leaderboard export --complete``) adds a third table, ``records``, with
what a build reads from the store beyond the ``runs`` and ``rounds`` tables, so that a build from it
reads the same runs as a build from the store itself. ``records.csv`` / ``records.parquet``: one row
per run: ``run_id``; ``tags`` (every MLflow tag of the run, canonical JSON); ``metrics`` (every
metric's latest value, canonical JSON, NaN and infinities written as JSON's ``NaN`` / ``Infinity``);
``client_metrics`` (the run's client-level artifact, ``clients/final_client_metrics.json``, as
canonical JSON; empty where the run has none).

An export is how a store's runs move between machines: a ledger run in parts, on machines that are
replaced between the parts, keeps each part's finished suites as complete exports and builds from all
of them at once (``build --from-export DIR DIR ...``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from fl_lightning.records.errors import first_line
from fl_lightning.records.vocabulary import Metric, Tag
from leaderboard.runs import (
    EXPORT_PREFIX,
    HISTORY_METRICS,
    LeaderboardError,
    Progress,
    RunRecord,
    StoreContents,
    is_agent_series,
)

RUNS, ROUNDS, RECORDS = "runs", "rounds", "records"
ROUND_COLUMNS = ("run_id", "round", "metric", "value")
RECORD_COLUMNS = ("run_id", "tags", "metrics", "client_metrics")


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def records_frame(runs: Sequence[RunRecord]) -> pd.DataFrame:
    """The ``records`` table of ``runs`` (see the module's docstring)."""
    rows = [(run.run_id, _json(run.tags), _json(run.metrics),
             "" if run.client_metrics is None else _json(run.client_metrics)) for run in runs]
    return pd.DataFrame(rows, columns=list(RECORD_COLUMNS), dtype=object)


def read_records(frame: pd.DataFrame) -> dict[str, tuple[dict[str, str], dict[str, float], dict | None]]:
    """run id -> (tags, metrics, client metrics) of a ``records`` table."""
    found: dict[str, tuple[dict[str, str], dict[str, float], dict | None]] = {}
    for run_id, tags, metrics, client_metrics in frame[list(RECORD_COLUMNS)].itertuples(index=False):
        text = "" if client_metrics is None or (isinstance(client_metrics, float)) else str(client_metrics)
        found[str(run_id)] = ({str(k): str(v) for k, v in json.loads(tags).items()},
                              {str(k): float(v) for k, v in json.loads(metrics).items()},
                              json.loads(text) if text else None)
    return found


def store_histories(histories: Mapping[str, list[tuple[int, float]]],
                    metrics: Mapping[str, float]) -> dict[str, list[tuple[int, float]]]:
    """The histories a build from the store reads (``leaderboard.runs``: the ``HISTORY_METRICS`` the
    run logged and the per-agent series), out of an export's rounds (which ``--all-metrics`` widens)."""
    return {name: values for name, values in histories.items()
            if (name in HISTORY_METRICS and name in metrics) or is_agent_series(name)}


# runs-table column -> the MLflow tag it was read from
EXPORT_TAGS = {
    "run_name": Tag.RUN_NAME, "suite": Tag.SUITE, "scale": Tag.SCALE, "paper": Tag.PAPER, "error": Tag.ERROR,
    "benchmark": Tag.BENCHMARK, "cell": Tag.CELL, "control": Tag.CONTROL, "client_test": Tag.CLIENT_TEST,
    "client_test_size": Tag.CLIENT_TEST_SIZE, "task_key": Tag.TASK_KEY, "algorithm": Tag.ALGORITHM,
    "algorithm_config": Tag.ALGORITHM_CONFIG, "seed": Tag.SEED, "data_seed": Tag.DATA_SEED,
    "git_sha": Tag.GIT_SHA, "machine": Tag.MACHINE, "replay_result": Tag.REPLAY_RESULT,
}
# per-run numbers that are not the last value of a history: kept as the run's final metrics
EXPORT_FINAL_METRICS = (
    Metric.GLOBAL_TEST_ACC,
    Metric.TEST_ACC_STD,
    Metric.TEST_ACC_WORST10,
    Metric.TEST_ACC_WORST5,
    Metric.TEST_ACC_VAR,
    Metric.TEST_ACC_JAIN,
    Metric.TEST_ACC_BEST5,
    Metric.CGSV_RHO,
    Metric.CGSV_RHO_R,
)


def _cell(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _has_table(folder: Path, name: str) -> bool:
    return (folder / f"{name}.parquet").exists() or (folder / f"{name}.csv").exists()


def _table(folder: Path, name: str) -> pd.DataFrame:
    parquet, text = folder / f"{name}.parquet", folder / f"{name}.csv"
    try:
        if parquet.exists():
            return pd.read_parquet(parquet)
        if text.exists():
            # round_trip: pandas < 3 parses floats with its own "high" precision parser, which can miss the
            # written value by an ulp (0.30000000000000004 read back as 0.3); a build must see the stored bits.
            return pd.read_csv(text, dtype={"seed": str, "data_seed": str}, keep_default_na=False,
                               na_values=[""], float_precision="round_trip")
    except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError: a corrupt export
        found = parquet if parquet.exists() else text
        raise LeaderboardError(f"{found} cannot be read ({first_line(error, type(error).__name__)}): "
                               "export the suite again") from None
    raise LeaderboardError(f"{folder} holds no {name}.parquet or {name}.csv: pass a folder written by "
                           "`python -m leaderboard export` (or a published site)")


def read_export(folders: Sequence[Path], experiments: Sequence[str] | None = None,
                progress: Progress = print) -> StoreContents:
    """The runs of one or more exports (``runs`` + ``rounds`` tables, as ``export`` writes them) as
    ``RunRecord``s: tags, params, histories and final values. A complete export (``--complete``: its
    ``records`` table) gives every tag, metric and the client-level artifact, as the store holds them;
    from another, the artifact (client accuracy distributions) and the tags the runs table has no
    column for are missing. A run id met twice keeps its first folder's copy."""
    records: dict[str, RunRecord] = {}
    for folder in folders:
        folder = Path(folder)
        if not folder.is_dir():
            raise LeaderboardError(f"--from-export {folder}: no such folder")
        runs, rounds = _table(folder, RUNS), _table(folder, ROUNDS)
        complete = read_records(_table(folder, RECORDS)) if _has_table(folder, RECORDS) else {}
        histories: dict[str, dict[str, list[tuple[int, float]]]] = {}
        for run_id, step, metric, value in rounds[list(ROUND_COLUMNS)].itertuples(index=False):
            histories.setdefault(str(run_id), {}).setdefault(str(metric), []).append((int(step), float(value)))
        for row in runs.to_dict("records"):
            run_id = str(row["run_id"])
            if run_id in records or (experiments and str(row["experiment"]) not in experiments):
                continue
            tags = {tag: text for column, tag in EXPORT_TAGS.items() if (text := _cell(row.get(column)))}
            tags[Tag.TASK] = _cell(row.get("task"))
            tags[Tag.PER_CLIENT_MODELS] = _cell(bool(row.get("per_client_models")))
            if _cell(row.get("rounds_planned")) and "num_rounds" in json.loads(row["params"] or "{}") and \
                    str(json.loads(row["params"])["num_rounds"]) != _cell(row.get("rounds_planned")):
                tags[Tag.EXTENDED_TO_ROUNDS] = _cell(row.get("rounds_planned"))
            series = {name: sorted(values) for name, values in histories.get(run_id, {}).items()}
            metrics = {name: values[-1][1] for name, values in series.items() if values}
            for name in EXPORT_FINAL_METRICS:
                if name not in series and _cell(row.get(name)):
                    metrics[name] = float(row[name])
            client_metrics = None
            if run_id in complete:  # as the store holds the run
                tags, metrics, client_metrics = complete[run_id]
                series = store_histories(series, metrics)
            start, end = row.get("start_time"), row.get("end_time")
            records[run_id] = RunRecord(
                run_id=run_id, experiment=str(row["experiment"]), status=str(row["status"]),
                start_time=None if not _cell(start) else pd.Timestamp(start).to_pydatetime(),
                end_time=None if not _cell(end) else pd.Timestamp(end).to_pydatetime(),
                tags=tags, params={k: str(v) for k, v in json.loads(row["params"] or "{}").items()},
                metrics=metrics, histories=series, client_metrics=client_metrics,
                known_code_version=_cell(row.get("code_version")),
            )
        progress(f"Read {len(runs)} runs from the export {folder}")
    runs_read = sorted(records.values(), key=lambda r: (r.start_time is None, r.start_time or 0))
    names = sorted({r.experiment for r in runs_read})
    return StoreContents(f"{EXPORT_PREFIX}{','.join(str(Path(f)) for f in folders)}", names, names, runs_read)
