"""Grid runner: expand a suite into (cell, seed) runs of `fl-lightning fit`, resumably.

A suite file (``benchmarks/<paper>/<name>.yaml``) is read by ``fl_lightning.suite_format``
(``SuiteSpec``; the format is at the top of that file): a suite name, paper, scale, seeds, a
LightningCLI ``base`` config, benchmarks merged over it, and algorithms expanded over their grids
(:mod:`benchmarks.suites`).

Every (benchmark, algorithm configuration) is a cell, and every cell runs once per seed
through the same code path as the CLI (``fl_lightning.cli``, with ``seed_everything: <seed>``
deciding every random stream), in one of ``--jobs`` reused worker processes (imports and
dataset parsing paid once per worker; ``--isolate``: a fresh process per run, same results;
``--cluster slurm``: one submitit job per run on a SLURM cluster; :mod:`benchmarks.launchers`),
tagged with suite, scale, paper, benchmark, cell, algorithm_config, seed, suite_description,
control (a variant's declared control benchmark) and cell_config (a digest of the cell's whole
config). Finished runs of the same cell config are found in the store and skipped
(:mod:`benchmarks.suite_store`), so an interrupted suite resumes where it stopped and an edited
cell runs again; a cell that fails is recorded as a FAILED run with its error, and the rest go
on. The command line is :mod:`benchmarks.command_line`.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import yaml

from benchmarks.launchers import (
    NOT_STARTED,
    STOPPED,
    IsolatedProcesses,
    Launcher,
    SubmititJobs,
    WarmWorkers,
)
from benchmarks.suite_store import (
    check_store,
    ensure_experiment,
    final_metric,
    finished_runs_or_exit,
    finished_runs_read_only,
    record_failure,
    resumable_checkpoint,
)
from benchmarks.suites import (
    Cell,
    check_algorithms,
    deep_merge,
    literal_text,
    load_suite,
    program_name,
    select_cells,
)
from fl_lightning.one_line import first_line
from fl_lightning.run_schema import DEFAULT_TRACKING_URI, Tag

INTERRUPTED_EXIT_CODES = (128 + 2, 128 + 15)  # a fit stopped by SIGINT / SIGTERM (lightning_cli.run)


class SuiteStopped(KeyboardInterrupt):
    """The suite was stopped by a signal (``signum``); raised in the runner's main thread."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop_suite(signum: int, frame: Any) -> None:
    raise SuiteStopped(signum)


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


def run_cell(cell: Cell, tracking_uri: str, log_dir: Path, launcher: Launcher) -> tuple[Cell, str, float, str]:
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


