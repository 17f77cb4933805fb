"""``fl_lightning.records.read_only_store``: a SQLite store another process holds locked is a store
in use, not "a file that cannot be read"; a store is read through a read-only URI that leaves nothing
behind, whatever its path holds."""

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


def test_a_read_only_uri_reads_the_store_and_leaves_no_folder_behind_whatever_the_path(tmp_path, monkeypatch):
    """MLflow creates the parent folders of a sqlite path, read from the URI or, from MLflow 3.18,
    from SQLAlchemy's once-unquoted database: neither may hold a "/", or a folder ``file:/...`` appears
    in the working directory. Any character of the path (spaces, ``%``, ``?``, ``#``) survives."""
    from sqlalchemy.engine import make_url

    plain = tmp_path / "plain"
    plain.mkdir()
    MlflowClient(f"sqlite:///{plain / 'runs.db'}").create_experiment("kept")  # made where any MLflow can
    folder = plain.rename(tmp_path / "a b%20?#c")
    store = folder / "runs.db"
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    uri = read_only_store.read_only_uri(store)
    assert "/" not in uri.removeprefix("sqlite:///") and "/" not in make_url(uri).database
    assert MlflowClient(uri).get_experiment_by_name("kept") is not None
    assert [p.name for p in work.iterdir()] in ([], ["mlruns"])  # MLflow 2.x makes its artifact folder, never file:
    with pytest.raises(Exception, match="readonly"):
        MlflowClient(uri).create_experiment("refused")
    assert MlflowClient(uri).get_experiment_by_name("refused") is None
