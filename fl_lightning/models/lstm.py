"""Character-level LSTM of the federated Shakespeare benchmark.

* ``fl_lstm_chars``: embedding of dimension 8 -> two-layer LSTM of hidden size 256 -> dense
  layer to the vocabulary from the last step, the Shakespeare model of McMahan et al.
  (AISTATS 2017), FedProx (Li et al., MLSys 2020) and FedMGDA+ (Hu et al., Sec. 6.1.3), for
  80-character sequences over LEAF's 80-letter vocabulary (default ``num_classes=80``).

Inputs are character indices stored as floats (data sources give float inputs); the model
casts them to integers. The LSTM is written with explicit gate matmuls (``nn.Linear``), not
``nn.LSTM``, so that ``torch.func.vmap`` and the stacked forward of the vectorised engine
both run it; its stacked rule (one batched matmul per gate block for all clients) is
registered here, as is the one of ``fl_cnn_femnist``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.models import generate_default_cfgs, register_model

from ._builder import as_input_shape, build_fl_model, paper_cfg
from .cnn import CnnFemnist
from .stacked import StackedCall, register_stacked_rule

__all__ = ["CharLstm", "LstmLayer"]


class LstmLayer(nn.Module):
    """One LSTM layer, gates (i, f, g, o) as in ``nn.LSTM``: ``input`` projects x_t (with the
    bias), ``hidden`` projects h_{t-1} (no bias). Zero initial state."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.hidden_size = int(hidden_size)
        self.input = nn.Linear(input_size, 4 * self.hidden_size)
        self.hidden = nn.Linear(self.hidden_size, 4 * self.hidden_size, bias=False)
        bound = self.hidden_size ** -0.5  # nn.LSTM's initialisation
        for parameter in self.parameters():
            nn.init.uniform_(parameter, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, input_size) -> (B, T, hidden_size)."""
        return _recur(self.input(x), lambda h: self.hidden(h), self.hidden_size)


def _recur(projected: torch.Tensor, hidden_projection, hidden_size: int) -> torch.Tensor:
    """The LSTM recurrence over dim -2 of ``projected`` (the inputs' gate pre-activations)."""
    steps = projected.shape[-2]
    h = projected.new_zeros(*projected.shape[:-2], hidden_size)
    c = torch.zeros_like(h)
    outputs = []
    for t in range(steps):
        gates = projected[..., t, :] + hidden_projection(h)
        i, f, g, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs, dim=-2)


class CharLstm(nn.Module):
    """Embedding -> stacked LSTM layers -> linear to ``num_classes`` from the last step.

    Args:
        num_classes: output logits (the vocabulary of the next character).
        input_shape: ``(sequence_length,)``, character indices stored as floats.
        vocab_size: embedding rows (default: ``num_classes``).
        embedding_dim: character embedding width (FedMGDA+ Sec. 6.1.3: 8).
        hidden_size: LSTM width (FedMGDA+ Sec. 6.1.3: 256).
        num_layers: LSTM layers (FedMGDA+ Sec. 6.1.3: 2).
    """

    def __init__(
        self,
        num_classes: int = 80,
        input_shape: Sequence[int] = (80,),
        vocab_size: int | None = None,
        embedding_dim: int = 8,
        hidden_size: int = 256,
        num_layers: int = 2,
    ) -> None:
        super().__init__()
        self.num_classes = int(num_classes)
        self.input_shape = as_input_shape(input_shape, model="fl_lstm_chars", image=False)
        if len(self.input_shape) != 1:
            raise ValueError(f"fl_lstm_chars takes sequences, input_shape=(length,), got {self.input_shape}")
        if num_layers < 1:
            raise ValueError(f"fl_lstm_chars needs num_layers >= 1, got {num_layers}")
        self.vocab_size = int(vocab_size or num_classes)
        # a plain parameter and named layers (not nn.Embedding / nn.ModuleList): every
        # submodule then has a stacked rule, registered below
        self.embedding = nn.Parameter(torch.randn(self.vocab_size, embedding_dim))  # nn.Embedding's init
        sizes = [embedding_dim] + [hidden_size] * num_layers
        self.num_layers = int(num_layers)
        for k, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            self.add_module(f"lstm{k}", LstmLayer(a, b))
        self.num_features = int(hidden_size)
        self.fc = nn.Linear(hidden_size, self.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.embedding(x.long(), self.embedding)
        for k in range(self.num_layers):
            h = getattr(self, f"lstm{k}")(h)
        return self.fc(h[..., -1, :])


# --- stacked rules: x [m, B, ...], parameters [m, ...] ------------------------------------


def _stacked_param(call: StackedCall, module: nn.Module, prefix: str, name: str) -> torch.Tensor:
    weight = call.param(module, prefix, name)
    if weight is None:
        raise ValueError(f"{type(module).__name__} has no parameter {prefix + name!r} to stack")
    return weight


@register_stacked_rule(CharLstm)
def _stacked_char_lstm(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    weight = _stacked_param(call, module, prefix, "embedding")  # [m, V, E]
    index = x.long().reshape(x.shape[0], -1)  # [m, B*T]
    h = torch.gather(weight, 1, index.unsqueeze(-1).expand(-1, -1, weight.shape[-1]))
    h = h.view(*x.shape, weight.shape[-1])  # [m, B, T, E]
    for k in range(int(module.num_layers)):  # type: ignore[arg-type]
        h = call.child(module, prefix, f"lstm{k}", h)
    return call.child(module, prefix, "fc", h[..., -1, :])


@register_stacked_rule(LstmLayer)
def _stacked_lstm_layer(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    projected = call.child(module, prefix, "input", x)  # [m, B, T, 4H]
    hidden = module.get_submodule("hidden")
    weight = _stacked_param(call, hidden, f"{prefix}hidden.", "weight")  # [m, 4H, H]
    return _recur(projected, lambda h: torch.bmm(h, weight.transpose(1, 2)), int(module.hidden_size))  # type: ignore[arg-type]


def _children_in_order(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    for name in ("features", "pre_logits", "fc"):
        x = call.child(module, prefix, name, x)
    return x


register_stacked_rule(CnnFemnist)(_children_in_order)


default_cfgs = generate_default_cfgs(
    {
        "fl_lstm_chars": paper_cfg(
            (80,),
            80,
            "Character LSTM: embedding 8, 2 x LSTM 256, dense to the vocabulary (Shakespeare).",
            paper_name="FedMGDA+: Federated Learning meets Multi-objective Optimization",
            classifier="fc",
        ),
    }
)


@register_model
def fl_lstm_chars(pretrained: bool = False, **kwargs: Any) -> CharLstm:
    """Shakespeare character LSTM (FedMGDA+ Sec. 6.1.3): embedding 8, two LSTM layers of 256."""
    return build_fl_model("fl_lstm_chars", CharLstm, pretrained, kwargs, num_classes=80, input_shape=(80,))
