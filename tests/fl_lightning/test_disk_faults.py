"""Faults of the machine said in one line, the traceback in a log file, nothing lost.

A full disk mid-fit (the store refuses the round's metrics, as SQLite does: "database or disk
is full"), then the printed resume command once space is back: the run finishes with every
round logged exactly once. A real full disk (a 300 KB tmpfs, where this machine lets us mount
one) when the store is created: two lines, no half-made store left. And :func:`fault_line`
on the exceptions these faults raise."""

import errno
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from fl_lightning.cli import main
from fl_lightning.faults import FAULT_LOG, TrackingServerLost, fault_line, save_traceback
from tests.fl_lightning.cli.test_resume_cli import ROUNDS, fit_args
from tests.paths import REPO
from tests.printed import printed_line, words

ROOT = REPO


def chained(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as error:
            raise outer from error
    except BaseException as error:  # noqa: BLE001
        return error


def test_fault_line_names_the_fault_and_the_file_written():
    move = OSError(errno.ENOSPC, "No space left on device", "/tmp/tmpabc", None, "/run/last.ckpt.partial")
    assert fault_line(move) == "the disk is full (writing /run/last.ckpt.partial)"
    wrapped = chained(RuntimeError("could not set up the MLflow store"), OSError(errno.ENOSPC, "full", "/s/m.db"))
    assert fault_line(wrapped) == "the disk is full (writing /s/m.db)"
    store = chained(RuntimeError("(sqlite3.OperationalError) database or disk is full"), ValueError("x"))
    assert fault_line(store).startswith("the disk is full")
    denied = PermissionError(errno.EACCES, "Permission denied", "/data/runs.db")
    assert fault_line(denied) == "a file cannot be written here: Permission denied (writing /data/runs.db)"
    server = RuntimeError("API request to http://127.0.0.1:5123/api/2.0/mlflow/runs/log-batch failed with exception "
                          "HTTPConnectionPool(...): Max retries exceeded (Connection refused)")
    assert fault_line(server) == "the tracking server http://127.0.0.1:5123 stopped answering"
    assert fault_line(TrackingServerLost("the tracking server x stopped answering at round 7")).endswith("round 7")
    assert fault_line(sqlite3.DatabaseError("database disk image is malformed")).startswith(
        "the MLflow store is corrupted"
    )
    # a bug is not a fault: it keeps its traceback
    assert fault_line(KeyError("state_dict")) is None
    assert fault_line(chained(ValueError("bad shape"), TypeError("x"))) is None


def test_the_traceback_goes_to_the_first_folder_that_takes_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    full = tmp_path / "full"  # a folder that does not exist stands for one that cannot be written
    error = chained(RuntimeError("outer"), OSError(errno.ENOSPC, "full"))
    log = save_traceback(error, [full])
    assert log == (tmp_path / FAULT_LOG).resolve()
    text = log.read_text()
    assert "OSError: [Errno 28] full" in text and "RuntimeError: outer" in text
    assert not list(tmp_path.glob(".*partial"))


@pytest.mark.integration
@pytest.mark.usefixtures("one_thread")
def test_a_full_disk_mid_fit_says_so_and_the_printed_resume_finishes_the_run(store, tmp_path, capsys, monkeypatch):
    """The store refuses round 3's metrics as SQLite does on a full disk, and keeps refusing
    (the disk stays full): the fit ends with one line naming the fault and the resume command,
    the handlers do not crash on the fault, the traceback is in a log beside the checkpoint. Once
    space is back, the printed command finishes the same run, every round logged once."""
    log_batch = MlflowClient.log_batch

    def full_disk(self, run_id, metrics=(), *args, **kwargs):
        if any(metric.step >= 3 for metric in metrics):
            raise sqlite3.OperationalError("database or disk is full")
        return log_batch(self, run_id, metrics, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(MlflowClient, "log_batch", full_disk)
        with pytest.raises(SystemExit) as failed:
            main(fit_args(store))
    assert failed.value.code == 1
    out, err = capsys.readouterr()
    said = printed_line(out, "The fit failed:")
    assert "the disk is full" in said and "its last checkpoint (after round" in said
    assert "Traceback" not in out + err
    log_line = [line for line in err.splitlines() if line.startswith("(the full traceback is in ")]
    assert len(log_line) == 1
    log = Path(log_line[0].removeprefix("(the full traceback is in ").rstrip(")"))
    assert log.name == FAULT_LOG and "database or disk is full" in log.read_text()
    command = words(printed_line(out, "resume it with:"))[1]
    assert log.parent == Path(command[-1]).parent  # beside the run's checkpoints

    main(command[1:])  # space is back: the printed command, as a user would paste it
    client = MlflowClient(store)
    [run] = client.search_runs([client.get_experiment_by_name("fl-lightning").experiment_id])
    assert run.info.status == "FINISHED"
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train_loss")) == list(
        range(1, ROUNDS + 1)
    )


def can_mount_tmpfs(folder: Path) -> bool:
    if os.geteuid() != 0 or sys.platform != "linux":
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(folder)], capture_output=True)
    return done.returncode == 0


@pytest.mark.integration
def test_a_really_full_disk_when_the_store_is_made_leaves_no_half_made_store(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if not can_mount_tmpfs(disk):
        pytest.skip("a 300 KB tmpfs cannot be mounted here (needs root on Linux)")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "fl_lightning.cli", *fit_args(f"sqlite:///{disk / 'runs.db'}")],
            cwd=disk, capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": f"sqlite:///{disk / 'runs.db'}"})
        left = sorted(path.name for path in disk.iterdir())
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    assert done.returncode == 1
    err = done.stderr.strip().splitlines()
    assert len(err) == 2, done.stderr
    assert (
        err[0]
        == f"error: the disk is full (writing {disk / 'runs.db'}); once that is fixed, run the same command again"
    )
    assert err[1].startswith("(the full traceback is in ") and "Traceback" not in done.stdout + done.stderr
    assert "runs.db" not in left and not [name for name in left if name.endswith(".partial")]
