"""`fl-lightning fit` end to end into a temporary MLflow store, read back with mlflow.search_runs."""

import json

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from fl_lightning.cli import main
from fl_lightning.configs import DEFAULT_CONFIG

pytestmark = pytest.mark.integration


def short_run(store, *extra):
    return [
        "fit",
        f"--trainer.logger.init_args.tracking_uri={store}",
        "--model.num_rounds=3",
        "--model.eval_every=2",
        "--data.num_clients=20",
        *extra,
    ]


def test_default_config_exists_and_names_the_offline_job():
    text = DEFAULT_CONFIG.read_text()
    assert "mnist5k" in text and "FedAvg" in text


def test_fit_logs_a_complete_run(store, capsys):
    main(short_run(store, "--model=FedProx", "--model.mu=0.01"))
    out = capsys.readouterr().out
    assert "mlflow ui --backend-store-uri" in out

    runs = mlflow.search_runs(experiment_names=["fl-lightning"])
    assert len(runs) == 1
    run = runs.iloc[0]
    assert run["status"] == "FINISHED"
    tags = {k[len("tags."):]: v for k, v in run.items() if k.startswith("tags.")}
    assert tags["algorithm"] == "FedProx"
    assert tags["dataset"] == "mnist5k"
    assert tags["partition"] == "dirichlet"
    partition_params = json.loads(tags["partition_params"])  # Dirichlet's defaults, resolved
    assert partition_params["alpha"] == 0.5 and partition_params["min_size"] == 10
    assert tags["num_clients"] == "20"
    assert tags["participation"] == "0.1"
    assert tags["model"] == "fl_mlp"
    assert tags["seed"] == "0"
    assert tags["git_sha"]
    assert run["params.mu"] == "0.01"
    assert run["params.num_rounds"] == "3"
    assert run["params.source"] == "mnist5k"
    assert run["params.partition_params/alpha"] == "0.5"
    assert not [k for k in run.index if k.startswith("params._")]  # no LightningCLI internals

    client = MlflowClient(tracking_uri=store)
    run_id = run["run_id"]
    assert [m.step for m in client.get_metric_history(run_id, "clients_aggregated")] == [1, 2, 3]
    # the clients' losses before training: in the rounds that evaluate (FedProx does not read them)
    assert [m.step for m in client.get_metric_history(run_id, "train_loss")] == [2, 3]
    assert [m.step for m in client.get_metric_history(run_id, "test_acc_mean")] == [2, 3]
    for name in ("client_time_s", "server_time_s", "test_acc_jain", "test_acc_angle", "test_acc_worst5"):
        assert client.get_metric_history(run_id, name), name

    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"config.yaml", "partition", "clients"} <= artifacts
    assert {a.path for a in client.list_artifacts(run_id, "partition")} == {
        "partition/partition.png", "partition/partition_table.txt"}
    assert {a.path for a in client.list_artifacts(run_id, "clients")} == {
        "clients/client_accuracy.png", "clients/final_client_metrics.json"}
    local = client.download_artifacts(run_id, "clients/final_client_metrics.json")
    final = json.load(open(local))
    assert final["status"] == "finished"
    assert len(final["clients"]["test_accuracy"]) == 20
    config = open(client.download_artifacts(run_id, "config.yaml")).read()
    assert "FedProx" in config and "mu: 0.01" in config


def test_a_fit_without_progress_bar_runs_and_logs(store, capsys):
    """--trainer.enable_progress_bar false drops the CLI's own bar (Lightning refuses one then)."""
    main(short_run(store, "--trainer.enable_progress_bar=false"))
    assert "rounds:" not in capsys.readouterr().err
    (run,) = MlflowClient(store).search_runs([MlflowClient(store).get_experiment_by_name("fl-lightning").experiment_id])
    assert run.info.status == "FINISHED" and run.data.metrics["round"] == 3


def test_unknown_algorithm_is_refused(store, capsys):
    with pytest.raises(SystemExit):
        main(short_run(store, "--model=FedMagic"))
    err = capsys.readouterr().err
    assert "unknown algorithm 'FedMagic'" in err and "FedAvg" in err and "FedProx" in err


def test_unknown_dataset_lists_the_valid_names(store, capsys):
    with pytest.raises(SystemExit):
        main(short_run(store, "--data.source=imagenet"))
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: unknown data source 'imagenet'; valid names:") and "mnist5k" in error


# --------------------------------------------------------------------------- a new store from the template


@pytest.fixture(scope="module")
def template_cache(tmp_path_factory):
    """One parse/template cache for the module (making the template runs MLflow's migrations)."""
    with pytest.MonkeyPatch.context() as patch:
        folder = tmp_path_factory.mktemp("cache")
        patch.setenv("FL_LIGHTNING_CACHE", str(folder))
        yield folder


