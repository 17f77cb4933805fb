"""Small convolutional networks of the federated-learning literature.

* ``fl_cnn_mnist``: the MNIST CNN of McMahan et al. (2017), also FedFV's "CNN with 2
  convolution layers on MNIST": 5x5 conv 32 ('same' padding) -> ReLU -> 2x2 max-pool ->
  5x5 conv 64 -> ReLU -> 2x2 max-pool -> fc 512 -> ReLU -> fc classes.
  1,663,370 parameters on (1, 28, 28) with 10 classes, the total McMahan et al. state.
* ``fl_cnn_cifar``: the CIFAR-10 CNN of FedMGDA+ (Hu et al., Table 2), also the CIFAR-10 CNN
  of FedLF/FedFV ("two convolutional layers with 64 channels, fully connected layers of
  384, 192 and 10 neurons"): conv5 64 -> ReLU -> max-pool 2 -> LocalResponseNorm(2) ->
  conv5 64 -> ReLU -> LocalResponseNorm(2) -> max-pool 2 -> 1600 -> 384 -> 192 -> classes.
  Exactly 797,962 parameters on (3, 32, 32) with 10 classes, as in the table.

* ``fl_cnn_femnist``: the Federated EMNIST CNN of Reddi et al. ("Adaptive Federated
  Optimization", ICLR 2021), FedMGDA+ Table 4: conv3 32 -> ReLU -> conv3 64 -> ReLU ->
  max-pool 2 -> dropout 0.25 -> 9216 -> 128 -> ReLU -> dropout 0.5 -> 62. Exactly 1,206,590
  parameters on (1, 28, 28) with 62 classes, as in the table.

All accept other image sizes: the width of the first dense layer follows ``input_shape``.
LocalResponseNorm has no parameters and no state, so the models stay ``vmap``-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
from timm.models import generate_default_cfgs, register_model

from ._builder import as_input_shape, build_fl_model, paper_cfg

__all__ = ["CnnMnist", "CnnCifar", "CnnFemnist"]


class CnnMnist(nn.Module):
    """McMahan et al. (2017) MNIST CNN; 1,663,370 parameters on (1, 28, 28), 10 classes."""

    def __init__(
        self,
        num_classes: int = 10,
        input_shape: Sequence[int] = (1, 28, 28),
        hidden_size: int = 512,
    ) -> None:
        super().__init__()
        self.num_classes = int(num_classes)
        self.input_shape = as_input_shape(input_shape, model="fl_cnn_mnist", image=True)
        channels, height, width = self.input_shape
        if min(height, width) < 4:
            raise ValueError(
                f"fl_cnn_mnist pools twice by 2 and needs H, W >= 4, got input_shape={self.input_shape}"
            )
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(start_dim=1),
        )
        flat = 64 * (height // 4) * (width // 4)
        self.pre_logits = nn.Sequential(nn.Linear(flat, hidden_size), nn.ReLU())
        self.num_features = hidden_size
        self.fc = nn.Linear(hidden_size, self.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pre_logits(self.features(x)))


class CnnCifar(nn.Module):
    """FedMGDA+ Table 2 CIFAR-10 CNN; 797,962 parameters on (3, 32, 32), 10 classes."""

    def __init__(
        self,
        num_classes: int = 10,
        input_shape: Sequence[int] = (3, 32, 32),
        hidden_sizes: Sequence[int] = (384, 192),
    ) -> None:
        super().__init__()
        self.num_classes = int(num_classes)
        self.input_shape = as_input_shape(input_shape, model="fl_cnn_cifar", image=True)
        channels, height, width = self.input_shape
        # two unpadded 5x5 convs, each followed by a 2x2 pool: 32 -> 28 -> 14 -> 10 -> 5
        out_h, out_w = ((height - 4) // 2 - 4) // 2, ((width - 4) // 2 - 4) // 2
        if min(out_h, out_w) < 1:
            raise ValueError(
                "fl_cnn_cifar uses two unpadded 5x5 convs and two 2x2 pools and needs "
                f"H, W >= 16, got input_shape={self.input_shape}"
            )
        self.features = nn.Sequential(
            nn.Conv2d(channels, 64, kernel_size=5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.LocalResponseNorm(2),
            nn.Conv2d(64, 64, kernel_size=5),
            nn.ReLU(),
            nn.LocalResponseNorm(2),
            nn.MaxPool2d(2),
            nn.Flatten(start_dim=1),
        )
        dense: list[nn.Module] = []
        width_in = 64 * out_h * out_w
        for hidden in hidden_sizes:
            dense += [nn.Linear(width_in, int(hidden)), nn.ReLU()]
            width_in = int(hidden)
        self.pre_logits = nn.Sequential(*dense)
        self.num_features = width_in
        self.fc = nn.Linear(width_in, self.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pre_logits(self.features(x)))


class CnnFemnist(nn.Module):
    """Reddi et al. (ICLR 2021) / FedMGDA+ Table 4 FEMNIST CNN; 1,206,590 parameters on
    (1, 28, 28) with 62 classes."""

    def __init__(
        self,
        num_classes: int = 62,
        input_shape: Sequence[int] = (1, 28, 28),
        hidden_size: int = 128,
        drop_rates: Sequence[float] = (0.25, 0.5),
    ) -> None:
        super().__init__()
        self.num_classes = int(num_classes)
        self.input_shape = as_input_shape(input_shape, model="fl_cnn_femnist", image=True)
        channels, height, width = self.input_shape
        out_h, out_w = (height - 4) // 2, (width - 4) // 2  # two unpadded 3x3 convs, one 2x2 pool
        if min(out_h, out_w) < 1:
            raise ValueError(f"fl_cnn_femnist needs H, W >= 6, got input_shape={self.input_shape}")
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, kernel_size=3),
            nn.ReLU(),
            nn.Conv2d(32, 64, kernel_size=3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(drop_rates[0]),
            nn.Flatten(start_dim=1),
        )
        self.pre_logits = nn.Sequential(
            nn.Linear(64 * out_h * out_w, hidden_size), nn.ReLU(), nn.Dropout(drop_rates[1])
        )
        self.num_features = hidden_size
        self.fc = nn.Linear(hidden_size, self.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pre_logits(self.features(x)))


default_cfgs = generate_default_cfgs(
    {
        "fl_cnn_mnist": paper_cfg(
            (1, 28, 28),
            10,
            "McMahan et al. 2017 MNIST CNN (1,663,370 parameters).",
            paper_name="Communication-Efficient Learning of Deep Networks from Decentralized Data",
            first_conv="features.0",
            classifier="fc",
        ),
        "fl_cnn_cifar": paper_cfg(
            (3, 32, 32),
            10,
            "FedMGDA+ Table 2 CIFAR-10 CNN (797,962 parameters).",
            paper_name="FedMGDA+: Federated Learning meets Multi-objective Optimization",
            first_conv="features.0",
            classifier="fc",
        ),
        "fl_cnn_femnist": paper_cfg(
            (1, 28, 28),
            62,
            "Reddi et al. 2021 / FedMGDA+ Table 4 FEMNIST CNN (1,206,590 parameters).",
            paper_name="Adaptive Federated Optimization (ICLR 2021)",
            first_conv="features.0",
            classifier="fc",
        ),
    }
)


@register_model
def fl_cnn_mnist(pretrained: bool = False, **kwargs: Any) -> CnnMnist:
    """McMahan et al. (2017) MNIST CNN; 1,663,370 parameters on (1, 28, 28), 10 classes."""
    return build_fl_model(
        "fl_cnn_mnist", CnnMnist, pretrained, kwargs, num_classes=10, input_shape=(1, 28, 28)
    )


@register_model
def fl_cnn_cifar(pretrained: bool = False, **kwargs: Any) -> CnnCifar:
    """FedMGDA+ CIFAR-10 CNN (Table 2); 797,962 parameters on (3, 32, 32), 10 classes."""
    return build_fl_model(
        "fl_cnn_cifar", CnnCifar, pretrained, kwargs, num_classes=10, input_shape=(3, 32, 32)
    )


@register_model
def fl_cnn_femnist(pretrained: bool = False, **kwargs: Any) -> CnnFemnist:
    """Reddi et al. (2021) FEMNIST CNN (FedMGDA+ Table 4); 1,206,590 parameters, 62 classes."""
    return build_fl_model(
        "fl_cnn_femnist", CnnFemnist, pretrained, kwargs, num_classes=62, input_shape=(1, 28, 28)
    )
