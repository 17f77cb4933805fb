"""The MLflow store as the runner sees it: which runs of a suite are finished (so a suite
resumes where it stopped), the unfinished run a cell continues from its checkpoint (never one
whose fit still runs), the run a failed or stopped cell is recorded as, and the final accuracy
the summary shows.

Several runners may share one store: a new store and the suite's experiment are made by one of
them at a time (:func:`ensure_experiment`, under the store's file lock, the schema copied into
place), and each cell is claimed before it runs (:func:`claims_folder`): a runner that finds a
cell claimed by a live runner leaves it to that runner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.suites import Cell
from fl_lightning.records.errors import first_line
from fl_lightning.records.vocabulary import Metric, Tag


def finished_runs(tracking_uri: str, suite: str) -> set[tuple[str, str, str]]:
    """(cell, seed, cell_config) of the FINISHED runs in the suite's experiment."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(suite)
    if experiment is None:
        return set()
    done, token = set(), None
    while True:
        page = client.search_runs([experiment.experiment_id], "attributes.status = 'FINISHED'",
                                  max_results=1000, page_token=token)
        for run in page:
            tags = run.data.tags
            if Tag.CELL in tags and Tag.CELL_CONFIG in tags:
                done.add((tags[Tag.CELL], tags.get(Tag.SEED, ""), tags[Tag.CELL_CONFIG]))
        token = page.token
        if not token:
            return done


def cell_finished(tracking_uri: str, suite: str, cell: str, seed: str, config_tag: str) -> bool:
    """Whether the suite's experiment holds a FINISHED run of (cell, seed, cell_config): the
    question ``finished_runs`` answers for every cell at once, asked of the runs with that config
    digest only (a hex tag, safe in a filter), so a runner can ask it before each cell it claims."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(suite)
    if experiment is None:
        return False
    runs = client.search_runs([experiment.experiment_id],
                              f"attributes.status = 'FINISHED' and tags.{Tag.CELL_CONFIG} = '{config_tag}'")
    return any(run.data.tags.get(Tag.CELL) == cell and run.data.tags.get(Tag.SEED, "") == seed for run in runs)


def finished_runs_or_exit(tracking_uri: str, suite: str) -> set[tuple[str, str, str]]:
    """``finished_runs``; a store MLflow cannot open (e.g. a schema it refuses to migrate) is
    reported in one line."""
    from mlflow.exceptions import MlflowException

    try:
        return finished_runs(tracking_uri, suite)
    except MlflowException as error:
        raise SystemExit(f"cannot open the store {tracking_uri}: {first_line(error.message)}") from None


def check_store(tracking_uri: str) -> None:
    """What would stop the runs from logging to the store, refused before any run starts (a folder
    that does not exist, a file that is not an MLflow store, a server that does not answer)."""
    from fl_lightning.cli.preflight import PreflightError, check_sqlite_store
    from fl_lightning.records.read_only_store import StoreError, check_writable
    from fl_lightning.records.store_uri import sqlite_file

    try:
        check_writable(tracking_uri)
        database = sqlite_file(tracking_uri)
        if database is not None and database.is_file():  # a store another process holds locked: waited for, saying so
            check_sqlite_store(tracking_uri, database, option="--tracking-uri")
    except (StoreError, PreflightError) as error:
        raise SystemExit(str(error)) from None


def finished_runs_read_only(
    tracking_uri: str, suite: str
) -> tuple[set[tuple[str, str, str]], dict[str, list[float]], str]:
    """A dry run's view of the store: (finished runs, their wall seconds per cell, a note), read without
    creating or altering it: a SQLite file that does not exist (or is empty) is not opened, an existing one is read
    through a read-only connection, a schema of another MLflow version is not migrated."""
    from fl_lightning.records.read_only_store import (
        EMPTY,
        MISSING,
        NO_EXPERIMENTS,
        StoreError,
        check_readable,
        reading,
    )

    check_store(tracking_uri)
    try:
        state = check_readable(tracking_uri)
    except StoreError as error:
        raise SystemExit(str(error)) from None
    if state in (MISSING, EMPTY, NO_EXPERIMENTS):
        what = "does not exist yet (a dry run does not create it)" if state == MISSING else "holds no runs yet"
        return set(), {}, f"the store {tracking_uri} {what}: every run is to run"
    from mlflow.exceptions import MlflowException

    from benchmarks.plan import run_durations

    try:
        with reading(tracking_uri) as read_uri:
            return finished_runs(read_uri, suite), run_durations(read_uri, suite), ""
    except MlflowException as error:
        raise SystemExit(f"cannot read the store {tracking_uri} without altering it ({first_line(error.message)}); "
                         "run without --dry-run, or pass another --tracking-uri") from None


def ensure_experiment(tracking_uri: str, suite: str) -> str:
    """The suite's experiment id, the store and the experiment made first where they do not exist:
    one process at a time (runners and fits started together on a new store wait for each other
    instead of both creating its tables); a store that cannot be set up is refused in one line."""
    from mlflow.tracking import MlflowClient

    from fl_lightning.callbacks.mlflow_store import open_mlflow_experiment

    try:
        open_mlflow_experiment(tracking_uri, suite)
    except RuntimeError as error:
        raise SystemExit(f"cannot set up the store {tracking_uri}: {first_line(error.__cause__ or error)}") from None
    experiment = MlflowClient(tracking_uri).get_experiment_by_name(suite)
    if experiment is None:  # another process deleted it meanwhile
        raise SystemExit(f"the experiment {suite!r} of the store {tracking_uri} vanished while it was set up; "
                         "run again")
    return str(experiment.experiment_id)


def claims_folder(tracking_uri: str, suite: str, log_dir: Path) -> Path:
    """Where the runners of a store claim its cells: beside a SQLite or file store (``file:`` or a
    plain path: every runner of that store sees it, from whatever folder it runs), else (a tracking
    server) in the suite's log folder of this working folder."""
    from fl_lightning.records.store_uri import file_store_folder, sqlite_file

    safe = suite.replace("/", "_")
    database = sqlite_file(tracking_uri)
    if database is not None:
        return Path(f"{Path(database).absolute()}.claims") / safe
    folder = file_store_folder(tracking_uri)
    if folder is not None:
        return folder.absolute() / ".claims" / safe
    return log_dir / "claims"


