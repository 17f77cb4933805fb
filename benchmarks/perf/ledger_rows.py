"""The ledger's long rows, timed at the confirmatory pass's cadence: what the whole pass costs.

Each row is one (suite, benchmark, algorithm configuration) that dominates its suite's time
(``fl-benchmarks ledger --confirmatory --dry-run`` lists the suites' estimates). A row runs one
seed of its cell as a ``--jobs 2`` worker runs it on a 2-core machine (``OMP_NUM_THREADS=1``,
so ``threads: auto`` is 1; the fit through the CLI in this process, logging to a scratch
store), twice: for one and for two of the pass's evaluation periods (``eval_every`` rounds of
``benchmarks/ledger_confirmatory.yaml``, the last round evaluating). The difference is one
period's cost (its rounds and one evaluation), so the projected run time of R rounds is the
two-period fit's seconds (start-up counted once) + (R / eval_every - 2) periods.

Run it from a worktree of an older commit for the "before" (``-m`` puts the working folder
first on ``sys.path``); entries are appended, under ``--label``, to
``results/ledger_rows_cpu.json``:

    python -m benchmarks.perf.ledger_rows --label after
    cd /tmp/before && python -m benchmarks.perf.ledger_rows --label before --out <this results file>
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "ledger_rows_cpu.json"
# (suite file, benchmark, algorithm configuration): the largest rows of the pass's estimate
ROWS = [
    ("cgsv/ablations_offline", "mnist5k/cla/full/fl_cnn_mnist/shared-test", "CGSV(beta=1.5)"),
    ("cgsv/ablations_offline", "mnist5k/cla/full/fl_cnn_mnist/shared-test", "FedAvg"),
    ("cgsv/text_offline", "pydoc_sentences/pow-5/full/fl_text_cnn", "ECI"),
    ("cgsv/text_offline", "pydoc_sentences/pow-5/full/fl_text_cnn", "CGSV(beta=1.0)"),
    ("cgsv/offline", "mnist5k/uni/full/fl_mlp", "CGSV(beta=1.0)"),
    ("fedlf/offline", "mnist5k/pat-1/p0.1/fl_mlp", "FedLF"),
    ("robustness/offline", "synthetic/natural/p0.2/fl_logreg/dropout-0.2", "FedLF"),
    ("fedmgda_plus/natural_offline", None, None),  # its first cell: the suite's typical row
    ("fedmgda_plus/ablations_offline", None, None),
    ("fedmgda_plus/bias_ablations_offline", None, None),
    ("fedmgda_plus/offline", None, None),
    ("fedfv/offline", None, None),
    ("fedfv/order_ablations_offline", None, None),
]


def confirmatory_length(suite: str, benchmark: str) -> dict[str, int]:
    import yaml

    lengths = yaml.safe_load(Path("benchmarks/ledger_confirmatory.yaml").read_text())["lengths"]
    return dict(lengths[suite][benchmark])


def time_row(suite_file: str, benchmark: str | None, config: str | None, scratch: Path) -> dict:
    """Times a row's cell (the first of ``suite_file`` matching ``benchmark`` and
    ``config``; None matches any) for one and two of the confirmatory pass's evaluation
    periods in this process, and projects its confirmatory run time from the difference."""
    from benchmarks.launchers import _fit_in_this_process
    from benchmarks.runner import _cell_config_file
    from benchmarks.suites import deep_merge, load_suite
    from fl_lightning.records.store_uri import sqlite_uri

    cells = load_suite(suite_file)
    cell = next(c for c in cells if (benchmark is None or c.benchmark == benchmark)
                and (config is None or c.algorithm_config == config))
    length = confirmatory_length(cell.suite, cell.benchmark)
    every, rounds = length["eval_every"], length["num_rounds"]
    seconds = {}
    for periods in (1, 2):  # one evaluation period, then two: their difference is one period's cost
        shortened = replace(cell, config=deep_merge(cell.config, {"model": {"init_args": {
            "num_rounds": periods * every, "eval_every": every}}}))
        path = _cell_config_file(shortened, sqlite_uri(scratch / f"rows{periods}.db"))
        started = time.perf_counter()
        code = _fit_in_this_process(path, str(scratch / "row.log"))
        seconds[periods] = time.perf_counter() - started
        if code:
            break
    period = max(seconds.get(2, 0.0) - seconds[1], 0.0)
    projected = seconds.get(2, seconds[1]) + (rounds / every - 2) * period
    return {"suite": cell.suite, "benchmark": cell.benchmark, "algorithm_config": cell.algorithm_config,
            "seed": cell.seed, "confirmatory_rounds": rounds, "eval_every": every, "exit_code": code,
            "seconds_one_period": seconds[1], "seconds_two_periods": seconds.get(2),
            "seconds_per_period": period, "projected_run_seconds": projected}


SIDE_BY_SIDE = 1.3  # two 1-thread fits on 2 cores, each against alone (docs: performance-and-threads, <= 1.29)


def estimate(label: str, exports: Path = Path("evidence/exploratory"), jobs: int = 2) -> list[dict]:
    """The confirmatory pass's wall time from the measurement ``label`` (every entry of that label)
    and the published ledger's exports: each published cell's median run time, rescaled to the
    pass's rounds, times its suite's factor (the measured rows' projected seconds over the same
    rows' published ones; the median factor of all measured suites where a suite has none), times
    the pass's 10 seeds, over ``jobs`` parallel fits slowed by ``SIDE_BY_SIDE``."""
    import statistics

    import pandas as pd
    import yaml

    confirmatory = yaml.safe_load(Path("benchmarks/ledger_confirmatory.yaml").read_text())
    lengths, seeds = confirmatory["lengths"], len(confirmatory["seeds"]["values"])
    measured = [row for entry in json.loads(RESULTS.read_text())["measurements"] if entry["label"] == label
                for row in entry["rows"]]

    def published(suite: str) -> pd.DataFrame:
        runs = pd.read_parquet(exports / suite / "runs.parquet")
        runs["seconds"] = (pd.to_datetime(runs.end_time) - pd.to_datetime(runs.start_time)).dt.total_seconds()
        cells = runs.groupby(["benchmark", "algorithm_config"]).agg(seconds=("seconds", "median"),
                                                                     rounds=("rounds_planned", "median"))
        cells["rescaled"] = [row.seconds * lengths[suite][benchmark]["num_rounds"] / row.rounds
                             for (benchmark, _), row in cells.iterrows()]
        return cells

    factors: dict[str, float] = {}
    for suite in {row["suite"] for row in measured}:
        cells = published(suite)
        rows = [row for row in measured if row["suite"] == suite]
        before = sum(cells.loc[(row["benchmark"], row["algorithm_config"]), "rescaled"] for row in rows)
        factors[suite] = sum(row["projected_run_seconds"] for row in rows) / before
    default = statistics.median(factors.values())
    from benchmarks.ledger import ledger_suites

    out = []
    for suite in sorted(experiment for _, experiment in ledger_suites()):
        cells = published(suite)
        factor = factors.get(suite, default)
        run_seconds = float(cells.rescaled.sum()) * factor * seeds
        out.append({"suite": suite, "factor": factor, "measured": suite in factors, "cells": len(cells),
                    "wall_hours": run_seconds * SIDE_BY_SIDE / jobs / 3600})
    return out


def main(argv: list[str] | None = None) -> int:
    """Times the ``--rows`` of ``ROWS`` (every row by default) at one torch thread and
    appends them under ``--label`` to ``--out``; ``--estimate LABEL`` instead prints the
    confirmatory pass's estimated wall time from that label's measurements. Returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default=None)
    parser.add_argument("--rows", type=int, nargs="+", help="row numbers of ROWS (default: every row)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--estimate", metavar="LABEL",
                        help="print the confirmatory pass's estimated wall time from the measurements of LABEL "
                             "(runs nothing)")
    args = parser.parse_args(argv)
    if args.estimate:
        suites = estimate(args.estimate)
        for suite in suites:
            print(f"  {suite['suite']:40s} {suite['cells']:3d} cells  x{suite['factor']:.2f}"
                  f"{'' if suite['measured'] else ' (median factor)'}  {suite['wall_hours'] * 60:6.1f} min")
        print(f"the confirmatory pass: about {sum(s['wall_hours'] for s in suites):.1f} h at --jobs 2 "
              f"(x{SIDE_BY_SIDE} for two fits side by side)")
        return 0
    os.environ["OMP_NUM_THREADS"] = "1"  # a --jobs 2 worker's share on 2 cores: threads auto = 1
    import torch

    from benchmarks.perf.machine import append_measurement, describe_machine

    torch.set_num_threads(1)
    chosen = [ROWS[i] for i in args.rows] if args.rows else ROWS
    results = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        for row in chosen:
            result = time_row(*row, Path(folder))
            results.append(result)
            print(f"{result['suite']} {result['benchmark']} {result['algorithm_config']}: "
                  f"{result['seconds_per_period']:.2f} s per {result['eval_every']} rounds -> "
                  f"{result['projected_run_seconds']:.0f} s a run of {result['confirmatory_rounds']} "
                  f"(exit {result['exit_code']})", flush=True)
    entry = {"label": args.label, "library": str(Path.cwd()), "machine": describe_machine(torch.device("cpu")),
             "load_average_1min_before": load_before, "load_average_1min_after": os.getloadavg()[0],
             "rows": results}
    append_measurement(args.out, "ledger_rows", entry)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
