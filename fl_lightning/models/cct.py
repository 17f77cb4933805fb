"""Compact Convolutional Transformer (Hassani et al. 2021, "Escaping the Big Data Paradigm
with Compact Transformers") for small images, built from timm layers.

``fl_cct_7_3x1`` is CCT-7/3x1, the model FedLF's appendix B.3 trains on CIFAR-100:

* convolutional tokenizer: ONE 3x3 conv (stride 1, padding 1, no bias, 256 channels) ->
  ReLU -> 3x3/2 max-pool (padding 1); a 32x32 image gives 16x16 = 256 tokens of width 256;
* learnable positional embedding (truncated normal, std 0.2) or fixed sinusoidal;
* 7 encoder layers, 4 heads, MLP ratio 2 (hidden 512), GELU; the layer is CCT's own
  layout, ``x = x + drop_path(attn(LN(x))); x = LN(x); x = x + drop_path(mlp(x))``, with
  timm's ``Attention`` (no qkv bias), ``Mlp`` and ``DropPath``;
* sequence pooling instead of a class token: a final LayerNorm, then softmax weights from a
  ``Linear(256, 1)`` over the tokens, a weighted sum and the linear classifier.

CIFAR defaults of the CCT paper (and FedLF's code): dropout 0, attention dropout 0.1,
stochastic depth 0.1. Parameters with a learnable positional embedding: 3,783,269 for 100
classes and 3,760,139 for 10 classes (65,536 fewer with ``positional_embedding="sine"``).

Attention runs timm's explicit ``softmax(q k^T) v`` path by default (``fused_attn=False``)
because it batches cleanly under ``torch.func.vmap``. With the fused
``scaled_dot_product_attention`` PyTorch (2.14, CPU) warns that its kernel has no vmap
batching rule and falls back to a loop over clients (not measured on a GPU). Pass
``fused_attn=True`` for ordinary, non-vmapped training.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Attention, DropPath, Mlp, trunc_normal_
from timm.models import generate_default_cfgs, register_model

from ._builder import as_input_shape, build_fl_model, paper_cfg

__all__ = ["ConvTokenizer", "CctEncoderLayer", "CompactTransformer"]

_POSITIONAL_EMBEDDINGS = ("learnable", "sine", "none")


class ConvTokenizer(nn.Module):
    """``n_conv_layers`` x (conv k x k -> ReLU -> max-pool 3/2), then one token per pixel."""

    def __init__(
        self,
        in_chans: int,
        embed_dim: int,
        kernel_size: int = 3,
        n_conv_layers: int = 1,
        mid_chans: int = 64,
    ) -> None:
        super().__init__()
        widths = [in_chans] + [mid_chans] * (n_conv_layers - 1) + [embed_dim]
        # CCT's rule: a 3x3 tokenizer conv has stride 1 and padding 1, a 7x7 one stride 2, padding 3
        self.kernel_size = kernel_size
        self.stride = stride = max(1, kernel_size // 2 - 1)
        self.padding = padding = max(1, kernel_size // 2)
        layers: list[nn.Module] = []
        for c_in, c_out in zip(widths[:-1], widths[1:], strict=True):
            layers += [
                nn.Conv2d(c_in, c_out, kernel_size, stride=stride, padding=padding, bias=False),
                nn.ReLU(),
                nn.MaxPool2d(3, stride=2, padding=1),
            ]
        self.conv_layers = nn.Sequential(*layers)

    def sequence_length(self, input_shape: Sequence[int]) -> int:
        """Number of tokens produced for one image of ``input_shape``."""
        sizes = list(input_shape[1:])
        for _ in range(len(self.conv_layers) // 3):
            sizes = [(s + 2 * self.padding - self.kernel_size) // self.stride + 1 for s in sizes]
            sizes = [(s + 2 * 1 - 3) // 2 + 1 for s in sizes]  # max-pool 3, stride 2, padding 1
        if min(sizes) < 1:
            raise ValueError(f"input_shape {input_shape} is too small for the CCT tokenizer")
        return sizes[0] * sizes[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_layers(x).flatten(2).transpose(1, 2)  # (B, C, H, W) -> (B, H*W, C)


class CctEncoderLayer(nn.Module):
    """CCT's encoder layer from timm parts: pre-norm attention, then norm, then MLP."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 2.0,
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.1,
        drop_path_rate: float = 0.0,
        fused_attn: bool = False,
    ) -> None:
        super().__init__()
        self.pre_norm = nn.LayerNorm(dim)
        self.attn = Attention(
            dim, num_heads=num_heads, qkv_bias=False, attn_drop=attn_drop_rate, proj_drop=drop_rate
        )
        self.attn.fused_attn = fused_attn  # type: ignore[misc]  # timm marks it Final for TorchScript
        self.norm1 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, hidden_features=int(dim * mlp_ratio), act_layer=nn.GELU, drop=drop_rate)
        self.drop_path = DropPath(drop_path_rate) if drop_path_rate > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.pre_norm(x)))
        x = self.norm1(x)
        return x + self.drop_path(self.mlp(x))


def sinusoidal_embedding(num_tokens: int, dim: int) -> torch.Tensor:
    """Fixed sine/cosine positional table of shape (1, num_tokens, dim)."""
    position = torch.arange(num_tokens, dtype=torch.float32).unsqueeze(1)
    exponent = torch.arange(dim, dtype=torch.float32) // 2 * 2 / dim
    table = position / torch.pow(10000.0, exponent)
    table[:, 0::2] = torch.sin(table[:, 0::2])
    table[:, 1::2] = torch.cos(table[:, 1::2])
    return table.unsqueeze(0)


