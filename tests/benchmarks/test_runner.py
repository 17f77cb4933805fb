"""The benchmark runner: grid expansion, tags, resuming, failed cells recorded, summary."""

import os
import re
from pathlib import Path

import mlflow
import pytest
import yaml

from benchmarks.command_line import main
from benchmarks.suites import deep_merge, expand_algorithms, literal_text, load_suite
from tests.paths import REPO

pytestmark = pytest.mark.integration

SUITE = {
    "suite": "tiny-offline",
    "paper": "fedfv",
    "scale": "offline",
    "description": "Tiny: four clients of digits # a comment sign too",
    "seeds": [0],
    "base": {
        "trainer": {"enable_checkpointing": False},
        "model": {"init_args": {"backbone": "fl_logreg", "num_rounds": 2, "eval_every": 1, "fraction": 1.0,
                                "batch_size": 16}},
        "data": {"source": "digits", "num_clients": 4, "partition": "iid"},
    },
    "benchmarks": [{"name": "digits/iid/full/fl_logreg"}],
    "algorithms": [
        {"class_path": "fl_lightning.algorithms.FedAvg"},
        {"class_path": "fl_lightning.algorithms.FedProx", "grid": {"mu": [0.0, 0.1]}},
    ],
}


def test_grid_expansion_and_labels():
    configs = expand_algorithms([
        {"class_path": "x.FedFV", "init_args": {"tau": 0}, "grid": {"alpha": [0.1, 0.5], "order": ["loss", "random"]},
         "label_args": ["tau"]},
        {"class_path": "x.FedAvg"},
    ])
    labels = [label for label, _ in configs]
    assert labels == ["FedFV(alpha=0.1,order=loss,tau=0)", "FedFV(alpha=0.1,order=random,tau=0)",
                      "FedFV(alpha=0.5,order=loss,tau=0)", "FedFV(alpha=0.5,order=random,tau=0)", "FedAvg"]
    assert configs[1][1]["init_args"] == {"tau": 0, "alpha": 0.1, "order": "random"}
    assert deep_merge({"a": {"b": 1, "c": 2}}, {"a": {"c": 3}}) == {"a": {"b": 1, "c": 3}}


def test_every_shipped_suite_expands():
    from benchmarks.suites import list_suites

    names = list_suites()
    assert {"fedfv/offline", "fedfv/paper"} <= set(names)
    for name in names:
        cells = load_suite(name)
        assert cells and len({(c.cell, c.seed) for c in cells}) == len(cells), name


def test_run_resume_and_failure(tmp_path, monkeypatch, capsys):
    """Two workers: one cell fails, another kills its worker while the other worker's cell runs;
    only those two fail."""
    monkeypatch.chdir(tmp_path)
    suite = dict(SUITE, benchmarks=[killer_benchmark(tmp_path, monkeypatch), *SUITE["benchmarks"]])
    # a cell that passes the suite's checks and fails when it runs (no such backbone)
    suite["algorithms"] = [
        *SUITE["algorithms"],
        {"class_path": "fl_lightning.algorithms.FedProx", "grid": {"mu": [0.5]}, "init_args": {"backbone": "fl_nope"}},
    ]
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(suite))
    uri = f"sqlite:///{tmp_path / 'runs.db'}"

    assert main(["run", str(path), "--tracking-uri", uri, "--jobs", "2"]) == 1  # the fl_nope cell fails
    out = capsys.readouterr().out
    assert "5 to run" in out and "FAILED" in out and "FedProx(mu=0.5)" in out
    assert "(its worker process was killed by SIGKILL; log " in out

    mlflow.set_tracking_uri(uri)
    runs = mlflow.search_runs(experiment_names=["tiny-offline"])
    finished = runs[runs["status"] == "FINISHED"]
    assert sorted(finished["tags.algorithm_config"]) == ["FedAvg", "FedProx(mu=0.0)", "FedProx(mu=0.1)"]
    assert set(finished["tags.suite"]) == {"tiny-offline"} and set(finished["tags.scale"]) == {"offline"}
    assert set(finished["tags.benchmark"]) == {"digits/iid/full/fl_logreg"}
    # free text reaches the store as text (LightningCLI would read "Tiny: ..." as a mapping)
    assert set(finished["tags.suite_description"]) == {literal_text(SUITE["description"])}
    assert literal_text(SUITE["description"]).replace("\u00a0", " ") == SUITE["description"]
    failed = runs[(runs["status"] == "FAILED") & runs["tags.error"].notna()].sort_values("tags.benchmark")
    assert list(failed["tags.benchmark"]) == ["digits/iid/full/fl_logreg", "digits/iid/full/fl_logreg/killed"]
    assert "fl_nope" in failed.iloc[0]["tags.error"] and "SIGKILL" in failed.iloc[1]["tags.error"]
    assert failed.iloc[0]["tags.mlflow.runName"].startswith("FedProx(mu=0.5) seed 0 | digits/iid/full/fl_logreg")
    # every cell's config stays beside its log, so a resume command printed in the log runs as printed
    logs = tmp_path / "benchmark_logs" / "tiny-offline"
    assert len(list(logs.glob("*.yaml"))) == 5 and len(list(logs.glob("*.log"))) == 5

    # resumable: the finished cells are skipped, only the failed ones run again
    assert main(["run", str(path), "--tracking-uri", uri]) == 1
    assert "3 already finished, 2 to run" in capsys.readouterr().out


