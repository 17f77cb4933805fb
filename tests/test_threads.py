"""Issue 24: fits that share a machine share its cores (``fl_lightning.threads``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from fl_lightning.running_fits import RunningFits, announce_fit
from fl_lightning.threads import (
    CPUThreads,
    available_cores,
    fixed_threads,
    parse_threads,
)


def test_a_thread_setting_is_auto_or_a_positive_integer():
    assert parse_threads("auto") is None and parse_threads(None) is None
    assert parse_threads("3") == 3 and parse_threads(2) == 2
    for bad in ("two", "0", "-1", "1.5", ""):
        with pytest.raises(ValueError, match="threads must be 'auto' or an integer >= 1"):
            parse_threads(bad)


def test_the_environment_fixes_the_count_unless_the_setting_does(monkeypatch):
    monkeypatch.setenv("FL_LIGHTNING_THREADS", "3")
    assert fixed_threads("auto") == 3 and fixed_threads("2") == 2
    monkeypatch.delenv("FL_LIGHTNING_THREADS")
    assert fixed_threads("auto") is None


def test_running_fits_count_live_processes_and_forget_dead_ones(tmp_path):
    fits = RunningFits(tmp_path)
    fits.join()
    assert fits.count() == 1
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    try:
        (tmp_path / str(sleeper.pid)).touch()
        (tmp_path / dead.stdout.strip()).touch()  # a fit that died without leaving
        assert fits.count() == 2
        assert not (tmp_path / dead.stdout.strip()).exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert fits.count() == 1
    fits.leave()
    assert not fits.entry.exists()


def test_auto_shares_the_cores_among_running_fits_and_restores_the_count(tmp_path, monkeypatch):
    monkeypatch.delenv("FL_LIGHTNING_THREADS", raising=False)
    monkeypatch.setattr("fl_lightning.threads.available_cores", lambda: 4)
    before = torch.get_num_threads()
    callback = CPUThreads("auto", folder=tmp_path)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        callback.setup(None, None, "fit")
        assert torch.get_num_threads() == 4  # alone: every core
        (tmp_path / str(sleeper.pid)).touch()  # a second fit starts
        callback.on_train_epoch_start(None, None)
        assert torch.get_num_threads() == 2  # the share, from the next round on
    finally:
        sleeper.kill()
        sleeper.wait()
    callback.on_train_epoch_start(None, None)
    assert torch.get_num_threads() == 4  # it ended: the cores come back
    callback.teardown(None, None, "fit")
    assert torch.get_num_threads() == before and not any(tmp_path.iterdir())


def test_a_fixed_count_is_used_as_given(tmp_path):
    before = torch.get_num_threads()
    announce_fit(tmp_path)  # as the CLI does before it knows the setting
    callback = CPUThreads("1", folder=tmp_path)
    callback.setup(None, None, "fit")
    assert torch.get_num_threads() == 1 and not any(tmp_path.iterdir())  # a fixed count takes no share
    callback.teardown(None, None, "fit")
    assert torch.get_num_threads() == before


def test_available_cores_follow_the_affinity():
    if hasattr(os, "sched_getaffinity"):
        assert available_cores() == len(os.sched_getaffinity(0))
    assert available_cores() >= 1


def test_a_fit_counts_among_the_running_fits_from_its_start_and_leaves_at_its_end(tmp_path, monkeypatch):
    """A second fit that is still parsing (seconds of imports and parsing before its first round)
    already counts for a fit that is running; it leaves when ``run`` returns, refused or not."""
    from fl_lightning import lightning_cli

    monkeypatch.setenv("FL_LIGHTNING_CACHE", str(tmp_path))
    seen = []

    def parsing(*args, **kwargs):
        seen.append(sorted(path.name for path in (tmp_path / "running-fits").iterdir()))
        raise SystemExit(2)  # refused while parsing

    monkeypatch.setattr(lightning_cli, "FederatedCLI", parsing)
    with pytest.raises(SystemExit):
        lightning_cli.run(["fit", "--model.lr", "-1"])
    assert seen == [[str(os.getpid())]]
    assert not any((tmp_path / "running-fits").iterdir())
