"""How a ``FederatedModule`` reaches its clients' data: the Trainer's ``FederatedDataModule``
(or one attached without a Trainer), checked against the model, sliced per client."""

from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch

from fl_lightning import private_api
from fl_lightning.core.local import ClientDataSlicer, ClientShards


class FederatedDataLink:
    """``federated_data``, ``attach_data``, ``check_data`` and ``client_shards`` of ``FederatedModule``."""

    _attached_data: Any = None
    _slicer: ClientDataSlicer | None = None
    _training_view: tuple[torch.Tensor, torch.Tensor, Any] | None = None  # (train_index, train_sizes, their view)
    if TYPE_CHECKING:  # what FederatedModule (a LightningModule) provides
        from lightning.pytorch.utilities.parsing import AttributeDict

        attacker: Any
        device: torch.device
        trainer: Any

        @property
        def hparams(self) -> AttributeDict: ...

        def training_samples(self, data: Any) -> tuple[torch.Tensor, torch.Tensor]: ...

    @property
    def num_clients_total(self) -> int:
        """K, every client of the federation (known once the data module is attached)."""
        return int(self.federated_data.num_clients)

    def client_shards(self, clients: torch.Tensor, split: str = "train") -> ClientShards:
        """The data of ``clients`` (ids on the CPU); in ``"train"``, the samples they train on
        (``training_samples``)."""
        if self._slicer is None:
            self._slicer = ClientDataSlicer()
        data = self.federated_data
        return self._slicer.shards(self._training_data(data) if split == "train" else data, clients, split)

    def _training_data(self, data: Any) -> Any:
        """``data`` with the index and sizes ``training_samples`` makes of its own, asked once per
        data tensors; ``data`` itself when they are unchanged (the default)."""
        cached = self._training_view
        if cached is None or cached[0] is not data.train_index or cached[1] is not data.train_sizes:
            index, sizes = self.training_samples(data)
            unchanged = index is data.train_index and sizes is data.train_sizes
            view = None if unchanged else SimpleNamespace(train_x=data.train_x, train_y=data.train_y,
                                                          train_index=index, train_sizes=sizes)
            cached = self._training_view = (data.train_index, data.train_sizes, view)
        return data if cached[2] is None else cached[2]

    @property
    def federated_data(self) -> Any:
        """The FederatedDataModule: the trainer's, or one given to ``attach_data``."""
        datamodule = getattr(self.trainer, "datamodule", None) if private_api.attached_trainer(self) else None
        datamodule = datamodule if datamodule is not None else self._attached_data
        if datamodule is None or not hasattr(datamodule, "train_index"):
            raise RuntimeError(
                "FederatedModule needs a FederatedDataModule: call trainer.fit(module, datamodule=...)"
                " (or module.attach_data(datamodule) to use it without a Trainer)"
            )
        return datamodule

    def attach_data(self, datamodule: Any) -> None:
        """Use ``datamodule`` without a Trainer (notebooks, benchmarks of the server step)."""
        self._attached_data = datamodule

    def _check_data(self) -> None:
        """Refuses data that does not fit the model (classes, input shape, attacker id); moves it to the
        model's device."""
        data = self.federated_data
        if data.num_classes != self.hparams.num_classes:
            raise ValueError(f"the model has {self.hparams.num_classes} classes but the data has {data.num_classes}: "
                             "set model.num_classes to match (the CLI links it automatically)")
        if tuple(data.input_shape) != tuple(self.hparams.input_shape):
            raise ValueError(f"the model expects inputs {tuple(self.hparams.input_shape)} but the data has "
                             f"{tuple(data.input_shape)}: set model.input_shape to match")
        if self.attacker is not None:
            self.attacker.check(self.num_clients_total)
        if data.train_x.device != self.device:
            data.to(self.device)
