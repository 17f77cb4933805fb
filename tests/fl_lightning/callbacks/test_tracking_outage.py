"""A tracking server that stops answering: the fit goes on with its metrics held and retried
(callbacks.tracking_buffer); a server that comes back gets every round once; one that does not
ends the fit in one line, its metrics kept in ``unsent_metrics.json`` and written by the resume.

The last test kills a real ``mlflow server`` in the middle of a fit and starts it again."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from fl_lightning.callbacks.tracking_buffer import UNSENT_FILE, BufferedClient, replay_unsent
from fl_lightning.faults import TrackingServerLost, fault_line

REFUSED = ("API request to http://127.0.0.1:5999/api/2.0/mlflow/runs/log-batch failed with exception "
           "HTTPConnectionPool(host='127.0.0.1', port=5999): Max retries exceeded with url: ... "
           "(Caused by NewConnectionError('Failed to establish a new connection: [Errno 111] Connection refused'))")


class FlakyServer:
    """An MlflowClient stand-in that refuses every call while ``down``."""

    tracking_uri = "http://127.0.0.1:5999"

    def __init__(self):
        self.down = False
        self.written: list[tuple[str, int]] = []
        self.ended = False

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        if self.down:
            raise RuntimeError(REFUSED)
        self.written += [(metric.key, metric.step) for metric in metrics]

    def set_terminated(self, run_id, status):
        if self.down:
            raise RuntimeError(REFUSED)
        self.ended = True


def metric(step, key="train_loss"):
    return Metric(key, 0.5, 1000 + step, step)


def test_an_outage_holds_the_metrics_and_retries_until_the_server_answers(monkeypatch):
    server, told = FlakyServer(), []
    buffered = BufferedClient(server, every_s=0.0, server_wait_s=600)
    buffered.on_outage = told.append
    buffered.log_batch("r", metrics=[metric(1)])
    server.down = True
    for step in range(2, 6):
        buffered.log_batch("r", metrics=[metric(step)])  # no exception: the fit goes on
        buffered.next_try = 0.0  # as if the pause had passed
    assert server.written == [("train_loss", 1)] and buffered.rounds_held() == 4
    assert told[-1] == "tracking server unreachable, retrying (4 rounds held)"
    server.down = False
    buffered.log_batch("r", metrics=[metric(6)])
    assert server.written == [("train_loss", step) for step in range(1, 7)]  # in order, each once
    assert told[-1] is None and buffered.unreachable_since is None


def test_the_pause_between_tries_doubles_up_to_a_limit():
    server = FlakyServer()
    server.down = True
    buffered = BufferedClient(server, every_s=0.0, server_wait_s=600)
    pauses = []
    for step in range(10):
        buffered.held.append(("r", metric(step)))
        buffered.flush()
        pauses.append(round(buffered.next_try - time.monotonic()))
    assert pauses[:4] == [0, 1, 2, 4] and max(pauses) == 30


def test_a_server_that_does_not_come_back_ends_the_fit_and_its_metrics_are_kept_then_replayed(tmp_path):
    server = FlakyServer()
    buffered = BufferedClient(server, every_s=0.0, server_wait_s=0.05)
    server.down = True
    buffered.log_batch("r", metrics=[metric(1), metric(1, "round")])
    time.sleep(0.06)
    buffered.next_try = 0.0
    with pytest.raises(TrackingServerLost) as lost:
        buffered.log_batch("r", metrics=[metric(2), metric(3)])
    assert (
        fault_line(lost.value)
        == "the tracking server http://127.0.0.1:5999 stopped answering and did not come back within 0.05 s"
    )
    with pytest.raises(TrackingServerLost):  # the run's end does not wait again
        buffered.set_terminated("r", "FAILED")
    spilled = buffered.spill(tmp_path)
    assert spilled == tmp_path / UNSENT_FILE and buffered.held == []
    assert [(m["key"], m["step"]) for m in json.loads(spilled.read_text())["metrics"]] == [
        ("train_loss", 1), ("round", 1), ("train_loss", 2), ("train_loss", 3)]

    # the resume: into a real store, only rounds up to the checkpoint's (2), none twice
    store = MlflowClient(f"sqlite:///{tmp_path / 'runs.db'}")
    run_id = store.create_run(store.create_experiment("e")).info.run_id
    text = spilled.read_text().replace('"run_id": "r"', f'"run_id": "{run_id}"')
    spilled.write_text(text)
    store.log_metric(run_id, "round", 0.5, step=1)  # one of them had reached the store before its answer was lost
    assert replay_unsent(store, run_id, tmp_path, rounds_completed=2) == 2
    assert sorted(m.step for m in store.get_metric_history(run_id, "train_loss")) == [1, 2]
    assert [m.step for m in store.get_metric_history(run_id, "round")] == [1]
    assert not spilled.exists()
    assert replay_unsent(store, run_id, tmp_path, rounds_completed=2) == 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class MlflowServer:
    """``mlflow server`` on a SQLite store in ``folder``, started, stopped (SIGKILL) and started again."""

    def __init__(self, folder: Path, port: int):
        self.folder, self.port, self.process = folder, port, None

    @property
    def uri(self):
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait=True):
        command = [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--backend-store-uri",
            f"sqlite:///{self.folder / 'srv.db'}",
            "--artifacts-destination",
            str(self.folder / "art"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
        ]
        log = open(self.folder / "server.log", "a")  # noqa: SIM115 - the server's, for as long as it runs
        self.process = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        if wait:
            self.wait_up()

    def wait_up(self, timeout=120):
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"{self.uri}/health", timeout=1)
                return
            except OSError:
                time.sleep(0.3)
        raise RuntimeError(f"mlflow server did not start: {(self.folder / 'server.log').read_text()[-2000:]}")

    def kill(self):
        if self.process is not None:
            os.killpg(self.process.pid, 9)
            self.process.wait()


@pytest.mark.integration
@pytest.mark.usefixtures("one_thread")
def test_a_tracking_server_killed_and_started_again_mid_fit_loses_nothing(tmp_path, capsys, monkeypatch):
    from fl_lightning.cli import main
    from tests.fl_lightning.cli.test_resume_cli import fit_args

    monkeypatch.chdir(tmp_path)
    server = MlflowServer(tmp_path, free_port())
    server.start()
    log_batch, restarted = MlflowClient.log_batch, []

    def outage_at_round_3(self, run_id, metrics=(), *args, **kwargs):
        if not restarted and any(m.step == 3 for m in metrics):  # the server dies as round 3 is sent
            server.kill()
            restarted.append(threading.Thread(target=server.start))
            restarted[0].start()
        return log_batch(self, run_id, metrics, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", outage_at_round_3)
    monkeypatch.setattr(
        "fl_lightning.callbacks.mlflow_run.MLflowRunInfo.__init__.__defaults__", (0.0,))  # write every round
    try:
        main(fit_args(server.uri, "--model.num_rounds=12"))
        out = capsys.readouterr().out
        restarted[0].join()
        client = MlflowClient(server.uri)
        [run] = client.search_runs([client.get_experiment_by_name("fl-lightning").experiment_id])
        history = sorted(m.step for m in client.get_metric_history(run.info.run_id, "train_loss"))
    finally:
        server.kill()
    assert f"the tracking server {server.uri} is not answering: the fit goes on" in out
    assert f"the tracking server {server.uri} answers again" in out
    assert run.info.status == "FINISHED"
    assert history == list(range(1, 13))  # every round once
