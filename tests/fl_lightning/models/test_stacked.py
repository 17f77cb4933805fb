"""Stacked forwards (fl_lightning.models.stacked): every registered model trains in the
vectorised engine without vmap and gives what the sequential engine gives."""

import pytest
import torch
from torch import nn
from torch.func import functional_call

from fl_lightning.core.engines import SequentialEngine, VectorisedEngine, sgd_step
from fl_lightning.core.flat import ParameterLayout
from fl_lightning.core.local import (
    ClientShards,
    LocalSGD,
    batch_order,
    masked_cross_entropy,
    with_proximal_term,
)
from fl_lightning.models import create_fl_model, list_fl_models
from fl_lightning.models.stacked import register_stacked_rule, stacked_forward, why_not_stacked
from tests.accelerator import device, shards_on
from tests.model_inputs import sample_inputs

# every registered model, shrunk so that a few SGD steps of three clients take milliseconds;
# dropout and stochastic depth off (train mode must be deterministic to compare engines)
SMALL = {
    "fl_logreg": dict(input_shape=(6,)),
    "fl_mlp": dict(input_shape=(1, 4, 4), hidden_sizes=(8, 8)),
    "fl_ffn": dict(input_shape=(3, 4, 4), hidden_sizes=(8, 8)),
    "fl_cnn_mnist": dict(input_shape=(1, 8, 8), hidden_size=8),
    "fl_cnn_cifar": dict(input_shape=(3, 16, 16), hidden_sizes=(8, 8)),
    "fl_nf_resnet18": dict(input_shape=(3, 8, 8), width=(4, 8)),
    "fl_nf_resnet18_standard": dict(input_shape=(3, 8, 8), width=(4, 8, 8)),
    "fl_nf_resnet18_fedlf": dict(input_shape=(3, 8, 8)),
    "fl_cct_7_3x1": dict(input_shape=(3, 8, 8), embed_dim=8, depth=2, num_heads=2,
                         attn_drop_rate=0.0, drop_path_rate=0.0),
    "fl_cnn_femnist": dict(input_shape=(1, 8, 8), hidden_size=8, drop_rates=(0.0, 0.0)),
    "fl_lstm_chars": dict(input_shape=(6,), vocab_size=7, embedding_dim=4, hidden_size=8),
    "fl_text_cnn": dict(input_shape=(6,), vocab_size=7, embedding_dim=4, kernel_sizes=(2, 3), num_filters=4,
                        drop_rate=0.0),
}
NUM_CLASSES = 3


def small_model(name: str, **overrides) -> nn.Module:
    torch.manual_seed(0)
    return create_fl_model(name, NUM_CLASSES, **{**SMALL[name], **overrides}).to(device())


def image_shards(sizes, input_shape, seed=0, model=None) -> ClientShards:
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    x = sample_inputs(model, total, *input_shape, generator=g)
    y = torch.randint(0, NUM_CLASSES, (total,), generator=g)
    index = torch.zeros(len(sizes), max(sizes), dtype=torch.long)
    first = 0
    for k, n in enumerate(sizes):
        index[k, :n] = torch.arange(first, first + n)
        first += n
    return ClientShards(x, y, index, torch.tensor(sizes), list(sizes))


def ce(logits, targets, mask, local_params, anchor):
    return masked_cross_entropy(logits, targets, mask)


def train_both(model, sgd, sizes=(5, 2, 7), objective=ce, start=None, anchor=None, forward="auto"):
    """Both engines from the same start on the test device (``pytest --accelerator``): (engine, vectorised,
    sequential, layout)."""
    model.to(device())
    layout = ParameterLayout.of(model)
    shards = shards_on(image_shards(list(sizes), tuple(model.input_shape), model=model))
    order = batch_order(shards.sizes, max(sizes), sgd.epochs, torch.Generator().manual_seed(1))
    start = start if start is not None else {n: p.detach() for n, p in model.named_parameters()}
    engine = VectorisedEngine(forward=forward)
    vec = engine.train(model, layout, start, shards, order, sgd, objective, anchor=anchor)
    seq = SequentialEngine().train(model, layout, start, shards, order, sgd, objective, anchor=anchor)
    return engine, layout.flatten_stacked(vec), layout.flatten_stacked(seq), layout


