"""The MLflow side of a command-line fit, through public APIs: params compared as MLflow holds
them, the loggers a fit gets (new runs named, a checkpoint's run continued or, when its params
changed, left for a new run) and a continued run that does not log a step twice.

Each test works on a temporary SQLite store and small stand-ins; no fit runs here (the
end-to-end resume is ``test_resume_cli.py``)."""

from argparse import Namespace as ArgparseNamespace
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from jsonargparse import Namespace
from lightning.pytorch.loggers import MLFlowLogger
from mlflow.tracking import MlflowClient

from fl_lightning.algorithms import FedAvg
from fl_lightning.callbacks.fit_runs import (
    AccuracyChartsFirst,
    ContinuedRunLogger,
    MLflowFitSetup,
    continued_run_class,
)
from fl_lightning.callbacks.hparams import mlflow_params
from fl_lightning.callbacks.mlflow_run import CHECKPOINT_KEY
from fl_lightning.data.datamodule import FederatedDataModule


@pytest.fixture()
def uri(tmp_path):
    return f"sqlite:///{tmp_path / 'runs.db'}"


@dataclass
class Schedule:
    warmup: int = 5
    decay: float = 0.5


def test_mlflow_params_are_what_mlflow_logger_records(uri):
    hparams = {
        "lr": 0.1, "seed": None, "flag": True, "shape": (1, 8, 8), "sizes": [1, 2, 3], "empty": [], "none": {},
        "partition_params": {"alpha": 0.5, "nested": {"deep": 1}}, "layers": [{"width": 4}, {"width": 8}],
        "schedule": Schedule(), "space": ArgparseNamespace(kind="grid", points=3), 7: "int key",
        "text": "x" * 300,
    }
    logger = MLFlowLogger(tracking_uri=uri, experiment_name="params")
    logger.log_hyperparams(dict(hparams))
    recorded = MlflowClient(uri).get_run(logger.run_id).data.params
    assert mlflow_params(hparams) == recorded


def new_run_setup(uri, ckpt_path=None, *, other_loggers=None, **init_args):
    """MLflowFitSetup for a parsed config whose ``trainer.logger`` is one MLFlowLogger (with
    ``other_loggers``: a list of it and those)."""
    args = {"experiment_name": "fl-lightning", "run_name": None, "tracking_uri": uri, "tags": None,
            "save_dir": "./mlruns", "log_model": False, "prefix": "", "artifact_location": None,
            "run_id": None, "synchronous": None} | init_args
    entry = Namespace(class_path="lightning.pytorch.loggers.MLFlowLogger", init_args=Namespace(**args))
    config = Namespace(trainer=Namespace(logger=entry if other_loggers is None else [entry, *other_loggers]))
    setup = MLflowFitSetup(config, ckpt_path)
    return setup, entry


def tiny_fit(num_clients=10):
    module = FedAvg(backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8), eval_every=1)
    return module, FederatedDataModule(source="digits", num_clients=num_clients, partition="iid", test_mode="local")


def run_of(logger):
    return MlflowClient(logger.experiment.tracking_uri).get_run(logger.run_id)


def test_new_runs_are_named_and_named_runs_keep_their_name(uri):
    module, data = tiny_fit()
    setup, entry = new_run_setup(uri)
    assert not Path(uri[len("sqlite:///"):]).exists()  # nothing is created before the data is built
    logger = setup.trainer_loggers(setup.held_back(entry), module, data)
    assert MlflowClient(uri).get_experiment_by_name("fl-lightning") is not None  # created with the logger
    assert isinstance(logger, AccuracyChartsFirst) and not isinstance(logger, ContinuedRunLogger)
    assert run_of(logger).info.run_name.startswith("FedAvg seed 0 | digits/iid | ")

    setup, entry = new_run_setup(uri, other_loggers=[False], run_name="my run")
    assert setup.held_back([entry, False]) == [None, False]  # LightningCLI builds no MLflow logger
    built, other = setup.trainer_loggers([None, False], module, data)
    assert isinstance(built, MLFlowLogger) and other is False
    assert run_of(built).info.run_name == "my run"


def checkpoint_of(tmp_path, run, rounds_completed=2):
    path = tmp_path / "last.ckpt"
    torch.save({CHECKPOINT_KEY: {"rounds_completed": rounds_completed, "round_metrics": None, "runs": [run]}}, path)
    return str(path)


