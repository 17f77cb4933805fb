"""A store that another process holds locked, a corrupt one and a half-made one: one line each,
before the fit creates or changes anything (preflight.check_sqlite_store)."""

import hashlib
import sqlite3

import pytest

from fl_lightning.cli import main, preflight
from tests.fl_lightning.cli.test_resume_cli import fit_args

pytestmark = pytest.mark.usefixtures("one_thread")


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_locked_store_is_waited_for_with_one_line_then_refused_with_one_more(store, tmp_path, capsys, monkeypatch):
    main(fit_args(store))
    capsys.readouterr()
    database = tmp_path / "runs.db"
    holder = sqlite3.connect(database, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process writing, and not letting go
    monkeypatch.setattr(preflight, "STORE_LOCK_WAIT_S", 1.0)
    try:
        with pytest.raises(SystemExit) as refused:
            main(fit_args(store))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert refused.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2
    assert "is locked by another process; waiting up to 1 s" in err[0]
    assert "stayed locked by another process for 1 s" in err[1] and "Traceback" not in "\n".join(err)
    assert len(list(tmp_path.glob("checkpoints/*/*"))) == 1  # no checkpoint folder for the refused fit


def test_a_lock_that_goes_away_is_waited_out(store, tmp_path, capsys, monkeypatch):
    import builtins

    main(fit_args(store))
    holder = sqlite3.connect(tmp_path / "runs.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")

    def say_then_let_go(*args, **kwargs):
        """The other process lets go once the fit has said it waits (not after a fixed time: a
        loaded machine may take longer than that to reach the store)."""
        builtins.print(*args, **kwargs)
        if holder.in_transaction:
            holder.execute("ROLLBACK")

    monkeypatch.setattr(preflight, "print", say_then_let_go, raising=False)
    try:
        main(fit_args(store))
    finally:
        holder.close()
    assert "waiting up to 60 s" in capsys.readouterr().err
    assert len(list(tmp_path.glob("checkpoints/*/*"))) == 2  # the waiting fit ran


@pytest.mark.parametrize(("content", "says"), [
    (b"this is not a database at all, it is a text file" * 100, "is not a readable SQLite database"),
    ("half", "is half-made (it lacks the tables alembic_version, runs)"),
])
def test_a_corrupt_or_half_made_store_is_refused_in_one_line_and_left_as_it_is(content, says, store, tmp_path, capsys):
    database = tmp_path / "runs.db"
    if content == "half":  # a creation that stopped after its first table
        connection = sqlite3.connect(database)
        connection.execute("CREATE TABLE experiments (experiment_id INTEGER PRIMARY KEY, name TEXT)")
        connection.commit()
        connection.close()
    else:
        database.write_bytes(content)
    before = digest(database)
    with pytest.raises(SystemExit):
        main(fit_args(store))
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err and "move it aside" in err
    assert digest(database) == before and not (tmp_path / "checkpoints").exists()
