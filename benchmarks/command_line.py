"""The runner's command line: ``fl-benchmarks`` / ``python -m benchmarks`` (``run`` a suite,
``list`` the suites with their sizes and estimated times, run the claims ``ledger`` in parts)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from pathlib import Path

from benchmarks.launchers import SUBMITIT_MISSING
from benchmarks.ledger import DEFAULT_CONFIRMATORY_EXPORTS, DEFAULT_EXPORTS, ROOT_VARIABLE, run_ledger
from benchmarks.plan import estimate_suite
from benchmarks.runner import run_suite
from benchmarks.suites import list_suites, load_suite, program_name
from fl_lightning.records.errors import OneLineParser
from fl_lightning.records.vocabulary import DEFAULT_TRACKING_URI

LIST_WIDTH = 100
"""``list`` prints no line wider than this."""


def first_sentence(text: str) -> str:
    """The first sentence of a suite's description (up to a full stop before a capital)."""
    return re.split(r"(?<=\.)\s+(?=[A-Z])", " ".join(text.split()), maxsplit=1)[0]


def suite_table(prog: str, width: int = LIST_WIDTH) -> list[str]:
    """``list``: one line per suite (name, runs, estimated time at --jobs 1, the first sentence of
    its description cut to fit ``width``), then what the numbers are."""
    from benchmarks.plan import _duration

    rows, partial = [], False
    for name in list_suites():
        cells = load_suite(name)
        seconds, unknown = estimate_suite(cells)
        partial |= unknown > 0
        time_text = "?" if unknown == len(cells) else _duration(seconds) + ("+" if unknown else "")
        description = first_sentence(cells[0].description) if cells else ""
        rows.append((name, f"{len(cells):,}", time_text, description))
    header = ("suite", "runs", "time", "description")
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]

    def line(name: str, runs: str, time_text: str, description: str) -> str:
        start = f"{name:<{widths[0]}}  {runs:>{widths[1]}}  {time_text:>{widths[2]}}  "
        room = max(width - len(start), 0)
        if len(description) > room:
            description = description[:max(room - 1, 0)].rstrip() + "…"
        return (start + description).rstrip()

    lines = [line(*header)] + [line(*row) for row in rows]
    notes = ["runs: cells x seeds. time: estimated for --jobs 1 (about time / N with --jobs N) from the",
             "published ledger's run times (leaderboard_site/runs.csv) where it ran the cell, else from its",
             "runs of the same algorithm, model and data, else from the measured cost table of algorithms",
             "and models (in benchmarks/perf/results), else from the benchmark's other configurations'",
             "runs, else from the CPU throughput figures; a GPU is faster for the large models."]
    if partial:
        notes.append("+: at least this (some runs' models have no throughput figure); ?: no estimate.")
    notes += [f"`{prog} run SUITE --dry-run --jobs N` also counts the runs finished in your store",
              "and lists the data files a suite still needs."]
    return lines + [""] + notes


def main(argv: list[str] | None = None) -> int:
    """``fl-benchmarks`` on ``argv`` (default: the command line): ``run``, ``list`` or ``ledger``; its exit status."""
    prog = program_name()
    parser, run, ledger = _parser(prog)
    args = parser.parse_args(argv)
    if args.command == "ledger":
        return _ledger_command(args, ledger)
    if args.command == "list":
        return _list_command(prog)
    _check_run_options(args, run)
    return run_suite(args.suite, seeds=args.seeds, jobs=args.jobs, tracking_uri=args.tracking_uri,
                     dry_run=args.dry_run, isolate=args.isolate, cluster=args.cluster, job_folder=args.job_folder,
                     slurm_partition=args.slurm_partition, timeout_min=args.timeout_min,
                     cpus_per_job=args.cpus_per_job, benchmarks=args.benchmarks, configs=args.configs,
                     confirmatory=args.confirmatory)


