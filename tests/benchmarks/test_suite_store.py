"""``benchmarks.suite_store``: what a dry run reads of a suite's store, without creating or altering
it, and what it says about a store with no runs to count."""

import pytest
import yaml
from mlflow.tracking import MlflowClient

from benchmarks import suite_store
from benchmarks.suite_store import claims_folder, finished_runs_or_exit, finished_runs_read_only
from benchmarks.suites import load_suite
from fl_lightning.records.vocabulary import Tag
from tests.benchmarks.test_runner import SUITE


def test_a_dry_runs_view_of_the_store_says_what_it_found(tmp_path, monkeypatch):
    from mlflow.exceptions import MlflowException

    store = tmp_path / "runs.db"
    uri = f"sqlite:///{store}"
    assert finished_runs_read_only(uri, "tiny") == (
        set(), {}, f"the store {uri} does not exist yet (a dry run does not create it): every run is to run")
    assert not store.exists()
    store.touch()
    assert finished_runs_read_only(uri, "tiny") == (set(), {}, f"the store {uri} holds no runs yet: every run is "
                                                                "to run")
    store.unlink()
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(SUITE))
    cell = load_suite(str(path))[0]
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment(cell.suite), start_time=1_000, tags=cell.tags)
    client.set_terminated(run.info.run_id, "FINISHED", end_time=3_500)
    unfinished = client.create_run(client.get_experiment_by_name(cell.suite).experiment_id,
                                   tags={**cell.tags, Tag.SEED: "7"})
    client.set_terminated(unfinished.info.run_id, "FAILED")
    assert finished_runs_read_only(uri, cell.suite) == (
        {(cell.tags[Tag.CELL], cell.tags[Tag.SEED], cell.tags[Tag.CELL_CONFIG])}, {cell.tags[Tag.CELL]: [2.5]}, "")

    def unreadable(read_uri, suite):
        raise MlflowException("no such table: runs\nand the rest of it")

    finished = {(cell.tags[Tag.CELL], cell.tags[Tag.SEED], cell.tags[Tag.CELL_CONFIG])}
    assert finished_runs_or_exit(uri, cell.suite) == finished and finished_runs_or_exit(uri, "other") == set()
    monkeypatch.setattr(suite_store, "finished_runs", unreadable)
    with pytest.raises(SystemExit) as refused:
        finished_runs_read_only(uri, cell.suite)
    assert str(refused.value) == (f"cannot read the store {uri} without altering it (no such table: runs); "
                                  "run without --dry-run, or pass another --tracking-uri")
    with pytest.raises(SystemExit) as refused:
        finished_runs_or_exit(uri, cell.suite)
    assert str(refused.value) == f"cannot open the store {uri}: no such table: runs"


def test_the_claims_of_a_local_store_lie_beside_it_and_a_servers_in_the_log_folder(tmp_path, monkeypatch):
    """Every runner of a SQLite or file store finds its claims from whatever folder it runs in; a
    suite's name with ``/`` is one folder; a server's claims are the working folder's."""
    monkeypatch.chdir(tmp_path)
    logs = tmp_path / "benchmark_logs" / "fedfv" / "offline"
    assert claims_folder("sqlite:///runs.db", "fedfv/offline", logs) == tmp_path / "runs.db.claims" / "fedfv_offline"
    assert claims_folder(f"sqlite:///{tmp_path}/a/runs.db", "s", logs) == tmp_path / "a" / "runs.db.claims" / "s"
    stores = (f"file://{tmp_path}/mlruns", f"file:{tmp_path}/mlruns", "file:./mlruns", "mlruns",
              str(tmp_path / "mlruns"))
    for uri in stores:
        assert claims_folder(uri, "fedfv/offline", logs) == tmp_path / "mlruns" / ".claims" / "fedfv_offline", uri
    assert claims_folder("http://127.0.0.1:5000", "fedfv/offline", logs) == logs / "claims"


