"""What a run is, as MLflow shows it: unique descriptive run names, the split as a dataset input,
no LightningCLI internals among the params, resolved partition defaults, the task tags the
leaderboard groups by, and ``fit`` as the only command.

The pure functions are tested on small stand-ins; the end-to-end part (marked ``integration``)
runs three tiny fits through the CLI into a temporary SQLite store.
"""

import dataclasses
import hashlib
import json
import re
from types import SimpleNamespace

import pytest
from mlflow.tracking import MlflowClient

from fl_lightning.algorithms import ALGORITHMS, FedAvg, FedFa, FedFV
from fl_lightning.callbacks import LogHyperparameters
from fl_lightning.callbacks import run_identity as identity
from fl_lightning.callbacks.fit_runs import run_name_for
from fl_lightning.callbacks.mlflow_ui import ui_links
from fl_lightning.cli import main
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.records.vocabulary import Tag

NAME = re.compile(r"^(?P<algorithm>\w+) seed (?P<seed>\d+)(?: data (?P<data_seed>\d+))?(?: \((?P<settings>.*)\))?"
                  r" \| (?P<data>.+) \| (?P<id>\d{4}-[0-9a-f]{4})$")


def data_stub(**hparams):
    """A stand-in data module: its hyper-parameters and nothing else."""
    defaults = dict(source="mnist5k", num_clients=100, partition="dirichlet", partition_params={},
                    test_mode="local", local_test_fraction=0.2, global_test_fraction=0.2, data_seed=0)
    return SimpleNamespace(hparams=defaults | hparams)


def module_stub(**hparams):
    defaults = dict(backbone="fl_mlp", num_rounds=100, fraction=0.1, local_epochs=1, batch_size=10,
                    dropout_prob=0.0, attack=None, attack_client=0, attack_strength=10.0, seed=0)
    return SimpleNamespace(hparams=defaults | hparams)


def tiny(cls=FedAvg, **kwargs):
    return cls(backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8), **kwargs)


# --------------------------------------------------------------------------- names


def test_algorithm_config_shows_the_algorithms_own_settings_that_differ_from_its_defaults():
    # shared settings that change how a run computes are part of its configuration (issue 33)
    assert identity.algorithm_config(tiny(FedAvg, lr=0.3)) == "FedAvg(lr=0.3)"
    # threads: a logged param, not the label (it changes only the rounding)
    assert identity.algorithm_config(tiny(FedAvg, lr=0.3, threads=2)) == "FedAvg(lr=0.3)"
    # ... not those that only say when or how fast it measures
    assert (
        identity.algorithm_config(tiny(FedAvg, eval_every=3, clients_per_chunk=4, track_improvement=True)) == "FedAvg"
    )
    assert identity.algorithm_config(tiny(FedFV, tau=1)) == "FedFV(tau=1)"
    assert identity.algorithm_config(tiny(FedFV, alpha=0.2, tau=1)) == "FedFV(alpha=0.2,tau=1)"
    # FedFa's client momentum defaults to its gamma: shown only where it differs (two computations, two labels)
    assert identity.algorithm_config(tiny(FedFa, gamma=0.5)) == "FedFa(gamma=0.5)"
    assert identity.algorithm_config(tiny(FedFa, gamma=0.5, momentum=0.5)) == "FedFa(gamma=0.5)"
    assert identity.algorithm_config(tiny(FedFa, gamma=0.5, momentum=0.9)) == "FedFa(gamma=0.5,momentum=0.9)"
    runner = {"algorithm_config": "FedFV(alpha=0.1,tau=10)"}  # the benchmark runner's tag wins
    assert identity.algorithm_config(tiny(FedFV, tau=1), runner) == "FedFV(alpha=0.1,tau=10)"


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_at_its_defaults_is_named_by_its_class_alone(name):
    assert identity.algorithm_config(tiny(ALGORITHMS[name])) == name


def test_data_text_shows_the_partitions_main_parameter_even_at_its_default():
    assert identity.data_text(data_stub()) == "mnist5k/dirichlet(alpha=0.5)"
    assert identity.data_text(data_stub(partition_params={"alpha": 0.1, "min_size": 5})) == (
        "mnist5k/dirichlet(alpha=0.1,min_size=5)")
    shards = data_stub(partition="shards", partition_params={"num_shards": 200, "shards_per_client": 2})
    assert identity.data_text(shards) == "mnist5k/shards(num_shards=200)"
    assert identity.data_text(data_stub(partition="iid")) == "mnist5k/iid"
    emnist = data_stub(source="emnist", source_params={"split": "letters"}, partition="iid")
    assert identity.data_text(emnist) == "emnist(split=letters)/iid"