def interrupted_run(uri, module, data):
    """A run as a fit killed in round 3 left it: params, metrics up to step 3."""
    logger = MLFlowLogger(tracking_uri=uri, experiment_name="fl-lightning", run_name="interrupted")
    from fl_lightning.callbacks.run_identity import loggable_hparams

    logger.log_hyperparams(loggable_hparams(module, data))
    for step in (1, 2, 3):
        logger.log_metrics({"test_acc_mean": step / 10}, step)
    return {"tracking_uri": uri, "experiment_id": logger.experiment_id, "run_id": logger.run_id}


def test_a_resume_continues_the_checkpoints_run_without_logging_a_step_twice(uri, tmp_path, capsys):
    module, data = tiny_fit()
    run = interrupted_run(uri, module, data)
    setup, entry = new_run_setup(uri, checkpoint_of(tmp_path, run))
    logger = setup.trainer_loggers(None, module, data)
    assert entry.init_args.run_id == run["run_id"]  # the saved config.yaml names the run
    assert f"continuing MLflow run {run['run_id']}" in capsys.readouterr().out
    assert isinstance(logger, ContinuedRunLogger) and logger.run_id == run["run_id"]
    assert logger.already_logged == {("test_acc_mean", 3)}
    logger.log_metrics({"test_acc_mean": 0.9, "train_loss": 1.0}, 3)
    logger.log_metrics({"test_acc_mean": 0.4}, 4)
    history = MlflowClient(uri).get_metric_history(run["run_id"], "test_acc_mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 0.4)]
    assert run_of(logger).info.run_name == "interrupted"


def test_a_resume_with_changed_params_logs_to_a_new_named_run(uri, tmp_path, capsys):
    module, data = tiny_fit()
    run = interrupted_run(uri, module, data)
    setup, entry = new_run_setup(uri, checkpoint_of(tmp_path, run))
    _, other_data = tiny_fit(num_clients=12)
    logger = setup.trainer_loggers(None, module, other_data)
    assert "num_clients 10 -> 12" in capsys.readouterr().out
    assert entry.init_args.run_id is None and logger.run_id != run["run_id"]
    assert run_of(logger).info.run_name.startswith("FedAvg seed 0 | digits/iid | ")


def test_a_resume_into_another_store_starts_a_new_run(uri, tmp_path, capsys):
    module, data = tiny_fit()
    run = interrupted_run(uri, module, data)
    other = f"sqlite:///{tmp_path / 'other.db'}"
    setup, entry = new_run_setup(other, checkpoint_of(tmp_path, run))
    assert "logs to a new run" in capsys.readouterr().out and entry.init_args.run_id is None
    logger = setup.trainer_loggers(None, module, data)
    assert logger.experiment.tracking_uri == other and logger.run_id != run["run_id"]


class TeamLogger(MLFlowLogger):
    """A user's own MLFlowLogger subclass."""

    def log_metrics(self, metrics, step=None):
        super().log_metrics({f"team/{k}": v for k, v in metrics.items()}, step)


def test_a_subclass_of_mlflow_logger_keeps_its_behaviour_when_it_continues_a_run(uri):
    cls = continued_run_class(TeamLogger)
    assert issubclass(cls, TeamLogger) and issubclass(cls, ContinuedRunLogger) and cls.__name__ == "TeamLogger"
    assert continued_run_class(MLFlowLogger) is ContinuedRunLogger
    logger = cls(tracking_uri=uri, already_logged={("loss", 1)})
    logger.log_metrics({"loss": 1.0, "acc": 0.5}, 1)
    assert set(MlflowClient(uri).get_run(logger.run_id).data.metrics) == {"team/acc"}


def test_fit_loggers_log_the_accuracy_charts_first_and_the_metrics_under_their_names(uri):
    module, data = tiny_fit()
    setup, entry = new_run_setup(uri)
    logger = setup.trainer_loggers(None, module, data)
    logger.log_metrics({"test_acc_mean": 0.5, "test_acc_worst10": 0.2, "conflicts_model": 1.0}, 1)
    logged = set(run_of(logger).data.metrics)
    assert logged == {"test_acc_mean", "test_acc_worst10", "conflicts_model",
                      "Accuracy and fairness/test_acc_mean", "Accuracy and fairness/test_acc_worst10"}
    experiment = MlflowClient(uri).get_experiment_by_name("fl-lightning")
    assert experiment.tags.get("mlflow.experimentKind") == "custom_model_development"
