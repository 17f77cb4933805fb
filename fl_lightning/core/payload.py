"""What a round hands an algorithm (``RoundPayload``, with its read-only ``RoundContext``) and
what the algorithm hands back (``ServerStep``): the two halves of the contract between
``FederatedModule`` and an algorithm."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from fl_lightning.core.local import ClientShards, LocalSGD

if TYPE_CHECKING:
    from fl_lightning.core.federation_evaluation import FederationEvaluator
    from fl_lightning.core.flat import ParameterLayout


class RoundContext:
    """What an algorithm's round hooks (``aggregate``, ``on_round_end``) may read of the engine,
    and nothing else: ``payload.context``. Read-only: every field is a property.

    - ``round``: t, counted from 0; ``lr``: the round's local step size η_t = lr · lr_decay^t;
    - ``layout``: the flat layout of the parameters (``layout.unflatten(v)``, ``num_parameters``);
      ``layer_slices`` / ``layer_names``: the "layers" of per-layer work (``layer_grouping``);
    - ``global_vector``: the global model w as a new flat (d,) tensor (in ``on_round_end``: after
      the round's step);
    - ``num_clients_total``: K;
    - ``local_train(shards, start=None, anchor=None, sgd=None, objective=None)``: local SGD of
      more clients or from other starting points, this round's shuffles and step size;
    - ``evaluator``: evaluates clients under a shared or one model per client.
    """

    __slots__ = ("_module", "_round")

    def __init__(self, module: Any, round_index: int) -> None:
        self._module, self._round = module, round_index

    @property
    def round(self) -> int:
        return self._round

    @property
    def lr(self) -> float:
        return float(self._module.round_lr(self._round))

    @property
    def layout(self) -> ParameterLayout:
        return self._module.layout

    @property
    def layer_slices(self) -> tuple[slice, ...]:
        return tuple(self._module.layer_slices)

    @property
    def layer_names(self) -> tuple[str, ...]:
        return tuple(self._module.layer_names)

    @property
    def global_vector(self) -> torch.Tensor:
        return self._module.global_vector()

    @property
    def num_clients_total(self) -> int:
        return int(self._module.num_clients_total)

    @property
    def evaluator(self) -> FederationEvaluator:
        return self._module.evaluator

    def local_train(self, shards: ClientShards, start: dict[str, torch.Tensor] | None = None,
                    anchor: dict[str, torch.Tensor] | None = None, sgd: LocalSGD | None = None,
                    objective: Callable[..., torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Local SGD of ``shards``' clients in this round: stacked [m, ...] results
        (``FederatedModule.local_train``)."""
        return self._module.local_train(self._round, shards, start=start, anchor=anchor, sgd=sgd, objective=objective)


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
    _context: RoundContext | None = None  # set by the module; read it as ``context``

    @property
    def num_clients(self) -> int:
        return int(self.clients.shape[0])

    @property
    def context(self) -> RoundContext:
        """The round's read-only view of the engine (``RoundContext``). Every payload a
        ``FederatedModule`` hook receives has one, a hand-built one included: the module adds it."""
        if self._context is None:
            raise RuntimeError("this RoundPayload has no context: call the hook through its module "
                               "(aggregate / on_round_end add it), or build it with _context=module.round_context(t)")
        return self._context

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
            self._context,
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
    - ``qp_fallbacks``: QPs of the round a fallback solver answered (``algorithms.qp``: warned,
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
