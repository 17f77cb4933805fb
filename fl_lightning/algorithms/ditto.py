"""Ditto (Li, Hu, Beirami & Smith, ICML 2021, Alg. 1): FedAvg plus a personal model per client.

Round t, every sampled client k:
  line 5: w_k ← local SGD on F_k from the global w^t (FedAvg's local solver); uploads w^t − w_k;
  line 7: v_k ← v_k − η (∇F_k(v_k) + λ (v_k − w^t)) for the same local steps, i.e. SGD on
          h_k(v_k; w^t) = F_k(v_k) + (λ/2) ||v_k − w^t||², the prox pulling towards the
          CURRENT global model;
  line 9: the server aggregates the uploads as FedAvg does.
Fairness and accuracy are measured on the personal models v_k (a (K, d) buffer, v_k^0 = w^0).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.algorithms.registry import register_algorithm
from fl_lightning.core import settings
from fl_lightning.core.local import with_proximal_term
from fl_lightning.core.module import GLOBAL_MODEL, RoundContext, RoundPayload, ServerStep
from fl_lightning.core.payload import as_server_step


@register_algorithm
class Ditto(FedAvg):
    """FedAvg whose clients also train personal models v_k with a prox to the global w.

    Args:
        lam: λ, the weight of (λ/2)||v_k − w^t||² in the personal objective (default 0.1;
            λ = 0: purely local personal models; λ → ∞: v_k stays at w^t). SGD on the prox
            alone diverges when λ·lr ≥ 2(1 + momentum), which is refused.
        **kwargs: everything ``FedAvg`` takes.

    The personal pass runs ``local_train`` from the stacked v_k with the global model as
    anchor and ``personal_objective`` (the prox added), so the global pass is FedAvg's
    exactly. Both passes of a round see the same minibatches.
    """

    # registered buffers and per-client state (typed for the checker; nn.Module holds them)
    personal_models: torch.Tensor

    def __init__(self, *args: Any, lam: settings.Penalty = 0.1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)  # checks lam >= 0 (its type) with the others
        if lam * self.hparams.lr >= 2 * (1 + self.hparams.momentum):
            raise ValueError(
                f"lam * lr = {lam * self.hparams.lr:g} makes the personal SGD diverge (the prox term "
                f"alone needs lam * lr < 2 (1 + momentum) = {2 * (1 + self.hparams.momentum):g}): "
                "lower lam or lr"
            )
        self.save_hyperparameters()
        self.register_client_state("personal_models", init=GLOBAL_MODEL)  # v_k^0 = w^0

    def personal_objective(self, logits, targets, mask, local_params, global_params) -> torch.Tensor:
        """h_k(v_k; w^t) = F_k(v_k) + (λ/2) ||v_k − w^t||² for every client's row."""
        loss = self.client_objective(logits, targets, mask, local_params, global_params)
        return with_proximal_term(loss, self.hparams.lam, local_params, global_params, tuple(global_params))

    def train_clients(self, context: RoundContext, shards: Any) -> torch.Tensor:
        updates = super().train_clients(context, shards)  # line 5: w_k from w^t, FedAvg's upload
        clients = shards.clients
        start = context.layout.unflatten_stacked(self.personal_models[clients])
        personal = context.local_train(shards, start=start, anchor=context.global_params,  # w^t
                                       objective=self.personal_objective)  # line 7: the same local steps on h_k
        self.personal_models[clients] = context.layout.flatten_stacked(personal)
        return updates

    def aggregate(self, payload: RoundPayload) -> ServerStep:
        """FedAvg's step for w, with the personal models' mean distance ||v_k − w^t|| logged."""
        drift = (self.personal_models[payload.clients] - payload.context.global_vector).norm(dim=1)
        step = as_server_step(super().aggregate(payload))
        return replace(step, metrics=step.metrics | {"ditto_personal_distance_mean": float(drift.mean())})

    def evaluation_params(self) -> torch.Tensor:
        return self.personal_models