def run_suite(name: str, *, seeds: list[int] | None = None, jobs: int = 1,
              tracking_uri: str = DEFAULT_TRACKING_URI, dry_run: bool = False, isolate: bool = False,
              cluster: str | None = None, job_folder: str | None = None, slurm_partition: str | None = None,
              timeout_min: int = 24 * 60, cpus_per_job: int | None = None,
              benchmarks: list[str] | None = None, configs: list[str] | None = None,
              confirmatory: bool = False, root: Path | str | None = None) -> int:
    """``run``: the suite's runs that the store holds no finished run of, ``jobs`` at a time, on
    the launcher the options choose; the exit status (0, 1 when a run failed, 128 + the signal
    that stopped the suite). The options are the command line's (``fl-benchmarks run --help``).
    ``confirmatory``: the claims ledger's confirmatory pass (``benchmarks.ledger``): refused before
    anything is created unless the registered files under ``root`` (default ``benchmarks/``, or
    $FL_BENCHMARKS_LEDGER_ROOT) match the plan's registration hash; then the suite runs on the pass's
    seeds at its registered rounds and cadence, every run tagged with the pass and the hash."""
    rescale: tuple[list[Cell], list[Cell]] | None = None
    if confirmatory:
        from benchmarks.confirmatory import confirmatory_cells, ledger_root, load_confirmatory, registered_hash_or_exit

        plan_hash = registered_hash_or_exit(root)  # before the store, a folder or a cell is touched
        registered = load_confirmatory(root)
        if seeds is not None and not set(seeds) <= set(registered.seeds):  # the timing driver: one seed a call
            raise SystemExit(f"--seeds and --confirmatory: only the pass's registered seeds {registered.seeds} "
                             f"may be picked, got {seeds}")
        in_root = ledger_root(root) / f"{name}.yaml"
        source = str(in_root) if Path(name).suffix not in (".yaml", ".yml") and in_root.is_file() else name
        picked = registered.seeds if seeds is None else [s for s in registered.seeds if s in seeds]
        exploratory = select_cells(load_suite(source, picked), name, benchmarks, configs)
        cells = confirmatory_cells(exploratory, registered, plan_hash)
        rescale = (exploratory, cells)
    else:
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
        from benchmarks.plan import plan_lines, published_durations, rescaled_durations

        published = published_durations(suite)
        if rescale is not None:  # times measured at the exploratory lengths, rescaled to the registered ones
            durations, published = {}, rescaled_durations(published, *rescale)
            print(f"  (confirmatory pass: seeds {cells[0].seed if cells else ''}..{cells[-1].seed if cells else ''}, "
                  f"plan hash {cells[0].plan_hash[:12] if cells else ''}, the rounds and cadence of "
                  "ledger_confirmatory.yaml)")
        for cell in todo:
            rounds = (cell.config.get("model") or {}).get("init_args", {}).get("num_rounds", "")
            every = (cell.config.get("model") or {}).get("init_args", {}).get("eval_every", "")
            length = f" ({rounds} rounds, eval every {every})" if rescale is not None else ""
            print(f"  would run {cell.cell} seed {cell.seed}{length}")
        print("\n".join(plan_lines(todo, durations, jobs, published)))
        return 0
    ensure_experiment(tracking_uri, suite)  # before the parallel jobs race to create it
    log_dir = Path("benchmark_logs") / suite
    log_dir.mkdir(parents=True, exist_ok=True)
    from fl_lightning.machine import available_cores

    # the cores this process may use, shared by the jobs: each worker's OMP_NUM_THREADS, which a
    # run's model.threads "auto" (the default) resolves to and logs; a suite that sets a count keeps it
    threads = max(1, available_cores() // jobs)
    outcomes: dict[tuple[str, int], tuple[str, float]] = {}
    started = time.perf_counter()
    launcher: Launcher
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
        note = f"  ({first_line(error)})" if error else ""
        print(f"[{number}/{len(todo)}] {status:8s} {seconds:6.0f}s  {cell.cell} seed {cell.seed}{note}", flush=True)
        reported.add(future)

    stopped_by: int = signal.SIGINT
    # SIGTERM (kill, a scheduler's stop, a shell's background job, which ignores SIGINT) stops the
    # suite as Ctrl-C does, and is passed on to the workers (Ctrl-C reaches them from the terminal)
    on_term = (
        signal.signal(signal.SIGTERM, _stop_suite) if threading.current_thread() is threading.main_thread() else None
    )
    try:
        futures = [pool.submit(run_cell, cell, tracking_uri, log_dir, launcher) for cell in todo]
        for future in as_completed(futures):
            report(future, len(reported) + 1)
    except KeyboardInterrupt as stop:  # the cells not started are dropped, the running ones stop with their fits
        STOPPED.set()
        if on_term is not None:  # a second SIGTERM (a scheduler's repeat) must not cut the stop short
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if isinstance(stop, SuiteStopped):
            stopped_by = stop.signum
            launcher.stop(stop.signum)
        verb = "terminated" if stopped_by == signal.SIGTERM else "interrupted"
        print(
            f"\n{verb} ({signal.Signals(stopped_by).name}): the cells in flight end KILLED; "
            f"`{program_name()} run {name}{' --confirmatory' if confirmatory else ''}` again runs them, "
            "from their last checkpoint where the suite keeps checkpoints",
            file=sys.stderr,
            flush=True,
        )
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
