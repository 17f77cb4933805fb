"""Timing runs: a timing suite run alone on an idle machine, its arms alternated and repeated.

A timing claim (FedLF's server time per round against FedFV's, CGSV's sampled Shapley time over psi's)
must not read times from runs made beside other work: two ledger builds of the same code and seeds
gave FedLF 743 and 310 ms a round. A timing suite (``benchmarks/<paper>/timing_*.yaml``) is run by
this driver instead of ``fl-benchmarks run``::

    python -m benchmarks.timing fedlf/timing_offline [--tracking-uri URI] [--max-load 0.5] [--max-wait 600]
        [--seeds ...] [--confirmatory] [--dry-run]

- **Alone.** One fit at a time (``jobs=1``). Before each fit the 1-minute load average must be below
  ``--max-load``; the driver waits for it (saying why, in one line) and gives up after ``--max-wait``
  seconds with a one-line error and exit status 1 (the finished fits are kept).
- **Alternated and repeated.** For each seed of the suite in order, every arm (a (benchmark,
  configuration) cell) runs once, and the order of the arms is reversed on every other seed (A B, B A,
  A B, ...), so a slow drift of the machine falls on both arms alike. Each call is the runner's own
  ``benchmarks.runner.run_suite(name, seeds=[seed], jobs=1, benchmarks=[...], configs=[...])``.
- **Resumable.** A (seed, arm) with a FINISHED run of the same cell config in the store is skipped
  (without waiting for the machine). Ctrl-C (or SIGTERM) stops the driver: the runner ends the fit in
  flight KILLED, so no run is left RUNNING, and running the driver again resumes.
- **Recorded.** For every fit: the 1-minute load average before and after it, the seconds it took,
  its place in the order, and the machine (CPU model and cores), in a JSON record beside the store
  (``<store>.<experiment>.timing.json``, written then renamed) and as tags on the run
  (``timing_load_before``, ``timing_load_after``, ``timing_order``, ``timing_machine``).
- **Confirmatory.** ``--confirmatory``: the claims ledger's confirmatory pass, as the runner's own
  ``--confirmatory``: the registered seeds and rounds (``benchmarks/ledger_confirmatory.yaml``, which
  must list the timing suite), each run tagged with the registration hash; one seed per runner call.
- **Summarised.** Per arm: the median over the repeats of each run's value (the mean over its rounds
  of the suite's timing metric) with its min and max; per seed: each arm's value over the baseline
  arm's (the paired ratio).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.suite_store import check_store, finished_runs
from benchmarks.suites import Cell, check_algorithms, load_suite, suite_path
from fl_lightning.records.machine import available_cores, cpu_description, cpu_model
from fl_lightning.records.store_uri import file_store_folder, sqlite_file
from fl_lightning.records.vocabulary import DEFAULT_TRACKING_URI, Metric, Tag

DEFAULT_MAX_LOAD = 0.5  # 1-minute load average: on a 2-core box, nothing else running
DEFAULT_MAX_WAIT_S = 600.0
POLL_S = 5.0  # the kernel updates the load average every 5 s
PROG = "python -m benchmarks.timing"

TAG_LOAD_BEFORE = "timing_load_before"
TAG_LOAD_AFTER = "timing_load_after"
TAG_ORDER = "timing_order"
TAG_MACHINE = "timing_machine"


@dataclass(frozen=True)
class Reading:
    """What a timing suite measures: ``metric`` logged per round, its mean over a run's rounds times
    ``scale`` in ``unit``; the paired ratio is each arm's value over the ``baseline`` arm's (a cell
    name, ``benchmark|configuration``)."""

    metric: str
    what: str
    unit: str
    scale: float
    baseline: str


READINGS = {
    "fedlf-timing-offline": Reading(
        Metric.SERVER_TIME_S, "server time per round", "ms", 1000.0,
        "mnist5k/pat-1/p0.1/fl_mlp|FedFV(alpha=0.1,tau=1)"),
    "cgsv-timing-offline": Reading(
        Metric.CGSV_SHAPLEY_TIME_RATIO, "sampled Shapley time over psi's", "x", 1.0,
        "mnist5k/pow-5/full/fl_mlp|CGSV(beta=1.0)"),
}
DEFAULT_READING = Reading(Metric.SERVER_TIME_S, "server time per round", "ms", 1000.0, "")


class MachineBusy(RuntimeError):
    """The load average stayed at or above the limit for the whole wait."""


class TimingStopped(KeyboardInterrupt):
    """The driver was stopped by a signal between fits (SIGTERM; Ctrl-C raises KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum: int, frame: Any) -> None:
    raise TimingStopped(signum)