def test_unknown_suite_lists_the_valid_ones():
    with pytest.raises(SystemExit, match="fedfv/offline"):
        load_suite("nope/offline")


def test_cells_seed_through_seed_everything_and_carry_their_controls(tmp_path):
    suite = dict(SUITE, seeds=[0, 3], description="A  tiny\n suite.")
    suite["benchmarks"] = [{"name": "digits/iid/full/fl_logreg"},
                           {"name": "digits/iid/full/fl_logreg/dropout", "control": "digits/iid/full/fl_logreg",
                            "config": {"model": {"init_args": {"dropout_prob": 0.2}}}}]
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(suite))
    cells = load_suite(str(path))
    for cell in cells:
        assert cell.config["seed_everything"] == cell.seed  # model and data take the run's seed
        assert "seed" not in cell.config["model"]["init_args"] and "seed" not in cell.config["data"]
        assert cell.tags["suite_description"] == "A tiny suite."
    variants = [c for c in cells if c.benchmark.endswith("dropout")]
    assert variants and all(c.tags["control"] == "digits/iid/full/fl_logreg" for c in variants)
    assert all("control" not in c.tags for c in cells if c not in variants)
    # the config digest tells an edited cell from the finished one
    digests = {(c.cell, c.seed): c.config_digest for c in cells}
    suite["base"]["model"]["init_args"]["num_rounds"] = 3
    path.write_text(yaml.safe_dump(suite))
    assert all(digests[(c.cell, c.seed)] != c.config_digest for c in load_suite(str(path)))

    suite["benchmarks"][1]["control"] = "no/such/benchmark"
    path.write_text(yaml.safe_dump(suite))
    with pytest.raises(SystemExit, match="control 'no/such/benchmark' is not a benchmark of the suite"):
        load_suite(str(path))


def snapshot(path):
    """The file as it is: bytes and modification time (a write changes one or the other)."""
    return path.read_bytes(), path.stat().st_mtime_ns


def test_a_dry_run_never_creates_or_alters_the_store(tmp_path, monkeypatch, capsys):
    """No file where there was none; an empty file, a store with runs and a store of an older
    MLflow schema stay byte for byte as they were; the finished runs are still counted."""
    import sqlite3

    from mlflow.tracking import MlflowClient

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(SUITE))
    store = tmp_path / "runs.db"
    uri = f"sqlite:///{store}"

    def dry_run():
        code = main(["run", str(path), "--tracking-uri", uri, "--dry-run"])
        return code, capsys.readouterr().out

    code, out = dry_run()  # no store yet: it is not created
    assert code == 0 and not store.exists()
    assert "0 already finished, 3 to run" in out and "does not exist yet" in out and out.count("would run") == 3

    store.touch()  # an empty file: not made a store
    before = snapshot(store)
    code, out = dry_run()
    assert code == 0 and snapshot(store) == before and "3 to run" in out

    store.unlink()  # a store with one finished cell: counted, read without a write
    client = MlflowClient(uri)
    cell = load_suite(str(path))[0]
    run = client.create_run(client.create_experiment(cell.suite), tags=cell.tags)
    client.set_terminated(run.info.run_id, "FINISHED")
    before = snapshot(store)
    code, out = dry_run()
    assert code == 0 and snapshot(store) == before
    assert "1 already finished, 2 to run" in out and cell.cell not in out

    connection = sqlite3.connect(store)  # a store of an older MLflow: not migrated
    connection.execute("UPDATE alembic_version SET version_num = '451aebb31d03'")
    connection.commit()
    connection.close()
    before = snapshot(store)
    with pytest.raises(SystemExit, match=r"schema of another MLflow version .*`mlflow db upgrade sqlite:///"):
        dry_run()
    assert snapshot(store) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs.db", "tiny.yaml"]  # no logs, no artifacts


