"""Read an MLflow store into ``RunRecord``s: tags, params, final metrics, histories, client metrics.

The conventions (written by the benchmark runner and ``fl-lightning fit``): one experiment per
suite, one run per (cell, seed); tags ``suite``, ``scale``, ``paper``, ``benchmark``, ``cell``,
``algorithm_config``, ``algorithm``, ``dataset``, ``partition``, ``participation``, ``model``,
``seed``, ``git_sha`` (+ ``error`` on failure, ``machine`` when the runner knows it); metrics
with step = completed rounds; the artifact ``vocabulary.Artifact.CLIENT_METRICS``.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol, runtime_checkable

import mlflow
from mlflow import MlflowClient
from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR
from mlflow.exceptions import MlflowException

from fl_lightning.records import vocabulary as schema
from fl_lightning.records.algorithm_facts import PER_CLIENT_MODEL_ALGORITHMS
from fl_lightning.records.errors import first_line
from fl_lightning.records.fit_lock import fit_is_alive
from fl_lightning.records.read_only_store import (
    EMPTY,
    EXAMPLE_URIS,
    MISSING,
    NO_EXPERIMENTS,
    StoreError,
    check_readable,
    reading,
    sqlite_file,
)
from fl_lightning.records.store_uri import store_display_name, without_credentials
from fl_lightning.records.vocabulary import Artifact, ClientMetrics, Metric, Tag, agent_of
from leaderboard.tasks import Task, task_of

# Metrics whose whole history is read (curves, means over rounds, rounds completed).
HISTORY_METRICS = (
    Metric.TEST_ACC_MEAN,
    Metric.GLOBAL_TEST_ACC,
    Metric.TEST_ACC_STD,
    Metric.TEST_ACC_ANGLE,
    Metric.CONFLICTS_MODEL,
    Metric.CLIENT_TIME_S,
    Metric.SERVER_TIME_S,
    Metric.IMPROVED_FRACTION,  # FedMGDA+ Fig. 4: share of participants whose loss did not increase
    # the claims ledger takes these at each run's convergence point too
    Metric.TEST_ACC_WORST5,
    Metric.TEST_ACC_WORST10,
    Metric.TEST_ACC_BEST5,
    Metric.TEST_ACC_MIN,
    Metric.CONFLICTS_LAYER,  # FedLF Table 4: layer-level conflicts per round
    # CGSV Fig. 1 (CGSV shapley_check_every): the approximation against the exact and sampled values
    Metric.CGSV_SHAPLEY_L1_GAP,
    Metric.CGSV_SHAPLEY_L2_GAP,
    Metric.CGSV_SHAPLEY_TIME_RATIO,
)
# Per-agent series of CGSV and its variants (``<name>/<agent>``, CGSV Fig. 2) and AFL's mixture: whole histories too.
AGENT_SERIES = (Metric.CGSV_R, Metric.CGSV_PSI, Metric.CGSV_DENSITY, Metric.CGSV_DISTANCE, Metric.AFL_LAMBDA)
# Logged once per round: the largest step among them is the number of completed rounds.
PER_ROUND_METRICS = (Metric.CLIENT_TIME_S, Metric.SERVER_TIME_S, Metric.CONFLICTS_MODEL)
CLIENT_METRICS_ARTIFACT = Artifact.CLIENT_METRICS
EXPORT_PREFIX = "export:"  # a StoreContents read from exports: "export:<folder>,<folder>"
FINISHED = "FINISHED"
FAILED = "FAILED"
# How per-client accuracy was measured (tag ``client_test``): only local and matched tests give each
# client its own test, so only they make a spread across clients a fairness statement.
CLIENT_TESTS_WITH_OWN_TEST = ("local", "matched")


class LeaderboardError(Exception):
    """A problem the user can fix (a wrong experiment name, a store that is not there)."""


Progress = Callable[[str], None]  # a line of progress (``print`` by default)


@runtime_checkable
class CountingProgress(Protocol):
    """A progress that also takes counts (``export.ProgressLines``: a bar on a terminal)."""

    def __call__(self, message: str) -> None: ...

    def counted(self, what: str, done: int, total: int) -> None: ...


def report_count(progress: Progress, what: str, done: int, total: int) -> None:
    """``done`` of ``total`` runs read: a typed count where the progress takes counts, else a line."""
    if isinstance(progress, CountingProgress):
        progress.counted(what, done, total)
    else:
        progress(f"  {what}: {done}/{total} runs")


def status_as_read(status: str, tags: dict[str, str]) -> str:
    """The run's status, with a RUNNING run whose fit is gone from this host (a SIGKILL, a power
    cut: its ``fit_host``/``fit_pid`` tags) read as KILLED: the leaderboard never counts a dead
    fit's run as running. The store is only read; the next fit of its experiment marks it."""
    if status == "RUNNING" and fit_is_alive(tags.get(Tag.FIT_HOST), tags.get(Tag.FIT_PID)) is False:
        return "KILLED"
    return status


