"""``python -m leaderboard export``: the run set as tidy tables, round-tripped against the leaderboard.

One small real MLflow store (SQLite in a temporary folder, written with the MLflow client): two
suites; runs with the tags the runner and ``fl-lightning fit`` write and metric histories over a few
rounds; a seed run twice (the older run superseded), a resumed run that logged one step twice, a NaN,
a FAILED run, an older run without a task tag (its task rebuilt from params), per-agent CGSV series
and a metric the leaderboard does not read (``train_loss``). The per-run table read back must equal
what the leaderboard computes from the same store; the rounds table must equal MLflow's histories.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from tests.paths import REPO

ROOT = REPO
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the leaderboard package lives at the repository root

from leaderboard import export, export_reading  # noqa: E402
from leaderboard.__main__ import main as leaderboard_main  # noqa: E402
from leaderboard.convergence import converged, still_improving  # noqa: E402
from leaderboard.runs import HISTORY_METRICS, load_runs, report_count  # noqa: E402
from leaderboard.table_building import build_tables  # noqa: E402
from leaderboard.tables import COLUMNS, HEADLINE, headline_value, run_value  # noqa: E402

SUITE_A, SUITE_B = "alpha-offline", "beta-offline"
BENCHMARK = "mnist5k/shards-200x2/p0.1/fl_mlp"
ROUNDS = 6
START = 1_767_225_600_000  # 2026-01-01
TASK = {"source": "mnist5k", "source_params": {}, "partition": "shards",
        "partition_params": {"num_shards": 200, "shards_per_client": 2}, "num_clients": 100, "fraction": 0.1,
        "model": "fl_mlp", "num_rounds": ROUNDS, "local_epochs": 1, "batch_size": None, "test_mode": "local",
        "local_test_fraction": 0.2, "dropout_prob": 0.0}


def task_tags(**changes) -> dict[str, str]:
    text = json.dumps({**TASK, **changes}, sort_keys=True)
    return {"task": text, "task_key": hashlib.sha256(text.encode()).hexdigest()[:12]}


def curve(final: float, rounds: int = ROUNDS) -> list[float]:
    """A rising accuracy curve ending at ``final``."""
    return [final - 0.05 * (rounds - step) for step in range(1, rounds + 1)]


def log_run(client: MlflowClient, experiment_id: str, suite: str, config: str, seed: int, final: float, *,
            minute: int, status: str = "FINISHED", tags: dict | None = None, params: dict | None = None,
            extra: list[Metric] = ()) -> str:
    base = {"suite": suite, "scale": "offline", "paper": "fedfv", "benchmark": BENCHMARK,
            "cell": f"{BENCHMARK}|{config}", "algorithm_config": config, "algorithm": config.split("(")[0],
            "seed": str(seed), "data_seed": str(seed), "git_sha": "a" * 40, "client_test": "local",
            "client_test_size": "local: 10 samples per client", "per_client_models": "false",
            "machine": "test box", "mlflow.runName": f"{config} seed {seed}", **task_tags()}
    merged = {k: v for k, v in {**base, **(tags or {})}.items() if v is not None}
    start = START + minute * 60_000
    run_id = client.create_run(experiment_id, start_time=start, tags=merged).info.run_id
    metrics = []
    for step, accuracy in enumerate(curve(final), start=1):
        time = start + step * 1000
        metrics += [
            Metric("test_acc_mean", accuracy, time, step),
            Metric("global_test_acc", accuracy - 0.01, time, step),
            Metric("test_acc_std", 0.2 - 0.01 * step, time, step),
            Metric("test_acc_worst10", accuracy / 2, time, step),
            Metric("client_time_s", 0.1 * step, time, step),
            Metric("server_time_s", 0.01, time, step),
            Metric("conflicts_model", float(step % 3), time, step),
            Metric("train_loss", 1.0 / step, time, step),
        ]
    client.log_batch(run_id, metrics=[*metrics, *extra],
                     params=[Param(k, v) for k, v in {"lr": "0.1", "seed": str(seed), **(params or {})}.items()])
    client.set_terminated(run_id, status, end_time=start + 30_000)
    return run_id


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("export")
    uri = f"sqlite:///{tmp / 'runs.db'}"
    client = MlflowClient(tracking_uri=uri)
    a = client.create_experiment(SUITE_A, artifact_location=(tmp / "artifacts").as_uri())
    b = client.create_experiment(SUITE_B, artifact_location=(tmp / "artifacts").as_uri())
    ids: dict[str, str] = {}
    for seed in range(3):
        ids[f"FedAvg/{seed}"] = log_run(client, a, SUITE_A, "FedAvg", seed, 0.80 + 0.01 * seed, minute=10 + seed)
        ids[f"FedFV/{seed}"] = log_run(client, a, SUITE_A, "FedFV(alpha=0.1,tau=1)", seed, 0.85 + 0.01 * seed,
                                       minute=10 + seed)
    ids["superseded"] = log_run(client, a, SUITE_A, "FedAvg", 0, 0.10, minute=1)  # seed 0 again, earlier
    ids["failed"] = log_run(client, a, SUITE_A, "FedFV(alpha=0.1,tau=1)", 3, 0.30, minute=20, status="FAILED",
                            tags={"error": "exit code 1; log x.log:\nRuntimeError: NaN"})
    # a resumed run: step 6 logged twice (the later value counts), and a NaN at step 3
    resumed = [Metric("test_acc_mean", 0.123, START + 40 * 60_000 + 900_000, ROUNDS),
               Metric("test_acc_std", float("nan"), START + 40 * 60_000 + 3500, 3)]
    ids["resumed"] = log_run(client, a, SUITE_A, "FedAvg", 5, 0.70, minute=40, extra=resumed)
    # CGSV with per-agent series and its rho, in the other suite; one run with another task (12 rounds)
    for seed in range(2):
        agents = [Metric(f"cgsv_r/{agent}", 0.1 * agent + 0.01 * step, START + step, step)
                  for agent in range(3) for step in range(1, ROUNDS + 1)]
        ids[f"CGSV/{seed}"] = log_run(client, b, SUITE_B, "CGSV(beta=1.0)", seed, 0.60 + 0.02 * seed, minute=50 + seed,
                                      tags={"paper": "cgsv", "per_client_models": "true"},
                                      extra=[*agents, Metric("cgsv_rho", 40.0 + seed, START, ROUNDS)])
    # the client-level artifact a fit writes at its end (a complete export carries it)
    client.log_dict(ids["CGSV/0"], {"status": "FINISHED", "rounds_completed": ROUNDS,
                                    "clients": {"client": [0, 1, 2], "test_accuracy": [0.5, 0.625, float("nan")],
                                                "num_test": [8, 8, 0]}}, "clients/final_client_metrics.json")
    client.set_tag(ids["CGSV/0"], "note", "a tag the runs table has no column for")
    ids["other-task"] = log_run(client, b, SUITE_B, "FedAvg", 0, 0.9, minute=60, tags=task_tags(num_rounds=12))
    # an older run: no task tag, its task rebuilt from params (mixed types in a task column)
    ids["untagged"] = log_run(client, b, SUITE_B, "FedAvg", 1, 0.65, minute=61,
                              tags={"task": None, "task_key": None, "client_test": None},
                              params={"num_rounds": str(ROUNDS), "num_clients": "6", "source": "digits",
                                      "partition": "iid", "fraction": "all", "test_mode": "local"})
    return {"uri": uri, "tmp": tmp, "db": tmp / "runs.db", "ids": ids, "client": client}


def run_export(store: dict, out: Path, *args: str) -> int:
    """``python -m leaderboard export`` in this process: its exit status (argparse's usage errors included)."""
    try:
        return leaderboard_main(["export", "--tracking-uri", store["uri"], "--out", str(out), *args])
    except SystemExit as stop:
        return int(stop.code)


@pytest.fixture(scope="module")
def exported(store) -> dict:
    out = store["tmp"] / "export"
    before = (store["db"].read_bytes(), store["db"].stat().st_mtime_ns)
    assert run_export(store, out, "--all-metrics") == 0
    after = (store["db"].read_bytes(), store["db"].stat().st_mtime_ns)
    leaderboard = load_runs(store["uri"], progress=lambda message: None)
    # round_trip: pandas before 3 reads a float's text to within a bit by default, not exactly
    return {
        "out": out,
        "runs": pd.read_csv(out / "runs.csv", float_precision="round_trip"),
        "rounds": pd.read_csv(out / "rounds.csv"),
        "store_unchanged": before == after,
        "leaderboard": leaderboard,
        "tables": build_tables(leaderboard.runs),
    }


def same(exported_value, expected) -> bool:
    """Equal to float precision; missing on both sides counts as equal."""
    missing = expected is None or (isinstance(expected, float) and math.isnan(expected))
    if missing or pd.isna(exported_value):
        return missing and pd.isna(exported_value)
    if isinstance(expected, float):
        return math.isclose(float(exported_value), expected, rel_tol=1e-12, abs_tol=1e-15)
    return exported_value == expected


# --- the per-run table ---------------------------------------------------------------------------


def test_export_reads_the_store_without_changing_it(exported):
    assert exported["store_unchanged"]
    assert sorted(p.name for p in exported["out"].iterdir()) == ["rounds.csv", "rounds.parquet",
                                                                 "runs.csv", "runs.parquet"]


def test_runs_table_equals_what_the_leaderboard_computes(exported):
    table = exported["runs"].set_index("run_id")
    runs = exported["leaderboard"].runs
    assert list(table.index) == [run.run_id for run in runs]  # the same runs, in the store's order
    for run in runs:
        row = table.loc[run.run_id]
        for column in COLUMNS:
            assert same(row[column.key], run_value(run, column.key)), (run.run_id, column.key)
        assert same(row["converged_test_acc_mean"], converged(run, "global_test_acc" if headline_value(run)[1]
                                                                 else "test_acc_mean"))
        for metric in ("global_test_acc", "test_acc_std", "test_acc_worst10"):
            assert same(row[f"converged_{metric}"], converged(run, metric))
        assert row["headline_derived"] == headline_value(run)[1]
        assert row["still_improving"] == still_improving(run)
        assert row["rounds_completed"] == run.rounds_completed()
        assert (row["task_key"], row["task_recorded_in"]) == (run.task.key, run.task.source)
        assert json.loads(row["task"]) == dict(run.task.fields)
        assert (row["algorithm_config"], row["benchmark"], row["suite"], row["experiment"], row["status"]) == (
            run.config, run.benchmark, run.suite, run.experiment, run.status)
        assert str(row["seed"]) == run.seed and row["git_sha"] == run.git_sha
        assert json.loads(row["params"]) == run.params


def test_table_means_of_the_exported_runs_equal_the_leaderboard_cells(exported):
    """The round trip at the level the pages show: mean over the runs in the means of each
    (table, configuration) equals the leaderboard's cell, for every column."""
    runs = exported["runs"]
    used = runs[runs["in_means"]]
    checked = 0
    for table in exported["tables"]:
        for row in table.rows:
            mine = used[(used["leaderboard_table"] == table.slug) & (used["algorithm_config"] == row.config)]
            assert sorted(mine["run_id"]) == sorted(r.run_id for r in row.used_runs)
            for key, stat in row.stats.items():
                values = mine[key].dropna()
                if stat is None:
                    assert values.empty
                    continue
                assert len(values) == stat.n and math.isclose(values.mean(), stat.mean, rel_tol=1e-12)
                checked += 1
    assert checked >= 10


def test_superseded_failed_and_untagged_runs(exported, store):
    table = exported["runs"].set_index("run_id")
    ids = store["ids"]
    assert not table.loc[ids["superseded"], "in_means"]
    assert table.loc[ids["superseded"], "superseded_by"] == ids["FedAvg/0"]
    assert table.loc[ids["failed"], "status"] == "FAILED" and "RuntimeError" in table.loc[ids["failed"], "error"]
    assert not table.loc[ids["failed"], "in_means"]
    untagged = table.loc[ids["untagged"]]
    assert untagged["task_recorded_in"] == "params" and untagged["task_source"] == "digits"
    # the fraction column mixes a number (tagged runs) and text ("all"): text, numbers as their JSON
    assert untagged["task_fraction"] == "all" and table.loc[ids["FedAvg/0"], "task_fraction"] == "0.1"
    assert json.loads(table.loc[ids["FedAvg/0"], "task_partition_params"]) == TASK["partition_params"]
    assert table.loc[ids["other-task"], "leaderboard_table"] != table.loc[ids["CGSV/0"], "leaderboard_table"]


def test_parquet_holds_the_same_as_csv_with_types(exported):
    csv = exported["runs"]
    parquet = pd.read_parquet(exported["out"] / "runs.parquet")
    assert list(parquet.columns) == list(csv.columns)
    assert str(parquet["seed"].dtype) == "Int64" and str(parquet["test_acc_mean"].dtype) == "float64"
    assert str(parquet["start_time"].dtype).startswith("datetime64")
    for column in ("run_id", "algorithm_config", "task_key", "leaderboard_table"):
        assert list(parquet[column].fillna("")) == list(csv[column].fillna(""))
    for column in [c.key for c in COLUMNS]:
        assert parquet[column].equals(csv[column].astype("float64")), column
    rounds = pd.read_parquet(exported["out"] / "rounds.parquet")
    assert len(rounds) == len(exported["rounds"])
    assert list(rounds.columns) == list(export_reading.ROUND_COLUMNS)


# --- the rounds table ------------------------------------------------------------------------------


def mlflow_history(client: MlflowClient, run_id: str, name: str) -> dict[int, float]:
    """MLflow's history of one metric, one value per step: the one logged last."""
    latest: dict[int, tuple[int, float]] = {}
    for metric in client.get_metric_history(run_id, name):
        if metric.step not in latest or metric.timestamp >= latest[metric.step][0]:
            latest[metric.step] = (metric.timestamp, metric.value)
    return {step: value for step, (_, value) in latest.items()}


def test_rounds_table_is_one_row_per_run_round_metric_and_equals_mlflow(exported, store):
    rounds = exported["rounds"]
    assert list(rounds.columns) == list(export_reading.ROUND_COLUMNS)
    assert not rounds.duplicated(["run_id", "round", "metric"]).any()
    client = store["client"]
    for run in exported["leaderboard"].runs:
        mine = rounds[rounds["run_id"] == run.run_id]
        assert set(mine["metric"]) == set(run.metrics)  # --all-metrics: every metric the run logged
        for name in run.metrics:
            got = dict(zip(*mine.loc[mine["metric"] == name, ["round", "value"]].T.values))
            expected = mlflow_history(client, run.run_id, name)
            assert got.keys() == expected.keys(), (run.run_id, name)
            assert all(same(got[step], value) for step, value in expected.items()), (run.run_id, name)
    resumed = rounds[(rounds["run_id"] == store["ids"]["resumed"]) & (rounds["metric"] == "test_acc_mean")]
    assert resumed.loc[resumed["round"] == ROUNDS, "value"].tolist() == [0.123]  # logged last
    nan = rounds[(rounds["run_id"] == store["ids"]["resumed"]) & (rounds["metric"] == "test_acc_std")]
    assert nan.loc[nan["round"] == 3, "value"].isna().all()


def test_rounds_table_without_all_metrics_holds_the_leaderboards_histories(store, tmp_path):
    assert run_export(store, tmp_path, "--format", "parquet", "--experiments", SUITE_B) == 0
    rounds = pd.read_parquet(tmp_path / "rounds.parquet")
    assert "train_loss" not in set(rounds["metric"])
    assert {"test_acc_mean", "client_time_s", "cgsv_r/0", "cgsv_r/2"} <= set(rounds["metric"])
    assert set(rounds["metric"]) <= set(HISTORY_METRICS) | {f"cgsv_r/{agent}" for agent in range(3)}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rounds.parquet", "runs.parquet"]


# --- filters ---------------------------------------------------------------------------------------


def exported_ids(store: dict, out: Path, *args: str) -> set[str]:
    assert run_export(store, out, "--format", "csv", *args) == 0
    runs = pd.read_csv(out / "runs.csv")
    rounds = pd.read_csv(out / "rounds.csv")
    assert set(rounds["run_id"]) <= set(runs["run_id"])
    return set(runs["run_id"])


def test_filters_by_experiment_and_tag(store, tmp_path):
    ids = store["ids"]
    in_b = {ids["CGSV/0"], ids["CGSV/1"], ids["other-task"], ids["untagged"]}
    assert exported_ids(store, tmp_path / "b", "--experiments", SUITE_B) == in_b
    assert exported_ids(store, tmp_path / "cgsv", "--tag", "algorithm=CGSV") == {ids["CGSV/0"], ids["CGSV/1"]}
    # one key, several values: any; several keys: all
    assert exported_ids(store, tmp_path / "seeds", "--experiments", SUITE_A, "--tag", "seed=1",
                        "--tag", "seed=2") == {ids["FedAvg/1"], ids["FedAvg/2"], ids["FedFV/1"], ids["FedFV/2"]}
    assert exported_ids(store, tmp_path / "both", "--tag", "seed=0", "--tag", "algorithm=FedAvg",
                        ) == {ids["FedAvg/0"], ids["superseded"], ids["other-task"]}
    # the leaderboard's tables are those of the experiments read: a tag filter does not change them
    runs = pd.read_csv(tmp_path / "both" / "runs.csv").set_index("run_id")
    assert runs.loc[ids["superseded"], "superseded_by"] == ids["FedAvg/0"]


def test_empty_selection_writes_headers_only(tmp_path):
    uri = f"sqlite:///{tmp_path / 'empty.db'}"
    client = MlflowClient(tracking_uri=uri)
    client.create_experiment("nothing-yet", artifact_location=(tmp_path / "artifacts").as_uri())
    assert leaderboard_main(["export", "--tracking-uri", uri, "--out", str(tmp_path / "out")]) == 0
    runs = pd.read_parquet(tmp_path / "out" / "runs.parquet")
    assert runs.empty and {"run_id", "task_key", "test_acc_mean", "converged_test_acc_mean"} <= set(runs.columns)
    assert list(pd.read_csv(tmp_path / "out" / "rounds.csv").columns) == list(export_reading.ROUND_COLUMNS)


# --- bad input: one line, exit 2, nothing written ----------------------------------------------------


@pytest.mark.parametrize("args, says", [
    (["--experiments", "no-such-suite"], "unknown experiment"),
    (["--tag", "suite"], "is not KEY=VALUE"),
    (["--tag", "=x"], "is not KEY=VALUE"),
    (["--tag", "colour=blue"], "no run read has a tag 'colour'"),
    (["--tag", "seed=99"], "values of 'seed': 0, 1, 2, 3, 5"),
    (["--tag", "seed=3", "--tag", "algorithm=CGSV"], "not together"),
    (["--experiments", SUITE_B, "--tag", "algorithm=FedFV"], "values of 'algorithm': CGSV, FedAvg"),
    (["--format", "xlsx"], "invalid choice"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(store, tmp_path, capsys, args, says):
    out = tmp_path / "out"
    assert run_export(store, out, *args) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize("kind", ["missing", "empty", "not-sqlite"])
def test_a_store_that_is_not_there_is_refused_and_not_created(tmp_path, capsys, kind):
    path = tmp_path / "store.db"
    if kind == "empty":
        path.touch()
    elif kind == "not-sqlite":
        path.write_text("hello")
    assert leaderboard_main(["export", "--tracking-uri", f"sqlite:///{path}", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert path.exists() == (kind != "missing") and (kind == "missing" or path.stat().st_size == (0 if kind == "empty"
                                                                                                 else 5))
    assert not (tmp_path / "out").exists()


def test_out_that_is_a_file_is_refused(store, tmp_path, capsys):
    out = tmp_path / "file.txt"
    out.write_text("keep me")
    assert run_export(store, out) == 2
    assert "is a file" in capsys.readouterr().err and out.read_text() == "keep me"


def test_uniform_types_per_column():
    assert export._uniform([1, 2.5, None]) == [1, 2.5, None]
    assert export._uniform([{"b": 1, "a": 2}, None]) == ['{"a":2,"b":1}', None]
    assert export._uniform([1, "all", True, None]) == ["1", "all", "true", None]


# --- the command line and the site -----------------------------------------------------------------


@pytest.mark.slow
def test_command_line_export(store, tmp_path):
    out = tmp_path / "cli"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run([sys.executable, "-m", "leaderboard", "export", "--tracking-uri", store["uri"],
                           "--out", str(out), "--tag", f"suite={SUITE_A}", "--format", "csv"],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "metric histories and client metrics" in done.stderr and "runs.csv" in done.stderr  # progress: stderr
    assert done.stdout == ""
    runs = pd.read_csv(out / "runs.csv")
    assert set(runs["suite"]) == {SUITE_A} and len(runs) == 9
    bad = subprocess.run([sys.executable, "-m", "leaderboard", "export", "--tracking-uri", store["uri"],
                          "--out", str(tmp_path / "bad"), "--tag", "nonsense"],
                         capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "KEY=VALUE" in bad.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_site_offers_the_export_for_download(store, exported, tmp_path):
    out = tmp_path / "site"
    assert leaderboard_main(["build", "--tracking-uri", store["uri"], "--out", str(out),
                             "--paper-numbers", str(tmp_path / "no-papers")]) == 0
    runs = pd.read_csv(out / "runs.csv")
    expected = exported["runs"]
    assert list(runs["run_id"]) == list(expected["run_id"])
    assert runs[HEADLINE].equals(expected[HEADLINE])
    rounds = pd.read_parquet(out / "rounds.parquet")
    assert len(rounds) == len(exported["rounds"][exported["rounds"]["metric"].isin(
        set(HISTORY_METRICS) | {f"cgsv_r/{agent}" for agent in range(3)})])
    index = (out / "index.html").read_text()
    assert 'href="runs.csv"' in index and 'href="rounds.parquet"' in index
    assert "runs.csv" in (out / "index.md").read_text()


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_lines_off_a_terminal_and_a_bar_on_one():
    lines = io.StringIO()
    progress = export.ProgressLines(lines)
    progress("Read 20 runs from 1 experiment(s)")
    for done in (10, 20):  # counts arrive typed (issue 35), as load_runs reports them
        report_count(progress, "metric histories and client metrics", done, 20)
    assert lines.getvalue().splitlines() == ["Read 20 runs from 1 experiment(s)",
                                             "  metric histories and client metrics: 10/20 runs",
                                             "  metric histories and client metrics: 20/20 runs"]
    terminal = Terminal()
    progress = export.ProgressLines(terminal)
    progress("Read 20 runs from 1 experiment(s)")
    report_count(progress, "metric histories and client metrics", 10, 20)
    assert progress.bar is not None and progress.bar.n == 10
    report_count(progress, "metric histories and client metrics", 20, 20)
    assert progress.bar is None  # closed when done
    assert "20/20" in terminal.getvalue() and "metric histories and client metrics" in terminal.getvalue()


def test_an_export_over_tables_already_there_is_refused_unless_asked(store, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "runs.csv").write_text("a user's own table\n")
    assert run_export(store, out, "--format", "csv") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "runs.csv already exists" in err and "--overwrite" in err
    assert (out / "runs.csv").read_text() == "a user's own table\n" and not (out / "rounds.csv").exists()
    assert run_export(store, out, "--format", "csv", "--overwrite") == 0
    assert pd.read_csv(out / "runs.csv")["run_id"].nunique() > 1


# --- a complete export: the runs as the store holds them -------------------------------------------


def comparable(run) -> dict:
    """A run's fields as a build reads them, NaN written as text (NaN != NaN); the code version is
    left out (read from git for a store, from the export's column for an export)."""
    def plain(value):
        if isinstance(value, float) and math.isnan(value):
            return "NaN"
        if isinstance(value, dict):
            return {key: plain(item) for key, item in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(item) for item in value]
        return value
    fields = {name: getattr(run, name) for name in ("run_id", "experiment", "status", "start_time", "end_time",
                                                    "tags", "params", "metrics", "histories", "client_metrics")}
    return plain(fields)


@pytest.mark.parametrize("file_format", ["csv", "parquet"])
def test_a_complete_export_reads_back_as_the_store_holds_the_runs(store, tmp_path, file_format):
    out = tmp_path / "complete"
    assert run_export(store, out, "--all-metrics", "--complete", "--format", file_format) == 0
    assert (out / f"records.{file_format}").exists()
    from_store = {run.run_id: comparable(run) for run in load_runs(store["uri"], progress=lambda m: None).runs}
    from_export = {run.run_id: comparable(run)
                   for run in export_reading.read_export([out], progress=lambda m: None).runs}
    assert from_store.keys() == from_export.keys() and len(from_store) == len(store["ids"])
    for run_id, fields in from_store.items():
        assert from_export[run_id] == fields, run_id
    # the artifact and a tag the runs table has no column for come back; a plain export loses them
    cgsv = store["ids"]["CGSV/0"]
    assert from_export[cgsv]["client_metrics"]["clients"]["test_accuracy"] == [0.5, 0.625, "NaN"]
    plain_out = tmp_path / "plain"
    assert run_export(store, plain_out, "--format", file_format) == 0
    plain = {run.run_id: run for run in export_reading.read_export([plain_out], progress=lambda m: None).runs}
    assert plain[cgsv].client_metrics is None and "note" not in plain[cgsv].tags
    assert from_export[cgsv]["tags"]["note"] == "a tag the runs table has no column for"