def test_dataset_name_lists_the_parameters_that_shape_the_split_and_the_clients():
    assert identity.dataset_name(data_stub()) == "mnist5k/dirichlet(alpha=0.5,min_size=10)/100 clients"


def test_run_names_say_what_the_run_is_and_differ_between_runs():
    data = FederatedDataModule(source="digits", num_clients=10, partition="dirichlet", seed=0)
    module = tiny(FedFV, tau=1, seed=3)
    first, second = identity.run_name(module, data), identity.run_name(module, data)
    assert first != second  # the unique id at the end
    match = NAME.match(first)
    assert match, first
    assert match["algorithm"] == "FedFV" and match["settings"] == "tau=1"
    assert match["data"] == "digits/dirichlet(alpha=0.5)"
    assert match["seed"] == "3" and match["data_seed"] == "0"  # the data seed differs: said
    assert first.startswith("FedFV seed 3 data 0")  # within the ~22 characters MLflow's list shows


def test_run_names_leave_out_a_data_seed_equal_to_the_seed():
    data = FederatedDataModule(source="digits", num_clients=10, partition="iid", seed=2)
    name = identity.run_name(tiny(seed=2), data)
    assert name.startswith("FedAvg seed 2 | digits/iid | "), name
    assert NAME.match(name)["data_seed"] is None


def test_only_new_unnamed_runs_are_named():
    module, data = tiny(), FederatedDataModule(source="digits", num_clients=10, partition="iid")
    fresh = run_name_for({}, module, data)  # the init args of an MLflow logger's config
    chosen = run_name_for({"run_name": "my run"}, module, data)
    continued = run_name_for({"run_id": "0123456789abcdef"}, module, data)
    suite = run_name_for({"tags": {"algorithm_config": "FedAvg(server_lr=0.5)"}}, module, data)
    tagged = run_name_for({"tags": {"mlflow.runName": "named by a tag"}}, module, data)
    assert suite.startswith("FedAvg seed 0 (server_lr=0.5) | digits/iid | ")  # the runner's tag
    assert NAME.match(fresh) and fresh.startswith("FedAvg seed 0 | digits/iid | ")
    assert chosen == "my run"
    assert continued is None  # the continued run keeps the name it has
    assert tagged is None  # MLflow takes the name from the tag


# --------------------------------------------------------------------------- params


def test_loggable_hparams_leave_out_lightning_cli_internals():
    module = tiny()
    module._hparams_initial["_instantiator"] = "lightning.pytorch.cli.instantiate_module"
    module._hparams_initial["_class_path"] = "fl_lightning.algorithms.FedAvg"
    data = FederatedDataModule(source="digits", num_clients=10, partition="dirichlet")
    hparams = identity.loggable_hparams(module, data)
    assert not [k for k in hparams if k.startswith("_")]
    assert hparams["lr"] == module.hparams.lr and hparams["source"] == "digits"
    assert hparams["partition_params"]["alpha"] == 0.5  # the default, resolved


class RecordingLogger:
    def __init__(self):
        self.logged = []

    def log_hyperparams(self, params):
        self.logged.append(params)


@pytest.mark.parametrize("autolog", [False, True])
def test_log_hyperparameters_logs_to_every_logger_unless_lightning_does(autolog):
    loggers = [RecordingLogger(), RecordingLogger()]  # e.g. MLflow and TensorBoard
    data = FederatedDataModule(source="digits", num_clients=10, partition="iid")
    trainer = SimpleNamespace(enable_autolog_hparams=autolog, is_global_zero=True, loggers=loggers, datamodule=data)
    LogHyperparameters().on_fit_start(trainer, tiny())
    if autolog:
        assert all(not logger.logged for logger in loggers)
    else:
        assert all(len(logger.logged) == 1 and logger.logged[0]["source"] == "digits" for logger in loggers)


# --------------------------------------------------------------------------- the task


def tags_of(module, data):
    return identity.task_tags(module, data)


