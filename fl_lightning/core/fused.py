"""Hand-derived minibatch gradients of stacked feed-forward nets under mean cross-entropy.

For the fully connected models (``fl_logreg``, ``fl_mlp``, ``fl_ffn``: flatten ->
[Linear -> ReLU]* -> Linear) trained on each client's mean cross-entropy, a lockstep step of
m clients is a handful of batched matmuls. Autograd spends more time recording and walking its
graph than computing them (a logistic-regression step of 100 clients is ~10 us of arithmetic);
here the backward pass is written out:

    z_l = h_{l-1} W_lᵀ + b_l,  h_l = relu(z_l),  p = softmax(z_L)
    dz_L = (p - onehot(y)) · mask / n_valid           (each client's mean over its valid samples)
    dW_l = dz_lᵀ h_{l-1},  db_l = Σ_batch dz_l,  dz_{l-1} = (dz_l W_l) ⊙ [z_{l-1} > 0]

with every product a ``bmm`` over the client dimension. The result equals autograd's gradient
of ``masked_cross_entropy(...).sum()`` (``tests/test_fused.py``), so the engines still agree.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fl_lightning.models.mlp import FeedForwardNet

MEAN_CROSS_ENTROPY = "mean_cross_entropy"  # the attribute that marks a plain cross-entropy objective


def mean_cross_entropy_objective(objective: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Marks ``objective`` as exactly ``masked_cross_entropy`` of the logits (no other term), so
    that the engine may use hand-derived gradients. An override of a marked method is unmarked."""
    setattr(objective, MEAN_CROSS_ENTROPY, True)
    return objective


def is_mean_cross_entropy(objective: Callable[..., torch.Tensor]) -> bool:
    return bool(getattr(objective, MEAN_CROSS_ENTROPY, False))


class FeedForwardGradients:
    """Every client's gradient of its mean cross-entropy on one minibatch, for a stacked
    :class:`~fl_lightning.models.mlp.FeedForwardNet`.

    Call with the stacked parameters in ``names`` order ([a, ...] each), inputs ``x``
    [a, B, *input_shape], targets and mask [a, B]; returns the gradients in ``names`` order.
    """

    def __init__(self, model: FeedForwardNet, names: list[str]) -> None:
        linears = [(f"features.{key}", layer) for key, layer in model.features.named_children()
                   if isinstance(layer, nn.Linear)] + [("fc", model.fc)]
        position = {name: i for i, name in enumerate(names)}
        expected = [f"{prefix}.{kind}" for prefix, _ in linears for kind in ("weight", "bias")]
        if sorted(expected) != sorted(position):
            raise ValueError(f"the trained parameters {sorted(position)} are not every Linear layer's weight "
                             f"and bias {sorted(expected)} (a frozen or missing parameter)")
        self.layers = [(position[f"{prefix}.weight"], position[f"{prefix}.bias"]) for prefix, _ in linears]
        self._minus_one = torch.empty(0)  # -1s to subtract onehot(y), kept between steps

    def __call__(self, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                 mask: torch.Tensor, weights: torch.Tensor | None = None) -> list[torch.Tensor]:
        """``weights`` [a, B, 1]: ``mask`` over each client's count of valid samples, when the
        caller has it already (``core.engines.lockstep_batches``)."""
        h = x.reshape(x.shape[0], x.shape[1], -1)  # [a, B, in]
        inputs: list[torch.Tensor] = []
        for w, b in self.layers:
            inputs.append(h)
            h = torch.baddbmm(params[b].unsqueeze(1), h, params[w].transpose(1, 2))
            if len(inputs) < len(self.layers):
                h = torch.relu(h)
        delta = torch.softmax(h, dim=-1)
        a, batch = y.shape
        minus_one = self._minus_one
        if (minus_one.shape[0] < a or minus_one.shape[1] < batch or minus_one.dtype != delta.dtype
                or minus_one.device != delta.device):
            minus_one = self._minus_one = torch.full((a, batch, 1), -1.0, dtype=delta.dtype, device=delta.device)
        delta.scatter_add_(-1, y.unsqueeze(-1), minus_one[:a, :batch])
        if weights is None:
            weights = (mask / mask.sum(dim=1, keepdim=True).clamp(min=1)).unsqueeze(-1)
        delta.mul_(weights)
        grads: list[torch.Tensor] = [torch.empty(0)] * len(params)
        for depth in reversed(range(len(self.layers))):
            w, b = self.layers[depth]
            grads[w] = torch.bmm(delta.transpose(1, 2), inputs[depth])  # [a, out, in], W's layout
            grads[b] = delta.sum(dim=1)
            if depth:
                delta = torch.bmm(delta, params[w]).mul_(inputs[depth] > 0)  # relu'(z) = [h > 0]
        return grads


def feedforward_gradients(model: nn.Module, names: list[str], objective: Callable[..., torch.Tensor],
                          autocast: str | None) -> tuple[FeedForwardGradients | None, str | None]:
    """The hand-derived gradients for ``model`` and ``objective``, or (None, why not)."""
    if not isinstance(model, FeedForwardNet):
        return None, f"{type(model).__name__} is not a FeedForwardNet"
    if not is_mean_cross_entropy(objective):
        return None, "the client objective is not the plain mean cross-entropy"
    if autocast is not None:
        return None, f"autocast={autocast!r}"
    try:
        return FeedForwardGradients(model, names), None
    except ValueError as error:
        return None, str(error)
