"""The benchmark runner and the leaderboard builder are installed tools: the console scripts
``fl-benchmarks`` and ``fl-leaderboard`` (beside ``fl-lightning``) work from a folder that is not
the clone's root, with help that shows the defaults, and the installed packages carry what they
read at run time (suites, perf figures, templates). Run from a temporary folder without
PYTHONPATH, so the imports resolve to the installed packages (under tox: a non-editable install)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.command_line import LIST_WIDTH
from benchmarks.command_line import main as runner_main
from benchmarks.suites import list_suites, load_suite

BIN = Path(sys.executable).parent


def script(name: str) -> str:
    """The console script beside this Python, or a skip that says how to install it."""
    found = shutil.which(name, path=str(BIN))
    if found is None:
        pytest.skip(f"{name} is not installed beside {sys.executable}: install the project "
                    "(pip install -e . or pip install .) to create its console scripts")
    return found


def run_outside(tmp_path: Path, *command: str, **environment: str) -> subprocess.CompletedProcess:
    """``command`` in ``tmp_path`` (not the clone), without PYTHONPATH or MLFLOW_TRACKING_URI unless given."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI")}
    env.update(environment, COLUMNS="100")
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def flat(text: str) -> str:
    """Help text with argparse's line wrapping undone."""
    return " ".join(text.split())


def test_fl_benchmarks_help_shows_the_defaults(tmp_path):
    runner = script("fl-benchmarks")
    top = flat(run_outside(tmp_path, runner, "--help").stdout)
    assert top.startswith("usage: fl-benchmarks ") and "{run,list,ledger}" in top
    ledger = flat(run_outside(tmp_path, runner, "ledger", "--help").stdout)
    assert ("(default: ledger_exports/ in the working folder; ledger_confirmatory_exports/ with --confirmatory)"
            in ledger)
    assert "(default: 1)" in ledger
    run = flat(run_outside(tmp_path, runner, "run", "--help").stdout)
    assert run.startswith("usage: fl-benchmarks run ")
    for default in ("(default: $MLFLOW_TRACKING_URI, else sqlite:///mlruns.db)", "(default: 1)",
                    "(default: the suite's own)", "default: 1440", "default: all"):
        assert default in run, default
    chosen = flat(run_outside(tmp_path, runner, "run", "--help", MLFLOW_TRACKING_URI="sqlite:///elsewhere.db").stdout)
    assert "here: sqlite:///elsewhere.db" in chosen


def test_fl_benchmarks_list_shows_every_suite_with_runs_and_time(tmp_path):
    lines = run_outside(tmp_path, script("fl-benchmarks"), "list").stdout.splitlines()
    too_wide = [line for line in lines if len(line) > LIST_WIDTH]
    assert not too_wide, too_wide
    rows = {line.split()[0]: line for line in lines[1:] if line.split() and "/" in line.split()[0]}
    assert set(rows) == set(list_suites())
    for name, line in rows.items():
        runs, time = re.match(rf"{re.escape(name)}\s+([\d,]+)\s+(\S+(?: \S+)?)\s+\S", line).groups()
        assert int(runs.replace(",", "")) == len(load_suite(name)), line
        assert re.fullmatch(r"[\d.,]+ (s|min|h|days)\+?|\?", time), line
    assert "quickstart/offline" in rows


@pytest.mark.slow
def test_fl_leaderboard_help(tmp_path):
    leaderboard = script("fl-leaderboard")
    assert "build" in run_outside(tmp_path, leaderboard, "--help").stdout
    build = flat(run_outside(tmp_path, leaderboard, "build", "--help").stdout)
    assert "--tracking-uri" in build and "sqlite:///mlruns.db" in build


def test_the_installed_packages_carry_their_data(tmp_path):
    """What the runner and the builder read at run time is beside their modules, wherever pip put them."""
    script("fl-benchmarks")
    check = (
        "from benchmarks import plan, suites\n"
        "from leaderboard import papers, site\n"
        "assert (suites.SUITES_DIR / 'quickstart' / 'offline.yaml').is_file(), suites.SUITES_DIR\n"
        "assert list(plan.PERF_RESULTS.glob(plan.PERF_FILES)), plan.PERF_RESULTS\n"
        "assert plan.model_throughput().get('fl_mlp'), plan.PERF_RESULTS\n"
        "assert list(site.TEMPLATES.glob('*.html')) and list(site.TEMPLATES.glob('*.j2')), site.TEMPLATES\n"
        "assert list(papers.DEFAULT_ROOT.glob('*/paper_numbers.yaml')), papers.DEFAULT_ROOT\n"
        "assert list(papers.DEFAULT_ROOT.glob('*/claims.yaml')), papers.DEFAULT_ROOT\n"
        "print(suites.__file__)\n"
    )
    done = run_outside(tmp_path, sys.executable, "-c", check)
    assert Path(done.stdout.strip()).name == "suites.py"


def test_the_quickstart_suite_is_estimated_under_five_minutes_with_two_jobs(tmp_path, capsys):
    """The README's few-minutes suite: its dry run (no store: the perf figures alone) at --jobs 2."""
    store = tmp_path / "missing.db"
    assert runner_main(["run", "quickstart/offline", "--dry-run", "--jobs", "2",
                        "--tracking-uri", f"sqlite:///{store}"]) == 0
    out = capsys.readouterr().out
    estimate = re.search(r"estimated time: ([\d.,]+) (s|min|h|days) with 2 job\(s\) for (\d+) of (\d+) run", out)
    assert estimate, out
    value, unit, estimated, runs = estimate.groups()
    assert estimated == runs == "18", out
    seconds = float(value.replace(",", "")) * {"s": 1, "min": 60, "h": 3600, "days": 86400}[unit]
    assert seconds < 5 * 60, out
    assert not store.exists()