def test_every_registered_model_has_a_small_configuration_here():
    assert sorted(SMALL) == list_fl_models()  # a new model must be added to these tests


@pytest.mark.parametrize("name", sorted(SMALL))
def test_stacked_forward_equals_each_clients_own_forward(name, one_thread):
    model = small_model(name).eval()
    forward, reason = stacked_forward(model)
    assert forward is not None, reason
    m = 3
    params = {n: p.detach() + 0.1 * torch.randn(m, *p.shape).to(p.device) for n, p in model.named_parameters()}
    x = sample_inputs(model, m, 4, *model.input_shape).to(device())
    expected = torch.stack(
        [functional_call(model, {n: p[i] for n, p in params.items()}, (x[i],)) for i in range(m)]
    )
    assert torch.allclose(forward(params, x), expected, atol=1e-5)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_stacked_engine_equals_sequential_for_every_model(name, one_thread):
    """Momentum, weight decay, two epochs and uneven clients (partial last batches)."""
    model = small_model(name)
    sgd = LocalSGD(lr=0.05, momentum=0.9, weight_decay=1e-3, epochs=2, batch_size=3)
    engine, vec, seq, layout = train_both(model, sgd)
    assert engine.forward_kind == "stacked" and engine.forward_reason is None
    assert torch.allclose(vec, seq, atol=1e-5), (vec - seq).abs().max()
    assert not torch.allclose(vec, layout.flatten(dict(model.named_parameters())).expand_as(vec))


@pytest.mark.parametrize("name", ["fl_mlp", "fl_cnn_cifar", "fl_nf_resnet18", "fl_cct_7_3x1"])
def test_full_batch_personal_starts_and_a_proximal_objective(name, one_thread):
    """Ditto-like: every client from its own model, proximal to the global one, full batch."""
    model = small_model(name)
    anchor = {n: p.detach() for n, p in model.named_parameters()}
    torch.manual_seed(1)
    starts = {n: p + 0.05 * torch.randn(3, *p.shape).to(p.device) for n, p in anchor.items()}
    names = tuple(anchor)

    def proximal(logits, targets, mask, local_params, anchor):
        return with_proximal_term(masked_cross_entropy(logits, targets, mask), 0.5, local_params, anchor, names)

    sgd = LocalSGD(lr=0.05, momentum=0.5, epochs=2, batch_size=None)
    engine, vec, seq, _ = train_both(model, sgd, objective=proximal, start=starts, anchor=anchor)
    assert engine.forward_kind == "stacked"
    assert torch.allclose(vec, seq, atol=1e-5), (vec - seq).abs().max()


def test_cct_variants_fused_attention_sine_embedding_and_eval_mode(one_thread):
    sgd = LocalSGD(lr=0.05, epochs=1, batch_size=4)
    for model in (
        small_model("fl_cct_7_3x1", fused_attn=True, positional_embedding="sine"),
        small_model("fl_cct_7_3x1", attn_drop_rate=0.1, drop_path_rate=0.1).eval(),  # dropout off in eval
    ):
        engine, vec, seq, _ = train_both(model, sgd)
        assert engine.forward_kind == "stacked"
        assert torch.allclose(vec, seq, atol=1e-5), (vec - seq).abs().max()


def test_plain_torch_layers_group_norm_layer_norm_grouped_conv(one_thread):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1, groups=2, bias=False), nn.GroupNorm(2, 4), nn.SiLU(),
        nn.Conv2d(4, 4, 3, stride=2, dilation=1), nn.AvgPool2d(1), nn.Flatten(),
        nn.LayerNorm(64), nn.Linear(64, NUM_CLASSES),
    )
    model.input_shape = (2, 10, 10)
    engine, vec, seq, _ = train_both(model, LocalSGD(lr=0.1, momentum=0.9, epochs=2, batch_size=2))
    assert engine.forward_kind == "stacked"
    assert torch.allclose(vec, seq, atol=1e-5), (vec - seq).abs().max()


