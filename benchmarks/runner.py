"""Grid runner: expand a suite into (cell, seed) runs of `fl-lightning fit`, resumably.

A suite file (``benchmarks/<paper>/<name>.yaml``) is read by ``benchmarks.suite_schema``
(``SuiteSpec``; the format is at the top of that file): a suite name, paper, scale, seeds, a
LightningCLI ``base`` config, benchmarks merged over it, and algorithms expanded over their grids.

Every (benchmark, algorithm configuration) is a cell, and every cell runs once per seed
through the same code path as the CLI (``fl_lightning.cli``, with ``seed_everything: <seed>``
deciding every random stream), in one of ``--jobs`` reused worker processes (imports and
dataset parsing paid once per worker; ``--isolate``: a fresh process per run, same results;
``--cluster slurm``: one submitit job per run on a SLURM cluster), tagged with suite, scale,
paper, benchmark, cell, algorithm_config, seed, suite_description, control (a variant's
declared control benchmark) and cell_config (a digest of the cell's whole config).
Finished runs of the same cell config are found in the store and skipped, so an
interrupted suite resumes where it stopped and an edited cell runs again; a cell that
fails is recorded as a FAILED run with its error, and the rest go on.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from benchmarks.suite_schema import AlgorithmEntry, SuiteFormatError, SuiteSpec
from fl_lightning.run_schema import DEFAULT_TRACKING_URI, Tag

SUITES_DIR = Path(__file__).resolve().parent
MAX_WORKER_RESIDENT_MB = 4096.0
"""A worker whose resident memory passes this after a cell is replaced by a fresh one."""


@dataclass(frozen=True)
class Cell:
    """One (benchmark, algorithm configuration) of a suite, at one seed."""

    suite: str
    paper: str
    scale: str
    benchmark: str
    algorithm_config: str
    seed: int
    config: dict
    description: str = ""
    control: str = ""

    @property
    def cell(self) -> str:
        return f"{self.benchmark}|{self.algorithm_config}"

    @property
    def config_digest(self) -> str:
        """12 hex digits of the cell's config at this seed: a finished run with another digest
        ran an older version of the cell and does not count as done."""
        text = yaml.safe_dump(self.config, sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    @property
    def config_tag(self) -> str:
        """The digest as the run's ``cell_config`` tag: :func:`digest_tag`."""
        return digest_tag(self.config_digest)

    @property
    def tags(self) -> dict[str, str]:
        """The run's tags, set through the logger of the cell's config (so a fit in any launcher,
        a plain ``fl-lightning fit --config`` included, carries them)."""
        tags = {
            Tag.SUITE: self.suite, Tag.PAPER: self.paper, Tag.SCALE: self.scale, Tag.BENCHMARK: self.benchmark,
            Tag.CELL: self.cell, Tag.ALGORITHM_CONFIG: self.algorithm_config, Tag.SEED: str(self.seed),
            Tag.CELL_CONFIG: self.config_tag,
        }
        if self.description:
            tags[Tag.SUITE_DESCRIPTION] = self.description
        if self.control:
            tags[Tag.CONTROL] = self.control
        return tags


def digest_tag(digest: str) -> str:
    """A config digest as a tag that reaches the store unchanged. The tags travel in the logger's
    config, which LightningCLI reads as YAML even when quoted: a digest that reads as a number
    (``5e8736190253``: a float that overflows to inf; ``123456789012``: an int) was stored as that
    number ("Inf"), so its run never counted as done and ran again on every resume. Such a digest
    gets the prefix ``cfg-``; every other one is the digest itself (the tags of stored runs)."""
    return f"cfg-{digest}" if re.fullmatch(r"[0-9]+|[0-9]+e[0-9]+", digest) else digest


def deep_merge(base: dict, override: dict) -> dict:
    """``override`` merged into a copy of ``base`` (nested dicts merged, the rest replaced)."""
    merged = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


NOT_SUITES = ("paper_numbers", "claims")  # the papers' numbers and claims sit beside the suites


def list_suites() -> list[str]:
    return sorted(f"{p.parent.name}/{p.stem}" for p in SUITES_DIR.glob("*/*.yaml")
                  if p.parent.name != "perf" and p.stem not in NOT_SUITES)


