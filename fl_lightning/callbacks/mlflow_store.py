"""The MLflow stores a fit logs to: creating a store (from an empty-store template), its tables and
experiment, and finding runs in it.

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
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import tenacity
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from fl_lightning import private_api
from fl_lightning.cache import cache_dir
from fl_lightning.callbacks.mlflow_ui import EXPERIMENT_TAGS
from fl_lightning.faults import fault_line
from fl_lightning.records.fit_lock import process_alive
from fl_lightning.records.store_probe import schema_revision
from fl_lightning.records.store_uri import absolute_tracking_uri, local_store_missing, sqlite_file, sqlite_uri
from fl_lightning.records.vocabulary import DEFAULT_TRACKING_URI

DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
# the stores a fit logs to when none is given: the CLI's default (vocabulary.DEFAULT_TRACKING_URI) and
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


def _schema_revision(database: Path) -> str | None:
    """The MLflow schema revision an SQLite store file is at (None if it is not a sound store)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as connection:
            if connection.execute("PRAGMA quick_check").fetchone() != ("ok",):
                return None
            return schema_revision(connection)
    except sqlite3.Error:
        return None


def empty_store_template() -> Path | None:
    """An empty MLflow SQLite store at the installed MLflow's schema, made once per MLflow
    version in the user cache (``fl_lightning.cache.cache_dir``): MLflow builds a new
    store by running every schema migration since its first release, seconds of alembic work.

    The template is made by MLflow's own ``_initialize_tables`` (the step its ``SqlAlchemyStore``
    runs on an empty database), and holds only the schema: the store's default experiment is
    created, as always, by the MLflow client that opens the copy. None where it cannot be made
    (a private MLflow helper gone, a read-only cache): MLflow then builds the store itself."""
    import mlflow

    folder = cache_dir()
    for template in sorted(folder.glob(f"mlflow-store-{mlflow.__version__}-*.db")):
        if _schema_revision(template) == template.stem.rsplit("-", 1)[1]:
            return template
    try:
        from mlflow.store.db.utils import create_sqlalchemy_engine

        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as scratch:
            database = Path(scratch) / "store.db"
            engine = create_sqlalchemy_engine(sqlite_uri(database))
            try:
                private_api.initialize_mlflow_tables(engine)
            finally:
                engine.dispose()
            revision = _schema_revision(database)
            if revision is None:
                return None
            template = folder / f"mlflow-store-{mlflow.__version__}-{revision}.db"
            os.replace(database, template)
        return template
    except Exception:  # MLflow builds the store itself, as it would without a template
        return None


def seed_sqlite_store(tracking_uri: str) -> bool:
    """Create a local SQLite store that does not exist yet, complete or not at all: a copy of the
    empty-store template (:func:`empty_store_template`; else MLflow's own migrations) written to a
    temporary file in the same folder and renamed, so that a full disk or a killed process never
    leaves a half-made store. Returns whether it did; other stores, existing files and folders
    that do not exist are left to MLflow; a failed write raises ``OSError`` naming the store.
    Call it under the store's lock (:func:`_store_lock`)."""
    uri = absolute_tracking_uri(tracking_uri)
    database = sqlite_file(uri)
    if database is None or "?" in uri or not local_store_missing(uri):
        return False
    if not database.parent.is_dir():
        return False
    for stale in database.parent.glob(f".{database.name}.*.partial"):  # ours, of a creation that was killed
        pid = stale.name[len(database.name) + 2:-len(".partial")]
        if pid.isdigit() and not process_alive(int(pid)):
            with contextlib.suppress(OSError):
                stale.unlink()
    partial = database.with_name(f".{database.name}.{os.getpid()}.partial")
    try:
        template = empty_store_template()
        if template is not None:
            shutil.copyfile(template, partial)
        else:  # MLflow's own migrations, into the temporary file
            from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

            # MLflow's default root
            SqlAlchemyStore(sqlite_uri(partial), str(Path("mlruns").resolve())).engine.dispose()
        os.replace(partial, database)
    except OSError as error:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise OSError(
            error.errno, f"the MLflow store could not be created ({error.strerror})", str(database)
        ) from error
    return True


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
