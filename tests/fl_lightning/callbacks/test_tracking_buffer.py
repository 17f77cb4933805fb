"""The tracking buffer's smaller rules (callbacks.tracking_buffer), each pinned where a mutant of it
survived the outage tests: the wait a fit gives a lost server comes from the environment, a call
other than a metric batch is retried through an outage (and only through one), and the file of
unsent metrics is read and rewritten whole."""

from __future__ import annotations

import json

import pytest
from lightning.pytorch.loggers import MLFlowLogger
from mlflow.tracking import MlflowClient

from fl_lightning.callbacks import tracking_buffer
from fl_lightning.callbacks.tracking_buffer import (
    RETRY_FIRST_S,
    SERVER_WAIT_ENV,
    SERVER_WAIT_S,
    UNSENT_FILE,
    BufferedClient,
    buffer_metrics,
    read_unsent,
    replay_unsent,
    server_wait_s,
    write_unsent,
)
from fl_lightning.faults import TrackingServerLost
from tests.fl_lightning.callbacks.test_tracking_outage import REFUSED, FlakyServer


@pytest.mark.parametrize(("value", "seconds"), [("7.5", 7.5), ("", SERVER_WAIT_S), ("soon", SERVER_WAIT_S),
                                                (None, SERVER_WAIT_S)])
def test_the_wait_for_a_lost_server_is_read_from_the_environment(value, seconds, monkeypatch):
    if value is None:
        monkeypatch.delenv(SERVER_WAIT_ENV, raising=False)
    else:
        monkeypatch.setenv(SERVER_WAIT_ENV, value)
    assert server_wait_s() == seconds


def test_a_fits_logger_gets_the_wait_the_environment_sets(tmp_path, monkeypatch):
    monkeypatch.setenv(SERVER_WAIT_ENV, "7")
    logger = MLFlowLogger(experiment_name="e", tracking_uri=f"sqlite:///{tmp_path / 'runs.db'}")
    logger.experiment  # noqa: B018 - makes the logger's client
    buffered = buffer_metrics(logger, every_s=5.0)
    assert isinstance(buffered, BufferedClient) and buffered.server_wait_s == 7.0
    assert buffer_metrics(logger, every_s=5.0) is buffered  # wrapped once


class TagServer(FlakyServer):
    """Refuses ``set_tag`` with ``errors`` in turn, then answers."""

    def __init__(self, *errors):
        super().__init__()
        self.errors, self.tags = list(errors), []

    def set_tag(self, run_id, key, value):
        if self.errors:
            raise self.errors.pop(0)
        self.tags.append((key, value))
        return "set"


def test_a_call_that_meets_an_outage_is_retried_until_the_server_answers(monkeypatch):
    """Retried after the pauses of an outage (0.5 s, then 1 s: doubling), no longer."""
    slept = []
    monkeypatch.setattr(tracking_buffer.time, "sleep", slept.append)
    server, told = TagServer(RuntimeError(REFUSED), RuntimeError(REFUSED)), []
    buffered = BufferedClient(server, every_s=0.0, server_wait_s=600)
    buffered.on_outage = told.append
    assert buffered.set_tag("r", "k", "v") == "set"
    assert server.tags == [("k", "v")] and told[0].startswith("tracking server unreachable") and told[-1] is None
    first, second = slept  # the pauses planned, less the moments since (the second doubles the first)
    assert 0 < first <= RETRY_FIRST_S < second <= 2 * RETRY_FIRST_S


def test_a_call_the_server_refuses_is_not_retried():
    server = TagServer(ValueError("RESOURCE_DOES_NOT_EXIST: run 'r' not found"))
    buffered = BufferedClient(server, every_s=0.0, server_wait_s=600)
    with pytest.raises(ValueError, match="not found"):
        buffered.set_tag("r", "k", "v")
    assert server.tags == [] and buffered.unreachable_since is None


def test_a_call_that_outlasts_the_wait_says_what_it_met():
    refused = RuntimeError(REFUSED)
    buffered = BufferedClient(TagServer(refused), every_s=0.0, server_wait_s=0.0)
    with pytest.raises(TrackingServerLost) as lost:
        buffered.set_tag("r", "k", "v")
    assert lost.value.__cause__ is refused  # the traceback file shows the connection's own error


def test_an_unsent_file_without_metrics_holds_none(tmp_path):
    path = tmp_path / UNSENT_FILE
    path.write_text(json.dumps({"tracking_uri": "http://127.0.0.1:5999"}))
    assert read_unsent(path) == []
    path.write_text("[1, 2]")  # not the file's form
    assert read_unsent(path) == []