class CompactTransformer(nn.Module):
    """Compact Convolutional Transformer with sequence pooling.

    Args:
        num_classes: number of output logits.
        input_shape: ``(C, H, W)`` of one image (fixes the positional embedding's length).
        embed_dim: transformer width.
        depth: transformer layers.
        num_heads: attention heads.
        mlp_ratio: MLP width over ``embed_dim``.
        kernel_size: tokenizer kernel (CCT-7/3x1: 3).
        n_conv_layers: tokenizer convolutions (CCT-7/3x1: 1).
        positional_embedding: "learnable", "sine" (a fixed, non-persistent buffer) or "none".
        drop_rate: dropout after the embedding and projections.
        attn_drop_rate: attention dropout.
        drop_path_rate: stochastic depth (rising linearly over the layers).
        fused_attn: use ``F.scaled_dot_product_attention`` (fast, but not vmap-batched).
    """

    def __init__(
        self,
        num_classes: int = 100,
        input_shape: Sequence[int] = (3, 32, 32),
        embed_dim: int = 256,
        depth: int = 7,
        num_heads: int = 4,
        mlp_ratio: float = 2.0,
        kernel_size: int = 3,
        n_conv_layers: int = 1,
        positional_embedding: str = "learnable",
        drop_rate: float = 0.0,
        attn_drop_rate: float = 0.1,
        drop_path_rate: float = 0.1,
        fused_attn: bool = False,
    ) -> None:
        super().__init__()
        if positional_embedding not in _POSITIONAL_EMBEDDINGS:
            raise ValueError(
                f"positional_embedding must be one of {_POSITIONAL_EMBEDDINGS}, got {positional_embedding!r}"
            )
        self.num_classes = int(num_classes)
        self.input_shape = as_input_shape(input_shape, model="CompactTransformer", image=True)
        self.num_features = embed_dim

        self.tokenizer = ConvTokenizer(
            self.input_shape[0], embed_dim, kernel_size=kernel_size, n_conv_layers=n_conv_layers
        )
        self.sequence_length = self.tokenizer.sequence_length(self.input_shape)
        self.pos_embed: nn.Parameter | None = None
        self.pos_table: torch.Tensor | None
        if positional_embedding == "learnable":
            self.pos_embed = nn.Parameter(torch.zeros(1, self.sequence_length, embed_dim))
        # a fixed table is a non-persistent buffer: constant, so vmap/functional_call-safe
        table = sinusoidal_embedding(self.sequence_length, embed_dim)
        self.register_buffer(
            "pos_table", table if positional_embedding == "sine" else None, persistent=False
        )
        self.pos_drop = nn.Dropout(drop_rate)

        rates = torch.linspace(0, drop_path_rate, depth).tolist()
        self.blocks = nn.Sequential(
            *[
                CctEncoderLayer(
                    embed_dim,
                    num_heads,
                    mlp_ratio=mlp_ratio,
                    drop_rate=drop_rate,
                    attn_drop_rate=attn_drop_rate,
                    drop_path_rate=rates[i],
                    fused_attn=fused_attn,
                )
                for i in range(depth)
            ]
        )
        self.norm = nn.LayerNorm(embed_dim)
        self.attention_pool = nn.Linear(embed_dim, 1)
        self.head = (
            nn.Linear(embed_dim, self.num_classes) if self.num_classes > 0 else nn.Identity()
        )
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight)
            elif isinstance(module, nn.Linear):
                trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)
        if self.pos_embed is not None:
            trunc_normal_(self.pos_embed, std=0.2)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Tokens after the encoder and final norm, shape (B, sequence_length, embed_dim)."""
        x = self.tokenizer(x)
        if self.pos_embed is not None:
            x = x + self.pos_embed
        elif self.pos_table is not None:
            x = x + self.pos_table
        x = self.blocks(self.pos_drop(x))
        return self.norm(x)

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        """Sequence pooling: softmax-weighted mean of the tokens, then the classifier."""
        weights = F.softmax(self.attention_pool(x), dim=1)  # (B, N, 1)
        pooled = (weights.transpose(1, 2) @ x).squeeze(1)  # (B, D)
        return self.head(pooled)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


default_cfgs = generate_default_cfgs(
    {
        "fl_cct_7_3x1": paper_cfg(
            (3, 32, 32),
            100,
            "CCT-7/3x1: 1-layer 3x3 conv tokenizer, 7 layers, 4 heads, dim 256.",
            paper_name="Escaping the Big Data Paradigm with Compact Transformers",
            paper_ids="arXiv:2104.05704",
            first_conv="tokenizer.conv_layers.0",
            classifier="head",
        ),
    }
)


@register_model
def fl_cct_7_3x1(pretrained: bool = False, **kwargs: Any) -> CompactTransformer:
    """CCT-7/3x1 for 32x32 images; 3,783,269 parameters with 100 classes."""
    return build_fl_model(
        "fl_cct_7_3x1",
        CompactTransformer,
        pretrained,
        kwargs,
        num_classes=100,
        input_shape=(3, 32, 32),
        embed_dim=256,
        depth=7,
        num_heads=4,
        mlp_ratio=2.0,
        kernel_size=3,
        n_conv_layers=1,
    )
