"""Hyper-parameters logged without LightningCLI's internal entries, and as MLflow holds them."""

from __future__ import annotations

from argparse import Namespace
from collections.abc import MutableMapping
from dataclasses import asdict, is_dataclass
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from fl_lightning.callbacks.run_identity import loggable_hparams

MLFLOW_PARAM_LENGTH = 250  # MLFlowLogger.log_hyperparams cuts every value to 250 characters


def flat_params(params: MutableMapping[Any, Any], parent: str = "") -> dict[str, Any]:
    """``{"partition_params": {"alpha": 0.5}}`` -> ``{"partition_params/alpha": 0.5}``: nested
    mappings (dataclasses and namespaces read as mappings, lists of mappings by index) become
    one ``/``-joined key per leaf, as Lightning's loggers flatten hyper-parameters."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{parent}/{key}" if parent else str(key)
        if is_dataclass(value) and not isinstance(value, type):
            value = asdict(value)
        elif isinstance(value, Namespace):
            value = vars(value)
        if isinstance(value, MutableMapping):
            flat.update(flat_params(value, name))
        elif isinstance(value, list) and all(isinstance(item, MutableMapping) for item in value):
            for i, item in enumerate(value):  # an empty list adds no key, as in Lightning
                flat.update(flat_params(item, f"{name}/{i}"))
        else:
            flat[name] = value
    return flat


def mlflow_params(hparams: MutableMapping[str, Any]) -> dict[str, str]:
    """The params ``MLFlowLogger.log_hyperparams(hparams)`` records: flattened, as text of at
    most 250 characters (what a run's ``data.params`` holds)."""
    return {key: str(value)[:MLFLOW_PARAM_LENGTH] for key, value in flat_params(hparams).items()}


class LogHyperparameters(Callback):
    """Logs what Lightning's own hyper-parameter logging would (the module's and the data
    module's), less LightningCLI's ``_instantiator`` and ``_class_path`` and with the
    partition's defaults filled in; for a trainer built with ``enable_autolog_hparams=False``
    (the CLI's default). With Lightning's logging on, it leaves the logging to Lightning."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.enable_autolog_hparams or not trainer.is_global_zero:
            return
        hparams = loggable_hparams(pl_module, getattr(trainer, "datamodule", None))
        for logger in trainer.loggers:
            logger.log_hyperparams(hparams)
