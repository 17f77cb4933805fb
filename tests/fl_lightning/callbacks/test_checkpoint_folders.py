"""Every printed checkpoint path is the file written, and a run's checkpoints stay in one folder:
fits without a logger get a folder each, a resume keeps writing where it resumed from, and two
fits started at the same moment in one folder and store collide in nothing."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from fl_lightning.cli import main
from tests.fl_lightning.cli.test_resume_cli import ROUNDS, fit_args
from tests.paths import REPO
from tests.printed import printed_line, words

ROOT = REPO
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]


def printed_checkpoint(out: str) -> Path:
    return Path(printed_line(out, "Checkpoint:"))


def test_fits_without_a_logger_each_write_the_checkpoint_they_print(store, tmp_path, capsys):
    printed = []
    for _ in range(2):
        main(fit_args(store, "--trainer.logger=false"))
        printed.append(printed_checkpoint(capsys.readouterr().out))
    assert printed[0] != printed[1] and all(path.name == "last.ckpt" and path.is_file() for path in printed)
    assert sorted(tmp_path.rglob("*.ckpt")) == sorted(printed)  # no last-v1.ckpt
    assert torch.load(printed[0], weights_only=True)["epoch"] == ROUNDS - 1


def test_a_resume_started_elsewhere_writes_into_the_runs_own_folder(store, tmp_path, capsys, monkeypatch):
    main(fit_args(store))
    first = printed_checkpoint(capsys.readouterr().out)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    main(fit_args(store, "--model.num_rounds=6", "--ckpt_path", str(first)))
    out = capsys.readouterr().out
    assert printed_checkpoint(out) == first.resolve()
    assert not (elsewhere / "checkpoints").exists()
    assert torch.load(first, weights_only=True)["epoch"] == 5
    client = MlflowClient(store)
    [run] = client.search_runs([client.get_experiment_by_name("fl-lightning").experiment_id])
    assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train_loss")) == list(range(1, 7))


def test_two_fits_started_together_in_one_folder_and_store_collide_in_nothing(tmp_path):
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": uri}
    fits = [subprocess.Popen([sys.executable, "-m", "fl_lightning.cli", *fit_args(uri, f"--seed_everything={seed}")],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for seed in (1, 2)]
    outs = [fit.communicate(timeout=300) for fit in fits]
    assert [fit.returncode for fit in fits] == [0, 0], [err[-2000:] for _, err in outs]
    printed = [printed_checkpoint(out) for out, _ in outs]
    assert printed[0] != printed[1] and all(path.is_file() for path in printed)
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("fl-lightning").experiment_id])
    assert len(runs) == 2 and {run.info.status for run in runs} == {"FINISHED"}
    for run in runs:
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, "train_loss")) == list(
            range(1, ROUNDS + 1))
        assert any(run.info.run_id in str(path) for path in printed)
    assert sorted(words(printed_line(out, "resume it with:"))[1][-1] for out, _ in outs) == sorted(map(str, printed))


def test_a_round_checkpoint_given_on_the_command_line_keeps_its_own_defaults(store, tmp_path, capsys):
    """LightningCLI fills a callback's **kwargs with ModelCheckpoint's defaults (save_last None,
    save_top_k 1): a RoundCheckpoint given with --trainer.callbacks must still write last.ckpt,
    at the interval asked for, in the run's folder, and nothing else."""
    main(fit_args(store, "--trainer.callbacks+=fl_lightning.callbacks.checkpointing.RoundCheckpoint",
                  "--trainer.callbacks.every_n_rounds", "2"))
    printed = printed_checkpoint(capsys.readouterr().out)
    assert printed.name == "last.ckpt" and printed.is_file()
    assert sorted(tmp_path.rglob("*.ckpt")) == [printed]
    state = torch.load(printed, weights_only=False)
    assert state["epoch"] == ROUNDS - 1
    (callback,) = [value for key, value in state["callbacks"].items() if "ModelCheckpoint" in key]
    assert str(printed.parent).endswith(callback["dirpath"])  # stored relative to the fit's folder
