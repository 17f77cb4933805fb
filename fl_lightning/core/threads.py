"""The fit's intra-op CPU threads: a setting of the run, like its seed.

A seeded fit must give the same bits wherever it runs, but the thread count changes them. Every
aten op of this project's fits was recomputed at one thread and compared with the fit's own count:
at 2 threads MKL's small matrix products in client training (a 10 x 200 batch times a 200 x 200
weight) and its matrix-vector products, Gram matrices and batched Cholesky solves on the server
round differently than at 1 thread, so the default FedAvg fit drifts from its fourth round. No
choice of operations makes MKL's products invariant to the count, so the count is a setting of
the run (``threads``, default 1): fixed when the fit starts, logged with the other settings, kept
by a resume, and the same whatever else runs on the machine. Fits side by side then do not fight
over the cores either: each uses its own count, one by default.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback


def set_threads(threads: int) -> None:
    """``torch.set_num_threads`` unless the count is already right (a change restarts the pool)."""
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


class FitThreads(Callback):
    """Holds the fit's intra-op threads at the run's setting from its setup to its end, setting it
    again at every round in case other code changed it, and puts the process's count back after."""

    def __init__(self, threads: int) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an integer >= 1, got {threads!r}")
        self.threads = threads
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