def _parser(prog: str) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, argparse.ArgumentParser]:
    """The command line's parser, with its ``run`` and ``ledger`` parsers (which say their own refusals)."""
    environment_uri = os.environ.get("MLFLOW_TRACKING_URI")
    parser = OneLineParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run benchmark suites (benchmarks/<paper>/<scale>.yaml): grids of `fl-lightning fit`\n"
                    "runs over benchmarks, algorithm configurations and seeds, logged to an MLflow store,\n"
                    "resumable. Build the leaderboard from the store with `fl-leaderboard build`.",
        epilog=f"`{prog} list` shows the suites; `{prog} run --help` the options of a run.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    run = sub.add_parser("run", help="run a suite (resumable)",
                         description="Run every (benchmark, algorithm configuration, seed) of a suite that the "
                                     "store holds no finished run of.")
    _add_run_options(run, prog, environment_uri)
    sub.add_parser("list", help="list the suites: runs, estimated time, description",
                   description="One line per suite: its name, its runs (cells x seeds), their estimated time at "
                               "--jobs 1 and the first sentence of its description.")
    ledger = sub.add_parser(
        "ledger", help="run the offline claims ledger's suites, exporting each finished one (resumable)",
        description="Run every offline suite the claims read, one after the other; when a suite has finished "
                    "every run, write its complete export to EXPORTS/<suite> and skip it from then on, so that "
                    "the ledger can run in parts, on machines replaced between them.")
    _add_ledger_options(ledger, environment_uri)
    return parser, run, ledger


def _add_run_options(run: argparse.ArgumentParser, prog: str, environment_uri: str | None) -> None:
    """Adds ``run``'s suite and options."""
    run.add_argument("suite", help=f"a suite name (`{prog} list` shows them with their sizes and estimated "
                                   "times, e.g. quickstart/offline) or a path to a suite YAML")
    run.add_argument("--seeds", type=int, nargs="+", help="override the suite's seeds (default: the suite's own)")
    run.add_argument("--jobs", type=int, default=1,
                     help="runs in parallel, each in its own worker process (default: %(default)s)")
    run.add_argument("--benchmarks", nargs="+", metavar="NAME",
                     help="run only these benchmarks of the suite (default: all)")
    run.add_argument("--configs", nargs="+", metavar="LABEL",
                     help="run only these algorithm configurations, by label, e.g. 'FedFV(alpha=0.1,tau=1)' "
                          "(default: all)")
    run.add_argument("--tracking-uri", default=environment_uri or DEFAULT_TRACKING_URI,
                     help="the MLflow store the runs log to: a SQLite file (sqlite:///path.db, relative to the "
                          "working folder), a folder (file://...) or a tracking server (http://...) "
                          f"(default: $MLFLOW_TRACKING_URI, else {DEFAULT_TRACKING_URI}"
                          + (f"; here: {environment_uri}" if environment_uri else "") + ")")
    run.add_argument("--dry-run", action="store_true",
                     help="list the runs that would run, the data files they lack and an estimate of their time "
                          "(reads the store; never creates or alters it)")
    _add_placement_options(run)
    run.add_argument("--confirmatory", action="store_true",
                     help="the claims ledger's confirmatory pass: refused unless the registered files (plan, "
                          "amendments, ledger_confirmatory.yaml, claims, suites) match the plan's registered_hash; "
                          "runs the pass's fresh seeds at the rounds and cadence of ledger_confirmatory.yaml, each "
                          f"run tagged ledger_pass and ledger_plan_hash (the files' folder: ${ROOT_VARIABLE}, "
                          "default benchmarks/)")


def _add_placement_options(run: argparse.ArgumentParser) -> None:
    """Adds ``run``'s options of where the cells run: --isolate, or --cluster and its jobs' settings."""
    run.add_argument("--isolate", action="store_true",
                     help="run every cell in a fresh process (slower: start-up and data loading paid per cell) "
                          "instead of in --jobs reused worker processes (default: reused workers)")
    run.add_argument("--cluster", choices=["slurm", "local"],
                     help="submit every cell as a job through submitit (slurm: a SLURM cluster; local: "
                          "submitit's local executor on this machine), --jobs of them in flight "
                          "(default: none, the cells run here)")
    run.add_argument("--job-folder", help="submitit's folder for job files and outputs (default "
                                          "benchmark_jobs/<suite>; on a SLURM cluster a folder every node sees)")
    run.add_argument("--slurm-partition",
                     help="the SLURM partition to submit to (--cluster slurm; default: the cluster's default)")
    run.add_argument("--timeout-min", type=int, default=24 * 60,
                     help="a job's time limit in minutes (--cluster; default: %(default)s, one day)")
    run.add_argument("--cpus-per-job", type=int, help="cores of a job, and its OpenMP/MKL threads (--cluster; "
                                                      "default: this machine's cores / --jobs); a run's torch "
                                                      "threads are its model.threads (by default auto: "
                                                      "these cores)")


