"""What a dry run says before a suite runs: the data files that are missing (where they go and
how to get them) and how long the runs would take on this machine.

The estimate of a run, in order of preference (issue 50: a run's cost depends on its algorithm as
much as on its model: FedLF's round costs 3-5 times FedAvg's on the same MLP), each named in the
dry run by its source (``SOURCES``):

1. ``store``: the median wall time of the cell's finished runs in the store (any seed);
2. ``published``: the same, of the published ledger's runs of the cell (``leaderboard_site/runs.csv``);
3. ``ledger``: the published ledger's runs of the same algorithm, model and data (source, clients,
   fraction, batch size, local epochs) in any suite, rescaled to the cell's rounds, evaluations
   and client samples a round (``ledger_pair_estimate``);
4. ``costs``: the measured cost table of ``python -m benchmarks.perf.algorithm_costs`` (seconds a
   round of each algorithm on each offline model), scaled the same way (``cost_table_estimate``);
5. ``benchmark``: the finished runs of the same benchmark's other configurations (any algorithm);
6. ``perf``: a guess, the same for every algorithm: rounds x (client samples per round / the
   model's training throughput measured by ``python -m benchmarks.perf``) plus evaluations, a
   per-round overhead and the start of a run;
7. none: the model has no throughput figure (it is named, with the command that measures it).

The sizes of the training sets are the published ones (``TRAIN_SIZES``); a partition's
``total_size`` or ``samples_per_client`` takes precedence. Estimates are for the CPU figures
in the results files; where the suite was also measured on a GPU (``perf_cuda*.json``), a second
line gives the time there, from the figure at the clients per round nearest the run's.
"""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fl_lightning.records import vocabulary as schema
from fl_lightning.records.vocabulary import Tag

if TYPE_CHECKING:
    from benchmarks.suites import Cell

PERF_RESULTS = Path(__file__).resolve().parent / "perf" / "results"
PERF_FILES = "perf_cpu*.json"  # perf_cpu.json and further models measured into perf_cpu_<what>.json
GPU_PERF_FILES = "perf_cuda*.json"  # the same suite on a GPU (python -m benchmarks.perf --device cuda)
# the published ledger's runs (leaderboard_site/runs.csv): how long each cell's runs took when it was made
PUBLISHED_RUNS = Path(__file__).resolve().parents[1] / "leaderboard_site" / "runs.csv"
# seconds a round per (algorithm, model), measured by python -m benchmarks.perf.algorithm_costs
COST_TABLE = PERF_RESULTS / "algorithm_costs_cpu.json"

TRAIN_SIZES = {  # published training-set sizes (samples), for estimates only
    "mnist": 60_000,
    "fashion_mnist": 60_000,
    "cifar10": 50_000,
    "cifar100": 50_000,
    "emnist": 112_800,  # balanced
    "mnist5k": 5_000,
    "digits": 1_797,
    "femnist": 805_263,  # LEAF, all 3,550 writers
    "shakespeare": 4_226_158,  # LEAF, all roles
    "adult": 32_561,
}
SYNTHETIC_MEAN_CLIENT_SIZE = 400  # FedProx's lognormal sizes + 50, clipped: about 400 on average
ROUND_OVERHEAD_S = 0.05  # logging, sampling and aggregation of a small model, per round
RUN_START_S = 4.0  # a run's start in a warm worker: store, data, model, the partition figure
EVAL_COST = 1 / 3  # a forward pass costs about a third of a training step per sample
# a worker's first fit pays imports and warm-up once per job (the runs' own times leave it out):
# 4-30 s over a later fit of the same cell in algorithm_costs' warm-up fits, 13-16 s in the
# quickstart's first two runs, both on the busy 2-core EPYC (issue 50)
FIRST_FIT_S = 10.0


@dataclass(frozen=True)
class MissingData:
    source: str
    data_dir: str
    files: tuple[str, ...]
    obtain: str
    runs: int


def _data(cell_config: dict) -> dict:
    return cell_config.get("data") or {}


def _init_args(cell_config: dict) -> dict:
    return (cell_config.get("model") or {}).get("init_args") or {}


