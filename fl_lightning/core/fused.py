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
of ``masked_cross_entropy(...).sum()`` (``tests/fl_lightning/core/test_fused.py``), so the engines still agree.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from fl_lightning.core.kernels import softmax_last
from fl_lightning.models.mlp import FeedForwardNet

MEAN_CROSS_ENTROPY = "mean_cross_entropy"  # the attribute that marks a plain cross-entropy objective


def mean_cross_entropy_objective(objective: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Marks ``objective`` as exactly ``masked_cross_entropy`` of the logits (no other term), so
    that the engine may use hand-derived gradients. An override of a marked method is unmarked."""
    setattr(objective, MEAN_CROSS_ENTROPY, True)
    return objective


def is_mean_cross_entropy(objective: Callable[..., torch.Tensor]) -> bool:
    return bool(getattr(objective, MEAN_CROSS_ENTROPY, False))


def mean_weights(mask: torch.Tensor) -> torch.Tensor:
    """[..., B, 1]: each client's mask over its number of valid samples in the batch, the
    weights of its mean cross-entropy (0 where a client has none)."""
    return (mask / mask.sum(dim=-1, keepdim=True).clamp(min=1)).unsqueeze(-1)


class FeedForwardGradients:
    """Every client's gradient of its mean cross-entropy on one minibatch, for a stacked
    :class:`~fl_lightning.models.mlp.FeedForwardNet`.

    Call with the parameters in ``names`` order: stacked [a, ...] each, with inputs ``x``
    [a, B, *input_shape], targets and mask [a, B] (a lockstep step of a clients); or one
    client's own [...] each, with ``x`` [B, *input_shape], targets and mask [B] (the steps a
    client takes alone at the end of an epoch: 2-D products, no client dimension). Returns the
    gradients in ``names`` order, shaped as the parameters.
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
        self.num_classes = model.fc.out_features

    def layer_views(self, params: list[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """Per Linear layer: W, Wᵀ and the bias shaped for the product. They are views, current
        while ``params`` are updated in place, so a caller may make them once for many steps."""
        stacked = params[self.layers[0][0]].dim() == 3
        return [(params[w], params[w].transpose(-1, -2), params[b].unsqueeze(1) if stacked else params[b])
                for w, b in self.layers]

    def negative_targets(self, y: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """-onehot(y) · weights, [..., B, classes]: what a step adds to its weighted softmax."""
        onehot = torch.zeros(*y.shape, self.num_classes, dtype=weights.dtype, device=weights.device)
        return onehot.scatter_(-1, y.unsqueeze(-1), weights.neg())

    def __call__(self, params: list[torch.Tensor], x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor,
                 weights: torch.Tensor | None = None) -> list[torch.Tensor]:
        """``weights`` [a, B, 1] (or [B, 1]): ``mask`` over each client's count of valid samples,
        when the caller has it already."""
        if weights is None:
            weights = mean_weights(mask)
        return self.step(params, x, self.negative_targets(y, weights), weights, self.layer_views(params))

    def step(self, params: list[torch.Tensor], x: torch.Tensor, negative_targets: torch.Tensor,
             weights: torch.Tensor, views: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
        """The gradients from ``negative_targets(y, weights)`` and ``layer_views(params)``, which a
        caller may make once for many steps (``core.engines.fused_epoch``)."""
        affine, product = (torch.baddbmm, torch.bmm) if weights.dim() == 3 else (torch.addmm, torch.mm)
        h = x if x.dim() == weights.dim() else x.reshape(*weights.shape[:-1], -1)  # [a, B, in] or [B, in]
        inputs: list[torch.Tensor] = []
        for _, transposed, bias in views:
            inputs.append(h)
            h = affine(bias, h, transposed)
            if len(inputs) < len(views):
                h = torch.relu(h)
        delta = torch.addcmul(negative_targets, softmax_last(h), weights)  # (p - onehot(y)) · weights
        grads: list[torch.Tensor] = list(params)  # each entry replaced below
        for depth in reversed(range(len(self.layers))):
            w, b = self.layers[depth]
            grads[w] = product(delta.transpose(-1, -2), inputs[depth])  # [(a,) out, in], W's layout
            grads[b] = delta.sum(dim=-2)
            if depth:
                delta = product(delta, views[depth][0]).mul_(inputs[depth] > 0)  # relu'(z) = [h > 0]
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
