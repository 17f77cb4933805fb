"""Per-round diagnostics as Lightning callbacks, switched on by ``FederatedModule.configure_callbacks``
(conflict counts and the QP fallback total always, the improvement share with
``track_improvement``) or by a user through ``trainer.callbacks``.

Each reads the round's outcome, which ``FederatedModule.training_step`` returns and Lightning
hands to ``on_train_batch_end``: the payload, the applied server step (None when the step was
refused) and the QP fallbacks of the round. Running sums are callback state, so a resumed run
reports what an uninterrupted one does.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from fl_lightning.core.flat import ParameterLayout, layer_slices
from fl_lightning.core.gram import conflict_counts
from fl_lightning.core.payload import RoundOutcome
from fl_lightning.records.vocabulary import Metric


def round_outcome(outputs: Any) -> RoundOutcome | None:
    """The ``RoundOutcome`` a ``FederatedModule`` round returns (``outputs["outcome"]``), else None."""
    outcome = outputs.get("outcome") if isinstance(outputs, dict) else None
    return outcome if isinstance(outcome, RoundOutcome) else None


def _log(pl_module: pl.LightningModule, metrics: dict[str, float]) -> None:
    """With the round's metrics (``FederatedModule.log_round``: one call per round), else ``log_dict``."""
    log_round = getattr(pl_module, "log_round", None)
    if callable(log_round):
        log_round(metrics)
    else:
        pl_module.log_dict(metrics, on_step=False, on_epoch=True, batch_size=1)


def paper_layer_slices(model: torch.nn.Module, layout: ParameterLayout) -> list[slice]:
    """The layers of FedLF's Table 4: one per module, its weight and bias together (the paper's
    CIFAR-10 CNN, two convolutional and three fully connected layers, has LC_1 .. LC_5), i.e.
    ``core.flat.layer_slices(model, layout, "module")``, whatever ``layer_grouping`` the
    algorithm aggregates with."""
    return layer_slices(model, layout, "module")