class Scale(nn.Module):
    """A module with no stacked rule: multiplies by a learned per-feature scale."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, width))

    def forward(self, x):
        return x * self.scale


def scaled_net() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), Scale(5), nn.Tanh(), nn.Linear(5, NUM_CLASSES))
    model.input_shape = (6,)
    return model


def test_a_module_without_a_rule_falls_back_to_vmap_and_still_agrees(one_thread):
    model = scaled_net()
    engine, vec, seq, _ = train_both(model, LocalSGD(lr=0.1, momentum=0.9, epochs=2, batch_size=3))
    assert engine.forward_kind == "vmap"
    assert "1 (test_stacked.Scale) has no stacked rule" in engine.forward_reason
    assert torch.allclose(vec, seq, atol=1e-5)
    with pytest.raises(ValueError, match=r"forward='stacked'.*Scale\) has no stacked rule.*register_stacked_rule"):
        train_both(model, LocalSGD(), forward="stacked")


def test_a_registered_rule_makes_a_custom_module_stacked(one_thread):
    class Shift(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shift = nn.Parameter(torch.tensor([0.1, -0.2, 0.3]))

        def forward(self, x):
            return x + self.shift

    @register_stacked_rule(Shift)
    def shift_rule(call, module, prefix, x):
        shift = call.param(module, prefix, "shift")  # [m, 3]
        return x + shift.view(shift.shape[0], *[1] * (x.dim() - 2), shift.shape[1])

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, NUM_CLASSES), Shift())
    model.input_shape = (6,)
    engine, vec, seq, _ = train_both(model, LocalSGD(lr=0.1, epochs=2, batch_size=3))
    assert engine.forward_kind == "stacked"
    assert torch.allclose(vec, seq, atol=1e-5)


def test_frozen_parameters_are_shared_by_every_client(one_thread):
    model = scaled_net()
    del model[1]  # no Scale: every module has a rule
    model[0].bias.requires_grad_(False)  # not trained: not in the layout, read from the module
    engine, vec, seq, layout = train_both(model, LocalSGD(lr=0.1, epochs=1, batch_size=3))
    assert "0.bias" not in layout.names and engine.forward_kind == "stacked"
    assert torch.allclose(vec, seq, atol=1e-5)


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, padding_mode="reflect")), "padding_mode='reflect'"),
        (nn.Sequential(nn.Flatten(0)), "start_dim=0"),
        (nn.Sequential(nn.Softmax(dim=0)), "mixes the batch"),
        (nn.Sequential(nn.BatchNorm1d(3)), "BatchNorm1d) has no stacked rule"),
    ],
)
def test_why_not_stacked_names_the_module_and_the_reason(model, reason):
    assert reason in why_not_stacked(model)


def test_hooks_and_tied_parameters_are_not_stacked():
    hooked = nn.Sequential(nn.Linear(2, 2))
    hooked[0].register_forward_hook(lambda module, args, out: out * 2)
    assert "forward hooks" in why_not_stacked(hooked)
    tied = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    tied[1].weight = tied[0].weight
    assert why_not_stacked(tied) == "parameters 0.weight and 1.weight are tied"


def test_a_subclass_does_not_inherit_its_parents_rule():
    class DoubledLinear(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    assert "DoubledLinear) has no stacked rule" in why_not_stacked(nn.Sequential(DoubledLinear(2, 2)))


def test_dropout_draws_its_own_mask_for_every_client():
    model = nn.Sequential(nn.Dropout(0.5)).train()
    forward, _ = stacked_forward(model)
    out = forward({}, torch.ones(2, 1, 1000))
    assert not torch.equal(out[0], out[1])  # clients with the same input get different masks
    assert set(out.unique().tolist()) == {0.0, 2.0}


@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 0.0), (0.0, 1e-2), (0.9, 1e-2)])
def test_fused_sgd_step_is_torch_sgd(momentum, weight_decay):
    torch.manual_seed(0)
    params = [torch.randn(3, 4), torch.randn(5)]
    reference = [p.clone().requires_grad_() for p in params]
    optimizer = torch.optim.SGD(reference, lr=0.1, momentum=momentum, weight_decay=weight_decay)
    sgd = LocalSGD(lr=0.1, momentum=momentum, weight_decay=weight_decay)
    buffers = [torch.zeros_like(p) for p in params] if momentum else None
    for _ in range(3):
        grads = [torch.randn_like(p) for p in params]
        for r, g in zip(reference, grads):
            r.grad = g.clone()
        optimizer.step()
        sgd_step(params, grads, buffers, sgd)
    for p, r in zip(params, reference):
        assert torch.allclose(p, r.detach(), atol=1e-7)
