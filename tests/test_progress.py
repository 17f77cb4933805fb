"""A Trainer script gets the CLI's round progress bar in place of Lightning's per-epoch one; a bar
the user chose, or none, is left alone."""

import lightning.pytorch as pl
import pytest
from lightning.pytorch.callbacks import ProgressBar, TQDMProgressBar

from fl_lightning.algorithms import FedAvg
from fl_lightning.core.progress import RoundProgressBar
from fl_lightning.data.datamodule import FederatedDataModule


def fit(**trainer_kwargs):
    data = FederatedDataModule(source="digits", num_clients=6, partition="iid", seed=1)
    module = FedAvg(backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8), num_rounds=4, fraction=0.5,
                    seed=1, eval_every=2)
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_model_summary=False, **trainer_kwargs)
    trainer.fit(module, datamodule=data)
    return trainer


def test_the_default_bar_becomes_one_bar_over_the_rounds(capsys):
    trainer = fit()
    bars = [c for c in trainer.callbacks if isinstance(c, TQDMProgressBar)]
    assert len(bars) == 1 and type(bars[0]) is RoundProgressBar and trainer.progress_bar_callback is bars[0]
    out = capsys.readouterr()
    assert "4/4" in out.out and "round" in out.out and "mean acc" in out.out
    assert "Epoch" not in out.out + out.err  # no per-epoch bar


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
    assert not any(isinstance(c, RoundProgressBar) for c in trainer.callbacks)


def test_no_bar_when_the_trainer_has_none():
    trainer = fit(enable_progress_bar=False)
    assert trainer.progress_bar_callback is None


def test_a_notice_printed_during_the_fit_is_not_lost(capsys):
    data = FederatedDataModule(source="digits", num_clients=3, partition="iid", seed=1)
    module = FedAvg(backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8), num_rounds=2, fraction=0.1, seed=1)
    pl.Trainer(logger=False, enable_checkpointing=False, enable_model_summary=False).fit(module, datamodule=data)
    assert "fraction 0.1 of 3 clients is 1 client a round" in capsys.readouterr().out