def test_a_store_error_is_one_line_without_a_traceback(tmp_path):
    """Through the real command line, before any run starts: one `error:` line, exit code 2."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "benchmarks", "run", "fedfv/offline", "--dry-run", "--tracking-uri",
                           f"sqlite:///{tmp_path / 'no' / 'runs.db'}"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("error: "), done.stderr
    assert (
        "the folder of the MLflow store sqlite:///" in done.stderr and "create it, or pass another store" in done.stderr
    )
    assert not (tmp_path / "no").exists()


KILLER = '''
import os
import signal

from lightning.pytorch import Callback


class KillWorker(Callback):
    """Test-only: the process running the fit dies at once, as if killed from outside."""

    def on_train_start(self, trainer, pl_module):
        os.kill(os.getpid(), signal.SIGKILL)
'''


def killer_benchmark(tmp_path, monkeypatch) -> dict:
    """A benchmark whose fit SIGKILLs its own process (the callback module importable by workers,
    which are spawned with the parent's sys.path)."""
    (tmp_path / "runner_killer.py").write_text(KILLER)
    monkeypatch.syspath_prepend(str(tmp_path))
    return {
        "name": "digits/iid/full/fl_logreg/killed",
        "algorithms": [{"class_path": "fl_lightning.algorithms.FedAvg"}],
        "config": {"trainer": {"callbacks": [{"class_path": "runner_killer.KillWorker"}]}},
    }


def metric_histories(uri: str, suite: str) -> dict:
    """(cell, seed) -> every logged metric's (step, value) history, of the store's FINISHED runs
    (but the wall-clock ones, ``client_time_s`` and ``server_time_s``)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(suite)
    histories = {}
    for run in client.search_runs([experiment.experiment_id], "attributes.status = 'FINISHED'"):
        histories[(run.data.tags["cell"], run.data.tags["seed"])] = {
            key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
            for key in sorted(run.data.metrics) if not key.endswith("_time_s")}
    return histories


def test_cells_in_a_reused_worker_log_what_fresh_processes_log(tmp_path, monkeypatch, capsys):
    """One worker runs every cell in turn (the later cells after the earlier ones' leftovers):
    every metric's whole history equals the one-process-per-run path's, value for value."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(dict(SUITE, seeds=[0, 1])))
    isolated, reused = f"sqlite:///{tmp_path / 'isolated.db'}", f"sqlite:///{tmp_path / 'reused.db'}"
    assert main(["run", str(path), "--tracking-uri", isolated, "--isolate", "--seeds", "1"]) == 0
    assert main(["run", str(path), "--tracking-uri", reused, "--jobs", "1"]) == 0
    capsys.readouterr()
    fresh, warm = metric_histories(isolated, "tiny-offline"), metric_histories(reused, "tiny-offline")
    assert len(fresh) == 3 and len(warm) == 6  # the isolated store: seed 1 only; the worker ran seed 0 first
    for key, histories in fresh.items():
        assert len(histories["test_acc_mean"]) >= 2  # evaluated every round
        assert warm[key] == histories, key
    assert warm[("digits/iid/full/fl_logreg|FedAvg", "0")] != warm[("digits/iid/full/fl_logreg|FedAvg", "1")]


def test_a_worker_serves_on_after_a_failed_cell_and_a_killed_one_is_replaced(tmp_path, monkeypatch):
    from benchmarks.launchers import WarmWorkers
    from benchmarks.runner import run_cell

    monkeypatch.chdir(tmp_path)
    suite = dict(SUITE, benchmarks=[*SUITE["benchmarks"], killer_benchmark(tmp_path, monkeypatch)])
    suite["algorithms"] = [
        *SUITE["algorithms"][:1],
        {"class_path": "fl_lightning.algorithms.FedProx", "grid": {"mu": [-1.0]}},
    ]
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(suite))
    good, bad, killed = load_suite(str(path))
    assert "mu=-1.0" in bad.cell and "killed" in killed.cell
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    workers = WarmWorkers(jobs=1, threads=1)
    (worker,) = workers.workers
    try:
        assert run_cell(bad, uri, tmp_path, workers)[1] == "FAILED"
        first = worker.process.pid
        assert run_cell(good, uri, tmp_path, workers)[1] == "FINISHED"
        assert worker.process.pid == first  # the failure did not end the worker
        _, status, _, error = run_cell(killed, uri, tmp_path, workers)
        assert status == "FAILED" and error.startswith("its worker process was killed by SIGKILL")
        assert run_cell(good, uri, tmp_path, workers)[1] == "FINISHED"
        assert worker.process.pid != first  # a fresh worker took the dead one's place
        workers.max_resident_mb = 0.0  # a worker over the memory limit is retired after its cell
        assert run_cell(good, uri, tmp_path, workers)[1] == "FINISHED" and worker.process is None
    finally:
        workers.close()
    assert worker.process is None


def test_a_fit_in_a_worker_leaves_the_process_as_it_found_it(tmp_path, monkeypatch, request):
    """The environment (PL_GLOBAL_SEED, MLFLOW_TRACKING_URI), the working
    folder, the signal handlers and torch's process-wide flags (Trainer(deterministic=True))."""
    import os
    import signal
    import sys

    import torch

    from benchmarks.launchers import _fit_in_this_process
    from benchmarks.runner import _cell_config_file

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # as in a worker: pytest's arguments are not the fit's
    # a fresh worker's flag (an earlier in-process test in this pytest worker may have turned it on)
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(False)
    request.addfinalizer(lambda: torch.use_deterministic_algorithms(was_deterministic))
    suite = dict(SUITE, algorithms=SUITE["algorithms"][:1])
    suite["base"] = deep_merge(SUITE["base"], {"trainer": {"deterministic": True}})
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(suite))
    (cell,) = load_suite(str(path))
    config = _cell_config_file(cell, f"sqlite:///{tmp_path / 'runs.db'}")
    before = (dict(os.environ), os.getcwd(), torch.are_deterministic_algorithms_enabled(),
              [signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)])
    assert _fit_in_this_process(config, str(tmp_path / "fit.log")) == 0, (tmp_path / "fit.log").read_text()
    assert "PL_GLOBAL_SEED" not in os.environ and not torch.are_deterministic_algorithms_enabled()
    assert (dict(os.environ), os.getcwd(), torch.are_deterministic_algorithms_enabled(),
            [signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)]) == before


