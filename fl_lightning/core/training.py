"""Local training of a round's clients: which data they hold, which engine trains them (and
with how many stacked at once), recovering from out-of-memory by smaller chunks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import nn

from fl_lightning.core.distributed import across_ranks, world_size
from fl_lightning.core.flat import ParameterLayout
from fl_lightning.core.local import ClientShards, LocalSGD, choose_engine, is_stacked_start
from fl_lightning.core.settings import Autocast, EngineName

GradientSignal = Literal["update", "full_batch"]  # what a client's row of J means (FedLF, FedMDFG)


def full_batch_gradients(module: Any, round_index: int, shards: ClientShards) -> torch.Tensor:
    """Every client's full local gradient ∇F_i(w), (m, d): one full-batch SGD step with lr 1
    from w gives w − w' = ∇F_i(w) (the client signal of the FedLF and FedMDFG authors' code)."""
    one_step = LocalSGD(lr=1.0, epochs=1, batch_size=None)
    trained = module.local_train(round_index, shards, sgd=one_step)
    return module.global_vector().unsqueeze(0) - module.layout.flatten_stacked(trained)


class ClientDataSlicer:
    """The data of a set of clients as ``ClientShards``. Loop bounds come from a host copy of
    the client sizes, so building a round's shards never waits for the device."""

    def __init__(self) -> None:
        self._host_sizes: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # split -> (sizes, CPU copy)

    def shards(self, data: Any, clients: torch.Tensor, split: str = "train") -> ClientShards:
        all_sizes = getattr(data, f"{split}_sizes")
        cached = self._host_sizes.get(split)
        if cached is None or cached[0] is not all_sizes:
            cached = self._host_sizes[split] = (all_sizes, all_sizes.cpu())
        sizes_cpu = cached[1][clients.cpu()].tolist()
        on_device = clients.to(data.train_x.device)
        sizes = all_sizes[on_device]
        index = getattr(data, f"{split}_index")[on_device][:, : max(sizes_cpu)]
        return ClientShards(getattr(data, f"{split}_x"), getattr(data, f"{split}_y"), index, sizes, sizes_cpu,
                            on_device)


class EngineRunner:
    """Runs the chosen engine; remembers a chunk size that ran out of memory (halved), so
    later rounds start from the size that fitted.

    After ``train``: ``engine_used`` (``"vectorised"``/``"sequential"``), ``last_chunk_size``
    and ``oom_retries`` (over the run) say what happened."""

    def __init__(self, engine: EngineName, memory_budget_gb: float, clients_per_chunk: int | str | None,
                 autocast: Autocast | None) -> None:
        self.engine, self.memory_budget_gb = engine, memory_budget_gb
        self.clients_per_chunk, self.autocast = clients_per_chunk, autocast
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
