"""Two fits on one machine: each fit's time beside another, against its time alone.

Each trial times a fit alone, then two copies started together, each in its own process; a fit's
time is that of the fit in its process (parsing, the data, the rounds; not Python's start-up).
Two routes: the CLI (``fl_lightning.cli.lightning_cli.run``) and a Trainer script (a plain
``pl.Trainer`` fitting a ``FederatedModule``: the README's Python route). Two cases:

* ``logreg``: FedAvg on Synthetic(0.5, 0.5), 100 natural clients, every client every round,
  logistic regression, b = 10, 60 rounds (the case where two fits collapsed 170x);
* ``mlp``: the README's main job (FedAvg, 10 of 100 mnist5k clients, the MLP, 100 rounds).

Two thread settings of the run (``model.threads``): 1, the default, and every core this process
may use (what PyTorch takes by itself). The figure of merit is pair / alone, per trial; the
target is at most 1.5. The cost of the default is its time alone against every core's alone,
printed as ``1 thread / every core``. Results are appended to ``results/side_by_side_cpu.json``.

    python -m benchmarks.perf.side_by_side --trials 3
    python -m benchmarks.perf.side_by_side --trials 3 --routes trainer --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "side_by_side_cpu.json"
FIT_TIMEOUT_S = 600
# each case's settings once, for both routes: the model's and the data's
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "logreg": ({"backbone": "fl_logreg", "num_rounds": 60, "fraction": 1.0, "batch_size": 10, "lr": 0.01,
                "eval_every": 60, "local_epochs": 1},
               {"source": "synthetic", "partition": "natural", "num_clients": 100,
                "source_params": {"alpha": 0.5, "beta": 0.5, "num_clients": 100}}),
    "mlp": ({"backbone": "fl_mlp", "num_rounds": 100, "fraction": 0.1, "batch_size": 10, "lr": 0.05,
             "eval_every": 5, "local_epochs": 1},
            {"source": "mnist5k", "num_clients": 100, "partition": "dirichlet", "test_mode": "local",
             "local_test_fraction": 0.2}),
}


def _flag(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return str(value)


def cli_seconds(case: str, threads: int) -> float:
    """In this process: one fit of ``case`` through the CLI, timed after the imports."""
    from fl_lightning.cli.lightning_cli import run

    model, data = CASES[case]
    args = [
        "fit",
        "--model",
        "FedAvg",
        f"--model.threads={threads}",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        *[f"--model.{k}={_flag(v)}" for k, v in model.items()],
        *[f"--data.{k}={_flag(v)}" for k, v in data.items()],
    ]
    started = time.perf_counter()
    run(args)
    return time.perf_counter() - started


def trainer_seconds(case: str, threads: int) -> float:
    """In this process: one fit of ``case`` by a plain Trainer script, timed after the imports."""
    import lightning.pytorch as pl

    from fl_lightning.algorithms import FedAvg
    from fl_lightning.data.datamodule import FederatedDataModule

    model, data = CASES[case]
    started = time.perf_counter()
    datamodule = FederatedDataModule(**data, seed=0)
    datamodule.prepare_data()
    datamodule.setup("fit")
    module = FedAvg(**model, threads=threads, seed=0, num_classes=datamodule.num_classes,
                    input_shape=datamodule.input_shape)
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, max_epochs=model["num_rounds"])
    trainer.fit(module, datamodule=datamodule)
    return time.perf_counter() - started


ROUTES = {"cli": "cli_seconds", "trainer": "trainer_seconds"}


def start_fit(route: str, case: str, threads: int, folder: str) -> subprocess.Popen:
    code = (f"import warnings; warnings.simplefilter('ignore'); from benchmarks.perf.side_by_side import "
            f"{ROUTES[route]} as fit; print('SECONDS', fit({case!r}, {threads}))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                       os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    return subprocess.Popen([sys.executable, "-c", code], cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def seconds_of(process: subprocess.Popen) -> float:
    out, err = process.communicate(timeout=FIT_TIMEOUT_S)
    lines = [line for line in out.splitlines() if line.startswith("SECONDS ")]
    if process.returncode != 0 or not lines:
        raise SystemExit(f"a fit failed ({process.returncode}):\n{err[-2000:]}")
    return float(lines[-1].split()[1])


def trial(route: str, case: str, threads: int) -> dict:
    with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        alone = seconds_of(start_fit(route, case, threads, one))
        pair = [start_fit(route, case, threads, a), start_fit(route, case, threads, b)]
        together = [seconds_of(p) for p in pair]
    return {"alone_s": alone, "pair_s": together, "worst_ratio": max(together) / alone}


def main(argv: list[str] | None = None) -> int:
    """Times every case, route and thread setting alone and side by side over ``--trials`` trials, prints the
    pair / alone ratios (and 1 thread against every core), and appends the rows to ``--out``; returns 0."""
    from fl_lightning.records.machine import available_cores, cpu_model

    cores = available_cores()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--routes", nargs="+", default=list(ROUTES), choices=list(ROUTES))
    parser.add_argument("--threads", nargs="+", type=int, default=sorted({1, cores}),
                        help="model.threads settings to time (default: 1 and every core; every core side by "
                             "side can take minutes: such pairs collapse)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows = []
    for case in args.cases:
        for route in args.routes:
            alone_by_threads = {}
            for threads in args.threads:
                trials = [trial(route, case, threads) for _ in range(args.trials)]
                ratios = [t["worst_ratio"] for t in trials]
                alone = statistics.median(t["alone_s"] for t in trials)
                alone_by_threads[threads] = alone
                rows.append({"case": case, "route": route, "threads": threads, "trials": trials,
                             "median_alone_s": alone, "median_ratio": statistics.median(ratios),
                             "worst_ratio": max(ratios)})
                print(f"{case:6} {route:7} threads {threads}: alone {alone:6.2f} s   pair/alone: "
                      + "  ".join(f"{r:.2f}" for r in ratios) + f"   (worst {max(ratios):.2f})", flush=True)
            if 1 in alone_by_threads and cores in alone_by_threads and cores != 1:
                print(f"{case:6} {route:7} alone, 1 thread / every core: "
                      f"{alone_by_threads[1] / alone_by_threads[cores]:.2f}", flush=True)
    entry = {"machine": {"cpu": cpu_model(), "cores_available": cores}, "load_average_1min": os.getloadavg()[0],
             "rows": rows}
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {"measurements": []}
    previous["measurements"].append(entry)
    args.out.write_text(json.dumps(previous, indent=1))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
