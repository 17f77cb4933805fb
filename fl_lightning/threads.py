"""How many intra-op CPU threads a fit uses, so that fits sharing a machine do not fight.

PyTorch's OpenMP threads spin while they wait for work. Two fits that each take every core of a
2-core machine then spin against each other: measured here (``benchmarks/perf/side_by_side.py``),
a fit that takes 2 s alone took 10-250 s beside a second one. One thread per fit does not
collapse, and for the small models of federated simulations it costs little alone.

``--threads auto`` (the default) shares the cores this process may use (``os.sched_getaffinity``)
among the fits running on the machine, and keeps the share right as fits start and end: each fit
registers in a folder of running fits (one file per process, under the fl-lightning cache) and
looks again at the start of every round. A fit joins that folder as it starts, before its imports
(:func:`fl_lightning.running_fits.announce_fit`), so fits already running give it its share of
the cores while it is still starting. ``--threads N`` (or the environment variable
``FL_LIGHTNING_THREADS=N``, which the benchmark runner sets for its jobs) fixes the count.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback

from fl_lightning.running_fits import RunningFits, default_folder

THREADS_ENV = "FL_LIGHTNING_THREADS"
AUTO = "auto"


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity; all of them where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def parse_threads(value: Any) -> int | None:
    """``"auto"`` (or None) -> None; a positive integer -> itself; anything else a ValueError."""
    if value is None or value == AUTO:
        return None
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise ValueError(f"threads must be 'auto' or an integer >= 1, got {value!r}")
    return int(text)


def fixed_threads(setting: Any) -> int | None:
    """The thread count a setting fixes: ``setting`` itself, else ``$FL_LIGHTNING_THREADS``;
    None for the automatic share."""
    number = parse_threads(setting)
    if number is None and os.environ.get(THREADS_ENV):
        number = parse_threads(os.environ[THREADS_ENV])
    return number


class CPUThreads(Callback):
    """Sets the fit's intra-op threads (``torch.set_num_threads``): a fixed count, or the share
    ``max(1, cores // running fits)`` checked at the start of every round (listing a folder of a
    few files: tens of microseconds; checking less often, once a second, left two 2-second fits
    at 1.6-1.7x instead of 1.3-1.5x). The count the process had is restored when the fit ends."""

    def __init__(self, threads: int | str | None = AUTO, folder: Path | None = None) -> None:
        self.fixed = fixed_threads(threads)
        self.folder = folder
        self.fits: RunningFits | None = None
        self.previous: int | None = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self.start()

    def start(self) -> None:
        """Join the running fits and set the threads now (the CLI calls it before the data is
        built, whose work would otherwise spin on every core); idempotent."""
        if self.previous is not None:
            return
        self.previous = torch.get_num_threads()
        fits = RunningFits(self.folder or default_folder())
        if self.fixed is not None:  # a fixed count takes no share: not counted by the others
            fits.leave()
        else:
            self.fits = fits
            try:
                self.fits.join()
            except OSError:  # an unwritable cache: every core, as torch would
                self.fits = None
        self._apply()

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self.fits is not None:
            self._apply()

    def threads(self) -> int:
        if self.fixed is not None:
            return self.fixed
        running = self.fits.count() if self.fits is not None else 1
        return max(1, available_cores() // running)

    def _apply(self) -> None:
        wanted = self.threads()
        if torch.get_num_threads() != wanted:
            torch.set_num_threads(wanted)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "fit" or self.previous is None:
            return
        if self.fits is not None:
            self.fits.leave()
            self.fits = None
        torch.set_num_threads(self.previous)
        self.previous = None
