"""Hyper-parameters logged without LightningCLI's internal entries."""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from fl_lightning.callbacks.run_identity import loggable_hparams


class LogHyperparameters(Callback):
    """Logs what Lightning's own hyper-parameter logging would (the module's and the data
    module's), less LightningCLI's ``_instantiator`` and ``_class_path`` and with the
    partition's defaults filled in; for a trainer built with ``enable_autolog_hparams=False``
    (the CLI's default). With Lightning's logging on, it leaves the logging to Lightning."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.enable_autolog_hparams or not trainer.is_global_zero:
            return
        hparams = loggable_hparams(pl_module, trainer.datamodule)
        for logger in trainer.loggers:
            logger.log_hyperparams(hparams)
