"""The performance suite: round throughput, peak memory and server aggregation time.

    python -m benchmarks.perf                      # the full suite on the default device
    python -m benchmarks.perf --quick              # fewer rounds and cells (a few minutes on a CPU)
    python -m benchmarks.perf --device cuda --models fl_cct_7_3x1 --clients 100

Sections (see benchmarks/perf/README.md for the fields of the results file):

* ``throughput``: for every (model, clients per round, engine) cell, FedAvg rounds with
  full participation of ``clients`` clients holding ``--samples-per-client`` samples each,
  E=1, B=10; the median seconds per round over ``--rounds`` timed rounds after a warm-up
  round, client-samples per second, and the cell's peak memory. Each cell runs in its own
  process (``benchmarks.perf.round_throughput``), so a crash or an out-of-memory kill is
  recorded as that cell's error and the suite goes on. Variants of the vectorised engine
  (mixed precision, automatic chunking) run as extra cells where the installed
  ``FederatedModule`` accepts their arguments.
* ``aggregation``: every algorithm's server step (``aggregate`` + ``on_round_end``) on a
  random round of m clients and d parameters (``benchmarks.perf.aggregation``).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.perf.cell import CELL_DEFAULTS, run_cell_here
from benchmarks.perf.machine import describe_machine, proc_kib_as_mib

REPO_ROOT = Path(__file__).resolve().parents[2]
MODELS = ["fl_logreg", "fl_mlp", "fl_cnn_cifar", "fl_nf_resnet18", "fl_cct_7_3x1"]
CLIENTS = [10, 100]
ENGINES = ["vectorised", "sequential"]
# extra cells of the vectorised engine: name -> FederatedModule arguments
VARIANTS = {
    "bf16": {"local_autocast": "bf16"},
    "chunk_auto": {"clients_per_chunk": "auto"},
}
AGGREGATION_SIZES = {"full": "0.8M", "quick": "0.2M"}  # names from aggregation.MODELS
ERROR_TAIL_CHARS = 2000
BUSY_CORES = 0.2  # other processes' average load during a cell above which it is flagged


# ----------------------------------------------------------------------------- host load


def busy_cpu_seconds() -> float | None:
    """CPU seconds every process of this machine has spent so far (Linux /proc/stat)."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def available_memory_mib() -> float | None:
    return proc_kib_as_mib("/proc/meminfo", "MemAvailable:")


# ----------------------------------------------------------------------------- cells


def variant_support(options: dict) -> str | None:
    """Why the installed FederatedModule cannot run with ``options`` (None: it can).

    Checks the constructor's signature, then builds a tiny module with the options, so a
    value the module does not accept yet (e.g. ``clients_per_chunk="auto"``) is found
    here rather than in a cell."""
    from fl_lightning.algorithms import FedAvg
    from fl_lightning.core.module import FederatedModule

    parameters = inspect.signature(FederatedModule.__init__).parameters
    missing = [name for name in options if name not in parameters]
    if missing:
        return f"FederatedModule has no parameter {', '.join(missing)}"
    try:
        FedAvg(backbone="fl_logreg", num_classes=10, input_shape=(60,), **options)
    except (TypeError, ValueError) as error:
        return f"FederatedModule rejects {options}: {error}"
    return None


def plan_cells(args: argparse.Namespace) -> list[dict]:
    """Every cell of the throughput section, in the order they run."""
    settings = {key: getattr(args, key) for key in ("rounds", "warmup", "samples_per_client",
                                                   "batch_size", "local_epochs", "device", "seed", "threads")}
    settings["max_timed_seconds"] = args.max_timed_seconds
    support = {name: variant_support(VARIANTS[name]) for name in args.variants}
    cells = []
    for model in args.models:
        for clients in args.clients:
            for engine in args.engines:
                cells.append({"model": model, "clients": clients, "engine": engine, "variant": None,
                              "options": {}, **settings})
            if "vectorised" not in args.engines:
                continue
            for name in args.variants:
                cell = {"model": model, "clients": clients, "engine": "vectorised", "variant": name,
                        "options": VARIANTS[name], **settings}
                if support[name] is not None:
                    cell |= {"status": "skipped", "error": support[name]}
                cells.append(cell)
    return cells


