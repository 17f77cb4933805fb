"""Issue 33: ``fl-lightning replay`` fits a stored run again from its logged settings and checks
every number of every round."""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
from pathlib import Path

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


class FakeReplays:
    """``main`` around fakes: the runs found or sampled, and the replays asked for."""

    def __init__(self, monkeypatch, outcomes=None, error=None):
        from fl_lightning.cli import replay as replay_module
        from fl_lightning.cli.replay import Outcome

        self.found, self.sampled, self.replayed, self.stores, self.clients = [], [], [], [], set()
        self.outcomes = outcomes or {}

        def find_run(client, key):
            self.clients.add(client.tracking_uri)
            self.found.append(key)
            if error is not None:
                raise error
            return key

        def sample_runs(client, experiment, count):
            self.clients.add(client.tracking_uri)
            self.sampled.append((experiment, count))
            return [f"{experiment}-{n}" for n in range(count)]

        def replay_run(client, run, record=True):
            self.clients.add(client.tracking_uri)
            self.replayed.append((run, record))
            return self.outcomes.get(run, Outcome(run, run, True, 3, 5))

        monkeypatch.setattr(replay_module, "find_run", find_run)
        monkeypatch.setattr(replay_module, "sample_runs", sample_runs)
        monkeypatch.setattr(replay_module, "replay_run", replay_run)
        monkeypatch.setattr(replay_module, "check_existing_store", self.stores.append)


@pytest.mark.parametrize("argv", [[], ["--sample", "2"], ["--experiment", "suite"], ["a", "--sample", "2"],
                                  ["--experiment", "suite", "--sample", "0"]])
def test_replay_needs_runs_or_an_experiment_with_a_sample_and_says_so_in_one_line(argv, monkeypatch, capsys):
    fakes = FakeReplays(monkeypatch)
    with pytest.raises(SystemExit) as stop:
        replay(argv)
    assert stop.value.code == 2 and fakes.replayed == []
    assert capsys.readouterr().err == ("fl-lightning replay: error: give run ids or names, or --experiment NAME "
                                       "--sample K (see fl-lightning replay --help)\n")


def test_replay_reads_the_store_from_the_environment_and_passes_the_no_record_choice_on(tmp_path, monkeypatch,
                                                                                          capsys):
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    MlflowClient(store).search_experiments()  # the store exists
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", raising=False)
    fakes = FakeReplays(monkeypatch)
    assert replay(["a", "b"]) == 0
    assert fakes.stores == [store] and fakes.found == ["a", "b"] and fakes.replayed == [("a", True), ("b", True)]
    assert fakes.clients == {store}
    assert capsys.readouterr().out.splitlines() == ["a: identical: 3 rounds, 5 metrics",
                                                     "b: identical: 3 rounds, 5 metrics", "2 of 2 runs identical"]
    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "false"  # no download bars between the lines
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "true")  # a user's own choice is kept
    assert replay(["c", "--no-record"]) == 0
    assert fakes.replayed[-1] == ("c", False) and capsys.readouterr().out.splitlines() == [
        "c: identical: 3 rounds, 5 metrics"]
    assert os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] == "true"


def test_replay_samples_an_experiment_when_no_run_is_named_and_named_runs_win(tmp_path, monkeypatch, capsys):
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    MlflowClient(store).search_experiments()
    fakes = FakeReplays(monkeypatch)
    assert replay(["--experiment", "suite", "--sample", "2", "--tracking-uri", store]) == 0
    assert fakes.sampled == [("suite", 2)] and [run for run, _ in fakes.replayed] == ["suite-0", "suite-1"]
    assert fakes.clients == {store}
    assert replay(["x", "--experiment", "suite", "--sample", "2", "--tracking-uri", store]) == 0
    assert fakes.sampled == [("suite", 2)] and fakes.replayed[-1] == ("x", True)


def test_a_run_that_cannot_be_replayed_is_one_error_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from fl_lightning.cli.preflight import PreflightError
    from fl_lightning.cli.replay import ReplayError

    store = f"sqlite:///{tmp_path / 'runs.db'}"
    MlflowClient(store).search_experiments()
    capsys.readouterr()
    for error in (ReplayError("no run with id or name \"x\" in the store"), PreflightError("the store is locked")):
        FakeReplays(monkeypatch, error=error)
        assert replay(["x", "--tracking-uri", store]) == 2
        captured = capsys.readouterr()
        assert captured.err == f"error: {error}\n" and captured.out == ""
    fakes = FakeReplays(monkeypatch)  # a server that does not answer: refused before any run is looked for
    assert replay(["x", "--tracking-uri", "http://127.0.0.1:9"]) == 2
    assert capsys.readouterr().err.startswith("error: cannot reach the MLflow tracking server http://127.0.0.1:9 (")
    assert fakes.found == []