def test_cells_submitted_as_submitit_jobs_log_what_reused_workers_log(tmp_path, monkeypatch, capsys):
    """--cluster local: every cell a job of submitit's local executor (a SLURM cluster takes the same
    path); a failing cell fails alone, with its log; the metrics equal the reused worker's."""
    pytest.importorskip("submitit", reason="pip install 'fl-lightning[cluster]'")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", f"{REPO}:{tmp_path}")  # jobs import benchmarks
    suite = dict(SUITE)
    suite["algorithms"] = [
        *SUITE["algorithms"][:1],
        {"class_path": "fl_lightning.algorithms.FedProx", "grid": {"mu": [0.5]}, "init_args": {"backbone": "fl_nope"}},
    ]
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(suite))
    jobs, reused = f"sqlite:///{tmp_path / 'jobs.db'}", f"sqlite:///{tmp_path / 'reused.db'}"
    assert main(["run", str(path), "--tracking-uri", jobs, "--cluster", "local", "--jobs", "2",
                 "--cpus-per-job", "1", "--job-folder", str(tmp_path / "jobs")]) == 1  # the fl_nope cell fails
    out = capsys.readouterr().out
    assert "FINISHED" in out and "FAILED" in out and "exit code" in out
    assert any((tmp_path / "jobs").iterdir())  # submitit's job folders
    assert main(["run", str(path), "--tracking-uri", reused, "--jobs", "1"]) == 1
    capsys.readouterr()
    submitted, warm = metric_histories(jobs, "tiny-offline"), metric_histories(reused, "tiny-offline")
    assert list(submitted) == [("digits/iid/full/fl_logreg|FedAvg", "0")]
    assert submitted == warm


def test_cluster_options_need_a_cluster(capsys):
    with pytest.raises(SystemExit):
        main(["run", "fedfv/offline", "--slurm-partition", "gpu"])
    assert "go with --cluster" in capsys.readouterr().err


