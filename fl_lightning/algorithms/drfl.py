"""DRFL (Zhao & Joshi, ICASSP 2022, "A dynamic reweighting strategy for fair federated
learning"): every round the clients' models are averaged with weights that grow with their
training loss, p_i ∝ F_i^q, in place of FedAvg's data-size weights.

What is implemented is the description the FedLF appendix gives (Pan et al., AAAI 2024)
("a dynamic reweighting strategy", "weights ∝ loss^q"); the paper's biased client selection
is not (the core samples clients uniformly). With q = 1 this is what the FedLF repository
runs (weights ∝ loss, normalised)."""

from __future__ import annotations

from typing import Any

import torch

from fl_lightning.algorithms.registry import register_algorithm
from fl_lightning.core.module import FederatedModule, RoundPayload


@register_algorithm
class DRFL(FederatedModule):
    """w <- Σ_i p_i w_i with p_i = F_i^q / Σ_j F_j^q over S_t (F_i: training loss at w).

    Args:
        q: q >= 0; q = 0 is FedAvg with uniform weights, larger q favours the clients
            with the largest losses more (default 1.0, the FedLF repository's setting).
    """

    def __init__(self, *args: Any, q: float = 1.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not q >= 0:
            raise ValueError(f"q must be >= 0 (0 = uniform weights), got {q}")
        self.save_hyperparameters()

    def aggregate(self, payload: RoundPayload) -> torch.Tensor:
        weights = payload.losses.double().clamp(min=1e-10) ** self.hparams.q  # F_i^q
        weights = weights / weights.sum()  # p_i
        return weights.to(payload.updates.dtype) @ payload.updates  # w - Σ_i p_i w_i = Σ_i p_i g_i