def is_timing_suite(name: str) -> bool:
    """Whether a suite (a name such as ``fedlf/timing_offline``, or a path) is a timing suite: its
    file is ``timing_*.yaml``. The ledger runs such a suite through :func:`run_timing_suite`."""
    return suite_path(name).stem.startswith("timing")


@dataclass(frozen=True)
class Arm:
    benchmark: str
    config: str

    @property
    def cell(self) -> str:
        return f"{self.benchmark}|{self.config}"


def suite_arms(cells: Sequence[Cell]) -> list[Arm]:
    """The suite's arms (its (benchmark, configuration) cells) in the suite's order."""
    return list(dict.fromkeys(Arm(c.benchmark, c.algorithm_config) for c in cells))


def arm_order(arms: Sequence[Arm], position: int) -> list[Arm]:
    """The arms in the order the ``position``-th seed (0, 1, ...) runs them: the suite's order on even
    positions, reversed on odd ones (A B, B A, A B, ...)."""
    return list(arms) if position % 2 == 0 else list(reversed(arms))


def arm_labels(arms: Sequence[Arm]) -> dict[Arm, str]:
    """Short names: the configuration where every arm has one benchmark, the benchmark where every arm
    has one configuration, else the cell."""
    if len({a.benchmark for a in arms}) == 1:
        return {a: a.config for a in arms}
    if len({a.config for a in arms}) == 1:
        return {a: a.benchmark for a in arms}
    return {a: a.cell for a in arms}


def load_1min() -> float:
    return os.getloadavg()[0]


def wait_until_idle(max_load: float, max_wait_s: float, say: Callable[[str], None] = print) -> tuple[float, float]:
    """Waits until the 1-minute load average is below ``max_load`` (one line saying why when it must
    wait); (the load then, the seconds waited). ``MachineBusy`` after ``max_wait_s`` seconds."""
    started = time.monotonic()
    load = load_1min()
    if load < max_load:
        return load, 0.0
    say(f"timing: waiting for an idle machine: 1-minute load {load:.2f} >= --max-load {max_load} "
        f"(other work is running, or the last fit's load is still decaying); up to {max_wait_s:.0f} s")
    while True:
        waited = time.monotonic() - started
        if waited >= max_wait_s:
            raise MachineBusy(
                f"timing: the machine is busy: the 1-minute load ({load:.2f}) stayed at or above --max-load "
                f"{max_load} for {waited:.0f} s; stop the other work (or raise --max-wait) and run again "
                "(finished fits are kept)")
        time.sleep(min(POLL_S, max(max_wait_s - waited, 0.1)))
        load = load_1min()
        if load < max_load:
            return load, time.monotonic() - started


def record_path(tracking_uri: str, experiment: str) -> Path:
    """The JSON record beside the store: ``<db>.<experiment>.timing.json`` beside a SQLite file,
    ``<folder>.<experiment>.timing.json`` beside a file store, else in the working folder."""
    database = sqlite_file(tracking_uri)
    if database is not None:
        return database.with_name(f"{database.name}.{experiment}.timing.json")
    folder = file_store_folder(tracking_uri)
    if folder is not None:
        folder = folder.resolve()
        return folder.with_name(f"{folder.name}.{experiment}.timing.json")
    return Path(f"{experiment}.timing.json")


def read_record(path: Path) -> dict[str, Any]:
    if path.is_file():
        return json.loads(path.read_text())
    return {}


