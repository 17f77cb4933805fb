"""Metrics held on their way to the MLflow store: written in batches, and kept through an outage
of a tracking server.

:class:`BufferedClient` wraps the ``MlflowClient`` a Lightning ``MLFlowLogger`` writes through.
Metrics are written together every few seconds, before every checkpoint and at the run's end.
When the tracking server stops answering, the fit goes on: the metrics are held and the write
is retried with growing pauses (0.5 s doubling to 30 s) for up to ``server_wait_s`` seconds
(``SERVER_WAIT_S``, 300 s; ``$FL_LIGHTNING_SERVER_WAIT_S``), while the progress bar says
"tracking server unreachable, retrying (N rounds held)". If the server does not come back, the
fit ends (``faults.TrackingServerLost``) and what is held is written to ``unsent_metrics.json``
beside the run's checkpoints (:meth:`BufferedClient.spill`); resuming the fit from that folder
writes them into the run first (:func:`replay_unsent`), so no round's metrics are lost.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import MLFlowLogger
from mlflow.entities import Metric

from fl_lightning import private_api
from fl_lightning.callbacks.checkpointing import replace_synced
from fl_lightning.faults import TrackingServerLost, naming, server_unreachable

SERVER_WAIT_S = 300.0
SERVER_WAIT_ENV = "FL_LIGHTNING_SERVER_WAIT_S"
RETRY_FIRST_S, RETRY_MAX_S = 0.5, 30.0
UNSENT_FILE = "unsent_metrics.json"
# how long one request to a tracking server may take during a fit (MLflow's defaults: 7 retries
# with back-off, 120 s timeout, minutes per call): the buffer's own retries take over
HTTP_SETTINGS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                 "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def server_wait_s() -> float:
    value = os.environ.get(SERVER_WAIT_ENV)
    try:
        return float(value) if value else SERVER_WAIT_S
    except ValueError:
        return SERVER_WAIT_S


class BufferedClient:
    """An ``MlflowClient`` whose metric-only ``log_batch`` calls are held and written together
    (one ``log_batch``) once ``every_s`` seconds have passed since the last write; every other
    call to the store (tags, params, artifacts, reads, the run's end) first writes what is held,
    so reads see every metric and nothing is left behind when the run ends. Metrics keep the
    time they were logged at. :meth:`flush` writes now (before a checkpoint: ``flush_loggers``);
    every buffer is also written at interpreter exit.

    A store that cannot be reached (a tracking server gone) is retried, the metrics held, for up
    to ``server_wait_s`` seconds; ``on_outage`` is told of it (a text, None once it answers)."""

    def __init__(self, client: Any, every_s: float, server_wait_s: float = SERVER_WAIT_S) -> None:
        self.client, self.every_s, self.server_wait_s = client, every_s, server_wait_s
        self.held: list[tuple[str, Any]] = []  # (run_id, Metric)
        self.written_at = time.monotonic()
        self.unreachable_since: float | None = None
        self.next_try, self.tries = 0.0, 0
        self.lost: TrackingServerLost | None = None
        self.on_outage: Callable[[str | None], None] = lambda text: None
        _BUFFERS.add(self)

    def log_batch(self, run_id: str, metrics: Any = (), params: Any = (), tags: Any = (), **kwargs: Any) -> Any:
        if params or tags or kwargs.get("synchronous") is False:
            return self._call(self.client.log_batch, run_id, metrics=metrics, params=params, tags=tags, **kwargs)
        self.held.extend((run_id, metric) for metric in metrics)
        now = time.monotonic()
        due = now >= self.next_try if self.unreachable_since is not None else now - self.written_at >= self.every_s
        if due:
            self.flush()
        return None

    def flush(self) -> None:
        """Write the held metrics (one ``log_batch`` per run); kept if the store refuses them.
        An unreachable server keeps them too, without raising, until ``server_wait_s`` has
        passed: then ``TrackingServerLost``."""
        if self.lost is not None:
            raise self.lost
        if not self.held:
            return
        self.written_at = time.monotonic()
        held, self.held = self.held, []
        try:
            for run_id in dict.fromkeys(run for run, _ in held):
                self.client.log_batch(run_id, metrics=[metric for run, metric in held if run == run_id])
        except BaseException as error:
            self.held = held + self.held
            if not server_unreachable(error):
                raise
            self._unreachable(error)
            return
        self._reachable()

    def rounds_held(self) -> int:
        return len({metric.step for _, metric in self.held})

    def _unreachable(self, error: BaseException) -> None:
        now = time.monotonic()
        if self.unreachable_since is None:
            self.unreachable_since, self.tries = now, 0
        self.tries += 1
        waited = now - self.unreachable_since
        if waited >= self.server_wait_s:
            self.lost = TrackingServerLost(
                f"the tracking server {self.client.tracking_uri} stopped answering and did not come back "
                f"within {self.server_wait_s:g} s")
            raise self.lost from error
        self.next_try = now + min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (self.tries - 1))
        self.on_outage(f"tracking server unreachable, retrying ({self.rounds_held()} rounds held)")

    def _reachable(self) -> None:
        if self.unreachable_since is not None:
            self.unreachable_since, self.next_try, self.tries = None, 0.0, 0
            self.on_outage(None)

    def _call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``method`` after the held metrics, retried while the server is unreachable (within
        ``server_wait_s``)."""
        while True:
            self.flush()
            if not self.held:  # all written: the call's turn
                try:
                    result = method(*args, **kwargs)
                except Exception as error:
                    if not server_unreachable(error):
                        raise
                    self._unreachable(error)
                else:
                    self._reachable()
                    return result
            time.sleep(max(0.0, self.next_try - time.monotonic()))

    def spill(self, folder: Path | None) -> Path | None:
        """Write the metrics still held to ``folder/UNSENT_FILE`` (added to what it holds;
        written, then renamed) and let go of them; the file, or None when nothing was held."""
        if not self.held or folder is None:
            return None
        path = folder / UNSENT_FILE
        write_unsent(path, self.client.tracking_uri, read_unsent(path) + [
            {"run_id": run_id, "key": metric.key, "value": metric.value, "timestamp": metric.timestamp,
             "step": metric.step} for run_id, metric in self.held])
        self.held = []
        return path

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.client, name)
        if not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(value, *args, **kwargs)

        return call