def test_task_tags_define_the_task_not_the_seed():
    tags = tags_of(module_stub(), data_stub())
    task = json.loads(tags["task"])
    assert tags["task"] == json.dumps(task, sort_keys=True)
    assert set(task) == {"source", "source_params", "partition", "partition_params", "num_clients", "fraction",
                         "model", "num_rounds", "local_epochs", "batch_size", "test_mode",
                         "local_test_fraction", "dropout_prob"}
    assert task["partition_params"]["alpha"] == 0.5 and task["partition_params"]["min_size"] == 10
    assert re.fullmatch(r"[0-9a-f]{12}", tags["task_key"])
    assert tags["client_test"] == "local" and tags["per_client_models"] == "false"
    assert tags["seed"] == "0" and tags["data_seed"] == "0" and tags["client_test_size"] == ""

    other_seed = tags_of(module_stub(seed=1), data_stub(data_seed=1))
    assert other_seed["task_key"] == tags["task_key"] and other_seed["seed"] == "1" and other_seed["data_seed"] == "1"
    assert tags_of(module_stub(num_rounds=50), data_stub())["task_key"] != tags["task_key"]
    assert tags_of(module_stub(fraction=1), data_stub())["task_key"] == tags_of(
        module_stub(fraction=1.0), data_stub())["task_key"]


def test_task_names_the_test_fraction_that_applies_and_an_attack_only_when_set():
    matched = json.loads(tags_of(module_stub(attack="bias"), data_stub(test_mode="matched"))["task"])
    assert matched["global_test_fraction"] == 0.2 and "local_test_fraction" not in matched
    assert (matched["attack"], matched["attack_client"], matched["attack_strength"]) == ("bias", 0, 10)
    assert "attack" not in json.loads(tags_of(module_stub(), data_stub())["task"])


def test_task_tags_read_the_data_modules_own_description_and_per_client_models():
    import torch

    data = data_stub(data_seed=7)
    data.client_test_description = lambda: "local: 2-40 samples per client (median 10)"
    module = module_stub()
    module.evaluation_params = lambda: torch.zeros(100, 5)  # one model per client (Ditto, CGSV)
    tags = tags_of(module, data)
    assert tags["client_test_size"] == "local: 2-40 samples per client (median 10)"
    assert tags["per_client_models"] == "true" and tags["data_seed"] == "7"


# --------------------------------------------------------------------------- the dataset input


def test_dataset_input_names_the_split_and_its_source():
    data = data_stub(source="mnist", data_dir="data")
    data.split_digest = lambda: "0123456789abcdef"
    entry = identity.dataset_input(data)
    assert entry.dataset.name == "mnist/dirichlet(alpha=0.5,min_size=10)/100 clients"
    assert entry.dataset.digest == "0123456789abcdef"
    source = json.loads(entry.dataset.source)
    assert source["source"] == "mnist" and source["data_dir"].endswith("data")  # torchvision: read from data_dir
    assert [(t.key, t.value) for t in entry.tags] == [("mlflow.data.context", "train")]
    offline = data_stub()
    offline.split_digest = lambda: "f" * 16
    assert "data_dir" not in json.loads(identity.dataset_input(offline).dataset.source)


# --------------------------------------------------------------------------- the command line


@pytest.mark.parametrize("command", ["test", "validate", "predict"])
def test_evaluation_subcommands_are_refused_in_one_line(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--model", "FedAvg"])
    assert exit_info.value.code != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fl-lightning {command}: not a command here") and "fit" in err[0]


def test_ui_links_open_the_classic_training_view():
    classic = "?workflowType=machine_learning"  # read by MLflow 3.17's router inside the fragment
    assert ui_links("sqlite:///mlruns.db", "3", "abc") == (
        f"http://127.0.0.1:5000/#/experiments/3/runs{classic}",
        f"http://127.0.0.1:5000/#/experiments/3/runs/abc/model-metrics{classic}")
    assert ui_links("http://mlflow.lab:5000/", "3", "abc")[0] == f"http://mlflow.lab:5000/#/experiments/3/runs{classic}"


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory):
    """Three tiny fits into one store: ``first`` and ``again`` differ only in num_rounds, ``seed1``
    only in the seed; {label: Run}, the store's client and the printed output."""
    folder = tmp_path_factory.mktemp("identity")
    uri = f"sqlite:///{folder / 'runs.db'}"
    base = ["fit", f"--trainer.logger.init_args.tracking_uri={uri}", "--model.num_rounds=2",
            "--model.eval_every=1", "--data.num_clients=10"]
    extra = {"first": [], "seed1": ["--seed_everything=1"],
             "again": ["--model.num_rounds=1"]}
    client, runs, printed = MlflowClient(uri), {}, {}
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        for label, args in extra.items():
            before = {r.info.run_id for r in _all_runs(client)}
            capture = _Capture()
            with capture:
                main(base + args)
            printed[label] = capture.text
            (runs[label],) = [r for r in _all_runs(client) if r.info.run_id not in before]
    return runs, client, printed