CHECKPOINT_ROOT = "checkpoints"  # the CLI's default_root_dir, relative to the runner's folder (its workers' too)


def latest_unfinished_run(tracking_uri: str, cell: Cell) -> Any:
    """The cell's (same cell, seed and config) latest run that did not finish, or None."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(cell.suite)
    if experiment is None:
        return None
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=(f"tags.{Tag.CELL} = '{cell.cell}' and tags.{Tag.SEED} = '{cell.seed}' "
                       f"and tags.{Tag.CELL_CONFIG} = '{cell.config_tag}'"),
        order_by=["attributes.start_time DESC"], max_results=1,
    )
    return runs[0] if runs and runs[0].info.status != "FINISHED" else None


def resumable_checkpoint(tracking_uri: str, cell: Cell) -> str | None:
    """The ``last.ckpt`` of the cell's latest unfinished run (a suite stopped by Ctrl-C, a killed
    worker), where the runner's fits write it: the rerun continues that run from there. A run
    still RUNNING whose fit is alive on this host (a fit started by hand, another runner's) is
    never resumed: the cell then starts a run of its own."""
    from fl_lightning.records.fit_lock import fit_is_alive

    run = latest_unfinished_run(tracking_uri, cell)
    if run is None:
        return None
    tags = run.data.tags
    if run.info.status == "RUNNING" and fit_is_alive(tags.get(Tag.FIT_HOST), tags.get(Tag.FIT_PID)):
        return None
    path = Path(CHECKPOINT_ROOT) / run.info.experiment_id / run.info.run_id / "checkpoints" / "last.ckpt"
    return str(path.resolve()) if path.is_file() else None


def record_failure(tracking_uri: str, cell: Cell, error: str, status: str = "FAILED") -> None:
    """A FAILED (or, for a suite stopped by Ctrl-C, KILLED) run for a cell whose process died
    before (or without) marking its own run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment_id = ensure_experiment(tracking_uri, cell.suite)
    run = latest_unfinished_run(tracking_uri, cell)
    name = f"{cell.algorithm_config} seed {cell.seed} | {cell.benchmark} | {status.lower()}"  # not MLflow's random one
    run_id = run.info.run_id if run else client.create_run(experiment_id, tags=cell.tags, run_name=name).info.run_id
    client.set_tag(run_id, Tag.ERROR, error[-5000:])
    client.set_terminated(run_id, status)


def final_metric(tracking_uri: str, suite: str) -> dict[tuple[str, str], float]:
    """(cell, seed) -> the run's mean client accuracy; for one model shared by every client tested
    on the shared set (``test_mode: global``), its global test accuracy, which every client has."""
    import math

    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    runs = mlflow.search_runs(experiment_names=[suite])
    accuracy = {}
    for _, run in runs.iterrows():
        for key in (f"metrics.{Metric.TEST_ACC_MEAN}", f"metrics.{Metric.GLOBAL_TEST_ACC}"):
            value = run.get(key)
            if value is not None and not math.isnan(value):
                accuracy[(run[f"tags.{Tag.CELL}"], run[f"tags.{Tag.SEED}"])] = float(value)
                break
    return accuracy
