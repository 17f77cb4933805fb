"""What a round hands an algorithm (``RoundPayload``, with its read-only ``RoundContext``) and
what the algorithm hands back (``ServerStep``): the two halves of the contract between
``FederatedModule`` and an algorithm."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from fl_lightning.core.local import ClientShards, LocalSGD

if TYPE_CHECKING:
    from fl_lightning.core.federation_evaluation import FederationEvaluator
    from fl_lightning.core.flat import ParameterLayout


class RoundData(Protocol):
    """What a round's context reads beside the engine (a ``FederatedModule`` is one): the
    federation's data, the training shards of some clients, and who answers a round when that is a
    pure function of (seed, round)."""

    @property
    def num_clients_total(self) -> int: ...

    @property
    def federated_data(self) -> Any: ...

    def client_shards(self, clients: torch.Tensor, split: str = "train") -> ClientShards: ...

    def predictable_answering(self, round_index: int) -> torch.Tensor | None: ...


class RoundEngineView(Protocol):
    """What a round's context reads of the engine that runs the rounds
    (``core.round_engine.RoundEngine`` is one): the parameter layout, the global model, the round's
    step size, local training, evaluation."""

    layout: ParameterLayout
    layer_slices: list[slice]  # one a layer
    layer_names: list[str]  # their names, in that order

    def round_lr(self, round_index: int) -> float: ...

    def global_vector(self) -> torch.Tensor: ...

    def global_params(self) -> dict[str, torch.Tensor]: ...

    @property
    def evaluator(self) -> FederationEvaluator: ...

    def local_train(self, round_index: int, shards: ClientShards, start: dict[str, torch.Tensor] | None = None,
                    anchor: dict[str, torch.Tensor] | None = None, sgd: LocalSGD | None = None,
                    objective: Callable[..., torch.Tensor] | None = None) -> dict[str, torch.Tensor]: ...

    def synchronize(self) -> None: ...


class RoundContext:
    """The one door from an algorithm to the engine: what its hooks may read of the run, and
    nothing else. ``aggregate`` and ``on_round_end`` read it as ``payload.context``;
    ``train_clients``, ``sample_clients``, ``evaluation_metrics`` and ``history_rows_to_keep``
    receive it. Read-only: every field is a property.

    - ``round``: t, counted from 0; ``lr``: the round's local step size η_t = lr · lr_decay^t;
    - ``layout``: the flat layout of the parameters (``layout.unflatten(v)``, ``num_parameters``);
      ``layer_slices`` / ``layer_names``: the "layers" of per-layer work (``layer_grouping``);
    - ``global_vector``: the global model w as a new flat (d,) tensor (in ``on_round_end``: after
      the round's step); ``global_params``: its trainable tensors by name (what a proximal term
      pulls towards);
    - ``num_clients_total``: K; ``train_sizes``: every client's (K,) number of training samples;
      ``data``: the federation's data (``train_x``, ``train_y``, ``train_index``, test sets);
    - ``client_shards(clients)``: the training shards of some clients;
    - ``local_train(shards, start=None, anchor=None, sgd=None, objective=None)``: local SGD of
      clients, from the global model or other starting points, this round's shuffles and step size;
    - ``evaluator``: evaluates clients under a shared model or one model per client;
    - ``answering_clients()``: who answers this round when that is a pure function of (seed,
      round) (the default sampler, no attacker), else None.
    """

    __slots__ = ("_data", "_engine", "_round")

    def __init__(self, engine: RoundEngineView, data: RoundData, round_index: int) -> None:
        self._engine, self._data, self._round = engine, data, round_index

    @property
    def round(self) -> int:
        return self._round

    @property
    def lr(self) -> float:
        return float(self._engine.round_lr(self._round))

    @property
    def layout(self) -> ParameterLayout:
        return self._engine.layout

    @property
    def layer_slices(self) -> tuple[slice, ...]:
        return tuple(self._engine.layer_slices)

    @property
    def layer_names(self) -> tuple[str, ...]:
        return tuple(self._engine.layer_names)

    @property
    def global_vector(self) -> torch.Tensor:
        return self._engine.global_vector()

    @property
    def global_params(self) -> dict[str, torch.Tensor]:
        return self._engine.global_params()

    @property
    def num_clients_total(self) -> int:
        return int(self._data.num_clients_total)

    @property
    def train_sizes(self) -> torch.Tensor:
        return self._data.federated_data.train_sizes

    @property
    def data(self) -> Any:
        return self._data.federated_data

    @property
    def evaluator(self) -> FederationEvaluator:
        return self._engine.evaluator

    def client_shards(self, clients: torch.Tensor) -> ClientShards:
        """The training shards of ``clients`` (ids), the samples they train on."""
        return self._data.client_shards(clients)

    def local_train(self, shards: ClientShards, start: dict[str, torch.Tensor] | None = None,
                    anchor: dict[str, torch.Tensor] | None = None, sgd: LocalSGD | None = None,
                    objective: Callable[..., torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Local SGD of ``shards``' clients in this round: stacked [m, ...] results. ``start``
        defaults to the global model (shared); stacked [m, ...] tensors start every client from
        its own model (``anchor``, default the global model, is what proximal terms pull
        towards). ``sgd`` overrides the local SGD settings (its lr is used as given);
        ``objective`` overrides ``client_objective``."""
        return self._engine.local_train(self._round, shards, start=start, anchor=anchor, sgd=sgd, objective=objective)

    def synchronize(self) -> None:
        """Waits for the accelerator's queued work (nothing on a CPU): for timing a computation."""
        self._engine.synchronize()

    def answering_clients(self) -> torch.Tensor | None:
        """The clients that answer this round, when they are a pure function of (seed, round):
        the default sampler and no attacker; else None (they may depend on state)."""
        return self._data.predictable_answering(self._round)


