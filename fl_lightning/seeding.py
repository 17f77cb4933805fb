"""One seed per run: ``fl-lightning fit --seed_everything N`` decides every random stream.

Lightning's ``seed_everything(N)`` (which LightningCLI calls before it builds the model
and the data) records N in the environment variable ``PL_GLOBAL_SEED``. A component
whose own seed is left at ``None`` takes that run seed; one given explicitly
(``--model.seed 3``, ``--data.seed 3``) keeps its own.
"""

from __future__ import annotations

import os
from typing import Any

import torch

SEED_ENV = "PL_GLOBAL_SEED"


def run_seed(seed: int | None, name: str = "seed") -> int:
    """``seed`` if given, else the run's ``seed_everything`` seed, else 0."""
    if seed is None:
        seed = int(os.environ.get(SEED_ENV, 0))
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise ValueError(f"{name} must be an integer in [0, 2**32), got {seed!r}")
    return seed


def global_generator_states() -> dict[str, Any]:
    """The global CPU (and initialised CUDA) generators' states, for a checkpoint."""
    states: dict[str, Any] = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_global_generators(states: dict[str, Any]) -> None:
    """Restores ``global_generator_states()`` (CUDA ones only onto the same number of devices)."""
    torch.set_rng_state(states["cpu"])
    if "cuda" in states and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(states["cuda"])
