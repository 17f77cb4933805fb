"""Where a suite's cells run: reused worker processes (:class:`WarmWorkers`, the default), a fresh
process per cell (:class:`IsolatedProcesses`, ``--isolate``) or a scheduler's jobs through
submitit (:class:`SubmititJobs`, ``--cluster``). Every launcher is a :class:`Launcher`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Protocol

from fl_lightning.records.errors import first_line


class Launcher(Protocol):
    """Runs a cell's ``fl-lightning fit --config`` and answers its exit code, or a line saying why
    it could not run (:data:`NOT_STARTED` for a cell handed over after the suite stopped)."""

    def run(self, config_path: str, log_path: str) -> int | str:
        """The cell's fit, its output in ``log_path``."""

    def stop(self, signum: int) -> None:
        """Passes ``signum`` on to the cells in flight (their fits end their runs KILLED)."""

    def close(self) -> None:
        """Ends what the launcher started, once the suite's cells are done."""

MAX_WORKER_RESIDENT_MB = 4096.0
"""A worker whose resident memory passes this after a cell is replaced by a fresh one."""
NOT_STARTED = "not started: the suite was stopped"  # a launcher's answer for a cell it did not start
STOPPED = threading.Event()  # set when the suite is stopped (Ctrl-C, SIGTERM): its cells in flight end KILLED


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
    import fl_lightning.cli.lightning_cli  # noqa: F401 - the start-up every cell of this worker shares

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
        """The cell's fit in a fresh ``python -m fl_lightning.cli fit --config`` process, its output
        in ``log_path``: its exit code, or :data:`NOT_STARTED` once the suite has stopped."""
        env = {**os.environ, **_thread_env(self.threads)}
        with self.lock:
            if STOPPED.is_set():  # before the log is opened: a cell not started leaves no empty log
                return NOT_STARTED
            with open(log_path, "w") as log:
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
        """Asks the worker to leave (killed when it has not after 60 s) and
        forgets it; its next cell starts a fresh one."""
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
        """The cell's fit on the next idle worker: its exit code, why the worker died, or :data:`NOT_STARTED`
        once the suite has stopped; a worker over ``max_resident_mb`` after the cell is retired."""
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
        """The cell's fit as one submitit job, its config copied into the job folder: the exit code, the
        scheduler's reason when the job failed, or :data:`NOT_STARTED` once the suite has stopped."""
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=self.folder, delete=False) as handle:
            handle.write(Path(config_path).read_text())  # where the job's node can read it
        try:
            if STOPPED.is_set():
                return NOT_STARTED
            job = self.executor.submit(_fit_as_job, handle.name, str(Path(log_path).resolve()), self.threads)
            try:
                return int(job.result())
            except Exception as error:  # noqa: BLE001 - the scheduler's reason becomes the cell's error
                return f"job {job.job_id} failed: {first_line(error, type(error).__name__)}"
        finally:
            os.unlink(handle.name)

    def stop(self, signum: int) -> None:
        """Jobs submitted run on (a cluster's own ``scancel`` stops them); no new job is submitted."""

    def close(self) -> None:
        """Jobs end with their cells: nothing to stop."""
