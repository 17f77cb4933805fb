"""A runner's claim on a cell (``try_claim`` / ``release_claim``): the file it writes, and the races
around a claim taken over from a process that is gone (another runner removing the file first)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from fl_lightning.records import fit_lock
from fl_lightning.records.fit_lock import read_lock, release_claim, this_host, try_claim


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
