"""A run set as tidy tables: ``python -m leaderboard export --tracking-uri URI --out DIR``.

The store is read by the leaderboard's own loading code (``leaderboard.runs.load_runs``: it only
reads; a missing or empty SQLite file is refused, never created or migrated) and every per-run
number is computed by the leaderboard's own functions, so the exported table is what the pages
show. Two tables, each written as CSV and/or Parquet (``--format``):

``runs.csv`` / ``runs.parquet``: one row per run, in the order the store returns them (oldest first).

- identity: ``run_id``, ``run_name``, ``experiment`` (the MLflow experiment), ``suite``, ``scale``,
  ``paper``, ``status`` (FINISHED, FAILED, KILLED, RUNNING), ``error`` (why a run failed, else empty),
  ``start_time``, ``end_time`` (UTC);
- the benchmark: ``benchmark``, ``cell``, ``control`` (a variant's control benchmark), ``client_test``
  (local / matched / global), ``client_test_size``, ``per_client_models``;
- the task (what the run was asked to solve; ``leaderboard.tasks``): ``task_key`` (runs with one key
  are comparable), ``task_recorded_in`` (``tag``; ``params`` for runs logged before the task tag;
  ``unrecorded``), ``task`` (its fields as canonical JSON) and one ``task_<field>`` column per field
  (``task_source``, ``task_partition``, ``task_partition_params`` (JSON), ``task_num_clients``,
  ``task_num_rounds``, ...; a field whose values mix numbers and text across runs is text);
- the configuration: ``algorithm`` (the class), ``algorithm_config`` (the leaderboard's row label),
  ``seed`` and ``data_seed`` (integers where every run's is), ``git_sha``, ``code_version`` (the
  library's source tree at that commit, as the pages group versions), ``machine``, ``params``
  (every MLflow param of the run: canonical JSON);
- ``rounds_completed``, ``rounds_planned``;
- where the leaderboard puts it: ``leaderboard_table`` (the page ``benchmarks/<leaderboard_table>.html``
  of a build of the same experiments), ``in_means`` (whether the run enters its table's means: the
  newest FINISHED run of its configuration and seed), ``superseded_by`` (the run used instead);
- the per-run number behind each leaderboard column, named by the column's key, in the units
  logged (accuracies as fractions; ``leaderboard.tables.run_value``): ``test_acc_mean`` (the
  headline; ``global_test_acc`` where ``headline_derived``), ``global_test_acc``, ``test_acc_std``,
  ``test_acc_worst10``, ``test_acc_worst5``, ``test_acc_var``, ``test_acc_angle``, ``test_acc_jain``,
  ``test_acc_best5``, ``cgsv_rho``, ``cgsv_rho_r``, ``conflicts_model`` (mean over rounds),
  ``time_per_round`` (seconds, mean over rounds); empty where the run did not log it;
- the value at the convergence point the claims ledger uses (the mean of the last 3 evaluations;
  ``leaderboard.convergence.converged``): ``converged_test_acc_mean`` (the headline, as the claims'
  ``mean``), ``converged_global_test_acc``, ``converged_test_acc_std``, ``converged_test_acc_worst5``,
  ``converged_test_acc_worst10``, ``converged_test_acc_best5``, ``converged_test_acc_min``,
  ``converged_test_acc_angle`` (a sensitivity point of the ledger, whose primary point is the final
  evaluation: the per-run columns above); ``convergence`` (converged, unconverged: the accuracy moved
  by more than 1 pp between the last two windows of 3 evaluations, rising or falling; or too short to
  judge: both windows do not fit in the run's second half) and ``still_improving`` (= unconverged).

``rounds.csv`` / ``rounds.parquet``: one row per (run, round, metric): ``run_id``, ``round`` (the
MLflow step: rounds completed), ``metric``, ``value`` (NaN where the run logged NaN). The metrics
are the histories the leaderboard reads (``leaderboard.runs.HISTORY_METRICS`` and CGSV's per-agent
series ``cgsv_r/<agent>``, ...); ``--all-metrics`` adds every other metric the runs logged (one
request per run and metric: slower). Where a metric was logged twice at one step (a resumed run),
the value logged last counts, as on the pages.

``--complete`` adds ``records.csv`` / ``records.parquet`` (every tag and metric of each run and its
client-level artifact: ``leaderboard.export_reading``), so that ``build --from-export`` of the folder
reads the runs as the store holds them.

Filters: ``--experiments NAME ...`` (as ``build``) and ``--tag KEY=VALUE`` (repeatable: runs whose
MLflow tag KEY equals VALUE; several values of one key: any of them; several keys: all of them).
The leaderboard tables (``leaderboard_table``, ``in_means``) are those of the experiments read, as a
build of those experiments shows them; a tag filter only selects the rows written.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pandas as pd
from mlflow import MlflowClient
from tqdm import tqdm

from fl_lightning.records import vocabulary as schema
from fl_lightning.records.store_uri import without_credentials
from fl_lightning.records.vocabulary import Metric, Tag
from leaderboard import claims as ledger
from leaderboard.convergence import (
    CONVERGENCE_WINDOW,
    converged,
    convergence_status,
    still_improving,
)
from leaderboard.export_reading import RECORDS, ROUNDS, RUNS, records_frame
from leaderboard.runs import (
    LeaderboardError,
    Progress,
    RunRecord,
    load_runs,
    metric_history,
    reading,
)
from leaderboard.table_building import build_tables
from leaderboard.tables import (
    COLUMNS,
    HEADLINE,
    BenchmarkTable,
    headline_value,
    run_value,
)
from leaderboard.tag_filters import check_tags_match, matches, parse_tags, precheck_tags
from leaderboard.tasks import TASK_LABELS, canonical_json

FORMATS = ("csv", "parquet")
# Metrics the claims ledger reads at a run's convergence point (``converged_<metric>``).
CONVERGED_METRICS = (
    Metric.TEST_ACC_MEAN,
    Metric.GLOBAL_TEST_ACC,
    Metric.TEST_ACC_STD,
    Metric.TEST_ACC_WORST5,
    Metric.TEST_ACC_WORST10,
    Metric.TEST_ACC_BEST5,
    Metric.TEST_ACC_MIN,
    Metric.TEST_ACC_ANGLE,
)
TASK_RECORDED_IN = "task_recorded_in"
PARQUET_COMPRESSION = "zstd"


# ---------------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------------


NO_SEED = (None, "", "?")


def _integers_where_possible(values: Iterable[object]) -> pd.api.extensions.ExtensionArray | pd.Series:
    """Nullable integers where every present value is an integer (``"3"`` or ``3``); else the values as given."""
    values = list(values)
    present = [v for v in values if v not in NO_SEED]
    if all((isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, str) and re.fullmatch(r"-?\d+", v))
           for v in present):
        return pd.array([None if v in NO_SEED else int(str(v)) for v in values], dtype="Int64")
    return pd.Series(values, dtype=object)


def _uniform(values: list[object]) -> list[object]:
    """One type per column (Parquet needs it): nested values as canonical JSON; a column whose
    values mix numbers, booleans and text holds text (numbers and booleans as JSON: ``0.1``, ``true``)."""
    values = [json.dumps(v, sort_keys=True, separators=(",", ":"), default=str) if isinstance(v, (dict, list)) else v
              for v in values]
    kinds = {"bool" if isinstance(v, bool) else "number" if isinstance(v, (int, float)) else "text"
             for v in values if v is not None}
    if len(kinds) <= 1:
        return values
    return [None if v is None else v if isinstance(v, str) else json.dumps(v) for v in values]


def _task_field_names(runs: Iterable[RunRecord]) -> list[str]:
    present = {name for run in runs for name in run.task.fields}
    return [name for name in TASK_LABELS if name in present] + sorted(present - set(TASK_LABELS))


def table_places(tables: Iterable[BenchmarkTable]) -> dict[str, tuple[str, bool, str]]:
    """run id -> (the slug of its table, whether it enters the means, the run that superseded it)."""
    places = {}
    for table in tables:
        for run in table.runs:
            newer = table.superseded_by(run)
            places[run.run_id] = (table.slug, table.in_means(run), newer.run_id if newer else "")
    return places


def run_row(run: RunRecord, place: tuple[str, bool, str] | None) -> dict[str, object]:
    """One run's row (without the per-field task columns)."""
    task = run.task
    slug, in_means, superseded_by = place or ("", False, "")
    row: dict[str, object] = {
        "run_id": run.run_id,
        "run_name": run.tags.get(Tag.RUN_NAME, ""),
        "experiment": run.experiment,
        "suite": run.suite,
        "scale": run.scale,
        "paper": run.tags.get(Tag.PAPER, ""),
        "status": run.status,
        "error": run.error,
        "start_time": run.start_time,
        "end_time": run.end_time,
        "benchmark": run.benchmark,
        "cell": run.cell,
        "control": run.control,
        "client_test": run.client_test,
        "client_test_size": run.client_test_size,
        "per_client_models": run.per_client_models,
        "task_key": task.key,
        TASK_RECORDED_IN: task.source,
        "task": canonical_json(task.fields),
        "algorithm": run.tags.get(Tag.ALGORITHM, ""),
        "algorithm_config": run.config,
        "seed": run.seed,
        "data_seed": run.tags.get(Tag.DATA_SEED) or run.params.get(schema.DATA_SEED),
        "git_sha": run.git_sha,
        "code_version": run.code_version,
        "machine": run.tags.get(Tag.MACHINE, ""),
        "replay_result": run.tags.get(Tag.REPLAY_RESULT, ""),
        "params": canonical_json(run.params),
        "rounds_completed": run.rounds_completed(),
        "rounds_planned": run.tags.get(Tag.EXTENDED_TO_ROUNDS) or run.params.get(schema.NUM_ROUNDS),
        "leaderboard_table": slug,
        "in_means": in_means,
        "superseded_by": superseded_by,
        "headline_derived": headline_value(run)[1],
    }
    for column in COLUMNS:
        row[column.key] = run_value(run, column.key)
    for metric in CONVERGED_METRICS:
        row[f"converged_{metric}"] = (ledger.QUANTITIES["mean"].value(run, CONVERGENCE_WINDOW) if metric == HEADLINE
                                      else converged(run, metric))
    row["still_improving"] = still_improving(run)
    row["convergence"] = convergence_status(run)
    return row


