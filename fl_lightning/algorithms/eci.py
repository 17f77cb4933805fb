"""ECI: the extended contribution index, CGSV's validation-Shapley baseline (Xu et al., NeurIPS
2021, Sec. 4.1: "an extended contribution index (ECI) method from [Song et al. 2019] utilizing
validation accuracy-based SV and setting q_i in (5) proportional to the agents' CIs").

Round t, every agent i of N with its own model w_i (as CGSV's agents):
  1. agent i trains from w_i and uploads Δw_i;
  2. contribution index (Song, Tong & Wei, "Profit allocation for federated learning", IEEE
     BigData 2019, the multi-round reconstruction): a coalition S is worth the validation
     accuracy of the server model moved by its members' FedAvg,
        ν(S) = acc_V(w + Σ_{i∈S} n_i Δw_i / Σ_{i∈S} n_i),   ν(∅) = acc_V(w),
     and φ_i is its Shapley value, estimated from ``num_permutations`` random orders drawn
     from the seed and the round (Wang et al. 2020, Maleki et al. 2013), or exact (2^N);
  3. r_i ← α r_i + (1 − α) φ_i, clamped at 1e-3 and normalised (CGSV eq. (4), the moving
     average CGSV App. B.3 applies to its baselines);
  4. w ← w + Δw_N, Δw_N = Σ_i n_i Δw_i / Σ_j n_j (FedAvg);
  5. reward: agent i downloads the ⌊D r_i / max_j r_j⌋ largest-magnitude entries of Δw_N
     (q_i of CGSV eq. (5) proportional to the CIs): w_i ← w_i + mask(Δw_N, q_i).

V is ``ValidatedAgents``' validation set: a share of every agent's training samples held by the
server, never trained on and never tested on (``validation_fraction``).

Round 0 dominates r: r starts at 0 and step 3 normalises it to sum 1 every round, while the
φ_i sum to ν(N) − ν(∅), the round's validation-accuracy gain, large in round 0 and small
later. So round 0's φ becomes all of r, and each later round keeps α / (α + (1 − α) Σ_i φ_i)
of it: with α = 0.95 and gains of 0.01 a round, r is still 95 % round 0's after 100 rounds.
"""

from __future__ import annotations

from typing import Annotated, Any

import torch
from pydantic import Field

from fl_lightning.algorithms.agents import ValidatedAgents, top_magnitude_mask
from fl_lightning.algorithms.registry import register_algorithm
from fl_lightning.core import settings
from fl_lightning.core.module import RoundPayload, ServerStep
from fl_lightning.core.simulation import round_generator
from fl_lightning.metrics.shapley import MAX_EXACT_AGENTS, exact_shapley, sampled_shapley
from fl_lightning.records.algorithm_facts import INTERPRETATIONS


@register_algorithm
class ECI(ValidatedAgents):
    """Rewards proportional to validation-accuracy Shapley values (see the module docstring).

    Args:
        num_permutations: random orders per round for the Shapley estimate (each values up to
            N + 1 coalitions on V); ``None``: exact, 2^N coalitions (N <= 10).
        alpha: α, the weight of the previous contribution index (CGSV: 0.95).
        **kwargs: ``validation_fraction`` (see ``ValidatedAgents``) and the base class's.

    Logged every round: ``eci_r/<i>``, ``eci_phi/<i>`` (N ≤ 20), and their min/mean/max.
    """

    # Shown under ECI's rows on the leaderboard (logged as the run tag algorithm_interpretation).
    interpretation = INTERPRETATIONS["ECI"]

    # registered buffers and per-client state (typed for the checker; nn.Module holds them)
    r: torch.Tensor
    phi: torch.Tensor

    def __init__(
        self,
        *args: Any,
        num_permutations: Annotated[settings.Count | None, Field(
            description=">= 1, or null for the exact Shapley value")] = 20,
        alpha: Annotated[settings.Probability, Field(
            description="in [0, 1) (CGSV uses 0.95; 1 would never update r)")] = 0.95,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.save_hyperparameters()
        self.register_client_state("r", dtype=torch.float64)  # r_i, the contribution index
        self.register_client_state("phi", dtype=torch.float64)  # φ_i of the last round

    def aggregate(self, payload: RoundPayload) -> ServerStep:
        n = payload.num_samples.double()
        step = (n / n.sum()).to(payload.updates.dtype) @ payload.updates  # −Δw_N (rows are −Δw_i)
        phi = self.shapley(payload)
        r, phi_all = self.r.clone(), torch.zeros_like(self.phi)
        phi_all[payload.clients] = phi
        r[payload.clients] = self.hparams.alpha * r[payload.clients] + (1 - self.hparams.alpha) * phi
        r = r.clamp(min=1e-3)
        return ServerStep(step, new_state={"r": r / r.sum(), "phi": phi_all})

    def shapley(self, payload: RoundPayload) -> torch.Tensor:
        """φ_i of the round's agents under ν(S) = validation accuracy of w + FedAvg of S."""
        w, n, deltas = payload.context.global_vector, payload.num_samples.double(), -payload.updates
        m = payload.num_clients

        def value(members: torch.Tensor) -> torch.Tensor:
            weights = members.to(n.device).double() * n
            weights = weights / weights.sum(dim=1, keepdim=True).clamp(min=1)  # ∅: no move
            return self.validation_accuracy(payload.context, w + weights.to(deltas.dtype) @ deltas)

        if self.hparams.num_permutations is None:
            if m > MAX_EXACT_AGENTS:
                raise ValueError(f"ECI with num_permutations=null values all 2^N coalitions and takes N <= "
                                 f"{MAX_EXACT_AGENTS} agents, got {m}: set num_permutations (e.g. 20)")
            return exact_shapley(value, m).to(n.device)
        orders = round_generator(self.hparams.seed, payload.round, "shapley_orders")
        return sampled_shapley(value, m, self.hparams.num_permutations, orders).to(n.device)

    def on_round_end(self, payload: RoundPayload, server_step: torch.Tensor) -> dict[str, float]:
        ratios = (self.r / self.r.max())[payload.clients]  # q_i / D = r_i / max_j r_j
        keep = top_magnitude_mask(-server_step, ratios)
        self.agent_models[payload.clients] += (-server_step) * keep  # w_i ← w_i + mask(Δw_N, q_i)
        agents = range(len(self.r))
        return self.per_agent_metrics({"eci_r": (self.r, agents), "eci_phi": (self.phi, agents)})