def write_record(path: Path, record: dict[str, Any]) -> None:
    """Written beside, then renamed: a reader never sees half a record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".partial", delete=False) as handle:
        json.dump(record, handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.replace(handle.name, path)


def machine() -> dict[str, Any]:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "cores_available": available_cores()}


def _entry_key(seed: int, arm: Arm) -> str:
    return f"{seed}|{arm.cell}"


def _latest_finished(client: Any, experiment_id: str, cell: Cell) -> Any:
    runs = client.search_runs(
        [experiment_id],
        filter_string=(f"tags.{Tag.CELL} = '{cell.cell}' and tags.{Tag.SEED} = '{cell.seed}' "
                       f"and tags.{Tag.CELL_CONFIG} = '{cell.config_tag}' and attributes.status = 'FINISHED'"),
        order_by=["attributes.start_time DESC"], max_results=1)
    return runs[0] if runs else None


def run_value(tracking_uri: str, cell: Cell, reading: Reading,
              tags: dict[str, str] | None = None) -> tuple[str, float | None]:
    """The cell's latest FINISHED run in the store: (its id, the mean over its rounds of the reading's
    metric, scaled); ``tags`` are set on it first. ("", None) when the store holds no such run."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(cell.suite)
    run = None if experiment is None else _latest_finished(client, experiment.experiment_id, cell)
    if run is None:
        return "", None
    for key, value in (tags or {}).items():
        client.set_tag(run.info.run_id, key, value)
    by_step = {m.step: m.value for m in client.get_metric_history(run.info.run_id, reading.metric)}
    if not by_step:
        return run.info.run_id, None
    return run.info.run_id, statistics.fmean(by_step.values()) * reading.scale


def timing_cells(name: str, seeds: list[int] | None, confirmatory: bool, root: Path | str | None) -> list[Cell]:
    """The suite's cells as the runner builds them: ``load_suite``'s; for the confirmatory pass, the
    registered copy of the suite (under the ledger's root) on the pass's seeds, at its registered
    rounds, tagged with the registration hash (``benchmarks.confirmatory.confirmatory_cells``), so that the
    driver's "already finished" and the runner's agree."""
    if not confirmatory:
        return load_suite(name, seeds)
    from benchmarks.confirmatory import confirmatory_cells, ledger_root, load_confirmatory, registered_hash_or_exit

    plan_hash = registered_hash_or_exit(root)
    registered = load_confirmatory(root)
    if seeds is not None:
        raise SystemExit("timing: --seeds and --confirmatory: the confirmatory pass runs the seeds registered in "
                         "ledger_confirmatory.yaml")
    in_root = ledger_root(root) / f"{name}.yaml"
    source = str(in_root) if Path(name).suffix not in (".yaml", ".yml") and in_root.is_file() else name
    return confirmatory_cells(load_suite(source, registered.seeds), registered, plan_hash)


@dataclass(frozen=True)
class _TimingPlan:
    """A timing suite's cells, what it reads and the order its fits run in."""

    name: str  # the suite as it was named (a name or a YAML path)
    cells: list[Cell]
    reading: Reading
    arms: list[Arm]
    labels: dict[Arm, str]
    by_key: dict[tuple[int, Arm], Cell]  # (seed, arm) -> its cell
    seeds: list[int]
    order: list[tuple[int, int, int, Arm]]  # (seed position, seed, arm number, arm), in running order

    @property
    def experiment(self) -> str:
        """The suite's experiment in the store."""
        return self.cells[0].suite


@dataclass(frozen=True)
class _Fit:
    """One timed fit: its place in the order, its exit status and what was measured around it."""

    position: int
    seed: int
    number: int
    arm: Arm
    outcome: int
    seconds: float
    waited: float
    load_before: float
    load_after: float


