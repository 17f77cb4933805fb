"""``python -m leaderboard build [--tracking-uri URI | --from-export DIR ...] [--out DIR | --publish]
[--experiments NAME ...]``; ``python -m leaderboard publish [--out DIR]`` (the published site
``leaderboard_site/`` from the committed exports in ``evidence/``: one command, byte for byte the same
build each time); ``python -m leaderboard register [--root DIR] [--again | --check]`` (the
claims ledger's registration hash, recorded in its plan: ``leaderboard/registration.py``);
``python -m leaderboard export --out DIR [--tracking-uri URI] [--experiments NAME ...] [--tag KEY=VALUE ...]
[--format csv parquet] [--all-metrics] [--complete]`` (the run set as tidy tables: ``leaderboard/export.py``).

A build writes ``leaderboard_build/`` in the working directory (git-ignored) unless told where:
``--out DIR``, or ``--publish`` for the repository's published site ``leaderboard_site/``.
It only reads the store: a missing or empty SQLite file is reported, never created or migrated.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before anything imports pyplot: no display needed, PNG only

from fl_lightning.records.errors import OneLineParser  # noqa: E402
from fl_lightning.records.vocabulary import DEFAULT_TRACKING_URI  # noqa: E402
from leaderboard import export, site  # noqa: E402
from leaderboard.papers import DEFAULT_ROOT  # noqa: E402
from leaderboard.runs import LeaderboardError  # noqa: E402


def parser() -> argparse.ArgumentParser:
    """The command line's parser: the ``build``, ``publish``, ``register``
    and ``export`` subcommands and their options."""
    parser = OneLineParser(
        prog="fl-leaderboard" if Path(sys.argv[0]).name == "fl-leaderboard" else "python -m leaderboard",
        description="Build the static leaderboard site (HTML + Markdown, tables and figures) from MLflow runs.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    build = commands.add_parser("build", help="read the runs and write the site",
                                description="Read the runs of an MLflow store (without altering it) and write "
                                            "the leaderboard site.")
    build.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI,
                       help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else %(default)s)")
    where = build.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path,
                       help=f"output folder; replaced if it holds an earlier build (default: {site.DEFAULT_OUT}/ "
                            "in the working directory, git-ignored)")
    where.add_argument("--publish", action="store_true",
                       help="write the repository's published site, leaderboard_site/ (replacing it)")
    build.add_argument("--experiments", nargs="+", metavar="NAME",
                       help="experiment (suite) names to read (default: every experiment in the store)")
    build.add_argument("--from-export", type=Path, nargs="+", metavar="DIR",
                       help="read the runs from folders written by `export` (or a published site: runs + rounds "
                            "tables) instead of the store; from an export without --complete, client accuracy "
                            "distributions need the store's artifacts and are left out (default: read the store)")
    build.add_argument("--paper-numbers", type=Path, default=DEFAULT_ROOT, metavar="DIR",
                       help="folder holding <paper>/paper_numbers.yaml (default: the repository's benchmarks/)")
    publishing = commands.add_parser(
        "publish", help="rebuild the published site, leaderboard_site/, from the committed exports in evidence/",
        description="Build the repository's published site from every committed export (evidence/exploratory/"
                    "<suite>/, then evidence/confirmatory/<suite>/) into leaderboard_site/, through a staging "
                    "folder renamed into place: a failed build leaves the old site. The same exports, code and "
                    "library releases build the same bytes (tests/leaderboard/test_published_site.py checks "
                    "the committed site against a fresh build).")
    publishing.add_argument("--out", type=Path, metavar="DIR",
                            help="write the build here instead (default: the repository's leaderboard_site/)")
    registering = commands.add_parser(
        "register", help="record the registration hash of the plan, claims, suites and amendments in the plan",
        description="Compute the SHA-256 of the ledger's registered files (the plan without its own hash line, "
                    "the amendments, the confirmatory pass and every paper folder's claims, suites and paper "
                    "numbers) and record it in the plan as `registered_hash:`. Commit it before the first "
                    "confirmatory run: the runner refuses one under files that differ from it.")
    registering.add_argument("--root", type=Path, default=DEFAULT_ROOT, metavar="DIR",
                             help="the folder of the registered files (default: the repository's benchmarks/)")
    registering.add_argument("--again", action="store_true",
                             help="replace a hash the plan already records (after recording the change as an "
                                  "amendment)")
    registering.add_argument("--check", action="store_true",
                             help="only say whether the files match the recorded hash (exit 1 when not); write "
                                  "nothing")
    exporting = commands.add_parser(
        "export", help="write the runs as tidy tables (CSV / Parquet)",
        description="Read the runs of an MLflow store (without altering it) and write runs.<format> (one row "
                    "per run: task, configuration, seed, the leaderboard's per-run numbers) and rounds.<format> "
                    "(one row per run, round and metric). Columns: leaderboard/export.py.")
    exporting.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI,
                           help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else %(default)s)")
    exporting.add_argument("--out", type=Path, required=True, metavar="DIR",
                           help="folder to write the tables into (created if missing; tables already there "
                                "are replaced only with --overwrite, nothing else is touched; required)")
    exporting.add_argument("--experiments", nargs="+", metavar="NAME",
                           help="experiment (suite) names to read (default: every experiment in the store)")
    exporting.add_argument("--tag", action="append", metavar="KEY=VALUE", dest="tags",
                           help="only the runs whose MLflow tag KEY equals VALUE; repeatable (one key given several "
                                "values: any of them; several keys: all of them) (default: every run read)")
    exporting.add_argument("--format", nargs="+", choices=export.FORMATS, default=list(export.FORMATS),
                           dest="formats", help=f"file formats to write (default: {' '.join(export.FORMATS)})")
    exporting.add_argument("--overwrite", action="store_true",
                           help="replace runs/rounds tables already in --out (without it, the export refuses)")
    exporting.add_argument("--complete", action="store_true",
                           help="also write the records table (every tag and metric of each run and its client "
                                "metrics), so that `build --from-export` reads the runs as the store holds them")
    exporting.add_argument("--all-metrics", action="store_true",
                           help="the rounds table holds every metric the runs logged, not only the histories the "
                                "leaderboard reads (one more request per run and metric: slower; default: off)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs the subcommand of ``argv`` (``build``, ``publish``, ``register``
    or ``export``); returns the exit status (2 after a one-line error)."""
    args = parser().parse_args(argv)
    if args.command == "export":
        return run_export(args)
    if args.command == "register":
        return run_register(args)
    try:
        if args.command == "publish":
            site.publish_site(args.out)
            return 0
        out = site.PUBLISHED_SITE if args.publish else args.out or site.DEFAULT_OUT
        site.build_site(args.tracking_uri, out, args.experiments, args.paper_numbers, from_export=args.from_export)
    except LeaderboardError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def run_register(args: argparse.Namespace) -> int:
    """``register``: records the registration hash in the plan (``--again`` replaces one), or with
    ``--check`` only says whether the files match it (1 when not); returns 2 after an error."""
    from leaderboard import registration

    try:
        if args.check:
            problem = registration.registration_problem(args.root)
            print(problem or f"registered: the files under {args.root} hash to the plan's "
                             f"{registration.recorded_hash(args.root)}", file=sys.stderr if problem else sys.stdout)
            return 1 if problem else 0
        digest, changed = registration.register(args.root, again=args.again)
    except LeaderboardError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    files = len(registration.registered_files(args.root))
    if changed:
        print(f"registered: {digest} over {files} files, recorded in {Path(args.root) / registration.PLAN_FILE}; "
              "commit it before the first confirmatory run")
    else:
        print(f"already registered: {digest} over {files} files")
    return 0


def run_export(args: argparse.Namespace) -> int:
    """``export``: writes the store's runs as tidy tables into ``--out``; returns 0, or 2 after a one-line error."""
    progress = export.ProgressLines()
    try:
        export.export(args.tracking_uri, args.out, args.experiments, args.tags, args.formats, args.all_metrics,
                      progress, overwrite=args.overwrite, complete=args.complete)
    except LeaderboardError as error:
        progress.close()
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
