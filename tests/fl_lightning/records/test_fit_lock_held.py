"""Issue 50, one writer per run: every logged fit, fresh or resumed, holds its run's ``fit.lock``
from the moment the run exists (its own printed resume command is refused in one line while it
runs), and a fit that could not write its checkpoints is refused before its run is created."""

import os
import subprocess
import sys

import pytest
from lightning.pytorch.loggers import MLFlowLogger
from mlflow.tracking import MlflowClient

from fl_lightning.cli import main
from fl_lightning.cli.preflight import PreflightError
from fl_lightning.records.fit_lock import LOCK_NAME, check_writable_folder, read_lock, release_claim, try_claim
from tests.fl_lightning.cli.test_resume_cli import fit_args
from tests.paths import REPO

ROOT = REPO
pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_fresh_fit_holds_its_lock_and_its_own_resume_command_is_refused_while_it_runs(store, tmp_path, capsys,
                                                                                        monkeypatch):
    seen: dict = {}
    log_metrics = MLFlowLogger.log_metrics

    def second_writer(self, metrics, step=None):
        if step == 2 and "train_loss" in metrics and not seen:
            (checkpoint,) = tmp_path.glob("checkpoints/*/*/checkpoints/last.ckpt")
            seen["lock"] = read_lock(checkpoint.parent / LOCK_NAME)
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            seen["resume"] = subprocess.run(
                [sys.executable, "-m", "fl_lightning.cli", *fit_args(store), "--ckpt_path", str(checkpoint)],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        return log_metrics(self, metrics, step)

    monkeypatch.setattr(MLFlowLogger, "log_metrics", second_writer)
    main(fit_args(store))
    assert seen["lock"]["pid"] == os.getpid()  # the fresh fit held its run's lock
    resume = seen["resume"]
    assert resume.returncode == 2, resume.stderr[-2000:]
    assert len(resume.stderr.strip().splitlines()) == 1 and "another fit is running this run" in resume.stderr
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("fl-lightning").experiment_id])
    assert run.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
    assert sorted(steps) == sorted(set(steps))  # no round logged twice
    assert not list(tmp_path.glob(f"checkpoints/*/*/checkpoints/{LOCK_NAME}"))  # released when the fit ended


def test_a_fit_whose_checkpoint_folder_cannot_be_written_creates_no_run(store, tmp_path, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the checkpoints would go\n")
    with pytest.raises(SystemExit) as stopped:
        main(fit_args(store, f"--trainer.default_root_dir={blocker / 'checkpoints'}"))
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{blocker} is not a folder" in err, err
    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("fl-lightning")
    assert experiment is None or client.search_runs([experiment.experiment_id]) == []
    assert blocker.read_text() == "a file where the checkpoints would go\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder")
def test_a_read_only_checkpoint_folder_is_refused(tmp_path):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(PreflightError, match="is not writable"):
            check_writable_folder(folder / "1" / "run" / "checkpoints")
    finally:
        folder.chmod(0o755)


def test_a_claim_is_taken_once_refused_to_a_live_holder_and_taken_over_from_a_dead_one(tmp_path):
    from tests.fl_lightning.records.test_fit_lock import dead_pid, write_lock

    path = tmp_path / "cell.claim"
    assert try_claim(path) is None and read_lock(path)["pid"] == os.getpid()
    assert try_claim(path) is None  # this process holds it already
    release_claim(path)
    assert not path.exists()
    write_lock(tmp_path, os.getppid()).rename(path)  # a live process holds it
    assert try_claim(path)["pid"] == os.getppid()
    release_claim(path)  # not ours: left alone
    assert path.exists()
    write_lock(tmp_path, dead_pid()).replace(path)  # its process is gone
    assert try_claim(path) is None and read_lock(path)["pid"] == os.getpid()


def test_a_checkpoint_folder_under_a_file_or_a_folder_it_may_not_write_is_refused_saying_what_to_do(
        tmp_path, monkeypatch):
    """Issue 50: both refusals of ``check_writable_folder`` in full, naming the nearest existing
    folder above the one asked for; a folder the process may not write into is told by
    ``os.access`` (faked here: this machine's tests run as root, which writes anywhere)."""
    from pathlib import Path

    from fl_lightning.records import fit_lock

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file\n")
    with pytest.raises(PreflightError) as under_a_file:
        check_writable_folder(blocker / "checkpoints")
    assert str(under_a_file.value) == (f"cannot write checkpoints into {blocker / 'checkpoints'}: {blocker} is not "
                                       "a folder; pass another --trainer.default_root_dir")
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    access = os.access
    monkeypatch.setattr(fit_lock.os, "access",
                        lambda path, mode: not (Path(path) == read_only and mode & os.W_OK) and access(path, mode))
    with pytest.raises(PreflightError) as not_writable:
        check_writable_folder(read_only / "1" / "run" / "checkpoints")
    assert str(not_writable.value) == (f"cannot write checkpoints into {read_only / '1' / 'run' / 'checkpoints'}: "
                                       f"{read_only} is not writable; make it writable or pass another "
                                       "--trainer.default_root_dir")
    check_writable_folder(tmp_path / "fine" / "checkpoints")  # creates nothing
    assert not (tmp_path / "fine").exists()