def run_cell_process(cell: dict, timeout: float) -> dict:
    """Runs one cell in a fresh Python process; returns its entry (never raises)."""
    spec = {key: value for key, value in cell.items() if key not in ("variant", "status", "error")}
    started = time.perf_counter()
    busy_before, ours_before = busy_cpu_seconds(), children_cpu_seconds()
    with tempfile.TemporaryDirectory(prefix="perf_cell_") as folder:
        result_path = Path(folder) / "result.json"
        command = [sys.executable, "-m", "benchmarks.perf.round_throughput",
                   "--cell", json.dumps(spec), "--result", str(result_path)]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        }
        try:
            process = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                                     timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"status": "timeout", "error": f"the cell ran longer than {timeout:g} s (--cell-timeout)",
                    "cell_seconds": time.perf_counter() - started}
        if result_path.exists():
            entry = json.loads(result_path.read_text())
        elif process.returncode < 0:
            signal = -process.returncode
            entry = {"status": "out_of_memory" if signal == 9 else "error",
                     "error": f"the cell's process was killed by signal {signal}"
                              + (" (SIGKILL: most likely the out-of-memory killer)" if signal == 9 else "")}
        else:
            entry = {"status": "error", "error": f"the cell's process exited with code {process.returncode}"}
        if entry["status"] != "ok":
            entry["stderr_tail"] = process.stderr[-ERROR_TAIL_CHARS:]
    entry["cell_seconds"] = time.perf_counter() - started
    busy_after = busy_cpu_seconds()
    if busy_before is not None and busy_after is not None:
        # CPU time of every other process while the cell ran, in cores: > ~0.2 means the
        # cell shared the machine and its timings are not clean
        others = (busy_after - busy_before) - (children_cpu_seconds() - ours_before)
        entry["other_processes_cores"] = round(max(0.0, others) / entry["cell_seconds"], 3)
    return entry


def predicted_skip(cell: dict, done: list[dict], cell_timeout: float) -> str | None:
    """Why ``cell`` should not run, judged from the same (model, engine, variant) at the
    largest smaller number of clients that ran: its seconds per round (and, on a CPU, its
    memory, for the stacked engines) scaled by the ratio of clients. ``None``: run it."""
    smaller = [c for c in done if c["status"] == "ok" and c["clients"] < cell["clients"]
               and (c["model"], c["engine"], c["variant"]) == (cell["model"], cell["engine"], cell["variant"])]
    if not smaller:
        failed = [c for c in done if c["status"] in ("timeout", "out_of_memory") and c["clients"] < cell["clients"]
                  and (c["model"], c["engine"], c["variant"]) == (cell["model"], cell["engine"], cell["variant"])]
        if failed:
            return f"the same cell at {failed[0]['clients']} clients ended with {failed[0]['status']}"
        return None
    base = max(smaller, key=lambda c: c["clients"])
    ratio = cell["clients"] / base["clients"]
    per_round = base["seconds_per_round"] * ratio
    timed = max(1, min(cell["rounds"], math.ceil(cell["max_timed_seconds"] / per_round)))
    estimate = (cell["warmup"] + timed) * per_round
    if estimate > cell_timeout:
        return (f"predicted {estimate:.0f} s ({per_round:.1f} s/round from {base['clients']} clients x {ratio:g}) "
                f"> --cell-timeout {cell_timeout:g} s")
    stacked = cell["engine"] == "vectorised" and "clients_per_chunk" not in cell["options"]
    available = available_memory_mib()
    if cell["device"] == "cpu" and stacked and available is not None:
        needed = base["peak_memory_mib"] * ratio
        if needed > 0.8 * available:
            return (f"predicted {needed:.0f} MiB of memory ({base['peak_memory_mib']:.0f} MiB at {base['clients']} "
                    f"clients x {ratio:g}) > 80% of the {available:.0f} MiB available")
    return None


def describe_cell(cell: dict) -> str:
    engine = cell["engine"] + (f"+{cell['variant']}" if cell["variant"] else "")
    return f"{cell['model']:15s} clients={cell['clients']:<4d} {engine:22s}"


def describe_entry(entry: dict) -> str:
    if entry["status"] != "ok":
        return f"{entry['status'].upper()}: {entry['error'].splitlines()[0][:160]}"
    text = (f"{entry['seconds_per_round']:8.3f} s/round {entry['client_samples_per_second']:10.0f} samples/s "
            f"peak {entry['peak_memory_mib']:8.0f} MiB")
    if entry.get("chunk_size") is not None and entry.get("engine_used") == "vectorised":
        text += f"  chunk {entry['chunk_size']}"
    return text


