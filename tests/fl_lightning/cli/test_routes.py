"""Issue 33: one configuration and seed, the same bits whatever the route: the CLI, a Trainer
script, or the benchmark runner at --jobs 1 and --jobs 2 (which divides the cores among its
workers, a count that must not reach the numbers)."""

from __future__ import annotations

import mlflow
import pytest
import torch
import yaml

from fl_lightning.algorithms import FedAvg
from fl_lightning.data.datamodule import FederatedDataModule
from tests import builders
from tests.call_logger import CallLogger

pytestmark = pytest.mark.integration

SEEDS = (3, 4)
# the main job's data and model (mnist5k, the 784-200-200-10 MLP): shapes on which MKL rounds
# differently at 1 and 2 threads
# (threads: one count for every route; "auto" would resolve to each route's share of the cores,
# a logged setting of its own: see test_the_runner_gives_each_job_its_share_of_the_cores)
MODEL = {"backbone": "fl_mlp", "num_rounds": 4, "eval_every": 2, "fraction": 0.5, "batch_size": 10, "lr": 0.05,
         "local_epochs": 1, "threads": 1}
DATA = {"source": "mnist5k", "num_clients": 20, "partition": "dirichlet", "test_mode": "local",
        "local_test_fraction": 0.2}
TIMES = ("client_time_s", "server_time_s")
# what differs by route and is not a number of the run: progress, bookkeeping, timing
NOT_NUMBERS = (*TIMES, "epoch")


def histories_of_store(uri: str, experiment: str) -> dict[int, dict[str, list[tuple[int, float]]]]:
    client = mlflow.tracking.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    out = {}
    for run in runs:
        assert run.info.status == "FINISHED"
        seed = int(run.data.tags.get("seed") or run.data.params["seed"])
        out[seed] = {key: sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
                     for key in run.data.metrics if key not in NOT_NUMBERS}
    return out


def histories_of_trainer_script(seed: int) -> dict[str, list[tuple[int, float]]]:
    data = FederatedDataModule(**DATA, seed=seed)
    logger = CallLogger()
    module = FedAvg(**MODEL, seed=seed, num_classes=10, input_shape=(1, 28, 28))
    builders.fit(module, data, logger=logger, max_epochs=MODEL["num_rounds"])
    history: dict[str, list[tuple[int, float]]] = {}
    for step, metrics in logger.calls:
        for key, value in metrics.items():
            if key not in NOT_NUMBERS:
                history.setdefault(key, []).append((step, float(torch.tensor(value, dtype=torch.float32))))
    return {key: sorted(values) for key, values in history.items()}


def common(first: dict, second: dict) -> list[str]:
    """The metrics both routes log, each of which must agree."""
    keys = sorted(set(first) & set(second))
    assert {"train_loss", "test_acc_mean", "server_step_norm"} <= set(keys)
    return keys


def test_cli_trainer_script_and_runner_at_one_and_two_jobs_give_the_same_bits(tmp_path, monkeypatch):
    from benchmarks.command_line import main as run_suite
    from fl_lightning.cli import main as cli

    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(2)  # the process's own count: never the run's
    suite = {"suite": "routes-offline", "paper": "fedfv", "scale": "offline", "description": "routes",
             "seeds": list(SEEDS),
             "base": {"trainer": {"enable_checkpointing": False}, "model": {"init_args": MODEL}, "data": DATA},
             "benchmarks": [{"name": "mnist5k/dirichlet/p0.5/fl_mlp"}],
             "algorithms": [{"class_path": "fl_lightning.algorithms.FedAvg"}]}
    path = tmp_path / "routes.yaml"
    path.write_text(yaml.safe_dump(suite))
    stores = {}
    for jobs in (1, 2):
        uri = f"sqlite:///{tmp_path / f'jobs{jobs}.db'}"
        assert run_suite(["run", str(path), "--tracking-uri", uri, "--jobs", str(jobs)]) == 0
        stores[jobs] = histories_of_store(uri, "routes-offline")
    cli_uri = f"sqlite:///{tmp_path / 'cli.db'}"
    for seed in SEEDS:
        args = [f"--model.{k}={v}" for k, v in MODEL.items()] + [f"--data.{k}={v}" for k, v in DATA.items()]
        cli(["fit", f"--seed_everything={seed}", f"--trainer.logger.init_args.tracking_uri={cli_uri}",
             "--trainer.enable_checkpointing=false", *args])
    from_cli = histories_of_store(cli_uri, "fl-lightning")
    assert torch.get_num_threads() == 2  # every fit put the process's count back

    for seed in SEEDS:
        runner_1, runner_2, by_cli = stores[1][seed], stores[2][seed], from_cli[seed]
        assert runner_1 == runner_2, seed  # --jobs 1 and --jobs 2: every metric of every round
        for key in common(runner_1, by_cli):
            assert runner_1[key] == by_cli[key], (seed, key)
        script = histories_of_trainer_script(seed)
        for key in common(runner_1, script):
            assert runner_1[key] == script[key], (seed, key)


def test_the_runner_gives_each_job_its_share_of_the_cores(tmp_path, monkeypatch):
    """threads "auto" (the default) resolves in each worker to cores // --jobs, and is logged as that number."""
    from benchmarks.command_line import main as run_suite
    from fl_lightning.records.machine import available_cores

    monkeypatch.chdir(tmp_path)
    model = {"backbone": "fl_logreg", "num_rounds": 1, "eval_every": 1, "fraction": 0.5, "batch_size": 10}
    suite = {"suite": "share-offline", "paper": "fedfv", "scale": "offline", "description": "share", "seeds": [3],
             "base": {"trainer": {"enable_checkpointing": False}, "model": {"init_args": model},
                      "data": {"source": "synthetic", "num_clients": 10}},
             "benchmarks": [{"name": "synthetic/natural/p0.5/fl_logreg"}],
             "algorithms": [{"class_path": "fl_lightning.algorithms.FedAvg"}]}
    path = tmp_path / "share.yaml"
    path.write_text(yaml.safe_dump(suite))
    for jobs in (1, 2):
        uri = f"sqlite:///{tmp_path / f'jobs{jobs}.db'}"
        assert run_suite(["run", str(path), "--tracking-uri", uri, "--jobs", str(jobs)]) == 0
        client = mlflow.tracking.MlflowClient(uri)
        [run] = client.search_runs([client.get_experiment_by_name("share-offline").experiment_id])
        assert run.data.params["threads"] == str(max(1, available_cores() // jobs)), jobs
