"""One seed per run through the CLI: --seed_everything N decides every random stream, a
component's own seed wins, and the logged seed is the seed used."""

import mlflow
import pytest

from fl_lightning.cli import main
from fl_lightning.seeding import SEED_ENV, run_seed

pytestmark = pytest.mark.integration


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(SEED_ENV, raising=False)  # seed_everything of an earlier in-process fit
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def fit(store, *extra) -> dict:
    """A tiny fit; its run's seed tags and params and its final metrics."""
    main(["fit", f"--trainer.logger.init_args.tracking_uri={store}", "--model.num_rounds=3",
          "--model.eval_every=3", "--data.num_clients=20", "--model.fraction=0.3",
          "--trainer.enable_checkpointing=false", *extra])
    runs = mlflow.search_runs(experiment_names=["fl-lightning"], order_by=["attributes.start_time DESC"])
    run = runs.iloc[0]
    return {"seed": run["tags.seed"], "model_seed": run["params.seed"], "data_seed": run["params.data_seed"],
            "acc": run["metrics.test_acc_mean"], "loss": run["metrics.test_loss_mean"]}


def test_seed_everything_decides_the_run(store, one_thread):
    first = fit(store, "--seed_everything=1")
    again = fit(store, "--seed_everything=1")
    other = fit(store, "--seed_everything=2")
    assert first == again  # one seed: the same run, bit for bit
    assert first["seed"] == first["model_seed"] == first["data_seed"] == "1"
    assert other["seed"] == "2" and (other["acc"], other["loss"]) != (first["acc"], first["loss"])


@pytest.mark.parametrize("component", ["model", "data"])
def test_a_component_seed_alone_works_and_wins(store, one_thread, component):
    run = fit(store, "--seed_everything=0", f"--{component}.seed=5")
    assert run[f"{component}_seed"] == "5"
    assert run["data_seed" if component == "model" else "model_seed"] == "0"
    baseline = fit(store, "--seed_everything=0")
    assert (run["acc"], run["loss"]) != (baseline["acc"], baseline["loss"])


def test_run_seed_without_seed_everything_is_zero(monkeypatch):
    monkeypatch.delenv(SEED_ENV, raising=False)
    assert run_seed(None) == 0 and run_seed(7) == 7
    monkeypatch.setenv(SEED_ENV, "3")
    assert run_seed(None) == 3 and run_seed(7) == 7
    with pytest.raises(ValueError, match="model.seed must be an integer"):
        run_seed(-1, "model.seed")


def test_a_fit_leaves_no_seed_behind_for_the_next_fit_in_the_process(store):
    """A CLI fit with seed 2 and then a Trainer-script module without a seed: the module's seed is
    the documented default 0, not the earlier fit's 2 (seed_everything's environment put back)."""
    from fl_lightning.algorithms import FedAvg

    fit(store, "--seed_everything=2")
    assert SEED_ENV not in __import__("os").environ
    assert FedAvg(backbone="fl_logreg", input_shape=(64,)).hparams.seed == 0