# ----------------------------------------------------------------------------- aggregation


def run_aggregation_process(args: argparse.Namespace) -> dict:
    """The aggregation section in one process (``benchmarks.perf.aggregation``); its
    per-algorithm lines are shown as they come."""
    size = args.aggregation_size
    started = time.perf_counter()
    busy_before, ours_before = busy_cpu_seconds(), children_cpu_seconds()
    with tempfile.TemporaryDirectory(prefix="perf_aggregation_") as folder:
        out = Path(folder) / "aggregation.json"
        command = [sys.executable, "-m", "benchmarks.perf.aggregation", "--clients", str(args.aggregation_clients),
                   "--sizes", size, "--repeats", str(args.aggregation_repeats), "--device", args.device,
                   "--out", str(out)]
        if args.algorithms:
            command += ["--algorithms", *args.algorithms]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        }
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        tail: list[str] = []
        assert process.stdout is not None
        for line in process.stdout:
            tail = (tail + [line])[-40:]
            if line.startswith("d="):  # the per-algorithm lines; warnings stay in the tail
                print(f"  aggregation  {line.rstrip()}", flush=True)
        process.wait()
        if not out.exists():
            return {"status": "error", "error": f"the aggregation process exited with code {process.returncode}",
                    "output_tail": "".join(tail)[-ERROR_TAIL_CHARS:]}
        report = json.loads(out.read_text())
    section = {"status": "ok", "settings": report["settings"], "results": report["results"]}
    busy_after, seconds = busy_cpu_seconds(), time.perf_counter() - started
    if busy_before is not None and busy_after is not None:
        others = (busy_after - busy_before) - (children_cpu_seconds() - ours_before)
        section["other_processes_cores"] = round(max(0.0, others) / seconds, 3)
    return section


# ----------------------------------------------------------------------------- report


def summary_table(cells: list[dict]) -> str:
    """model | clients | vectorised s/round | sequential s/round | ratio | peak MiB, then
    the variants of the vectorised engine."""

    def seconds(entry: dict | None) -> str:
        if entry is None:
            return "-"
        return f"{entry['seconds_per_round']:.3f}" if entry["status"] == "ok" else entry["status"]

    def peak(entry: dict | None) -> str:
        return f"{entry['peak_memory_mib']:.0f}" if entry and entry["status"] == "ok" else "-"

    lines = ["| model | clients | vectorised s/round | sequential s/round | sequential/vectorised "
             "| peak MiB vectorised | peak MiB sequential |", "|---|---:|---:|---:|---:|---:|---:|"]
    keys = list(dict.fromkeys((c["model"], c["clients"]) for c in cells))
    by_key = {(c["model"], c["clients"], c["engine"], c["variant"]): c for c in cells}
    for model, clients in keys:
        vec = by_key.get((model, clients, "vectorised", None))
        seq = by_key.get((model, clients, "sequential", None))
        ratio = "-"
        if vec and seq and vec["status"] == seq["status"] == "ok":
            ratio = f"{seq['seconds_per_round'] / vec['seconds_per_round']:.2f}"
        lines.append(f"| {model} | {clients} | {seconds(vec)} | {seconds(seq)} | {ratio} | {peak(vec)} | {peak(seq)} |")
    variants = [c for c in cells if c["variant"]]
    if variants:
        lines += ["", "| model | clients | vectorised variant | s/round | vs plain vectorised | chunk | peak MiB |",
                  "|---|---:|---|---:|---:|---:|---:|"]
        for cell in variants:
            plain = by_key.get((cell["model"], cell["clients"], "vectorised", None))
            speed = "-"
            if plain and plain["status"] == cell["status"] == "ok":
                speed = f"{plain['seconds_per_round'] / cell['seconds_per_round']:.2f}x"
            chunk = cell.get("chunk_size") if cell["status"] == "ok" else None
            lines.append(f"| {cell['model']} | {cell['clients']} | {cell['variant']} | {seconds(cell)} | {speed} "
                         f"| {chunk if chunk is not None else '-'} | {peak(cell)} |")
    return "\n".join(lines)