def run_timing(name: str, *, tracking_uri: str = DEFAULT_TRACKING_URI, max_load: float = DEFAULT_MAX_LOAD,
               max_wait_s: float = DEFAULT_MAX_WAIT_S, seeds: list[int] | None = None, dry_run: bool = False,
               confirmatory: bool = False, root: Path | str | None = None,
               run: Callable[..., int] | None = None, runner_options: dict[str, Any] | None = None) -> int:
    """Runs the timing suite ``name`` as the module's docstring says; the exit status (0; 1 when a fit
    failed or the machine stayed busy; 128 + the signal that stopped it). ``run`` is the runner's
    ``run_suite`` (replaceable in tests); ``runner_options`` are passed on to each of its calls (e.g.
    an option of a confirmatory pass), never ``seeds``, ``jobs``, ``benchmarks`` or ``configs``."""
    _refuse_fixed_options(runner_options)
    if run is None:
        from benchmarks.runner import run_suite

        run = run_suite
    plan = _timing_plan(name, seeds, confirmatory, root)
    runner_options = dict(runner_options or {})
    if confirmatory:  # each call: one of the pass's seeds (the runner checks it is one)
        runner_options |= {"confirmatory": True, "root": root}
    done, note = _finished_fits(tracking_uri, plan.experiment, dry_run)
    todo = [(position, seed, number, arm) for position, seed, number, arm in plan.order
            if (plan.by_key[(seed, arm)].cell, str(seed), plan.by_key[(seed, arm)].config_tag) not in done]
    print(f"timing {plan.experiment}: {len(plan.arms)} arms x {len(plan.seeds)} seeds, arms alternated per seed; "
          f"{len(plan.order) - len(todo)} already finished, {len(todo)} to run one at a time "
          f"(each after the 1-minute load is below {max_load}); machine: {cpu_description()}", flush=True)
    if note:
        print(f"  ({note})")
    if dry_run:
        _print_timing_plan(plan, done)
        return 0

    path = record_path(tracking_uri, plan.experiment)
    record = read_record(path) or {"suite": plan.experiment, "suite_file": name, "reading": asdict(plan.reading),
                                   "runs": {}}
    status = _time_fits(plan, todo, run, runner_options, tracking_uri=tracking_uri, max_load=max_load,
                        max_wait_s=max_wait_s, record=record, path=path)
    print()
    print(summary(tracking_uri, plan.cells, plan.arms, plan.reading, record, plan.seeds))
    if path.is_file():
        print(f"\nrecord: {path}", flush=True)
    return status


def _refuse_fixed_options(runner_options: dict[str, Any] | None) -> None:
    """Refuses ``runner_options`` that set what the driver sets itself."""
    fixed = ({"seeds", "jobs", "benchmarks", "configs", "tracking_uri", "dry_run", "confirmatory", "root"}
             & set(runner_options or {}))
    if fixed:
        raise ValueError(f"runner_options may not set {sorted(fixed)}: the driver sets them")


def _timing_plan(name: str, seeds: list[int] | None, confirmatory: bool, root: Path | str | None) -> _TimingPlan:
    """The timing suite's plan: its cells (refused when it has none), arms and the order of its fits."""
    cells = timing_cells(name, seeds, confirmatory, root)
    check_algorithms(cells, name)
    if not cells:
        raise SystemExit(f"timing: suite {name!r} has no cells")
    arms = suite_arms(cells)
    seed_list = list(dict.fromkeys(c.seed for c in cells))
    order = [(position, seed, number, arm) for position, seed in enumerate(seed_list)
             for number, arm in enumerate(arm_order(arms, position), start=1)]
    return _TimingPlan(name, cells, READINGS.get(cells[0].suite, DEFAULT_READING), arms, arm_labels(arms),
                      {(c.seed, Arm(c.benchmark, c.algorithm_config)): c for c in cells}, seed_list, order)


def _finished_fits(tracking_uri: str, experiment: str, dry_run: bool) -> tuple[set[tuple[str, str, str]], str]:
    """(the finished runs in the store, a note); a dry run reads the store without creating or altering it."""
    if dry_run:
        from benchmarks.suite_store import finished_runs_read_only

        done, _, note = finished_runs_read_only(tracking_uri, experiment)
        return done, note
    check_store(tracking_uri)
    return finished_runs(tracking_uri, experiment), ""


def _print_timing_plan(plan: _TimingPlan, done: set[tuple[str, str, str]]) -> None:
    """``--dry-run``: prints every fit in its order, finished or to run."""
    for _, seed, number, arm in plan.order:
        cell = plan.by_key[(seed, arm)]
        mark = "finished" if (cell.cell, str(seed), cell.config_tag) in done else "to run"
        print(f"  seed {seed} arm {number}/{len(plan.arms)}: {plan.labels[arm]:40s} {mark}")