_BUFFERS: weakref.WeakSet[BufferedClient] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    for buffer in list(_BUFFERS):
        with contextlib.suppress(Exception):
            if buffer.unreachable_since is None:  # an outage is not waited out at exit
                buffer.flush()


def buffer_metrics(logger: MLFlowLogger, every_s: float) -> BufferedClient | None:
    """Hold ``logger``'s metrics in a :class:`BufferedClient` (written every ``every_s`` seconds,
    before checkpoints and at the run's end; ``every_s`` 0: at every call), which also carries
    the fit through an outage of its tracking server."""
    client = private_api.mlflow_client(logger)
    if isinstance(client, BufferedClient):
        return client
    if client is None:
        return None
    buffered = BufferedClient(client, every_s, server_wait_s())
    private_api.replace_mlflow_client(logger, buffered)
    logger.metrics_buffer = buffered  # type: ignore[attr-defined]  # flush_loggers finds it
    return buffered


def read_unsent(path: Path) -> list[dict[str, Any]]:
    try:
        return list(json.loads(path.read_text()).get("metrics", []))
    except (OSError, ValueError, AttributeError):
        return []


def write_unsent(path: Path, tracking_uri: str, entries: list[dict[str, Any]]) -> None:
    """``path`` holding ``entries`` (written to a temporary name, synced, then renamed: a crash
    leaves the previous file or the new one, whole). An error names the temporary file, which is
    removed."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        with naming(partial):
            partial.write_text(json.dumps({"tracking_uri": tracking_uri, "metrics": entries}))
        replace_synced(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise


def replay_unsent(client: Any, run_id: str, folder: Path, rounds_completed: int) -> int:
    """Write into run ``run_id`` the metrics a fit that lost its tracking server left in
    ``folder/UNSENT_FILE`` (of rounds up to its checkpoint's, ``rounds_completed``: the resumed
    fit logs the later ones again), leaving out any (metric, step) the run already holds; the
    file is removed once written. Returns how many were written."""
    path = folder / UNSENT_FILE
    everything = read_unsent(path)
    entries = [entry for entry in everything if entry.get("run_id") == run_id]
    if not entries:
        return 0
    held = {(metric.key, metric.step)
            for key in {entry["key"] for entry in entries}
            for metric in client.get_metric_history(run_id, key)}
    metrics = [Metric(entry["key"], float(entry["value"]), int(entry["timestamp"]), int(entry["step"]))
               for entry in entries
               if int(entry["step"]) <= rounds_completed and (entry["key"], int(entry["step"])) not in held]
    for start in range(0, len(metrics), 1000):  # MLflow's limit on one batch
        client.log_batch(run_id, metrics=metrics[start:start + 1000])
    others = [entry for entry in everything if entry.get("run_id") != run_id]
    if others:
        write_unsent(path, client.tracking_uri, others)
    else:
        path.unlink()
    return len(metrics)