# ------------------------------------------------------------------ issue 50: what the replay mutants got past
def stored_runs(store, statuses):
    """Runs of experiment ``suite`` in ``store``, ended with ``statuses``; a second experiment
    beside it. Returns the client and the ids of the FINISHED runs."""
    client = MlflowClient(store)
    suite = client.create_experiment("suite")
    client.create_experiment("other")
    finished = []
    for status in statuses:
        run = client.create_run(suite)
        if status != "RUNNING":
            client.set_terminated(run.info.run_id, status=status)
        if status == "FINISHED":
            finished.append(run.info.run_id)
    return client, finished


def test_a_sample_is_finished_runs_only_drawn_with_seed_0_from_the_runs_in_id_order(store):
    """``--sample K`` picks the same K runs however often it is asked (seed 0 over the runs sorted
    by id), never a failed or running one, and all of them when K is more than there are."""
    import random

    from fl_lightning.cli.replay import sample_runs

    client, finished = stored_runs(store, ["FINISHED"] * 10 + ["FAILED", "KILLED", "RUNNING"])
    picked = [run.info.run_id for run in sample_runs(client, "suite", 5)]
    assert picked == random.Random(0).sample(sorted(finished), 5)
    assert sorted(run.info.run_id for run in sample_runs(client, "suite", 50)) == sorted(finished)


def test_a_sample_draws_from_every_finished_run_not_from_mlflows_first_page(store, monkeypatch):
    """MLflow's ``search_runs`` returns 1,000 runs unless asked for more, and a suite may hold more:
    the sample is drawn from all of them (the default page shrunk to 2 here, instead of 1,001 runs)."""
    import inspect

    from fl_lightning.cli.replay import sample_runs

    client, finished = stored_runs(store, ["FINISHED"] * 4)
    defaults = list(MlflowClient.search_runs.__defaults__)
    names = list(inspect.signature(MlflowClient.search_runs).parameters)[-len(defaults):]
    defaults[names.index("max_results")] = 2
    monkeypatch.setattr(MlflowClient.search_runs, "__defaults__", tuple(defaults))
    assert len(client.search_runs([client.get_experiment_by_name("suite").experiment_id])) == 2  # the page
    assert sorted(run.info.run_id for run in sample_runs(client, "suite", 10)) == sorted(finished)


def test_sampling_an_experiment_the_store_lacks_names_those_it_has(store):
    from fl_lightning.cli.replay import ReplayError, sample_runs

    client, _ = stored_runs(store, [])
    with pytest.raises(ReplayError) as refused:
        sample_runs(client, "suit", 2)
    assert str(refused.value) == "no experiment 'suit' in the store; it has: Default, other, suite"


def test_a_value_the_other_side_did_not_log_is_said_to_be_not_logged():
    """The divergence line's words for a missing value (``round 2: x stored (not logged), replayed 0.5``)."""
    from fl_lightning.cli.replay import _text

    assert _text(None) == "(not logged)"
    assert _text(0.5) == "0.5" and _text(0.0) == "0.0"


def test_a_run_is_found_by_its_name_in_any_experiment_quotes_and_all(store):
    """``fl-lightning replay NAME``: the run named so, whichever experiment holds it, a name with a
    quote mark too (MLflow's filters have no escapes: ``\\'`` matched nothing); a name two runs share,
    or one holding both quote marks (no filter can name it), is refused, asking for the id."""
    from fl_lightning.cli.replay import ReplayError, find_run

    client, _ = stored_runs(store, [])
    other = client.get_experiment_by_name("other").experiment_id
    plain = client.create_run(other, run_name="fedavg-seed-3").info.run_id
    quoted = client.create_run(other, run_name="it's-seed-4").info.run_id
    double = client.create_run(other, run_name='say "seed 5"').info.run_id
    for _ in range(2):
        client.create_run(other, run_name="twin")
    assert find_run(client, "fedavg-seed-3").info.run_id == plain
    assert find_run(client, plain).info.run_id == plain
    assert find_run(client, "it's-seed-4").info.run_id == quoted
    assert find_run(client, 'say "seed 5"').info.run_id == double
    with pytest.raises(ReplayError) as refused:
        find_run(client, 'it\'s "both"')
    assert str(refused.value) == ("no run with id 'it\\'s \"both\"', and a run name holding both ' and \" "
                                  "cannot be searched for; give the run id instead")
    with pytest.raises(ReplayError) as refused:
        find_run(client, "twin")
    assert str(refused.value) == "2 runs are named 'twin'; give the run id instead"


