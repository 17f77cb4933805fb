"""Every private name of Lightning, MLflow and PyTorch that fl-lightning relies on, in one place.

Each is wrapped here with why no public API serves, so that an upgrade that renames one breaks
this file (and ``tests/fl_lightning/test_private_api.py``, which checks each against the installed version)
instead of a fit. Nothing else in the package spells these names, except ``core.state``, whose
``_apply`` override moves per-client state that lives off the model's device (it uses
:func:`own_buffers` for the buffers it holds back), and ``core.engines``, whose fused SGD step
calls ``torch._foreach_*`` (PyTorch's multi-tensor kernels, used by its own optimizers).

Checked against lightning 2.5/2.6, mlflow 3.x and torch 2.x.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from lightning.pytorch import LightningModule, Trainer


# --------------------------------------------------------------------------- Lightning
def attached_trainer(module: LightningModule | Any) -> Trainer | None:
    """The trainer a module is attached to, or None (``module.trainer`` raises when detached)."""
    return module._trainer


def record_hparams(owner: Any, values: dict[str, Any]) -> None:
    """Write ``values`` into a module's or data module's saved hyper-parameters, both the live ones
    and the initial ones that checkpoints and loggers read (``save_hyperparameters`` records what
    was passed; a resolved default, such as the seed a None stood for, has no public setter)."""
    for hparams in (owner._hparams, owner._hparams_initial):
        hparams.update(values)


def dump_checkpoint(trainer: Trainer, weights_only: bool) -> dict[str, Any]:
    """The checkpoint ``trainer.save_checkpoint`` would write now, as a dict (not written)."""
    return trainer._checkpoint_connector.dump_checkpoint(weights_only)


def running_epoch_results(trainer: Trainer) -> Any:
    """The running loop's result collection (``None`` outside a loop): the metrics Lightning will
    send to the loggers at the end of the epoch. ``logged_metrics`` and ``callback_metrics`` are
    cumulative, so they cannot tell this round's values from an earlier round's."""
    return trainer._results


# --------------------------------------------------------------------------- MLflow
def initialize_mlflow_tables(engine: Any) -> None:
    """Create an empty MLflow store's tables and migrations on a SQLAlchemy engine, the step
    ``SqlAlchemyStore`` takes for a new database (used once, for the store template)."""
    from mlflow.store.db.utils import _initialize_tables

    _initialize_tables(engine)


def mlflow_client(logger: Any) -> Any:
    """The ``MlflowClient`` a Lightning ``MLFlowLogger`` writes through (None before it has one)."""
    return getattr(logger, "_mlflow_client", None)


def replace_mlflow_client(logger: Any, client: Any) -> None:
    """Make a Lightning ``MLFlowLogger`` write through ``client`` (a buffering wrapper)."""
    logger._mlflow_client = client


# --------------------------------------------------------------------------- PyTorch
def tensor_version(tensor: torch.Tensor) -> int:
    """The tensor's version counter, which every in-place change increases (autograd's own check
    that a saved tensor was not modified)."""
    return int(tensor._version)


def own_buffers(module: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    """A module's own buffer dict, live (not a copy): entries can be taken out and put back
    around ``_apply`` so that ``.to()`` leaves them where they are."""
    return module._buffers