def aggregation_table(section: dict) -> str:
    """The aggregation section as Markdown tables, one per cell: milliseconds per server step of each
    algorithm (the first line of the error of one that failed); the section's error where it did not run."""
    if section.get("status") != "ok":
        return f"aggregation: {section.get('status')}: {section.get('error')}"
    lines = []
    for cell in section["results"]:
        lines.append(f"aggregation, m={cell['m']}, d={cell.get('num_parameters', cell['d'])}: "
                     "seconds per server step (aggregate + on_round_end)")
        lines += ["| algorithm | ms |", "|---|---:|"]
        lines += [f"| {name} | {value * 1000:.1f} |" for name, value in cell["seconds"].items()]
        lines += [f"| {name} | {error.splitlines()[0][:80]} |" for name, error in cell.get("errors", {}).items()]
    return "\n".join(lines)


def write_report(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))


# ----------------------------------------------------------------------------- entry point


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The suite's options, with the defaults that depend on ``--quick`` filled in
    (clients, variants, rounds, the aggregation's size and repeats) and the results
    file resolved; ``--device cuda`` without a visible CUDA device is refused."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.perf", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="10 clients per round only, 1 timed round, no variants, a smaller aggregation (d=0.2M)")
    parser.add_argument("--models", nargs="+", default=MODELS, help=f"timm names (default: {' '.join(MODELS)})")
    parser.add_argument("--clients", nargs="+", type=int, help="clients per round (default: 10 100; --quick: 10)")
    parser.add_argument("--engines", nargs="+", default=ENGINES, choices=ENGINES)
    parser.add_argument("--variants", nargs="*", choices=list(VARIANTS),
                        help="extra vectorised cells (default: all, --quick: none; `--variants` alone: none)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--rounds", type=int, help=f"timed rounds per cell (default {CELL_DEFAULTS['rounds']}; --quick: 1)"
    )
    parser.add_argument("--warmup", type=int, default=CELL_DEFAULTS["warmup"], help="untimed rounds first")
    parser.add_argument("--samples-per-client", type=int, default=CELL_DEFAULTS["samples_per_client"])
    parser.add_argument("--batch-size", type=int, default=CELL_DEFAULTS["batch_size"])
    parser.add_argument("--local-epochs", type=int, default=CELL_DEFAULTS["local_epochs"])
    parser.add_argument("--seed", type=int, default=CELL_DEFAULTS["seed"])
    parser.add_argument("--threads", type=int, help="torch.set_num_threads in every cell (default: PyTorch's)")
    parser.add_argument("--max-timed-seconds", type=float, default=CELL_DEFAULTS["max_timed_seconds"],
                        help="a cell stops timing rounds (after at least one) once they took this long")
    parser.add_argument("--cell-timeout", type=float, default=900.0,
                        help="seconds before a cell is stopped and recorded as timed out; a cell predicted "
                             "(from the same cell at fewer clients) to take longer is skipped")
    parser.add_argument("--sections", nargs="+", default=["throughput", "aggregation"],
                        choices=["throughput", "aggregation"])
    parser.add_argument("--algorithms", nargs="+", help="aggregation: algorithm names (default: all)")
    parser.add_argument("--aggregation-clients", type=int, default=100, help="aggregation: m")
    parser.add_argument(
        "--aggregation-size", choices=["0.2M", "0.8M"], help="aggregation: d (default 0.8M; --quick 0.2M)"
    )
    parser.add_argument(
        "--aggregation-repeats", type=int, help="aggregation: timed server steps (default 3; --quick 1)"
    )
    parser.add_argument("--out", help="results file (default benchmarks/perf/results/perf_<cpu|cuda>.json)")
    parser.add_argument("--in-process", action="store_true",
                        help="run the throughput cells in this process (no interpreter start per cell: for a "
                             "short GPU lease; peak memory is still reset per cell)")
    args = parser.parse_args(argv)
    args.clients = args.clients or ([10] if args.quick else CLIENTS)
    if args.variants is None:
        args.variants = [] if args.quick else list(VARIANTS)
    args.rounds = args.rounds or (1 if args.quick else CELL_DEFAULTS["rounds"])
    args.aggregation_size = args.aggregation_size or AGGREGATION_SIZES["quick" if args.quick else "full"]
    args.aggregation_repeats = args.aggregation_repeats or (1 if args.quick else 3)
    args.out = Path(args.out or REPO_ROOT / f"benchmarks/perf/results/perf_{args.device}.json")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is visible to PyTorch here; use --device cpu")
    return args