class ConflictCounts(Callback):
    """How many online clients' updates conflict with the applied step, for the whole model
    and per layer (Pan et al., "FedLF: Layer-wise Fair Federated Learning", AAAI 2024,
    Appendix B.2.1, Table 4; Table 2 of the main paper on CIFAR-10 Pat-1).

    The server moves w by −s (s = the applied server step, the paper's d = −s) and client i's
    own descent move is −g_i, so a layer l of client i conflicts when g_{i,l} · s_l < 0, i.e.
    d_l · g_{i,l} > 0, the opposite of FedLF's guarantee d_l · g_{i,l} < 0 (App. A.1, eq. (5));
    a zero inner product (d_l = 0 at a Pareto-stationary layer) is no conflict. Only the
    round's online clients count (those whose updates were aggregated), as in Table 4.

    Logged every round, with step = rounds completed (``FederatedModule.log_round``):

    * ``conflicts_model``: Table 4's MC, the clients with g_i · s < 0;
    * ``conflicts_layer``: Table 4's LC_1 + ... + LC_L of the round, LC_l = #{i : g_{i,l} · s_l < 0},
      i.e. the number of (client, layer) pairs in conflict, with Table 4's layers (one per
      module, :func:`paper_layer_slices`, for every algorithm and ``layer_grouping``); its mean
      over rounds is the sum of a Table 4 row's LC columns (FedLF: 0, no layer of any online
      client conflicts, which the per-layer QP guarantees unless layers were combined);
    * ``conflicts_layer_mean``, ``conflicts_layer_max``: the mean and max over the algorithm's own
      layers (``layer_slices``: one per tensor under ``layer_grouping="tensor"``) of the per-layer counts.

    Logged at every evaluation: ``conflicts_layer/<layer>``, the per-layer mean since the last one
    (the algorithm's own layers)."""

    def __init__(self) -> None:
        self.layer_sums: list[float] = []
        self.rounds = 0
        self.layer_names: tuple[str, ...] = ()
        self.evaluation_follows = False
        self._paper_layers: tuple[ParameterLayout, list[slice]] | None = None

    def _paper_slices(self, pl_module: Any, layout: ParameterLayout) -> list[slice]:
        """:func:`paper_layer_slices` of the module's model, built once per layout."""
        if self._paper_layers is None or self._paper_layers[0] is not layout:
            self._paper_layers = (layout, paper_layer_slices(pl_module.model, layout))
        return self._paper_layers[1]

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Counts the round's conflicts between the clients' updates and the step's direction,
        at model level and per layer (the algorithm's layers and those of FedLF's Table 4),
        logs them, and adds the per-layer counts to the sums the next evaluation averages."""
        outcome = round_outcome(outputs)
        if outcome is None:
            return
        self.evaluation_follows = outcome.evaluates
        if outcome.direction is None or outcome.payload is None:
            return
        context = outcome.payload.context
        own, paper = list(context.layer_slices), self._paper_slices(pl_module, context.layout)
        self.layer_names = context.layer_names
        same = own == paper  # layer_grouping="module"
        # one conflict_counts call (one device sync) for both sets of layers
        model_level, counts = conflict_counts(outcome.payload.updates, outcome.direction, own if same else own + paper)
        per_layer = counts[:len(own)]
        per_paper_layer = per_layer if same else counts[len(own):]
        if len(self.layer_sums) != len(per_layer):
            self.layer_sums = [0.0] * len(per_layer)
        self.layer_sums = [total + count for total, count in zip(self.layer_sums, per_layer)]
        self.rounds += 1
        _log(pl_module, {
            Metric.CONFLICTS_MODEL: float(model_level),
            Metric.CONFLICTS_LAYER: float(sum(per_paper_layer)),
            Metric.CONFLICTS_LAYER_MEAN: sum(per_layer) / max(1, len(per_layer)),
            Metric.CONFLICTS_LAYER_MAX: float(max(per_layer, default=0)),
        })

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if not (self.rounds and self.evaluation_follows and not trainer.sanity_checking):
            return
        means = {f"{Metric.CONFLICTS_LAYER}/{name}": total / self.rounds
                 for name, total in zip(self.layer_names, self.layer_sums)}
        _log(pl_module, means)
        self.layer_sums, self.rounds = [0.0] * len(self.layer_sums), 0

    def state_dict(self) -> dict[str, Any]:
        return {"layer_sums": list(self.layer_sums), "rounds": self.rounds}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.layer_sums, self.rounds = list(state_dict["layer_sums"]), int(state_dict["rounds"])


class QPFallbackTotal(Callback):
    """``qp_fallbacks_total``: QPs over the run that the primary solver could not solve and a
    fallback answered (warned, never fatal), logged in every round that aggregated."""

    def __init__(self) -> None:
        self.total = 0

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        outcome = round_outcome(outputs)
        if outcome is None or outcome.payload is None:  # no update reached the server: nothing aggregated
            return
        self.total += outcome.qp_fallbacks
        _log(pl_module, {"qp_fallbacks_total": float(self.total)})

    def state_dict(self) -> dict[str, Any]:
        return {"total": self.total}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.total = int(state_dict["total"])


class ImprovementShare(Callback):
    """``improved_fraction``: the share of the round's participants whose training loss did not
    increase after the step (Hu et al., FedMGDA+, IEEE TNSE 2022, footnote 6); costs one more
    evaluation of their training data per round."""

    reads_training_losses = True  # every round computes the losses before training for it

    @torch.no_grad()
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Logs ``improved_fraction``: the share of the round's participants
        whose training loss after the step is at most their loss before it."""
        outcome = round_outcome(outputs)
        if outcome is None or outcome.direction is None or outcome.payload is None:
            return
        payload = outcome.payload
        shards = payload.shards
        assert shards is not None, "a round's payload carries its clients' shards"
        losses_after, _ = payload.context.evaluator.shared(
            pl_module.model, (shards.x, shards.y, shards.index, shards.sizes)
        )
        _log(pl_module, {Metric.IMPROVED_FRACTION: float((losses_after <= payload.training_losses()).float().mean())})
