"""Builders the unit tests share: a round's uploads (``RoundPayload``) made by hand, and the small
CPU Trainer that fits a module on a data module (no logger, checkpoints, progress bar, summary or
sanity check unless a test asks for them)."""

import lightning.pytorch as pl
import torch

from fl_lightning.core.module import RoundPayload

TRAINER = dict(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, num_sanity_val_steps=0)


def trainer(**overrides) -> pl.Trainer:
    """The tests' Trainer: ``TRAINER`` with ``overrides`` (callbacks, a logger, a length...)."""
    return pl.Trainer(**(TRAINER | overrides))


def fit(module, data, **overrides) -> pl.Trainer:
    """Fit ``module`` on the data module ``data`` with ``trainer(**overrides)``; the Trainer."""
    fitted = trainer(**overrides)
    fitted.fit(module, datamodule=data)
    return fitted


def payload(updates, num_samples=None, *, losses=None, accuracies=None, clients=None, round_index=0,
            dtype=torch.float32) -> RoundPayload:
    """Round ``round_index``'s uploads of m clients: the (m, d) ``updates`` g_i and the losses and
    accuracies in ``dtype`` (zeros when not given), clients 0..m-1 unless given, n_i = 10 each
    unless ``num_samples`` is given."""
    updates = torch.as_tensor(updates, dtype=dtype)
    m = updates.shape[0]
    return RoundPayload(
        round=round_index,
        clients=torch.arange(m) if clients is None else torch.as_tensor(clients),
        updates=updates,
        losses=torch.zeros(m, dtype=dtype) if losses is None else torch.as_tensor(losses, dtype=dtype),
        accuracies=torch.zeros(m, dtype=dtype) if accuracies is None else torch.as_tensor(accuracies, dtype=dtype),
        num_samples=torch.full((m,), 10) if num_samples is None else torch.as_tensor(num_samples),
    )
