"""FedAvg (McMahan et al. 2017, Alg. 1): the server averages the client updates by data size."""

from __future__ import annotations

from typing import Any

import torch

from fl_lightning.algorithms.registry import register_algorithm
from fl_lightning.core import settings
from fl_lightning.core.module import FederatedModule, RoundPayload, ServerStep


@register_algorithm
class FedAvg(FederatedModule):
    """w <- w - eta_g * sum_i p_i g_i with p_i = n_i / sum_{j in S_t} n_j.

    Args:
        server_lr: eta_g, the server learning rate (1.0 = plain model averaging).
        **kwargs: everything ``FederatedModule`` takes (data, model, local SGD, rounds).
    """

    def __init__(self, *args: Any, server_lr: settings.StepSize = 1.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.save_hyperparameters()

    def aggregate(self, payload: RoundPayload) -> ServerStep | torch.Tensor:
        weights = payload.num_samples.to(payload.updates.dtype)
        weights = weights / weights.sum()  # p_i = n_i / n
        return self.hparams.server_lr * (weights @ payload.updates)
