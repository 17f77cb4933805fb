"""Callbacks: the rounds progress bar, MLflow run tags/inputs/artifacts, clean hyper-parameters,
what a command-line fit reports (resume command, MLflow UI links)."""

from fl_lightning.callbacks.fit_report import FitReport
from fl_lightning.callbacks.hparams import LogHyperparameters
from fl_lightning.callbacks.mlflow_run import MLflowRunInfo
from fl_lightning.core.progress import RoundProgressBar

__all__ = ["FitReport", "LogHyperparameters", "MLflowRunInfo", "RoundProgressBar"]