def test_lightnings_epoch_counter_is_not_one_of_the_numbers_compared():
    """``epoch`` is the Trainer's loop counter logged beside the metrics, not a number of the run:
    neither compared nor counted in ``identical: N rounds, M metrics``."""
    from fl_lightning.cli.replay import compared

    assert not compared("epoch")
    assert compared("train_loss")


def test_nan_on_one_side_only_diverges():
    """A metric that became NaN in the replay (or was NaN only in the stored run) is a divergence;
    NaN on both sides is the same number."""
    nan = float("nan")
    stored = {"train_loss": {1: 0.5, 2: 0.4}}
    went_nan = {"train_loss": {1: 0.5, 2: nan}}
    assert first_divergence(stored, went_nan)[:3] == (2, "train_loss", 0.4)
    assert first_divergence(went_nan, stored)[::3] == (2, 0.4)


def test_a_divergence_is_recorded_on_the_run_and_printed_with_where_it_is():
    """The ``replay_result`` tag and the printed line of a replay that diverged both say where."""
    from fl_lightning.cli.replay import Outcome

    where = "round 2: train_loss stored 0.5, replayed 0.25"
    diverged = Outcome("abc", "fedavg-seed-3", False, 3, 7, where)
    assert diverged.verdict == f"diverged: {where}"
    assert diverged.line() == f"fedavg-seed-3: diverged at {where}"
    same = Outcome("abc", "fedavg-seed-3", True, 3, 7)
    assert same.verdict == "identical" and same.line() == "fedavg-seed-3: identical: 3 rounds, 7 metrics"


def test_metrics_diverging_in_the_same_round_give_the_first_by_name_whatever_their_values():
    stored = {"train_loss": {2: 5.0}, "worst_acc": {2: 0.25}}
    replayed = {"train_loss": {2: 6.0}, "worst_acc": {2: 0.5}}
    assert first_divergence(stored, replayed) == (2, "train_loss", 5.0, 6.0)


def test_the_replayed_config_runs_quietly_in_its_scratch_folder_and_every_length_setting_goes(tmp_path):
    """A replay's fit: no progress bar, its files under the scratch folder, none of the stored
    run's callbacks (its checkpoint writer), no checkpoint unless a route needs one, and no
    min/max epochs or steps (the model's ``num_rounds`` decides); a stored config without a
    ``trainer`` section or without the old ``threads`` flag is taken as it is."""
    import yaml

    from fl_lightning.cli.replay import ReplayError, replay_config

    model = {"class_path": "fl_lightning.algorithms.FedAvg", "init_args": {"lr": 0.05}}
    stored = {"model": model, "trainer": {"min_epochs": 2, "min_steps": 3, "enable_progress_bar": True,
                                          "callbacks": [{"class_path": "RoundCheckpoint"}],
                                          "default_root_dir": "elsewhere"}}
    config = yaml.safe_load(replay_config(yaml.safe_dump(stored), "sqlite:///scratch.db", tmp_path).read_text())
    assert config["trainer"] == {"logger": {"class_path": "lightning.pytorch.loggers.MLFlowLogger",
                                            "init_args": {"experiment_name": "replay",
                                                          "tracking_uri": "sqlite:///scratch.db"}},
                                 "enable_progress_bar": False, "callbacks": None,
                                 "default_root_dir": str(tmp_path / "checkpoints"), "enable_checkpointing": False}
    route = yaml.safe_load(replay_config(yaml.safe_dump({"model": model}), "sqlite:///scratch.db", tmp_path,
                                         checkpoints=True).read_text())
    assert route["model"] == model and route["trainer"]["enable_checkpointing"] is True
    with pytest.raises(ReplayError) as refused:
        replay_config("- model\n", "sqlite:///scratch.db", tmp_path)
    assert str(refused.value) == "its config.yaml holds no model: it was not logged by fl-lightning fit"


