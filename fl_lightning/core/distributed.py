"""What a module reads of its Trainer: the length of a fit (``check_trainer_length``), and the
clients of a round split across Lightning's DDP ranks: each rank works on a contiguous block of
clients and the results are all-gathered, so every rank holds every client's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# Lightning's max_epochs when a Trainer is given neither max_epochs nor max_steps
LIGHTNING_DEFAULT_MAX_EPOCHS = 1000


def check_trainer_length(trainer: Any, num_rounds: int) -> None:
    """A fit runs ``num_rounds`` rounds, one epoch (and one step) each: a Trainer's own
    ``max_epochs``/``max_steps`` that says otherwise is refused, not overridden in silence (an
    unlimited -1 and Lightning's default 1000, when neither is given, are left to ``num_rounds``)."""
    max_epochs, max_steps = trainer.fit_loop.max_epochs, trainer.max_steps
    if max_epochs not in (None, -1, LIGHTNING_DEFAULT_MAX_EPOCHS, num_rounds):
        raise ValueError(f"Trainer(max_epochs={max_epochs}) but the module runs num_rounds={num_rounds} rounds (one "
                         "epoch each): set num_rounds on the module and leave max_epochs out")
    if max_steps not in (None, -1, num_rounds):
        raise ValueError(f"Trainer(max_steps={max_steps}) but the module runs num_rounds={num_rounds} rounds (one "
                         "step each): set num_rounds on the module and leave max_steps out")


def world_size(trainer: Any) -> int:
    """Processes sharing the clients of a round (1 without a Trainer)."""
    return int(trainer.world_size) if trainer is not None else 1


def across_ranks(
    trainer: Any, num_rows: int, work: Callable[[slice], tuple[torch.Tensor, ...]]
) -> tuple[torch.Tensor, ...]:
    """Runs ``work(rows)`` on this rank's block of ``num_rows`` clients and all-gathers the
    results (each with one leading row per client) in client order.

    Block r is rows [r*b, (r+1)*b) with b = ceil(num_rows / world_size), so ranks agree on
    the split without talking; a rank whose block is empty computes one row and drops it,
    so that every rank joins every all-gather with the same shape.
    """
    world = world_size(trainer)
    if world == 1:
        return work(slice(0, num_rows))
    block = -(-num_rows // world)
    first = min(num_rows, trainer.global_rank * block)
    last = min(num_rows, first + block)
    results = work(slice(first, last)) if last > first else tuple(r[:0] for r in work(slice(0, 1)))
    gathered = []
    for rows in results:
        padded = rows.new_zeros((block, *rows.shape[1:]))
        padded[: rows.shape[0]] = rows
        stacked = trainer.strategy.all_gather(padded)  # (world, block, ...)
        gathered.append(stacked.reshape(world * block, *rows.shape[1:])[:num_rows])
    return tuple(gathered)
