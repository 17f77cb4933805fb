"""Every client's loss and accuracy under one shared model, in one pass over their data."""

from __future__ import annotations

import torch
from torch import nn


class SamplePositions:
    """Where clients' samples are: each valid sample's position in ``x`` and its client, in
    client order, and whether they are simply rows 0..N-1 of ``x`` in order (then chunks are
    slices of ``x``, with no gather). Built from ``index`` (K, max_n) and ``sizes`` (K,)."""

    def __init__(self, index: torch.Tensor, sizes: torch.Tensor) -> None:
        valid = torch.arange(index.shape[1], device=index.device) < sizes.unsqueeze(1)
        self.samples = index[valid]
        self.owner = torch.arange(index.shape[0], device=index.device).unsqueeze(1).expand_as(index)[valid]
        count = self.samples.numel()
        self.in_order = bool(torch.equal(self.samples, torch.arange(count, device=index.device)))
        self._index, self._sizes = index.clone(), sizes.clone()

    def describes(self, index: torch.Tensor, sizes: torch.Tensor) -> bool:
        """Whether ``index`` and ``sizes`` are (equal to) the ones these positions were built from."""
        return (index.shape == self._index.shape and sizes.shape == self._sizes.shape
                and index.device == self._index.device and bool(torch.equal(index, self._index))
                and bool(torch.equal(sizes, self._sizes)))


@torch.no_grad()
def evaluate_clients(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    index: torch.Tensor,
    sizes: torch.Tensor,
    chunk_size: int = 8192,
    positions: SamplePositions | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-client mean loss and accuracy, each (K,); NaN for a client with no samples.

    ``index`` (K, max_n) holds client k's sample positions in ``x`` (valid below
    ``sizes[k]``). All clients' samples go through the model together, in chunks, and
    the per-sample results are summed per client with ``index_add_``. ``positions``: the
    ``SamplePositions`` of ``index`` and ``sizes`` when the caller keeps them (a round that
    evaluates the same clients as the last one).
    """
    num_clients = index.shape[0]
    positions = positions if positions is not None else SamplePositions(index, sizes)
    samples, owner = positions.samples, positions.owner
    # rows 0..N-1 in order: a chunk is a slice of x with the same values and layout as the
    # gather would copy, and as aligned (x starts on 64 bytes and a chunk starts a multiple of
    # chunk_size rows, a multiple of 64), so the model computes the same bits
    in_order = (positions.in_order and samples.numel() <= x.shape[0] and x.is_contiguous()
                and x.data_ptr() % 64 == 0 and chunk_size % 64 == 0)
    loss_sum = torch.zeros(num_clients, device=x.device)
    correct = torch.zeros(num_clients, device=x.device)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, samples.numel(), chunk_size):
            stop = min(start + chunk_size, samples.numel())
            who = owner[start:stop]
            logits = model(x[start:stop] if in_order else x[samples[start:stop]]).float()
            targets = y[start:stop] if in_order else y[samples[start:stop]]
            loss_sum.index_add_(0, who, nn.functional.cross_entropy(logits, targets, reduction="none"))
            correct.index_add_(0, who, (logits.argmax(dim=1) == targets).float())
    finally:
        model.train(was_training)
    counts = sizes.to(loss_sum.dtype)
    return loss_sum / counts, correct / counts


def label_matched(class_values: torch.Tensor, class_weights: torch.Tensor) -> torch.Tensor:
    """Each client's expected value over its own label distribution: sum_c p_k(c) v(c).

    ``class_values`` (C,) from one shared model (classes without test samples are NaN and
    carry no weight), ``class_weights`` (K, C) with rows summing to 1."""
    return class_weights @ torch.nan_to_num(class_values, nan=0.0)


@torch.no_grad()
def evaluate_clients_stacked(
    model: nn.Module,
    layout,
    client_params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    index: torch.Tensor,
    sizes: torch.Tensor,
    positions_per_pass: int = 256,
    clients_per_pass: int = 64,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-client mean loss and accuracy when client k has its own model (row k of
    ``client_params``, (K, d)), each evaluated on client k's samples; vmap over clients.

    ``weights`` (K, max_n), each row summing to 1 over the client's samples, gives a
    weighted mean instead (e.g. a shared test set re-weighted to the client's labels)."""
    from torch.func import functional_call, vmap

    num_clients, max_n = index.shape
    buffers = dict(model.named_buffers())
    forward = vmap(lambda p, xb: functional_call(model, (p, buffers), (xb,)))
    loss_sum = torch.zeros(num_clients, device=x.device)
    correct = torch.zeros(num_clients, device=x.device)
    was_training = model.training
    model.eval()
    try:
        for first in range(0, num_clients, clients_per_pass):
            rows = slice(first, first + clients_per_pass)
            params = layout.unflatten_stacked(client_params[rows].to(x.dtype))
            for start in range(0, max_n, positions_per_pass):
                cols = slice(start, start + positions_per_pass)
                samples = index[rows, cols]
                valid = (torch.arange(start, start + samples.shape[1], device=index.device)
                         < sizes[rows].unsqueeze(1)).to(loss_sum.dtype)
                if weights is not None:
                    valid = valid * weights[rows, cols]
                logits = forward(params, x[samples]).float()
                targets = y[samples]
                losses = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
                loss_sum[rows] += (torch.where(valid > 0, losses.view_as(valid), 0.0) * valid).sum(dim=1)
                correct[rows] += ((logits.argmax(dim=-1) == targets).to(valid.dtype) * valid).sum(dim=1)
    finally:
        model.train(was_training)
    if weights is not None:
        return loss_sum, correct
    counts = sizes.to(loss_sum.dtype)
    return loss_sum / counts, correct / counts
