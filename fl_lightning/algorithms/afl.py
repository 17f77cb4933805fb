"""AFL (Mohri, Sivek & Suresh, ICML 2019, "Agnostic federated learning"): the minimax problem
min_w max_{λ ∈ Δ} Σ_k λ_k F_k(w), solved by simultaneous stochastic gradient steps on w and λ."""

from __future__ import annotations

from typing import Annotated, Any

import torch
from pydantic import Field

from fl_lightning.algorithms.agents import MAX_LOGGED_AGENTS
from fl_lightning.algorithms.qp import simplex_projection
from fl_lightning.algorithms.registry import register_algorithm
from fl_lightning.core import settings
from fl_lightning.core.module import FederatedModule, RoundPayload, ServerStep
from fl_lightning.records.vocabulary import FRACTION, FULL_PARTICIPATION, Metric, agent_metric


@register_algorithm
class AFL(FederatedModule):
    """Agnostic FL: descend on w along Σ_k λ_k ∇F_k, ascend on λ along the losses F.

    Every client takes part in every round (K is small: AFL treats each client as a domain).
    Per round t, with λ indexed by client id and F_k the training loss at w:
        ∇F_k ≈ g_k / lr_t                  (the local update as a gradient estimate)
        w <- w - γ_w Σ_k λ_k g_k / lr_t,   γ_w = server_lr · lr_t
        λ <- Proj_Δ(λ + γ_λ F)             (both steps use w and λ before the round)
    Evaluation uses the running average of the iterates w_1, ..., w_t (``averaged_model``),
    AFL's output. Clients missing from a round (dropped, non-finite update) add nothing
    to either step. Logged every round: the mixture λ the round's step used, ``afl_lambda/<k>``
    (K ≤ 20) and ``afl_lambda_max``, which show where the adversary of a bias attack (FedMGDA+,
    Hu et al., IEEE TNSE 2022, Sec. 6.2.2) pulls the weight.

    Args:
        lr_lambda: γ_λ > 0, the step size of λ (FedFV's grid {0.01, 0.1, 0.5}; default 0.1).
        server_lr: γ_w as a multiple of the round's local lr, > 0 (as FedAvg's ``server_lr``:
            1.0 makes the w step Σ_k λ_k g_k, the FedLF code's choice).
        fraction: 1.0 here (every client every round); anything lower is refused
            (``needs_every_client``).
    """

    needs_every_client = True
    reads_training_losses = True  # F_k(w), the domains' losses

    # registered buffers and per-client state (typed for the checker; nn.Module holds them)
    averaged_model: torch.Tensor
    num_averaged: torch.Tensor
    mixture: torch.Tensor

    def __init__(
        self,
        *args: Any,
        lr_lambda: Annotated[settings.StepSize, Field(description="> 0 (FedFV's grid: 0.01, 0.1, 0.5)")] = 0.1,
        server_lr: Annotated[
            settings.StepSize, Field(description="> 0 (a multiple of the local lr; 1.0 = Σ λ_k g_k)")] = 1.0,
        fraction: settings.Participation = FULL_PARTICIPATION,
        **kwargs: Any,
    ) -> None:
        kwargs[FRACTION] = fraction
        super().__init__(*args, **kwargs)
        self.save_hyperparameters()
        self.register_buffer("averaged_model", torch.zeros(self.num_parameters))  # w̄_t
        self.register_buffer("num_averaged", torch.zeros((), dtype=torch.long))
        self.register_client_state("mixture", init=lambda k: torch.full((k,), 1.0 / k))  # λ, uniform

    def aggregate(self, payload: RoundPayload) -> ServerStep:
        weights = self.mixture[payload.clients].to(payload.updates.dtype)  # λ_k by client id
        # γ_w Σ_k λ_k ∇F_k = server_lr · lr_t Σ_k λ_k g_k / lr_t
        return ServerStep(self.hparams.server_lr * (weights @ payload.updates), metrics=self.mixture_metrics())

    def mixture_metrics(self) -> dict[str, float | torch.Tensor]:
        mixture = self.mixture.detach().cpu()
        metrics: dict[str, float | torch.Tensor] = {Metric.AFL_LAMBDA_MAX: float(mixture.max())}
        if mixture.numel() <= MAX_LOGGED_AGENTS:
            metrics |= {agent_metric(Metric.AFL_LAMBDA, k): float(v) for k, v in enumerate(mixture.tolist())}
        return metrics

    def on_round_end(self, payload: RoundPayload, server_step: torch.Tensor) -> None:
        losses = torch.zeros_like(self.mixture)
        losses[payload.clients] = payload.training_losses().to(losses.dtype)  # F, indexed by client id
        self.mixture.copy_(simplex_projection(self.mixture + self.hparams.lr_lambda * losses))
        self.num_averaged += 1  # w̄_t = w̄_{t-1} + (w_t - w̄_{t-1}) / t
        self.averaged_model += (
            payload.context.global_vector.to(self.averaged_model.dtype) - self.averaged_model
        ) / self.num_averaged

    def evaluation_params(self) -> torch.Tensor | None:
        return self.averaged_model if int(self.num_averaged) > 0 else None