@dataclass
class RoundPayload:
    """What the answering clients of round t upload (rows aligned across fields)."""

    round: int
    clients: torch.Tensor  # (m,) client ids
    updates: torch.Tensor  # (m, d) g_i = w - w_i
    # (m,) training loss and accuracy at w, before local training; None in a round that does not
    # compute them (an algorithm that reads them sets ``reads_training_losses``)
    losses: torch.Tensor | None
    accuracies: torch.Tensor | None
    num_samples: torch.Tensor  # (m,) n_i
    shards: ClientShards | None = None  # the clients' training data (for extra evaluations)
    _context: RoundContext | None = None  # set by the module; read it as ``context``

    @property
    def num_clients(self) -> int:
        return int(self.clients.shape[0])

    def training_losses(self) -> torch.Tensor:
        """(m,) each client's training loss at the global model w, before local training."""
        return self._before_training(self.losses, "losses")

    def training_accuracies(self) -> torch.Tensor:
        """(m,) each client's training accuracy at the global model w, before local training."""
        return self._before_training(self.accuracies, "accuracies")

    def _before_training(self, values: torch.Tensor | None, what: str) -> torch.Tensor:
        if values is None:
            raise RuntimeError(f"round {self.round + 1} did not compute the clients' training {what}: an algorithm "
                               "that reads them sets the class attribute reads_training_losses = True")
        return values

    @property
    def context(self) -> RoundContext:
        """The round's read-only view of the engine (``RoundContext``). Every payload a round
        hands ``aggregate`` and ``on_round_end`` has one; a payload built by hand gets it from
        ``module.propose(payload)`` / ``module.server_round(payload)``."""
        if self._context is None:
            raise RuntimeError("this RoundPayload has no context: call the hook through its module "
                               "(module.propose(payload) or module.server_round(payload) add it), "
                               "or build it with _context=module.round_context(t)")
        return self._context

    def select(self, keep: torch.Tensor) -> RoundPayload:
        """The payload of a subset of the clients (boolean mask over the rows)."""
        return RoundPayload(
            self.round,
            self.clients[keep],
            self.updates[keep],
            None if self.losses is None else self.losses[keep],
            None if self.accuracies is None else self.accuracies[keep],
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
      layer groups), for tests, notebooks and callbacks (``RoundOutcome.details``).
    """

    direction: torch.Tensor  # (d,)
    new_state: dict[str, torch.Tensor] = field(default_factory=dict)  # buffer name -> its new value
    metrics: dict[str, float | torch.Tensor] = field(default_factory=dict)  # metric name -> value
    qp_fallbacks: int = 0
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundOutcome:
    """What a round did, as the callbacks read it (``outputs`` of ``on_train_batch_end``):

    - ``payload``: the uploads aggregated (None when no client's update reached the server);
    - ``direction``: the server step d applied (None when none was: no upload, or d not finite);
    - ``qp_fallbacks`` and ``details``: the algorithm's ``ServerStep`` fields;
    - ``evaluates``: whether an evaluation of every client follows this round (every
      ``eval_every`` rounds and after the last).
    """

    round: int
    evaluates: bool
    payload: RoundPayload | None = None
    direction: torch.Tensor | None = None
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
