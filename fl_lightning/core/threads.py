"""The fit's intra-op CPU threads: a setting of the run, like its seed.

A seeded fit must give the same bits wherever it runs, but the thread count changes them. Every
aten op of this project's fits was recomputed at one thread and compared with the fit's own count:
at 2 threads MKL's small matrix products in client training (a 10 x 200 batch times a 200 x 200
weight) and its matrix-vector products, Gram matrices and batched Cholesky solves on the server
round differently than at 1 thread, so the default FedAvg fit drifts from its fourth round. No
choice of operations makes MKL's products invariant to the count, so the count is a setting of
the run (``threads``): fixed when the module is built, logged with the other settings (its
``config.yaml`` and MLflow params hold the number), kept by a resume and taken by a replay, and the
same whatever else runs on the machine.

The default, ``"auto"``, is the cores the fit is given, resolved once when the module is built
(``cores_given``): the CPU affinity of the process, or fewer where ``OMP_NUM_THREADS`` says so. A
lone fit uses the machine; the benchmark runner gives each of its ``--jobs`` its share of the
cores through ``OMP_NUM_THREADS``, so fits side by side do not fight over them.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning.pytorch import Callback

from fl_lightning.records.machine import available_cores

AUTO = "auto"


def cores_given() -> int:
    """The cores this process may use: its CPU affinity, capped by ``OMP_NUM_THREADS`` when that
    holds a positive integer (how the runner gives each job its share)."""
    cores = available_cores()
    limit = os.environ.get("OMP_NUM_THREADS", "").strip()
    if limit.isdigit() and int(limit) >= 1:
        cores = min(cores, int(limit))
    return max(1, cores)


def resolve_threads(threads: Any) -> int:
    """The run's count: ``threads`` itself, or ``cores_given()`` for ``"auto"``."""
    if threads == AUTO:
        return cores_given()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be an integer >= 1 or 'auto', got {threads!r}")
    return threads


def set_threads(threads: int) -> None:
    """``torch.set_num_threads`` unless the count is already right (a change restarts the pool)."""
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


class FitThreads(Callback):
    """Holds the fit's intra-op threads at the run's setting from its setup to its end, setting it
    again at every round in case other code changed it, and puts the process's count back after."""

    def __init__(self, threads: int | str) -> None:
        self.threads = resolve_threads(threads)
        self.previous: int | None = None

    def start(self) -> None:
        """Keep the process's count and set the run's (the CLI calls it before it builds the data)."""
        if self.previous is None:
            self.previous = torch.get_num_threads()
        set_threads(self.threads)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.start()

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        set_threads(self.threads)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        set_threads(self.threads)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.previous is not None:
            set_threads(self.previous)
            self.previous = None
