"""FedGini (Li, Zhao, Chen & Zheng, Information Sciences 619, 2023, "Heterogeneity-aware fair
federated learning"): a Gini penalty on the clients' losses.

The only description available here is FedLF's (appendix: "introducing a penalty term to
enhance fairness") and the FedLF repository's code: the paper's own definition could not be
found here (its text is not reachable from this project), so this is an interpretation,
documented as such: the server descends on the mean training loss of the round's clients
inflated by its Gini coefficient,

    P(w) = F̄ (1 + λ Gini(F)),   Gini(F) = Σ_i Σ_j |F_i - F_j| / (2 m² F̄),

i.e. F̄ + λ Σ_i Σ_j |F_i - F_j| / (2 m²). Its (sub)gradient is Σ_k c_k ∇F_k with

    c_k = (1/m) (1 + λ Σ_j sign(F_k - F_j) / m) = (1/m) (1 + λ (2 r_k - m - 1) / m),

r_k the ascending rank of F_k (ties share their mean rank). The c_k sum to 1 and stay
positive for λ <= 1, so the step is an average of the updates g_k (standing for ∇F_k, as
in every algorithm here) whose weights grow linearly with the loss rank.

``weighting="reference"`` reproduces the FedLF repository instead: rank weights
u_i = 1 + (1 - ε) i (i + 1) / D, i = 0..m-1, D = (m-1) m (m+1) / 3, normalised, the client at
position j taking u[argsort(-F)[j]] (a permutation index used as a rank, so which client
gets which weight depends on the order the clients arrive in).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
from pydantic import Field

from fl_lightning.algorithms.registry import register_algorithm
from fl_lightning.core import settings
from fl_lightning.core.module import FederatedModule, RoundPayload
from fl_lightning.records.algorithm_facts import INTERPRETATIONS

Weighting = Literal["gini", "reference"]


@register_algorithm
class FedGini(FederatedModule):
    """w <- w - Σ_k c_k g_k, c_k = ∂/∂F_k of F̄ (1 + λ Gini(F)) over the round's clients.

    Args:
        penalty: λ in [0, 1], the weight of the Gini penalty (0 = FedAvg with uniform
            weights; default 0.5, our choice: no paper value is available here).
        weighting: ``"gini"`` (the reading above) or ``"reference"`` (the FedLF code).
        epsilon: ε in [0, 1], the FedLF code's parameter (default 0.5, its default); used
            only with ``weighting="reference"``.
    """

    reads_training_losses = True  # the clients' losses at w before local training

    # Shown under FedGini's rows on the leaderboard (logged as the run tag algorithm_interpretation): the method as read
    # from secondary sources (the module docstring), not checked against its paper.
    interpretation = INTERPRETATIONS["FedGini"]

    def __init__(
        self,
        *args: Any,
        penalty: Annotated[settings.Proportion, Field(
            description="in [0, 1] (larger values make some weights negative)")] = 0.5,
        weighting: Weighting = "gini",
        epsilon: settings.Proportion = 0.5,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.save_hyperparameters()

    def aggregate(self, payload: RoundPayload) -> torch.Tensor:
        if self.hparams.weighting == "gini":
            weights = self.gini_weights(payload.training_losses())
        else:
            weights = self.reference_weights(payload.training_losses())
        return weights.to(payload.updates.dtype) @ payload.updates

    def gini_weights(self, losses: torch.Tensor) -> torch.Tensor:
        """c_k = (1/m)(1 + λ Σ_j sign(F_k - F_j) / m)."""
        F = losses.double()
        m = F.numel()
        rank_excess = torch.sign(F[:, None] - F[None, :]).sum(dim=1)  # 2 r_k - m - 1
        return (1 + self.hparams.penalty * rank_excess / m) / m

    def reference_weights(self, losses: torch.Tensor) -> torch.Tensor:
        """The FedLF repository's weights (see the module docstring)."""
        m = losses.numel()
        if m == 1:
            return torch.ones(1, dtype=torch.float64, device=losses.device)
        i = torch.arange(m, dtype=torch.float64, device=losses.device)
        u = 1 + (1 - self.hparams.epsilon) * i * (i + 1) / ((m - 1) * m * (m + 1) / 3)
        weights = u[torch.argsort(-losses.double())]
        return weights / weights.sum()
