"""Careless inputs a new user makes, through the console script as a user runs it: each is
refused with exit status 2 and one line that says what is wrong and what to do, no traceback,
and nothing created in the folder (no MLflow store, no checkpoint folder). The table of
issue 22, row by row; the SIGTERM row is ``test_extend_and_interrupt``'s signal test."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fl_lightning.cli import main
from tests.paths import REPO

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

TINY = ["--model.num_rounds=2", "--model.eval_every=1", "--model.backbone=fl_logreg", "--data.source=digits",
        "--data.num_clients=6", "--data.partition=iid", "--data.partition_params={}"]


def fl_lightning(*args: str, cwd: Path, timeout: float = 300) -> tuple[subprocess.CompletedProcess, float]:
    script = Path(sys.executable).parent / "fl-lightning"
    command = [str(script)] if script.is_file() else [sys.executable, "-m", "fl_lightning.cli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    done = subprocess.run([*command, "fit", *args], cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout)
    return done, time.monotonic() - started


def listing(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


def refused(*args: str, cwd: Path) -> tuple[str, float]:
    """The one error line of a refused fit (exit status 2, nothing created in ``cwd``) and its time."""
    before = listing(cwd)
    done, seconds = fl_lightning(*args, cwd=cwd)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    assert listing(cwd) == before, f"created: {sorted(set(listing(cwd)) - set(before))}"
    return lines[0], seconds


@pytest.fixture(scope="module")
def fedavg_checkpoint(tmp_path_factory) -> Path:
    """A finished 2-round FedAvg fit's last.ckpt (its own folder and store)."""
    folder = tmp_path_factory.mktemp("fedavg")
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        main(["fit", *TINY, f"--trainer.logger.init_args.tracking_uri=sqlite:///{folder / 'runs.db'}"])
    finally:
        os.chdir(cwd)
    return next(folder.rglob("last.ckpt"))


def test_resume_with_another_algorithm_is_refused(fedavg_checkpoint, tmp_path):
    line, _ = refused(*TINY, "--model.num_rounds=4", "--model", "FedFV", "--ckpt_path", str(fedavg_checkpoint),
                      cwd=tmp_path)
    assert "was written by FedAvg, not FedFV" in line and "--model FedAvg" in line


@pytest.mark.parametrize("model", [[], ["--model", "FedFV"]], ids=["default-algorithm", "given-algorithm"])
def test_trainer_max_epochs_is_refused_and_points_to_num_rounds(model, tmp_path):
    line, _ = refused(*model, "--trainer.max_epochs", "3", cwd=tmp_path)  # as a user types it
    assert "--model.num_rounds 3" in line


@pytest.mark.parametrize("change", [["--data.num_clients=5"], ["--data.partition=dirichlet"], ["--seed_everything=7"]],
                         ids=["num_clients", "partition", "seed"])
def test_resume_on_other_data_is_refused(change, fedavg_checkpoint, tmp_path):
    line, _ = refused(*TINY, "--model.num_rounds=4", *change, "--ckpt_path", str(fedavg_checkpoint), cwd=tmp_path)
    assert "was trained with other settings" in line and "leave --ckpt_path out" in line


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_a_store_folder_that_takes_no_files_is_refused_at_once(tmp_path):
    _, startup = refused(*TINY, "--trainer.max_epochs", "3", cwd=tmp_path)  # a refusal before any store: start-up
    line, seconds = refused(*TINY, "--trainer.logger.init_args.tracking_uri", "sqlite:////proc/m.db", cwd=tmp_path)
    assert "/proc takes no new files" in line
    assert seconds <= startup + 10, (seconds, startup)  # was: MLflow's retry loop, more than 11 minutes


def test_a_store_path_through_a_file_says_the_file_is_not_a_folder(tmp_path):
    (tmp_path / "README.md").write_text("a file")
    line, _ = refused(*TINY, "--trainer.logger.init_args.tracking_uri", "sqlite:///README.md/m.db", cwd=tmp_path)
    assert "README.md is a file, not a folder" in line


def test_a_refused_partition_creates_no_store(tmp_path):
    line, _ = refused(*TINY, "--data.num_clients=100000", cwd=tmp_path)  # refused once the data is built
    assert "cannot build 100000 clients" in line


def test_a_yaml_error_names_the_file_and_line(tmp_path):
    (tmp_path / "run.yaml").write_text("model:\n  init_args:\n    lr: [0.1, 0.2\n")
    line, _ = refused("--config", "run.yaml", cwd=tmp_path)
    assert line.startswith("error: --config run.yaml, line 4") and "not valid YAML" in line


def test_an_unknown_suite_is_one_error_line(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "run", "fedfv/ofline"],
        cwd=tmp_path,
        text=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: unknown suite 'fedfv/ofline'"), done.stderr
    assert listing(tmp_path) == []