def missing_data(configs: Iterable[dict]) -> list[MissingData]:
    """The sources whose files are not under their ``data_dir``, once per (source, data_dir, params)."""
    from fl_lightning.data.source_registry import missing_files

    found: dict[tuple, MissingData] = {}
    for config in configs:
        data = _data(config)
        source, data_dir = (
            data.get(schema.SOURCE, schema.DEFAULT_SOURCE),
            str(data.get("data_dir", schema.DEFAULT_DATA_DIR)),
        )
        params = data.get(schema.SOURCE_PARAMS) or {}
        key = (source, data_dir, json.dumps(params, sort_keys=True))
        if key in found:
            entry = found[key]
            found[key] = MissingData(entry.source, entry.data_dir, entry.files, entry.obtain, entry.runs + 1)
            continue
        try:
            files, obtain = missing_files(source, data_dir, **params)
        except ValueError as error:  # an unknown source or parameter: the run would fail the same way
            files, obtain = [f"(cannot check: {error})"], ""
        found[key] = MissingData(source, data_dir, tuple(files), obtain, 1)
    return [entry for entry in found.values() if entry.files]


def training_samples(config: dict) -> float | None:
    """Client samples trained on per round (fraction x training samples x local epochs)."""
    data, args = _data(config), _init_args(config)
    params = data.get(schema.PARTITION_PARAMS) or {}
    num_clients = int(data.get(schema.NUM_CLIENTS, schema.DEFAULT_NUM_CLIENTS))
    source = data.get(schema.SOURCE, schema.DEFAULT_SOURCE)
    if "total_size" in params:
        total = float(params["total_size"])
    elif "samples_per_client" in params:
        total = float(params["samples_per_client"]) * num_clients
    elif source == "synthetic":
        total = float(SYNTHETIC_MEAN_CLIENT_SIZE * num_clients)
    elif source in TRAIN_SIZES:
        total = float(TRAIN_SIZES[source])
        if data.get(schema.TEST_MODE, schema.DEFAULT_TEST_MODE) == schema.LOCAL_TEST_MODE:
            total *= 1 - float(data.get(schema.LOCAL_TEST_FRACTION, schema.DEFAULT_LOCAL_TEST_FRACTION))
    else:
        return None
    return _fraction(args) * total * int(args.get(schema.LOCAL_EPOCHS, schema.DEFAULT_LOCAL_EPOCHS))


def _fraction(init_args: dict) -> float:
    return float(init_args.get(schema.FRACTION, schema.DEFAULT_FRACTION))


def _reports(folder: Path, pattern: str) -> list[dict]:
    """The perf results files matching ``pattern``, read once (unreadable ones left out)."""
    reports = []
    for path in sorted(folder.glob(pattern)):
        try:
            report = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(report, dict):
            reports.append(report)
    return reports


def _default_vectorised_rows(reports: list[dict]) -> list[dict]:
    rows = [row for report in reports for row in report.get("throughput") or [] if isinstance(row, dict)]
    return [row for row in rows
            if row.get("status") == "ok" and row.get("variant") is None and row.get("engine") == "vectorised"]


def model_throughput(folder: Path = PERF_RESULTS) -> dict[str, float]:
    """Training client-samples per second of each model: the best default vectorised CPU figure."""
    best: dict[str, float] = {}
    for row in _default_vectorised_rows(_reports(folder, PERF_FILES)):
        best[row["model"]] = max(best.get(row["model"], 0.0), float(row["client_samples_per_second"]))
    return best


def gpu_throughput(folder: Path = PERF_RESULTS) -> tuple[dict[str, dict[int, float]], str | None]:
    """The GPU figures by model and clients per round (a GPU's throughput grows with the clients
    trained at once, unlike a CPU's), and the GPU's name; ``({}, None)`` where none was measured."""
    reports = _reports(folder, GPU_PERF_FILES)
    by_model: dict[str, dict[int, float]] = {}
    for row in _default_vectorised_rows(reports):
        speeds = by_model.setdefault(row["model"], {})
        speeds[int(row["clients"])] = max(speeds.get(int(row["clients"]), 0.0), float(row["client_samples_per_second"]))
    names = {str(report["machine"]["gpu"]) for report in reports if (report.get("machine") or {}).get("gpu")}
    return by_model, ", ".join(sorted(names)) or None


