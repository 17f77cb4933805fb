"""Who takes part in a round: client sampling, simulated dropout and a malicious client.

Every draw is a pure function of (seed, round, purpose), so round t samples, drops and
shuffles the same clients whether the run was resumed or not.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from fl_lightning.core.payload import RoundPayload
from fl_lightning.core.settings import ClientId, FiniteNumber, OptionalAttack, SettingsGroup

# purposes of the per-round draws -> (multiplier of the round, offset) in round_seed's mix. The
# server-side ones serve algorithms that hold a validation set (its draw, once), estimate Shapley
# values from random orders, pick candidate clients, or order FedFV's projections at random (whose
# mix, seed * 1_000_003 + round, predates this table and is kept so its runs replay exactly)
_STREAMS = {
    "sampling": (7_919, 1 * 104_729), "dropout": (7_919, 2 * 104_729), "shuffle": (7_919, 3 * 104_729),
    "validation": (7_919, 11 * 104_729), "shapley_orders": (7_919, 12 * 104_729),
    "candidates": (7_919, 13 * 104_729), "projection_order": (1, 0),
}


def round_seed(seed: int, round_index: int, stream: str) -> int:
    """The seed of one purpose's draws in one round: a pure function of (seed, round, purpose)."""
    round_multiplier, offset = _STREAMS[stream]
    return (seed * 1_000_003 + round_index * round_multiplier + offset) % (2**63 - 1)


def round_generator(seed: int, round_index: int, stream: str) -> torch.Generator:
    """A CPU generator for one purpose in one round, independent of everything before."""
    return torch.Generator().manual_seed(round_seed(seed, round_index, stream))


def clients_per_round(num_clients: int, fraction: float) -> int:
    """m = max(1, round(C*K)): how many of the K clients a round with participation C takes."""
    return max(1, round(fraction * num_clients))


def participation_that_runs(num_clients: int, fraction: float) -> float:
    """m / K with m = ``clients_per_round(K, fraction)``: the participation a fit actually has;
    ``fraction`` itself where the two agree (0.1 of 100 clients), else the rounded one (0.1 of 3
    clients runs 1 client a round: 1/3)."""
    ran = clients_per_round(num_clients, fraction) / num_clients
    return fraction if abs(ran - fraction) < 1e-9 else ran


def sample_uniformly(seed: int, round_index: int, num_clients: int, fraction: float) -> torch.Tensor:
    """S_t: max(1, round(C*K)) of the K clients uniformly without replacement, sorted
    (McMahan et al., AISTATS 2017, Alg. 1)."""
    m = clients_per_round(num_clients, fraction)
    if m >= num_clients:
        return torch.arange(num_clients)
    chosen = torch.randperm(num_clients, generator=round_generator(seed, round_index, "sampling"))
    return chosen[:m].sort().values


def drop_clients(seed: int, round_index: int, sampled: torch.Tensor, dropout_prob: float) -> torch.Tensor:
    """The sampled clients that answer; each fails independently with ``dropout_prob``."""
    if dropout_prob == 0:
        return sampled
    draws = torch.rand(len(sampled), generator=round_generator(seed, round_index, "dropout"))
    return sampled[draws >= dropout_prob]


@dataclass(frozen=True)
class MaliciousClient(SettingsGroup):
    """One client that takes part in every round and lies (Hu et al., FedMGDA+, IEEE TNSE
    2022, Sec. 6.2.2): ``"bias"`` adds ``strength`` to the loss it reports; ``"scaling"``
    multiplies its loss, and so its update, by ``strength``."""

    kind: OptionalAttack  # None: no attacker (the module then builds none)
    client: ClientId = 0
    strength: FiniteNumber = 10.0

    LABELS: ClassVar[dict[str, str]] = {"kind": "attack", "client": "attack_client", "strength": "attack_strength"}

    def check(self, num_clients: int) -> None:
        """Refuses an attacker id that is not one of the federation's clients."""
        if self.client >= num_clients:
            raise ValueError(
                f"attack_client {self.client} is not a client: there are {num_clients} "
                f"(ids 0..{num_clients - 1}); set model.attack_client to one of them"
            )

    def joins(self, sampled: torch.Tensor) -> torch.Tensor:
        """The sampled clients with the attacker among them (sorted)."""
        if bool((sampled == self.client).any()):
            return sampled
        return torch.cat([sampled, torch.tensor([self.client])]).sort().values

    def corrupt(self, payload: RoundPayload) -> RoundPayload:
        """The attacker's report: its loss + b (bias), or its loss and update × s (scaling)."""
        row = payload.clients == self.client
        if not bool(row.any()):
            return payload
        # a round that did not compute the losses (an algorithm that does not read them) has none to lie about
        losses = None if payload.losses is None else payload.losses.clone()
        if self.kind == "bias":
            if losses is not None:
                losses[row] += self.strength
            return replace(payload, losses=losses)
        if losses is not None:
            losses[row] *= self.strength
        updates = payload.updates
        updates[row] *= self.strength  # J is this round's own tensor: scaled in place
        return replace(payload, losses=losses, updates=updates)
