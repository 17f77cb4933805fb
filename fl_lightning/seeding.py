"""One seed per run: ``fl-lightning fit --seed_everything N`` decides every random stream.

Lightning's ``seed_everything(N)`` (which LightningCLI calls before it builds the model
and the data) records N in the environment variable ``PL_GLOBAL_SEED``. A component
whose own seed is left at ``None`` takes that run seed; one given explicitly
(``--model.seed 3``, ``--data.seed 3``) keeps its own.
"""

from __future__ import annotations

import os

SEED_ENV = "PL_GLOBAL_SEED"


def run_seed(seed: int | None, name: str = "seed") -> int:
    """``seed`` if given, else the run's ``seed_everything`` seed, else 0."""
    if seed is None:
        seed = int(os.environ.get(SEED_ENV, 0))
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"{name} must be an integer in [0, 2**32), got {seed!r}")
    return seed