CLI_EXPERIMENT = schema.DEFAULT_EXPERIMENT
"""The experiment ``fl-lightning fit`` logs to unless told another (``lightning_cli.trainer_defaults``)."""
PLAIN_FITS = "Your fits (not from a suite)"
"""Where the leaderboard groups the runs no suite made (``fl-lightning fit`` alone, a Trainer script)."""


def plain_fits(experiment: str) -> str:
    """The group, named for a reader, of the runs in ``experiment`` that no suite made: the
    CLI's default experiment's are :data:`PLAIN_FITS`, another experiment's say its name."""
    return PLAIN_FITS if experiment == CLI_EXPERIMENT else f"Your fits in {experiment} (not from a suite)"


@dataclass
class RunRecord:
    """One MLflow run, with what the leaderboard needs from it."""

    run_id: str
    experiment: str
    status: str
    start_time: datetime | None
    end_time: datetime | None
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]  # MLflow's latest value of each metric = the value at the largest step
    histories: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # (step, value), by step
    client_metrics: dict | None = None  # the Artifact.CLIENT_METRICS JSON (fields: ClientMetrics)
    known_code_version: str = ""  # set where the version was read with the run (an export), not from git

    @property
    def finished(self) -> bool:
        return self.status == FINISHED

    @property
    def from_suite(self) -> bool:
        """Whether the benchmark runner made the run (its ``suite`` tag); else it is a plain fit."""
        return bool(self.tags.get(Tag.SUITE))

    @property
    def suite(self) -> str:
        """The ``suite`` tag; for a plain fit, :func:`plain_fits` of its experiment."""
        return self.tags[Tag.SUITE] if self.from_suite else plain_fits(self.experiment)

    @property
    def scale(self) -> str:
        """offline / paper (tag ``scale``), "unknown" for a suite's run without one, "" for a
        plain fit (no scale to show: it ran whatever the user chose)."""
        return self.tags.get(Tag.SCALE) or ("unknown" if self.from_suite else "")

    @property
    def benchmark(self) -> str:
        """The ``benchmark`` tag, or dataset/partition/participation/model built from the other tags."""
        if self.tags.get(Tag.BENCHMARK):
            return self.tags[Tag.BENCHMARK]
        parts = [self.tags.get(k, "") for k in (Tag.DATASET, Tag.PARTITION, Tag.PARTICIPATION, Tag.MODEL)]
        if not any(parts):
            return f"{self.experiment}/(no benchmark tags)"
        return "/".join(p or "?" for p in parts)

    @property
    def config(self) -> str:
        """The algorithm configuration label (``algorithm_config`` tag, else the class name)."""
        return self.tags.get(Tag.ALGORITHM_CONFIG) or self.tags.get(Tag.ALGORITHM) or "(unknown algorithm)"

    @property
    def seed(self) -> str:
        return self.tags.get(Tag.SEED) or self.params.get(schema.SEED) or "?"

    @property
    def cell(self) -> str:
        return self.tags.get(Tag.CELL) or f"{self.benchmark}/{self.config}"

    @property
    def git_sha(self) -> str:
        """The commit that ran (``git_sha`` tag), "" when unknown."""
        return self.tags.get(Tag.GIT_SHA, "")

    @property
    def code_version(self) -> str:
        """What decides the run's results: the library's source tree at its commit
        (``fl_lightning/``, read from this checkout's git), so commits that changed only docs,
        tests or the leaderboard are one version; the commit itself when git cannot tell."""
        return self.known_code_version or library_tree(self.git_sha) or self.git_sha

    @property
    def task(self) -> Task:
        return task_of(self.tags, self.params)

    @property
    def client_test(self) -> str:
        """local / matched / global (tag ``client_test``; older runs: their ``test_mode``), or unknown."""
        value = self.tags.get(Tag.CLIENT_TEST) or self.params.get(schema.TEST_MODE) or self.tags.get(Tag.TEST_MODE)
        return value or "unknown"

    @property
    def client_test_size(self) -> str:
        return self.tags.get(Tag.CLIENT_TEST_SIZE, "")

    @property
    def per_client_models(self) -> bool:
        """Whether every client ends with a model of its own (tag, else known per algorithm)."""
        if self.tags.get(Tag.PER_CLIENT_MODELS) in ("true", "false"):
            return self.tags[Tag.PER_CLIENT_MODELS] == "true"
        return self.tags.get(Tag.ALGORITHM) in PER_CLIENT_MODEL_ALGORITHMS

    @property
    def control(self) -> str:
        """The benchmark name of this variant's declared control (tag ``control``), "" on controls."""
        return self.tags.get(Tag.CONTROL, "")

    @property
    def suite_description(self) -> str:
        return " ".join(self.tags.get(Tag.SUITE_DESCRIPTION, "").split())

    @property
    def error(self) -> str:
        """Why the run failed: the ``error`` tag, else the status in its client metrics artifact;
        "" for a finished run (a run resumed after a failure keeps the tag of that failure)."""
        if self.finished:
            return ""
        if self.tags.get(Tag.ERROR):
            return self.tags[Tag.ERROR]
        status = str((self.client_metrics or {}).get(ClientMetrics.STATUS, ""))
        return status if status.startswith("failed") else ""

    def final(self, name: str) -> float | None:
        """The last logged value (at the largest step) of a metric, or None when it was never logged."""
        value = self.metrics.get(name)
        return None if value is None or value != value else float(value)  # NaN -> None

    def mean_over_rounds(self, name: str) -> float | None:
        values = [v for _, v in self.histories.get(name, []) if v == v]
        return sum(values) / len(values) if values else None

    def time_per_round(self) -> float | None:
        """Mean over rounds of client_time_s + server_time_s (the wall time of one round)."""
        per_step: dict[int, float] = {}
        for name in (Metric.CLIENT_TIME_S, Metric.SERVER_TIME_S):
            for step, value in self.histories.get(name, []):
                if value == value:
                    per_step[step] = per_step.get(step, 0.0) + value
        return sum(per_step.values()) / len(per_step) if per_step else None

    def rounds_completed(self) -> int | None:
        steps = [s for name in PER_ROUND_METRICS for s, _ in self.histories.get(name, [])]
        if steps:
            return max(steps)
        if self.client_metrics and self.client_metrics.get(ClientMetrics.ROUNDS_COMPLETED) is not None:
            return int(self.client_metrics[ClientMetrics.ROUNDS_COMPLETED])
        steps = [s for s, _ in self.histories.get(Metric.TEST_ACC_MEAN, [])]
        return max(steps) if steps else None

    def client_accuracies(self) -> list[float]:
        clients = (self.client_metrics or {}).get(ClientMetrics.CLIENTS) or {}
        values = clients.get(ClientMetrics.TEST_ACCURACY) or []
        return [float(v) for v in values if v is not None and v == v]


