"""The ledger's long rows, timed at the confirmatory pass's cadence: what the whole pass costs.

Each row is one (suite, benchmark, algorithm configuration) that dominates its suite's time
(``fl-benchmarks ledger --confirmatory --dry-run`` lists the suites' estimates). A row runs one
seed of its cell as a ``--jobs 2`` worker runs it on a 2-core machine (``OMP_NUM_THREADS=1``,
so ``threads: auto`` is 1; the fit through the CLI in this process, logging to a scratch
store), shortened to two of the pass's evaluation periods: ``num_rounds = 2 x eval_every`` of
``benchmarks/ledger_confirmatory.yaml``, so it evaluates twice (the pass's share of evaluation
rounds, one in ten). The row's projected run time is its seconds x num_rounds / (2 x
eval_every), start-up included (an over-estimate by a few seconds).

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
]


def confirmatory_length(suite: str, benchmark: str) -> dict[str, int]:
    import yaml

    lengths = yaml.safe_load(Path("benchmarks/ledger_confirmatory.yaml").read_text())["lengths"]
    return dict(lengths[suite][benchmark])


def time_row(suite_file: str, benchmark: str | None, config: str | None, scratch: Path) -> dict:
    from benchmarks.launchers import _fit_in_this_process
    from benchmarks.runner import _cell_config_file
    from benchmarks.suites import deep_merge, load_suite
    from fl_lightning.store_uri import sqlite_uri

    cells = load_suite(suite_file)
    cell = next(c for c in cells if (benchmark is None or c.benchmark == benchmark)
                and (config is None or c.algorithm_config == config))
    length = confirmatory_length(cell.suite, cell.benchmark)
    every = length["eval_every"]
    cell.config = deep_merge(cell.config, {"model": {"init_args": {"num_rounds": 2 * every, "eval_every": every}}})
    uri = sqlite_uri(scratch / "rows.db")
    path = _cell_config_file(cell, uri)
    started = time.perf_counter()
    code = _fit_in_this_process(path, str(scratch / "row.log"))
    seconds = time.perf_counter() - started
    projected = seconds * length["num_rounds"] / (2 * every)
    return {"suite": cell.suite, "benchmark": cell.benchmark, "algorithm_config": cell.algorithm_config,
            "seed": cell.seed, "rounds_timed": 2 * every, "confirmatory_rounds": length["num_rounds"],
            "eval_every": every, "exit_code": code, "seconds": seconds, "projected_run_seconds": projected}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default=None)
    parser.add_argument("--rows", type=int, nargs="+", help="row numbers of ROWS (default: every row)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = "1"  # a --jobs 2 worker's share on 2 cores: threads auto = 1
    from benchmarks.perf.machine import describe_machine

    import torch

    torch.set_num_threads(1)
    chosen = [ROWS[i] for i in args.rows] if args.rows else ROWS
    results = []
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        for row in chosen:
            result = time_row(*row, Path(folder))
            results.append(result)
            print(f"{result['suite']} {result['benchmark']} {result['algorithm_config']}: "
                  f"{result['seconds']:.1f} s for {result['rounds_timed']} rounds -> "
                  f"{result['projected_run_seconds']:.0f} s a run of {result['confirmatory_rounds']} "
                  f"(exit {result['exit_code']})", flush=True)
    entry = {"label": args.label, "library": str(Path.cwd()), "machine": describe_machine(torch.device("cpu")),
             "load_average_1min_before": load_before, "load_average_1min_after": os.getloadavg()[0],
             "rows": results}
    existing = json.loads(args.out.read_text()) if args.out.exists() else {"benchmark": "ledger_rows",
                                                                           "measurements": []}
    existing["measurements"].append(entry)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    partial = args.out.with_suffix(".json.partial")
    partial.write_text(json.dumps(existing, indent=2))
    partial.replace(args.out)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
