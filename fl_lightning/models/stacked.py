"""Stacked forward passes: m clients' copies of one model evaluated with plain batched ops.

(The rules for torch.nn, the timm layers and the registered models all live here.)

The vectorised engine keeps every client's parameters stacked along a leading client
dimension [m, ...]. ``torch.func.vmap`` over ``functional_call`` evaluates any module that
way, but pays about a millisecond of Python and dispatch work per step, which dominates
small models. A *stacked rule* writes a module's forward directly for stacked parameters
and inputs ``x`` of shape [m, B, ...]:

* ``nn.Linear`` -> ``torch.baddbmm`` (one batched matmul for all clients);
* ``nn.Conv2d`` -> one grouped convolution with the clients folded into the channels
  (``groups = m * groups``), the construction vmap's own convolution batching rule uses;
* normalisation layers -> the parameter-free normalisation, then a per-client affine;
* parameter-free per-sample modules (activations, pooling, flatten, dropout, ...) -> the
  module itself on the [m * B, ...] batch;
* containers and the registered models -> their children, as their ``forward`` does.

``stacked_forward(model)`` returns ``f(params, x)`` built from these rules, or explains why
it cannot (a submodule without a rule, hooks, tied parameters); the engine then keeps
vmap. Plain autograd through ``f`` gives every client's gradient: client i's output
depends only on its own parameters. Dropout and stochastic depth draw independent masks
per client and sample (like ``vmap(randomness="different")``), not the same numbers.

Rules for other modules are added with ``register_stacked_rule``; rules are looked up by
the module's exact type, so a subclass with its own ``forward`` never inherits a rule
that does not describe it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from timm.layers import (
    Attention,
    ClassifierHead,
    DropPath,
    Mlp,
    ScaledStdConv2d,
    SelectAdaptivePool2d,
)
from timm.models.nfnet import DownsampleAvg
from torch import nn

from .cct import CctEncoderLayer, CompactTransformer, ConvTokenizer
from .cnn import CnnCifar, CnnMnist
from .mlp import FeedForwardNet
from .nf_resnet import NfBasicBlock, NfResNet

# rule(call, module, prefix, x [m, B, ...]) -> output [m, B, ...]
StackedRule = Callable[["StackedCall", nn.Module, str, torch.Tensor], torch.Tensor]
# check(module) -> why this instance cannot be stacked, or None
StackedCheck = Callable[[nn.Module], "str | None"]


@dataclass(frozen=True)
class _Entry:
    rule: StackedRule
    check: StackedCheck | None


_RULES: dict[type, _Entry] = {}


def register_stacked_rule(
    *module_types: type, check: StackedCheck | None = None
) -> Callable[[StackedRule], StackedRule]:
    """Decorator: ``rule`` evaluates modules of exactly these types for stacked parameters.

    ``check(module)`` may return why a particular instance is not covered (e.g. a padding
    mode the rule does not implement); the engine then falls back to vmap.
    """

    def register(rule: StackedRule) -> StackedRule:
        for module_type in module_types:
            _RULES[module_type] = _Entry(rule, check)
        return rule

    return register


def register_per_sample(*module_types: type, check: StackedCheck | None = None) -> None:
    """Parameter-free modules that treat the samples of a batch independently: applied as
    they are to the clients' samples folded into one batch [m * B, ...]."""
    register_stacked_rule(*module_types, check=check)(_per_sample)


