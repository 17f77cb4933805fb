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

from fl_lightning.core.gram import conflict_counts


def _log(pl_module: pl.LightningModule, metrics: dict[str, float]) -> None:
    """With the round's metrics (``FederatedModule.log_round``: one call per round), else ``log_dict``."""
    log_round = getattr(pl_module, "log_round", None)
    if callable(log_round):
        log_round(metrics)
    else:
        pl_module.log_dict(metrics, on_step=False, on_epoch=True, batch_size=1)


class ConflictCounts(Callback):
    """How many clients' updates conflict with the applied step (g_i · d < 0), for the whole
    model and per layer (Li et al., FedLF, AAAI 2024, Table 4).

    Logged every round: ``conflicts_model``, ``conflicts_layer_mean``, ``conflicts_layer_max``;
    at every evaluation: ``conflicts_layer/<layer>``, the per-layer mean since the last one."""

    def __init__(self) -> None:
        self.layer_sums: list[float] = []
        self.rounds = 0

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = (outputs or {}).get("server_step")
        if step is None:
            return
        model_level, per_layer = conflict_counts(outputs["payload"].updates, step, pl_module.layer_slices)
        if len(self.layer_sums) != len(per_layer):
            self.layer_sums = [0.0] * len(per_layer)
        self.layer_sums = [total + count for total, count in zip(self.layer_sums, per_layer)]
        self.rounds += 1
        _log(pl_module, {
            "conflicts_model": float(model_level),
            "conflicts_layer_mean": sum(per_layer) / max(1, len(per_layer)),
            "conflicts_layer_max": float(max(per_layer, default=0)),
        })

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: Any) -> None:
        if not (self.rounds and pl_module._is_eval_round()):
            return
        means = {f"conflicts_layer/{name}": total / self.rounds
                 for name, total in zip(pl_module.layer_names, self.layer_sums)}
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
        if "qp_fallbacks" not in (outputs or {}):
            return
        self.total += int(outputs["qp_fallbacks"])
        _log(pl_module, {"qp_fallbacks_total": float(self.total)})

    def state_dict(self) -> dict[str, Any]:
        return {"total": self.total}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.total = int(state_dict["total"])


class ImprovementShare(Callback):
    """``improved_fraction``: the share of the round's participants whose training loss did not
    increase after the step (Hu et al., FedMGDA+, IEEE TNSE 2022, footnote 6); costs one more
    evaluation of their training data per round."""

    @torch.no_grad()
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (outputs or {}).get("server_step") is None:
            return
        payload = outputs["payload"]
        shards = payload.shards
        losses_after, _ = pl_module.evaluator.shared(pl_module.model, (shards.x, shards.y, shards.index, shards.sizes))
        _log(pl_module, {"improved_fraction": float((losses_after <= payload.losses).float().mean())})