def suite_path(name: str) -> Path:
    """``fedfv/offline`` or a path to a suite file."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    candidate = SUITES_DIR / f"{name}.yaml"
    if not candidate.exists():
        raise SystemExit(f"unknown suite {name!r}; valid: {', '.join(list_suites())} (or a path to a suite YAML)")
    return candidate


def expand_algorithms(entries: list[dict]) -> list[tuple[str, dict]]:
    """[(label, model config)] with every grid expanded (cartesian product)."""
    return [config for number, entry in enumerate(entries)
            for config in AlgorithmEntry.parse(entry, number, "(algorithms)").configurations()]


def yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error in one line: where (line, column) and what."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return " ".join(f"{where}{problem}".split())


def load_suite(name: str, seeds: list[int] | None = None) -> list[Cell]:
    path = suite_path(name)
    try:
        spec = yaml.safe_load(path.read_text())
    except OSError as error:
        raise SystemExit(f"cannot read suite {name!r} ({path}): {error.strerror or error}; pass a readable "
                         f"suite YAML or one of the names `{program_name()} list` prints") from None
    except yaml.YAMLError as error:
        raise SystemExit(f"suite {name!r} ({path}) is not valid YAML: {yaml_problem(error)}") from None
    try:
        suite = SuiteSpec.parse(spec, repr(name))
    except SuiteFormatError as error:
        raise SystemExit(str(error)) from None
    if seeds is not None and (not seeds or not all(type(s) is int for s in seeds)):
        raise SystemExit(f"seeds must be a non-empty list of integers, got {seeds!r}")
    cells = []
    for benchmark in suite.benchmarks:
        bench_config = deep_merge(suite.base, benchmark.config)
        for entry in suite.algorithms_of(benchmark):
            for label, model in entry.configurations():
                for seed in seeds if seeds is not None else suite.seeds:
                    config = deep_merge(bench_config, {"model": model})
                    config = deep_merge(config, {"seed_everything": seed})  # model and data take it
                    cells.append(Cell(suite.suite, suite.paper, suite.scale, benchmark.name, label, seed,
                                      config, suite.description, benchmark.control or ""))
    return cells


def finished_runs(tracking_uri: str, suite: str) -> set[tuple[str, str, str]]:
    """(cell, seed, cell_config) of the FINISHED runs in the suite's experiment."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(suite)
    if experiment is None:
        return set()
    done, token = set(), None
    while True:
        page = client.search_runs([experiment.experiment_id], "attributes.status = 'FINISHED'",
                                  max_results=1000, page_token=token)
        for run in page:
            tags = run.data.tags
            if Tag.CELL in tags and Tag.CELL_CONFIG in tags:
                done.add((tags[Tag.CELL], tags.get(Tag.SEED, ""), tags[Tag.CELL_CONFIG]))
        token = page.token
        if not token:
            return done


def finished_runs_or_exit(tracking_uri: str, suite: str) -> set[tuple[str, str, str]]:
    """``finished_runs``; a store MLflow cannot open (e.g. a schema it refuses to migrate) is
    reported in one line."""
    from mlflow.exceptions import MlflowException

    try:
        return finished_runs(tracking_uri, suite)
    except MlflowException as error:
        first = next((line for line in str(error.message).splitlines() if line.strip()), "")
        raise SystemExit(f"cannot open the store {tracking_uri}: {first}") from None


def check_store(tracking_uri: str) -> None:
    """What would stop the runs from logging to the store, refused before any run starts (a folder
    that does not exist, a file that is not an MLflow store, a server that does not answer)."""
    from fl_lightning.preflight import PreflightError, check_sqlite_store, sqlite_database
    from leaderboard.store import StoreError, check_writable

    try:
        check_writable(tracking_uri)
        database = sqlite_database(tracking_uri)
        if database is not None and database.is_file():  # a store another process holds locked: waited for, saying so
            check_sqlite_store(tracking_uri, database, option="--tracking-uri")
    except (StoreError, PreflightError) as error:
        raise SystemExit(str(error)) from None


def finished_runs_read_only(
    tracking_uri: str, suite: str
) -> tuple[set[tuple[str, str, str]], dict[str, list[float]], str]:
    """A dry run's view of the store: (finished runs, their wall seconds per cell, a note), read without creating or altering
    it: a SQLite file that does not exist (or is empty) is not opened, an existing one is read
    through a read-only connection, a schema of another MLflow version is not migrated."""
    from leaderboard.store import (
        EMPTY,
        MISSING,
        NO_EXPERIMENTS,
        StoreError,
        check_readable,
        reading,
    )

    check_store(tracking_uri)
    try:
        state = check_readable(tracking_uri)
    except StoreError as error:
        raise SystemExit(str(error)) from None
    if state in (MISSING, EMPTY, NO_EXPERIMENTS):
        what = "does not exist yet (a dry run does not create it)" if state == MISSING else "holds no runs yet"
        return set(), {}, f"the store {tracking_uri} {what}: every run is to run"
    from mlflow.exceptions import MlflowException

    from benchmarks.plan import run_durations

    try:
        with reading(tracking_uri) as read_uri:
            return finished_runs(read_uri, suite), run_durations(read_uri, suite), ""
    except MlflowException as error:
        first = next((line for line in str(error.message).splitlines() if line.strip()), "")
        raise SystemExit(f"cannot read the store {tracking_uri} without altering it ({first}); "
                         "run without --dry-run, or pass another --tracking-uri") from None


def ensure_experiment(tracking_uri: str, suite: str) -> str:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(suite)
    return experiment.experiment_id if experiment else client.create_experiment(suite)


CHECKPOINT_ROOT = "checkpoints"  # the CLI's default_root_dir, relative to the runner's folder (its workers' too)
INTERRUPTED_EXIT_CODES = (128 + 2, 128 + 15)  # a fit stopped by SIGINT / SIGTERM (lightning_cli.run)
NOT_STARTED = "not started: the suite was stopped"  # a launcher's answer for a cell it did not start
STOPPED = threading.Event()  # set when the suite is stopped (Ctrl-C, SIGTERM): its cells in flight end KILLED


class SuiteStopped(KeyboardInterrupt):
    """The suite was stopped by a signal (``signum``); raised in the runner's main thread."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop_suite(signum: int, frame: Any) -> None:
    raise SuiteStopped(signum)


def latest_unfinished_run(tracking_uri: str, cell: Cell) -> Any:
    """The cell's (same cell, seed and config) latest run that did not finish, or None."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(cell.suite)
    if experiment is None:
        return None
    runs = client.search_runs(
        [experiment.experiment_id],
        filter_string=(f"tags.{Tag.CELL} = '{cell.cell}' and tags.{Tag.SEED} = '{cell.seed}' "
                       f"and tags.{Tag.CELL_CONFIG} = '{cell.config_tag}'"),
        order_by=["attributes.start_time DESC"], max_results=1,
    )
    return runs[0] if runs and runs[0].info.status != "FINISHED" else None


