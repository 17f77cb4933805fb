"""What the CLI prints for a user to run, taken apart and run as printed."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def printed_line(out: str, marker: str) -> str:
    """The command after ``marker`` on the last line of ``out`` that holds it."""
    lines = [line for line in out.splitlines() if marker in line]
    assert lines, out
    return lines[-1].split(marker, 1)[1].strip()


def words(command: str) -> tuple[dict[str, str], list[str]]:
    """(the environment the command sets, its words without those assignments)."""
    parts = shlex.split(command)
    env = {}
    while parts and ASSIGNMENT.match(parts[0]):
        name, _, value = parts.pop(0).partition("=")
        env[name] = value
    return env, parts


def user_shell_env() -> dict[str, str]:
    """A user's shell after the README's set-up: the virtual environment never activated (its
    bin/ not on PATH) and no PYTHONPATH: a printed command must carry what it needs."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PATH": path, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def run_as_printed(command: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """``command`` run by a shell, as a user pastes it, from the folder it was printed in."""
    return subprocess.run(command, shell=True, cwd=cwd, env=user_shell_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