def runs_frame(runs: Sequence[RunRecord], tables: Iterable[BenchmarkTable] = ()) -> pd.DataFrame:
    """The per-run table (see the module's docstring) of ``runs``; ``tables``: the leaderboard's
    tables of the runs read (``build_tables``), for the columns that say where a run is shown."""
    places = table_places(tables)
    rows = [run_row(run, places.get(run.run_id)) for run in runs]
    fields = _task_field_names(runs)
    task_columns = {f"task_{name}": _uniform([run.task.fields.get(name) for run in runs]) for name in fields}
    frame = pd.DataFrame(rows, columns=list(run_row_columns()))
    for name in ("seed", "data_seed", "rounds_completed", "rounds_planned"):
        frame[name] = _integers_where_possible(row[name] for row in rows)
    for name in ("start_time", "end_time"):
        frame[name] = pd.to_datetime(frame[name], utc=True)
    float_columns = [c.key for c in COLUMNS] + [f"converged_{m}" for m in CONVERGED_METRICS]
    frame[float_columns] = frame[float_columns].astype("float64")
    at = frame.columns.get_loc("task") + 1
    for offset, (name, values) in enumerate(task_columns.items()):
        frame.insert(at + offset, name, pd.Series(values, dtype=object))
    return frame


def run_row_columns() -> list[str]:
    """The runs table's fixed columns, in order (the ``task_<field>`` columns follow ``task``)."""
    from datetime import datetime

    probe = RunRecord("", "", "", datetime.now(), None, {}, {}, {})
    return list(run_row(probe, None))


