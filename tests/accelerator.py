"""The accelerator the engine, module and resume tests run on.

``pytest --accelerator gpu`` runs them on the first CUDA device (what a researcher's
``--trainer.accelerator gpu`` does); the default, ``cpu``, is what CI runs. Kept out of
``conftest.py`` so that test modules can import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from fl_lightning.core.local import ClientShards

ACCELERATOR = "cpu"  # set by conftest.pytest_configure from --accelerator


def accelerator() -> str:
    """The Lightning accelerator name: "cpu" or "gpu"."""
    return ACCELERATOR


def device() -> torch.device:
    import torch

    return torch.device("cuda" if ACCELERATOR == "gpu" else "cpu")


def shards_on(shards: ClientShards) -> ClientShards:
    """``shards`` with their tensors on the test device (sizes also kept on the host, as the module does)."""
    from fl_lightning.core.local import ClientShards

    here = device()
    return ClientShards(shards.x.to(here), shards.y.to(here), shards.index.to(here), shards.sizes.to(here),
                        list(shards.sizes_cpu), None if shards.clients is None else shards.clients.to(here))
