"""Two fits on one machine: each fit's time beside another, against its time alone.

Each trial times a fit alone, then two copies started together, each in its own process; a fit's
time is that of ``fl_lightning.lightning_cli.run`` in its process (parsing, the data, the rounds;
not Python's start-up). Two cases:

* ``logreg``: FedAvg on Synthetic(0.5, 0.5), 100 natural clients, every client every round,
  logistic regression, b = 10, 60 rounds (the case where two fits collapsed 170x);
* ``mlp``: the README's main job (FedAvg, 10 of 100 mnist5k clients, the MLP, 100 rounds).

and two thread settings, run in the same session: ``--threads N`` with N = every core this
process may use (what PyTorch takes by default: the behaviour before the thread share) and
``--threads auto`` (the share). The figure of merit is pair / alone, per trial; the target is
at most 1.5 in every trial. With ``auto``, each trial also times the fit alone on half the cores
(its share beside another): a fit that gains from every core alone cannot do better beside
another than that ratio, the floor, which is printed beside. Results are appended to ``results/side_by_side_cpu.json``.

    python -m benchmarks.perf.side_by_side --trials 3
    python -m benchmarks.perf.side_by_side --trials 5 --settings auto   # the share only
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

RESULTS = Path(__file__).resolve().parent / "results" / "side_by_side_cpu.json"
QUIET = ["--trainer.logger", "false", "--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false"]
CASES: dict[str, list[str]] = {
    "logreg": ["--model", "FedAvg", "--model.backbone", "fl_logreg", "--model.num_rounds", "60",
               "--model.fraction", "1.0", "--model.batch_size", "10", "--model.lr", "0.01", "--model.eval_every", "60",
               "--data.source", "synthetic", "--data.partition", "natural", "--data.num_clients", "100",
               "--data.source_params", "{alpha: 0.5, beta: 0.5, num_clients: 100}"],
    "mlp": [],
}
FIT_TIMEOUT_S = 600


def fit_seconds(case: str, threads: str) -> float:
    """In this process: one fit of ``case``, timed around the CLI (after the imports)."""
    from fl_lightning.lightning_cli import run

    started = time.perf_counter()
    run(["fit", *CASES[case], "--threads", threads, *QUIET])
    return time.perf_counter() - started


def start_fit(case: str, threads: str, folder: str) -> subprocess.Popen:
    code = f"from benchmarks.perf.side_by_side import fit_seconds; print('SECONDS', fit_seconds({case!r}, {threads!r}))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                       os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    env.pop("FL_LIGHTNING_THREADS", None)
    return subprocess.Popen([sys.executable, "-c", code], cwd=folder, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def seconds_of(process: subprocess.Popen) -> float:
    out, err = process.communicate(timeout=FIT_TIMEOUT_S)
    lines = [line for line in out.splitlines() if line.startswith("SECONDS ")]
    if process.returncode != 0 or not lines:
        raise SystemExit(f"a fit failed ({process.returncode}):\n{err[-2000:]}")
    return float(lines[-1].split()[1])


def trial(case: str, threads: str, half: int | None = None) -> dict:
    """``half``: also time the fit alone on half the cores (its share beside another fit): the
    ratio no thread setting can beat when the fit alone gains from every core."""
    with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        alone = seconds_of(start_fit(case, threads, one))
        pair = [start_fit(case, threads, a), start_fit(case, threads, b)]
        together = [seconds_of(p) for p in pair]
        row = {"alone_s": alone, "pair_s": together, "worst_ratio": max(together) / alone}
        if half is not None:
            row["alone_half_cores_s"] = seconds_of(start_fit(case, str(half), one))
            row["floor_ratio"] = row["alone_half_cores_s"] / alone
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--settings", nargs="+", default=["every-core", "auto"], choices=["every-core", "auto"],
                        help="thread settings to time (every-core pairs can take minutes: they collapse)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    from fl_lightning.machine import cpu_model
    from fl_lightning.threads import available_cores

    cores = available_cores()
    settings = {name: threads for key, name, threads in
                [("every-core", "every core (before)", str(cores)), ("auto", "auto (the share)", "auto")]
                if key in args.settings}
    rows = []
    for case in args.cases:
        for name, threads in settings.items():
            half = max(1, cores // 2) if threads == "auto" else None
            trials = [trial(case, threads, half) for _ in range(args.trials)]
            ratios = [t["worst_ratio"] for t in trials]
            rows.append({"case": case, "threads": name, "trials": trials,
                         "median_alone_s": statistics.median(t["alone_s"] for t in trials),
                         "median_ratio": statistics.median(ratios), "worst_ratio": max(ratios)})
            floors = "" if half is None else ("   floor (alone on half the cores / alone): "
                                              + "  ".join(f"{t['floor_ratio']:.2f}" for t in trials))
            print(f"{case:6} {name:20} alone {rows[-1]['median_alone_s']:6.2f} s   pair/alone: "
                  + "  ".join(f"{r:.2f}" for r in ratios) + f"   (worst {max(ratios):.2f}){floors}", flush=True)
    entry = {"machine": {"cpu": cpu_model(), "cores_available": cores}, "load_average_1min": os.getloadavg()[0],
             "rows": rows}
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {"measurements": []}
    previous["measurements"].append(entry)
    args.out.write_text(json.dumps(previous, indent=1))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
