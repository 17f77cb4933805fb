"""What a round hands an algorithm (``RoundPayload``) and what the algorithm hands back
(``ServerStep``): the two halves of the contract between ``FederatedModule`` and an algorithm."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from fl_lightning.core.local import ClientShards


@dataclass
class RoundPayload:
    """What the answering clients of round t upload (rows aligned across fields)."""

    round: int
    clients: torch.Tensor  # (m,) client ids
    updates: torch.Tensor  # (m, d) g_i = w - w_i
    losses: torch.Tensor  # (m,) training loss at w, before local training
    accuracies: torch.Tensor  # (m,) training accuracy at w, before local training
    num_samples: torch.Tensor  # (m,) n_i
    shards: ClientShards | None = None  # the clients' training data (for extra evaluations)

    @property
    def num_clients(self) -> int:
        return int(self.clients.shape[0])

    def select(self, keep: torch.Tensor) -> RoundPayload:
        """The payload of a subset of the clients (boolean mask over the rows)."""
        return RoundPayload(
            self.round,
            self.clients[keep],
            self.updates[keep],
            self.losses[keep],
            self.accuracies[keep],
            self.num_samples[keep],
            None if self.shards is None else self.shards.select(keep),
        )


@dataclass
class ServerStep:
    """An algorithm's answer to a round: the step d (the server applies w <- w - d) and the
    new values of its registered state, which the server commits only when d is finite.

    ``aggregate`` returns a ``ServerStep`` (or just the tensor d when it has nothing else to
    say), so a refused round leaves the model and the algorithm's state in step, and
    ``aggregate`` itself changes nothing and logs nothing:

    - ``metrics``: what the algorithm logs about the round (name -> a number, or a tensor,
      logged as its mean), logged with the round's own metrics (step = round), whether or
      not the step is applied;
    - ``qp_fallbacks``: QPs of the round a fallback solver answered (``core.qp``: warned,
      never fatal), added to the run's ``qp_fallbacks_total``;
    - ``details``: what the aggregation found that is not logged (FedMGDA+'s λ*, FedLF's
      layer groups), for tests, notebooks and callbacks (``outputs["details"]`` of the
      round's ``on_train_batch_end``).
    """

    direction: torch.Tensor  # (d,)
    new_state: dict[str, torch.Tensor] = field(default_factory=dict)  # buffer name -> its new value
    metrics: dict[str, float | torch.Tensor] = field(default_factory=dict)  # metric name -> value
    qp_fallbacks: int = 0
    details: dict[str, Any] = field(default_factory=dict)


def as_server_step(proposal: ServerStep | torch.Tensor) -> ServerStep:
    """What ``aggregate`` returned, as a ``ServerStep``."""
    return proposal if isinstance(proposal, ServerStep) else ServerStep(proposal)


def finite_rows(updates: torch.Tensor) -> torch.Tensor:
    """Which rows hold only finite numbers, (m,) bool.

    A row's sum is finite when all its entries are (one read of J, no m x d mask); the few
    rows whose sum is not are checked entry by entry (a finite row can overflow its sum).
    """
    finite = torch.isfinite(updates.sum(dim=1))
    if not bool(finite.all()):
        suspects = (~finite).nonzero().flatten()
        finite[suspects] = torch.isfinite(updates[suspects]).all(dim=1)
    return finite
