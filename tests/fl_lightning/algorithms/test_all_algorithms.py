"""Every registered algorithm runs a short fit end to end through the CLI, and its run lands in MLflow."""

import inspect
import math

import mlflow
import pytest

from fl_lightning.algorithms import ALGORITHMS
from fl_lightning.cli import main
from fl_lightning.core.module import FederatedModule

pytestmark = pytest.mark.integration

FULL_PARTICIPATION = {"AFL", "CGSV", "Standalone", "DW", "RR", "EU", "CFFL", "ECI"}


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_short_cli_fit(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    fraction = 1.0 if name in FULL_PARTICIPATION else 0.5
    main([
        "fit", f"--model={name}", f"--trainer.logger.init_args.tracking_uri={uri}",
        "--model.num_rounds=2", "--model.eval_every=1", f"--model.fraction={fraction}",
        "--model.backbone=fl_logreg", "--model.batch_size=16", "--model.lr=0.05",
        "--data.source=digits", "--data.num_clients=6", "--data.partition=iid", "--data.partition_params={}",
        "--trainer.enable_checkpointing=false",
    ])
    runs = mlflow.search_runs(experiment_names=["fl-lightning"])
    assert len(runs) == 1
    run = runs.iloc[0]
    assert run["status"] == "FINISHED" and run["tags.algorithm"] == name
    accuracy = run["metrics.test_acc_mean"]
    assert 0.0 <= accuracy <= 1.0 and math.isfinite(run["metrics.train_loss"])
    assert run["metrics.round"] == 2
    # The algorithm's own hyper-parameters keep their defaults when --model switches away
    # from the default config's FedAvg (jsonargparse carries over same-named init args).
    base = set(inspect.signature(FederatedModule.__init__).parameters) | {"fraction"}
    defaults = {}  # the most derived class's default of every own hyper-parameter
    for cls in ALGORITHMS[name].__mro__:
        if cls is FederatedModule or "__init__" not in vars(cls):
            continue
        for param in inspect.signature(cls.__init__).parameters.values():
            if param.name not in base and param.default is not inspect.Parameter.empty:
                defaults.setdefault(param.name, param.default)
    for param_name, default in defaults.items():
        assert run[f"params.{param_name}"] == str(default), param_name
