"""What machine ran something: names for run tags, results files and page provenance.

Standard library only, so that light tools (the leaderboard builder) can import it
without torch or Lightning.
"""

from __future__ import annotations

import os
import platform


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_description() -> str:
    """The CPU and its core count, e.g. 'AMD EPYC (2 cores)'."""
    return f"{cpu_model()} ({os.cpu_count()} cores)"


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity; all of them where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1