def _time_fits(plan: _TimingPlan, todo: list[tuple[int, int, int, Arm]], run: Callable[..., int],
               runner_options: dict[str, Any], *, tracking_uri: str, max_load: float, max_wait_s: float,
               record: dict[str, Any], path: Path) -> int:
    """Runs the fits one at a time, each on an idle machine, recording each; the exit status."""
    status = 0
    on_term = (signal.signal(signal.SIGTERM, _stop) if threading.current_thread() is threading.main_thread()
               else None)
    try:
        for count, (position, seed, number, arm) in enumerate(todo, start=1):
            load_before, waited = wait_until_idle(max_load, max_wait_s)
            print(f"[{count}/{len(todo)}] seed {seed}, arm {number}/{len(plan.arms)} {plan.labels[arm]} "
                  f"(load {load_before:.2f})", flush=True)
            outcome, seconds, output = _timed_fit(plan.name, seed, arm, run, tracking_uri, runner_options)
            load_after = load_1min()
            if outcome >= 128:  # stopped by a signal: the runner ended the fit KILLED
                print(output, end="")
                print(f"timing: stopped ({signal.Signals(outcome - 128).name}) at seed {seed}, {plan.labels[arm]}; "
                      f"no fit is left running; `{PROG} {plan.name}` again resumes", file=sys.stderr, flush=True)
                status = outcome
                break
            fit = _Fit(position, seed, number, arm, outcome, seconds, waited, load_before, load_after)
            _record_fit(plan, fit, tracking_uri, max_load, record, path)
            if outcome != 0:
                print(output, end="", flush=True)
                status = 1
    except MachineBusy as busy:
        print(str(busy), file=sys.stderr, flush=True)
        status = 1
    except KeyboardInterrupt as stop:  # between fits (waiting for the machine, reading the store)
        signum = stop.signum if isinstance(stop, TimingStopped) else signal.SIGINT
        print(f"\ntiming: stopped ({signal.Signals(signum).name}) between fits; no fit is left running; "
              f"`{PROG} {plan.name}` again resumes", file=sys.stderr, flush=True)
        status = 128 + signum
    finally:
        if on_term is not None:
            signal.signal(signal.SIGTERM, on_term)
    return status


def _timed_fit(name: str, seed: int, arm: Arm, run: Callable[..., int], tracking_uri: str,
               runner_options: dict[str, Any]) -> tuple[int, float, str]:
    """Runs one arm on one seed through the runner, its output kept; (exit status, seconds, output)."""
    started = time.perf_counter()
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        outcome = run(name, seeds=[seed], jobs=1, benchmarks=[arm.benchmark], configs=[arm.config],
                      tracking_uri=tracking_uri, **runner_options)
    seconds = time.perf_counter() - started
    return outcome, seconds, output.getvalue()


