"""Fault injection, in the spirit of SQLite's crash tests: a fit is stopped at each phase (store
creation, mid-round, the checkpoint write, an MLflow flush, the final artefacts) by each fault (SIGKILL,
a full disk, a tracking store that stops answering; ``tests/fault_harness.py`` strikes it), and
after each the invariants hold:

* the store opens (and SQLite finds it sound);
* no run is RUNNING without a live fit: one left RUNNING is read as KILLED (its fit is gone);
* every earlier run of the store is unchanged;
* every checkpoint file left is loadable (``last.ckpt`` or absent; no partial file counts);
* the printed resume command (or, with no checkpoint yet, the same command again) finishes the
  run with every round logged exactly once;
* a fault that is not a kill ends in one line naming it, with no traceback on the terminal.

And the second writer (issue 50): a fit's own printed resume command, run while the fit still
runs, is refused in one line and changes nothing; two ``fl-benchmarks run`` of one suite started
together, on a new store and on an existing one, split its cells: every cell one FINISHED run,
every round logged once, one fit per cell log, no traceback.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from fl_lightning.cli import main
from fl_lightning.records.fit_lock import fit_is_alive
from fl_lightning.records.vocabulary import Tag
from leaderboard.runs import status_as_read
from tests.fl_lightning.cli.test_resume_cli import fit_args
from tests.paths import REPO, TESTS
from tests.printed import printed_line, words

ROOT = REPO
HARNESS = TESTS / "fault_harness.py"
PHASES = ("store", "round", "checkpoint", "flush", "final")
FAULTS = ("sigkill", "enospc", "server")
ROUNDS = 6
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def earlier_store(tmp_path_factory):
    """A store holding one finished run (the run every fault must leave unchanged)."""
    folder = tmp_path_factory.mktemp("earlier")
    uri = f"sqlite:///{folder / 'runs.db'}"
    here = Path.cwd()
    os.chdir(folder)
    try:
        main(fit_args(uri, "--seed_everything=9"))
    finally:
        os.chdir(here)
    return folder / "runs.db"


def snapshot(client: MlflowClient, run_id: str) -> tuple:
    run = client.get_run(run_id)
    history = {key: [(m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key)]
               for key in run.data.metrics}
    return run.info.status, run.info.end_time, dict(run.data.tags), dict(run.data.params), history


def runs_of(client: MlflowClient) -> list:
    experiment = client.get_experiment_by_name("fl-lightning")
    return [] if experiment is None else client.search_runs([experiment.experiment_id])


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("phase", PHASES)
def test_a_fault_at_any_phase_loses_nothing(phase, fault, earlier_store, tmp_path, capsys, monkeypatch):
    database = tmp_path / "runs.db"
    uri = f"sqlite:///{database}"
    earlier: dict[str, tuple] = {}
    if phase != "store":  # the store phase needs a store that does not exist yet
        shutil.copyfile(earlier_store, database)
        client = MlflowClient(uri)
        earlier = {run.info.run_id: snapshot(client, run.info.run_id) for run in runs_of(client)}
        assert len(earlier) == 1
    args = fit_args(uri, f"--model.num_rounds={ROUNDS}", "--seed_everything=5")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": uri, "FL_LIGHTNING_SERVER_WAIT_S": "0.5"}
    done = subprocess.run([sys.executable, str(HARNESS), phase, fault, *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    said = done.stdout + done.stderr
    assert f"STRUCK {phase} {fault}" in done.stderr, said[-3000:]  # the fault did strike, in that phase

    # what the user sees
    if fault == "sigkill":
        assert done.returncode == -9
    else:
        assert done.returncode == 1, said[-3000:]
        assert "Traceback" not in said, said[-3000:]
        assert "(the full traceback is in " in done.stderr
        fault_words = "the disk is full" if fault == "enospc" else "stopped answering"
        assert fault_words in said, said[-3000:]

    # the store opens and is sound
    if database.exists():
        with contextlib.closing(sqlite3.connect(database)) as connection:
            assert connection.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    # (a client of a store that is not there would make one)
    runs = runs_of(MlflowClient(uri)) if database.exists() else []
    # no RUNNING run without a live fit
    for run in runs:
        if run.info.status == "RUNNING":
            assert fit_is_alive(run.data.tags.get(Tag.FIT_HOST), run.data.tags.get(Tag.FIT_PID)) is False
            assert status_as_read(run.info.status, run.data.tags) == "KILLED"
    # every earlier run unchanged
    if earlier:
        assert {run_id: snapshot(MlflowClient(uri), run_id) for run_id in earlier} == earlier
    # every checkpoint left is whole; a fault that is not a kill leaves no half-written file
    if fault != "sigkill":
        assert not list(tmp_path.rglob("*.partial")), list(tmp_path.rglob("*.partial"))
    for checkpoint in tmp_path.rglob("*.ckpt"):
        assert torch.load(checkpoint, map_location="cpu", weights_only=True)["state_dict"]

    # the printed command (or the same command again) finishes the run, every round once
    lines = [line for line in done.stdout.splitlines() if "resume it with:" in line]
    command = words(printed_line(done.stdout, "resume it with:"))[1][1:] if lines else args
    monkeypatch.chdir(tmp_path)
    main(command)
    capsys.readouterr()
    client = MlflowClient(uri)
    runs = [run for run in runs_of(client) if run.info.run_id not in earlier]
    finished = [run for run in runs if run.info.status == "FINISHED"]
    assert len(finished) == 1, [(run.info.run_id, run.info.status) for run in runs]
    steps = sorted(m.step for m in client.get_metric_history(finished[0].info.run_id, "train_loss"))
    assert steps == list(range(1, ROUNDS + 1))
    assert not [run for run in runs_of(client) if status_as_read(run.info.status, run.data.tags) == "RUNNING"]
    assert not list(tmp_path.rglob("*.partial")) and not list(tmp_path.rglob(".*.partial"))  # nothing half-written left
    if lines:  # the resume continued the same run
        assert len(runs) == 1
    assert {run_id: snapshot(client, run_id) for run_id in earlier} == earlier


def test_a_fits_own_resume_command_run_while_it_runs_is_refused_and_changes_nothing(tmp_path):
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    release = tmp_path / "release"
    args = fit_args(uri, f"--model.num_rounds={ROUNDS}", "--seed_everything=5")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": uri, "FL_HOLD_RELEASE": str(release)}
    fit = subprocess.Popen([sys.executable, str(HARNESS), "round", "hold", *args], cwd=tmp_path, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = ""
        while "resume it with:" not in out:  # printed when the fit starts
            line = fit.stdout.readline()
            assert line, fit.stderr.read()[-3000:]
            out += line
        while "STRUCK round hold" not in fit.stderr.readline():  # the fit waits, alive, in round ROUND
            assert fit.poll() is None, fit.stderr.read()[-3000:]
        command = words(printed_line(out, "resume it with:"))[1]
        second = subprocess.run([sys.executable, "-m", "fl_lightning.cli", *command[1:]], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=300)
        release.touch()
        rest, err = fit.communicate(timeout=300)
    finally:
        if fit.poll() is None:
            fit.kill()
            fit.wait()
    assert second.returncode == 2, second.stderr[-3000:]
    assert len(second.stderr.strip().splitlines()) == 1 and "another fit is running this run" in second.stderr
    assert fit.returncode == 0, err[-3000:]
    client = MlflowClient(uri)
    (run,) = runs_of(client)
    assert run.info.status == "FINISHED"
    steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train_loss"))
    assert steps == list(range(1, ROUNDS + 1))  # every round once: the second process logged nothing
    assert not list(tmp_path.rglob("fit.lock"))


def two_runner_suite(tmp_path: Path) -> Path:
    """Three cells of a few seconds each, with checkpoints (a rerun could resume a live run)."""
    import yaml

    from benchmarks.suites import deep_merge
    from tests.benchmarks.test_runner import SUITE

    base = deep_merge(SUITE["base"], {"trainer": {"enable_checkpointing": True},
                                      "model": {"init_args": {"num_rounds": 12, "eval_every": 4}}})
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(dict(SUITE, base=base)))
    return path


@pytest.mark.parametrize("store", ["new", "existing"])
def test_two_runners_of_one_suite_at_once_split_its_cells(store, tmp_path):
    from benchmarks.suite_store import ensure_experiment

    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    if store == "existing":
        ensure_experiment(uri, "tiny-offline")
    path = two_runner_suite(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "benchmarks", "run", str(path), "--tracking-uri", uri]
    runners = [subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)]
    runners.append(subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True))
    said = [runner.communicate(timeout=600) for runner in runners]
    for runner, (out, err) in zip(runners, said, strict=True):
        assert runner.returncode == 0, (out + err)[-3000:]
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err[-3000:]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("tiny-offline").experiment_id])
    cells = [run.data.tags[Tag.CELL] for run in runs]
    assert sorted(set(cells)) == sorted(cells) and len(cells) == 3, [(c, r.info.status) for c, r in zip(cells, runs)]
    assert {run.info.status for run in runs} == {"FINISHED"}
    for run in runs:
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "clients_aggregated"))
        assert steps == list(range(1, 13))  # every round once
    for log in (tmp_path / "benchmark_logs" / "tiny-offline").glob("*.log"):
        assert log.read_text().count("resume it with:") == 1, log  # one fit per cell log
