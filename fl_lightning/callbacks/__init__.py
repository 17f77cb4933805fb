"""Callbacks: the rounds progress bar, MLflow run tags/inputs/artifacts, clean hyper-parameters."""

from fl_lightning.callbacks.hparams import LogHyperparameters
from fl_lightning.callbacks.mlflow_run import MLflowRunInfo
from fl_lightning.callbacks.progress import RoundProgressBar

__all__ = ["LogHyperparameters", "MLflowRunInfo", "RoundProgressBar"]