def main(argv: list[str] | None = None) -> int:
    """Runs the chosen sections (each throughput cell in its own process unless ``--in-process``; a
    cell predicted to time out is skipped), writes the report after every cell and at the end, and
    prints the summary tables, with a warning for timings taken on a busy machine; returns 0."""
    args = parse_args(argv)
    started = time.perf_counter()
    report: dict = {
        "benchmark": "perf",
        "machine": describe_machine(torch.device(args.device)),
        "settings": {
            "quick": args.quick,
            "device": args.device,
            "algorithm": "FedAvg, full participation of `clients` clients, engine as named",
            "data": "samples_per_client training samples per client: synthetic (fl_logreg), "
            "mnist5k (fl_mlp), seeded N(0,1) 3x32x32 images (CIFAR-shaped models)",
            "rounds_timed": args.rounds,
            "warmup_rounds": args.warmup,
            "max_timed_seconds": args.max_timed_seconds,
            "cell_timeout": args.cell_timeout,
            "samples_per_client": args.samples_per_client,
            "batch_size": args.batch_size,
            "local_epochs": args.local_epochs,
            "seed": args.seed,
            "threads": args.threads,
            "in_process": args.in_process,
            "seconds_per_round": "median over the timed rounds; a round = one Lightning epoch, "
            "wall clock (device synchronised)",
            "peak_memory": "cuda: torch.cuda.max_memory_allocated of the cell's process; cpu: peak RSS "
            "(ru_maxrss) of the cell's process minus its RSS after setup",
            "variants": {name: VARIANTS[name] for name in args.variants},
            "other_processes_cores": "average number of cores other processes of the machine kept busy "
            f"while the cell ran (/proc/stat); above {BUSY_CORES} its timings are not clean",
        },
        "throughput": [],
        "aggregation": None,
    }
    if "throughput" in args.sections:
        cells = plan_cells(args)
        where = "in this process" if args.in_process else "each in its own process"
        print(f"throughput: {len(cells)} cells on {args.device}, {where}; writing {args.out}", flush=True)
        for number, cell in enumerate(cells, 1):
            if cell.get("status") != "skipped":
                reason = predicted_skip(cell, report["throughput"], args.cell_timeout)
                if reason is not None:
                    cell |= {"status": "skipped", "error": reason}
                else:
                    cell |= run_cell_here(cell) if args.in_process else run_cell_process(cell, args.cell_timeout)
            print(f"[{number:2d}/{len(cells)}] {describe_cell(cell)} {describe_entry(cell)}"
                  + (f"  ({cell['cell_seconds']:.0f} s)" if "cell_seconds" in cell else ""), flush=True)
            report["throughput"].append(cell)
            write_report(args.out, report)  # partial results survive an interrupted suite
    if "aggregation" in args.sections:
        print(f"aggregation: m={args.aggregation_clients}, d={args.aggregation_size}", flush=True)
        report["aggregation"] = run_aggregation_process(args)
    report["wall_seconds"] = time.perf_counter() - started
    busy = [c for c in report["throughput"] if c.get("other_processes_cores", 0) > BUSY_CORES]
    report["cells_on_a_busy_machine"] = len(busy)
    aggregation_busy = (report["aggregation"] or {}).get("other_processes_cores", 0) > BUSY_CORES
    report["aggregation_on_a_busy_machine"] = aggregation_busy
    write_report(args.out, report)
    if report["throughput"]:
        print("\n" + summary_table(report["throughput"]))
    if report["aggregation"] is not None:
        print("\n" + aggregation_table(report["aggregation"]))
    if busy:
        print(f"\nWARNING: {len(busy)} cells shared the machine with other processes (up to "
              f"{max(c['other_processes_cores'] for c in busy):.1f} cores busy elsewhere): their timings are "
              "not clean; re-run when the machine is quiet")
    if aggregation_busy:
        print("\nWARNING: the aggregation section shared the machine with other processes: its timings are not clean")
    print(f"\nwrote {args.out} ({report['wall_seconds']:.0f} s)")
    return 0
