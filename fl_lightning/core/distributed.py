"""Clients of a round split across Lightning's DDP ranks: each rank works on a contiguous
block of clients and the results are all-gathered, so every rank holds every client's."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


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