def gpu_estimate_seconds(config: dict, by_model: dict[str, dict[int, float]]) -> float | None:
    """A run's wall time on the GPU of the figures: the model's figure measured at the number of
    clients nearest to the run's clients per round."""
    args, data = _init_args(config), _data(config)
    speeds = by_model.get(args.get(schema.BACKBONE, schema.DEFAULT_BACKBONE))
    if not speeds:
        return None
    clients = _fraction(args) * int(data.get(schema.NUM_CLIENTS, schema.DEFAULT_NUM_CLIENTS))
    nearest = min(speeds, key=lambda measured: (abs(measured - clients), measured))
    model = args.get(schema.BACKBONE, schema.DEFAULT_BACKBONE)
    return estimate_seconds(config, {model: speeds[nearest]})


def estimate_seconds(config: dict, throughput: dict[str, float]) -> float | None:
    """A run's wall time from the perf figures, or None where its model has none."""
    args = _init_args(config)
    model = args.get(schema.BACKBONE, schema.DEFAULT_BACKBONE)
    per_round = training_samples(config)
    if model not in throughput or per_round is None:
        return None
    rounds = int(args.get(schema.NUM_ROUNDS, schema.DEFAULT_NUM_ROUNDS))
    speed = throughput[model]
    evaluations = rounds / int(args.get(schema.EVAL_EVERY, schema.DEFAULT_EVAL_EVERY)) + 1
    fraction = _fraction(args) * int(args.get(schema.LOCAL_EPOCHS, schema.DEFAULT_LOCAL_EPOCHS))
    evaluated = per_round / fraction if fraction else 0.0  # every client's data
    return (RUN_START_S + rounds * (per_round / speed + ROUND_OVERHEAD_S)
            + evaluations * evaluated * EVAL_COST / speed)


RESCALE_START_S = 0.6  # a run's start in a warm worker, as the ledger's exploratory runs measured it