class _Capture:
    """stdout of an in-process fit (capsys is function-scoped)."""

    def __enter__(self):
        import contextlib
        import io

        self.buffer = io.StringIO()
        self.redirect = contextlib.redirect_stdout(self.buffer)
        self.redirect.__enter__()

    def __exit__(self, *exc):
        self.redirect.__exit__(*exc)
        self.text = self.buffer.getvalue()


def _all_runs(client):
    experiment = client.get_experiment_by_name("fl-lightning")
    return client.search_runs([experiment.experiment_id]) if experiment else []


@pytest.mark.integration
def test_cli_runs_have_unique_names_that_say_what_they_are(three_runs):
    runs, _, printed = three_runs
    names = {label: run.info.run_name for label, run in runs.items()}
    assert len(set(names.values())) == 3, names  # unique
    assert names["seed1"][:22] != names["first"][:22], names  # what differs shows where MLflow cuts names
    for label, name in names.items():
        match = NAME.match(name)
        assert match, name
        assert match["algorithm"] == "FedAvg" and match["data"] == "mnist5k/dirichlet(alpha=0.5)"
        assert match["seed"] == ("1" if label == "seed1" else "0")
    first = runs["first"]
    assert f"#/experiments/{first.info.experiment_id}/runs/{first.info.run_id}" in printed["first"]
    assert names["first"] in printed["first"]


@pytest.mark.integration
def test_cli_runs_log_the_split_as_a_dataset_input(three_runs):
    runs, _, _ = three_runs
    inputs = {label: run.inputs.dataset_inputs for label, run in runs.items()}
    for entries in inputs.values():
        assert len(entries) == 1
        (entry,) = entries
        assert entry.dataset.name == "mnist5k/dirichlet(alpha=0.5,min_size=10)/10 clients"
        assert json.loads(entry.dataset.source)["source"] == "mnist5k"
        assert {t.key: t.value for t in entry.tags} == {"mlflow.data.context": "train"}
    digests = {label: entries[0].dataset.digest for label, entries in inputs.items()}
    assert digests["first"] == digests["again"]  # the same split: only num_rounds differs
    assert digests["seed1"] != digests["first"]


@pytest.mark.integration
def test_cli_runs_log_no_internal_params_and_the_resolved_partition(three_runs):
    runs, _, _ = three_runs
    params = runs["first"].data.params
    assert not [k for k in params if k.startswith("_")], sorted(params)
    assert params["partition_params/alpha"] == "0.5" and params["partition_params/min_size"] == "10"
    tags = runs["first"].data.tags
    assert json.loads(tags["partition_params"])["alpha"] == 0.5


@pytest.mark.integration
def test_cli_runs_carry_the_task_tags(three_runs):
    runs, _, _ = three_runs
    tags = {label: run.data.tags for label, run in runs.items()}
    for label, tag in tags.items():
        task = json.loads(tag["task"])
        assert tag["task_key"] == identity.task_key(tag["task"])
        assert task["partition_params"]["alpha"] == 0.5 and task["num_clients"] == 10
        assert tag["client_test"] == "matched" and tag["per_client_models"] == "false"  # the default config's
        assert tag["client_test_size"].startswith("matched: ")  # the data module's own description
        assert tag["seed"] == tag["data_seed"] == ("1" if label == "seed1" else "0")
    assert tags["first"]["task_key"] == tags["seed1"]["task_key"]  # seeds of one task
    assert tags["first"]["task_key"] != tags["again"]["task_key"]  # num_rounds defines the task


