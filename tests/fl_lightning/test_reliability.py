"""Nothing is lost: a fit killed with SIGKILL keeps the history it logged (its run stays RUNNING,
the leaderboard lists it as unfinished) and resumes from its last checkpoint into the same run;
two fits started together on one fresh SQLite store both land."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from fl_lightning.cli import main as fit_main
from tests.paths import REPO

ROOT = REPO
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the leaderboard package lives at the repository root

from leaderboard.__main__ import main as leaderboard_main  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]




def fit_command(uri: str, rounds: int, seed: int = 0) -> list[str]:
    return [
        sys.executable, "-m", "fl_lightning.cli", "fit", f"--trainer.logger.init_args.tracking_uri={uri}",
        f"--model.num_rounds={rounds}", "--model.eval_every=5", "--model.fraction=0.5",
        "--model.backbone=fl_logreg", "--model.batch_size=null", f"--model.seed={seed}",
        "--data.source=digits", "--data.num_clients=6", "--data.partition=iid", "--data.partition_params={}",
        f"--data.seed={seed}",
    ]


def start(command: list[str], folder: Path, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    with open(log, "w") as out:
        return subprocess.Popen(command, cwd=folder, stdout=out, stderr=subprocess.STDOUT, env=env)


def rounds_checkpointed(folder: Path) -> int:
    """Rounds done according to the fit's ``last.ckpt`` (0 before it exists or while it is written)."""
    import torch

    for path in folder.glob("checkpoints/*/*/checkpoints/last.ckpt"):
        try:
            return int(torch.load(path, map_location="cpu", weights_only=False)["epoch"]) + 1
        except Exception:  # noqa: BLE001 - a file being written: try again
            return 0
    return 0


def experiment_runs(uri: str, name: str = "fl-lightning") -> list:
    client = MlflowClient(uri)
    return client.search_runs([client.get_experiment_by_name(name).experiment_id])


def steps(uri: str, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in MlflowClient(uri).get_metric_history(run_id, key))


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_killed_fit_keeps_its_history_and_resumes_into_the_same_run(tmp_path, monkeypatch):
    uri, rounds, log = f"sqlite:///{tmp_path / 'runs.db'}", 40, tmp_path / "fit.log"
    process = start(fit_command(uri, rounds), tmp_path, log)
    deadline = time.monotonic() + 240
    while rounds_checkpointed(tmp_path) < 4:  # poll the files, not the store the fit writes to
        assert process.poll() is None, f"the fit ended before it was killed:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL

    (run,) = experiment_runs(uri)
    run_id = run.info.run_id
    assert run.info.status == "RUNNING"  # nobody marked it finished (or failed)
    logged = steps(uri, run_id, "clients_aggregated")
    assert len(logged) >= 3 and logged == list(range(1, len(logged) + 1)) and len(logged) < rounds
    evaluated = steps(uri, run_id, "test_acc_mean")  # every 5 rounds (round n+1's may precede its loss)
    assert evaluated == list(range(5, len(logged) + 1, 5)) or evaluated == list(range(5, len(logged) + 2, 5))

    site = tmp_path / "site"
    assert leaderboard_main(["build", "--tracking-uri", uri, "--out", str(site)]) == 0
    pages = "\n".join(p.read_text() for p in site.rglob("*.md"))
    listed = [line for line in pages.splitlines() if run_id in line]
    # its fit is gone: the leaderboard never counts it as running (the store still says RUNNING)
    assert listed and all("KILLED" in line and "RUNNING" not in line for line in listed), listed
    assert experiment_runs(uri)[0].info.status == "RUNNING"

    hint = [line for line in log.read_text().splitlines() if "resume it with:" in line]
    command = shlex.split(hint[-1].split("resume it with:", 1)[1])
    assert command[-1].endswith("last.ckpt")
    monkeypatch.chdir(tmp_path)
    fit_main(command[1:])
    (resumed,) = experiment_runs(uri)
    assert resumed.info.run_id == run_id and resumed.info.status == "FINISHED"
    assert steps(uri, run_id, "clients_aggregated") == list(range(1, rounds + 1))
    assert steps(uri, run_id, "test_acc_mean") == list(range(5, rounds + 1, 5))


def test_two_fits_into_one_fresh_sqlite_store_both_land(tmp_path):
    uri, rounds = f"sqlite:///{tmp_path / 'shared.db'}", 3
    processes = []
    for seed in (0, 1):
        folder = tmp_path / f"fit{seed}"
        folder.mkdir()
        processes.append((start(fit_command(uri, rounds, seed), folder, folder / "fit.log"), folder / "fit.log"))
    for process, log in processes:
        assert process.wait(timeout=300) == 0, log.read_text()[-5000:]
    runs = experiment_runs(uri)
    assert sorted(r.data.tags["seed"] for r in runs) == ["0", "1"]
    for run in runs:
        assert run.info.status == "FINISHED"
        assert steps(uri, run.info.run_id, "clients_aggregated") == list(range(1, rounds + 1))
