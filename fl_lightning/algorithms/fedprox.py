"""FedProx (Li et al. 2020): FedAvg whose clients minimise F_i(w_i) + (mu/2)||w_i - w||^2."""

from __future__ import annotations

from typing import Any

import torch

from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.algorithms.registry import register_algorithm
from fl_lightning.core import settings
from fl_lightning.core.local import with_proximal_term


@register_algorithm
class FedProx(FedAvg):
    """FedAvg with a proximal term in every client's local objective (FedProx eq. 2).

    Args:
        mu: weight of the proximal term (default 0.1; mu = 0 is exactly FedAvg).
    """

    def __init__(self, *args: Any, mu: settings.Penalty = 0.1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.save_hyperparameters()

    def client_objective(self, logits, targets, mask, local_params, global_params) -> torch.Tensor:
        loss = super().client_objective(logits, targets, mask, local_params, global_params)
        return with_proximal_term(loss, self.hparams.mu, local_params, global_params, tuple(global_params))
