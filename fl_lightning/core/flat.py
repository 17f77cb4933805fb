"""Flat views of model parameters.

Every aggregation rule works on client updates as rows of a matrix J (m x d): one flat
vector per client, laid out in the order of ``model.named_parameters()``.
``ParameterLayout`` converts between that flat layout and named tensors, for one model
(a vector of d) or for many clients at once (stacked tensors [m, ...] <-> [m, d]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fl_lightning.core.settings import LayerGrouping, check_setting


@dataclass(frozen=True)
class ParameterLayout:
    """Names, shapes and offsets of a model's trainable parameters in the flat vector."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]

    @classmethod
    def of(cls, model: nn.Module) -> ParameterLayout:
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        return cls(tuple(n for n, _ in named), tuple(p.shape for _, p in named))

    @property
    def numels(self) -> tuple[int, ...]:
        return tuple(int(torch.Size(s).numel()) for s in self.shapes)

    @property
    def num_parameters(self) -> int:
        return sum(self.numels)

    def slices(self) -> dict[str, slice]:
        """Where each named tensor lives in the flat vector (one group per tensor)."""
        out, start = {}, 0
        for name, n in zip(self.names, self.numels):
            out[name] = slice(start, start + n)
            start += n
        return out

    def flatten(self, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        """Named tensors -> flat vector (d,)."""
        return torch.cat([tensors[n].reshape(-1) for n in self.names])

    def flatten_stacked(self, stacked: dict[str, torch.Tensor]) -> torch.Tensor:
        """Stacked named tensors [m, ...] -> rows of J (m, d)."""
        first = stacked[self.names[0]]
        return torch.cat([stacked[n].reshape(first.shape[0], -1) for n in self.names], dim=1)

    def unflatten(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Flat vector (d,) -> named tensors (views into ``flat``)."""
        pieces = torch.split(flat, list(self.numels))
        return {n: p.view(s) for n, p, s in zip(self.names, pieces, self.shapes)}

    def unflatten_stacked(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """Rows (m, d) -> stacked named tensors [m, ...] (views into ``rows``)."""
        pieces = torch.split(rows, list(self.numels), dim=1)
        return {n: p.reshape(rows.shape[0], *s) for n, p, s in zip(self.names, pieces, self.shapes)}


def model_vector(model: nn.Module, layout: ParameterLayout) -> torch.Tensor:
    """The model's trainable parameters as one detached flat vector."""
    params = dict(model.named_parameters())
    return torch.cat([params[n].detach().reshape(-1) for n in layout.names])


@torch.no_grad()
def assign_model_vector(model: nn.Module, layout: ParameterLayout, flat: torch.Tensor) -> None:
    """Copy a flat vector into the model's parameters, in place."""
    params = dict(model.named_parameters())
    for name, value in layout.unflatten(flat).items():
        params[name].copy_(value)


def layer_slices(model: nn.Module, layout: ParameterLayout, grouping: str = "tensor") -> list[slice]:
    """Contiguous slices of the flat vector that form the model's "layers".

    ``"tensor"``: one group per parameter tensor (what the FedLF authors' code does);
    ``"module"``: one group per module, its weight and bias together (what the FedLF
    paper's Table 4 counts as a layer). A module's own parameters are adjacent in
    ``named_parameters()`` order, so every group is one slice.
    """
    check_setting("layer_grouping", grouping, LayerGrouping)
    slices = layout.slices()
    if grouping == "tensor":
        return [slices[name] for name in layout.names]
    groups: list[slice] = []
    owner_of = {name: name.rpartition(".")[0] for name in layout.names}
    current_owner = None
    for name in layout.names:
        piece = slices[name]
        if groups and owner_of[name] == current_owner and groups[-1].stop == piece.start:
            groups[-1] = slice(groups[-1].start, piece.stop)
        else:
            groups.append(piece)
        current_owner = owner_of[name]
    return groups


def layer_names(layout: ParameterLayout, grouping: str = "tensor") -> list[str]:
    """A readable name per layer group (the tensor name, or the module name)."""
    if grouping == "tensor":
        return list(layout.names)
    names: list[str] = []
    for name in layout.names:
        owner = name.rpartition(".")[0] or name
        if not names or names[-1] != owner:
            names.append(owner)
    return names
