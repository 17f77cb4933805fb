"""What a round of each algorithm costs on each offline model, for the dry run's estimates (issue 50).

``python -m benchmarks.perf.algorithm_costs [--models fl_mlp fl_logreg] [--out ...]`` takes, for every
(algorithm, model) pair that the offline suites run, the first such cell (its data, partition and
the algorithm's own settings), and fits it twice through the runner (``fl-benchmarks run``, one job,
one torch thread as at ``--jobs 2`` on two cores, a scratch store): ``SHORT`` and ``LONG`` rounds,
evaluating every ``EVAL_EVERY``.
A run's wall time is its store's (start to end, as the dry run's ``store`` source reads it), so

    per round = (t_long - t_short) / (LONG - SHORT)     (training, aggregation and the evaluations
                                                         at one every EVAL_EVERY rounds)
    start     = t_short - SHORT x per round              (clamped at 0)

The results file (``benchmarks/perf/results/algorithm_costs_cpu.json``) keeps, with each pair, the
client samples trained per round and the samples evaluated of its reference cell, by which
``benchmarks.plan`` scales the cost to another cell of the same pair. The models default to the two
that a whole pair list measures in a few minutes (the text CNN and the MNIST CNN run for minutes a
fit; their cells are in the published ledger). The machine should be idle: the figures are
wall times.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

from fl_lightning.records.store_uri import sqlite_uri

SHORT, LONG, EVAL_EVERY = 10, 30, 10
DEFAULT_MODELS = ("fl_mlp", "fl_logreg")
OUT = Path(__file__).resolve().parent / "results" / "algorithm_costs_cpu.json"


def reference_cells(models: tuple[str, ...]) -> dict[tuple[str, str], object]:
    """(algorithm class, model) -> the first offline suite cell that runs the pair."""
    from benchmarks.suites import list_suites, load_suite

    found: dict[tuple[str, str], object] = {}
    for name in list_suites():
        if not name.endswith("offline"):
            continue
        for cell in load_suite(name, [0]):
            model = cell.config["model"]
            key = (model["class_path"].rsplit(".", 1)[-1],
                   (model.get("init_args") or {}).get("backbone", "fl_mlp"))
            if key[1] in models and key not in found:
                found[key] = cell
    return found


def cost_suite(algorithm: str, cells: dict[str, object]) -> dict:
    """A suite of one algorithm: a warm-up fit, then per model its reference cell at SHORT and at LONG rounds."""
    benchmarks = []
    for model, cell in cells.items():
        config = json.loads(json.dumps(cell.config))
        class_path = config["model"].pop("class_path")
        config.pop("seed_everything", None)
        config.setdefault("trainer", {})["enable_checkpointing"] = False
        for rounds in (SHORT, LONG):
            config["model"]["init_args"].update(num_rounds=rounds, eval_every=EVAL_EVERY, threads=1)
            benchmarks.append({"name": f"{model}/r{rounds}", "config": json.loads(json.dumps(config))})
    # the worker's first fit pays its imports and warm-up (seconds): a short fit first, not read
    benchmarks.insert(0, dict(benchmarks[0], name="warm-up"))
    return {"suite": f"costs-{algorithm}", "paper": "perf", "scale": "offline", "seeds": [0],
            "description": "algorithm_costs", "base": {}, "benchmarks": benchmarks,
            "algorithms": [{"class_path": class_path}]}


def main(argv: list[str] | None = None) -> int:
    """Fits each (algorithm, model) pair's reference cell for ``SHORT`` and ``LONG`` rounds through the runner
    and writes every pair's seconds a round and start seconds (or its failure) to ``--out``; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    parser.add_argument("--algorithms", nargs="+", default=None, help="only these (class names)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)

    import torch

    from benchmarks.command_line import main as benchmarks_main
    from benchmarks.perf.machine import describe_machine
    from benchmarks.plan import run_durations, training_samples

    pairs = reference_cells(tuple(args.models))
    by_algorithm: dict[str, dict[str, object]] = {}
    for (algorithm, model), cell in sorted(pairs.items()):
        if args.algorithms is None or algorithm in args.algorithms:
            by_algorithm.setdefault(algorithm, {})[model] = cell
    scratch = Path(tempfile.mkdtemp(prefix="algorithm_costs_"))
    uri = sqlite_uri(scratch / "costs.db")
    rows, started, load_before = [], time.perf_counter(), os.getloadavg()[0]
    for algorithm, cells in by_algorithm.items():
        spec = cost_suite(algorithm, cells)
        path = scratch / f"{algorithm}.yaml"
        path.write_text(yaml.safe_dump(spec))
        print(f"{algorithm}: {', '.join(cells)}", flush=True)
        code = benchmarks_main(["run", str(path), "--tracking-uri", uri, "--jobs", "1"])
        times = run_durations(uri, spec["suite"])
        for model, cell in cells.items():
            short = times.get(f"{model}/r{SHORT}|{algorithm}")
            long = times.get(f"{model}/r{LONG}|{algorithm}")
            reference = cell.config
            row = {"algorithm": algorithm, "model": model, "reference_suite": cell.suite, "reference_cell": cell.cell,
                   "source": reference["data"].get("source"),
                   "train_samples_per_round": training_samples(reference)}
            if not short or not long:
                rows.append(row | {"status": f"failed (exit {code})"})
                continue
            per_round = max((long[0] - short[0]) / (LONG - SHORT), 0.0)
            rows.append(row | {"status": "ok", "seconds": {str(SHORT): short[0], str(LONG): long[0]},
                               "per_round_s": round(per_round, 5),
                               "start_s": round(max(short[0] - SHORT * per_round, 0.0), 3)})
            print(f"  {model}: {per_round * 1000:.1f} ms a round, start {rows[-1]['start_s']:.2f} s", flush=True)
    machine = describe_machine(torch.device("cpu"))
    command = "python -m benchmarks.perf.algorithm_costs " + " ".join(argv if argv is not None else sys.argv[1:])
    report = {"what": f"seconds a round (eval every {EVAL_EVERY}) and a run's start, per algorithm and model, "
                      f"from fits of {SHORT} and {LONG} rounds through the runner (--jobs 1)",
              "command": command,
              "date": datetime.date.today().isoformat(), "machine": machine, "eval_every": EVAL_EVERY,
              "wall_s": round(time.perf_counter() - started, 1),
              "load_1min": {"before": load_before, "after": os.getloadavg()[0]}, "costs": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out} ({sum(r['status'] == 'ok' for r in rows)} of {len(rows)} pairs) in "
          f"{report['wall_s']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