def test_the_summarys_accuracy_is_the_mean_client_accuracy_else_the_global_one(tmp_path, monkeypatch):
    """``final_metric``: (cell, seed) -> a run's ``test_acc_mean``; a run of one model tested on the
    shared set (``test_mode: global``) has ``global_test_acc`` only, or a NaN mean; a run with
    neither is left out."""
    import math

    from benchmarks.suite_store import final_metric
    from fl_lightning.records.vocabulary import Metric

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    client = MlflowClient(uri)
    suite = client.create_experiment("tiny")
    client.create_experiment("other")
    for cell, seed, metrics in (("a", "0", {Metric.TEST_ACC_MEAN: 0.5, Metric.GLOBAL_TEST_ACC: 0.25}),
                                ("a", "1", {Metric.GLOBAL_TEST_ACC: 0.75}),
                                ("b", "0", {Metric.TEST_ACC_MEAN: math.nan, Metric.GLOBAL_TEST_ACC: 0.125}),
                                ("b", "1", {"train_loss": 1.0})):
        run = client.create_run(suite, tags={Tag.CELL: cell, Tag.SEED: seed})
        for name, value in metrics.items():
            client.log_metric(run.info.run_id, name, value)
    other = client.create_run(client.get_experiment_by_name("other").experiment_id, tags={Tag.CELL: "c", Tag.SEED: "0"})
    client.log_metric(other.info.run_id, Metric.TEST_ACC_MEAN, 0.9)
    assert final_metric(uri, "tiny") == {("a", "0"): 0.5, ("a", "1"): 0.75, ("b", "0"): 0.125}


def test_a_cell_is_finished_by_a_finished_run_of_its_config_cell_and_seed_only(tmp_path):
    """``cell_finished``: the question a runner asks before each cell it claims."""
    from benchmarks.suite_store import cell_finished

    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    client = MlflowClient(uri)
    assert not cell_finished(uri, "tiny", "a", "0", "c1")  # no experiment yet
    suite = client.create_experiment("tiny")
    for status, tags in (("FAILED", {Tag.CELL: "a", Tag.SEED: "0", Tag.CELL_CONFIG: "c1"}),
                         ("FINISHED", {Tag.CELL: "a", Tag.SEED: "1", Tag.CELL_CONFIG: "c2"}),
                         ("FINISHED", {Tag.CELL: "b", Tag.CELL_CONFIG: "c1"})):  # a run without a seed tag
        client.set_terminated(client.create_run(suite, tags=tags).info.run_id, status)
    assert not cell_finished(uri, "tiny", "a", "0", "c1")  # failed
    assert not cell_finished(uri, "tiny", "a", "1", "c1")  # finished with another config
    assert cell_finished(uri, "tiny", "a", "1", "c2") and cell_finished(uri, "tiny", "b", "", "c1")
    assert not cell_finished(uri, "tiny", "b", "0", "c1")


def test_a_store_that_cannot_be_set_up_or_loses_its_experiment_is_refused_in_one_line(tmp_path, monkeypatch):
    from benchmarks.suite_store import ensure_experiment
    from fl_lightning.callbacks import mlflow_store

    uri = f"sqlite:///{tmp_path / 'runs.db'}"

    def locked(tracking_uri, name):
        try:
            raise OSError("database is locked\nretry later")
        except OSError as error:
            raise RuntimeError("could not open the experiment") from error

    monkeypatch.setattr(mlflow_store, "open_mlflow_experiment", locked)
    with pytest.raises(SystemExit) as refused:
        ensure_experiment(uri, "tiny")
    assert str(refused.value) == f"cannot set up the store {uri}: database is locked"
    monkeypatch.setattr(mlflow_store, "open_mlflow_experiment", lambda tracking_uri, name: None)  # made, then gone
    with pytest.raises(SystemExit) as refused:
        ensure_experiment(uri, "tiny")
    assert str(refused.value) == (f"the experiment 'tiny' of the store {uri} vanished while it was set up; "
                                  "run again")


