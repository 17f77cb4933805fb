"""``RoundEngine``: what a ``FederatedModule`` holds to run its rounds, and what ``RoundContext``
wraps. The global model as a flat vector, the round's step size and local SGD, dropout, local
training across ranks and the evaluator. The module holds one (``module.round_engine``) rather than
inheriting these helpers, so an algorithm reads them only through its round's context, and a test
or a benchmark through this public API."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from fl_lightning.core import simulation
from fl_lightning.core.distributed import world_size
from fl_lightning.core.engine_runner import EngineRunner
from fl_lightning.core.federation_evaluation import FederationEvaluator, KeptPositions
from fl_lightning.core.flat import ParameterLayout, model_vector
from fl_lightning.core.local import ClientShards, LocalSGD, batch_order
from fl_lightning.core.simulation import round_generator


class RoundEngine:
    """The engine of one module's rounds.

    Args:
        model: the global model (the module's own; its parameters are w).
        layout: the flat layout of ``model``'s trainable parameters.
        layer_slices: the "layers" of per-layer work (``layer_grouping``), as slices of w.
        layer_names: those layers' names.
        local_sgd: the local SGD settings (their lr is the base of ``round_lr``).
        runner: picks and runs the local-training engine (vectorised or sequential).
        seed: the run's seed (every per-round stream is a function of it and the round).
        dropout_prob: the chance that a sampled client does not answer.
        objective: every client's minibatch loss (the module's ``client_objective``).
        attached_trainer: the Trainer the module is attached to, None outside one.
    """

    def __init__(self, model: nn.Module, layout: ParameterLayout, layer_slices: list[slice], layer_names: list[str],
                 local_sgd: LocalSGD, runner: EngineRunner, seed: int, dropout_prob: float,
                 objective: Callable[..., torch.Tensor], attached_trainer: Callable[[], Any]) -> None:
        self.model = model
        self.layout = layout
        self.layer_slices = layer_slices
        self.layer_names = layer_names
        self.local_sgd = local_sgd
        self.runner = runner
        self.seed = seed
        self.dropout_prob = dropout_prob
        self.objective = objective
        self.attached_trainer = attached_trainer
        self.kept_positions = KeptPositions()  # the evaluator's sample positions, kept between rounds
        self._kept_round_sgd: tuple[LocalSGD, float, LocalSGD] | None = None

    @property
    def num_parameters(self) -> int:
        """d, the number of trainable parameters (the length of w and of every update)."""
        return self.layout.num_parameters

    def global_vector(self) -> torch.Tensor:
        """The global model w as a flat vector (d,)."""
        return model_vector(self.model, self.layout)

    def global_params(self) -> dict[str, torch.Tensor]:
        """The global model's trainable parameters by name (what proximal terms pull towards)."""
        return {n: p for n, p in self.model.named_parameters() if n in self.layout.names}

    def round_lr(self, round_index: int) -> float:
        """The local learning rate of round t: lr * lr_decay^t."""
        return self.local_sgd.round_lr(round_index)

    def round_sgd(self, round_index: int) -> LocalSGD:
        """The local SGD settings of a round (``local_sgd`` at ``round_lr``); the last one is
        kept, so rounds of one learning rate do not build and check a new one each."""
        lr = self.round_lr(round_index)
        kept = self._kept_round_sgd
        if kept is None or kept[0] is not self.local_sgd or kept[1] != lr:
            kept = self._kept_round_sgd = (self.local_sgd, lr, replace(self.local_sgd, lr=lr))
        return kept[2]

    def drop_clients(self, round_index: int, sampled: torch.Tensor) -> torch.Tensor:
        """The sampled clients that answer; each fails with probability ``dropout_prob``."""
        return simulation.drop_clients(self.seed, round_index, sampled, self.dropout_prob)

    def local_train(self, round_index: int, shards: ClientShards, start: dict[str, torch.Tensor] | None = None,
                    anchor: dict[str, torch.Tensor] | None = None, sgd: LocalSGD | None = None,
                    objective: Callable[..., torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Local SGD of the shards' clients, stacked [m, ...] results.

        ``start`` defaults to the global model (shared); pass stacked [m, ...] tensors to
        start every client from its own model (``anchor``, default the global model, is what
        proximal terms pull towards). ``sgd`` overrides the local SGD settings (its lr is used
        as given; by default the module's, with this round's lr); ``objective`` overrides
        ``client_objective``. Under DDP every rank trains its own block of the clients and
        the results are all-gathered, so every rank returns all m clients.
        """
        sgd = sgd or self.round_sgd(round_index)
        order = batch_order(shards.sizes, shards.index.shape[1], sgd.epochs,
                            round_generator(self.seed, round_index, "shuffle"))
        start = self.global_params() if start is None else start
        anchor = self.global_params() if anchor is None else anchor
        return self.runner.train_across_ranks(self.attached_trainer(), self.model, self.layout, shards, order,
                                              start, anchor, sgd, objective or self.objective)

    @property
    def world_size(self) -> int:
        """Processes sharing the clients of a round (Lightning's DDP world size)."""
        return world_size(self.attached_trainer())

    @property
    def evaluator(self) -> FederationEvaluator:
        """Evaluates clients under shared or per-client models, split across ranks; the sample
        positions of the last clients evaluated are kept between rounds."""
        return FederationEvaluator(self.model, self.layout, self.attached_trainer(), self.kept_positions)

    def synchronize(self) -> None:
        """Waits for the accelerator's queued work (nothing on a CPU): for timing a computation."""
        parameter = next(self.model.parameters(), None)
        if parameter is not None and parameter.device.type == "cuda":
            torch.cuda.synchronize(parameter.device)
