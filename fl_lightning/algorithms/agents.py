"""What CGSV and its validation-based baselines share: agents that keep their own models.

* :class:`AgentModels`: N agents, each with its own model w_i, all in every round; local
  training starts from w_i (CGSV Sec. 3.1). CGSV, Standalone, DW, EU, RR (``cgsv.py``) and,
  through ``ValidatedAgents``, CFFL (``cffl.py``) and ECI (``eci.py``) build on it.
* :class:`ValidatedAgents`: agents and a server that holds an auxiliary validation set V, a
  share of every agent's training samples the agents never train on (CFFL, ECI).
* :func:`top_magnitude_mask` / :func:`rank_by_magnitude`: which entries of an update an agent
  keeps, by magnitude, from one ranking (CGSV's download mask of eq. (5), CFFL's uploads and
  downloads, ECI's downloads).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Annotated, Any

import torch
from pydantic import Field

from fl_lightning.core import settings
from fl_lightning.core.module import GLOBAL_MODEL, FederatedModule, RoundContext
from fl_lightning.core.simulation import round_generator
from fl_lightning.records.vocabulary import FRACTION, agent_metric

MAX_LOGGED_AGENTS = 20  # per-agent curves (cgsv_r/<i>, cgsv_density/<i>, ...) up to this N


class AgentModels(FederatedModule):
    """N agents, each with its own model w_i (the (N, d) buffer ``agent_models``), all taking
    part in every round (CGSV Sec. 3.1). Local training starts from w_i and uploads
    g_i = w_i − w_i' (J's rows); evaluation uses the agents' models, each on its own test
    set, or all on the shared test set (``test_mode="global"``, the CGSV setting).

    Args:
        fraction: must be 1.0 (every agent, every round).
    """

    # registered buffers and per-client state (typed for the checker; nn.Module holds them)
    agent_models: torch.Tensor

    def __init__(self, *args: Any, fraction: settings.Participation = 1.0, **kwargs: Any) -> None:
        kwargs[FRACTION] = fraction
        super().__init__(*args, **kwargs)
        if fraction != 1.0:
            raise ValueError(
                f"{type(self).__name__} needs every agent in every round: set fraction=1.0, got {fraction}"
            )
        self.register_client_state("agent_models", init=GLOBAL_MODEL)  # w_{i,0} := w_0 (Sec. 3.1)

    def per_agent_metrics(self, series: Mapping[str, tuple[Any, Iterable[int]]],
                          metrics: dict[str, float] | None = None) -> dict[str, float]:
        """``<name>/<agent>`` for every value of each series (N ≤ ``MAX_LOGGED_AGENTS``) and
        ``<name>_min``/``_mean``/``_max`` (any N), with ``metrics``: what ``on_round_end``
        returns, logged with the round."""
        metrics = dict(metrics or {})
        for name, (values, ids) in series.items():
            metrics |= self.agent_metrics(name, values, ids)
        return metrics

    def agent_metrics(self, name: str, values: torch.Tensor, agents: Iterable[int]) -> dict[str, float]:
        """One series' metrics: ``<name>/<agent>`` (N ≤ ``MAX_LOGGED_AGENTS``) and
        ``<name>_min``/``_mean``/``_max``."""
        metrics: dict[str, float] = {}
        if self.agent_models.shape[0] <= MAX_LOGGED_AGENTS:
            metrics |= {agent_metric(name, i): float(v) for i, v in zip(agents, values)}
        return metrics | {f"{name}_min": float(values.min()), f"{name}_mean": float(values.mean()),
                          f"{name}_max": float(values.max())}

    @staticmethod
    def train_from(context: RoundContext, shards: Any, start: torch.Tensor) -> torch.Tensor:
        """Local training of the shards' agents from their own flat models ``start`` (m, d);
        returns g_i = start_i − trained_i."""
        trained = context.local_train(shards, start=context.layout.unflatten_stacked(start),
                                      anchor=context.global_params)
        return start - context.layout.flatten_stacked(trained)

    def train_clients(self, context: RoundContext, shards: Any) -> torch.Tensor:
        return self.train_from(context, shards, self.agent_models[shards.clients])

    def evaluation_params(self) -> torch.Tensor:
        return self.agent_models


class ValidatedAgents(AgentModels):
    """Agents with their own models (``AgentModels``) and a server that holds an auxiliary
    validation set V: ``validation_fraction`` of every agent's training samples, drawn once
    from the seed (at least one sample from each agent with two or more; each agent keeps at
    least one). The agents never train on V, and V is never part of a test set.

    Args:
        validation_fraction: share of each agent's training samples given to the server
            (CFFL's experiments: 10% of the training set).
    """

    def __init__(
        self,
        *args: Any,
        validation_fraction: Annotated[float, Field(gt=0, lt=1, description=(
            "in (0, 1) (the share of each agent's training samples the server validates on)"))] = 0.1,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)  # checks validation_fraction (its type) with the others
        self._validation: tuple[Any, SimpleNamespace, torch.Tensor] | None = None

    def validation_split(self, data: Any) -> tuple[SimpleNamespace, torch.Tensor]:
        """(the agents' training data without V, V's positions in ``train_x``) of the federation's
        ``data``, made once per data tensors (again if the data moves to another device)."""
        if self._validation is not None and self._validation[0] is data.train_index:
            return self._validation[1], self._validation[2]
        generator = round_generator(self.hparams.seed, 0, "validation")
        index, sizes = data.train_index.cpu(), data.train_sizes.cpu().tolist()
        kept, held = [], []
        for k, n in enumerate(sizes):
            num_held = min(max(round(self.hparams.validation_fraction * n), 1), n - 1) if n > 1 else 0
            order = torch.randperm(n, generator=generator)
            held.append(index[k, order[:num_held]])
            kept.append(index[k, order[num_held:]].sort().values)
        width = max(len(rows) for rows in kept)
        kept_index = torch.zeros(len(kept), width, dtype=torch.long)
        for k, rows in enumerate(kept):
            kept_index[k, : len(rows)] = rows
        device = data.train_x.device
        training = SimpleNamespace(train_x=data.train_x, train_y=data.train_y, train_index=kept_index.to(device),
                                   train_sizes=torch.tensor([len(r) for r in kept], device=device))
        validation = torch.cat(held).sort().values.to(device)
        if validation.numel() == 0:
            raise ValueError(f"{type(self).__name__} needs a validation set, but no agent has two training "
                             "samples to share one: give the agents more data")
        self._validation = (data.train_index, training, validation)
        return training, validation

    def training_samples(self, data: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """The agents' training samples less the server's validation set V (``validation_split``
        of the same data)."""
        training, _ = self.validation_split(data)
        return training.train_index, training.train_sizes

    def validation_accuracy(self, context: RoundContext, models: torch.Tensor) -> torch.Tensor:
        """Accuracy on V of each row of ``models`` (M, d) (float64)."""
        data = context.data
        _, held = self.validation_split(data)
        m, n = models.shape[0], held.numel()
        sets = (data.train_x, data.train_y, held.expand(m, n), torch.full((m,), n, device=held.device))
        return context.evaluator.stacked(models, sets)[1].double()


def rank_by_magnitude(values: torch.Tensor) -> torch.Tensor:
    """rank[..., k] = position of entry k of its row when sorted by |value|, largest first
    (0-based; ties by position)."""
    order = values.abs().argsort(dim=-1, descending=True, stable=True)
    positions = torch.arange(values.shape[-1], device=values.device).expand_as(order)
    return torch.empty_like(order).scatter_(-1, order, positions)


def top_magnitude_mask(values: torch.Tensor, ratios: torch.Tensor) -> torch.Tensor:
    """(m, D) booleans: row i keeps the ⌊D ratios_i⌋ entries of ``values`` with the largest
    magnitude (one ranking, ties by position). ``values`` is (D,) shared or (m, D) per row:
    CGSV's download mask of eq. (5), CFFL's uploads and downloads, ECI's downloads."""
    rows = values if values.dim() == 2 else values.unsqueeze(0)
    quota = torch.floor(rows.shape[1] * ratios.double()).unsqueeze(1)
    return rank_by_magnitude(rows) < quota