def _add_ledger_options(ledger: argparse.ArgumentParser, environment_uri: str | None) -> None:
    """Adds ``ledger``'s options."""
    ledger.add_argument("--exports", type=Path, metavar="EXPORTS",
                        help=f"the folder of the suites' exports (default: {DEFAULT_EXPORTS}/ in the working folder; "
                             f"{DEFAULT_CONFIRMATORY_EXPORTS}/ with --confirmatory)")
    ledger.add_argument("--jobs", type=int, default=1,
                        help="runs in parallel, each in its own worker process (default: %(default)s)")
    ledger.add_argument("--dry-run", action="store_true",
                        help="list the suites left and their estimated time (creates nothing)")
    ledger.add_argument("--confirmatory", action="store_true",
                        help="run the confirmatory pass (as `run --confirmatory`), exporting to "
                             f"{DEFAULT_CONFIRMATORY_EXPORTS}/ unless --exports says otherwise; use a store of its own")
    ledger.add_argument("--tracking-uri", default=environment_uri or DEFAULT_TRACKING_URI,
                        help=f"the MLflow store the runs log to (default: $MLFLOW_TRACKING_URI, else "
                             f"{DEFAULT_TRACKING_URI})")


def _ledger_command(args: argparse.Namespace, ledger: argparse.ArgumentParser) -> int:
    """``ledger``: its options checked, then the ledger's suites run; the exit status."""
    if args.jobs < 1:
        ledger.error("--jobs must be >= 1")
    if args.exports is None:
        args.exports = Path(DEFAULT_CONFIRMATORY_EXPORTS if args.confirmatory else DEFAULT_EXPORTS)
    if args.exports.exists() and not args.exports.is_dir():
        ledger.error(f"--exports {args.exports} is a file: give a folder")
    return run_ledger(args.tracking_uri, args.exports, args.jobs, dry_run=args.dry_run,
                      confirmatory=args.confirmatory)


def _list_command(prog: str) -> int:
    """``list``: prints the table of suites; 0."""
    try:
        print("\n".join(suite_table(prog)), flush=True)
    except BrokenPipeError:  # `... list | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _check_run_options(args: argparse.Namespace, run: argparse.ArgumentParser) -> None:
    """Refuses ``run``'s options that do not go together, before the store is touched."""
    if args.jobs < 1:
        run.error("--jobs must be >= 1")
    if args.cluster is not None and args.isolate:
        run.error("--isolate and --cluster both choose where cells run: give one")
    if args.timeout_min < 1:
        run.error("--timeout-min must be >= 1")
    if args.cpus_per_job is not None and args.cpus_per_job < 1:
        run.error("--cpus-per-job must be >= 1")
    if args.cluster is None and (args.job_folder or args.slurm_partition or args.cpus_per_job):
        run.error("--job-folder, --slurm-partition and --cpus-per-job go with --cluster")
    if args.cluster is not None and importlib.util.find_spec("submitit") is None:  # before the store is touched
        run.error(SUBMITIT_MISSING)
    if args.confirmatory and args.seeds is not None:
        run.error("--seeds and --confirmatory: the confirmatory pass runs the seeds registered in "
                  "ledger_confirmatory.yaml")


def cli() -> int:
    """The ``fl-benchmarks`` / ``python -m benchmarks`` entry point: :func:`main`, with a refusal
    (a ``SystemExit`` carrying a message: an unknown suite, an unreadable store, ...) said in one
    ``error:`` line with exit status 2, as the other tools do."""
    try:
        return main()
    except SystemExit as stop:
        if isinstance(stop.code, str):
            print(f"error: {stop.code}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(cli())