def test_only_a_sqlite_store_is_checked_for_its_file(tmp_path):
    """Replay never creates a store: a SQLite file that is not there is refused; other stores
    (a server, a file store) are left for MLflow to reach."""
    from fl_lightning.cli.replay import ReplayError, check_existing_store

    (tmp_path / "runs.db").write_bytes(b"")
    check_existing_store(f"sqlite:///{tmp_path / 'runs.db'}")
    check_existing_store("http://127.0.0.1:5000")
    check_existing_store(f"file:{tmp_path / 'mlruns'}")
    with pytest.raises(ReplayError) as refused:
        check_existing_store(f"sqlite:///{tmp_path / 'gone.db'}")
    assert str(refused.value) == (f"no MLflow store at {tmp_path / 'gone.db'}: give the store that holds the run "
                                  "with --tracking-uri")


def test_a_route_fit_without_one_checkpoint_to_continue_from_is_a_replay_error(tmp_path):
    """A route's later fit continues from the one ``last.ckpt`` the earlier fit left; none (or two)
    is said in one line, not a traceback."""
    from fl_lightning.cli.replay import ReplayError, route_fit

    config = tmp_path / "config.yaml"
    assert route_fit(tmp_path, config, None, continues=False) == ["fit", "--config", str(config)]
    assert route_fit(tmp_path, config, 3, continues=False)[-1] == "--model.num_rounds=3"
    with pytest.raises(ReplayError) as refused:
        route_fit(tmp_path, config, 5, continues=True)
    assert str(refused.value) == (f"the replay's fit before 5 rounds left 0 last.ckpt files in "
                                  f"{tmp_path / 'checkpoints'}, not one to continue from")
    (tmp_path / "checkpoints" / "run").mkdir(parents=True)
    (tmp_path / "checkpoints" / "run" / "last.ckpt").write_bytes(b"")
    assert route_fit(tmp_path, config, 5, continues=True)[-2:] == [
        "--ckpt_path", str(tmp_path / "checkpoints" / "run" / "last.ckpt")]


# ------------------------------------------------- replay_run and its fits, around a fake fit (no training)
CONFIG = "model:\n  class_path: fl_lightning.algorithms.FedAvg\n  init_args:\n    num_rounds: 2\n" \
         "trainer:\n  max_epochs: 2\n"


@functools.cache
def empty_store() -> Path:
    """An MLflow SQLite store with its tables made, copied where a test needs a fresh store (making
    the tables takes a second or two)."""
    path = Path(tempfile.mkdtemp(prefix="fl-empty-store-")) / "empty.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


class FakeFit:
    """``lightning_cli.run`` for a replay: each fit logs ``values`` (metric -> {round: value}) up to
    its rounds into the scratch store its config names, in the one run there (a later fit of a
    route continues it), and leaves a ``last.ckpt``; ``fail`` makes it print lines and exit so."""

    def __init__(self, monkeypatch, values, fail=None, log_nothing=False):
        from fl_lightning.cli import lightning_cli

        self.values, self.fail, self.log_nothing, self.calls = values, fail, log_nothing, []
        monkeypatch.setattr(lightning_cli, "run", self)

    def __call__(self, words):
        import yaml

        self.calls.append((os.getcwd(), list(words)))
        if self.fail is not None:
            print("line 1\nline 2\nline 3")
            sys.stderr.write("the fit's last line\n")  # the fit's errors, into its log as well
            raise SystemExit(self.fail)
        config = yaml.safe_load(open(words[words.index("--config") + 1]))
        self.configs = [*getattr(self, "configs", []), config]
        rounds = next((int(w.split("=")[1]) for w in words if w.startswith("--model.num_rounds=")),
                      config["model"]["init_args"]["num_rounds"])
        if not self.log_nothing:
            init = config["trainer"]["logger"]["init_args"]
            shutil.copy(empty_store(), init["tracking_uri"].removeprefix("sqlite:///"))
            client = MlflowClient(init["tracking_uri"])
            found = client.get_experiment_by_name(init["experiment_name"])
            experiment = found.experiment_id if found else client.create_experiment(init["experiment_name"])
            runs = client.search_runs([experiment])
            run_id = runs[0].info.run_id if runs else client.create_run(experiment).info.run_id
            for name, steps in self.values.items():
                for step, value in steps.items():
                    if step <= rounds:
                        client.log_metric(run_id, name, value, step=step)
        earlier = sorted(Path("checkpoints").glob("fit*/last.ckpt"))  # a route's earlier fit's: continued, replaced
        for path in earlier:
            path.unlink()
        folder = Path("checkpoints") / f"fit{len(list(Path('checkpoints').glob('fit*'))) + 1}"
        folder.mkdir(parents=True)
        (folder / "last.ckpt").touch()