def resumable_checkpoint(tracking_uri: str, cell: Cell) -> str | None:
    """The ``last.ckpt`` of the cell's latest unfinished run (a suite stopped by Ctrl-C, a killed
    worker), where the runner's fits write it: the rerun continues that run from there."""
    run = latest_unfinished_run(tracking_uri, cell)
    if run is None:
        return None
    path = Path(CHECKPOINT_ROOT) / run.info.experiment_id / run.info.run_id / "checkpoints" / "last.ckpt"
    return str(path.resolve()) if path.is_file() else None


def record_failure(tracking_uri: str, cell: Cell, error: str, status: str = "FAILED") -> None:
    """A FAILED (or, for a suite stopped by Ctrl-C, KILLED) run for a cell whose process died
    before (or without) marking its own run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment_id = ensure_experiment(tracking_uri, cell.suite)
    run = latest_unfinished_run(tracking_uri, cell)
    name = f"{cell.algorithm_config} seed {cell.seed} | {cell.benchmark} | {status.lower()}"  # not MLflow's random one
    run_id = run.info.run_id if run else client.create_run(experiment_id, tags=cell.tags, run_name=name).info.run_id
    client.set_tag(run_id, Tag.ERROR, error[-5000:])
    client.set_terminated(run_id, status)


def literal_text(text: str) -> str:
    """``text`` as LightningCLI keeps it: it reads a string given where any value may go as YAML,
    so "Sec. 5: 100 clients" would become a mapping and "a # b" lose its end. A no-break space
    after a colon or before a hash reads the same and is plain text to YAML."""
    return text.replace(": ", ":\u00a0").replace(" #", "\u00a0#")


def _cell_config_file(cell: Cell, tracking_uri: str, path: Path | None = None) -> str:
    """The cell's LightningCLI config, logging to the suite's experiment: at ``path`` (beside the
    cell's log, where the resume command its fit prints finds it; written then renamed), else in a
    temporary file."""
    tags = {key: literal_text(value) for key, value in cell.tags.items()}
    config = deep_merge(cell.config, {"trainer": {"logger": {
        "class_path": "lightning.pytorch.loggers.MLFlowLogger",
        "init_args": {"experiment_name": cell.suite, "tracking_uri": tracking_uri, "tags": tags},
    }}})
    if path is not None and (checkpoint := resumable_checkpoint(tracking_uri, cell)) is not None:
        config["ckpt_path"] = checkpoint  # continue the run a stopped suite left, from its last round
    folder = None if path is None else Path(path).parent
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=folder, delete=False) as handle:
        yaml.safe_dump(config, handle, sort_keys=False)
    if path is None:
        return handle.name
    os.replace(handle.name, path)
    return str(Path(path).resolve())


def _thread_env(threads: int) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def _torch_settings() -> tuple[Any, ...]:
    """The process-wide torch settings a fit may change and not change back: Lightning's
    ``Trainer(deterministic=True)`` calls ``torch.use_deterministic_algorithms`` and a later
    trainer left at ``None`` keeps it; ``torch.set_float32_matmul_precision``, thread count."""
    import torch

    return (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.get_float32_matmul_precision(), torch.get_num_threads(), torch.get_default_dtype(),
            torch.is_grad_enabled(), torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)


def _restore_torch_settings(settings: tuple[Any, ...]) -> None:
    import torch

    deterministic, warn_only, precision, threads, dtype, grad, benchmark, cudnn_deterministic = settings
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)
    torch.set_float32_matmul_precision(precision)
    torch.set_num_threads(threads)
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(grad)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = benchmark, cudnn_deterministic


def _fit_in_this_process(config_path: str, log_path: str) -> int:
    """``fl-lightning fit --config`` in this (reused) process, its output in ``log_path``; the exit code.

    What a fit leaves behind in its process is put back afterwards, so that the next cell starts
    as a fresh process would: the environment (``seed_everything`` sets ``PL_GLOBAL_SEED``, which
    a later run without a seed would read; MLflow sets ``MLFLOW_TRACKING_URI``), the working
    folder, the SIGINT/SIGTERM/SIGALRM handlers and the alarm timer, the warnings filters and
    torch's process-wide settings. Random streams need nothing: ``seed_everything`` seeds Python,
    NumPy and torch when each fit starts."""
    import traceback
    import warnings

    environment, folder, settings = dict(os.environ), os.getcwd(), _torch_settings()
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM, signal.SIGALRM)}
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "w") as log, warnings.catch_warnings():
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            from fl_lightning.cli import main as fit_main

            fit_main(["fit", "--config", config_path])
            code = 0
        except SystemExit as stop:  # SystemExit() and SystemExit(0) are a success, as at a process's exit
            code = stop.code if isinstance(stop.code, int) else int(stop.code is not None)
        except BaseException:  # noqa: BLE001 - recorded in the log and the store, the suite goes on
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            os.environ.clear()
            os.environ.update(environment)
            os.chdir(folder)
            signal.setitimer(signal.ITIMER_REAL, 0)
            for number, handler in handlers.items():
                signal.signal(number, handler)
            _restore_torch_settings(settings)
    return code


def _resident_mb() -> float:
    """This process's resident memory in MiB (Linux ``/proc/self/statm``; 0 elsewhere)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def _serve_cells(connection: Any, threads: int) -> None:
    """A worker process: thread counts set before torch is imported, the runner's own command
    line hidden from LightningCLI, the CLI imported once; then one cell per request, answered
    with its exit code and the worker's resident memory, until ``None`` or the runner is gone."""
    os.environ.update(_thread_env(threads))
    sys.argv = sys.argv[:1]
    # SIGTERM (the runner passing on its own) stops this worker as Ctrl-C does: a fit in flight ends
    # its run KILLED (exit 143), an idle worker leaves its loop
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    import fl_lightning.lightning_cli  # noqa: F401 - the start-up every cell of this worker shares

    while True:
        try:
            request = connection.recv()
        except (EOFError, KeyboardInterrupt):
            return
        if request is None:
            return
        connection.send((_fit_in_this_process(*request), _resident_mb()))


class IsolatedProcesses:
    """Every cell in a fresh ``python -m fl_lightning.cli fit --config`` process (``--isolate``).

    The runner hands each cell to a launcher's ``run(config_path, log_path)`` (its exit
    code, or why it could not run) and calls ``close()`` when the suite ends; a launcher that
    submits to a cluster scheduler (e.g. submitit's ``AutoExecutor`` running
    ``_fit_in_this_process`` there) fits the same two methods."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.running: set[subprocess.Popen[bytes]] = set()
        self.lock = threading.Lock()

    def run(self, config_path: str, log_path: str) -> int | str:
        env = {**os.environ, **_thread_env(self.threads)}
        with open(log_path, "w") as log, self.lock:
            if STOPPED.is_set():
                return NOT_STARTED
            process = subprocess.Popen([sys.executable, "-m", "fl_lightning.cli", "fit", "--config", config_path],
                                       stdout=log, stderr=subprocess.STDOUT, env=env)
            self.running.add(process)
        try:
            return process.wait()
        finally:
            with self.lock:
                self.running.discard(process)

    def stop(self, signum: int) -> None:
        """Passes ``signum`` on to the cells in flight (their fits end their runs KILLED)."""
        with self.lock:
            for process in self.running:
                _send(process.pid, signum)

    def close(self) -> None:
        """Nothing outlives a cell."""


def _send(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:  # it ended meanwhile
        pass


class Worker:
    """One reused worker process (spawned: its own interpreter, thread counts set before torch
    loads), started on its first cell and again after it dies or is retired."""

    def __init__(self, threads: int) -> None:
        self.threads = threads
        self.process: Any = None
        self.connection: Any = None

    def start(self) -> None:
        import multiprocessing

        context = multiprocessing.get_context("spawn")
        self.connection, child_end = context.Pipe()
        self.process = context.Process(target=_serve_cells, args=(child_end, self.threads), name="fl-lightning-worker")
        self.process.start()
        child_end.close()  # the worker's end lives in the worker only: its death reads as EOF here

    def run(self, request: tuple[str, str]) -> tuple[int, float] | str:
        """The cell's exit code and the worker's memory after it, or why the worker died."""
        if self.process is None:
            self.start()
        try:
            self.connection.send(request)
            return self.connection.recv()
        except (EOFError, OSError):
            self.process.join()
            why = self.process.exitcode
            self.connection.close()
            self.process = self.connection = None
            if why is not None and why < 0:
                return f"its worker process was killed by {signal.Signals(-why).name}"
            return f"its worker process died (exit code {why})"

    def stop(self, signum: int) -> None:
        if self.process is not None and self.process.pid is not None:
            _send(self.process.pid, signum)

    def close(self) -> None:
        if self.process is None:
            return
        try:
            self.connection.send(None)
        except OSError:
            pass
        self.process.join(timeout=60)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.connection.close()
        self.process = self.connection = None


class WarmWorkers:
    """``jobs`` reused worker processes (the default): Python, torch, Lightning and MLflow are
    imported once per worker, not once per cell, and each dataset is parsed once per worker
    (:mod:`fl_lightning.data.sources` keeps it in memory). Each worker is its own process with
    its own pipe, so a worker that dies fails only the cell it ran (a shared
    ``ProcessPoolExecutor`` would break every cell in flight) and a fresh one takes its place.
    A worker whose resident memory passes ``max_resident_mb`` is retired after its cell."""

    def __init__(self, jobs: int, threads: int, max_resident_mb: float = MAX_WORKER_RESIDENT_MB) -> None:
        import queue

        self.max_resident_mb = max_resident_mb
        self.workers = [Worker(threads) for _ in range(jobs)]
        self.idle: queue.SimpleQueue[Worker] = queue.SimpleQueue()
        for worker in self.workers:
            self.idle.put(worker)

    def run(self, config_path: str, log_path: str) -> int | str:
        worker = self.idle.get()
        try:
            if STOPPED.is_set():  # stopped while this cell waited for a worker
                return NOT_STARTED
            answer = worker.run((config_path, log_path))
            if isinstance(answer, str):
                return answer
            code, resident_mb = answer
            if resident_mb > self.max_resident_mb:
                worker.close()  # the next cell starts a fresh one
            return code
        finally:
            self.idle.put(worker)

    def stop(self, signum: int) -> None:
        """Passes ``signum`` on to every worker: a fit in flight ends its run KILLED."""
        for worker in self.workers:
            worker.stop(signum)

    def close(self) -> None:
        for worker in self.workers:
            worker.close()


SUBMITIT_MISSING = "--cluster needs submitit: pip install 'fl-lightning[cluster]' (or pip install submitit)"


def _fit_as_job(config_path: str, log_path: str, threads: int) -> int:
    """A cell inside a scheduler's job (:class:`SubmititJobs`): thread counts set before torch
    loads (a job's process is fresh), then the same fit as in a reused worker."""
    os.environ.update(_thread_env(threads))
    return _fit_in_this_process(config_path, log_path)


class SubmititJobs:
    """Every cell as one job of a submitit executor (``--cluster slurm`` on a SLURM cluster,
    ``--cluster local``: submitit's local executor, one process a job, on this machine).

    A job runs the cell as a reused worker would (:func:`_fit_in_this_process`); its config is
    copied into the job folder (``benchmark_jobs/<suite>`` beside the store unless
    ``--job-folder`` says otherwise), which, like the logs and the store, must be on a file system
    the cluster's nodes share; a SLURM cluster wants an MLflow tracking server
    (``--tracking-uri http://...``) rather than one SQLite file written from many nodes.
    ``--jobs`` bounds the jobs in flight; a job the scheduler loses or kills is that cell's
    failure, with the scheduler's reason."""

    def __init__(self, cluster: str, folder: Path, threads: int, timeout_min: int = 24 * 60,
                 slurm_partition: str | None = None) -> None:
        try:
            import submitit
        except ImportError:
            raise SystemExit(SUBMITIT_MISSING) from None
        self.folder = folder
        self.threads = threads
        folder.mkdir(parents=True, exist_ok=True)
        self.executor = submitit.AutoExecutor(folder=str(folder / "%j"), cluster=cluster)
        parameters: dict[str, Any] = {"timeout_min": timeout_min, "cpus_per_task": threads, "name": "fl-lightning"}
        if slurm_partition:
            parameters["slurm_partition"] = slurm_partition
        self.executor.update_parameters(**parameters)

    def run(self, config_path: str, log_path: str) -> int | str:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=self.folder, delete=False) as handle:
            handle.write(Path(config_path).read_text())  # where the job's node can read it
        try:
            if STOPPED.is_set():
                return NOT_STARTED
            job = self.executor.submit(_fit_as_job, handle.name, str(Path(log_path).resolve()), self.threads)
            try:
                return int(job.result())
            except Exception as error:  # noqa: BLE001 - the scheduler's reason becomes the cell's error
                first = str(error).strip().splitlines()
                return f"job {job.job_id} failed: {first[0] if first else type(error).__name__}"
        finally:
            os.unlink(handle.name)

    def stop(self, signum: int) -> None:
        """Jobs submitted run on (a cluster's own ``scancel`` stops them); no new job is submitted."""

    def close(self) -> None:
        """Jobs end with their cells: nothing to stop."""


def run_cell(cell: Cell, tracking_uri: str, log_dir: Path, launcher: Any) -> tuple[Cell, str, float, str]:
    """Runs one (cell, seed) through ``launcher`` (:class:`WarmWorkers` or :class:`IsolatedProcesses`);
    (cell, status, seconds, error). A cell that fails is recorded in the store as a FAILED run."""
    safe = cell.cell.replace("/", "_").replace("|", "__").replace(" ", "")
    log_path = log_dir / f"{safe}__seed{cell.seed}.log"
    # kept beside the log: the resume command the fit prints names it
    config_path = _cell_config_file(cell, tracking_uri, log_dir / f"{safe}__seed{cell.seed}.yaml")
    started = time.perf_counter()
    outcome = launcher.run(config_path, str(log_path))
    seconds = time.perf_counter() - started
    if outcome == 0:
        return cell, "FINISHED", seconds, ""
    if outcome == NOT_STARTED:
        return cell, "NOT-RUN", seconds, NOT_STARTED
    if outcome in INTERRUPTED_EXIT_CODES or STOPPED.is_set():  # Ctrl-C / SIGTERM: the fit ended its run KILLED
        if outcome not in INTERRUPTED_EXIT_CODES:  # its worker died first: say so in the store
            record_failure(tracking_uri, cell, f"the suite was stopped ({outcome}); log {log_path}", status="KILLED")
        return cell, "KILLED", seconds, "stopped with the suite; the next run of the suite resumes it"
    tail = log_path.read_text()[-3000:] if log_path.exists() else ""
    why = f"exit code {outcome}" if isinstance(outcome, int) else outcome
    error = f"{why}; log {log_path}:\n{tail}"
    record_failure(tracking_uri, cell, error)
    return cell, "FAILED", seconds, error


def final_metric(tracking_uri: str, suite: str) -> dict[tuple[str, str], float]:
    """(cell, seed) -> the run's mean client accuracy; for one model shared by every client tested
    on the shared set (``test_mode: global``), its global test accuracy, which every client has."""
    import math

    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    runs = mlflow.search_runs(experiment_names=[suite])
    accuracy = {}
    for _, run in runs.iterrows():
        for key in ("metrics.test_acc_mean", "metrics.global_test_acc"):
            value = run.get(key)
            if value is not None and not math.isnan(value):
                accuracy[(run[f"tags.{Tag.CELL}"], run[f"tags.{Tag.SEED}"])] = float(value)
                break
    return accuracy


def summary_table(cells: list[Cell], outcomes: dict[tuple[str, int], tuple[str, float]], accuracy: dict) -> str:
    rows: dict[str, dict[str, Any]] = {}
    for cell in cells:
        status, seconds = outcomes.get((cell.cell, cell.seed), ("SKIPPED (done)", 0.0))
        entry = rows.setdefault(cell.cell, {"status": [], "seconds": 0.0, "acc": []})
        entry["status"].append(status)
        entry["seconds"] += seconds
        value = accuracy.get((cell.cell, str(cell.seed)))
        if value is not None:
            entry["acc"].append(value)
    width = max(len(c) for c in rows) if rows else 10
    lines = [f"{'cell':{width}s}  {'runs':22s} {'mean acc':>9s} {'time':>8s}"]
    for name, entry in rows.items():
        counts = {s: entry["status"].count(s) for s in dict.fromkeys(entry["status"])}
        status = ", ".join(f"{n} {s.split()[0].lower()}" for s, n in counts.items())
        acc = f"{sum(entry['acc']) / len(entry['acc']):.4f}" if entry["acc"] else "—"
        lines.append(f"{name:{width}s}  {status:22s} {acc:>9s} {entry['seconds']:7.0f}s")
    return "\n".join(lines)


def select_cells(cells: list[Cell], name: str, benchmarks: list[str] | None,
                 configs: list[str] | None) -> list[Cell]:
    """Only the cells of the named benchmarks and configurations (all where a list is None); an
    unknown name is refused with the names the suite has."""
    for wanted, known, what in ((benchmarks, {c.benchmark for c in cells}, "benchmark"),
                                (configs, {c.algorithm_config for c in cells}, "configuration")):
        unknown = sorted(set(wanted or ()) - known)
        if unknown:
            raise SystemExit(f"suite '{name}' has no {what} {', '.join(map(repr, unknown))}; "
                             f"its {what}s: {', '.join(sorted(known))}")
    return [c for c in cells if (benchmarks is None or c.benchmark in benchmarks)
            and (configs is None or c.algorithm_config in configs)]


def check_algorithms(cells: list[Cell], name: str) -> None:
    """Every algorithm configuration of the suite, before its first cell runs: its class path
    names a class (with a did-you-mean), every setting is one the class takes, and every value
    keeps its setting's rule (``core.settings``). One line (``SystemExit``) for the first problem."""
    import importlib

    from fl_lightning.algorithms import ALGORITHMS
    from fl_lightning.choices import did_you_mean
    from fl_lightning.core.module import FederatedModule
    from fl_lightning.core.settings import check_setting, signature_types

    seen: set[str] = set()
    for cell in cells:
        model = cell.config.get("model") or {}
        class_path, init_args = model.get("class_path", ""), model.get("init_args") or {}
        key = f"{class_path}|{sorted(init_args.items(), key=str)!r}"
        if key in seen:
            continue
        seen.add(key)
        where = f"suite '{name}', {cell.algorithm_config}"
        module_name, _, class_name = class_path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError, ValueError):
            hint = did_you_mean(class_name, list(ALGORITHMS), prefix="fl_lightning.algorithms.")
            raise SystemExit(f"{where}: no algorithm class {class_path!r}{hint}") from None
        if not (isinstance(cls, type) and issubclass(cls, FederatedModule)):
            raise SystemExit(f"{where}: {class_path!r} is not a federated algorithm (a FederatedModule subclass)")
        types = signature_types(cls)
        for setting, value in init_args.items():
            if setting not in types:
                raise SystemExit(f"{where}: {class_name} takes no setting {setting!r}{did_you_mean(setting, list(types))}")
            try:
                check_setting(setting, value, types[setting], strict=True)
            except ValueError as error:
                raise SystemExit(f"{where}: {error}") from None