def pages_of_two(monkeypatch):
    """MLflow's run searches answered in pages of 2 runs (MLflow's are of up to 1,000); the page
    tokens asked with, one per page read, are recorded in the list returned."""
    search, calls = MlflowClient.search_runs, []

    def small_pages(self, *args, **kwargs):
        calls.append(kwargs.get("page_token"))
        assert len(calls) <= 10, "the pages never end"
        return search(self, *args, **{**kwargs, "max_results": 2})

    monkeypatch.setattr(MlflowClient, "search_runs", small_pages)
    return calls


def test_the_finished_runs_are_read_page_by_page(tmp_path, monkeypatch):
    """``finished_runs`` follows MLflow's pages (of 1,000 runs; here of 2) to the last one."""
    from benchmarks.suite_store import finished_runs

    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    client = MlflowClient(uri)
    suite = client.create_experiment("tiny")
    for seed in range(5):
        run = client.create_run(suite, tags={Tag.CELL: "a", Tag.SEED: str(seed), Tag.CELL_CONFIG: "c"})
        client.set_terminated(run.info.run_id, "FINISHED")
    for tags in ({Tag.CELL: "b", Tag.CELL_CONFIG: "c"}, {Tag.CELL: "a fit by hand"}):  # no seed tag; no cell config
        client.set_terminated(client.create_run(suite, tags=tags).info.run_id, "FINISHED")
    calls = pages_of_two(monkeypatch)
    assert finished_runs(uri, "tiny") == {*{("a", str(seed), "c") for seed in range(5)}, ("b", "", "c")}
    assert len(calls) == 4


def test_a_real_runs_view_of_the_store_makes_it_and_counts_its_finished_runs(tmp_path):
    """The runner's ``_finished_runs`` without ``--dry-run``: the store and the suite's experiment
    are made, and its finished runs read, with no durations and no note."""
    from benchmarks.runner import _finished_runs

    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    assert _finished_runs(uri, "tiny", dry_run=False) == (set(), {}, "")
    client = MlflowClient(uri)
    tags = {Tag.CELL: "a", Tag.SEED: "0", Tag.CELL_CONFIG: "c"}
    client.set_terminated(client.create_run(client.get_experiment_by_name("tiny").experiment_id,
                                            tags=tags).info.run_id, "FINISHED")
    assert _finished_runs(uri, "tiny", dry_run=False) == ({("a", "0", "c")}, {}, "")


def test_a_store_file_locked_by_another_process_or_on_a_read_only_mount_is_refused_naming_the_option(
        tmp_path, monkeypatch):
    """``check_store`` before a suite's runs: an existing SQLite store is waited for while another
    process holds it locked (here 0.3 s, not 60) and refused after; one that cannot be written
    for another reason (a read-only mount) is refused at once, naming the runner's option."""
    import sqlite3

    from benchmarks.suite_store import check_store
    from fl_lightning.cli import preflight

    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    MlflowClient(uri).search_experiments()
    check_store(uri)  # a whole store, free: nothing said
    monkeypatch.setattr(preflight, "STORE_LOCK_WAIT_S", 0.3)
    holder = sqlite3.connect(tmp_path / "runs.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(SystemExit) as refused:
            check_store(uri)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert str(refused.value) == (f"the MLflow store {uri} stayed locked by another process for 0 s; run again once "
                                  "it is free (another fit or an `mlflow ui` writing to it), or pass another store")
    connect = sqlite3.connect

    class ReadOnlyMount:
        def __init__(self, connection):
            self.connection = connection

        def execute(self, statement, *args):
            if statement == "BEGIN IMMEDIATE":
                raise sqlite3.OperationalError("attempt to write a readonly database")
            return self.connection.execute(statement, *args)

        def __getattr__(self, name):
            return getattr(self.connection, name)

    monkeypatch.setattr(sqlite3, "connect", lambda *args, **kwargs: ReadOnlyMount(connect(*args, **kwargs)))
    with pytest.raises(SystemExit) as refused:
        check_store(uri)
    assert str(refused.value) == (f"the MLflow store {uri} cannot be written (attempt to write a readonly "
                                  "database); pass another --tracking-uri")