def test_a_cluster_without_submitit_is_refused_before_the_store_exists(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "submitit" else real(name, *a))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["run", "fedfv/offline", "--cluster", "local", "--tracking-uri", f"sqlite:///{tmp_path / 'runs.db'}"])
    assert "pip install 'fl-lightning[cluster]'" in capsys.readouterr().err
    assert not (tmp_path / "runs.db").exists() and not (tmp_path / "benchmark_logs").exists()


@pytest.mark.parametrize(("algorithm", "message"), [
    ({"class_path": "fl_lightning.algorithms.FedProxx"},
     "no algorithm class 'fl_lightning.algorithms.FedProxx'; did you mean 'fl_lightning.algorithms.FedProx'"),
    ({"class_path": "fl_lightning.algorithms.FedProx", "grid": {"mu": [0.1, -1.0]}}, "mu must be >= 0, got -1.0"),
    ({"class_path": "fl_lightning.algorithms.FedFV", "grid": {"alpha": [1.5]}}, "alpha"),
    ({"class_path": "fl_lightning.algorithms.FedFV", "init_args": {"tua": 2}}, "did you mean 'tau'"),
])
def test_a_users_suite_is_checked_before_any_cell_runs_or_the_store_is_made(algorithm, message, tmp_path, monkeypatch,
                                                                               capsys):
    from benchmarks.command_line import main

    monkeypatch.chdir(tmp_path)
    suite = {"suite": "mine", "paper": "fedfv", "scale": "offline", "seeds": [0],
             "base": {"model": {"init_args": {"backbone": "fl_logreg", "num_rounds": 2}},
                      "data": {"source": "digits", "num_clients": 4, "partition": "iid"}},
             "benchmarks": [{"name": "digits/iid"}],
             "algorithms": [{"class_path": "fl_lightning.algorithms.FedAvg"}, algorithm]}
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(suite))
    with pytest.raises(SystemExit) as refused:
        main(["run", str(path), "--tracking-uri", f"sqlite:///{tmp_path / 'runs.db'}"])
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert not (tmp_path / "runs.db").exists() and not (tmp_path / "benchmark_logs").exists()


def _processes_in_group(group: int, wait_s: float) -> list[str]:
    """The command lines of the processes still in process group ``group`` after up to ``wait_s``."""
    import time

    deadline = time.time() + wait_s
    while True:
        left = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[2]) == group and fields[0] != "Z":
                    left.append((stat.parent / "cmdline").read_text().replace("\0", " ").strip())
            except (OSError, IndexError, ValueError):
                continue
        if not left or time.time() > deadline:
            return left
        time.sleep(0.2)


@pytest.mark.integration
@pytest.mark.parametrize(("signal_name", "to_group", "line"), [
    ("SIGINT", True, "interrupted (SIGINT)"),    # Ctrl-C: the terminal signals the whole process group
    ("SIGTERM", False, "terminated (SIGTERM)"),  # kill <runner>: the runner passes it on to its workers
])
def test_a_stopped_suite_ends_the_cell_in_flight_killed_prints_the_summary_and_a_rerun_resumes_it(
        signal_name, to_group, line, tmp_path):
    """Ctrl-C (SIGINT to the runner's process group, as a terminal sends it) or SIGTERM to the
    runner alone (``kill``, a background job): exit 128 + the signal, the summary, the cell's run
    KILLED (not FAILED), no worker left behind; the suite run again continues that run from its
    checkpoint."""
    import signal
    import subprocess
    import sys
    import time

    from mlflow.tracking import MlflowClient

    suite = dict(SUITE, algorithms=SUITE["algorithms"][:1])
    suite["base"] = deep_merge(SUITE["base"], {"trainer": {"enable_checkpointing": True},
                                               "model": {"init_args": {"num_rounds": 1000, "eval_every": 50}}})
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(suite))
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "benchmarks", "run", str(path), "--tracking-uri", uri]
    runner = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    client = MlflowClient(uri)
    try:
        deadline, checkpoint = time.time() + 120, []
        while time.time() < deadline and not checkpoint:
            time.sleep(0.5)
            checkpoint = list(tmp_path.glob("checkpoints/*/*/checkpoints/last.ckpt"))
        assert checkpoint, "the cell never wrote a checkpoint"
        time.sleep(0.3)
        signum = signal.Signals[signal_name]
        if to_group:
            os.killpg(runner.pid, signum)
        else:
            os.kill(runner.pid, signum)
        out, err = runner.communicate(timeout=120)
        left = _processes_in_group(runner.pid, wait_s=10)
        assert not left, f"left running after the runner exited: {left}"  # its workers end with it
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
    assert runner.returncode == 128 + signum, err
    assert line in err and "Traceback" not in err
    assert "KILLED" in out and "suite tiny-offline stopped" in out and "mean acc" in out  # the summary
    (run,) = client.search_runs([client.get_experiment_by_name("tiny-offline").experiment_id])
    assert run.info.status == "KILLED"
    done_before = len(client.get_metric_history(run.info.run_id, "clients_aggregated"))
    assert 0 < done_before < 1000

    # again: the same run continues from its checkpoint, every round logged once
    rerun = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    (again,) = client.search_runs([client.get_experiment_by_name("tiny-offline").experiment_id])
    assert again.info.run_id == run.info.run_id and again.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "clients_aggregated")]
    assert sorted(steps) == list(range(1, 1001))
    log = next((tmp_path / "benchmark_logs" / "tiny-offline").glob("*.log")).read_text()
    assert "Resuming from" in log


