"""What the docs print is what the program prints (issue 50).

Every ``output`` block of the docs (``<!-- docs: output -->``, what a command prints) is one of:

- produced again here and compared with the block (``CHECKED`` below: the block's page and first
  line, and the test that makes it). A line ``...`` in a block stands for any number of lines the
  page leaves out;
- marked ``<!-- docs: output; illustrative, <date>: <why> -->`` on its page: what the program printed
  that day (run names, run ids, paths, timings), shown as an example and not compared.

``test_every_output_block_is_checked_or_illustrative`` keeps it that way for new blocks.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from tests.docs.test_docs import ALL_BLOCKS, DOCS, ROOT, Block, blocks_of

# (page, the block's first line) -> the test below that produces the block again
CHECKED = {
    ("guides/suites-and-runner.md", "suite                                 runs          time  description"):
        "test_the_suite_list_is_what_fl_benchmarks_list_prints",
    ("guides/leaderboard.md", "CGSV(beta=1.5) − FedAvg: -5.92 pp"):
        "test_the_comparison_line_is_in_the_published_ledger",
    ("guides/datasets-and-partitions.md", "error: cannot build 100 clients from 'mnist5k'"):
        "test_the_infeasible_partition_error_is_what_the_fit_prints",
    ("guides/datasets-and-partitions.md", "source=digits partition=pathological"):
        "test_the_partition_report_is_what_the_python_block_prints",
    ("guides/resume-faults-replay.md", "usage: fl-lightning replay"):
        "test_the_replay_help_is_what_fl_lightning_replay_help_prints",
}
# Output blocks on pages another change owns (issue 50 leaves them to it): each still needs a check
# here or an 'illustrative, <date>: <why>' marker. The test fails once one of them has either, so
# that it is taken off this list.
PENDING = {
}


def first_line(block: Block) -> str:
    return block.text.splitlines()[0] if block.text.strip() else ""


def checked_key(block: Block) -> tuple[str, str] | None:
    for page, start in CHECKED:
        if block.page == page and first_line(block).startswith(start):
            return page, start
    return None


def pending(block: Block) -> bool:
    return block.page in PENDING and first_line(block).startswith(PENDING[block.page])


def the_block(page: str, start: str) -> Block:
    found = [b for b in blocks_of(DOCS / page) if b.kind == "output" and first_line(b).startswith(start)]
    assert len(found) == 1, f"{page}: {len(found)} output blocks start with {start!r}"
    return found[0]


def matches(shown: str, printed: str) -> bool:
    """The block, its ``...`` lines standing for any lines, is the whole of what was printed."""
    parts = []
    for line in shown.rstrip("\n").splitlines():
        parts.append(r"(?:[^\n]*\n)*?" if line.strip() == "..." else re.escape(line.rstrip()) + r"[ \t]*\n")
    normalised = "\n".join(line.rstrip() for line in printed.rstrip("\n").splitlines()) + "\n"
    return re.fullmatch("".join(parts), normalised) is not None


def test_every_output_block_is_checked_or_illustrative():
    problems, still_pending = [], []
    for block in ALL_BLOCKS:
        if block.kind != "output":
            continue
        if pending(block):
            if block.illustrative or checked_key(block):
                still_pending.append(f"{block.id}: now checked or illustrative; take it off PENDING")
            continue
        if block.illustrative and checked_key(block):
            problems.append(f"{block.id}: both checked here and marked illustrative")
        elif not block.illustrative and not checked_key(block):
            problems.append(f"{block.id}: an output block that no test produces: check it in "
                            "tests/docs/test_docs_outputs.py or mark it "
                            "'<!-- docs: output; illustrative, <date>: <why> -->'")
    for key, test in CHECKED.items():
        assert test in globals(), f"{key}: no test {test}"
        the_block(*key)
    assert not problems and not still_pending, "\n".join(problems + still_pending)


def test_the_suite_list_is_what_fl_benchmarks_list_prints():
    from benchmarks.command_line import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), mock.patch.object(sys, "argv", ["fl-benchmarks"]):
        main(["list"])
    shown = the_block("guides/suites-and-runner.md", "suite                                 runs")
    assert matches(shown.text, out.getvalue()), (
        f"{shown.id}: the docs' `fl-benchmarks list` differs from what it prints now:\n{out.getvalue()}")


def test_the_replay_help_is_what_fl_lightning_replay_help_prints(monkeypatch):
    from fl_lightning.cli.replay import main

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("COLUMNS", "100")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["--help"])
    shown = the_block("guides/resume-faults-replay.md", "usage: fl-lightning replay")
    assert matches(shown.text, out.getvalue()), (
        f"{shown.id}: the docs' `fl-lightning replay --help` differs from what it prints now:\n{out.getvalue()}")


def test_the_comparison_line_is_in_the_published_ledger():
    shown = the_block("guides/leaderboard.md", "CGSV(beta=1.5) − FedAvg: -5.92 pp")
    ledger = (ROOT / "leaderboard_site" / "index.md")
    if not ledger.is_file():
        pytest.skip("this checkout has no published leaderboard (leaderboard_site)")
    line = shown.text.strip()
    assert line in ledger.read_text(), f"{shown.id}: the published ledger has no line {line!r}"


def run_env() -> dict[str, str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


@pytest.mark.slow
def test_the_infeasible_partition_error_is_what_the_fit_prints(tmp_path):
    shown = the_block("guides/datasets-and-partitions.md", "error: cannot build 100 clients")
    done = subprocess.run([sys.executable, "-m", "fl_lightning.cli", "fit", "--data.partition", "shards",
                           "--data.partition_params", "{num_shards: 100}", "--trainer.logger", "false"],
                          cwd=tmp_path, env=run_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert matches(shown.text, done.stderr.strip().splitlines()[-1]), (
        f"{shown.id}: the fit prints\n{done.stderr[-2000:]}")


@pytest.mark.slow
def test_the_partition_report_is_what_the_python_block_prints(tmp_path):
    page = blocks_of(DOCS / "guides/datasets-and-partitions.md")
    shown = the_block("guides/datasets-and-partitions.md", "source=digits partition=pathological")
    program = page[page.index(shown) - 1]
    assert program.lang == "python" and program.kind == "run", program.id
    done = subprocess.run([sys.executable, "-c", program.text], cwd=tmp_path, env=run_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert matches(shown.text, done.stdout), f"{shown.id}: {program.id} prints\n{done.stdout}"