def _length(config: dict) -> tuple[int, int]:
    args = _init_args(config)
    rounds = int(args.get(schema.NUM_ROUNDS, schema.DEFAULT_NUM_ROUNDS))
    return rounds, -(-rounds // int(args.get(schema.EVAL_EVERY, schema.DEFAULT_EVAL_EVERY)))


def rescaled_durations(durations: dict[str, list[float]], before: list[Cell],
                       after: list[Cell]) -> dict[str, list[float]]:
    """Wall seconds measured for the cells ``before`` at their rounds and cadence, rescaled to the
    same cells ``after`` (in the same order) at theirs: a run's start plus the rest, scaled by the
    larger of the rounds' and the evaluations' growth (an upper bound; ``leaderboard.run_lengths``)."""
    growth: dict[str, float] = {}
    for old, new in zip(before, after):
        (rounds_old, evals_old), (rounds_new, evals_new) = _length(old.config), _length(new.config)
        growth[new.cell] = max(rounds_new / rounds_old, evals_new / evals_old)
    return {cell: [RESCALE_START_S + max(t - RESCALE_START_S, 0.0) * growth[cell] for t in times]
            for cell, times in durations.items() if cell in growth}


def published_durations(suite: str, path: Path = PUBLISHED_RUNS) -> dict[str, list[float]]:
    """Wall seconds of the published ledger's finished exploratory runs of ``suite``, per cell (empty
    where the file or the suite is missing): a clean re-run's best estimate, the code that made them
    being close to this one. The confirmatory pass's runs are left out: they ran at its own rounds."""
    return _published_durations_by_suite(path).get(suite, {})


@functools.lru_cache(maxsize=4)
def _published_durations_by_suite(path: Path) -> dict[str, dict[str, list[float]]]:
    """The published runs file read once (``benchmarks list`` asks for every suite): suite ->
    cell -> wall seconds of its finished runs."""
    import csv
    from datetime import datetime

    durations: dict[str, dict[str, list[float]]] = {}
    try:
        with open(path, newline="") as rows:
            for row in csv.DictReader(rows):
                if row.get("status") != "FINISHED" or not row.get("end_time"):
                    continue
                if row.get("task_ledger_pass") == "confirmatory":
                    continue  # run at the confirmatory pass's rounds and cadence, not the suite's
                seconds = (
                    datetime.fromisoformat(row["end_time"]) - datetime.fromisoformat(row["start_time"])
                ).total_seconds()
                durations.setdefault(row["suite"], {}).setdefault(row["cell"], []).append(seconds)
    except (OSError, KeyError, ValueError):
        return {}
    return durations


def _algorithm(cell) -> tuple[str, str]:
    """(class name, label) of a cell's algorithm: ``FedFV`` and ``FedFV(alpha=0.1,tau=1)``."""
    label = cell.cell.split("|", 1)[1] if "|" in cell.cell else ""
    class_path = (cell.config.get("model") or {}).get("class_path")
    return (class_path.rsplit(".", 1)[-1] if class_path else label.split("(", 1)[0]), label


def _setting(config: dict) -> tuple:
    """What a round's cost depends on besides the algorithm: model, source, clients, fraction,
    batch size and local epochs (as the published runs file spells them)."""
    args, data = _init_args(config), _data(config)
    return (args.get(schema.BACKBONE, schema.DEFAULT_BACKBONE), data.get(schema.SOURCE, schema.DEFAULT_SOURCE),
            int(data.get(schema.NUM_CLIENTS, schema.DEFAULT_NUM_CLIENTS)), round(_fraction(args), 6),
            int(args.get("batch_size", 0) or 0),
            int(args.get(schema.LOCAL_EPOCHS, schema.DEFAULT_LOCAL_EPOCHS)))


def _rescaled(seconds: float, start: float, measured: tuple[int, int, float | None], config: dict) -> float:
    """``seconds`` measured at (rounds, evaluation cadence, client samples a round) rescaled to
    ``config``'s: the start plus the rest, scaled by the larger of the rounds' and the evaluations'
    growth (as ``rescaled_durations``) and by the client samples trained a round."""
    rounds_old, every_old, samples_old = measured
    rounds_new, evals_new = _length(config)
    growth = max(rounds_new / rounds_old, evals_new / -(-rounds_old // every_old))
    samples_new = training_samples(config)
    size = samples_new / samples_old if samples_new and samples_old else 1.0
    return start + max(seconds - start, 0.0) * growth * size


def _as_config(row: dict) -> dict | None:
    """A published run's task as a run config (what ``_setting`` and ``training_samples`` read)."""
    try:
        task = json.loads(row.get("task") or "{}")
        params = json.loads(row.get("params") or "{}")
        return {"model": {"init_args": {
                    schema.BACKBONE: row["task_model"], schema.FRACTION: float(row["task_fraction"]),
                    schema.LOCAL_EPOCHS: int(float(row["task_local_epochs"])),
                    "batch_size": int(float(row["task_batch_size"])),
                    schema.NUM_ROUNDS: int(float(row["rounds_planned"])),
                    schema.EVAL_EVERY: int(params.get("eval_every") or schema.DEFAULT_EVAL_EVERY)}},
                "data": {schema.SOURCE: row["task_source"], schema.NUM_CLIENTS: int(float(row["task_num_clients"])),
                         schema.PARTITION_PARAMS: {k: v for k, v in (task.get("partition_params") or {}).items()
                                                   if v is not None},
                         schema.TEST_MODE: task.get("test_mode") or schema.DEFAULT_TEST_MODE}}
    except (KeyError, TypeError, ValueError):
        return None


@functools.lru_cache(maxsize=4)
def _published_runs_by_setting(path: Path) -> dict[tuple, list[tuple[float, tuple[int, int, float | None]]]]:
    """The published finished runs by (algorithm class, label, setting), each as (wall seconds,
    (rounds, evaluation cadence, client samples a round)); under the label ``""`` too, so that a
    cell whose label the ledger never ran still finds the class's runs."""
    import csv
    from datetime import datetime

    runs: dict[tuple, list[tuple[float, tuple[int, int, float | None]]]] = {}
    try:
        with open(path, newline="") as rows:
            for row in csv.DictReader(rows):
                if row.get("status") != "FINISHED" or not row.get("end_time"):
                    continue
                config = _as_config(row)
                if config is None:
                    continue
                try:
                    seconds = (datetime.fromisoformat(row["end_time"])
                               - datetime.fromisoformat(row["start_time"])).total_seconds()
                    rounds, _ = _length(config)
                    measured = (rounds, int(_init_args(config)[schema.EVAL_EVERY]), training_samples(config))
                except (TypeError, ValueError, KeyError, ZeroDivisionError):  # a row it cannot read: left out
                    continue
                for label in (row.get("algorithm_config") or "", ""):
                    runs.setdefault((row["algorithm"], label, _setting(config)), []).append((seconds, measured))
    except (OSError, KeyError, ValueError):
        return {}
    return runs


def ledger_pair_estimate(cell, path: Path | None = None) -> float | None:
    """The median of the published ledger's runs of the cell's algorithm (its label, else any
    configuration of its class) on the same model and data, each rescaled to the cell's rounds,
    evaluations and client samples a round; None where the ledger ran no such run."""
    runs = _published_runs_by_setting(path or PUBLISHED_RUNS)
    name, label = _algorithm(cell)
    setting = _setting(cell.config)
    seen = runs.get((name, label, setting)) or runs.get((name, "", setting))
    if not seen:
        return None
    return statistics.median(_rescaled(t, RESCALE_START_S, measured, cell.config) for t, measured in seen)


def cost_table(path: Path | None = None) -> tuple[dict[tuple[str, str], dict], str]:
    """The measured cost table (``COST_TABLE`` unless ``path``): (algorithm class, model) -> its row,
    and where it was measured ("2-core AMD EPYC ..., 2026-12-07"); ``({}, "")`` where the file is
    missing or unreadable."""
    return _read_cost_table(path or COST_TABLE)


@functools.lru_cache(maxsize=4)
def _read_cost_table(path: Path) -> tuple[dict[tuple[str, str], dict], str]:
    try:
        report = json.loads(path.read_text())
        rows = {(row["algorithm"], row["model"]): row for row in report["costs"]
                if row.get("status") == "ok" and row.get("per_round_s") is not None}
    except (OSError, ValueError, KeyError, TypeError):
        return {}, ""
    machine = report.get("machine") or {}
    where = f"{machine.get('cpu_cores', '?')}-core {machine.get('cpu', 'CPU')}, {report.get('date', '?')}"
    return rows, where


def cost_table_estimate(cell, table: dict[tuple[str, str], dict] | None = None) -> float | None:
    """The cell's wall time from the cost table's row of its (algorithm, model): the row's start
    plus its seconds a round (measured at one evaluation every ``eval_every`` rounds) at the
    cell's rounds, scaled by the evaluations' growth where the cell evaluates more often and by
    the client samples trained a round; None where the table has no row for the pair."""
    row = (cost_table()[0] if table is None else table).get(
        (_algorithm(cell)[0], _init_args(cell.config).get(schema.BACKBONE, schema.DEFAULT_BACKBONE)))
    if row is None:
        return None
    every = int(row.get("eval_every") or 10)
    start, per_round = float(row.get("start_s") or 0.0), float(row["per_round_s"])
    # the row's figures as one run of ``every`` rounds, rescaled to the cell
    return _rescaled(start + every * per_round, start, (every, every, row.get("train_samples_per_round")), cell.config)


def cell_estimates(cells: list, durations: dict[str, list[float]],
                   published: dict[str, list[float]] | None = None) -> list[tuple[float | None, str]]:
    """Each cell's estimated seconds and its source (``SOURCES``), in order of preference: the
    median of its finished runs in the store (``store``), else of the published ledger's
    (``published``), else the ledger's runs of the same algorithm, model and data in any suite
    (``ledger``), else the measured cost table of its algorithm and model (``costs``), else the
    finished runs of the same benchmark's other configurations, store and published together
    (``benchmark``: any algorithm), else the perf figures (``perf``, the same for every algorithm;
    None where its model has none)."""
    throughput = model_throughput()
    per_benchmark: dict[str, list[float]] = {}
    for seen in (durations, published or {}):
        for cell_name, times in seen.items():
            per_benchmark.setdefault(cell_name.split("|", 1)[0], []).extend(times)
    estimates: list[tuple[float | None, str]] = []
    for cell in cells:
        for basis, seen in (("store", durations.get(cell.cell)), ("published", (published or {}).get(cell.cell))):
            if seen:
                estimates.append((statistics.median(seen), basis))
                break
        else:
            pair = ledger_pair_estimate(cell)
            measured = cost_table_estimate(cell) if pair is None else None
            if pair is not None:
                estimates.append((pair, "ledger"))
            elif measured is not None:
                estimates.append((measured, "costs"))
            elif per_benchmark.get(cell.cell.split("|", 1)[0]):
                estimates.append((statistics.median(per_benchmark[cell.cell.split("|", 1)[0]]), "benchmark"))
            else:
                estimates.append((estimate_seconds(cell.config, throughput), "perf"))
    return estimates


def sources() -> dict[str, str]:
    """What each source of an estimate is, as the dry run names it."""
    where = cost_table()[1]
    return {
        "store": "this store's finished runs of the cell",
        "published": "the published ledger's runs of the cell (leaderboard_site/runs.csv)",
        "ledger": "the published ledger's runs of the same algorithm, model and data, rescaled to the cell's "
                  "rounds and evaluations",
        "costs": f"the measured cost table ({where or 'not measured'}; benchmarks/perf/results/{COST_TABLE.name})",
        "benchmark": "the same benchmark's other configurations' runs, any algorithm",
        "perf": f"a guess from the model's CPU throughput (benchmarks/perf/results/{PERF_FILES}), "
                "the same for every algorithm",
    }


SHORT_SOURCE = {"store": "here", "published": "published", "ledger": "ledger", "costs": "cost table",
                "benchmark": "benchmark", "perf": "guess"}


def plan_lines(cells: list, durations: dict[str, list[float]], jobs: int,
               published: dict[str, list[float]] | None = None) -> list[str]:
    """The dry run's report: missing data, then the estimated time of the runs to run with the
    source of each estimate, its algorithms and longest rows (benchmark x algorithm configuration)
    and the GPU estimate."""
    lines = []
    for entry in missing_data(cell.config for cell in cells):
        shown = ", ".join(entry.files[:4]) + (f" and {len(entry.files) - 4} more" if len(entry.files) > 4 else "")
        lines.append(f"  data missing for {entry.runs} run(s): {entry.source} needs {shown}"
                     + (f"; get them with {entry.obtain}" if entry.obtain else ""))
    total, estimated, unknown_models = 0.0, 0, set()
    basis = dict.fromkeys(SHORT_SOURCE, 0)
    per_model: dict[str, float] = {}
    per_algorithm: dict[str, list[tuple[float, str]]] = {}
    per_row: dict[str, list[tuple[float, str]]] = {}
    for cell, (seconds, source) in zip(cells, cell_estimates(cells, durations, published)):
        model = _init_args(cell.config).get(schema.BACKBONE, schema.DEFAULT_BACKBONE)
        if seconds is None:
            unknown_models.add(model)
            continue
        basis[source] += 1
        total += seconds
        estimated += 1
        per_model[model] = per_model.get(model, 0.0) + seconds
        per_algorithm.setdefault(_algorithm(cell)[1] or "?", []).append((seconds, source))
        per_row.setdefault(cell.cell, []).append((seconds, source))
    if cells:
        described = sources()
        how = "; ".join(f"{n} from {b}: {described[b]}" for b, n in basis.items() if n)
        first = FIRST_FIT_S if estimated else 0.0
        lines.append(f"  estimated time: {_duration(total / jobs + first)} with {jobs} job(s) for {estimated} of "
                     f"{len(cells)} run(s) ({how or 'none'}; and {first:.0f} s for the workers' first fits)")
    if len(per_model) > 1:
        largest = sorted(per_model.items(), key=lambda item: -item[1])[:3]
        lines.append("  of which " + ", ".join(f"{m} {_duration(t / jobs)}" for m, t in largest))
    if len(per_algorithm) > 1:
        slowest = sorted(per_algorithm.items(), key=lambda item: -sum(t for t, _ in item[1]))
        lines.append("  by algorithm (runs x median run at --jobs 1, source): " + "; ".join(
            f"{label} {len(runs)} x {_duration(statistics.median(t for t, _ in runs))} ({_sources_of(runs)})"
            for label, runs in slowest[:8]) + (f"; and {len(slowest) - 8} more" if len(slowest) > 8 else ""))
    if len(per_row) > 1:
        longest = sorted(per_row.items(), key=lambda item: -sum(t for t, _ in item[1]))[:5]
        lines.append(
            "  longest rows (runs x median run at --jobs 1, source): "
            + "; ".join(
                f"{row} {len(runs)} x {_duration(statistics.median(t for t, _ in runs))} = "
                f"{_duration(sum(t for t, _ in runs))} ({_sources_of(runs)})"
                for row, runs in longest
            )
        )
    gpu_figures, gpu = gpu_throughput()
    on_gpu = [gpu_estimate_seconds(cell.config, gpu_figures) for cell in cells] if gpu_figures else []
    if any(seconds is not None for seconds in on_gpu):
        known = [seconds for seconds in on_gpu if seconds is not None]
        lines.append(f"  on a GPU ({gpu}, one run at a time): {_duration(sum(known))} for {len(known)} of "
                     f"{len(cells)} run(s) (benchmarks/perf/results/{GPU_PERF_FILES}, at the nearest measured "
                     "clients per round; the same for every algorithm)")
    if unknown_models:
        lines.append(f"  not estimated: no throughput figure for {', '.join(sorted(unknown_models))} "
                     "(measure it: python -m benchmarks.perf --models <name> --sections throughput "
                     "--out benchmarks/perf/results/perf_cpu_<name>.json)")
    return lines


def _sources_of(runs: list[tuple[float, str]]) -> str:
    """``cost table`` or ``2 here, 1 cost table``: the sources of a group's estimates."""
    counts: dict[str, int] = {}
    for _, source in runs:
        counts[source] = counts.get(source, 0) + 1
    if len(counts) == 1:
        return SHORT_SOURCE[next(iter(counts))]
    return ", ".join(f"{n} {SHORT_SOURCE[s]}" for s, n in counts.items())


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.0f} days"


def run_durations(tracking_uri: str, suite: str) -> dict[str, list[float]]:
    """Wall seconds of the suite's finished runs, per cell (read through ``tracking_uri``)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    experiment = client.get_experiment_by_name(suite)
    if experiment is None:
        return {}
    durations: dict[str, list[float]] = {}
    token = None
    while True:
        page = client.search_runs([experiment.experiment_id], "attributes.status = 'FINISHED'",
                                  max_results=1000, page_token=token)
        for run in page:
            cell, end = run.data.tags.get(Tag.CELL), run.info.end_time
            if cell and end:
                durations.setdefault(cell, []).append((end - run.info.start_time) / 1000)
        token = page.token
        if not token:
            return durations


def estimate_suite(cells: list[Cell], measured_as: list[Cell] | None = None) -> tuple[float, int]:
    """(estimated seconds at --jobs 1, runs without an estimate) as a dry run estimates a clean
    store's runs, by the sources of ``plan.cell_estimates`` without a store. ``measured_as``: the same
    cells at the lengths the published runs had (their times are rescaled to ``cells``' lengths)."""
    published = published_durations(cells[0].suite) if cells else {}
    if measured_as is not None:
        published = rescaled_durations(published, measured_as, cells)
    seconds = [estimate for estimate, _ in cell_estimates(cells, {}, published)]
    return sum(s for s in seconds if s is not None), sum(s is None for s in seconds)
