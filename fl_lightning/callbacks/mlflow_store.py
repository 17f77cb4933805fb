"""The MLflow stores a fit logs to: creating a store's tables and experiment, and finding runs in it.

A store is named by its tracking URI (``sqlite:///mlruns.db``, ``file:./mlruns``, ``http://...``).
Fits started together on a fresh store (``benchmarks`` ``--jobs``, several shells) race to create
its schema and experiment: :func:`open_mlflow_experiment` sets a SQLite store up under a file lock,
one process at a time, and tries a database store a few times. :func:`run_exists` and
:func:`same_store` only read, and create no store, so that a resume refused before the fit starts
leaves none behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from pathlib import Path
from typing import Any

import tenacity
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from fl_lightning.callbacks.mlflow_run import (
    absolute_tracking_uri,
    local_store_missing,
    seed_sqlite_store,
)
from fl_lightning.callbacks.mlflow_ui import EXPERIMENT_TAGS
from fl_lightning.faults import fault_line
from fl_lightning.run_schema import DEFAULT_TRACKING_URI
from fl_lightning.store_uri import sqlite_file

DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
# the stores a fit logs to when none is given: the CLI's default (run_schema.DEFAULT_TRACKING_URI) and
# MLFlowLogger's own; a resume finds its run in the store its checkpoint recorded instead
DEFAULT_STORES = (DEFAULT_TRACKING_URI, "file:./mlruns")


def _store_lock(tracking_uri: str) -> Any:
    """An inter-process lock for a SQLite store's file (a no-op for other stores); the lock
    file lives in the temporary folder, not beside the user's database."""
    database = sqlite_file(tracking_uri)
    if database is None:
        return contextlib.nullcontext()
    from filelock import FileLock  # a torch dependency

    database = database.resolve()
    digest = hashlib.sha1(str(database).encode()).hexdigest()[:16]
    return FileLock(Path(tempfile.gettempdir()) / f"fl-lightning-mlflow-{digest}.lock", timeout=300)


def open_mlflow_experiment(tracking_uri: str, name: str | None, artifact_location: str | None = None,
                           attempts: int = 10) -> None:
    """Create the store's tables and the experiment ``name`` if they do not exist yet.

    Fits started together on a fresh database store (``benchmarks`` ``--jobs``, several shells)
    would otherwise race: both create the schema and run its migrations ("table ... already
    exists", an alembic error, or a half-migrated store), or both create the experiment
    (RESOURCE_ALREADY_EXISTS), and one dies. A SQLite store is set up under a file lock, one
    process at a time; any other database is retried a few times (the loser of a race finds
    what the winner made). File and HTTP stores are opened once, as the logger would.

    A database store, SQLite included, is tried up to ``attempts`` times (tenacity; not after a
    fault of the machine, such as a full disk: ``faults.fault_line``), each retry
    after a random pause that grows with the number of tries, so that processes that collided
    spread out; the last failure is raised as a ``RuntimeError`` naming the store.
    """
    database = tracking_uri.split(":", 1)[0].split("+", 1)[0] in DATABASE_SCHEMES
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(attempts if database else 1),
        wait=tenacity.wait_random_exponential(multiplier=0.1, max=2.0),  # jittered back-off
        retry=tenacity.retry_if_exception(lambda error: fault_line(error) is None),  # a full disk is no race
        reraise=True,
    )
    try:
        for attempt in retrying:
            with attempt, _store_lock(tracking_uri):
                seed_sqlite_store(tracking_uri)  # a new SQLite store: its schema copied, not migrated
                client = MlflowClient(tracking_uri)
                if name is not None and client.get_experiment_by_name(name) is None:
                    client.create_experiment(name, artifact_location=artifact_location, tags=EXPERIMENT_TAGS)
    except Exception as error:
        raise RuntimeError(f"could not set up the MLflow store {tracking_uri}: {error}") from error


def run_exists(tracking_uri: str, run_id: str) -> bool:
    """Whether the store holds the run (a local store that does not exist is not created)."""
    if local_store_missing(tracking_uri):
        return False
    try:
        MlflowClient(tracking_uri).get_run(run_id)
    except MlflowException:
        return False
    return True


def same_store(a: str, b: str) -> bool:
    return absolute_tracking_uri(a) == absolute_tracking_uri(b)
