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

from benchmarks.confirmatory import (  # noqa: F401  (the confirmatory pass, re-exported for the ledger's callers)
    CONFIRMATORY,
    CONFIRMATORY_FILE,
    ROOT_VARIABLE,
    Confirmatory,
    confirmatory_cells,
    ledger_root,
    load_confirmatory,
    registered_hash_or_exit,
)
from benchmarks.suites import SUITES_DIR, list_suites, load_suite
from fl_lightning.records.vocabulary import Tag

DEFAULT_EXPORTS = "ledger_exports"
"""The exports' folder, in the working folder (as ``benchmark_logs/``)."""
DEFAULT_CONFIRMATORY_EXPORTS = "ledger_confirmatory_exports"
"""The confirmatory pass's exports' folder, in the working folder (apart from the exploratory ones)."""


def runs_under_other_hashes(tracking_uri: str, experiment: str, plan_hash: str) -> int:
    """How many runs of ``experiment`` (any status) do not carry ``plan_hash`` as their ``ledger_plan_hash``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return 0
    others, token = 0, None
    while True:
        page = client.search_runs([found.experiment_id], max_results=1000, page_token=token)
        others += sum(run.data.tags.get(Tag.LEDGER_PLAN_HASH) != plan_hash for run in page)
        token = page.token
        if not token:
            return others


def used_seeds(exports: Path, suites_dir: Path = SUITES_DIR) -> set[int]:
    """Every seed an exploratory run of the exports under ``exports`` (each folder's ``runs`` table;
    runs tagged ``ledger_pass`` are left out) or a suite file under ``suites_dir`` holds."""
    import json

    import pandas as pd

    used: set[int] = set()
    for folder in sorted(Path(exports).iterdir()):
        if not (folder / "runs.parquet").exists():
            continue
        runs = pd.read_parquet(folder / "runs.parquet", columns=["run_id", "seed"])
        confirmatory: set[str] = set()
        if (folder / "records.parquet").exists():
            records = pd.read_parquet(folder / "records.parquet", columns=["run_id", "tags"])
            confirmatory = {run_id for run_id, tags in records.itertuples(index=False)
                            if Tag.LEDGER_PASS in json.loads(tags)}
        used |= {int(seed) for run_id, seed in runs.itertuples(index=False)
                 if run_id not in confirmatory and str(seed).strip() not in ("", "nan", "None")}
    for path in sorted(Path(suites_dir).glob("*/*.yaml")):
        raw = yaml.safe_load(path.read_text())
        if isinstance(raw, dict) and isinstance(raw.get("seeds"), list):
            used |= {seed for seed in raw["seeds"] if type(seed) is int}
    return used


def rule_seeds(first: int, count: int, used: set[int]) -> list[int]:
    """The seeds rule of ``ledger_confirmatory.yaml``: the first ``count`` integers from ``first`` up
    not in ``used``."""
    seeds, seed = [], first
    while len(seeds) < count:
        if seed not in used:
            seeds.append(seed)
        seed += 1
    return seeds


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


def plan_lines(suites: list[tuple[str, str]], exports: Path, jobs: int,
               confirmatory: tuple[Confirmatory, str] | None = None) -> list[str]:
    """``--dry-run``: one line per suite (exported, or its runs and estimated time at ``jobs``; the
    runner's estimate for a clean store) and the time left in all; reads nothing but the suites.
    ``confirmatory`` (the pass's file and hash): its seeds and lengths, the published run times
    rescaled to those lengths."""
    from benchmarks.plan import _duration, estimate_suite

    lines, left = [], 0.0
    for name, experiment in suites:
        if (exports / experiment).is_dir():
            lines.append(f"  {name:<38} exported")
            continue
        if confirmatory is None:
            cells = load_suite(name)
            seconds, _ = estimate_suite(cells)
        else:
            exploratory = load_suite(name, confirmatory[0].seeds)
            cells = confirmatory_cells(exploratory, *confirmatory)
            seconds, _ = estimate_suite(cells, measured_as=exploratory)
        left += seconds / jobs
        lines.append(f"  {name:<38} {len(cells):>5} runs  about {_duration(seconds / jobs)}")
    basis = ("the published ledger's run times" if confirmatory is None
             else "the published ledger's run times, rescaled to the rounds and cadence of ledger_confirmatory.yaml")
    return lines + [f"left: about {_duration(left)} at --jobs {jobs} (from {basis})"]


def is_timing_suite(name: str) -> bool:
    """Whether a suite is a timing suite (``benchmarks/<paper>/timing_*.yaml``): the ledger runs it through
    the timing driver (one fit at a time on an idle machine, arms alternated), never at ``--jobs``."""
    return Path(name).stem.startswith("timing")


def run_ledger(tracking_uri: str, exports: Path, jobs: int = 1, suites: list[tuple[str, str]] | None = None,
               run: Callable[..., int] | None = None,
               export: Callable[[str, str, Path], Path] = export_suite, dry_run: bool = False,
               confirmatory: bool = False, root: Path | str | None = None) -> int:
    """Runs and exports every ledger suite not yet in ``exports`` (see the module's docstring); the
    exit status: 0 when every suite is exported, else the first suite's that did not finish (the
    suites after it wait, so the parts stay in order). ``dry_run``: says what is left, creates nothing.
    ``confirmatory``: the confirmatory pass (``run_suite(..., confirmatory=True)``), refused before
    anything is created while the registered files differ from the plan's hash; a suite is exported
    only when every run of its experiment carries the pass's hash (never mixed with other runs)."""
    from benchmarks.runner import run_suite
    from benchmarks.timing import run_timing_suite

    registered = None
    if confirmatory:
        plan_hash = registered_hash_or_exit(root)  # before the exports' folder or the store
        registered = (load_confirmatory(root), plan_hash)
    run = run_suite if run is None else run
    suites = ledger_suites() if suites is None else suites
    exports = Path(exports)
    todo = [(name, experiment) for name, experiment in suites if not (exports / experiment).is_dir()]
    print(f"ledger: {len(suites)} suites, {len(suites) - len(todo)} already exported in {exports}, "
          f"{len(todo)} to run", flush=True)
    if dry_run:
        print("\n".join(plan_lines(suites, exports, jobs, registered)), flush=True)
        return 0
    exports.mkdir(parents=True, exist_ok=True)
    for number, (name, experiment) in enumerate(todo, start=1):
        print(f"\n=== ledger suite {number}/{len(todo)}: {name}", flush=True)
        runner = run_timing_suite if run is run_suite and is_timing_suite(name) else run
        if registered is None:
            status = runner(name, jobs=jobs, tracking_uri=tracking_uri)
        else:
            status = runner(name, jobs=jobs, tracking_uri=tracking_uri, confirmatory=True, root=root)
        if status != 0:
            print(f"ledger: {name} did not finish every run (exit status {status}); it is not exported. "
                  f"Run the ledger again to resume it.", flush=True)
            return status
        if registered is not None and (others := runs_under_other_hashes(tracking_uri, experiment, registered[1])):
            print(f"ledger: {name} finished, but its experiment holds {others} run(s) without the plan hash "
                  f"{registered[1][:12]}: not exported (a confirmatory export holds only the pass's runs). "
                  "Run the confirmatory pass into a store of its own.", flush=True)
            return 1
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
