"""Clients whose training data is corrupted on purpose: noisy labels and noisy inputs.

CGSV (Xu et al., NeurIPS 2021, Sec. 3.3 and Fig. 2) gives 3 of 5 agents 20%, 40% and 60%
"randomly corrupted labels" to show that their gradients are valued, and rewarded, less.
Here a corrupted label is replaced by one of the *other* classes, uniformly, so a fraction f of
a client's n training labels means exactly round(f n) wrong labels. Feature noise adds
N(0, std²) to every input of the client. Both are drawn from the data seed and the client's id
only (the same data whatever the number of processes), and touch training data only: test
sets stay clean, so a noisy client's accuracy shows what its noise cost it.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

NoiseSpec = Mapping[int, float]


def check_noise(name: str, spec, num_clients: int, upper: float | None) -> dict[int, float]:
    """``spec`` as {client id: value}, or a ValueError that says what to change."""
    if spec is None:
        return {}
    example = "{0: 0.2, 1: 0.4}" if upper == 1.0 else "{0: 0.5}"
    if not isinstance(spec, Mapping):
        raise ValueError(f"{name} must map client ids to values, e.g. {example}, got {spec!r}")
    checked = {}
    for client, value in spec.items():
        try:
            k = int(client)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: client id {client!r} is not an integer; use e.g. {example}") from None
        if not 0 <= k < num_clients:
            raise ValueError(f"{name}: client {k} does not exist (num_clients={num_clients}: ids 0..{num_clients - 1})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
            raise ValueError(f"{name}[{k}] must be a number, got {value!r}")
        if value < 0 or (upper is not None and value > upper):
            bounds = f"in [0, {upper:g}]" if upper is not None else ">= 0"
            raise ValueError(f"{name}[{k}] must be {bounds}, got {value!r}")
        checked[k] = float(value)
    return checked


def _client_rng(seed: int, purpose: str, client: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, client, *purpose.encode()]))


def noisy_label_positions(num_samples: int, fraction: float, seed: int, client: int) -> np.ndarray:
    """The round(fraction · n) positions among a client's n training samples whose labels change."""
    count = int(round(fraction * num_samples))
    return np.sort(_client_rng(seed, "label_noise", client).choice(num_samples, count, replace=False))


def corrupt_labels(labels: torch.Tensor, fraction: float, num_classes: int, seed: int, client: int) -> torch.Tensor:
    """A copy of one client's labels with round(fraction · n) of them replaced by another class."""
    positions = noisy_label_positions(len(labels), fraction, seed, client)
    if num_classes < 2 or len(positions) == 0:
        return labels.clone()
    rng = _client_rng(seed, "label_noise_classes", client)
    shift = torch.as_tensor(rng.integers(1, num_classes, len(positions)), dtype=labels.dtype)
    out = labels.clone()
    index = torch.as_tensor(positions)
    out[index] = (out[index] + shift) % num_classes  # uniform over the other classes
    return out


def add_feature_noise(inputs: torch.Tensor, std: float, seed: int, client: int) -> torch.Tensor:
    """One client's inputs plus N(0, std²) noise (float32, seeded per client)."""
    if std == 0 or len(inputs) == 0:
        return inputs.clone()
    noise = _client_rng(seed, "feature_noise", client).standard_normal(tuple(inputs.shape))
    return inputs + torch.as_tensor(noise, dtype=inputs.dtype) * std


def apply_client_noise(
    x: torch.Tensor, y: torch.Tensor, sizes: torch.Tensor, num_classes: int, seed: int,
    label_noise: NoiseSpec, feature_noise: NoiseSpec,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The packed training tensors (clients contiguous, in id order, ``sizes`` each) with each
    listed client's labels / inputs corrupted; the others are returned unchanged."""
    if not label_noise and not feature_noise:
        return x, y
    x, y = x.clone(), y.clone()
    offsets = (torch.cumsum(sizes, 0) - sizes).tolist()
    for client, fraction in label_noise.items():
        part = slice(offsets[client], offsets[client] + int(sizes[client]))
        y[part] = corrupt_labels(y[part], fraction, num_classes, seed, client)
    for client, std in feature_noise.items():
        part = slice(offsets[client], offsets[client] + int(sizes[client]))
        x[part] = add_feature_noise(x[part], std, seed, client)
    return x, y
