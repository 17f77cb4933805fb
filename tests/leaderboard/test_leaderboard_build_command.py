"""The build command around the store and its output: an empty store gives a page that says so; a
build only reads the store (never creates, migrates or alters it, even one left mid-write), refuses
in one line without a traceback, and writes leaderboard_build/ unless asked to --publish.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from leaderboard.__main__ import main as leaderboard_main
from tests.leaderboard_builders import ROOT, SUITE, runner_tags


def test_empty_store_gives_a_page_that_says_so(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'empty.db'}"
    MlflowClient(tracking_uri=uri).search_experiments()  # creates the (empty) store
    code = leaderboard_main(["build", "--tracking-uri", uri, "--out", str(tmp_path / "site"),
                             "--paper-numbers", str(tmp_path / "none")])
    assert code == 0
    assert "No runs found" in (tmp_path / "site" / "index.html").read_text()
    assert "No runs found" in (tmp_path / "site" / "index.md").read_text()
    assert "file://" in capsys.readouterr().out


# --- a build only reads the store, and writes leaderboard_build/ unless asked to publish -------------

OLD_MLFLOW_SCHEMA = "451aebb31d03"  # the revision of the stores MLflow 1.x wrote


def snapshot(path: Path) -> tuple[bytes, int]:
    """The file as it is: bytes and modification time (a write changes one or the other)."""
    return path.read_bytes(), path.stat().st_mtime_ns


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def mlflow_store(path: Path, runs: int = 0) -> str:
    """A store written by this MLflow, with ``runs`` finished runs in the experiment SUITE."""
    uri = f"sqlite:///{path}"
    client = MlflowClient(tracking_uri=uri)
    client.search_experiments()  # creates the tables and the Default experiment
    if runs:
        experiment = client.create_experiment(SUITE)
        for seed in range(runs):
            run = client.create_run(experiment, tags={**runner_tags("FedAvg", seed), "algorithm": "FedAvg"})
            client.log_metric(run.info.run_id, "test_acc_mean", 0.5 + seed / 100, step=3)
            client.set_terminated(run.info.run_id, "FINISHED")
    return uri


def sql(path: Path, *statements: str) -> None:
    import sqlite3

    connection = sqlite3.connect(path)
    for statement in statements:
        connection.execute(statement)
    connection.commit()
    connection.close()


def test_build_never_creates_a_missing_store(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert leaderboard_main(["build", "--tracking-uri", "sqlite:///mlruns.db"]) == 2
    line = one_line(capsys.readouterr().err)
    assert re.search(r"no MLflow store at sqlite:///mlruns\.db: the file .*mlruns\.db does not exist\. "
                     r"Pass the store the runs were logged to with --tracking-uri", line), line
    assert list(tmp_path.iterdir()) == []  # no store, no site, no artifact folder


@pytest.mark.parametrize("kind", ["empty file", "older schema", "another database", "no experiment", "runs"])
def test_build_leaves_an_existing_store_as_it_was(kind, tmp_path, monkeypatch, capsys):
    """MLflow's client would make the empty file a store, migrate the older schema, add its tables
    to the other database and a Default experiment to the store without one: a build does none of
    it. It refuses the first three in one line and reads the others without a write."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "mlruns.db"
    if kind == "empty file":
        path.touch()
    elif kind == "another database":
        sql(path, "CREATE TABLE notes (text TEXT)", "INSERT INTO notes VALUES ('keep me')")
    else:
        mlflow_store(path, runs=2 if kind == "runs" else 0)
        if kind == "older schema":
            sql(path, f"UPDATE alembic_version SET version_num = '{OLD_MLFLOW_SCHEMA}'")
        elif kind == "no experiment":
            sql(path, "DELETE FROM experiment_tags", "DELETE FROM experiments")
    before = snapshot(path)
    present = sorted(p.name for p in tmp_path.iterdir())  # MLflow 2.16 makes ./mlruns beside a new store
    capsys.readouterr()  # MLflow's log lines from making the store
    code = leaderboard_main(["build", "--tracking-uri", "sqlite:///mlruns.db", "--paper-numbers", str(tmp_path)])
    captured = capsys.readouterr()
    assert snapshot(path) == before, f"{kind}: the store was altered"
    if kind in ("no experiment", "runs"):
        assert code == 0
        index = (tmp_path / "leaderboard_build" / "index.md").read_text()
        assert ("No runs found" in index) == (kind == "no experiment")
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*present, "leaderboard_build"])
        return
    assert code == 2
    line = one_line(captured.err)
    expected = {
        "empty file": r"the store sqlite:///mlruns\.db is an empty file .*a build does not make it a store\. "
                      r"Pass the store the runs were logged to with --tracking-uri",
        "older schema": rf"has the schema of another MLflow version \(revision {OLD_MLFLOW_SCHEMA}; this MLflow .*"
                        r"back it up, then run `mlflow db upgrade sqlite:///mlruns\.db`",
        "another database": r"is an SQLite database of something else \(tables notes\), not an MLflow store; "
                            r"pass the store .* --tracking-uri",
    }[kind]
    assert re.search(expected, line), line
    assert sorted(p.name for p in tmp_path.iterdir()) == present  # no site, no artifact folder


