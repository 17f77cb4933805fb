"""A round's metrics, collected and sent to the loggers in one call.

Lightning's ``self.log`` moves every value through its result collection (about a millisecond
a value on a CPU, twenty values a round). :class:`RoundLog` keeps a round's values (numbers
or tensors) in a dict, converts them all with one host sync, rounded as ``self.log`` rounds a
number (to the default dtype), and does what Lightning does with epoch metrics:

- at the end of the round's step, ``trainer.callback_metrics`` and ``logged_metrics`` hold
  them (monitors such as ``ModelCheckpoint(monitor=...)`` and ``EarlyStopping`` read them);
- they reach the loggers after the round's epoch-end callbacks (its checkpoint), here when the
  next round starts or training ends, so a checkpoint still records the round it ends
  (:attr:`RoundLog.pending`, read by ``callbacks.mlflow_run.round_end_metrics``);
- an evaluation's reach the loggers at the end of its validation epoch, with ``progress_bar``
  values in ``trainer.progress_bar_metrics`` and ``callback_metrics`` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from fl_lightning import private_api

Value = float | int | bool | torch.Tensor


def as_logged(values: dict[str, Value]) -> tuple[dict[str, float], torch.Tensor]:
    """({name: float}, the same values as one tensor): each value as ``self.log`` would log a
    number (a tensor's mean), in the default dtype; the tensors are read with one host sync."""
    dtype = torch.get_default_dtype()
    tensors = [v for v in values.values() if isinstance(v, torch.Tensor)]
    read: list[float] = []
    if tensors:
        device = tensors[0].device
        means = [(v.detach() if v.is_floating_point() else v.detach().to(dtype)).mean().to(device, torch.float64)
                 for v in tensors]
        read = torch.stack(means).tolist()  # the one sync
    numbers = iter(read)
    exact = [next(numbers) if isinstance(v, torch.Tensor) else float(v) for v in values.values()]
    rounded = torch.tensor(exact, dtype=torch.float64).to(dtype)
    return dict(zip(values, rounded.tolist(), strict=True)), rounded


def send(trainer: Any, metrics: dict[str, float], step: int) -> None:
    """``metrics`` to every logger of the trainer with ``step``, as Lightning sends them."""
    if not metrics:
        return
    for logger in trainer.loggers:
        logger.log_metrics(metrics, step=step)
        logger.save()


class RoundLog:
    """The metrics of the running round and evaluation, and the round not yet sent."""

    def __init__(self) -> None:
        self.round_values: dict[str, Value] = {}
        self.round_step = 0
        self.unsent: tuple[int, dict[str, float]] | None = None
        self.evaluation_values: dict[str, Value] = {}
        self.evaluation_step = 0
        self.shown: set[str] = set()

    def add_round(self, metrics: Mapping[str, Value], step: int) -> None:
        self.round_step = step
        self.round_values.update(metrics)

    def add_evaluation(self, metrics: Mapping[str, Value], step: int, progress_bar: bool = False) -> None:
        self.evaluation_step = step
        self.evaluation_values.update(metrics)
        if progress_bar:
            self.shown.update(metrics)

    @property
    def pending(self) -> dict[str, Any] | None:
        """The ended round not sent yet: ``{"step", "metrics"}``, else None."""
        return None if self.unsent is None else {"step": self.unsent[0], "metrics": dict(self.unsent[1])}

    def end_round(self, trainer: Any) -> None:
        """The values collected so far in this round: converted, visible to callbacks, held to send."""
        if not self.round_values:
            return
        step = self.round_step
        values, rounded = as_logged({**self.round_values, "round": step, "step": step})
        self.round_values = {}
        publish(trainer, values, rounded, set())
        del values["step"]
        if self.unsent is not None and self.unsent[0] != step:
            self.send_round(trainer)
        self.unsent = (step, (self.unsent[1] if self.unsent else {}) | values)

    def send_round(self, trainer: Any) -> None:
        """The ended round to the loggers."""
        if self.unsent is None:
            return
        step, metrics = self.unsent
        self.unsent = None
        send(trainer, metrics, step)

    def end_evaluation(self, trainer: Any) -> None:
        """The evaluation's values: visible to callbacks and the progress bar, sent to the loggers."""
        if not self.evaluation_values:
            return
        step, shown = self.evaluation_step, self.shown
        values, rounded = as_logged({**self.evaluation_values, "step": step})
        self.evaluation_values, self.shown = {}, set()
        publish(trainer, values, rounded, shown)
        send(trainer, {k: v for k, v in values.items() if k not in shown and k != "step"}, step)


def publish(trainer: Any, values: dict[str, float], rounded: torch.Tensor, shown: set[str]) -> None:
    """The trainer's views of logged values: ``callback_metrics`` (all, as tensors),
    ``logged_metrics`` (all but ``shown``) and ``progress_bar_metrics`` (``shown``)."""
    tensors = dict(zip(values, rounded.unbind(), strict=True))
    trainer.callback_metrics.update(tensors)
    trainer.logged_metrics.update({k: v for k, v in tensors.items() if k not in shown})
    trainer.progress_bar_metrics.update({k: values[k] for k in shown})


class RoundLogging:
    """``FederatedModule``'s side of the round log: ``log_round`` collects a round's (or an
    evaluation's) metrics, and Lightning's epoch hooks send them (a LightningModule mixin)."""

    if TYPE_CHECKING:  # what FederatedModule (a LightningModule) provides
        round_log: RoundLog
        trainer: Any
        @property
        def _round_index(self) -> int: ...

        def _rounds_completed(self) -> int: ...

    def log_round(self, metrics: Mapping[str, float | torch.Tensor]) -> None:
        """Log metrics of this round with step = rounds completed (the module's and its callbacks';
        an algorithm returns its metrics instead; in an evaluation they join its metrics).
        Collected, converted with one host sync, and sent in one call per round
        (``core.round_log``)."""
        if private_api.attached_trainer(self) is None:
            return
        if self.trainer.training:
            self.round_log.add_round(metrics, self._round_index + 1)
        else:
            self.round_log.add_evaluation(metrics, self._rounds_completed())

    def on_train_epoch_start(self) -> None:
        self.round_log.send_round(self.trainer)  # the previous round's, after its checkpoint

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.round_log.end_round(self.trainer)  # visible to the epoch-end callbacks (monitors, the bar)

    def on_train_epoch_end(self) -> None:
        self.round_log.end_round(self.trainer)  # anything logged after the round's step

    def on_validation_epoch_end(self) -> None:
        self.round_log.end_evaluation(self.trainer)

    def on_train_end(self) -> None:
        self.round_log.end_round(self.trainer)
        self.round_log.send_round(self.trainer)