def test_the_run_schema_is_torch_free_and_holds_the_defaults_the_modules_use():
    """``fl_lightning.records.vocabulary`` imports the standard library only (the leaderboard reads it where
    PyTorch is not installed), and its defaults are the modules' own."""
    import inspect
    import subprocess
    import sys

    from fl_lightning.core.module import FederatedModule
    from fl_lightning.records import vocabulary as schema

    code = ("import sys, fl_lightning.records.vocabulary; "
            "assert 'torch' not in sys.modules and 'numpy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
    module_defaults = inspect.signature(FederatedModule.__init__).parameters
    data_defaults = inspect.signature(FederatedDataModule.__init__).parameters
    assert module_defaults[schema.FRACTION].default == schema.DEFAULT_FRACTION
    assert data_defaults[schema.TEST_MODE].default == schema.DEFAULT_TEST_MODE
    assert data_defaults[schema.LOCAL_TEST_FRACTION].default == schema.DEFAULT_LOCAL_TEST_FRACTION
    # the defaults the runner's time estimate reads (benchmarks.plan) are the modules' own
    for name, default in [(schema.BACKBONE, schema.DEFAULT_BACKBONE), (schema.NUM_ROUNDS, schema.DEFAULT_NUM_ROUNDS),
                          (schema.EVAL_EVERY, schema.DEFAULT_EVAL_EVERY),
                          (schema.LOCAL_EPOCHS, schema.DEFAULT_LOCAL_EPOCHS)]:
        assert module_defaults[name].default == default, name
    for name, default in [(schema.SOURCE, schema.DEFAULT_SOURCE), (schema.NUM_CLIENTS, schema.DEFAULT_NUM_CLIENTS),
                          ("data_dir", schema.DEFAULT_DATA_DIR)]:
        assert data_defaults[name].default == default, name
    # one default per setting: the settings groups that check a module's values default to its own
    from fl_lightning.core.local import LocalSGD
    from fl_lightning.core.settings import Federation

    for group, renamed in [(Federation, {}), (LocalSGD, {"epochs": schema.LOCAL_EPOCHS})]:
        for field in dataclasses.fields(group):
            name = renamed.get(field.name, field.name)
            assert field.default == module_defaults[name].default, f"{group.__name__}.{field.name}"
    # the task key's recipe is the store's: 12 hex digits of the sha1 of the sorted JSON
    fields = {"num_rounds": 3.0, "fraction": 1.0, "partition_params": {"alpha": 0.5}}
    text = schema.task_json(schema.canonical(fields))
    assert text == '{"fraction": 1, "num_rounds": 3, "partition_params": {"alpha": 0.5}}'
    assert schema.task_key(text) == hashlib.sha1(text.encode()).hexdigest()[:12]


def test_a_finished_run_reports_no_error_though_it_keeps_the_runners_error_tag():
    """A run the benchmark runner marked FAILED and a resumed fit finished keeps the runner's
    ``error`` tag (the library does not delete it); the leaderboard reports it only while the run
    has not finished."""
    from leaderboard.runs import RunRecord

    tags = {Tag.ERROR: "exit code 1; log x.log", Tag.RESUMED_AT_ROUND: "3"}
    record = lambda status: RunRecord("r", "suite", status, None, None, dict(tags), {}, {})  # noqa: E731
    assert record("FINISHED").error == ""
    assert record("FAILED").error == record("RUNNING").error == "exit code 1; log x.log"


@pytest.mark.integration
def test_a_sweep_of_plain_fits_is_never_merged_into_one_configuration(tmp_path, monkeypatch):
    """FedAvg at lr 0.01 and 0.2 and FedProx at mu 0.01 and 5.0, all seed 0, through the CLI: four
    configurations on the leaderboard, none superseded by another (issue 33)."""
    from leaderboard.runs import load_runs
    from leaderboard.table_building import build_tables

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    common = [f"--trainer.logger.init_args.tracking_uri={uri}", "--trainer.enable_checkpointing=false",
              "--model.num_rounds=2", "--model.eval_every=2", "--data.num_clients=10", "--model.fraction=0.5",
              "--seed_everything=0"]
    for extra in (["--model.lr=0.01"], ["--model.lr=0.2"], ["--model=FedProx", "--model.mu=0.01"],
                  ["--model=FedProx", "--model.mu=5.0"]):
        main(["fit", *common, *extra])
    runs = load_runs(uri, progress=lambda *a, **k: None).runs
    labels = sorted(run.tags["algorithm_config"] for run in runs)
    assert labels == ["FedAvg(lr=0.01)", "FedAvg(lr=0.2)", "FedProx(mu=0.01)", "FedProx(mu=5)"]  # lr 0.05: the default
    names = {run.tags["mlflow.runName"].split(" | ")[0] for run in runs}
    assert len(names) == 4  # the MLflow UI tells them apart too
    (table,) = build_tables(runs)
    assert sorted(row.config for row in table.rows) == labels and not any(row.superseded for row in table.rows)