def run_suite(name: str, seeds: list[int] | None, jobs: int, tracking_uri: str, dry_run: bool = False,
              isolate: bool = False, cluster: str | None = None, job_folder: str | None = None,
              slurm_partition: str | None = None, timeout_min: int = 24 * 60, cpus_per_job: int | None = None,
              benchmarks: list[str] | None = None, configs: list[str] | None = None) -> int:
    cells = select_cells(load_suite(name, seeds), name, benchmarks, configs)
    check_algorithms(cells, name)  # before the store is touched and before any cell runs
    suite = cells[0].suite if cells else name
    durations: dict[str, list[float]] = {}
    if dry_run:  # reads the store, never creates or alters it
        done, durations, note = finished_runs_read_only(tracking_uri, suite)
    else:
        check_store(tracking_uri)
        done, note = finished_runs_or_exit(tracking_uri, suite), ""
    todo = [c for c in cells if (c.cell, str(c.seed), c.config_tag) not in done]
    print(f"suite {suite}: {len(cells)} runs ({len({c.cell for c in cells})} cells x seeds), "
          f"{len(cells) - len(todo)} already finished, {len(todo)} to run with {jobs} job(s)", flush=True)
    if note:
        print(f"  ({note})")
    if dry_run:
        from benchmarks.plan import plan_lines, published_durations

        for cell in todo:
            print(f"  would run {cell.cell} seed {cell.seed}")
        print("\n".join(plan_lines(todo, durations, jobs, published_durations(suite))))
        return 0
    ensure_experiment(tracking_uri, suite)  # before the parallel jobs race to create it
    log_dir = Path("benchmark_logs") / suite
    log_dir.mkdir(parents=True, exist_ok=True)
    from fl_lightning.machine import available_cores

    # the cores this process may use, shared by the jobs: the workers' OpenMP/MKL defaults (a run's
    # own intra-op count is its setting, model.threads, whatever --jobs is)
    threads = max(1, available_cores() // jobs)
    outcomes: dict[tuple[str, int], tuple[str, float]] = {}
    started = time.perf_counter()
    launcher: Any
    if cluster is not None:
        launcher = SubmititJobs(cluster, Path(job_folder or Path("benchmark_jobs") / suite), cpus_per_job or threads,
                                timeout_min, slurm_partition)
    else:
        launcher = IsolatedProcesses(threads) if isolate else WarmWorkers(jobs, threads)
    pool = ThreadPoolExecutor(max_workers=jobs)
    STOPPED.clear()
    futures = []
    reported: set[Any] = set()

    def report(future: Any, number: int) -> None:
        cell, status, seconds, error = future.result()
        outcomes[(cell.cell, cell.seed)] = (status, seconds)
        note = f"  ({error.splitlines()[0]})" if error else ""
        print(f"[{number}/{len(todo)}] {status:8s} {seconds:6.0f}s  {cell.cell} seed {cell.seed}{note}", flush=True)
        reported.add(future)

    stopped_by: int = signal.SIGINT
    # SIGTERM (kill, a scheduler's stop, a shell's background job, which ignores SIGINT) stops the
    # suite as Ctrl-C does, and is passed on to the workers (Ctrl-C reaches them from the terminal)
    on_term = signal.signal(signal.SIGTERM, _stop_suite) if threading.current_thread() is threading.main_thread() else None
    try:
        futures = [pool.submit(run_cell, cell, tracking_uri, log_dir, launcher) for cell in todo]
        for future in as_completed(futures):
            report(future, len(reported) + 1)
    except KeyboardInterrupt as stop:  # the cells not started are dropped, the running ones stop with their fits
        STOPPED.set()
        if isinstance(stop, SuiteStopped):
            stopped_by = stop.signum
            launcher.stop(stop.signum)
        verb = "terminated" if stopped_by == signal.SIGTERM else "interrupted"
        print(f"\n{verb} ({signal.Signals(stopped_by).name}): the cells in flight end KILLED; "
              f"`{program_name()} run {name}` again resumes them from their checkpoints", file=sys.stderr, flush=True)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        launcher.close()
        if on_term is not None:
            signal.signal(signal.SIGTERM, on_term)
    for future in futures:  # the cells that ended while the suite stopped
        if future not in reported and future.done() and not future.cancelled() and future.exception() is None:
            report(future, len(reported) + 1)
    for cell in todo:  # dropped when the suite stopped (not "skipped": that is a run finished before)
        outcomes.setdefault((cell.cell, cell.seed), ("NOT-RUN", 0.0))
    print(f"\nsuite {suite} {'stopped' if STOPPED.is_set() else 'done'} in {time.perf_counter() - started:.0f}s; "
          f"logs in {log_dir}\n")
    print(summary_table(cells, outcomes, final_metric(tracking_uri, suite)))
    failed = sum(1 for status, _ in outcomes.values() if status == "FAILED")
    if failed:
        print(f"\n{failed} run(s) failed: their errors are in the store (tag '{Tag.ERROR}') and in {log_dir}")
    print(f"\nStore: {tracking_uri}\nBuild the leaderboard from it:  {leaderboard_command(tracking_uri)}", flush=True)
    if STOPPED.is_set():
        return 128 + stopped_by
    return 1 if failed else 0


def leaderboard_command(tracking_uri: str) -> str:
    """The command that builds the leaderboard from ``tracking_uri``, as it runs from the folder
    the suite ran in: this installation's ``fl-leaderboard`` (its bare name where ``PATH`` finds
    it, else its path), else ``python -m leaderboard``."""
    from fl_lightning.callbacks.fit_report import console_command, shell_command

    return shell_command([*console_command("fl-leaderboard", "leaderboard"), "build", "--tracking-uri", tracking_uri])


LIST_WIDTH = 100
"""``list`` prints no line wider than this."""


def program_name() -> str:
    """How the runner was started, for its usage and error lines: the console script
    ``fl-benchmarks`` (``pip install`` puts it beside ``fl-lightning``), else ``python -m benchmarks``."""
    return "fl-benchmarks" if Path(sys.argv[0]).name == "fl-benchmarks" else "python -m benchmarks"


def first_sentence(text: str) -> str:
    """The first sentence of a suite's description (up to a full stop before a capital)."""
    return re.split(r"(?<=\.)\s+(?=[A-Z])", " ".join(text.split()), maxsplit=1)[0]


def estimate_suite(cells: list[Cell]) -> tuple[float, int]:
    """(estimated seconds at --jobs 1, runs without an estimate) as a dry run estimates a clean
    store's runs: the published ledger's run times where it has the cell, else its benchmark's other
    configurations' there, else the perf figures (``plan.cell_estimates``)."""
    from benchmarks.plan import cell_estimates, published_durations

    published = published_durations(cells[0].suite) if cells else {}
    seconds = [estimate for estimate, _ in cell_estimates(cells, {}, published)]
    return sum(s for s in seconds if s is not None), sum(s is None for s in seconds)


def suite_table(prog: str, width: int = LIST_WIDTH) -> list[str]:
    """``list``: one line per suite (name, runs, estimated time at --jobs 1, the first sentence of
    its description cut to fit ``width``), then what the numbers are."""
    from benchmarks.plan import _duration

    rows, partial = [], False
    for name in list_suites():
        cells = load_suite(name)
        seconds, unknown = estimate_suite(cells)
        partial |= unknown > 0
        time_text = "?" if unknown == len(cells) else _duration(seconds) + ("+" if unknown else "")
        description = first_sentence(cells[0].description) if cells else ""
        rows.append((name, f"{len(cells):,}", time_text, description))
    header = ("suite", "runs", "time", "description")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]

    def line(name: str, runs: str, time_text: str, description: str) -> str:
        start = f"{name:<{widths[0]}}  {runs:>{widths[1]}}  {time_text:>{widths[2]}}  "
        room = max(width - len(start), 0)
        if len(description) > room:
            description = description[:max(room - 1, 0)].rstrip() + "…"
        return (start + description).rstrip()

    lines = [line(*header)] + [line(*row) for row in rows]
    notes = ["runs: cells x seeds. time: estimated for --jobs 1 (about time / N with --jobs N) from the",
             "published ledger's run times (leaderboard/site/runs.csv) where it ran the cell, else from its",
             "benchmark's other configurations' runs there, else from the CPU throughput figures (in",
             "the folder benchmarks/perf/results); a GPU is faster for the large models."]
    if partial:
        notes.append("+: at least this (some runs' models have no throughput figure); ?: no estimate.")
    notes += [f"`{prog} run SUITE --dry-run --jobs N` also counts the runs finished in your store",
              "and lists the data files a suite still needs."]
    return lines + [""] + notes