def test_default_output_is_git_ignored_and_only_publish_writes_the_published_site(tmp_path, monkeypatch, capsys):
    from leaderboard import site as site_module

    published_index = site_module.PUBLISHED_SITE / "index.html"
    published_before = snapshot(published_index) if published_index.exists() else None
    monkeypatch.chdir(tmp_path)
    uri = mlflow_store(tmp_path / "mlruns.db", runs=1)
    assert leaderboard_main(["build", "--tracking-uri", uri, "--paper-numbers", str(tmp_path)]) == 0
    assert (tmp_path / "leaderboard_build" / "index.html").is_file()
    assert (snapshot(published_index) if published_index.exists() else None) == published_before

    stand_in = tmp_path / "published"  # the repository's leaderboard_site/ is not rebuilt by a test
    monkeypatch.setattr(site_module, "PUBLISHED_SITE", stand_in)
    assert leaderboard_main(["build", "--tracking-uri", uri, "--paper-numbers", str(tmp_path), "--publish"]) == 0
    assert (stand_in / "index.html").is_file()
    capsys.readouterr()

    with pytest.raises(SystemExit) as stop:
        leaderboard_main(["build", "--tracking-uri", uri, "--out", "elsewhere", "--publish"])
    assert stop.value.code == 2
    line = one_line(capsys.readouterr().err)
    assert re.search(r"error: argument --publish: not allowed with argument --out \(see python -m leaderboard "
                     r"build --help\)$", line), line


def test_generated_outputs_are_git_ignored():
    import subprocess

    outputs = ["benchmark_logs/fedfv-offline/x.log", "leaderboard_build/index.html",
               ".leaderboard_build-build-x1/index.html", ".leaderboard_site-build-x1/index.html"]
    try:
        done = subprocess.run(["git", "check-ignore", "--no-index", *outputs, "leaderboard_site/index.html"],
                              cwd=ROOT, capture_output=True, text=True, timeout=30)
    except OSError:
        pytest.skip("no git")
    if done.returncode == 128:
        pytest.skip("not a git checkout")
    assert done.stdout.split() == outputs  # every generated output; never the published site


def test_a_user_error_is_one_line_without_a_traceback(tmp_path):
    """Through the real command line: the message, exit code 2, nothing else on stderr."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "leaderboard", "build", "--tracking-uri",
                           f"sqlite:///{tmp_path / 'typo.db'}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2
    assert re.fullmatch(r"error: no MLflow store at sqlite:///.*typo\.db: the file .* does not exist\. Pass the "
                        r"store the runs were logged to with --tracking-uri \(.*\)\.\n", done.stderr), done.stderr
    assert not (tmp_path / "typo.db").exists()


KILLED_MID_WRITE = """
import os, sqlite3
connection = sqlite3.connect("mlruns.db", isolation_level=None)
connection.execute("PRAGMA cache_size = 1")  # pages reach the file before the commit
connection.execute("BEGIN")
connection.execute("UPDATE runs SET status = 'FAILED'")
connection.execute("CREATE TABLE junk (x)")
connection.executemany("INSERT INTO junk VALUES (?)", [(os.urandom(500),) for _ in range(2000)])
os._exit(0)  # killed before the commit: the journal stays beside the store
"""


def test_a_store_left_mid_write_is_read_as_last_committed_and_left_as_it_is(tmp_path, monkeypatch, capsys):
    """A reader must roll a killed writer's journal back, which a read-only connection cannot: the
    build rolls it back in a copy, reads the committed runs, and leaves the store and journal alone."""
    import subprocess

    monkeypatch.chdir(tmp_path)
    uri = mlflow_store(tmp_path / "mlruns.db", runs=2)
    subprocess.run([sys.executable, "-c", KILLED_MID_WRITE], cwd=tmp_path, check=True, timeout=120)
    store, journal = tmp_path / "mlruns.db", tmp_path / "mlruns.db-journal"
    assert journal.stat().st_size > 0
    before = snapshot(store), snapshot(journal)
    capsys.readouterr()
    assert leaderboard_main(["build", "--tracking-uri", uri, "--paper-numbers", str(tmp_path)]) == 0
    assert (snapshot(store), snapshot(journal)) == before
    out = capsys.readouterr().out
    assert f"Read 2 runs from 1 experiment(s) ({SUITE})" in out
    index = (tmp_path / "leaderboard_build" / "index.md").read_text()
    assert "FAILED" not in index  # the uncommitted write is not read
