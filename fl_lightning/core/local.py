"""What a client trains with: the local SGD settings (``LocalSGD``), its data (``ClientShards``,
cut from the data module by ``ClientDataSlicer``), the local objective (masked cross-entropy, the
proximal term) and the minibatch order both engines draw from (``batch_order``). The engines that
run the training are in ``core.engines``."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from fl_lightning.core.settings import (
    BatchSize,
    Count,
    Decay,
    Penalty,
    Probability,
    SettingsGroup,
    StepSize,
)
from fl_lightning.records.vocabulary import DEFAULT_BATCH_SIZE, DEFAULT_LOCAL_EPOCHS, DEFAULT_LR

# objective(logits (m,B,C), targets (m,B), mask (m,B), local_params {name: [m, ...]},
#           global_params {name: [...]}) -> every client's minibatch loss (m,)
ClientObjective = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class LocalSGD(SettingsGroup):
    """Hyper-parameters of local training (PyTorch SGD semantics, dampening 0); the step size of
    round t is ``lr * lr_decay**t`` (:meth:`round_lr`). Each field's type checks it."""

    lr: StepSize = DEFAULT_LR
    momentum: Probability = 0.0
    weight_decay: Penalty = 0.0
    epochs: Count = DEFAULT_LOCAL_EPOCHS
    batch_size: BatchSize = DEFAULT_BATCH_SIZE  # None: full batch (one step per epoch)
    lr_decay: Decay = 1.0

    LABELS = {"epochs": "local epochs"}

    def round_lr(self, round_index: int) -> float:
        """η_t = lr · lr_decay^t."""
        return self.lr * self.lr_decay**round_index


@dataclass
class ClientShards:
    """The training data of the m clients of a round.

    ``x``/``y`` hold samples of many clients; row k of ``index`` lists client k's sample
    positions in ``x`` (padded beyond ``sizes[k]``). ``sizes`` is kept on the CPU too
    (``sizes_cpu``) so that loop bounds never wait for the device.
    """

    x: torch.Tensor
    y: torch.Tensor
    index: torch.Tensor  # (m, max_n) int64
    sizes: torch.Tensor  # (m,) int64 on the data device
    sizes_cpu: list[int]
    clients: torch.Tensor | None = None  # (m,) the clients' ids, when known

    @property
    def num_clients(self) -> int:
        return len(self.sizes_cpu)

    def rows(self, block: slice) -> ClientShards:
        """The shards of a contiguous block of the clients."""
        return ClientShards(
            self.x, self.y, self.index[block], self.sizes[block], self.sizes_cpu[block],
            None if self.clients is None else self.clients[block],
        )

    def select(self, keep: torch.Tensor) -> ClientShards:
        """The shards of a subset of the clients (boolean mask over the rows)."""
        rows = keep.nonzero().flatten().tolist()
        return ClientShards(
            self.x, self.y, self.index[keep], self.sizes[keep], [self.sizes_cpu[r] for r in rows],
            None if self.clients is None else self.clients[keep],
        )


def masked_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Every client's mean cross-entropy over its valid (mask = 1) samples.

    logits (m, B, C), targets and mask (m, B) -> (m,).
    """
    losses = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    losses = losses.view_as(mask) * mask
    return losses.sum(dim=1) / mask.sum(dim=1).clamp(min=1)


def proximal_term(
    local_params: dict[str, torch.Tensor], global_params: dict[str, torch.Tensor], names: tuple[str, ...]
) -> torch.Tensor:
    """||w_i − w||² for every client i (rows of the stacked local parameters): (m,).

    FedProx's (μ/2)||w_i − w||², MGDA-Prox's and Ditto's personal objective build on it.
    """
    squares = [(local_params[n] - global_params[n]).pow(2).flatten(1).sum(dim=1) for n in names]
    return torch.stack(squares).sum(dim=0)


def with_proximal_term(loss: torch.Tensor, weight: float, local_params: dict[str, torch.Tensor],
                       anchor: dict[str, torch.Tensor], names: tuple[str, ...]) -> torch.Tensor:
    """loss + (weight/2) ||w_i − anchor||² for every client's row (FedProx, Li et al., MLSys 2020,
    eq. 2; Ditto's personal objective; MGDA-Prox); ``loss`` itself when weight is 0."""
    if weight == 0:
        return loss
    return loss + 0.5 * weight * proximal_term(local_params, anchor, names)


def steps_per_epoch(sizes: list[int], batch_size: int | None) -> list[int]:
    """ceil(n_i / B) minibatches per epoch (1 for full batch)."""
    if batch_size is None:
        return [1 for _ in sizes]
    return [math.ceil(n / batch_size) for n in sizes]


def batch_order(
    sizes: torch.Tensor, max_n: int, epochs: int, generator: torch.Generator
) -> torch.Tensor:
    """A fresh shuffle of every client's samples for every epoch: (E, m, max_n).

    Row [e, k] starts with a permutation of 0..n_k-1 (client k's positions) followed by
    the padding positions n_k..max_n-1 in order. Drawn with ``generator`` on the CPU so that
    both engines and every device see the same order for the same seed: one ``randperm`` per
    epoch and client, in that order, so the padding of unequal clients costs nothing (a sort of
    random keys over the padded rows cost 4x more on Synthetic's 100 clients).
    """
    counts = sizes.cpu()
    m, total = counts.shape[0], int(counts.sum())
    order = torch.arange(max_n).repeat(epochs, m, 1)
    if total == 0:
        return order
    # where each real sample goes in the flattened (m, max_n) rows: client k's j-th at k·max_n + j
    offset = torch.repeat_interleave(torch.arange(m) * max_n - (counts.cumsum(0) - counts), counts)
    place = (offset + torch.arange(total)).repeat(epochs) + torch.arange(epochs).repeat_interleave(total) * (m * max_n)
    shuffled = torch.cat([torch.randperm(n, generator=generator) for _ in range(epochs) for n in counts.tolist()])
    return order.view(-1).index_copy_(0, place, shuffled).view(epochs, m, max_n)


class ClientDataSlicer:
    """The data of a set of clients as ``ClientShards``. Loop bounds come from a host copy of
    the client sizes, so building a round's shards never waits for the device."""

    def __init__(self) -> None:
        self._host_sizes: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # split -> (sizes, CPU copy)

    def shards(self, data: Any, clients: torch.Tensor, split: str = "train") -> ClientShards:
        """The data of ``clients`` in ``split`` (``"train"`` by default) as ``ClientShards``: the shared tensors,
        the clients' index rows cut to the largest of them, and their sizes on the device and on the host."""
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
