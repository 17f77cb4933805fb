"""Wall time of the README's main job (``fl-lightning fit`` on its embedded default), from a
fresh folder each time, and where it goes.

Each repeat runs, in a new empty folder (a new MLflow store, no checkpoint):

* ``help``: ``fl-lightning --help`` (the light entry point);
* ``start_up``: ``fl-lightning fit --print_config`` (imports, LightningCLI parsing, no fit);
* ``fit``: ``fl-lightning fit`` (100 rounds of FedAvg, 10 of 100 mnist5k clients);
* ``rounds``: the fit's rounds alone, from its progress bar's average rate;
* ``rest``: ``fit - start_up - rounds``: data, the MLflow run, checkpoints, the end of the run.

The medians of the phases are appended to ``results/main_job_cpu.json`` under ``--label``.
``--source DIR`` times another checkout of the library (e.g. a ``git worktree`` of an older
commit) with the same interpreter, for before/after figures in one session.

    python -m benchmarks.perf.main_job --label after
    git worktree add /tmp/before <commit> && python -m benchmarks.perf.main_job --source /tmp/before --label before
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "main_job_cpu.json"
RATE = re.compile(r"(\d+)/(\d+) \[[^\]]*?([\d.]+)round/s")


def timed(args: list[str], folder: str, env: dict[str, str]) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "fl_lightning.cli", *args], cwd=folder, env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"fl-lightning {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return seconds, done.stdout + done.stderr


def rounds_seconds(output: str) -> float:
    """The rounds' time from the progress bar's last update: rounds / average rate."""
    found = RATE.findall(output)
    if not found:
        raise SystemExit("no progress bar in the fit's output: cannot time its rounds")
    done, _, rate = found[-1]
    return int(done) / float(rate)


def measure(repeats: int, source: str | None) -> dict:
    """Runs the help, start-up and fit phases ``repeats`` times, each in a fresh folder (``source``: a checkout
    put first on ``PYTHONPATH``); returns each phase's median seconds, with every repeat under ``"all"``."""
    env = {**os.environ}
    if source:
        env["PYTHONPATH"] = os.pathsep.join([source, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    phases: dict[str, list[float]] = {"help": [], "start_up": [], "fit": [], "rounds": [], "rest": []}
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as folder:
            phases["help"].append(timed(["--help"], folder, env)[0])
            phases["start_up"].append(timed(["fit", "--print_config"], folder, env)[0])
            fit, output = timed(["fit"], folder, env)
            phases["fit"].append(fit)
            phases["rounds"].append(rounds_seconds(output))
            phases["rest"].append(fit - phases["start_up"][-1] - phases["rounds"][-1])
    return {name: statistics.median(values) for name, values in phases.items()} | {"all": phases}


def main(argv: list[str] | None = None) -> int:
    """Times the main job's phases and appends their medians and every
    repeat, under ``--label``, to ``--out``; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--label", required=True, help="a name for this measurement (e.g. 'before', 'after')")
    parser.add_argument("--source", help="a checkout whose fl_lightning/ to time instead of the installed one")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    from fl_lightning.records.machine import cpu_model

    load_before = os.getloadavg()[0]
    result = measure(args.repeats, args.source)
    entry = {
        "label": args.label,
        "source": args.source or "installed",
        "machine": {"cpu": cpu_model(), "cpu_cores": os.cpu_count()},
        "repeats": args.repeats,
        "load_average_1min_before": load_before,
        "load_average_1min_after": os.getloadavg()[0],
        "median_seconds": {k: v for k, v in result.items() if k != "all"},
        "all_seconds": result["all"],
    }
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {"measurements": []}
    previous["measurements"].append(entry)
    args.out.write_text(json.dumps(previous, indent=1))
    print(f"{args.label}: " + ", ".join(f"{k} {v:.2f} s" for k, v in entry["median_seconds"].items()))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
