"""Issue 33: ``fl-lightning replay`` fits a stored run again from its logged settings and checks
every number of every round."""

from __future__ import annotations

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from fl_lightning.cli import main as cli
from fl_lightning.cli.replay import RESULT_TAG, first_divergence
from fl_lightning.cli.replay import main as replay

pytestmark = pytest.mark.integration

COMMON = ["--trainer.enable_checkpointing=false", "--model.num_rounds=3", "--model.eval_every=2",
          "--data.num_clients=10", "--model.fraction=0.5", "--seed_everything=5"]

PLUGIN = '''
from fl_lightning.algorithms import FedAvg


class HalfStep(FedAvg):
    """A user's algorithm outside the package: FedAvg at half the server step."""

    def __init__(self, *args, shrink: float = 0.5, **kwargs):
        super().__init__(*args, **kwargs)

    def aggregate(self, payload):
        step = super().aggregate(payload)
        return step * self.hparams.shrink
'''


def fitted(store, *extra) -> str:
    cli(["fit", f"--trainer.logger.init_args.tracking_uri={store}", *COMMON, *extra])
    runs = mlflow.search_runs(experiment_names=["fl-lightning"], order_by=["attributes.start_time DESC"])
    return str(runs.iloc[0]["run_id"])


def test_an_untouched_run_replays_identical_and_the_verdict_is_recorded(store, capsys):
    run_id = fitted(store)
    assert replay([run_id, "--tracking-uri", store]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].endswith("identical: 3 rounds, " + out[-1].split(", ")[-1]) and "metrics" in out[-1]
    assert MlflowClient(store).get_run(run_id).data.tags[RESULT_TAG] == "identical"


def test_an_altered_metric_is_named_with_its_round(store, capsys):
    run_id = fitted(store)
    client = MlflowClient(store)
    logged = [m.value for m in client.get_metric_history(run_id, "train_loss") if m.step == 2]
    client.log_metric(run_id, "train_loss", logged[0] + 1e-6, step=2)  # a number edited after the fit
    assert replay([run_id, "--tracking-uri", store, "--no-record"]) == 1
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert f"diverged at round 2: train_loss stored {logged[0] + 1e-6!r}, replayed {logged[0]!r}" in line
    assert RESULT_TAG not in client.get_run(run_id).data.tags  # --no-record: the run is untouched


def test_a_plugin_algorithm_replays(store, tmp_path, monkeypatch, capsys):
    (tmp_path / "user_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    run_id = fitted(store, "--model=user_plugin.HalfStep", "--model.shrink=0.25")
    assert replay([run_id, "--tracking-uri", store]) == 0
    assert "identical: 3 rounds" in capsys.readouterr().out


def test_a_sample_of_an_experiment_and_clear_refusals(store, capsys):
    first, second = fitted(store), fitted(store, "--model.lr=0.2")
    assert replay(["--experiment", "fl-lightning", "--sample", "2", "--tracking-uri", store]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 runs identical" in out
    client = MlflowClient(store)
    assert {client.get_run(r).data.tags[RESULT_TAG] for r in (first, second)} == {"identical"}
    assert replay(["no-such-run", "--tracking-uri", store]) == 2
    assert replay(["x", "--tracking-uri", "sqlite:///elsewhere.db"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: no run with id or name 'no-such-run' in the store; `mlflow ui` lists them",
                   "error: no MLflow store at elsewhere.db: give the store that holds the run with --tracking-uri"]


def test_first_divergence_is_the_earliest_round_then_the_metric_name():
    stored = {"a": {1: 1.0, 2: 2.0, 3: 3.0}, "b": {1: 1.0, 2: 5.0}}
    replayed = {"a": {1: 1.0, 2: 2.0, 3: 3.5}, "b": {1: 1.0, 2: 6.0}}
    assert first_divergence(stored, replayed) == (2, "b", 5.0, 6.0)
    assert first_divergence(stored, stored) is None
    assert first_divergence({"a": {1: float("nan")}}, {"a": {1: float("nan")}}) is None
    assert first_divergence({"a": {1: 1.0}}, {"a": {1: 1.0, 2: 1.0}}) == (2, "a", None, 1.0)


def test_the_replayed_config_logs_to_the_scratch_store_and_drops_what_a_fresh_fit_refuses(tmp_path):
    import yaml

    from fl_lightning.cli.replay import ReplayError, replay_config

    stored = {"seed_everything": 3, "threads": "auto", "ckpt_path": "old/last.ckpt",
              "trainer": {"max_epochs": -1, "max_steps": -1, "logger": {"init_args": {"run_id": "abc"}}},
              "model": {"class_path": "fl_lightning.algorithms.FedAvg", "init_args": {"lr": 0.05}}}
    config = yaml.safe_load(replay_config(yaml.safe_dump(stored), "sqlite:///scratch.db", tmp_path).read_text())
    assert config["seed_everything"] == 3 and config["model"] == stored["model"]
    assert "threads" not in config and "ckpt_path" not in config  # the old CLI flag; no checkpoint
    assert not {"max_epochs", "max_steps"} & set(config["trainer"])  # num_rounds decides, as in a fresh fit
    assert config["trainer"]["logger"]["init_args"] == {"experiment_name": "replay", "tracking_uri": "sqlite:///scratch.db"}
    assert config["trainer"]["enable_checkpointing"] is False
    with pytest.raises(ReplayError, match="holds no model"):
        replay_config("trainer: {}\n", "sqlite:///scratch.db", tmp_path)


# ------------------------------------------------------------------ issue 50: what the verdict misses no more
def test_values_one_ulp_apart_diverge():
    """No tolerance: a replay is identical bit for bit or not at all."""
    import math

    value = 0.8125
    for other in (math.nextafter(value, 1.0), math.nextafter(value, 0.0)):
        assert first_divergence({"test_acc_mean": {3: value}}, {"test_acc_mean": {3: other}}) == (
            3, "test_acc_mean", value, other)
    assert first_divergence({"x": {1: float("nan")}}, {"x": {1: float("nan")}}) is None


def test_a_metric_only_the_replay_logs_diverges():
    stored = {"train_loss": {1: 0.5, 2: 0.4}}
    replayed = {"train_loss": {1: 0.5, 2: 0.4}, "test_acc_mean": {2: 0.9}}
    assert first_divergence(stored, replayed) == (2, "test_acc_mean", None, 0.9)
    assert first_divergence(replayed, stored) == (2, "test_acc_mean", 0.9, None)


def test_the_ui_chart_copies_are_not_compared_but_wall_clock_times_only_are_left_out():
    from fl_lightning.cli.replay import compared

    assert not compared("Accuracy and fairness/test_acc_mean") and not compared("client_time_s")
    assert compared("test_acc_mean") and compared("test_acc_worst10")


def test_a_batch_with_one_altered_run_exits_1(tmp_path, monkeypatch, capsys):
    from fl_lightning.cli import replay as replay_module
    from fl_lightning.cli.replay import Outcome

    store = f"sqlite:///{tmp_path / 'runs.db'}"
    MlflowClient(store).search_experiments()  # the store exists
    outcomes = {"a": Outcome("a", "a", True, 3, 5), "b": Outcome("b", "b", False, 3, 5, "round 2: x")}
    monkeypatch.setattr(replay_module, "find_run", lambda client, key: key)
    monkeypatch.setattr(replay_module, "replay_run", lambda client, run, record=True: outcomes[run])
    assert replay(["a", "b", "--tracking-uri", store]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1] == "1 of 2 runs identical"
    assert replay(["a", "a", "--tracking-uri", store]) == 0
    assert replay(["b", "--tracking-uri", store]) == 1
