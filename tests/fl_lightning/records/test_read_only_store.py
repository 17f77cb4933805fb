"""``fl_lightning.records.read_only_store``: a SQLite store another process holds locked is a store
in use, not "a file that cannot be read"."""

import sqlite3

import pytest
from mlflow.tracking import MlflowClient

from fl_lightning.records import read_only_store
from fl_lightning.records.read_only_store import LOCKED, READY, StoreError, check_readable, check_writable, sqlite_state


def test_a_store_locked_by_another_process_is_said_to_be_locked_not_another_kind_of_file(tmp_path, monkeypatch):
    path = tmp_path / "runs.db"
    uri = f"sqlite:///{path}"
    MlflowClient(uri).create_experiment("tiny")
    assert sqlite_state(path) == (READY, "")
    monkeypatch.setattr(read_only_store, "LOCK_WAIT_S", 0.1)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process writing for longer than the wait
    try:
        assert sqlite_state(path) == (LOCKED, "database is locked")
        with pytest.raises(StoreError) as refused:
            check_readable(uri)
        check_writable(uri)  # a fit or runner waits for the lock itself, saying so
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert str(refused.value) == (f"the MLflow store {uri} is locked by another process (database is locked); run "
                                  "again once it is free (another fit or an `mlflow ui` writing to it)")
    assert check_readable(uri) == READY