def test_the_entries_of_other_runs_keep_their_store_when_one_run_is_written(tmp_path):
    store = MlflowClient(f"sqlite:///{tmp_path / 'runs.db'}")
    run_id = store.create_run(store.create_experiment("e")).info.run_id
    entry = {"key": "train_loss", "value": 0.5, "timestamp": 1000, "step": 1}
    write_unsent(tmp_path / UNSENT_FILE, "http://elsewhere:5000",
                 [{**entry, "run_id": run_id}, {**entry, "run_id": "another"}])
    assert replay_unsent(store, run_id, tmp_path, rounds_completed=1) == 1
    left = json.loads((tmp_path / UNSENT_FILE).read_text())
    assert left["tracking_uri"] == store.tracking_uri and [e["run_id"] for e in left["metrics"]] == ["another"]


class RecordingClient:
    """A store that answers every call and notes it."""

    tracking_uri = "sqlite:///runs.db"

    def __init__(self):
        self.calls = []

    def log_batch(self, run_id, metrics=(), params=(), tags=(), **kwargs):
        self.calls.append(("log_batch", [m.step for m in metrics], list(params), list(tags), kwargs))

    def set_terminated(self, run_id, status=None):
        self.calls.append(("set_terminated", status))


def test_only_metric_batches_are_held_the_rest_passes_through_whole():
    """Metrics alone wait for the next write; a batch with tags or params, or one asked for
    asynchronously (``synchronous=False``: MLflow's own queue), goes to the store at once, every
    argument with it; so does any other call, keywords included."""
    from mlflow.entities import Metric, RunTag

    store = RecordingClient()
    buffered = BufferedClient(store, every_s=3600)  # nothing is due on its own
    loss = Metric("train_loss", 0.5, 1000, 1)
    buffered.log_batch("r", metrics=[loss])
    buffered.log_batch("r", metrics=[loss], synchronous=True)
    assert store.calls == [] and len(buffered.held) == 2
    buffered.log_batch("r", tags=[RunTag("k", "v")])
    buffered.log_batch("r", metrics=[Metric("round", 1.0, 1000, 2)], synchronous=False)
    buffered.set_terminated("r", status="KILLED")
    assert store.calls == [
        ("log_batch", [1, 1], [], [], {}),  # what was held, written first
        ("log_batch", [], [], [RunTag("k", "v")], {}),
        ("log_batch", [2], [], [], {"synchronous": False}),
        ("set_terminated", "KILLED"),
    ]


class Clock:
    """``time.monotonic`` that stands still until moved."""

    def __init__(self, now=100.0):
        self.now = now

    def __call__(self):
        return self.now


def test_a_write_is_due_when_its_time_comes_to_the_instant(monkeypatch):
    """``every_s`` after the last write (0: at every call, even within one tick of the clock); in an
    outage, at the planned retry and not ``every_s`` later."""
    from mlflow.entities import Metric

    clock = Clock()
    monkeypatch.setattr(tracking_buffer.time, "monotonic", clock)
    store = RecordingClient()
    BufferedClient(store, every_s=0.0).log_batch("r", metrics=[Metric("x", 1.0, 1, 1)])
    assert len(store.calls) == 1  # the clock did not move: still due
    buffered = BufferedClient(store, every_s=5.0)
    clock.now += 5.0
    buffered.log_batch("r", metrics=[Metric("x", 1.0, 1, 2)])
    assert len(store.calls) == 2  # exactly every_s later

    server = FlakyServer()
    buffered = BufferedClient(server, every_s=3600, server_wait_s=600)
    server.down = True
    buffered.held.append(("r", Metric("x", 1.0, 1, 1)))
    buffered.flush()  # refused: retried at next_try, 0.5 s on
    server.down = False
    clock.now = buffered.next_try
    buffered.log_batch("r", metrics=[Metric("x", 1.0, 1, 2)])
    assert server.written == [("x", 1), ("x", 2)]  # at the planned retry, though every_s has not passed


def test_a_lost_server_found_by_a_metric_write_says_what_it_met():
    from mlflow.entities import Metric

    refused = RuntimeError(REFUSED)

    class Refusing(FlakyServer):
        def log_batch(self, run_id, metrics=(), params=(), tags=()):
            raise refused

    buffered = BufferedClient(Refusing(), every_s=0.0, server_wait_s=0.0)
    with pytest.raises(TrackingServerLost) as lost:
        buffered.log_batch("r", metrics=[Metric("x", 1.0, 1, 1)])
    assert lost.value.__cause__ is refused
