"""AFL (Mohri, Sivek & Suresh, ICML 2019, "Agnostic federated learning"): the minimax problem
min_w max_{λ ∈ Δ} Σ_k λ_k F_k(w), solved by simultaneous stochastic gradient steps on w and λ."""

from __future__ import annotations

from typing import Any

import torch

from fl_lightning.core.module import FederatedModule, RoundPayload
from fl_lightning.core.qp import simplex_projection


class AFL(FederatedModule):
    """Agnostic FL: descend on w along Σ_k λ_k ∇F_k, ascend on λ along the losses F.

    Every client takes part in every round (K is small: AFL treats each client as a domain).
    Per round t, with λ indexed by client id and F_k the training loss at w:
        ∇F_k ≈ g_k / lr                    (the local update as a gradient estimate)
        w <- w - γ_w Σ_k λ_k g_k / lr
        λ <- Proj_Δ(λ + γ_λ F)             (both steps use w and λ before the round)
    Evaluation uses the running average of the iterates w_1, ..., w_t (``averaged_model``),
    AFL's output. Clients missing from a round (dropped, non-finite update) add nothing
    to either step.

    Args:
        lr_lambda: γ_λ > 0, the step size of λ (FedFV's grid {0.01, 0.1, 0.5}; default 0.1).
        lr_w: γ_w > 0, or None for this round's local lr, which makes the w step
            Σ_k λ_k g_k (the FedLF code's choice).
    The base ``fraction`` defaults to 1.0 here; anything lower is refused when fit starts.
    (γ_w is not called ``server_lr``: FedAvg's ``server_lr`` = 1.0 would carry over when a
    config switches ``--model`` from FedAvg to AFL, and a γ_w of 1/lr times the update diverges.)
    """

    def __init__(self, *args: Any, lr_lambda: float = 0.1, lr_w: float | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("fraction", 1.0)
        super().__init__(*args, **kwargs)
        if not lr_lambda > 0:
            raise ValueError(f"lr_lambda must be > 0 (FedFV's grid: 0.01, 0.1, 0.5), got {lr_lambda}")
        if lr_w is not None and not lr_w > 0:
            raise ValueError(f"lr_w must be > 0, or null for the local learning rate, got {lr_w}")
        self.save_hyperparameters()
        self.register_buffer("averaged_model", torch.zeros(self.layout.num_parameters))  # w̄_t
        self.register_buffer("num_averaged", torch.zeros((), dtype=torch.long))
        self.register_client_state("mixture", init=lambda k: torch.full((k,), 1.0 / k))  # λ, uniform

    def on_fit_start(self) -> None:
        super().on_fit_start()
        if self.hparams.fraction < 1:
            raise ValueError(
                f"AFL needs every client in every round, but fraction = {self.hparams.fraction}: "
                "set fraction: 1.0"
            )

    def aggregate(self, payload: RoundPayload) -> torch.Tensor:
        lr = self.round_lr(payload.round)
        lr_w = self.hparams.lr_w or lr
        gradients = payload.updates / lr  # ∇F_k ≈ g_k / lr
        weights = self.mixture[payload.clients].to(gradients.dtype)  # λ_k by client id
        return lr_w * (weights @ gradients)  # γ_w Σ_k λ_k ∇F_k

    def on_round_end(self, payload: RoundPayload, server_step: torch.Tensor) -> None:
        losses = torch.zeros_like(self.mixture)
        losses[payload.clients] = payload.losses.to(losses.dtype)  # F, indexed by client id
        self.mixture.copy_(simplex_projection(self.mixture + self.hparams.lr_lambda * losses))
        self.num_averaged += 1  # w̄_t = w̄_{t-1} + (w_t - w̄_{t-1}) / t
        self.averaged_model += (self.global_vector().to(self.averaged_model.dtype) - self.averaged_model) / self.num_averaged

    def evaluation_params(self) -> torch.Tensor | None:
        return self.averaged_model if int(self.num_averaged) > 0 else None