def schema(database):
    import sqlite3

    with sqlite3.connect(database) as connection:
        tables = sorted(row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type='table'"))
        return tables, connection.execute("SELECT version_num FROM alembic_version").fetchall()


def test_a_new_sqlite_store_is_a_copy_of_migrated_schema(template_cache, tmp_path, monkeypatch):
    from fl_lightning.callbacks.mlflow_store import open_mlflow_experiment, seed_sqlite_store

    monkeypatch.chdir(tmp_path)  # the default experiment's artifacts: ./mlruns/0, in the working directory
    MlflowClient(f"sqlite:///{tmp_path / 'migrated.db'}").search_experiments()  # MLflow's own migrations
    open_mlflow_experiment(f"sqlite:///{tmp_path / 'seeded.db'}", "fl-lightning")
    assert list(template_cache.glob("mlflow-store-*.db")), "no template was made"
    assert schema(tmp_path / "seeded.db") == schema(tmp_path / "migrated.db")
    client = MlflowClient(f"sqlite:///{tmp_path / 'seeded.db'}")
    experiments = {e.name: e for e in client.search_experiments()}
    assert set(experiments) == {"Default", "fl-lightning"}  # the default experiment is made here, not copied
    assert experiments["Default"].artifact_location == str(tmp_path / "mlruns" / "0")
    run = client.create_run(experiments["fl-lightning"].experiment_id)
    client.log_metric(run.info.run_id, "acc", 0.5, step=1)
    assert client.get_metric_history(run.info.run_id, "acc")[0].value == 0.5
    before = (tmp_path / "seeded.db").read_bytes()
    assert not seed_sqlite_store(f"sqlite:///{tmp_path / 'seeded.db'}")  # an existing store is left alone
    assert (tmp_path / "seeded.db").read_bytes() == before


def test_a_broken_template_is_made_again(template_cache, tmp_path, monkeypatch):
    from fl_lightning.callbacks.mlflow_store import empty_store_template, seed_sqlite_store

    template = empty_store_template()
    template.write_bytes(b"not a database")
    monkeypatch.chdir(tmp_path)
    assert seed_sqlite_store(f"sqlite:///{tmp_path / 'runs.db'}")
    assert schema(tmp_path / "runs.db")[1] == [(template.stem.rsplit("-", 1)[1],)]
    MlflowClient(f"sqlite:///{tmp_path / 'runs.db'}").search_experiments()


@pytest.mark.parametrize("uri", ["file:./mlruns", "sqlite:///:memory:", "sqlite:///no/such/folder/runs.db",
                                 "http://127.0.0.1:5000"])
def test_only_new_local_sqlite_files_are_seeded(template_cache, tmp_path, monkeypatch, uri):
    from fl_lightning.callbacks.mlflow_store import seed_sqlite_store

    monkeypatch.chdir(tmp_path)
    assert not seed_sqlite_store(uri)
    assert list(tmp_path.iterdir()) == []


def test_an_algorithm_chosen_on_the_command_line_keeps_its_own_defaults(store):
    """--model X over the default config's FedAvg: jsonargparse carries FedAvg's parsed base
    defaults over, so AFL ran (or was refused) at fraction 0.1 and FedMGDA+ without its
    improvement tracking. Each now runs with its own default; what the user gives still wins."""
    main(short_run(store, "--model=AFL", "--data.num_clients=4"))
    main(short_run(store, "--model=FedMGDAPlus", "--model.fraction=0.5", "--data.num_clients=4"))
    runs = mlflow.search_runs(experiment_names=["fl-lightning"])
    params = {row["tags.algorithm"]: row for _, row in runs.iterrows()}
    assert params["AFL"]["params.fraction"] == "1.0"  # AFL's own, not FedAvg's 0.1
    assert params["AFL"]["params.lr"] == "0.05"  # the default config's, as for any algorithm
    assert params["FedMGDAPlus"]["params.track_improvement"] == "True"
    assert params["FedMGDAPlus"]["params.fraction"] == "0.5"  # given: kept


def test_a_database_store_that_fails_is_retried_then_named(tmp_path, monkeypatch):
    """Two processes racing on a fresh store: the loser's failure is retried (jittered back-off),
    and a store that keeps failing is named in one RuntimeError after ``attempts`` tries."""
    from fl_lightning.callbacks import mlflow_store

    calls = []

    def flaky(uri):
        calls.append(uri)
        if len(calls) < 3:
            raise RuntimeError("table experiments already exists")

    monkeypatch.setattr(mlflow_store, "seed_sqlite_store", flaky)
    uri = f"sqlite:///{tmp_path / 'race.db'}"
    mlflow_store.open_mlflow_experiment(uri, "fl-lightning", attempts=5)
    assert len(calls) == 3
    assert "fl-lightning" in {e.name for e in MlflowClient(uri).search_experiments()}

    def broken(uri):
        calls.append(uri)
        raise RuntimeError("disk I/O error")

    calls.clear()
    monkeypatch.setattr(mlflow_store, "seed_sqlite_store", broken)
    with pytest.raises(RuntimeError, match=r"could not set up the MLflow store sqlite:///.*: disk I/O error"):
        mlflow_store.open_mlflow_experiment(uri, "other", attempts=3)
    assert len(calls) == 3
    calls.clear()
    with pytest.raises(RuntimeError, match="could not set up"):  # a file store is opened once
        mlflow_store.open_mlflow_experiment(f"file:{tmp_path / 'mlruns'}", "other", attempts=3)
    assert len(calls) == 1


def test_a_partition_figure_that_fails_is_a_warning_not_the_runs_end(store, monkeypatch):
    """The partition figure is drawn beside the first rounds (a background thread); if drawing
    fails, the fit finishes, says so in a warning, and keeps everything else."""
    from fl_lightning.callbacks import mlflow_run

    def broken(data):
        raise RuntimeError("no fonts")

    monkeypatch.setattr(mlflow_run, "partition_figure", broken)
    with pytest.warns(UserWarning, match="a partition figure was not logged to MLflow: RuntimeError: no fonts"):
        main(short_run(store))
    run = mlflow.search_runs(experiment_names=["fl-lightning"]).iloc[0]
    assert run["status"] == "FINISHED"
    paths = {a.path for a in MlflowClient(store).list_artifacts(run["run_id"], "partition")}
    assert paths == {"partition/partition_table.txt"}