def stored_run(tmp_path, values, *, status="FINISHED", config=CONFIG, tags=None):
    shutil.copy(empty_store(), tmp_path / "runs.db")
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs.db'}")
    run = client.create_run(client.create_experiment("suite"), run_name="FedAvg seed 4", tags=tags or {})
    for name, steps in values.items():
        for step, value in steps.items():
            client.log_metric(run.info.run_id, name, value, step=step)
    if config is not None:
        client.log_text(run.info.run_id, config, "config.yaml")
    if status != "RUNNING":
        client.set_terminated(run.info.run_id, status)
    return client, client.get_run(run.info.run_id)


VALUES = {"test_acc_mean": {1: 0.5, 2: 0.625}, "train_loss": {1: 1.5, 2: 1.25}, "client_time_s": {1: 3.0, 2: 2.0}}


def test_a_replay_fits_the_stored_config_in_a_scratch_folder_and_records_identical(tmp_path, monkeypatch):
    import datetime

    from fl_lightning.cli.replay import DATE_TAG, replay_run

    client, run = stored_run(tmp_path, VALUES)
    fit = FakeFit(monkeypatch, {**VALUES, "client_time_s": {1: 9.0, 2: 8.0}})  # wall-clock times differ
    said: list[str] = []
    here = os.getcwd()
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))
    outcome = replay_run(client, run, progress=said.append)
    assert os.getcwd() == here and said == ["replaying FedAvg seed 4 ..."]
    assert list(temporary.iterdir()) == []  # the config downloaded into the scratch folder, gone with it
    assert (outcome.run_id, outcome.name, outcome.identical, outcome.rounds, outcome.metrics, outcome.route) == (
        run.info.run_id, "FedAvg seed 4", True, 2, 2, ())
    [(folder, words)] = fit.calls
    assert os.path.basename(folder).startswith("fl-replay-") and not os.path.exists(folder)  # scratch, removed
    assert words == ["fit", "--config", os.path.join(folder, "config.yaml")]
    trainer = fit.configs[0]["trainer"]
    assert trainer["enable_checkpointing"] is False and "max_epochs" not in trainer
    assert trainer["logger"]["init_args"]["tracking_uri"] == f"sqlite:///{os.path.join(folder, 'replay.db')}"
    tags = client.get_run(run.info.run_id).data.tags
    assert tags[RESULT_TAG] == "identical" and tags[DATE_TAG] == datetime.date.today().isoformat()


def test_a_replay_that_diverges_says_where_and_records_it_unless_told_not_to(tmp_path, monkeypatch):
    from fl_lightning.cli.replay import DATE_TAG, replay_run

    client, run = stored_run(tmp_path, VALUES)
    FakeFit(monkeypatch, {**VALUES, "train_loss": {1: 1.5, 2: 1.375}})
    outcome = replay_run(client, run, record=False, progress=lambda line: None)
    assert outcome.identical is False and outcome.divergence == "round 2: train_loss stored 1.25, replayed 1.375"
    assert (outcome.run_id, outcome.name, outcome.rounds, outcome.metrics) == (run.info.run_id, "FedAvg seed 4", 2, 2)
    assert outcome.line() == "FedAvg seed 4: diverged at round 2: train_loss stored 1.25, replayed 1.375"
    assert {RESULT_TAG, DATE_TAG}.isdisjoint(client.get_run(run.info.run_id).data.tags)
    outcome = replay_run(client, run, progress=lambda line: None)
    assert client.get_run(run.info.run_id).data.tags[RESULT_TAG] == (
        "diverged: round 2: train_loss stored 1.25, replayed 1.375")


