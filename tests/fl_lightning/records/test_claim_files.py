"""A runner's claim on a cell (``try_claim`` / ``release_claim``) and a fit's lock on its run
(``RunLock``, the same kind of file): the file written, the races around a claim taken over from
a process that is gone (another runner removing the file first), and the one-line refusals."""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path

import pytest

from fl_lightning.records import fit_lock
from fl_lightning.records.errors import PreflightError
from fl_lightning.records.fit_lock import LOCK_NAME, RunLock, read_lock, release_claim, this_host, try_claim


def test_the_claim_file_says_which_process_of_which_host_since_when_and_is_read_only_to_others(tmp_path):
    path = tmp_path / "cell.claim"
    assert try_claim(path) is None
    record = json.loads(path.read_text())
    assert record.keys() == {"host", "pid", "started"}
    assert (record["host"], record["pid"]) == (this_host(), os.getpid())
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", record["started"])
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644 & ~umask


def test_a_dead_holders_claim_removed_first_by_another_runner_is_still_taken(tmp_path, monkeypatch):
    path = tmp_path / "cell.claim"
    path.write_text(json.dumps({"host": this_host(), "pid": 1 << 30, "started": "then"}))

    def gone_and_removed_by_another_runner(host, pid):
        path.unlink()  # the other runner saw the same dead holder and removed its file first
        return False

    monkeypatch.setattr(fit_lock, "fit_is_alive", gone_and_removed_by_another_runner)
    assert try_claim(path) is None and read_lock(path)["pid"] == os.getpid()


def test_a_claim_retaken_by_dead_holders_at_every_try_gives_up_as_taken(tmp_path, monkeypatch):
    path = tmp_path / "cell.claim"
    dead = {"host": this_host(), "pid": 1 << 30, "started": "then"}

    def retaken(*args, **kwargs):
        path.write_text(json.dumps(dead))  # another dead-on-arrival claim each time
        raise FileExistsError(path)

    monkeypatch.setattr(fit_lock, "fit_is_alive", lambda host, pid: False)
    monkeypatch.setattr(fit_lock.os, "open", retaken)
    assert try_claim(path) == {}  # taken, by a claim it cannot read (as one being written reads)


def test_releasing_a_claim_whose_file_is_already_gone_is_quiet(tmp_path, monkeypatch):
    path = tmp_path / "cell.claim"
    monkeypatch.setattr(fit_lock, "read_lock", lambda _: {"host": this_host(), "pid": os.getpid()})
    release_claim(path)  # ours by its record, removed meanwhile: nothing to do
    assert not Path(path).exists()


def test_a_lock_that_cannot_be_created_or_written_is_refused_in_one_line_and_leaves_no_file(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    create = fit_lock.os.open

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(fit_lock.os, "open", refused)
    with pytest.raises(PreflightError, match=r"^cannot lock the run's checkpoint folder .*run \(Permission denied\): "
                                             "make it writable"):
        RunLock.acquire(run)
    monkeypatch.setattr(fit_lock.os, "open", create)

    def full(record, file):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fit_lock.json, "dump", full)
    with pytest.raises(PreflightError, match=r"^cannot write the lock .*fit.lock \(No space left on device\): "
                                             "free some space"):
        RunLock.acquire(run)
    assert list(run.iterdir()) == []  # no empty lock left to refuse every later resume


def test_a_lock_this_process_holds_already_is_its_own_and_released_once(tmp_path, monkeypatch):
    monkeypatch.setattr(fit_lock, "_HELD", [])
    first = RunLock.acquire(tmp_path)
    again = RunLock.acquire(tmp_path)  # the same fit asking twice
    assert again.path == first.path and fit_lock._HELD == [first]
    fit_lock.release_all()
    assert not (tmp_path / LOCK_NAME).exists() and fit_lock._HELD == []


def test_a_lock_held_by_a_live_process_names_it_and_one_of_another_host_says_how_to_clear_it(tmp_path):
    path = tmp_path / LOCK_NAME
    path.write_text(json.dumps({"host": this_host(), "pid": os.getppid(), "started": "2026-12-07 08:00:00"}))
    with pytest.raises(PreflightError) as live:
        RunLock.acquire(tmp_path)
    assert str(live.value) == (f"another fit is running this run (process {os.getppid()} on {this_host()}, since "
                               f"2026-12-07 08:00:00; lock {path}): wait for it to end or stop it")
    path.write_text(json.dumps({"host": "elsewhere", "pid": 7, "started": "then"}))
    with pytest.raises(PreflightError, match="process 7 on elsewhere, since then; .*delete the lock file and resume"):
        RunLock.acquire(tmp_path)
    path.write_text("")  # unreadable: being written
    with pytest.raises(PreflightError, match=r"\(an unknown process; lock .*delete the lock file"):
        RunLock.acquire(tmp_path)


# ------------------------------------------------------------------ issue 50: what the acquire mutants got past
def test_a_resumes_folder_that_is_gone_is_refused_not_made_again(tmp_path, monkeypatch):
    """Only a fresh run's lock makes its folder (``make``); a resume whose checkpoint folder has
    gone is refused in one line and no folder appears."""
    monkeypatch.setattr(fit_lock, "_HELD", [])
    gone = tmp_path / "runs" / "1" / "abc" / "checkpoints"
    with pytest.raises(PreflightError, match=r"^cannot lock the run's checkpoint folder .*checkpoints "
                                             r"\(No such file or directory\)"):
        RunLock.acquire(gone)
    assert not (tmp_path / "runs").exists()
    RunLock.acquire(gone, make=True).release()
    assert gone.is_dir()


def test_a_fresh_runs_folder_that_cannot_be_made_is_refused_saying_what_to_do(tmp_path, monkeypatch):
    """The folder's parent passed the writability check but making the folder failed (the disk
    filled meanwhile): one line naming the folder, why, and what to do."""
    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "mkdir", full)
    folder = tmp_path / "checkpoints"
    with pytest.raises(PreflightError) as refused:
        RunLock.acquire(folder, make=True)
    assert str(refused.value) == (f"cannot make the run's checkpoint folder {folder} (No space left on device): "
                                  "make its parent writable or pass --trainer.default_root_dir")


def test_a_lock_refused_by_the_folder_the_disk_or_another_hosts_fit_says_the_whole_remedy(tmp_path, monkeypatch):
    """Each one-line refusal of ``RunLock.acquire`` in full: what failed, why, and what to do."""
    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied")

    def full(record, file):
        raise OSError(errno.ENOSPC, "No space left on device")

    def refusal() -> str:
        with pytest.raises(PreflightError) as refused_lock:
            RunLock.acquire(tmp_path)
        monkeypatch.undo()
        return str(refused_lock.value)

    monkeypatch.setattr(fit_lock.os, "open", refused)
    assert refusal() == (f"cannot lock the run's checkpoint folder {tmp_path} (Permission denied): make it "
                         "writable or resume from a copy of the checkpoint elsewhere")
    monkeypatch.setattr(fit_lock.json, "dump", full)
    assert refusal() == (f"cannot write the lock {tmp_path / LOCK_NAME} (No space left on device): free "
                         "some space, then resume again")
    (tmp_path / LOCK_NAME).write_text(json.dumps({"host": "elsewhere", "pid": 7, "started": "then"}))
    assert refusal() == (f"another fit is running this run (process 7 on elsewhere, since then; lock "
                         f"{tmp_path / LOCK_NAME}): wait for it to end or stop it; if no fit runs there any "
                         "more, delete the lock file and resume again")
