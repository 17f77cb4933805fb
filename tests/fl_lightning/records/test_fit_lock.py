"""One fit per run at a time (fit_lock.RunLock), and a run left RUNNING by a fit that died is
ended KILLED by the next fit of its experiment (fit_lock.mark_dead_runs)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from fl_lightning.cli import main
from fl_lightning.cli.preflight import PreflightError
from fl_lightning.records.fit_lock import LOCK_NAME, RunLock, read_lock, this_host
from fl_lightning.records.vocabulary import Tag
from tests.fl_lightning.cli.test_resume_cli import fit_args, interrupted_fit
from tests.paths import REPO

pytestmark = pytest.mark.usefixtures("one_thread")


def dead_pid() -> int:
    """The id of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def write_lock(folder: Path, pid: int, host: str | None = None) -> Path:
    path = folder / LOCK_NAME
    path.write_text(f'{{"host": "{host or this_host()}", "pid": {pid}, "started": "2026-11-27 10:00:00"}}')
    return path


def test_a_lock_is_taken_refused_while_its_fit_lives_and_taken_over_when_stale(tmp_path):
    lock = RunLock.acquire(tmp_path)
    assert read_lock(tmp_path / LOCK_NAME)["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()

    write_lock(tmp_path, os.getppid())  # a live process of this host holds it
    with pytest.raises(PreflightError, match=f"another fit is running this run \\(process {os.getppid()}"):
        RunLock.acquire(tmp_path)
    write_lock(tmp_path, os.getppid(), host="another-machine")  # cannot be told: refused, with what to do
    with pytest.raises(PreflightError, match="delete the lock file"):
        RunLock.acquire(tmp_path)
    write_lock(tmp_path, dead_pid())  # its fit is gone
    RunLock.acquire(tmp_path).release()


@pytest.mark.slow
def test_the_same_resume_twice_at_once_the_second_is_refused_and_logs_nothing(store, capsys, monkeypatch):
    run, command = interrupted_fit(store, capsys, monkeypatch)
    client = MlflowClient(store)
    steps_before = [m.step for m in client.get_metric_history(run.info.run_id, "test_acc_mean")]
    write_lock(Path(command[-1]).parent, os.getppid())  # the first resume, still running
    with pytest.raises(SystemExit) as stopped:
        main(command[1:])
    assert stopped.value.code != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "another fit is running this run" in err
    assert client.get_run(run.info.run_id).info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "test_acc_mean")] == steps_before

    (Path(command[-1]).parent / LOCK_NAME).unlink()  # the first one ended: the resume runs, and leaves no lock
    main(command[1:])
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
    assert not (Path(command[-1]).parent / LOCK_NAME).exists()


def test_a_run_whose_fit_died_is_ended_killed_by_the_next_fit(store):
    client = MlflowClient(store)
    main(fit_args(store))  # creates the experiment
    experiment = client.get_experiment_by_name("fl-lightning").experiment_id
    orphan = client.create_run(experiment, tags={Tag.FIT_HOST: this_host(), Tag.FIT_PID: str(dead_pid())})
    elsewhere = client.create_run(experiment, tags={Tag.FIT_HOST: "another-machine", Tag.FIT_PID: "1"})
    main(fit_args(store))
    assert client.get_run(orphan.info.run_id).info.status == "KILLED"
    assert "stopped without ending the run" in client.get_run(orphan.info.run_id).data.tags[Tag.KILLED_REASON]
    assert client.get_run(elsewhere.info.run_id).info.status == "RUNNING"  # cannot be told from here
    finished = [r for r in client.search_runs([experiment]) if r.info.status == "FINISHED"]
    assert len(finished) == 2 and all(r.data.tags[Tag.FIT_HOST] == this_host() for r in finished)


@pytest.mark.integration
def test_sigkill_then_a_new_fit_ends_the_dead_run_killed(store, tmp_path):
    """A real fit killed with SIGKILL mid-run (no handler runs) stays RUNNING in the store until the
    next fit of its experiment ends it KILLED."""
    args = [arg.replace(f"--model.num_rounds={4}", "--model.num_rounds=100000") for arg in fit_args(store)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen([sys.executable, "-m", "fl_lightning.cli", *args], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = MlflowClient(store)
    try:
        deadline = time.time() + 120
        running = []
        while time.time() < deadline and not running:
            time.sleep(0.5)
            experiment = client.get_experiment_by_name("fl-lightning") if Path(tmp_path / "runs.db").exists() else None
            if experiment is not None:
                running = [r for r in client.search_runs([experiment.experiment_id])
                           if r.info.status == "RUNNING" and r.data.tags.get(Tag.FIT_PID) == str(child.pid)]
        assert running, "the fit never reached its first round"
    finally:
        child.kill()
        child.wait()
    (run,) = running
    assert client.get_run(run.info.run_id).info.status == "RUNNING"  # nothing ended it
    from leaderboard.runs import load_runs

    read = {r.run_id: r.status for r in load_runs(store, ["fl-lightning"], lambda *_: None).runs}
    assert read[run.info.run_id] == "KILLED"  # the leaderboard never counts it as running...
    assert client.get_run(run.info.run_id).info.status == "RUNNING"  # ...and only reads the store
    main(fit_args(store))
    assert client.get_run(run.info.run_id).info.status == "KILLED"


# ------------------------------------------------------------------ issue 50: what the fit_lock mutants got past
def test_only_running_runs_whose_fit_is_gone_are_ended_and_the_reason_names_the_fit(store):
    """``mark_dead_runs`` ends KILLED the RUNNING runs of the experiments it is given whose fit (a
    process of this host) is gone, unless kept for a resume; a run of a dead fit that had ended
    (FINISHED, FAILED) stays as it ended, and a run whose fit lives or ran on another host, or of
    another experiment, stays RUNNING."""
    from fl_lightning.records.fit_lock import mark_dead_runs

    client = MlflowClient(store)
    suite, other = client.create_experiment("suite"), client.create_experiment("other")
    dead = str(dead_pid())

    def run(experiment, pid=dead, host=None, status=None):
        run_id = client.create_run(experiment, tags={Tag.FIT_HOST: host or this_host(), Tag.FIT_PID: pid}).info.run_id
        if status:
            client.set_terminated(run_id, status=status)
        return run_id

    orphan, kept = run(suite), run(suite)
    ended = {run(suite, status="FINISHED"): "FINISHED", run(suite, status="FAILED"): "FAILED"}
    left = [run(suite, pid=str(os.getpid())), run(suite, host="another-machine"), run(other)]
    assert mark_dead_runs(client, [suite], keep={kept}) == [orphan]
    assert {run_id: client.get_run(run_id).info.status for run_id in [orphan, kept, *ended, *left]} == {
        orphan: "KILLED", kept: "RUNNING", **ended, **dict.fromkeys(left, "RUNNING")}
    assert client.get_run(orphan).data.tags[Tag.KILLED_REASON] == (
        f"its fit (process {dead} on {this_host()}) stopped without ending the run (killed, or the machine went "
        "down); found by a later fit")
    assert mark_dead_runs(client, []) == []
