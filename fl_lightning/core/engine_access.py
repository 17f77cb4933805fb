"""What ``RoundContext`` reads of a ``FederatedModule``: the engine's private helpers (the global
model as a flat vector, the round's step size and local SGD, dropout, local training across
ranks, the evaluator). An algorithm reaches them only through its round's context."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from fl_lightning import private_api
from fl_lightning.core import simulation
from fl_lightning.core.distributed import world_size
from fl_lightning.core.federation_evaluation import FederationEvaluator, KeptPositions
from fl_lightning.core.flat import model_vector
from fl_lightning.core.local import ClientShards, LocalSGD, batch_order
from fl_lightning.core.simulation import round_generator


class EngineAccess(nn.Module):
    """The engine's helpers behind ``RoundContext`` (private: an algorithm reads the context)."""

    if TYPE_CHECKING:  # what FederatedModule provides
        from lightning.pytorch.utilities.parsing import AttributeDict

        from fl_lightning.core.engine_runner import EngineRunner
        from fl_lightning.core.flat import ParameterLayout

        model: nn.Module
        _layout: ParameterLayout
        _local_sgd: LocalSGD
        _engines: EngineRunner
        current_epoch: int
        device: torch.device

        @property
        def hparams(self) -> AttributeDict: ...

        def client_objective(self, *args: Any) -> torch.Tensor: ...

    def _global_vector(self) -> torch.Tensor:
        """The global model w as a flat vector (d,)."""
        return model_vector(self.model, self._layout)

    def _global_params(self) -> dict[str, torch.Tensor]:
        """The global model's trainable parameters by name (what proximal terms pull towards)."""
        return {n: p for n, p in self.model.named_parameters() if n in self._layout.names}

    def _round_lr(self, round_index: int | None = None) -> float:
        """The local learning rate of a round: lr * lr_decay^t."""
        return self._local_sgd.round_lr(self._round_index if round_index is None else round_index)

    def _round_sgd(self, round_index: int) -> LocalSGD:
        """The local SGD settings of a round (``local_sgd`` at ``round_lr``); the last one is
        kept, so rounds of one learning rate do not build and check a new one each."""
        lr = self._round_lr(round_index)
        kept = getattr(self, "_kept_round_sgd", None)
        if kept is None or kept[0] is not self._local_sgd or kept[1] != lr:
            kept = self._kept_round_sgd = (self._local_sgd, lr, replace(self._local_sgd, lr=lr))
        return kept[2]

    def _drop_clients(self, round_index: int, sampled: torch.Tensor) -> torch.Tensor:
        """The sampled clients that answer; each fails with probability ``dropout_prob``."""
        return simulation.drop_clients(self.hparams.seed, round_index, sampled, self.hparams.dropout_prob)

    def _local_train(self, round_index: int, shards: ClientShards, start: dict[str, torch.Tensor] | None = None,
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
        sgd = sgd or self._round_sgd(round_index)
        order = batch_order(shards.sizes, shards.index.shape[1], sgd.epochs,
                            round_generator(self.hparams.seed, round_index, "shuffle"))
        start = self._global_params() if start is None else start
        anchor = self._global_params() if anchor is None else anchor
        return self._engines.train_across_ranks(
            private_api.attached_trainer(self),
            self.model,
            self._layout,
            shards,
            order,
            start,
            anchor,
            sgd,
            objective or self.client_objective,
        )

    @property
    def _world_size(self) -> int:
        """Processes sharing the clients of a round (Lightning's DDP world size)."""
        return world_size(private_api.attached_trainer(self))

    @property
    def _evaluator(self) -> FederationEvaluator:
        """Evaluates clients under shared or per-client models, split across ranks; the sample
        positions of the last clients evaluated are kept on the module between rounds."""
        kept = self.__dict__.get("_kept_positions")
        if kept is None:
            kept = self.__dict__["_kept_positions"] = KeptPositions()
        return FederationEvaluator(self.model, self._layout, private_api.attached_trainer(self), kept)

    @property
    def _round_index(self) -> int:
        """0-based index of the round being run (= the Lightning epoch)."""
        return int(self.current_epoch)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