def test_the_summary_names_the_store_and_the_command_that_builds_its_leaderboard(tmp_path, monkeypatch, capsys):
    """The last lines: the store the suite wrote and the leaderboard command for it, which runs as
    printed from the suite's folder."""
    import shlex

    from leaderboard.__main__ import main as leaderboard_main

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tiny.yaml"
    one_round = deep_merge(SUITE["base"], {"model": {"init_args": {"num_rounds": 1}}})
    path.write_text(yaml.safe_dump(dict(SUITE, base=one_round, algorithms=SUITE["algorithms"][:1])))
    uri = "sqlite:///my runs.db"  # relative to the suite's folder, as the default store is
    assert main(["run", str(path), "--tracking-uri", uri]) == 0
    store, command = capsys.readouterr().out.strip().splitlines()[-2:]
    assert store == f"Store: {uri}"
    assert command.startswith("Build the leaderboard from it:  ")
    words = shlex.split(command.split(":  ", 1)[1])
    assert Path(words[0]).name == "fl-leaderboard" and words[1:] == ["build", "--tracking-uri", uri]
    assert leaderboard_main(words[1:]) == 0
    assert (tmp_path / "leaderboard_build" / "index.html").is_file()


@pytest.mark.parametrize("digest", ["5e8736190253", "123456789012", "0e1234567890", "abc123def456", "12e4a5b6c7d8"])
def test_a_cell_config_tag_reaches_the_store_as_written(digest, tmp_path):
    """The cell_config tag goes through the logger's config, which jsonargparse reads as YAML: a
    digest that reads as a number ('5e8736190253' became 'Inf') must still arrive as the tag the
    runner looks for, or the run never counts as done and runs again on every resume."""
    from typing import Any

    from jsonargparse import ActionConfigFile, ArgumentParser

    from benchmarks.suites import digest_tag

    tag = digest_tag(digest)
    assert digest in tag and (tag == digest) == (not re.fullmatch(r"[0-9]+|[0-9]+e[0-9]+", digest))
    parser = ArgumentParser()
    parser.add_argument("--config", action=ActionConfigFile)
    parser.add_argument("--tags", type=dict[str, Any] | None)  # MLFlowLogger's tags
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"tags": {"cell_config": tag}}))
    assert str(parser.parse_args(["--config", str(tmp_path / "c.yaml")]).tags["cell_config"]) == tag


@pytest.mark.parametrize("launcher", ["warm", "isolated"])
def test_a_cell_that_waited_while_the_suite_stopped_starts_no_process(launcher, tmp_path):
    """A cell handed to a launcher after the stop (it waited for a worker) is answered 'not
    started', and no worker or fit process is started for it."""
    from benchmarks.launchers import NOT_STARTED, STOPPED, IsolatedProcesses, WarmWorkers

    pool = WarmWorkers(1, 1) if launcher == "warm" else IsolatedProcesses(1)
    STOPPED.set()
    try:
        assert pool.run(str(tmp_path / "cell.yaml"), str(tmp_path / "cell.log")) == NOT_STARTED
    finally:
        STOPPED.clear()
    if launcher == "warm":
        assert all(worker.process is None for worker in pool.workers)
    else:
        assert not pool.running
    pool.close()