def rounds_frame(runs: Sequence[RunRecord], extra: Mapping[str, Mapping[str, list[tuple[int, float]]]] = {},
                 ) -> pd.DataFrame:
    """One row per (run, round, metric): the histories the leaderboard read, plus ``extra`` (run id ->
    metric -> (step, value) history, as ``leaderboard.runs.metric_history`` reads it)."""
    run_ids: list[str] = []
    steps: list[int] = []
    names: list[str] = []
    values: list[float] = []
    for run in runs:
        histories = {**run.histories, **extra.get(run.run_id, {})}
        for name in sorted(histories):
            for step, value in histories[name]:
                run_ids.append(run.run_id)
                steps.append(step)
                names.append(name)
                values.append(value)
    return pd.DataFrame({"run_id": pd.Series(run_ids, dtype=object), "round": pd.Series(steps, dtype="int64"),
                         "metric": pd.Series(names, dtype=object), "value": pd.Series(values, dtype="float64")})


def other_histories(tracking_uri: str, runs: Sequence[RunRecord],
                    progress: Progress) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """The histories of every metric the leaderboard did not read (``--all-metrics``)."""
    wanted = {run.run_id: sorted(set(run.metrics) - set(run.histories)) for run in runs}
    total = sum(map(len, wanted.values()))
    progress(f"Reading {total} more metric histories of {len(runs)} runs (--all-metrics)")
    found: dict[str, dict[str, list[tuple[int, float]]]] = {}
    with reading(tracking_uri) as read_uri:
        client = MlflowClient(tracking_uri=read_uri)
        with tqdm(total=total, unit="metric", desc="metric histories", file=sys.stderr, disable=None) as bar:
            for run in runs:
                found[run.run_id] = {name: metric_history(client, run.run_id, name) for name in wanted[run.run_id]}
                bar.update(len(wanted[run.run_id]))
    return found