def main(argv: list[str] | None = None) -> int:
    import argparse

    class OneLineParser(argparse.ArgumentParser):
        """A usage error in one line (what is wrong, where the help is), exit code 2."""

        def error(self, message: str):  # type: ignore[override]
            self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    prog = program_name()
    environment_uri = os.environ.get("MLFLOW_TRACKING_URI")
    parser = OneLineParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run benchmark suites (benchmarks/<paper>/<scale>.yaml): grids of `fl-lightning fit`\n"
                    "runs over benchmarks, algorithm configurations and seeds, logged to an MLflow store,\n"
                    "resumable. Build the leaderboard from the store with `fl-leaderboard build`.",
        epilog=f"`{prog} list` shows the suites; `{prog} run --help` the options of a run.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    run = sub.add_parser("run", help="run a suite (resumable)",
                         description="Run every (benchmark, algorithm configuration, seed) of a suite that the "
                                     "store holds no finished run of.")
    run.add_argument("suite", help=f"a suite name (`{prog} list` shows them with their sizes and estimated "
                                   "times, e.g. quickstart/offline) or a path to a suite YAML")
    run.add_argument("--seeds", type=int, nargs="+", help="override the suite's seeds (default: the suite's own)")
    run.add_argument("--jobs", type=int, default=1,
                     help="runs in parallel, each in its own worker process (default: %(default)s)")
    run.add_argument("--benchmarks", nargs="+", metavar="NAME",
                     help="run only these benchmarks of the suite (default: all)")
    run.add_argument("--configs", nargs="+", metavar="LABEL",
                     help="run only these algorithm configurations, by label, e.g. 'FedFV(alpha=0.1,tau=1)' "
                          "(default: all)")
    run.add_argument("--tracking-uri", default=environment_uri or DEFAULT_TRACKING_URI,
                     help="the MLflow store the runs log to: a SQLite file (sqlite:///path.db, relative to the "
                          "working folder), a folder (file://...) or a tracking server (http://...) "
                          f"(default: $MLFLOW_TRACKING_URI, else {DEFAULT_TRACKING_URI}"
                          + (f"; here: {environment_uri}" if environment_uri else "") + ")")
    run.add_argument("--dry-run", action="store_true",
                     help="list the runs that would run, the data files they lack and an estimate of their time "
                          "(reads the store; never creates or alters it)")
    run.add_argument("--isolate", action="store_true",
                     help="run every cell in a fresh process (slower: start-up and data loading paid per cell) "
                          "instead of in --jobs reused worker processes (default: reused workers)")
    run.add_argument("--cluster", choices=["slurm", "local"],
                     help="submit every cell as a job through submitit (slurm: a SLURM cluster; local: "
                          "submitit's local executor on this machine), --jobs of them in flight "
                          "(default: none, the cells run here)")
    run.add_argument("--job-folder", help="submitit's folder for job files and outputs (default "
                                          "benchmark_jobs/<suite>; on a SLURM cluster a folder every node sees)")
    run.add_argument("--slurm-partition",
                     help="the SLURM partition to submit to (--cluster slurm; default: the cluster's default)")
    run.add_argument("--timeout-min", type=int, default=24 * 60,
                     help="a job's time limit in minutes (--cluster; default: %(default)s, one day)")
    run.add_argument("--cpus-per-job", type=int, help="cores of a job, and its OpenMP/MKL threads (--cluster; "
                                                      "default: this machine's cores / --jobs); a run's torch "
                                                      "threads are its model.threads (1 by default)")
    sub.add_parser("list", help="list the suites: runs, estimated time, description",
                   description="One line per suite: its name, its runs (cells x seeds), their estimated time at "
                               "--jobs 1 and the first sentence of its description.")
    args = parser.parse_args(argv)
    if args.command == "list":
        try:
            print("\n".join(suite_table(prog)), flush=True)
        except BrokenPipeError:  # `... list | head`: the reader has what it wanted
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    if args.jobs < 1:
        run.error("--jobs must be >= 1")
    if args.cluster is not None and args.isolate:
        run.error("--isolate and --cluster both choose where cells run: give one")
    if args.timeout_min < 1:
        run.error("--timeout-min must be >= 1")
    if args.cpus_per_job is not None and args.cpus_per_job < 1:
        run.error("--cpus-per-job must be >= 1")
    if args.cluster is None and (args.job_folder or args.slurm_partition or args.cpus_per_job):
        run.error("--job-folder, --slurm-partition and --cpus-per-job go with --cluster")
    if args.cluster is not None and importlib.util.find_spec("submitit") is None:  # before the store is touched
        run.error(SUBMITIT_MISSING)
    return run_suite(args.suite, args.seeds, args.jobs, args.tracking_uri, args.dry_run, args.isolate,
                     args.cluster, args.job_folder, args.slurm_partition, args.timeout_min, args.cpus_per_job,
                     args.benchmarks, args.configs)


def cli() -> int:
    """The ``fl-benchmarks`` / ``python -m benchmarks`` entry point: :func:`main`, with a refusal
    (a ``SystemExit`` carrying a message: an unknown suite, an unreadable store, ...) said in one
    ``error:`` line with exit status 2, as the other tools do."""
    try:
        return main()
    except SystemExit as stop:
        if isinstance(stop.code, str):
            print(f"error: {stop.code}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(cli())