def test_an_extended_run_is_replayed_along_its_route_each_fit_continuing_the_last(tmp_path, monkeypatch):
    from fl_lightning.cli.replay import replay_run

    values = {"test_acc_mean": {1: 0.5, 2: 0.625, 3: 0.75}}
    client, run = stored_run(tmp_path, values, tags={"fit_lengths": "2,3"})
    fit = FakeFit(monkeypatch, values)
    outcome = replay_run(client, run, progress=lambda line: None)
    assert outcome.identical and outcome.route == (2, 3) and outcome.rounds == 3
    (folder, first), (_, second) = fit.calls
    config = os.path.join(folder, "config.yaml")
    assert first == ["fit", "--config", config, "--model.num_rounds=2"]
    assert second == ["fit", "--config", config, "--model.num_rounds=3", "--ckpt_path",
                      os.path.join(folder, "checkpoints", "fit1", "last.ckpt")]
    assert fit.configs[0]["trainer"]["enable_checkpointing"] is True  # the next fit continues from it
    FakeFit(monkeypatch, {"test_acc_mean": {1: 0.5, 2: 0.625, 3: 0.875}})
    diverged = replay_run(client, run, progress=lambda line: None)
    assert diverged.route == (2, 3) and diverged.line() == (
        "FedAvg seed 4: diverged at round 3: test_acc_mean stored 0.75, replayed 0.875 "
        "(fitted to 2 rounds, then extended to 3, as the run was)")


@pytest.mark.parametrize(("status", "config", "said"), [
    ("RUNNING", CONFIG, "run FedAvg seed 4 is RUNNING: only a finished run has every number to check"),
    ("FAILED", CONFIG, "run FedAvg seed 4 is FAILED: only a finished run has every number to check"),
    ("FINISHED", None, "run FedAvg seed 4 has no config.yaml artifact (a Trainer script's run): only runs of "
                       "`fl-lightning fit` and the benchmark runner log the settings to replay"),
])
def test_a_run_that_cannot_be_replayed_says_why_and_fits_nothing(status, config, said, tmp_path, monkeypatch):
    from fl_lightning.cli.replay import ReplayError, replay_run

    client, run = stored_run(tmp_path, VALUES, status=status, config=config)
    fit = FakeFit(monkeypatch, VALUES)
    with pytest.raises(ReplayError) as refused:
        replay_run(client, run, progress=lambda line: None)
    assert str(refused.value) == said and fit.calls == []
    assert RESULT_TAG not in client.get_run(run.info.run_id).data.tags


def test_a_replay_whose_fit_fails_or_logs_nothing_says_so_with_the_fits_last_lines(tmp_path, monkeypatch, capsys):
    from fl_lightning.cli.replay import ReplayError, replay_run

    client, run = stored_run(tmp_path, VALUES)
    here = os.getcwd()
    FakeFit(monkeypatch, VALUES, fail=2)
    capsys.readouterr()
    with pytest.raises(ReplayError) as failed:
        replay_run(client, run, progress=lambda line: None)
    assert "last line" not in capsys.readouterr().err  # the fit's output went to its log only
    assert str(failed.value) == ("run FedAvg seed 4: the replay's fit failed (exit 2): "
                                 "line 2 | line 3 | the fit's last line") and os.getcwd() == here
    FakeFit(monkeypatch, VALUES, log_nothing=True)
    with pytest.raises(ReplayError, match=r"^run FedAvg seed 4: the replay's fit logged no run$"):
        replay_run(client, run, progress=lambda line: None)
    FakeFit(monkeypatch, VALUES, fail=0)  # a fit that exits 0 (as LightningCLI may) is no failure
    with pytest.raises(ReplayError, match="logged no run"):
        replay_run(client, run, progress=lambda line: None)
    assert os.getcwd() == here


def test_a_run_without_a_name_is_called_by_its_id(tmp_path, monkeypatch):
    from fl_lightning.cli.replay import replay_run

    client, run = stored_run(tmp_path, VALUES)
    client.delete_tag(run.info.run_id, "mlflow.runName")
    FakeFit(monkeypatch, VALUES)
    said: list[str] = []
    outcome = replay_run(client, client.get_run(run.info.run_id), progress=said.append)
    assert outcome.name == run.info.run_id and said == [f"replaying {run.info.run_id} ..."]


def test_a_run_with_only_wall_clock_times_replays_as_zero_rounds_and_zero_metrics(tmp_path, monkeypatch):
    from fl_lightning.cli.replay import replay_run

    times = {"client_time_s": {1: 3.0, 2: 2.0}}
    client, run = stored_run(tmp_path, times)
    FakeFit(monkeypatch, times)
    outcome = replay_run(client, run, progress=lambda line: None)
    assert outcome.line() == "FedAvg seed 4: identical: 0 rounds, 0 metrics"
