"""q-FedAvg (Li, Sanjabi, Beirami & Smith, ICLR 2020, "Fair resource allocation in federated
learning"), Algorithm 2: the server step of q-FFL, min_w Σ_k p_k F_k(w)^(q+1) / (q+1)."""

from __future__ import annotations

from typing import Annotated, Any

import torch
from pydantic import Field

from fl_lightning.algorithms.registry import register_algorithm
from fl_lightning.core import settings
from fl_lightning.core.module import FederatedModule, RoundPayload


@register_algorithm
class QFedAvg(FederatedModule):
    """q-FedAvg: clients with larger losses F_k get larger steps.

    With F_k the training loss at w (+1e-10), L the Lipschitz estimate and Δw_k = L g_k:
        Δ_k = F_k^q Δw_k,   h_k = q F_k^(q-1) ||Δw_k||² + L F_k^q,   w <- w - Σ_k Δ_k / Σ_k h_k.
    q = 0 gives h_k = L and the step (1/m) Σ_k g_k: FedAvg with uniform weights.

    Args:
        q: q >= 0, the fairness parameter (paper grids {0.1, 0.2, 1, 2, 5, 15}; default 1.0,
            a middle value of that grid: the papers give no single default).
        lipschitz: L > 0, or None for L = 1 / (this round's local lr), as the q-FFL code does.
    """

    reads_training_losses = True  # the clients' losses at w before local training

    def __init__(
        self,
        *args: Any,
        q: Annotated[settings.Exponent, Field(description=">= 0 (0 = FedAvg with uniform weights)")] = 1.0,
        lipschitz: Annotated[settings.Scale | None, Field(
            description="> 0, or null for 1 / the local learning rate")] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.save_hyperparameters()

    def aggregate(self, payload: RoundPayload) -> torch.Tensor:
        q = self.hparams.q
        L = self.hparams.lipschitz or 1.0 / payload.context.lr
        updates = payload.updates
        F = payload.training_losses().double() + 1e-10  # F_k(w^t)
        squared_norms = L**2 * updates.double().pow(2).sum(dim=1)  # ||Δw_k||² = ||L g_k||²
        h = q * F ** (q - 1) * squared_norms + L * F**q  # h_k
        coefficients = L * F**q / h.sum()  # Δ_k / Σ h = (F_k^q L / Σ h) g_k
        return coefficients.to(updates.dtype) @ updates
