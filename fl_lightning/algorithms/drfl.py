"""DRFL (Zhao & Joshi, ICASSP 2022, "A dynamic reweighting strategy for fair federated
learning"): every round the clients' models are averaged with weights that grow with their
training loss, p_i ∝ F_i^q, in place of FedAvg's data-size weights.

The weights follow the description the FedLF appendix gives (Pan et al., AAAI 2024) ("a
dynamic reweighting strategy", "weights ∝ loss^q"); with q = 1 this is what the FedLF
repository runs (weights ∝ loss, normalised).

The paper combines them with "a biased client selection strategy" (its abstract); its text was
not reachable here. ``selection="loss_aware"`` is the power-of-choice rule of Cho, Wang & Joshi
("Client selection in federated learning: convergence analysis and power-of-choice selection
strategies", 2020), the biased selection of Joshi's group that DRFL builds on: draw d candidate
clients without replacement with probabilities ∝ their data sizes, evaluate each one's training
loss at the current global model, and take the m = round(C K) with the largest losses.
``selection="uniform"`` (default) samples m clients uniformly, as every other algorithm."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import torch
from pydantic import Field

from fl_lightning.algorithms.registry import register_algorithm
from fl_lightning.core import settings
from fl_lightning.core.module import FederatedModule, RoundContext, RoundPayload
from fl_lightning.core.simulation import clients_per_round, round_generator

Selection = Literal["uniform", "loss_aware"]


@register_algorithm
class DRFL(FederatedModule):
    """w <- Σ_i p_i w_i with p_i = F_i^q / Σ_j F_j^q over S_t (F_i: training loss at w).

    Args:
        q: q >= 0; q = 0 is FedAvg with uniform weights, larger q favours the clients
            with the largest losses more (default 1.0, the FedLF repository's setting).
        selection: ``"uniform"`` or ``"loss_aware"`` (power-of-choice, module docstring).
        num_candidates: d, the candidates of ``"loss_aware"`` (m <= d <= K); None: 2m, at most K.
    """

    reads_training_losses = True  # the clients' losses at w before local training

    def __init__(
        self,
        *args: Any,
        q: Annotated[settings.Exponent, Field(description=">= 0 (0 = uniform weights)")] = 1.0,
        selection: Selection = "uniform",
        num_candidates: Annotated[settings.Count | None, Field(
            description=">= 1 (d), or null for twice the clients per round")] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.save_hyperparameters()

    def sample_clients(self, context: RoundContext) -> torch.Tensor:
        """S_t: uniform, or the m highest-loss of d candidates drawn ∝ data size (power of choice)."""
        if self.hparams.selection == "uniform":
            return super().sample_clients(context)
        num_clients = context.num_clients_total
        m = clients_per_round(num_clients, self.hparams.fraction)
        d = min(num_clients, self.hparams.num_candidates or 2 * m)
        if d < m:
            raise ValueError(f"num_candidates={d} is below the {m} clients a round takes (fraction="
                             f"{self.hparams.fraction} of {num_clients}): set num_candidates >= {m}")
        sizes = context.train_sizes.cpu().double()
        draw = round_generator(self.hparams.seed, context.round, "candidates")
        candidates = torch.multinomial(sizes, d, replacement=False, generator=draw).sort().values
        return self.highest_losses(candidates, self.candidate_losses(context, candidates), m)

    def candidate_losses(self, context: RoundContext, candidates: torch.Tensor) -> torch.Tensor:
        """F_k(w): each candidate's training loss at the current global model."""
        shards = context.client_shards(candidates)
        losses, _ = context.evaluator.shared(self.model, (shards.x, shards.y, shards.index, shards.sizes))
        return losses.cpu()

    @staticmethod
    def highest_losses(candidates: torch.Tensor, losses: torch.Tensor, m: int) -> torch.Tensor:
        """The m candidates with the largest losses (ties: the lower id), sorted."""
        order = torch.argsort(-losses.double(), stable=True)
        return candidates[order[:m]].sort().values

    def aggregate(self, payload: RoundPayload) -> torch.Tensor:
        weights = payload.training_losses().double().clamp(min=1e-10) ** self.hparams.q  # F_i^q
        weights = weights / weights.sum()  # p_i
        return weights.to(payload.updates.dtype) @ payload.updates  # w - Σ_i p_i w_i = Σ_i p_i g_i
