"""timm-registered model zoo of fl-lightning.

Importing this package registers every ``fl_*`` model in timm's registry, so
``timm.create_model("fl_cnn_cifar", num_classes=10, input_shape=(3, 32, 32))`` works.
Every model takes a batch ``(B, *input_shape)`` and returns logits ``(B, num_classes)``;
none has BatchNorm or buffers that change in ``forward`` (the vectorised federated engine
runs clients with their stacked forms, ``models/stacked.py``, or ``torch.func.vmap``), and
none has pretrained weights.

=========================  ==================================================  =============
name                       model                                               default input
=========================  ==================================================  =============
fl_logreg                  multinomial logistic regression                     (60,)
fl_mlp                     FedLF MLP 784-200-200-10                            (1, 28, 28)
fl_ffn                     FedFV feed-forward net, 2 hidden layers of 200      (3, 32, 32)
fl_cnn_mnist               McMahan et al. 2017 MNIST CNN                       (1, 28, 28)
fl_cnn_cifar               FedMGDA+ Table 2 CIFAR-10 CNN                       (3, 32, 32)
fl_nf_resnet18             NF-ResNet-18, small widths (16, 32, 64, 128)        (3, 32, 32)
fl_nf_resnet18_standard    NF-ResNet-18, widths (64, 128, 256, 512)            (3, 32, 32)
fl_nf_resnet18_fedlf       FedLF reference layout: stem 64 + pool, (16,32,64)  (3, 32, 32)
fl_cct_7_3x1               Compact Convolutional Transformer CCT-7/3x1         (3, 32, 32)
=========================  ==================================================  =============

Default ``num_classes`` is 10, except 100 for the CIFAR-100 models of FedLF
(NF-ResNet-18 and CCT).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import timm
import torch.nn as nn

from fl_lightning.records.errors import did_you_mean

from . import cct, cnn, lstm, mlp, nf_resnet, text_cnn  # noqa: F401  (registers the models with timm)
from .cct import CompactTransformer
from .cnn import CnnCifar, CnnMnist
from .mlp import FeedForwardNet
from .nf_resnet import NfResNet

__all__ = [
    "CnnCifar",
    "CnnMnist",
    "CompactTransformer",
    "FeedForwardNet",
    "NfResNet",
    "create_fl_model",
    "list_fl_models",
]

MODEL_PREFIX = "fl_"


def list_fl_models() -> list[str]:
    """Sorted names of the fl-lightning models registered in timm (all start with ``fl_``)."""
    return sorted(timm.list_models(f"{MODEL_PREFIX}*"))


def create_fl_model(
    name: str, num_classes: int, input_shape: Sequence[int], **kwargs: Any
) -> nn.Module:
    """Build the registered model ``name`` for ``num_classes`` and one sample of ``input_shape``.

    Extra keyword arguments go to the model (e.g. ``width="standard"`` for NF-ResNet-18,
    ``hidden_sizes=(100,)`` for the MLPs). Raises ``ValueError`` for an unknown name or a
    ``num_classes`` that is not a positive integer.
    """
    valid = list_fl_models()
    if name not in valid:
        raise ValueError(f"unknown fl-lightning model {name!r}; valid names: {', '.join(valid)}"
                         f"{did_you_mean(name, valid)}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
        raise ValueError(
            f"{name}: num_classes must be a positive integer (the number of output logits, e.g. 10), "
            f"got {num_classes!r}; it must match the data (FederatedDataModule.num_classes)"
        )
    return timm.create_model(
        name, num_classes=int(num_classes), input_shape=tuple(input_shape), **kwargs
    )