# ---------------------------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------------------------


def write_frame(frame: pd.DataFrame, path: Path) -> Path:
    """``frame`` to ``path`` (CSV or Parquet by its suffix), through a temporary file in the same
    folder: a reader never sees half a file (made with the umask's permissions, as ``path`` would be)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        if path.suffix == ".csv":
            frame.to_csv(temporary, index=False)
        else:
            frame.to_parquet(temporary, index=False, compression=PARQUET_COMPRESSION)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


def check_out(out: Path) -> None:
    """``out`` is (or can become) a folder this user can write: checked before the store is read."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise LeaderboardError(f"--out {out} is a file, not a folder; pass a folder to write the tables into")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise LeaderboardError(f"cannot write into {existing.resolve()}: choose a folder you can write with --out")


def write_tables(frames: Mapping[str, pd.DataFrame], out: Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        return [write_frame(frame, out / f"{name}.{fmt}") for name, frame in frames.items() for fmt in formats]
    except OSError as error:
        raise LeaderboardError(f"cannot write the tables to {out.resolve()} ({error.strerror or error}); "
                               "choose a folder you can write with --out") from None


def check_formats(formats: Sequence[str]) -> list[str]:
    unknown = [f for f in formats if f not in FORMATS]
    if unknown or not formats:
        raise LeaderboardError(f"--format {' '.join(unknown) or '(none)'}: choose from {' '.join(FORMATS)}")
    return list(dict.fromkeys(formats))


def export(
    tracking_uri: str,
    out: Path,
    experiments: Sequence[str] | None = None,
    tags: Iterable[str] | None = None,
    formats: Sequence[str] = FORMATS,
    all_metrics: bool = False,
    progress: Progress = print,
    overwrite: bool = False,
    complete: bool = False,
) -> list[Path]:
    """Read the store, write ``runs.<fmt>`` and ``rounds.<fmt>`` into ``out`` (and ``records.<fmt>``
    with ``complete``: ``leaderboard.export_records``); returns the files.
    Bad input (a missing store, an unknown experiment, a malformed or unmatched --tag, an ``out``
    that is a file, a table already there without ``overwrite``) raises ``LeaderboardError``
    before anything is written."""
    formats = check_formats(formats)
    wanted = parse_tags(tags)
    check_out(out)
    there = [Path(out) / f"{name}.{fmt}" for name in (RUNS, ROUNDS, RECORDS) for fmt in formats
             if (Path(out) / f"{name}.{fmt}").exists()]
    if there and not overwrite:
        raise LeaderboardError(f"{', '.join(map(str, there))} already exist{'s' * (len(there) == 1)}: pass --overwrite "
                               "to replace them, or choose another --out")
    precheck_tags(tracking_uri, experiments, wanted)
    store = load_runs(tracking_uri, experiments, progress)
    check_tags_match([run.tags for run in store.runs], wanted)  # the store may have changed since the check
    tables = build_tables(store.runs)
    runs = [run for run in store.runs if matches(run.tags, wanted)]
    extra = other_histories(tracking_uri, runs, progress) if all_metrics else {}
    frames = {RUNS: runs_frame(runs, tables), ROUNDS: rounds_frame(runs, extra)}
    if complete:
        frames[RECORDS] = records_frame(runs)
    written = write_tables(frames, out, formats)
    progress(f"Exported {len(frames[RUNS])} runs and {len(frames[ROUNDS])} (run, round, metric) rows "
             f"from {without_credentials(tracking_uri)}:")
    for path in written:
        progress(f"  {path} ({path.stat().st_size / 1e6:.2f} MB)")
    return written


class ProgressLines:
    """The load's progress on stderr: lines, and its counts of runs read as a tqdm bar on a
    terminal (as lines elsewhere). A ``runs.CountingProgress``: counts arrive typed, not as text."""

    def __init__(self, stream=None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.bar: tqdm | None = None

    def __call__(self, message: str) -> None:
        self.close()
        print(message, file=self.stream, flush=True)

    def counted(self, what: str, done: int, total: int) -> None:
        if not self.stream.isatty():
            self(f"  {what}: {done}/{total} runs")
            return
        if self.bar is None:
            self.bar = tqdm(total=total, unit="run", desc=what, file=self.stream)
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


SITE_FILES = (("runs.csv", "one row per run: task, configuration, seed, the leaderboard's per-run numbers"),
              ("rounds.parquet", "one row per (run, round, metric): the curves"))
# a longer rounds table is left out of the site (export it instead): decided on its rows, not its
# compressed size, so that every library release builds the same site (about 12 MB at 3.3 bytes a row)
SITE_ROUNDS_LIMIT_ROWS = 3_600_000


def write_site_files(runs: Sequence[RunRecord], tables: Iterable[BenchmarkTable], folder: Path,
                     progress: Progress = print) -> list[tuple[str, str]]:
    """The export beside a built site's ``index.html``: ``runs.csv`` and, while it stays small,
    ``rounds.parquet``; returns (file name, what it holds) of the files written, for the links."""
    written = [SITE_FILES[0]]
    write_frame(runs_frame(runs, tables), folder / SITE_FILES[0][0])
    rounds = rounds_frame(runs)
    if len(rounds) > SITE_ROUNDS_LIMIT_ROWS:
        progress(f"  rounds.parquet left out of the site ({len(rounds):,} rows > {SITE_ROUNDS_LIMIT_ROWS:,}): "
                 "`python -m leaderboard export` writes it")
    else:
        write_frame(rounds, folder / SITE_FILES[1][0])
        written.append(SITE_FILES[1])
    return written
