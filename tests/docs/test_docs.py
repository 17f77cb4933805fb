"""The documentation site (docs/, mkdocs.yml) says only what is so.

- It builds with every warning an error (a broken link or anchor, a docstring that names a
  parameter the signature lacks).
- Every fenced block carries a marker saying what the tests do with it: ``run`` (executed in a
  fresh folder), ``parse`` (each ``fl-lightning fit`` line parsed with ``--print_config``: every flag
  exists, every value validates), ``config`` (a whole fit config, checked the same way), ``suite``
  (a whole benchmark suite, loaded by the runner), ``output`` (what a command prints) or ``skip``.
  ``parse`` and ``skip`` say why the block is not run. An ``output`` block is either produced again
  and compared by tests/docs/test_docs_outputs.py, or says ``output; illustrative, <date>: <why>`` (what
  the program printed that day, not checked: run names, paths, timings).
- Every ``--flag`` the docs and the README name, in a block or in the prose, is one of our
  commands' flags (or one of the few other tools' flags they show).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from unittest import mock

import pytest

from tests.paths import REPO

ROOT = REPO
DOCS = ROOT / "docs"
MARKER = re.compile(
    r"^<!--\s*docs:\s*(?P<kind>run|parse|config|suite|output|skip)\s*"
    r"(?:;\s*(?:not run:\s*(?P<why>.+?)|illustrative,\s*(?P<date>\d{4}-\d{2}-\d{2}):\s*(?P<note>.+?)))?\s*-->$"
)
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
NEEDS_REASON = {"parse", "skip"}
RUN_TIMEOUT_S = 300

# flags of other tools that the docs show beside ours (pip, pytest, tox, mlflow, python, git, ...)
OTHER_TOOLS_FLAGS = {
    "--quiet", "--upgrade", "--no-compile", "--index-url", "--extra-index-url", "--user",  # pip
    "--durations", "--ignore", "--accelerator", "--lf", "--co",  # pytest (--accelerator: ours, conftest)
    "--backend-store-uri", "--default-artifact-root", "--host", "--port", "--workers",  # mlflow ui
    "--strict", "--serve", "--dev-addr",  # mkdocs
    "--version", "--help", "--nproc_per_node", "--nnodes", "--node_rank", "--master_addr",
    "--master_port", "--ntasks-per-node", "--gpus-per-node", "--nodes",  # torchrun, SLURM
    "--model.smoothing",  # the setting of the docs' own example algorithm (Writing an algorithm)
    "--sf", "--iu", "--tf", "--k", "--smplseed", "--spltseed",  # LEAF's preprocess.sh (FEMNIST, Shakespeare)
}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    kind: str | None
    why: str | None
    text: str
    illustrative: str | None = None  # the date of an output shown as an example, not checked

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def blocks_of(path: Path) -> list[Block]:
    """The fenced blocks of a page, each with the marker on the last non-blank line before it."""
    lines = path.read_text().splitlines()
    found, i, previous = [], 0, ""
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            if lines[i].strip():
                previous = lines[i].strip()
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        body, j = [], i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        marker = MARKER.match(previous)
        found.append(Block(str(path.relative_to(DOCS)), i + 1, opening["lang"], marker["kind"] if marker else None,
                           marker["why"] if marker else None, "\n".join(body) + "\n",
                           marker["date"] if marker else None))
        previous, i = "", j + 1
    return found


ALL_BLOCKS = [block for page in pages() for block in blocks_of(page)]


def of_kind(kind: str) -> list:
    return [pytest.param(b, id=b.id) for b in ALL_BLOCKS if b.kind == kind]


def test_the_docs_have_pages_and_blocks():
    assert len(pages()) >= 20 and len(ALL_BLOCKS) >= 10


def test_every_block_says_what_the_tests_do_with_it():
    problems = []
    for block in ALL_BLOCKS:
        if block.kind is None:
            problems.append(
                f"{block.id}: no marker (<!-- docs: run|parse|config|suite|output|skip -->) before the block"
            )
        elif block.illustrative and block.kind != "output":
            problems.append(f"{block.id}: only an 'output' block can be 'illustrative, <date>: <why>'")
        elif block.kind in NEEDS_REASON and not block.why:
            problems.append(f"{block.id}: '{block.kind}' needs '; not run: <why>'")
        elif block.kind in {"parse", "run"} and block.lang not in {"bash", "sh", "python"}:
            problems.append(f"{block.id}: '{block.kind}' is for bash or python blocks, not {block.lang!r}")
        elif block.kind in {"config", "suite"} and block.lang != "yaml":
            problems.append(f"{block.id}: '{block.kind}' is for yaml blocks")
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_the_site_builds_with_warnings_as_errors(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    if mkdocs is None:
        pytest.fail("mkdocs is not installed: pip install -e '.[test]' (mkdocs-material, mkdocstrings[python])")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert (tmp_path / "site" / "reference" / "algorithms" / "index.html").is_file()
    assert (tmp_path / "site" / "search" / "search_index.json").is_file()


# ------------------------------------------------------------------ the commands the docs show


def commands(block: Block) -> list[list[str]]:
    """The block's command lines (comments dropped, backslash continuations joined), split."""
    joined = re.sub(r"\\\n\s*", " ", block.text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.append(shlex.split(line, comments=True))
    return out


def fit_words(words: list[str]) -> list[str] | None:
    """The arguments after ``fl-lightning`` of an ``fl-lightning fit`` line (any path to it)."""
    for i, word in enumerate(words):
        if Path(word).name == "fl-lightning" and words[i + 1:i + 2] == ["fit"]:
            return words[i + 1:]
    return None


def print_config(args: list[str]) -> tuple[int, str]:
    """``fl-lightning <args> --print_config`` in this process: its exit code and what it printed."""
    from fl_lightning.cli import main

    out = io.StringIO()
    code = 0
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(out),
        mock.patch.object(sys, "argv", ["fl-lightning"]),
    ):
        try:
            main([*args, "--print_config"])
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return code, out.getvalue()