@dataclass
class StoreContents:
    tracking_uri: str
    all_experiments: list[str]  # every active experiment in the store
    read_experiments: list[str]  # the ones that were read
    runs: list[RunRecord]


LIBRARY = "fl_lightning"


@functools.cache
def library_tree(sha: str) -> str:
    """``LIBRARY@<tree>``: the git tree of the library's folder at commit ``sha`` in the checkout
    this package lives in; "" for an unknown sha or without git."""
    if not sha or sha == "unknown":
        return ""
    try:
        found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{sha}:{LIBRARY}"],
                               cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    tree = found.stdout.strip()
    return f"{LIBRARY}@{tree[:10]}" if found.returncode == 0 and tree else ""


def store_name(uri: str) -> str:
    """What the page may say about the store: the folders of exports (``2 exports: a, b``), else
    ``records.store_uri.store_display_name`` (a file's name, a server's host; never a local absolute
    path, never a password)."""
    if uri.startswith(EXPORT_PREFIX):
        names = [Path(folder.rstrip("/")).name for folder in uri.removeprefix(EXPORT_PREFIX).split(",")]
        return f"{len(names)} export{'s' * (len(names) > 1)}: {', '.join(names)}"
    return store_display_name(uri)


def check_store_exists(uri: str) -> str:
    """The store is there and can be read as it is (``fl_lightning.records.read_only_store.check_readable``): a sqlite
    URI naming a file (or a file store naming a folder) that does not exist is a typo, not an
    empty store; an empty file is not a store. Returns the store's state (``READY``, or
    ``NO_EXPERIMENTS`` for MLflow tables without an experiment)."""
    try:
        state = check_readable(uri)
    except StoreError as error:
        raise LeaderboardError(str(error)) from None
    path = sqlite_file(uri)
    if state == MISSING:
        raise LeaderboardError(
            f"no MLflow store at {uri}: the file {path.resolve()} does not exist. "
            f"Pass the store the runs were logged to with --tracking-uri ({EXAMPLE_URIS})."
        )
    if state == EMPTY:
        raise LeaderboardError(
            f"the store {uri} is an empty file ({path.resolve()}): nothing was logged to it, and a build does "
            f"not make it a store. Pass the store the runs were logged to with --tracking-uri ({EXAMPLE_URIS})."
        )
    return state


