"""Every client's test metrics and their fairness summary, under the shared model or under
one model per client (Ditto's personal models, CGSV's agent models), clients split across
DDP ranks."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from fl_lightning.core.distributed import across_ranks
from fl_lightning.core.evaluation import (
    SamplePositions,
    evaluate_clients,
    evaluate_clients_stacked,
    label_matched,
)
from fl_lightning.core.flat import ParameterLayout, assign_model_vector
from fl_lightning.metrics import fairness_summary
from fl_lightning.records.vocabulary import ClientMetrics, Metric

Sets = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # x, y, index (K, n), sizes (K,)


class KeptPositions:
    """The sample positions of the last clients a shared model was evaluated on, kept between
    rounds by the module: under full participation every round evaluates the same clients."""

    def __init__(self) -> None:
        self.last: SamplePositions | None = None

    def of(self, index: torch.Tensor, sizes: torch.Tensor) -> SamplePositions:
        if self.last is None or not self.last.describes(index, sizes):
            self.last = SamplePositions(index, sizes)
        return self.last


class FederationEvaluator:
    """Evaluates a federation's clients on the data module's test sets.

    ``params`` is what the algorithm evaluates: ``None`` for the global model, a flat (d,)
    vector for another shared model (AFL's averaged iterate), or (K, d), one model per client.
    """

    def __init__(self, model: nn.Module, layout: ParameterLayout, trainer: Any = None,
                 kept: KeptPositions | None = None) -> None:
        self.model, self.layout, self.trainer = model, layout, trainer
        self.kept = kept if kept is not None else KeptPositions()

    def shared(self, model: nn.Module, sets: Sets) -> tuple[torch.Tensor, torch.Tensor]:
        """``evaluate_clients`` of one shared model, the clients split across ranks, with the
        sample positions ``kept`` from the last call where the clients are the same."""
        x, y, index, sizes = sets

        def block(rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
            block_index, block_sizes = index[rows], sizes[rows]
            positions = self.kept.of(block_index, block_sizes)
            return evaluate_clients(model, x, y, block_index, block_sizes, positions=positions)
        losses, accuracies = across_ranks(self.trainer, int(sizes.shape[0]), block)
        return losses, accuracies

    def stacked(self, params: torch.Tensor, sets: Sets, weights: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``evaluate_clients_stacked``: client k under its own model ``params[k]``, split across ranks."""
        x, y, index, sizes = sets

        def block(rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
            return evaluate_clients_stacked(self.model, self.layout, params[rows], x, y, index[rows], sizes[rows],
                                            weights=None if weights is None else weights[rows])
        losses, accuracies = across_ranks(self.trainer, int(sizes.shape[0]), block)
        return losses, accuracies

    def evaluate(self, data: Any, params: torch.Tensor | None) -> tuple[dict[str, float], dict[str, list]]:
        """(metrics, per-client values): the fairness summary of the clients' test accuracies
        (local test sets, the label-matched shared pool, or the shared test set when clients
        have their own models and no local test), and the shared test set under the shared model."""
        per_client = params is not None and params.dim() == 2
        shared = self.shared_model(None if per_client else params)
        metrics: dict[str, float] = {}
        clients: dict[str, list] = {}
        stacked = params if per_client else None
        result = self.client_results(data, stacked, shared)
        if result is not None:
            losses, accuracies, num_test = result
            has_test = num_test > 0
            metrics |= fairness_summary(accuracies[has_test], prefix=Metric.TEST_ACC_PREFIX)
            metrics["test_loss_mean"] = float(losses[has_test].mean())
            clients = {
                "client": list(range(len(accuracies))),
                ClientMetrics.TEST_ACCURACY: accuracies.tolist(),
                "test_loss": losses.tolist(),
                "num_train": data.train_sizes.tolist(),
                "num_test": num_test.tolist(),
            }
        if data.global_test_x is not None:
            loss, acc = evaluate_clients(shared, *whole_pool(data, 1))
            metrics |= {Metric.GLOBAL_TEST_ACC: float(acc[0]), Metric.GLOBAL_TEST_LOSS: float(loss[0])}
        return metrics, clients

    def client_results(self, data: Any, params: torch.Tensor | None, shared: nn.Module
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Every client's test loss, accuracy and number of test samples; None without any test data."""
        if getattr(data, "test_class_weights", None) is not None:
            return self.label_matched(data, params, shared)
        sets = client_test_sets(data, None if params is None else params.shape[0])
        if sets is None:
            return None
        losses, accuracies = self.shared(shared, sets) if params is None else self.stacked(params, sets)
        return losses, accuracies, sets[3]

    def label_matched(self, data: Any, params: torch.Tensor | None, shared: nn.Module
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``test_mode="matched"``: client k's loss and accuracy are sum_c p_k(c) v_k(c), its model's
        class-wise values on the shared test set weighted by its own training labels; and the
        number of shared test samples in the classes it holds."""
        weights = data.test_class_weights
        class_sizes = data.global_test_class_sizes
        num_test = (weights > 0).to(class_sizes.dtype) @ class_sizes
        if params is None:  # one shared model: its class-wise values once, then weighted per client
            class_losses, class_accuracies = evaluate_clients(
                shared, data.global_test_x, data.global_test_y, data.global_test_class_index, class_sizes)
            return label_matched(class_losses, weights), label_matched(class_accuracies, weights), num_test
        per_sample = weights[:, data.global_test_y] / class_sizes[data.global_test_y].clamp_min(1)
        losses, accuracies = self.stacked(params, whole_pool(data, params.shape[0]), weights=per_sample)
        return losses, accuracies, num_test

    def shared_model(self, flat: torch.Tensor | None) -> nn.Module:
        """The global model, or a copy of it holding another shared parameter vector."""
        if flat is None:
            return self.model
        model = copy.deepcopy(self.model)
        assign_model_vector(model, self.layout, flat)
        return model


def whole_pool(data: Any, num_clients: int) -> Sets:
    """The shared test set as every one of ``num_clients`` clients' test set."""
    n = data.global_test_y.shape[0]
    everything = torch.arange(n, device=data.global_test_x.device).expand(num_clients, n)
    return data.global_test_x, data.global_test_y, everything, torch.full((num_clients,), n, device=everything.device)


def client_test_sets(data: Any, num_models: int | None) -> Sets | None:
    """The clients' own test sets; with one model per client and no local test, the shared
    test set for every client; None when there is nothing to test on."""
    if int(data.test_sizes.sum()) > 0:
        return data.test_x, data.test_y, data.test_index, data.test_sizes
    if num_models is not None and data.global_test_x is not None:
        return whole_pool(data, num_models)
    return None
