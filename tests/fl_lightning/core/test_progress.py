"""A Trainer script prints what the CLI prints: the round progress bar in place of Lightning's
per-epoch one, no model table, no deprecation warning and the CLI's closing line; a bar or
summary the user chose, or none, is left alone."""

import os
import re
import subprocess
import sys

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import ModelSummary, ProgressBar, TQDMProgressBar

from fl_lightning.algorithms import FedAvg
from fl_lightning.callbacks.fit_report import FitReport
from fl_lightning.core.progress import FitSummary, NoModelSummary, RoundProgressBar
from fl_lightning.data.datamodule import FederatedDataModule


def fit(**trainer_kwargs):
    data = FederatedDataModule(source="digits", num_clients=6, partition="iid", test_mode="local", seed=1)
    module = FedAvg(backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8), num_rounds=4, fraction=0.5,
                    seed=1, lr=0.1, eval_every=2)
    trainer = pl.Trainer(**{"logger": False, "enable_checkpointing": False, "enable_model_summary": False,
                            **trainer_kwargs})
    trainer.fit(module, datamodule=data)
    return trainer


def test_the_default_bar_becomes_one_bar_over_the_rounds(capsys):
    trainer = fit()
    bars = [c for c in trainer.callbacks if isinstance(c, TQDMProgressBar)]
    assert len(bars) == 1 and type(bars[0]) is RoundProgressBar and trainer.progress_bar_callback is bars[0]
    out = capsys.readouterr()
    assert "4/4" in out.out and "round" in out.out and "mean acc" in out.out
    assert "Epoch" not in out.out + out.err  # no per-epoch bar
    mean = 100 * float(trainer.callback_metrics["test_acc_mean"])
    assert out.out.splitlines()[-1].startswith(f"Done: 4 rounds, mean client accuracy {mean:.2f}%, worst 10% ")


class MyTqdm(TQDMProgressBar):
    pass


class MyBar(ProgressBar):
    pass


@pytest.mark.parametrize("kind", [MyTqdm, MyBar])
def test_a_bar_the_user_chose_is_kept(kind):
    """Another class than Lightning's default (a plain ``TQDMProgressBar`` is taken as the default)."""
    bar = kind()
    trainer = fit(callbacks=[bar])
    assert trainer.progress_bar_callback is bar
    assert not any(isinstance(c, (RoundProgressBar, FitSummary)) for c in trainer.callbacks)


def test_no_bar_when_the_trainer_has_none():
    trainer = fit(enable_progress_bar=False)
    assert trainer.progress_bar_callback is None


def test_a_notice_printed_during_the_fit_is_not_lost(capsys):
    data = FederatedDataModule(source="digits", num_clients=3, partition="iid", test_mode="local", seed=1)
    module = FedAvg(backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8), num_rounds=2, fraction=0.1, seed=1,
                    lr=0.1, eval_every=1)
    pl.Trainer(logger=False, enable_checkpointing=False, enable_model_summary=False).fit(module, datamodule=data)
    assert "fraction 0.1 of 3 clients is 1 client a round" in capsys.readouterr().out


def test_the_default_model_table_becomes_none_and_a_chosen_summary_is_kept():
    assert [type(c) for c in fit(enable_model_summary=True).callbacks if isinstance(c, ModelSummary)] == [
        NoModelSummary
    ]

    class MySummary(ModelSummary):
        pass

    mine = MySummary(max_depth=2)
    assert [c for c in fit(callbacks=[mine]).callbacks if isinstance(c, ModelSummary)] == [mine]


def test_a_trainer_with_the_cli_report_gets_no_second_closing_line():
    report = FitReport([])
    trainer = fit(callbacks=[report])
    assert [c for c in trainer.callbacks if isinstance(c, FitSummary)] == [report]


SCRIPT = """
import lightning.pytorch as pl
from fl_lightning.algorithms import FedAvg
from fl_lightning.data.datamodule import FederatedDataModule

data = FederatedDataModule(source="digits", num_clients=6, partition="iid", test_mode="local", seed=1)
module = FedAvg(backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8), num_rounds=3, fraction=0.5, seed=1,
                lr=0.1, eval_every=1)
pl.Trainer(max_epochs=3, logger=False, enable_checkpointing=False).fit(module, datamodule=data)
"""
# what Lightning itself says, which no module setting changes: its Trainer's device lines and
# litlogger tip (printed when the Trainer is made, before any module is seen), the override of
# the Trainer's default callbacks, and the end of the fit
LIGHTNING_LINES = ("GPU available: ", "TPU available: ", "\N{ELECTRIC LIGHT BULB} Tip: For seamless cloud logging",
                   "The following callbacks returned in `LightningModule.configure_callbacks` will override "
                   "existing callbacks passed to Trainer: ModelSummary, TQDMProgressBar",
                   "`Trainer.fit` stopped: `max_epochs=3` reached.")


@pytest.mark.slow
def test_a_trainer_script_prints_the_rounds_bar_and_one_closing_line(tmp_path):
    """A plain Trainer (default bar and model summary) run as a script, as a user runs the
    README's: besides Lightning's own lines, only the rounds bar and the CLI's closing line; no
    per-epoch bar, model table or deprecation warning."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    lines = [line for line in re.split(r"[\r\n]", done.stdout + done.stderr) if line.strip()]
    bar = [line for line in lines if line.startswith("rounds: ")]
    ours = [line for line in lines if line not in bar and not line.startswith(LIGHTNING_LINES)]
    assert bar and bar[-1].startswith("rounds: 100%") and "3/3" in bar[-1]
    assert len(ours) == 1 and re.fullmatch(r"Done: 3 rounds, mean client accuracy \d+\.\d\d%, worst 10% \d+\.\d\d%",
                                           ours[0]), ours
    assert list(tmp_path.iterdir()) == []
