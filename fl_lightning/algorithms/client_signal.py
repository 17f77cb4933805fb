"""What a client's row of J means for FedLF and FedMDFG: its update (``"update"``) or its full
local gradient at w (``"full_batch"``, the signal of both papers' authors' code)."""

from __future__ import annotations

from typing import Literal

import torch

from fl_lightning.core.local import ClientShards, LocalSGD
from fl_lightning.core.payload import RoundContext

GradientSignal = Literal["update", "full_batch"]  # what a client's row of J means (FedLF, FedMDFG)


def full_batch_gradients(context: RoundContext, shards: ClientShards) -> torch.Tensor:
    """Every client's full local gradient ∇F_i(w), (m, d): one full-batch SGD step with lr 1
    from w gives w − w' = ∇F_i(w) (the client signal of the FedLF and FedMDFG authors' code);
    ``context`` is the round's ``RoundContext``."""
    one_step = LocalSGD(lr=1.0, epochs=1, batch_size=None)
    trained = context.local_train(shards, sgd=one_step)
    return context.global_vector.unsqueeze(0) - context.layout.flatten_stacked(trained)


