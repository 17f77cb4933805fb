"""Inputs a registered model accepts: token ids (as floats) for the models with a vocabulary,
Gaussian features or images for the others."""

import torch


def sample_inputs(model: torch.nn.Module, *shape: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """A tensor of ``shape`` (ending in the model's input shape) that ``model`` can read."""
    vocab = getattr(model, "vocab_size", None)
    if vocab is not None:
        return torch.randint(0, int(vocab), shape, generator=generator).float()
    return torch.randn(*shape, generator=generator)
