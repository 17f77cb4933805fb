"""Grid runner: expand a suite into (cell, seed) runs of `fl-lightning fit`, resumably.

A suite file (``benchmarks/<paper>/<name>.yaml``) is read by ``fl_lightning.records.suite_format``
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

One runner per cell: runners of one suite on one store claim each cell before it runs (a claim
file beside the store, :func:`benchmarks.suite_store.claims_folder`, holding the runner's host and
process id; a claim whose runner is gone is taken over). A runner that finds a cell claimed by a
live runner leaves it (ELSEWHERE) and, once its own cells are done, waits for that claim to go
and then runs the cell only if it did not finish, so two runners split the cells and never
duplicate a run, resume a live one or write the same log. The exit status tells the truth: 0
only when every cell finished (here or by the other runner), 1 when a cell ended FAILED or
KILLED, 128 + the signal when the suite was stopped: SIGINT, SIGTERM and SIGHUP all stop it,
SIGINT even where the runner inherited it ignored (a background job of a script), and no cell
starts after the stop.
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
    cell_finished,
    check_store,
    claims_folder,
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
from fl_lightning.records.errors import first_line
from fl_lightning.records.fit_lock import release_claim, try_claim
from fl_lightning.records.vocabulary import DEFAULT_TRACKING_URI, Tag

INTERRUPTED_EXIT_CODES = (128 + 2, 128 + 15)  # a fit stopped by SIGINT / SIGTERM (lightning_cli.run)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # each stops the suite (see the module's docstring)
ELSEWHERE = "ELSEWHERE"  # a cell another live runner of the store has claimed
BAD_ENDS = ("FAILED", "KILLED")  # a cell that ended so makes the runner's exit status 1
WAIT_S = 2.0  # how often a runner looks again at the cells another runner holds
ExploratoryAndPass = tuple[list[Cell], list[Cell]]  # a confirmatory pass's cells beside their exploratory ones


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


def cell_file_name(cell: Cell) -> str:
    """The stem of the cell's log, config and claim files."""
    return f"{cell.cell.replace('/', '_').replace('|', '__').replace(' ', '')}__seed{cell.seed}"


def run_cell(cell: Cell, tracking_uri: str, log_dir: Path, launcher: Launcher,
             claims: Path | None = None) -> tuple[Cell, str, float, str]:
    """Runs one (cell, seed) through ``launcher`` (:class:`WarmWorkers` or :class:`IsolatedProcesses`);
    (cell, status, seconds, error). A cell that fails is recorded in the store as a FAILED run.

    ``claims``: the store's claims folder; the cell is claimed there first, and left
    (:data:`ELSEWHERE`) while another live runner holds it, or skipped (``SKIPPED (done)``) when it
    finished meanwhile; its config and log are written only under the claim."""
    if claims is None:
        return _run_claimed_cell(cell, tracking_uri, log_dir, launcher)
    path = claims / f"{cell_file_name(cell)}.claim"
    try:
        claims.mkdir(parents=True, exist_ok=True)
        holder = try_claim(path)
    except OSError as error:
        return cell, "NOT-RUN", 0.0, f"cannot claim the cell in {claims} ({error.strerror or error})"
    if holder is not None:
        who = f"process {holder.get('pid')} on {holder.get('host')}" if holder else "another process"
        return cell, ELSEWHERE, 0.0, f"being run by another runner of this store ({who}; claim {path})"
    try:
        if STOPPED.is_set():
            return cell, "NOT-RUN", 0.0, NOT_STARTED
        if cell_finished(tracking_uri, cell.suite, cell.cell, str(cell.seed), cell.config_tag):
            return cell, "SKIPPED (done)", 0.0, ""  # another runner finished it meanwhile
        return _run_claimed_cell(cell, tracking_uri, log_dir, launcher)
    finally:
        release_claim(path)


