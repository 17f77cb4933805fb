"""Text CNN for sentence classification (Kim, "Convolutional Neural Networks for Sentence
Classification", EMNLP 2014), the text embedding CNN of CGSV on MR and SST (Xu et al.,
NeurIPS 2021, Sec. 4).

* ``fl_text_cnn``: embedding -> for each filter width a 1-d convolution over the words
  (``num_filters`` maps) -> ReLU -> max over time -> concatenated -> dropout -> linear.
  Defaults are Kim's CNN-rand: embedding 300, widths (3, 4, 5) x 100 filters, dropout 0.5, the
  embeddings trained from random initialisation (no pre-trained vectors offline). CGSV's
  published code uses ``kernel_sizes=(3, 3, 3)``, ``num_filters=128`` and a 20,000-word
  vocabulary; pass those to match it.

Inputs are token ids stored as floats, ``(max_length,)`` per sample (sources ``mr``, ``sst``);
the model casts them to integers. Padding id 0 is an ordinary (trained) row, as in CGSV's code.
The stacked rule registered here (one grouped ``conv1d`` per width for all clients) lets the
vectorised engine run it without vmap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.models import generate_default_cfgs, register_model

from ._builder import as_input_shape, build_fl_model, paper_cfg
from .stacked import StackedCall, register_stacked_rule

__all__ = ["TextCnn", "WordConv"]


class WordConv(nn.Conv1d):
    """A 1-d convolution over the words of a sentence, (B, D, T) -> (B, F, T - width + 1):
    ``nn.Conv1d`` with no padding, stride 1 (its own type so that its stacked rule is its own)."""

    def __init__(self, embedding_dim: int, num_filters: int, width: int) -> None:
        super().__init__(embedding_dim, num_filters, width)


class TextCnn(nn.Module):
    """Kim's (EMNLP 2014) sentence CNN.

    Args:
        num_classes: output logits (2 for MR, 5 for SST-5).
        input_shape: ``(max_length,)``, token ids as floats; at least the widest filter.
        vocab_size: embedding rows (the source's ``max_vocab``; default 20,000).
        embedding_dim: embedding width (Kim: 300).
        kernel_sizes: filter widths (Kim: 3, 4, 5).
        num_filters: filters per width (Kim: 100).
        drop_rate: dropout before the classifier (Kim: 0.5).
    """

    def __init__(
        self,
        num_classes: int = 2,
        input_shape: Sequence[int] = (56,),
        vocab_size: int = 20000,
        embedding_dim: int = 300,
        kernel_sizes: Sequence[int] = (3, 4, 5),
        num_filters: int = 100,
        drop_rate: float = 0.5,
    ) -> None:
        super().__init__()
        self.num_classes = int(num_classes)
        self.input_shape = as_input_shape(input_shape, model="fl_text_cnn", image=False)
        widths = tuple(int(k) for k in kernel_sizes)
        if len(self.input_shape) != 1:
            raise ValueError(f"fl_text_cnn takes token sequences, input_shape=(max_length,), got {self.input_shape}")
        if not widths or min(widths) < 1 or max(widths) > self.input_shape[0]:
            raise ValueError(
                f"fl_text_cnn kernel_sizes {widths} must be >= 1 and at most max_length={self.input_shape[0]}"
            )
        self.vocab_size = int(vocab_size)
        self.kernel_sizes = widths
        # a plain parameter (nn.Embedding's N(0, 1) initialisation), looked up with F.embedding
        self.embedding = nn.Parameter(torch.randn(self.vocab_size, int(embedding_dim)))
        for k, width in enumerate(widths):
            self.add_module(f"conv{k}", WordConv(int(embedding_dim), int(num_filters), width))
        self.num_features = len(widths) * int(num_filters)
        self.dropout = nn.Dropout(drop_rate)
        self.fc = nn.Linear(self.num_features, self.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.embedding(x.long(), self.embedding).transpose(-1, -2)  # (B, D, T)
        pooled = [F.relu(getattr(self, f"conv{k}")(h)).amax(dim=-1) for k in range(len(self.kernel_sizes))]
        return self.fc(self.dropout(torch.cat(pooled, dim=-1)))


# --- stacked rule: x [m, B, T], parameters [m, ...] ---------------------------------------


def _stacked(call: StackedCall, module: nn.Module, prefix: str, name: str) -> torch.Tensor:
    weight = call.param(module, prefix, name)
    if weight is None:
        raise ValueError(f"{type(module).__name__} has no parameter {prefix + name!r} to stack")
    return weight


@register_stacked_rule(WordConv)
def _stacked_word_conv(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    """Every client's convolution at once: clients folded into the channels, ``groups = m``."""
    weight = _stacked(call, module, prefix, "weight")  # [m, F, D, k]
    bias = call.param(module, prefix, "bias")  # [m, F]
    m, batch, channels, steps = x.shape
    folded = x.transpose(0, 1).reshape(batch, m * channels, steps)
    out = F.conv1d(folded, weight.reshape(-1, *weight.shape[2:]),
                   None if bias is None else bias.reshape(-1), groups=m)  # [B, m * F, T']
    return out.view(batch, m, weight.shape[1], -1).transpose(0, 1)


@register_stacked_rule(TextCnn)
def _stacked_text_cnn(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    weight = _stacked(call, module, prefix, "embedding")  # [m, V, D]
    index = x.long().reshape(x.shape[0], -1)  # [m, B*T]
    h = torch.gather(weight, 1, index.unsqueeze(-1).expand(-1, -1, weight.shape[-1]))
    h = h.view(*x.shape, weight.shape[-1]).transpose(-1, -2)  # [m, B, D, T]
    pooled = [F.relu(call.child(module, prefix, f"conv{k}", h)).amax(dim=-1)
              for k in range(len(module.kernel_sizes))]  # type: ignore[arg-type]
    features = call.child(module, prefix, "dropout", torch.cat(pooled, dim=-1))
    return call.child(module, prefix, "fc", features)


default_cfgs = generate_default_cfgs(
    {
        "fl_text_cnn": paper_cfg(
            (56,),
            2,
            "Kim (2014) text CNN: embedding 300, widths 3/4/5 x 100, max over time, dropout 0.5 (MR, SST).",
            paper_name="Gradient-Driven Rewards to Guarantee Fairness in Collaborative Machine Learning",
            classifier="fc",
        ),
    }
)


@register_model
def fl_text_cnn(pretrained: bool = False, **kwargs: Any) -> TextCnn:
    """Kim's sentence CNN (EMNLP 2014), the text CNN of CGSV (NeurIPS 2021, Sec. 4) on MR and SST."""
    return build_fl_model("fl_text_cnn", TextCnn, pretrained, kwargs, num_classes=2, input_shape=(56,))