@pytest.mark.parametrize("block", of_kind("parse"))
def test_every_fit_command_parses(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = [args for args in map(fit_words, commands(block)) if args is not None]
    assert lines, f"{block.id}: a 'parse' block with no fl-lightning fit line"
    for args in lines:
        code, printed = print_config(args)
        assert code == 0, f"{block.id}: fl-lightning {shlex.join(args)} --print_config failed:\n{printed[-2000:]}"


@pytest.mark.parametrize("block", of_kind("config"))
def test_every_config_parses(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.yaml").write_text(block.text)
    code, printed = print_config(["fit", "--config", "config.yaml"])
    assert code == 0, f"{block.id}: the config does not parse:\n{printed[-2000:]}"


@pytest.mark.parametrize("block", of_kind("suite"))
def test_every_suite_loads(block, tmp_path):
    from benchmarks.suites import load_suite

    path = tmp_path / "suite.yaml"
    path.write_text(block.text)
    assert load_suite(str(path)), f"{block.id}: the suite has no runs"


@pytest.mark.integration
@pytest.mark.parametrize("block", of_kind("run"))
def test_every_runnable_block_runs(block, tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    env.pop("MLFLOW_TRACKING_URI", None)
    if block.lang == "python":
        command = [sys.executable, "-c", block.text]
    else:
        command = ["bash", "-e", "-c", block.text]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert done.returncode == 0, f"{block.id} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


# ------------------------------------------------------------------ every flag the docs name


def help_flags(run) -> set[str]:
    out = io.StringIO()
    with (contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), contextlib.suppress(SystemExit),
          mock.patch.object(sys, "argv", ["fl-lightning"])):
        run()
    return set(re.findall(r"(?<![\w-])--[A-Za-z][\w.-]*", out.getvalue()))


@cache
def known_flags() -> frozenset[str]:
    """Our commands' flags: fit's (with every algorithm's settings as ``--model.X``), the runner's,
    the leaderboard builder's, replay's; and the other tools' the docs show."""
    from benchmarks.command_line import main as benchmarks_main
    from fl_lightning.algorithms import ALGORITHMS
    from fl_lightning.cli import main as fit_main
    from fl_lightning.cli.replay import main as replay_main
    from fl_lightning.cli.settings import signature_defaults
    from leaderboard.__main__ import main as leaderboard_main

    flags = help_flags(lambda: fit_main(["fit", "--help"]))
    for cls in ALGORITHMS.values():
        flags |= {f"--model.{name}" for name in signature_defaults(cls)}
        flags |= {f"--model.init_args.{name}" for name in signature_defaults(cls)}
    for command in (["run", "--help"], ["list", "--help"], ["ledger", "--help"]):
        flags |= help_flags(lambda c=command: benchmarks_main(c))
    flags |= help_flags(lambda: leaderboard_main(["build", "--help"]))
    flags |= help_flags(lambda: leaderboard_main(["export", "--help"]))
    flags |= help_flags(lambda: leaderboard_main(["register", "--help"]))
    flags |= set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", (ROOT / "benchmarks" / "timing.py").read_text()))
    flags |= help_flags(lambda: replay_main(["--help"]))
    for script in (ROOT / "benchmarks" / "perf").glob("*.py"):  # the speed benchmarks' own flags, read from
        flags |= set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", script.read_text()))  # the source (no torch import)
    return frozenset(flags | OTHER_TOOLS_FLAGS)


def named_flags() -> dict[str, list[str]]:
    """Every ``--flag`` in the docs and the README (blocks and inline code), with where it is."""
    where: dict[str, list[str]] = {}
    for page in [*pages(), ROOT / "README.md"]:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for flag in re.findall(r"(?<![\w/-])--[A-Za-z][\w.-]*[\w]", line):
                where.setdefault(flag, []).append(f"{page.relative_to(ROOT)}:{number}")
    return where


def flag_exists(flag: str, known: frozenset[str]) -> bool:
    if flag in known:
        return True
    head = flag.split(".")
    # nested settings of a class-valued option (--trainer.logger.init_args.X, --trainer.callbacks+=...)
    return len(head) > 2 and ".".join(head[:2]) in known | {"--trainer.logger", "--trainer.callbacks"}


def test_every_flag_the_docs_name_exists():
    known = known_flags()
    missing = {flag: where for flag, where in named_flags().items() if not flag_exists(flag, known)}
    assert not missing, "flags no command has:\n" + "\n".join(
        f"{f}: {', '.join(w)}" for f, w in sorted(missing.items())
    )