def _record_fit(plan: _TimingPlan, fit: _Fit, tracking_uri: str, max_load: float, record: dict[str, Any],
                path: Path) -> None:
    """Tags the fit's run, writes the fit to the record and says how it ended."""
    tags = {TAG_LOAD_BEFORE: f"{fit.load_before:.2f}", TAG_LOAD_AFTER: f"{fit.load_after:.2f}",
            TAG_ORDER: f"seed position {fit.position}, arm {fit.number} of {len(plan.arms)}",
            TAG_MACHINE: cpu_description()}
    cell = plan.by_key[(fit.seed, fit.arm)]
    run_id, value = run_value(tracking_uri, cell, plan.reading, tags) if fit.outcome == 0 else ("", None)
    record["runs"][_entry_key(fit.seed, fit.arm)] = {
        "seed": fit.seed, "benchmark": fit.arm.benchmark, "algorithm_config": fit.arm.config,
        "seed_position": fit.position, "arm_number": fit.number,
        "status": "FINISHED" if fit.outcome == 0 else "FAILED",
        "run_id": run_id, "seconds": round(fit.seconds, 2), "waited_s": round(fit.waited, 1),
        "load_1min_before": round(fit.load_before, 2), "load_1min_after": round(fit.load_after, 2),
        "max_load": max_load, "machine": machine(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "value": value, "unit": plan.reading.unit,
    }
    write_record(path, record)
    shown = "no value" if value is None else f"{value:.4g} {plan.reading.unit}"
    print(f"    {'FINISHED' if fit.outcome == 0 else 'FAILED'} in {fit.seconds:.0f} s: {shown}; "
          f"load after {fit.load_after:.2f}", flush=True)


def _values(tracking_uri: str, cells: Sequence[Cell], reading: Reading,
            record: dict[str, Any]) -> dict[tuple[int, Arm], float]:
    """(seed, arm) -> value: from the record, else from the store (a fit finished by an earlier
    session whose record is gone, or by ``fl-benchmarks run``)."""
    values = {}
    for cell in cells:
        arm = Arm(cell.benchmark, cell.algorithm_config)
        entry = record.get("runs", {}).get(_entry_key(cell.seed, arm))
        if entry and entry.get("value") is not None:
            values[(cell.seed, arm)] = float(entry["value"])
            continue
        try:
            _, value = run_value(tracking_uri, cell, reading)
        except Exception:  # noqa: BLE001 - a store that cannot be read: the summary shows what it has
            value = None
        if value is not None:
            values[(cell.seed, arm)] = value
    return values


def summary(tracking_uri: str, cells: Sequence[Cell], arms: Sequence[Arm], reading: Reading,
            record: dict[str, Any], seeds: Sequence[int]) -> str:
    """Per arm: median, min and max over the seeds of each run's value; per seed: each arm over the
    baseline arm (the paired ratio)."""
    values = _values(tracking_uri, cells, reading, record)
    return summary_lines(values, arms, reading, record, seeds)


def summary_lines(values: dict[tuple[int, Arm], float], arms: Sequence[Arm], reading: Reading,
                  record: dict[str, Any], seeds: Sequence[int]) -> str:
    """The summary's text: the record's machines and loads, each arm's values, then the paired ratios."""
    labels = arm_labels(arms)
    lines = _record_lines(record, reading) + _arm_lines(values, arms, labels, seeds)
    baseline = next((a for a in arms if a.cell == reading.baseline), None)
    others = [a for a in arms if a != baseline]
    if baseline is None or not others or not any((s, baseline) in values for s in seeds):
        return "\n".join(lines)
    return "\n".join(lines + _ratio_lines(values, baseline, others, labels, seeds))


def _record_lines(record: dict[str, Any], reading: Reading) -> list[str]:
    """What the summary reads, the machines it ran on and the loads around its fits."""
    machines = sorted({e["machine"]["cpu"] + f" ({e['machine']['cores']} cores)"
                       for e in record.get("runs", {}).values() if e.get("machine")})
    loads = [e["load_1min_before"] for e in record.get("runs", {}).values() if "load_1min_before" in e]
    lines = [f"{record.get('suite', '')}: {reading.what} ({reading.unit}), each run's mean over its rounds; "
             f"machine: {', '.join(machines) or cpu_description()}"]
    if loads:
        lines.append(f"1-minute load before the fits: {min(loads):.2f} to {max(loads):.2f}")
    busy = [e for e in record.get("runs", {}).values()
            if e.get("load_1min_after", 0.0) > 1.0 + e.get("max_load", DEFAULT_MAX_LOAD)]
    if busy:
        lines.append(f"{len(busy)} fit(s) ended with a 1-minute load above 1 + the limit (the fit itself is about 1): "
                     "other work may have run beside them: " + ", ".join(
                         f"seed {e['seed']} {e['benchmark']}|{e['algorithm_config']}" for e in busy))
    return lines


def _arm_lines(values: dict[tuple[int, Arm], float], arms: Sequence[Arm], labels: dict[Arm, str],
               seeds: Sequence[int]) -> list[str]:
    """Per arm: its runs and the median, min and max of their values."""
    width = max(len(label) for label in labels.values())
    lines = [f"  {'arm':{width}s}  runs  {'median':>9s} {'min':>9s} {'max':>9s}"]
    for arm in arms:
        got = [values[(s, arm)] for s in seeds if (s, arm) in values]
        if got:
            lines.append(f"  {labels[arm]:{width}s}  {len(got):4d}  {statistics.median(got):9.4g} "
                         f"{min(got):9.4g} {max(got):9.4g}")
        else:
            lines.append(f"  {labels[arm]:{width}s}  {0:4d}  {'—':>9s} {'—':>9s} {'—':>9s}")
    return lines


def _ratio_lines(values: dict[tuple[int, Arm], float], baseline: Arm, others: list[Arm], labels: dict[Arm, str],
                 seeds: Sequence[int]) -> list[str]:
    """Per seed, each other arm's value over the baseline arm's; then their median, min and max."""
    lines = [f"paired ratio per seed: each arm's value over {labels[baseline]}'s"]
    head = "  ".join(f"{labels[a]:>{max(9, len(labels[a]))}s}" for a in others)
    lines.append(f"  {'seed':>6s}  {head}")
    ratios: dict[Arm, list[float]] = {a: [] for a in others}
    for seed in seeds:
        if (seed, baseline) not in values or values[(seed, baseline)] == 0:
            continue
        cells_text = []
        for arm in others:
            text = "—"
            if (seed, arm) in values:
                ratio = values[(seed, arm)] / values[(seed, baseline)]
                ratios[arm].append(ratio)
                text = f"{ratio:.3g}"
            cells_text.append(f"{text:>{max(9, len(labels[arm]))}s}")
        lines.append(f"  {seed:>6d}  {'  '.join(cells_text)}")
    stats = []
    for arm in others:
        got = ratios[arm]
        text = f"{statistics.median(got):.3g} [{min(got):.3g}, {max(got):.3g}]" if got else "—"
        stats.append(f"{labels[arm]}: {text}")
    lines.append(f"  median [min, max]: {'; '.join(stats)}")
    return lines


def run_timing_suite(name: str, *, jobs: int = 1, tracking_uri: str = DEFAULT_TRACKING_URI,
                     seeds: list[int] | None = None, dry_run: bool = False, confirmatory: bool = False,
                     root: Path | str | None = None, **options: Any) -> int:
    """``run_suite``'s call shape for the ledger (``benchmarks.ledger.run_ledger``): a timing suite runs
    through the driver with its load limit and wait, one fit at a time whatever ``jobs`` the ledger runs
    the other suites at; ``seeds`` (a confirmatory pass's) and the runner's other options are passed on
    (``benchmarks`` and ``configs``: the driver runs every arm)."""
    options = {k: v for k, v in options.items() if k not in ("benchmarks", "configs")}
    return run_timing(name, tracking_uri=tracking_uri, seeds=seeds, dry_run=dry_run, confirmatory=confirmatory,
                      root=root, runner_options=options)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.timing``: runs a timing suite alone on an
    idle machine (:func:`run_timing`); returns its exit status."""
    from fl_lightning.records.errors import OneLineParser

    environment_uri = os.environ.get("MLFLOW_TRACKING_URI")
    parser = OneLineParser(
        prog=PROG,
        description="Run a timing suite (benchmarks/<paper>/timing_*.yaml) alone on an idle machine: one fit "
                    "at a time, each after the 1-minute load average is below --max-load, the arms "
                    "alternated per seed (A B, B A, ...); resumable; records the load and the machine.")
    parser.add_argument("suite", help="a timing suite, e.g. fedlf/timing_offline or cgsv/timing_offline (or a path)")
    parser.add_argument("--tracking-uri", default=environment_uri or DEFAULT_TRACKING_URI,
                        help=f"the MLflow store (default: $MLFLOW_TRACKING_URI, else {DEFAULT_TRACKING_URI})")
    parser.add_argument("--max-load", type=float, default=DEFAULT_MAX_LOAD,
                        help=f"the 1-minute load average a fit waits to be below (default {DEFAULT_MAX_LOAD})")
    parser.add_argument("--max-wait", type=float, default=DEFAULT_MAX_WAIT_S, metavar="SECONDS",
                        help="give up (exit status 1) after waiting this long for it "
                             f"(default {DEFAULT_MAX_WAIT_S:.0f})")
    parser.add_argument("--seeds", type=int, nargs="+", help="override the suite's seeds (default: its own)")
    parser.add_argument("--dry-run", action="store_true", help="print the order of the fits and which are finished")
    parser.add_argument("--confirmatory", action="store_true",
                        help="the claims ledger's confirmatory pass: the registered seeds and rounds, each run tagged "
                             "with the registration hash (refused when the registered files differ from it)")
    args = parser.parse_args(argv)
    if args.max_load <= 0 or args.max_wait < 0:
        parser.error("--max-load must be positive and --max-wait not negative")
    return run_timing(args.suite, tracking_uri=args.tracking_uri, max_load=args.max_load,
                      max_wait_s=args.max_wait, seeds=args.seeds, dry_run=args.dry_run,
                      confirmatory=args.confirmatory)


if __name__ == "__main__":
    sys.exit(main())
