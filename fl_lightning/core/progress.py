"""What a fit prints: one progress bar over communication rounds (one Lightning epoch = one
round), no model table, and the line it ends with.

:class:`RoundProgressBar` is a ``TQDMProgressBar`` in type, so that a ``FederatedModule`` can
return it from ``configure_callbacks`` and Lightning puts it in place of a Trainer's default bar
(a callback the module returns replaces the Trainer's of the same class or a parent class); in
behaviour one bar for the whole fit instead of a bar per epoch and per validation.
:class:`NoModelSummary` takes the place of the default ``ModelSummary`` the same way,
:class:`FitSummary` prints the closing line (the CLI's ``FitReport`` is one), and
:class:`QuietLightningWarnings` hides a deprecation warning Lightning's own code raises.
:func:`console_callbacks` is what a module returns of these for a given Trainer.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelSummary, TQDMProgressBar
from tqdm.auto import tqdm

from fl_lightning.records.vocabulary import Metric

_SHOWN = {
    f"{Metric.TEST_ACC_MEAN}_now": "mean acc",
    f"{Metric.GLOBAL_TEST_ACC}_now": "global acc",
    Metric.TRAIN_LOSS: "loss",
}


class RoundProgressBar(TQDMProgressBar):
    """One bar for the whole fit: rounds done / num_rounds, with the live mean client accuracy,
    and ``note`` when one is set (e.g. "tracking server unreachable, retrying (3 rounds held)")."""

    def __init__(self) -> None:
        super().__init__()
        self._bar: Any = None
        self.note: str | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Opens the fit's bar: rounds, from the round a resumed fit starts at up to ``max_epochs``."""
        self._bar = tqdm(
            total=trainer.max_epochs,
            initial=trainer.current_epoch,
            desc="rounds",
            unit="round",
            disable=not self.is_enabled,
            dynamic_ncols=True,
            file=sys.stdout,
        )

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Advances the bar by one round and shows the latest mean and global
        accuracy, the training loss and the note; closes it after the last round."""
        if self._bar is None:
            return
        metrics = trainer.progress_bar_metrics | {
            k: v for k, v in trainer.callback_metrics.items() if k == Metric.TRAIN_LOSS
        }
        shown = {label: f"{float(metrics[key]):.4f}" for key, label in _SHOWN.items() if key in metrics}
        if self.note:
            shown["note"] = self.note
        self._bar.set_postfix(shown, refresh=False)
        self._bar.update(1)
        if self._bar.n >= (self._bar.total or float("inf")):  # the last round: done before Lightning says so
            self.on_train_end(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """A stopped or failed fit ends its bar too, so that what it prints next starts a line."""
        self.on_train_end(trainer, pl_module)

    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        """``LightningModule.print``: above the bar while it runs, a plain line otherwise."""
        if self._bar is not None:
            self._bar.write(sep.join(map(str, args)), file=sys.stdout)
        else:
            print(*args, sep=sep, **kwargs)

    # TQDMProgressBar's own bars (a bar per epoch, sanity check, validation, test, predict): none
    def _nothing(self, *args: Any, **kwargs: Any) -> None:
        return None

    on_sanity_check_start = on_sanity_check_end = _nothing
    on_train_epoch_start = on_train_batch_end = _nothing
    on_validation_start = on_validation_batch_start = on_validation_batch_end = on_validation_end = _nothing
    on_test_start = on_test_batch_start = on_test_batch_end = on_test_end = _nothing
    on_predict_start = on_predict_batch_start = on_predict_batch_end = on_predict_end = _nothing


class NoModelSummary(ModelSummary):
    """In place of Lightning's default model summary: no table (``max_depth=0``, Lightning's
    own off switch). A federated fit names its model by ``backbone``; the CLI prints none either."""

    def __init__(self) -> None:
        super().__init__(max_depth=0)


ACCURACIES = (("mean client accuracy", Metric.TEST_ACC_MEAN), ("worst 10%", Metric.TEST_ACC_WORST10))
"""The client accuracies a finished fit reports: (label, metric)."""


def final_accuracy(trainer: pl.Trainer, logged: Mapping[str, float], key: str) -> float | None:
    """The fit's last value of ``key`` (a client-accuracy metric): the trainer's, else the run's
    latest ``logged`` one."""
    metric = trainer.callback_metrics.get(key)
    if metric is not None:
        return float(metric)
    value = logged.get(key)
    return None if value is None else float(value)


def summary_line(trainer: pl.Trainer, logged: Mapping[str, float] | None = None, run_name: str | None = None) -> str:
    """The line a finished fit ends with: rounds, the mean and worst-10 % client accuracy and,
    for a logged run, its name."""
    accuracies = [(label, final_accuracy(trainer, logged or {}, key)) for label, key in ACCURACIES]
    scores = ", ".join(f"{label} {100 * value:.2f}%" for label, value in accuracies if value is not None)
    line = f"Done: {trainer.current_epoch} rounds, {scores or 'no evaluation logged'}"
    return f"{line}; run '{run_name}'" if run_name is not None else line


class FitSummary(Callback):
    """Prints :func:`summary_line` when the fit ends (rank 0). The CLI's ``FitReport`` is a
    ``FitSummary`` that adds the run's name and how to open it in the MLflow UI."""

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            print(summary_line(trainer), flush=True)


LIGHTNING_DEPRECATIONS = (r".*isinstance\(treespec, LeafSpec\)", r"The pynvml package is deprecated")
"""Deprecation warnings that Lightning's or torch's own code raises and no user of fl-lightning can
act on: torch (2.14) deprecates ``LeafSpec``, which ``lightning/pytorch/utilities/_pytree.py``
(Lightning 2.6) builds for every fit's ``CombinedLoader``; and where the ``pynvml`` package is
installed (common on GPU machines), torch's use of it raises that package's own ``FutureWarning``
("The pynvml package is deprecated. Please install nvidia-ml-py instead."), which a fit printed
after its closing line."""


class QuietLightningWarnings(Callback):
    """Hides :data:`LIGHTNING_DEPRECATIONS` from the fit's start on: a process-wide ``warnings``
    filter on those messages only, as the CLI sets. A federated round is one batch, so Lightning's
    logging interval (``log_every_n_steps``, 50 by default, which it warns is longer than the
    epoch) is set to 1, as the CLI's Trainer has it: every round's values are logged."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for message in LIGHTNING_DEPRECATIONS:
            warnings.filterwarnings("ignore", message=message, category=FutureWarning)
        if getattr(trainer, "log_every_n_steps", 1) > 1:  # set by Lightning's logger connector, undeclared
            setattr(trainer, "log_every_n_steps", 1)  # noqa: B010


def console_callbacks(trainer: pl.Trainer | None) -> list[Callback]:
    """What a fit through ``trainer`` prints, as the module's callbacks: with Lightning's default
    bar (a plain ``TQDMProgressBar``), the rounds bar and, unless the Trainer already has one, the
    closing line; in place of the default ``ModelSummary`` (a plain one), no table; Lightning's
    deprecation warnings hidden. A bar or summary of another class, or none, is left alone."""
    callbacks = trainer.callbacks if trainer is not None else []  # type: ignore[attr-defined]
    own: list[Callback] = [QuietLightningWarnings()]
    if trainer is not None and type(trainer.progress_bar_callback) is TQDMProgressBar:
        own.append(RoundProgressBar())
        if not any(isinstance(callback, FitSummary) for callback in callbacks):
            own.append(FitSummary())
    if any(type(callback) is ModelSummary for callback in callbacks):
        own.append(NoModelSummary())
    return own
