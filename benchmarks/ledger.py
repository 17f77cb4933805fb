"""The offline claims ledger, run in parts: ``fl-benchmarks ledger``.

The ledger's suites (every offline suite a claim of ``benchmarks/<paper>/claims.yaml`` reads) run one
after the other into one store. When a suite has finished every run, its complete export (``python -m
leaderboard export --complete``: every tag, metric and client-level artifact of its runs) is written to
``<exports>/<suite>`` (written beside, then renamed). A suite already exported there is skipped. The
ledger can so run in parts, on machines replaced between the parts: a part loses at most the suite in
flight, and one build reads every part's exports (``fl-leaderboard build --from-export <exports>/*``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import yaml

from benchmarks.suites import SUITES_DIR, list_suites, load_suite

DEFAULT_EXPORTS = "ledger_exports"
"""The exports' folder, in the working folder (as ``benchmark_logs/``)."""


def claimed_suites(claims_files: Iterable[Path] | None = None) -> set[str]:
    """The suites (experiment names) the claims read: every ``suite:`` of the claims files."""
    names: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("suite"), str):
                names.add(node["suite"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for path in claims_files if claims_files is not None else sorted(SUITES_DIR.glob("*/claims.yaml")):
        walk(yaml.safe_load(Path(path).read_text()))
    return names


def ledger_suites(claimed: set[str] | None = None) -> list[tuple[str, str]]:
    """(suite file name, experiment name) of every offline suite the claims read, in ``list`` order."""
    claimed = claimed_suites() if claimed is None else claimed
    found = []
    for name in list_suites():
        cells = load_suite(name)
        if cells and cells[0].scale == "offline" and cells[0].suite in claimed:
            found.append((name, cells[0].suite))
    return found


def export_suite(tracking_uri: str, experiment: str, exports: Path) -> Path:
    """``python -m leaderboard export --complete --all-metrics`` of one suite into ``exports/<experiment>``,
    through a folder beside it renamed when the export is whole."""
    final, partial = exports / experiment, exports / f".{experiment}.partial"
    if partial.exists():  # a part stopped while it exported: ours to replace
        shutil.rmtree(partial)
    command = [sys.executable, "-m", "leaderboard", "export", "--tracking-uri", tracking_uri,
               "--experiments", experiment, "--out", str(partial), "--complete", "--all-metrics",
               "--format", "parquet"]
    subprocess.run(command, check=True)
    partial.rename(final)
    return final


def plan_lines(suites: list[tuple[str, str]], exports: Path, jobs: int) -> list[str]:
    """``--dry-run``: one line per suite (exported, or its runs and estimated time at ``jobs``; the
    runner's estimate for a clean store) and the time left in all; reads nothing but the suites."""
    from benchmarks.plan import _duration, estimate_suite

    lines, left = [], 0.0
    for name, experiment in suites:
        if (exports / experiment).is_dir():
            lines.append(f"  {name:<38} exported")
            continue
        cells = load_suite(name)
        seconds, _ = estimate_suite(cells)
        left += seconds / jobs
        lines.append(f"  {name:<38} {len(cells):>5} runs  about {_duration(seconds / jobs)}")
    return lines + [f"left: about {_duration(left)} at --jobs {jobs} (from the published ledger's run times)"]


def run_ledger(tracking_uri: str, exports: Path, jobs: int = 1, suites: list[tuple[str, str]] | None = None,
               run: Callable[..., int] | None = None,
               export: Callable[[str, str, Path], Path] = export_suite, dry_run: bool = False) -> int:
    """Runs and exports every ledger suite not yet in ``exports`` (see the module's docstring); the
    exit status: 0 when every suite is exported, else the first suite's that did not finish (the
    suites after it wait, so the parts stay in order). ``dry_run``: says what is left, creates nothing."""
    from benchmarks.runner import run_suite

    run = run_suite if run is None else run
    suites = ledger_suites() if suites is None else suites
    exports = Path(exports)
    todo = [(name, experiment) for name, experiment in suites if not (exports / experiment).is_dir()]
    print(f"ledger: {len(suites)} suites, {len(suites) - len(todo)} already exported in {exports}, "
          f"{len(todo)} to run", flush=True)
    if dry_run:
        print("\n".join(plan_lines(suites, exports, jobs)), flush=True)
        return 0
    exports.mkdir(parents=True, exist_ok=True)
    for number, (name, experiment) in enumerate(todo, start=1):
        print(f"\n=== ledger suite {number}/{len(todo)}: {name}", flush=True)
        status = run(name, jobs=jobs, tracking_uri=tracking_uri)
        if status != 0:
            print(f"ledger: {name} did not finish every run (exit status {status}); it is not exported. "
                  f"Run the ledger again to resume it.", flush=True)
            return status
        try:
            print(f"ledger: {name} exported to {export(tracking_uri, experiment, exports)}", flush=True)
        except (subprocess.CalledProcessError, OSError) as error:
            print(f"ledger: {name} finished but its export failed ({error}); its runs are in the store. "
                  "Run the ledger again to export it.", flush=True)
            return 1
    print(f"\nledger: every suite is exported in {exports}. Build from them:  {build_command(exports, suites)}",
          flush=True)
    return 0


def build_command(exports: Path, suites: list[tuple[str, str]]) -> str:
    """The leaderboard build from every suite's export, as it runs from this folder
    (``fl-leaderboard`` as this installation is reached, each folder named)."""
    from fl_lightning.callbacks.fit_report import console_command, shell_command

    folders = [str(exports / experiment) for _, experiment in suites]
    return shell_command([*console_command("fl-leaderboard", "leaderboard"), "build", "--from-export", *folders])