def _run_claimed_cell(cell: Cell, tracking_uri: str, log_dir: Path, launcher: Launcher) -> tuple[Cell, str, float, str]:
    safe = cell_file_name(cell)
    log_path = log_dir / f"{safe}.log"
    # kept beside the log: the resume command the fit prints names it
    config_path = _cell_config_file(cell, tracking_uri, log_dir / f"{safe}.yaml")
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
    """The suite's table, one line per cell: how its seeds' runs ended (a seed without an outcome this time: skipped),
    the mean of their accuracies in ``accuracy`` ((cell, seed) -> value; — without any) and the seconds they took."""
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


def threads_per_job(jobs: int, cores: int | None = None) -> int:
    """Each of ``jobs`` workers' share of the cores this process may use (``cores``, default
    ``fl_lightning.records.machine.available_cores()``), at least 1 (``--jobs`` above the core count
    oversubscribes rather than starving a worker): its OMP_NUM_THREADS, which a run's
    ``model.threads`` "auto" (the default) resolves to and logs; a suite that sets a count keeps it."""
    if cores is None:
        from fl_lightning.records.machine import available_cores

        cores = available_cores()
    return max(1, cores // jobs)


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
    cells, rescale = _suite_cells(name, seeds, benchmarks, configs, confirmatory, root)
    check_algorithms(cells, name)  # before the store is touched and before any cell runs
    suite = cells[0].suite if cells else name
    done, durations, note = _finished_runs(tracking_uri, suite, dry_run)
    todo = [c for c in cells if (c.cell, str(c.seed), c.config_tag) not in done]
    print(f"suite {suite}: {len(cells)} runs ({len({c.cell for c in cells})} cells x seeds), "
          f"{len(cells) - len(todo)} already finished, {len(todo)} to run with {jobs} job(s)", flush=True)
    if note:
        print(f"  ({note})")
    if dry_run:
        _print_plan(suite, cells, todo, durations, jobs, rescale)
        return 0
    log_dir = Path("benchmark_logs") / suite
    log_dir.mkdir(parents=True, exist_ok=True)
    claims = claims_folder(tracking_uri, suite, log_dir)
    threads = threads_per_job(jobs)
    progress = _Progress(len(todo))
    started = time.perf_counter()
    launcher = _launcher(suite, jobs, threads, isolate, cluster, job_folder, slurm_partition, timeout_min,
                         cpus_per_job)
    stopped_by = _run_cells(todo, launcher, progress, jobs=jobs, tracking_uri=tracking_uri, log_dir=log_dir,
                            claims=claims, name=name, confirmatory=confirmatory)
    progress.report_late()
    for cell in todo:  # dropped when the suite stopped (not "skipped": that is a run finished before)
        progress.outcomes.setdefault((cell.cell, cell.seed), ("NOT-RUN", 0.0))
    _print_summary(name, suite, cells, progress.outcomes, tracking_uri, log_dir, started)
    return exit_status(progress.outcomes, stopped_by if STOPPED.is_set() else None)


def _suite_cells(name: str, seeds: list[int] | None, benchmarks: list[str] | None, configs: list[str] | None,
                 confirmatory: bool, root: Path | str | None) -> tuple[list[Cell], ExploratoryAndPass | None]:
    """The suite's cells to run, and for the confirmatory pass (its exploratory cells, its cells)."""
    if not confirmatory:
        return select_cells(load_suite(name, seeds), name, benchmarks, configs), None
    rescale = _confirmatory_cells(name, seeds, benchmarks, configs, root)
    return rescale[1], rescale


def _confirmatory_cells(name: str, seeds: list[int] | None, benchmarks: list[str] | None,
                        configs: list[str] | None, root: Path | str | None) -> ExploratoryAndPass:
    """(exploratory cells, pass cells) of the confirmatory pass; refused unless registered and on its seeds."""
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
    return exploratory, confirmatory_cells(exploratory, registered, plan_hash)


def _finished_runs(tracking_uri: str, suite: str,
                   dry_run: bool) -> tuple[set[tuple[str, str, str]], dict[str, list[float]], str]:
    """(finished runs, wall seconds per cell, a note) from the store; only a real run may create it."""
    if dry_run:
        return finished_runs_read_only(tracking_uri, suite)
    check_store(tracking_uri)
    ensure_experiment(tracking_uri, suite)  # a new store: one runner makes it, the others wait
    return finished_runs_or_exit(tracking_uri, suite), {}, ""


def _print_plan(suite: str, cells: list[Cell], todo: list[Cell], durations: dict[str, list[float]], jobs: int,
                rescale: ExploratoryAndPass | None) -> None:
    """``--dry-run``: prints the runs that would run, the data they lack and an estimate of their time."""
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


def _launcher(suite: str, jobs: int, threads: int, isolate: bool, cluster: str | None, job_folder: str | None,
              slurm_partition: str | None, timeout_min: int, cpus_per_job: int | None) -> Launcher:
    """The launcher the options choose: submitit jobs, a fresh process per cell, or reused workers."""
    if cluster is not None:
        return SubmititJobs(cluster, Path(job_folder or Path("benchmark_jobs") / suite), cpus_per_job or threads,
                            timeout_min, slurm_partition)
    return IsolatedProcesses(threads) if isolate else WarmWorkers(jobs, threads)


class _Progress:
    """The outcomes of a suite's cells as they end, each said in one line."""

    def __init__(self, total: int) -> None:
        self.total = total  # the runs to run
        self.outcomes: dict[tuple[str, int], tuple[str, float]] = {}
        self.futures: list[Any] = []  # every submitted cell, including the ones looked at again
        self.reported: set[Any] = set()
        self.waiting: set[tuple[str, int]] = set()  # the cells another runner held when looked at: said once

    def report(self, future: Any) -> Cell | None:
        """Says how the cell ended; the cell, if another runner holds it (looked at again later)."""
        self.reported.add(future)
        cell, status, seconds, error = future.result()
        key = (cell.cell, cell.seed)
        if status == ELSEWHERE:
            self.outcomes[key] = (status, 0.0)
            if key not in self.waiting:  # said once, not on every look
                self.waiting.add(key)
                print(f"[-/{self.total}] {status:8s} {0:6.0f}s  {cell.cell} seed {cell.seed}  ({first_line(error)}; "
                      "waiting for it)", flush=True)
            return cell
        self.outcomes[key] = (status, seconds)
        note = f"  ({first_line(error)})" if error else ""
        number = sum(1 for value, _ in self.outcomes.values() if value != ELSEWHERE)
        print(f"[{number}/{self.total}] {status:8s} {seconds:6.0f}s  {cell.cell} seed {cell.seed}{note}", flush=True)
        return None

    def report_late(self) -> None:
        """Says the cells that ended while the suite stopped."""
        for future in self.futures:
            if future not in self.reported and future.done() and not future.cancelled() and future.exception() is None:
                self.report(future)


def _run_cells(todo: list[Cell], launcher: Launcher, progress: _Progress, *, jobs: int, tracking_uri: str,
               log_dir: Path, claims: Path, name: str, confirmatory: bool) -> int:
    """Runs the cells until all ended or a signal stopped the suite; that signal (SIGINT if none)."""
    pool = ThreadPoolExecutor(max_workers=jobs)
    STOPPED.clear()
    stopped_by: int = signal.SIGINT
    # SIGINT (Ctrl-C; also where a background job of a script inherited it ignored), SIGTERM (kill,
    # a scheduler's stop) and SIGHUP (the terminal closed) stop the suite; after SIGTERM and SIGHUP
    # the workers are sent SIGTERM (a fit ends its run KILLED); Ctrl-C reaches them from the
    # terminal, and a second SIGINT would cut a fit's stop short
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {number: signal.signal(number, _stop_suite) for number in STOP_SIGNALS} if main_thread else {}
    try:
        batch = [pool.submit(run_cell, cell, tracking_uri, log_dir, launcher, claims) for cell in todo]
        progress.futures += batch
        while batch:
            held = [left for left in (progress.report(future) for future in as_completed(batch)) if left is not None]
            if held:  # another runner's cells: looked at again until it lets them go
                time.sleep(WAIT_S)
            batch = [pool.submit(run_cell, cell, tracking_uri, log_dir, launcher, claims) for cell in held]
            progress.futures += batch
    except KeyboardInterrupt as stop:  # the cells not started are dropped, the running ones stop with their fits
        stopped_by = _stop_cells(stop, previous, launcher, name, confirmatory)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        launcher.close()
        for number, handler in previous.items():
            signal.signal(number, handler)
    return stopped_by


def _stop_cells(stop: KeyboardInterrupt, previous: dict[Any, Any], launcher: Launcher, name: str,
                confirmatory: bool) -> int:
    """Stops the suite's cells and says how to run them again; the signal that stopped it."""
    STOPPED.set()
    for number in previous:  # a second signal (a scheduler's repeat) must not cut the stop short
        signal.signal(number, signal.SIG_IGN)
    stopped_by: int = stop.signum if isinstance(stop, SuiteStopped) else signal.SIGINT
    if stopped_by != signal.SIGINT:  # Ctrl-C reaches the workers from the terminal
        launcher.stop(signal.SIGTERM)
    verb = {signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}.get(signal.Signals(stopped_by), "interrupted")
    print(
        f"\n{verb} ({signal.Signals(stopped_by).name}): the cells in flight end KILLED; "
        f"`{program_name()} run {name}{' --confirmatory' if confirmatory else ''}` again runs them, "
        "from their last checkpoint where the suite keeps checkpoints",
        file=sys.stderr,
        flush=True,
    )
    return stopped_by


def _print_summary(name: str, suite: str, cells: list[Cell], outcomes: dict[tuple[str, int], tuple[str, float]],
                   tracking_uri: str, log_dir: Path, started: float) -> None:
    """Prints how the suite ended, its cells' table, what failed and how to build the leaderboard."""
    ended = "stopped" if STOPPED.is_set() else "done" if exit_status(outcomes, None) == 0 else "ended"
    print(f"\nsuite {suite} {ended} in {time.perf_counter() - started:.0f}s; "
          f"logs in {log_dir}\n")
    print(summary_table(cells, outcomes, final_metric(tracking_uri, suite)))
    failed = sum(1 for status, _ in outcomes.values() if status == "FAILED")
    killed = sum(1 for status, _ in outcomes.values() if status == "KILLED")
    if failed:
        print(f"\n{failed} run(s) failed: their errors are in the store (tag '{Tag.ERROR}') and in {log_dir}")
    if killed and not STOPPED.is_set():
        print(f"\n{killed} run(s) were stopped by a signal to their fits: "
              f"`{program_name()} run {name}` again resumes them")
    print(f"\nStore: {tracking_uri}\nBuild the leaderboard from it:  {leaderboard_command(tracking_uri)}", flush=True)


def exit_status(outcomes: dict[tuple[str, int], tuple[str, float]], stopped_by: int | None) -> int:
    """128 + the signal that stopped the suite; else 1 when a cell ended FAILED or KILLED (or was
    left unfinished to another runner that stopped), else 0."""
    if stopped_by is not None:
        return 128 + stopped_by
    return 1 if any(status in BAD_ENDS or status in (ELSEWHERE, "NOT-RUN") for status, _ in outcomes.values()) else 0


def leaderboard_command(tracking_uri: str) -> str:
    """The command that builds the leaderboard from ``tracking_uri``, as it runs from the folder
    the suite ran in: this installation's ``fl-leaderboard`` (its bare name where ``PATH`` finds
    it, else its path), else ``python -m leaderboard``."""
    from fl_lightning.callbacks.fit_report import console_command, shell_command

    return shell_command([*console_command("fl-leaderboard", "leaderboard"), "build", "--tracking-uri", tracking_uri])
