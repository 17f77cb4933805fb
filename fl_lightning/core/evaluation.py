"""Every client's loss and accuracy under one shared model, in one pass over their data."""

from __future__ import annotations

import weakref

import torch
from torch import nn

from fl_lightning.core.kernels import cross_entropy_and_correct

ACTIVATION_BUDGET_BYTES = 64 * 2**20
"""What one evaluation chunk's activations may take on a CPU: a chunk of a convolutional model
holds far more than its input (the MNIST CNN: 355 KB a sample, 2.9 GB for 8,192 rows), and chunks
that stay near the caches run faster (1.3-1.8x for that CNN on a 2-core CPU) and give the same
bits. On a GPU, where a larger batch is cheaper and cuDNN may choose by batch size, the chunks
stay as they were (8,192 rows; a whole vmap pass)."""
MAX_CHUNK_ROWS = 8192
_activation_bytes: weakref.WeakKeyDictionary[nn.Module, dict[tuple, int]] = weakref.WeakKeyDictionary()


@torch.no_grad()
def activation_bytes_per_sample(model: nn.Module, sample: torch.Tensor) -> int:
    """Bytes of every leaf module's output for one sample (``sample``: one row of the input),
    measured once per model and input shape (one forward pass of that row)."""
    key = (tuple(sample.shape), sample.dtype, sample.device)
    known = _activation_bytes.setdefault(model, {})
    if key not in known:
        sizes: list[int] = []

        def record(module: nn.Module, inputs: object, output: object) -> None:
            if isinstance(output, torch.Tensor):
                sizes.append(output.numel() * output.element_size())

        leaves = [m for m in model.modules() if next(m.children(), None) is None]
        hooks = [leaf.register_forward_hook(record) for leaf in leaves]
        was_training = model.training
        model.eval()
        try:
            model(sample.unsqueeze(0))
        finally:
            for hook in hooks:
                hook.remove()
            model.train(was_training)
        known[key] = max(sum(sizes), sample.numel() * sample.element_size())
    return known[key]


def rows_within_budget(per_row_bytes: int, multiple: int, most: int) -> int:
    """The most rows (a multiple of ``multiple``, at least one multiple, at most ``most``) whose
    activations fit ``ACTIVATION_BUDGET_BYTES``."""
    rows = ACTIVATION_BUDGET_BYTES // max(per_row_bytes, 1) // multiple * multiple
    return max(multiple, min(rows, most))


def _rows(model: nn.Module, x: torch.Tensor, per_row_models: int, multiple: int, most: int) -> int:
    """Rows of ``x`` per forward: within the budget on a CPU (``per_row_models`` models see each
    row), ``most`` elsewhere or without rows."""
    if x.device.type != "cpu" or x.shape[0] == 0:
        return most
    return rows_within_budget(activation_bytes_per_sample(model, x[0]) * per_row_models, multiple, most)


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
    chunk_size: int | None = None,
    positions: SamplePositions | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-client mean loss and accuracy, each (K,); NaN for a client with no samples.

    ``index`` (K, max_n) holds client k's sample positions in ``x`` (valid below
    ``sizes[k]``). All clients' samples go through the model together, in chunks (of
    ``chunk_size`` rows, by default on a CPU as many as keep the activations within
    ``ACTIVATION_BUDGET_BYTES``, a multiple of 64), and the per-sample results are summed per
    client with ``index_add_``. ``positions``: the ``SamplePositions`` of ``index`` and ``sizes``
    when the caller keeps them (a round that evaluates the same clients as the last one).
    """
    num_clients = index.shape[0]
    if chunk_size is None:
        chunk_size = _rows(model, x, 1, 64, MAX_CHUNK_ROWS)
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
            losses, is_correct = cross_entropy_and_correct(logits, targets)
            loss_sum.index_add_(0, who, losses)
            correct.index_add_(0, who, is_correct)
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
    ``client_params``, (K, d)), each evaluated on client k's samples; vmap over clients (on a
    CPU, one client at a time: ``_evaluate_each_client``).

    ``weights`` (K, max_n), each row summing to 1 over the client's samples, gives a
    weighted mean instead (e.g. a shared test set re-weighted to the client's labels).
    A pass sums the losses of ``positions_per_pass`` samples per client (the sums' rounding is
    set by it)."""
    from torch.func import functional_call, vmap

    if x.device.type == "cpu":
        return _evaluate_each_client(model, layout, client_params, x, y, index, sizes, positions_per_pass, weights)
    num_clients, max_n = index.shape
    piece = _rows(model, x, min(clients_per_pass, num_clients), 8, positions_per_pass)
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
                logits = torch.cat([forward(params, x[samples[:, at:at + piece]])
                                    for at in range(0, samples.shape[1], piece)], dim=1).float()
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


def _evaluate_each_client(
    model: nn.Module,
    layout,
    client_params: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    index: torch.Tensor,
    sizes: torch.Tensor,
    positions_per_pass: int,
    weights: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``evaluate_clients_stacked`` on a CPU: each client's model in turn, a plain forward over
    its samples in pieces of as many rows (a multiple of 8) as keep the activations within
    ``ACTIVATION_BUDGET_BYTES``. vmap over K models turns each convolution into one over K
    times the channels with every model's activations live at once: 2-3x slower on a 2-core CPU
    for the MNIST CNN (CGSV's 10 agents on a shared test set of 1,000 images)."""
    from torch.func import functional_call

    rows = _rows(model, x, 1, 8, positions_per_pass)
    buffers = dict(model.named_buffers())
    loss_sum = torch.zeros(index.shape[0])
    correct = torch.zeros(index.shape[0])
    was_training = model.training
    model.eval()
    try:
        for client, size in enumerate(sizes.tolist()):
            params = layout.unflatten(client_params[client].to(x.dtype))
            for start in range(0, size, positions_per_pass):
                samples = index[client, start:min(start + positions_per_pass, size)]
                logits = torch.cat([functional_call(model, (params, buffers), (x[samples[at:at + rows]],))
                                    for at in range(0, samples.numel(), rows)]).float()
                losses, is_correct = cross_entropy_and_correct(logits, y[samples])
                if weights is not None:
                    share = weights[client, start:start + samples.numel()].to(losses.dtype)
                    losses, is_correct = torch.where(share > 0, losses, 0.0) * share, is_correct * share
                loss_sum[client] += losses.sum()
                correct[client] += is_correct.sum()
    finally:
        model.train(was_training)
    if weights is not None:
        return loss_sum, correct
    counts = sizes.to(loss_sum.dtype)
    return loss_sum / counts, correct / counts
