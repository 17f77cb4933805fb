"""Which engine trains a round's clients, and running it (``core.engines`` are the engines):
``choose_engine`` picks the vectorised or the sequential engine for a round, and ``EngineRunner``
runs it across DDP ranks, halving the clients stacked at once after an out-of-memory error and
remembering the size that fitted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fl_lightning.core.distributed import across_ranks, world_size
from fl_lightning.core.engines import LocalTrainingEngine, SequentialEngine, VectorisedEngine, is_stacked_start
from fl_lightning.core.flat import ParameterLayout
from fl_lightning.core.local import ClientShards, LocalSGD
from fl_lightning.core.settings import EngineName, EngineSettings, check_setting


def choose_engine(
    name: str,
    num_clients: int,
    num_parameters: int,
    memory_budget_bytes: int,
    clients_per_chunk: int | str | None = None,
    autocast: str | None = None,
) -> LocalTrainingEngine:
    """``auto`` picks the vectorised engine unless the stacked parameters, gradients and
    momenta of one chunk of clients would not fit in the memory budget (an ``"auto"``
    chunk always fits: it is sized from the free memory)."""
    check_setting("engine", name, EngineName)
    if name == "auto":
        stacked = 1 if isinstance(clients_per_chunk, str) else min(num_clients, clients_per_chunk or num_clients)
        needed = 4 * stacked * num_parameters * 4  # params, grads, momentum, copies (fp32)
        name = "vectorised" if needed <= memory_budget_bytes else "sequential"
    if name == "vectorised":
        return VectorisedEngine(clients_per_chunk, autocast)
    return SequentialEngine(autocast)



class EngineRunner:
    """Runs the chosen engine; remembers a chunk size that ran out of memory (halved), so
    later rounds start from the size that fitted.

    After ``train``: ``engine_used`` (``"vectorised"``/``"sequential"``), ``last_chunk_size``
    and ``oom_retries`` (over the run) say what happened."""

    def __init__(self, settings: EngineSettings) -> None:
        self.engine, self.memory_budget_gb = settings.engine, settings.memory_budget_gb
        self.clients_per_chunk, self.autocast = settings.clients_per_chunk, settings.autocast
        self.engine_used: str | None = None
        self.last_chunk_size: int | None = None
        self.oom_retries = 0
        self._chunk_cap: int | None = None

    def train_across_ranks(self, trainer: Any, model: nn.Module, layout: ParameterLayout, shards: ClientShards,
                           order: torch.Tensor, start: dict[str, torch.Tensor], anchor: dict[str, torch.Tensor],
                           sgd: LocalSGD, objective: Callable[..., torch.Tensor]) -> dict[str, torch.Tensor]:
        """``train``, with every DDP rank training its own block of the clients and the results
        all-gathered, so every rank returns all m clients."""
        if world_size(trainer) == 1:
            return self.train(model, layout, shards, order, start, anchor, sgd, objective)
        per_client_start = is_stacked_start(start, layout)

        def train_block(rows: slice) -> tuple[torch.Tensor]:
            block_start = {n: v[rows] for n, v in start.items()} if per_client_start else start
            trained = self.train(model, layout, shards.rows(rows), order[:, rows], block_start, anchor, sgd, objective)
            return (layout.flatten_stacked(trained),)

        (flat,) = across_ranks(trainer, shards.num_clients, train_block)
        return layout.unflatten_stacked(flat)

    def train(self, model: nn.Module, layout: ParameterLayout, shards: ClientShards, order: torch.Tensor,
              start: dict[str, torch.Tensor], anchor: dict[str, torch.Tensor], sgd: LocalSGD,
              objective: Callable[..., torch.Tensor]) -> dict[str, torch.Tensor]:
        """The clients of ``shards`` trained from ``start`` on the chosen engine
        (``"auto"``: vectorised where it fits the memory budget), the chunk size capped at
        one that fitted after running out of memory; returns the trained parameters."""
        chunk = self.clients_per_chunk
        if self._chunk_cap is not None:
            chunk = self._chunk_cap if chunk in (None, "auto") else min(chunk, self._chunk_cap)
        engine = choose_engine(self.engine, shards.num_clients, layout.num_parameters,
                               int(self.memory_budget_gb * 2**30), chunk, self.autocast)
        self.engine_used = engine.name
        trained = engine.train(model, layout, start, shards, order, sgd, objective, anchor=anchor)
        self.last_chunk_size = engine.chunk_size
        if engine.oom_retries:
            self.oom_retries += engine.oom_retries
            self._chunk_cap = engine.chunk_size
        return trained
