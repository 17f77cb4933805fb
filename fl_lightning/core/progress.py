"""A progress bar over communication rounds (one Lightning epoch = one round).

A ``TQDMProgressBar`` in type, so that a ``FederatedModule`` can return it from
``configure_callbacks`` and Lightning puts it in place of a Trainer's default bar (a callback
the module returns replaces the Trainer's of the same class or a parent class); in behaviour one
bar for the whole fit instead of a bar per epoch and per validation.
"""

from __future__ import annotations

import sys
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import TQDMProgressBar
from tqdm.auto import tqdm

_SHOWN = {"test_acc_mean_now": "mean acc", "global_test_acc_now": "global acc", "train_loss": "loss"}


class RoundProgressBar(TQDMProgressBar):
    """One bar for the whole fit: rounds done / num_rounds, with the live mean client accuracy,
    and ``note`` when one is set (e.g. "tracking server unreachable, retrying (3 rounds held)")."""

    def __init__(self) -> None:
        super().__init__()
        self._bar: Any = None
        self.note: str | None = None

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
        if self.note:
            shown["note"] = self.note
        self._bar.set_postfix(shown, refresh=False)
        self._bar.update(1)
        if self._bar.n >= (self._bar.total or float("inf")):  # the last round: done before Lightning says so
            self.on_train_end(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """A stopped or failed fit ends its bar too, so that what it prints next starts a line."""
        self.on_train_end(trainer, pl_module)

    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        """``LightningModule.print``: above the bar while it runs, a plain line otherwise."""
        if self._bar is not None:
            self._bar.write(sep.join(map(str, args)), file=sys.stdout)
        else:
            print(*args, sep=sep, **kwargs)

    # TQDMProgressBar's own bars (a bar per epoch, sanity check, validation, test, predict): none
    def _nothing(self, *args: Any, **kwargs: Any) -> None:
        return None

    on_sanity_check_start = on_sanity_check_end = _nothing
    on_train_epoch_start = on_train_batch_end = _nothing
    on_validation_start = on_validation_batch_start = on_validation_batch_end = on_validation_end = _nothing
    on_test_start = on_test_batch_start = on_test_batch_end = on_test_end = _nothing
    on_predict_start = on_predict_batch_start = on_predict_batch_end = on_predict_end = _nothing