@contextmanager
def quiet_artifact_downloads() -> Iterator[None]:
    """No tqdm bar per downloaded artifact: the build prints its own progress."""
    previous = os.environ.get(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name)
    os.environ[MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name, None)
        else:
            os.environ[MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name] = previous


@contextmanager
def using_tracking_uri(uri: str) -> Iterator[None]:
    """``mlflow.search_runs`` reads the global tracking URI: set it, then put the old one back."""
    previous = mlflow.get_tracking_uri() if mlflow.tracking.is_tracking_uri_set() else None
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)


def _time(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def is_agent_series(name: str) -> bool:
    """``cgsv_r/3`` and the like: one agent's value of an ``AGENT_SERIES`` metric."""
    agent = agent_of(name)
    return agent is not None and agent[0] in AGENT_SERIES


def metric_history(client: MlflowClient, run_id: str, name: str) -> list[tuple[int, float]]:
    """A metric's (step, value) curve, one value per step: where a resumed run logged a step
    twice, the later value (the leaderboard and the export read curves through this)."""
    by_step: dict[int, tuple[int, float]] = {}
    for metric in client.get_metric_history(run_id, name):
        previous = by_step.get(metric.step)
        if previous is None or metric.timestamp >= previous[0]:
            by_step[metric.step] = (metric.timestamp, float(metric.value))
    return [(step, value) for step, (_, value) in sorted(by_step.items())]


def _client_metrics(client: MlflowClient, run_id: str, scratch: Path) -> dict | None:
    try:
        path = client.download_artifacts(run_id, CLIENT_METRICS_ARTIFACT, str(scratch))
        with open(path) as f:
            payload = json.load(f)
    except (MlflowException, OSError, json.JSONDecodeError):
        return None  # no artifact (e.g. a run killed before the end): the run still counts
    return payload if isinstance(payload, dict) else None


def select_experiments(client: MlflowClient | None,
                       names: Iterable[str] | None) -> tuple[list[str], list[str], list[str]]:
    """(all experiment names, the selected names, their ids); unknown names -> LeaderboardError.
    ``client`` None: a store without experiments."""
    experiments = client.search_experiments() if client is not None else []
    by_name = {e.name: e.experiment_id for e in experiments}
    all_names = sorted(by_name)
    if not names:
        return all_names, all_names, [by_name[n] for n in all_names]
    names = list(dict.fromkeys(names))
    unknown = [n for n in names if n not in by_name]
    if unknown:
        listing = ", ".join(all_names) if all_names else "(none: the store is empty)"
        raise LeaderboardError(
            f"unknown experiment(s): {', '.join(unknown)}. "
            f"Experiments in the store: {listing}. "
            "Pass one of those to --experiments, or leave --experiments out to read them all."
        )
    return all_names, names, [by_name[n] for n in names]


def load_runs(
    tracking_uri: str,
    experiments: Iterable[str] | None = None,
    progress: Progress = print,
) -> StoreContents:
    """Every run of the selected experiments (all by default), with histories and client metrics."""
    if check_store_exists(tracking_uri) == NO_EXPERIMENTS:  # MLflow would add its Default experiment
        select_experiments(None, experiments)  # an --experiments name is unknown here
        return StoreContents(tracking_uri, [], [], [])
    with reading(tracking_uri) as read_uri:  # a SQLite store through a connection that cannot write
        return _read_store(tracking_uri, read_uri, experiments, progress)


def _read_store(tracking_uri: str, read_uri: str, experiments: Iterable[str] | None,
                progress: Progress) -> StoreContents:
    try:
        client = MlflowClient(tracking_uri=read_uri)
        all_names, names, ids = select_experiments(client, experiments)
    except MlflowException as error:
        raise LeaderboardError(f"cannot read the MLflow store {without_credentials(tracking_uri)}: "
                               f"{first_line(error.message)}") from None
    id_to_name = dict(zip(ids, names))
    if not ids:
        return StoreContents(tracking_uri, all_names, names, [])

    with using_tracking_uri(read_uri):
        found = mlflow.search_runs(experiment_ids=ids, output_format="list", order_by=["start_time ASC"])
    with_runs = sorted({id_to_name.get(r.info.experiment_id, r.info.experiment_id) for r in found})
    progress(f"Read {len(found)} runs from {len(with_runs)} experiment(s) ({', '.join(with_runs) or 'none with runs'}) "
             f"in {without_credentials(tracking_uri)}")

    runs: list[RunRecord] = []
    step = max(10, len(found) // 10)
    with tempfile.TemporaryDirectory(prefix="leaderboard-") as scratch_dir, quiet_artifact_downloads():
        for index, run in enumerate(found, start=1):
            info, data = run.info, run.data
            scratch = Path(scratch_dir) / info.run_id
            scratch.mkdir()
            record = RunRecord(
                run_id=info.run_id,
                experiment=id_to_name.get(info.experiment_id, info.experiment_id),
                status=status_as_read(info.status, data.tags),
                start_time=_time(info.start_time),
                end_time=_time(info.end_time),
                tags=dict(data.tags),
                params=dict(data.params),
                metrics=dict(data.metrics),
            )
            record.histories = {
                name: metric_history(client, info.run_id, name) for name in HISTORY_METRICS if name in data.metrics
            } | {name: metric_history(client, info.run_id, name) for name in data.metrics if is_agent_series(name)}
            record.client_metrics = _client_metrics(client, info.run_id, scratch)
            runs.append(record)
            if index % step == 0 or index == len(found):
                report_count(progress, "metric histories and client metrics", index, len(found))
    return StoreContents(tracking_uri, all_names, names, runs)