class StackedCall:
    """One stacked evaluation: the clients' parameters and the dispatch to the rules."""

    def __init__(self, params: dict[str, torch.Tensor], num_clients: int) -> None:
        self.params = params
        self.num_clients = num_clients

    def param(self, module: nn.Module, prefix: str, name: str) -> torch.Tensor | None:
        """The stacked [m, ...] parameter ``prefix + name``; a parameter that is not
        trained (absent from ``params``) is the module's own, shared by every client."""
        stacked = self.params.get(prefix + name)
        if stacked is not None:
            return stacked
        own = getattr(module, name)
        if own is None:
            return None
        return own.unsqueeze(0).expand(self.num_clients, *own.shape)

    def __call__(self, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
        return _RULES[type(module)].rule(self, module, prefix, x)

    def child(self, module: nn.Module, prefix: str, name: str, x: torch.Tensor) -> torch.Tensor:
        """Evaluate the submodule ``name`` of ``module`` (whose parameters start with ``prefix``)."""
        return self(getattr(module, name), f"{prefix}{name}.", x)


class StackedForward:
    """``f(params {name: [m, ...]}, x [m, B, ...]) -> outputs [m, B, ...]`` for ``model``."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def __call__(self, params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return StackedCall(params, x.shape[0])(self.model, "", x)


def why_not_stacked(model: nn.Module) -> str | None:
    """Why ``model`` has no stacked forward (None: it has one)."""
    for name, module in model.named_modules():
        where = f"{name or 'the model'} ({type(module).__module__}.{type(module).__qualname__})"
        entry = _RULES.get(type(module))
        if entry is None:
            return f"{where} has no stacked rule"
        reason = entry.check(module) if entry.check is not None else None
        if reason is not None:
            return f"{where}: {reason}"
        if module._forward_hooks or module._forward_pre_hooks:
            return f"{where} has forward hooks, which a stacked forward would skip"
    seen: dict[int, str] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if id(parameter) in seen:
            return f"parameters {seen[id(parameter)]} and {name} are tied"
        seen[id(parameter)] = name
    return None


def stacked_forward(model: nn.Module) -> tuple[StackedForward | None, str | None]:
    """The stacked forward of ``model`` and None, or None and why there is none."""
    reason = why_not_stacked(model)
    return (None, reason) if reason is not None else (StackedForward(model), None)


# --- rules for torch.nn -----------------------------------------------------------------


def _fold(x: torch.Tensor) -> torch.Tensor:
    """[m, B, ...] -> [m * B, ...]."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _per_sample(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    y = module(_fold(x))
    return y.view(x.shape[0], x.shape[1], *y.shape[1:])


def _no_own_parameters(module: nn.Module) -> str | None:
    if next(module.parameters(recurse=False), None) is not None:
        return "a module applied per sample has parameters"
    return None


register_per_sample(
    nn.Identity, nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Mish,
    nn.Sigmoid, nn.Tanh, nn.Softplus, nn.Hardswish, nn.Hardsigmoid,
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.AlphaDropout,
    nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d,
    nn.LocalResponseNorm,
    check=_no_own_parameters,
)


def _check_flatten(module: nn.Module) -> str | None:
    assert isinstance(module, nn.Flatten)
    return None if module.start_dim >= 1 else f"Flatten(start_dim={module.start_dim}) flattens the batch"


register_per_sample(nn.Flatten, check=_check_flatten)


def _check_softmax(module: nn.Module) -> str | None:
    dim = getattr(module, "dim", None)
    return None if dim is not None and dim != 0 else f"{type(module).__name__}(dim={dim}) mixes the batch"


register_per_sample(nn.Softmax, nn.LogSoftmax, check=_check_softmax)


@register_stacked_rule(nn.Sequential)
def _sequential(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    for name in module._modules:
        x = call.child(module, prefix, name, x)
    return x


@register_stacked_rule(nn.Linear)
def _linear(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    """x W_iᵀ + b_i for every client i: one batched matmul over [m, B*, in].

    Written as (W_i xᵀ)ᵀ so that autograd's weight gradient g_outᵀ x comes out contiguous
    in W's own [m, out, in] layout (the SGD step then streams through memory)."""
    weight = call.param(module, prefix, "weight")
    bias = call.param(module, prefix, "bias")
    assert weight is not None
    columns = x.reshape(x.shape[0], -1, x.shape[-1]).transpose(1, 2)  # [m, in, B*]
    if bias is None:
        y = torch.bmm(weight, columns)
    else:
        y = torch.baddbmm(bias.unsqueeze(2), weight, columns)
    return y.transpose(1, 2).reshape(*x.shape[:-1], weight.shape[1])


def grouped_conv2d(
    module: nn.Conv2d, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """Client i's ``conv2d(x[i], weight[i], bias[i])`` for all i in one grouped convolution.

    x [m, B, C, H, W], weight [m, O, C/g, k, k], bias [m, O]: the clients become channel
    groups of a [B, m*C, H, W] batch (``groups = m * g``).
    """
    m, batch = x.shape[:2]
    folded = x.transpose(0, 1).reshape(batch, m * x.shape[2], *x.shape[3:])
    y = F.conv2d(
        folded, weight.reshape(-1, *weight.shape[2:]), None if bias is None else bias.reshape(-1),
        module.stride, module.padding, module.dilation, module.groups * m,
    )
    return y.view(batch, m, -1, *y.shape[2:]).transpose(0, 1)


def _check_conv(module: nn.Module) -> str | None:
    assert isinstance(module, nn.Conv2d)
    return None if module.padding_mode == "zeros" else f"padding_mode={module.padding_mode!r} (only 'zeros')"


@register_stacked_rule(nn.Conv2d, check=_check_conv)
def _conv2d(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    assert isinstance(module, nn.Conv2d)
    weight = call.param(module, prefix, "weight")
    assert weight is not None
    return grouped_conv2d(module, x, weight, call.param(module, prefix, "bias"))


def _affine(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
            feature_dims: int, leading: int) -> torch.Tensor:
    """x * weight_i + bias_i with [m, *features] parameters broadcast over the ``leading``
    dims after the client dim and any trailing dims after the ``feature_dims`` features."""
    trailing = x.dim() - 1 - leading - feature_dims
    for value in (weight, bias):
        if value is not None:
            shaped = value.view(value.shape[0], *[1] * leading, *value.shape[1:], *[1] * trailing)
            x = x * shaped if value is weight else x + shaped
    return x


@register_stacked_rule(nn.LayerNorm)
def _layer_norm(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    """Layer normalisation (Ba et al. 2016) with every client's own elementwise affine."""
    assert isinstance(module, nn.LayerNorm)
    shape = module.normalized_shape
    y = F.layer_norm(x, shape, None, None, module.eps)
    return _affine(y, call.param(module, prefix, "weight"), call.param(module, prefix, "bias"),
                   len(shape), x.dim() - 1 - len(shape))


@register_stacked_rule(nn.GroupNorm)
def _group_norm(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    """Group normalisation (Wu & He 2018) per sample, then every client's channel affine."""
    assert isinstance(module, nn.GroupNorm)
    y = F.group_norm(_fold(x), module.num_groups, None, None, module.eps).view_as(x)
    return _affine(y, call.param(module, prefix, "weight"), call.param(module, prefix, "bias"), 1, 1)


# --- rules for timm layers and the registered models -----------------------------------

# per-sample and parameter-free: stochastic depth drops whole samples, each on its own
register_per_sample(DropPath, SelectAdaptivePool2d)


def _chain(*names: str):
    """A rule for modules whose forward applies the children ``names`` in turn."""

    def rule(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
        for name in names:
            x = call.child(module, prefix, name, x)
        return x

    return rule


register_stacked_rule(FeedForwardNet)(_chain("features", "fc"))
register_stacked_rule(CnnMnist, CnnCifar)(_chain("features", "pre_logits", "fc"))
register_stacked_rule(DownsampleAvg)(_chain("pool", "conv"))
register_stacked_rule(Mlp)(_chain("fc1", "act", "drop1", "norm", "fc2", "drop2"))
register_stacked_rule(NfResNet)(_chain("stem", "stages", "final_act", "head"))
register_stacked_rule(ClassifierHead)(_chain("global_pool", "drop", "fc", "flatten"))


@register_stacked_rule(ScaledStdConv2d)
def _scaled_std_conv2d(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    """Scaled weight standardisation (Brock et al. 2021) of every client's kernels, as timm's
    ``ScaledStdConv2d`` does it (a batch norm over each output channel's fan-in), then one
    grouped convolution."""
    assert isinstance(module, ScaledStdConv2d)
    weight, gain = call.param(module, prefix, "weight"), call.param(module, prefix, "gain")
    assert weight is not None and gain is not None
    m, out = weight.shape[:2]
    standardised = F.batch_norm(
        weight.reshape(1, m * out, -1), None, None, weight=(gain * module.scale).reshape(-1),
        training=True, momentum=0.0, eps=module.eps,
    ).view_as(weight)
    return grouped_conv2d(module, x, standardised, call.param(module, prefix, "bias"))


@register_stacked_rule(NfBasicBlock)
def _nf_basic_block(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    assert isinstance(module, NfBasicBlock)
    out = call.child(module, prefix, "act1", x) * module.beta
    shortcut = call.child(module, prefix, "downsample", out) if module.downsample is not None else x
    out = call.child(module, prefix, "conv1", out)
    out = call.child(module, prefix, "conv2", call.child(module, prefix, "act2", out))
    out = call.child(module, prefix, "drop_path", out)
    gain = call.param(module, prefix, "skipinit_gain")
    if gain is not None:
        out = out * gain.view(-1, *[1] * (out.dim() - 1))
    return out * module.alpha + shortcut


@register_stacked_rule(ConvTokenizer)
def _conv_tokenizer(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    x = call.child(module, prefix, "conv_layers", x)  # [m, B, C, H, W]
    return x.flatten(3).transpose(2, 3)  # [m, B, H*W, C]


@register_stacked_rule(CctEncoderLayer)
def _cct_encoder_layer(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    attended = call.child(module, prefix, "attn", call.child(module, prefix, "pre_norm", x))
    x = x + call.child(module, prefix, "drop_path", attended)
    x = call.child(module, prefix, "norm1", x)
    return x + call.child(module, prefix, "drop_path", call.child(module, prefix, "mlp", x))


@register_stacked_rule(CompactTransformer)
def _compact_transformer(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    assert isinstance(module, CompactTransformer)
    x = call.child(module, prefix, "tokenizer", x)  # [m, B, N, D]
    pos_embed = call.param(module, prefix, "pos_embed")  # [m, 1, N, D]
    if pos_embed is not None:
        x = x + pos_embed
    elif module.pos_table is not None:
        x = x + module.pos_table
    x = call.child(module, prefix, "pos_drop", x)
    x = call.child(module, prefix, "norm", call.child(module, prefix, "blocks", x))
    # sequence pooling: softmax weights over the tokens, a weighted mean, the classifier
    weights = call.child(module, prefix, "attention_pool", x).softmax(dim=2)  # [m, B, N, 1]
    pooled = (weights.transpose(-1, -2) @ x).squeeze(-2)  # [m, B, D]
    return call.child(module, prefix, "head", pooled)


def _check_attention(module: nn.Module) -> str | None:
    return None if hasattr(module, "head_dim") else "this timm Attention has no head_dim (another timm version)"


@register_stacked_rule(Attention, check=_check_attention)
def _attention(call: StackedCall, module: nn.Module, prefix: str, x: torch.Tensor) -> torch.Tensor:
    """timm's multi-head self-attention (no mask) with the clients as one more batch dim."""
    assert isinstance(module, Attention)
    m, batch, tokens = x.shape[:3]
    heads, head_dim = module.num_heads, module.head_dim
    # timm before 1.0.23 has no attn_dim (it is the model width) and no gate
    attn_dim = getattr(module, "attn_dim", heads * head_dim)
    gate = call.child(module, prefix, "gate", x).sigmoid() if getattr(module, "gate", None) is not None else None
    qkv = call.child(module, prefix, "qkv", x).reshape(m, batch, tokens, 3, heads, head_dim)
    q, k, v = qkv.permute(3, 0, 1, 4, 2, 5).unbind(0)  # each [m, B, heads, N, head_dim]
    q, k = call.child(module, prefix, "q_norm", q), call.child(module, prefix, "k_norm", k)
    if module.fused_attn:
        dropout = module.attn_drop.p if module.training else 0.0
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)
    else:
        attn = (q * module.scale) @ k.transpose(-2, -1)
        attn = call.child(module, prefix, "attn_drop", attn.softmax(dim=-1))
        x = attn @ v
    x = x.transpose(-3, -2).reshape(m, batch, tokens, attn_dim)
    x = call.child(module, prefix, "norm", x)
    if gate is not None:
        x = x * gate
    return call.child(module, prefix, "proj_drop", call.child(module, prefix, "proj", x))
