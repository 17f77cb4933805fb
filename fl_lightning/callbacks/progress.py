"""A progress bar over communication rounds (one Lightning epoch = one round)."""

from __future__ import annotations

import sys
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ProgressBar
from tqdm.auto import tqdm

_SHOWN = {"test_acc_mean_now": "mean acc", "global_test_acc_now": "global acc", "train_loss": "loss"}


class RoundProgressBar(ProgressBar):
    """One bar for the whole fit: rounds done / num_rounds, with the live mean client accuracy."""

    def __init__(self) -> None:
        super().__init__()
        self._enabled = True
        self._bar: Any = None

    def disable(self) -> None:
        self._enabled = False

    def enable(self) -> None:
        self._enabled = True

    @property
    def is_enabled(self) -> bool:
        return self._enabled

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._bar = tqdm(
            total=trainer.max_epochs,
            initial=trainer.current_epoch,
            desc="rounds",
            unit="round",
            disable=not self.is_enabled,
            dynamic_ncols=True,
            file=sys.stdout,
        )

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._bar is None:
            return
        metrics = trainer.progress_bar_metrics | {
            k: v for k, v in trainer.callback_metrics.items() if k == "train_loss"
        }
        shown = {label: f"{float(metrics[key]):.4f}" for key, label in _SHOWN.items() if key in metrics}
        self._bar.set_postfix(shown, refresh=False)
        self._bar.update(1)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """A stopped or failed fit ends its bar too, so that what it prints next starts a line."""
        self.on_train_end(trainer, pl_module)
