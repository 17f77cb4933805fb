"""Tests of the timm-registered fl_* models and of the constraints the engine relies on.

The federated engine runs many clients at once with ``torch.func.functional_call`` +
``vmap`` + ``grad`` over stacked parameters, so every model must be BatchNorm-free, have no
buffer that changes in ``forward``, and give the same result vmapped as one client at a time.
Batches are kept at 2 samples so the big models stay fast on 2 CPU cores.
"""

from __future__ import annotations

import warnings

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.func import functional_call, grad, vmap

import fl_lightning.models as flm
from fl_lightning.models import create_fl_model, list_fl_models
from tests.model_inputs import sample_inputs

NUM_CLIENTS = 3
BATCH = 2

# name -> (default input_shape, default num_classes)
DEFAULTS = {
    "fl_logreg": ((60,), 10),
    "fl_mlp": ((1, 28, 28), 10),
    "fl_ffn": ((3, 32, 32), 10),
    "fl_cnn_mnist": ((1, 28, 28), 10),
    "fl_cnn_cifar": ((3, 32, 32), 10),
    "fl_nf_resnet18": ((3, 32, 32), 100),
    "fl_nf_resnet18_standard": ((3, 32, 32), 100),
    "fl_nf_resnet18_fedlf": ((3, 32, 32), 100),
    "fl_cct_7_3x1": ((3, 32, 32), 100),
    "fl_cnn_femnist": ((1, 28, 28), 62),
    "fl_lstm_chars": ((80,), 80),
    "fl_text_cnn": ((56,), 2),
}
ALL_MODELS = sorted(DEFAULTS)
# gradient tests of the transformer on 16x16 images (64 tokens, not 256): same code paths,
# a quarter of the cost, so the file stays well under a minute on 2 busy cores
GRAD_SHAPES = {"fl_cct_7_3x1": (3, 16, 16)}

# (name, num_classes, input_shape, extra kwargs) -> exact number of parameters
PARAM_COUNTS = [
    ("fl_logreg", 10, (60,), {}, 60 * 10 + 10),
    ("fl_logreg", 10, (1, 28, 28), {}, 784 * 10 + 10),
    ("fl_mlp", 10, (1, 28, 28), {}, 199_210),
    ("fl_ffn", 10, (3, 32, 32), {}, 656_810),
    ("fl_ffn", 10, (1, 28, 28), {}, 199_210),
    ("fl_cnn_mnist", 10, (1, 28, 28), {}, 1_663_370),  # McMahan et al. 2017
    ("fl_cnn_cifar", 10, (3, 32, 32), {}, 797_962),  # FedMGDA+ Table 2
    ("fl_nf_resnet18", 10, (3, 32, 32), {}, 701_466),
    ("fl_nf_resnet18", 100, (3, 32, 32), {}, 713_076),
    ("fl_nf_resnet18_standard", 10, (3, 32, 32), {}, 11_173_962),
    ("fl_nf_resnet18_standard", 100, (3, 32, 32), {}, 11_220_132),
    ("fl_nf_resnet18", 100, (3, 32, 32), {"width": "standard"}, 11_220_132),
    ("fl_nf_resnet18_fedlf", 10, (3, 32, 32), {}, 184_618),
    ("fl_nf_resnet18_fedlf", 100, (3, 32, 32), {}, 190_468),
    ("fl_cct_7_3x1", 10, (3, 32, 32), {}, 3_760_139),
    ("fl_cct_7_3x1", 100, (3, 32, 32), {}, 3_783_269),
    ("fl_cct_7_3x1", 100, (3, 32, 32), {"positional_embedding": "sine"}, 3_783_269 - 256 * 256),
    ("fl_cnn_femnist", 62, (1, 28, 28), {}, 1_206_590),  # Reddi et al. 2021 / FedMGDA+ Table 4
    # FedMGDA+ Sec. 6.1.3: embedding 80 x 8, LSTM 8 -> 256 -> 256 (4 gates, biases), dense 256 -> 80
    ("fl_lstm_chars", 80, (80,), {}, 80 * 8 + 4 * 256 * (8 + 256 + 1) + 4 * 256 * (256 + 256 + 1) + 256 * 80 + 80),
]

# other inputs the data sources produce: digits 8x8, synthetic 60 features, MNIST, CIFAR
SHAPE_VARIANTS = [
    ("fl_logreg", (60,), 10),
    ("fl_logreg", (1, 8, 8), 10),
    ("fl_mlp", (1, 8, 8), 10),
    ("fl_mlp", (60,), 10),
    ("fl_mlp", (3, 32, 32), 100),
    ("fl_ffn", (1, 28, 28), 10),
    ("fl_cnn_mnist", (1, 8, 8), 10),
    ("fl_cnn_mnist", (3, 32, 32), 10),
    ("fl_cnn_cifar", (1, 28, 28), 10),
    ("fl_cnn_cifar", (3, 32, 32), 100),
    ("fl_nf_resnet18", (1, 28, 28), 10),
    ("fl_nf_resnet18", (3, 32, 32), 10),
    ("fl_nf_resnet18_fedlf", (1, 28, 28), 62),
    ("fl_cct_7_3x1", (1, 28, 28), 10),
    ("fl_cct_7_3x1", (3, 24, 24), 10),
]


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def build(name: str, **kwargs) -> nn.Module:
    shape, classes = DEFAULTS[name]
    kwargs.setdefault("num_classes", classes)
    kwargs.setdefault("input_shape", shape)
    return create_fl_model(name, **kwargs)


def client_params(model: nn.Module, num_clients: int = NUM_CLIENTS, scale: float = 0.05):
    """Each client's parameters: the model's plus its own noise (so clients differ)."""
    gen = torch.Generator().manual_seed(1234)
    return [
        {
            name: p.detach() + scale * torch.randn(p.shape, generator=gen)
            for name, p in model.named_parameters()
        }
        for _ in range(num_clients)
    ]


def stack(per_client: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {name: torch.stack([p[name] for p in per_client]) for name in per_client[0]}


def client_batches(shape, num_classes, seed=0, model=None):
    gen = torch.Generator().manual_seed(seed)
    x = sample_inputs(model, NUM_CLIENTS, BATCH, *shape, generator=gen)
    y = torch.randint(0, num_classes, (NUM_CLIENTS, BATCH), generator=gen)
    return x, y


# --------------------------------------------------------------------------- registry


def test_registered_names():
    assert list_fl_models() == ALL_MODELS
    assert all(name.startswith("fl_") for name in list_fl_models())
    assert all(timm.is_model(name) for name in ALL_MODELS)
    assert set(timm.list_models("fl_*")) >= set(ALL_MODELS)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError, match="unknown fl-lightning model 'resnet18'") as err:
        create_fl_model("resnet18", num_classes=10, input_shape=(3, 32, 32))
    for name in ALL_MODELS:
        assert name in str(err.value)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_pretrained_is_refused(name):
    with pytest.raises(ValueError, match="no pretrained weights"):
        timm.create_model(name, pretrained=True)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_timm_create_model_defaults(name):
    shape, classes = DEFAULTS[name]
    model = timm.create_model(name)
    assert isinstance(model, nn.Module)
    assert model.num_classes == classes
    assert model(sample_inputs(model, BATCH, *shape)).shape == (BATCH, classes)
    cfg = timm.models.get_pretrained_cfg(name)
    assert tuple(cfg.input_size) == shape and cfg.num_classes == classes


@pytest.mark.parametrize(("name", "classes", "shape", "kwargs", "expected"), PARAM_COUNTS)
def test_parameter_counts(name, classes, shape, kwargs, expected):
    model = create_fl_model(name, num_classes=classes, input_shape=shape, **kwargs)
    assert n_params(model) == expected


def test_cct_size_matches_paper():
    # Hassani et al. report CCT-7/3x1 (CIFAR-100) at 3.78M parameters
    model = build("fl_cct_7_3x1")
    assert abs(n_params(model) - 3.78e6) / 3.78e6 < 0.01
    assert model.sequence_length == 16 * 16
    assert len(model.blocks) == 7
    assert model.blocks[0].attn.num_heads == 4
    assert model.blocks[0].mlp.fc1.out_features == 2 * 256
    assert len([m for m in model.tokenizer.modules() if isinstance(m, nn.Conv2d)]) == 1


def test_cnn_cifar_layers_match_fedmgda_table2():
    model = build("fl_cnn_cifar")
    per_layer = [n_params(m) for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    assert per_layer == [4864, 102464, 614784, 73920, 1930]
    assert [type(m) for m in model.features][:5] == [
        nn.Conv2d,
        nn.ReLU,
        nn.MaxPool2d,
        nn.LocalResponseNorm,
        nn.Conv2d,
    ]


def test_nf_resnet18_structure():
    small = build("fl_nf_resnet18")
    assert [len(stage) for stage in small.stages] == [2, 2, 2, 2]
    assert [stage[0].conv1.out_channels for stage in small.stages] == [16, 32, 64, 128]
    standard = build("fl_nf_resnet18_standard")
    assert [stage[0].conv1.out_channels for stage in standard.stages] == [64, 128, 256, 512]
    fedlf = build("fl_nf_resnet18_fedlf")
    assert [stage[0].conv1.out_channels for stage in fedlf.stages] == [16, 32, 64]
    assert isinstance(fedlf.stem.pool, nn.MaxPool2d)
    # the NF recipe: alpha 0.2, beta = 1/sqrt(1 + alpha^2) on the second block of a stage
    assert small.stages[1][1].beta == pytest.approx((1 + 0.2**2) ** -0.5)
    assert all(not block.conv2.gain.detach().any() for s in small.stages for block in s)


# --------------------------------------------------------------------------- arguments


@pytest.mark.parametrize(("name", "shape", "classes"), SHAPE_VARIANTS)
def test_forward_shape_variants(name, shape, classes):
    model = create_fl_model(name, num_classes=classes, input_shape=shape).eval()
    with torch.no_grad():
        out = model(sample_inputs(model, BATCH, *shape))
    assert out.shape == (BATCH, classes)
    assert torch.isfinite(out).all()


def test_input_shape_from_a_yaml_list():
    model = create_fl_model("fl_cnn_cifar", num_classes=10, input_shape=[3, 32, 32])
    assert model.input_shape == (3, 32, 32)


def test_argument_errors():
    with pytest.raises(ValueError, match=r"needs input_shape=\(C, H, W\)"):
        create_fl_model("fl_cnn_cifar", num_classes=10, input_shape=(60,))
    with pytest.raises(ValueError, match="H, W >= 16"):
        create_fl_model("fl_cnn_cifar", num_classes=10, input_shape=(1, 8, 8))
    with pytest.raises(ValueError, match="unknown NF-ResNet-18 width 'huge'"):
        create_fl_model("fl_nf_resnet18", num_classes=10, input_shape=(3, 32, 32), width="huge")
    with pytest.raises(ValueError, match="positional_embedding"):
        create_fl_model("fl_cct_7_3x1", 10, (3, 32, 32), positional_embedding="rope")
    with pytest.raises(TypeError):
        create_fl_model("fl_mlp", num_classes=10, input_shape=(60,), hiden_sizes=(10,))


def test_model_kwargs_pass_through():
    mlp = create_fl_model("fl_mlp", num_classes=3, input_shape=(60,), hidden_sizes=(32,))
    assert n_params(mlp) == 60 * 32 + 32 + 32 * 3 + 3
    custom = create_fl_model("fl_nf_resnet18", 10, (3, 32, 32), width=(8, 16))
    assert [stage[0].conv1.out_channels for stage in custom.stages] == [8, 16]


# --------------------------------------------------------------------------- engine constraints


@pytest.mark.parametrize("name", ALL_MODELS)
def test_no_batchnorm_and_no_changing_buffers(name):
    model = build(name)
    norms = [
        type(m).__name__ for m in model.modules() if isinstance(m, nn.modules.batchnorm._NormBase)
    ]
    assert norms == []
    before = {k: v.clone() for k, v in model.named_buffers()}
    model.train()
    shape, _ = DEFAULTS[name]
    model(sample_inputs(model, BATCH, *shape))
    after = dict(model.named_buffers())
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_cct_sine_buffer_is_constant_and_vmap_safe():
    model = build("fl_cct_7_3x1", input_shape=(3, 16, 16), positional_embedding="sine").eval()
    assert [name for name, _ in model.named_buffers()] == ["pos_table"]
    assert "pos_table" not in model.state_dict()
    table = model.pos_table.clone()
    params = client_params(model)
    x, _ = client_batches((3, 16, 16), 100)
    out = vmap(lambda p, xb: functional_call(model, p, (xb,)))(stack(params), x)
    assert out.shape == (NUM_CLIENTS, BATCH, 100)
    assert torch.equal(model.pos_table, table)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_deterministic_construction(name):
    torch.manual_seed(7)
    first = build(name).state_dict()
    torch.manual_seed(7)
    second = build(name).state_dict()
    torch.manual_seed(8)
    third = build(name).state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert any(not torch.equal(first[k], third[k]) for k in first)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_vmap_forward_equals_per_client_forward(name):
    shape, classes = DEFAULTS[name]
    torch.manual_seed(0)
    model = build(name).eval()
    params = client_params(model)
    x, _ = client_batches(shape, classes, model=model)

    def forward(p, xb):
        return functional_call(model, p, (xb,))

    with torch.no_grad():
        batched = vmap(forward, randomness="different")(stack(params), x)
        one_by_one = torch.stack([forward(params[i], x[i]) for i in range(NUM_CLIENTS)])
    assert batched.shape == (NUM_CLIENTS, BATCH, classes)
    assert one_by_one.abs().max() > 1e-3  # the check below is not vacuous
    torch.testing.assert_close(batched, one_by_one, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ALL_MODELS)
def test_vmap_grad_equals_per_client_grad(name):
    _, classes = DEFAULTS[name]
    shape = GRAD_SHAPES.get(name, DEFAULTS[name][0])
    torch.manual_seed(0)
    model = build(name, input_shape=shape).eval()
    params = client_params(model)
    x, y = client_batches(shape, classes, model=model)

    def loss(p, xb, yb):
        return F.cross_entropy(functional_call(model, p, (xb,)), yb)

    batched = vmap(grad(loss), randomness="different")(stack(params), x, y)
    for i in range(NUM_CLIENTS):
        single = grad(loss)(params[i], x[i], y[i])
        for key, g in single.items():
            torch.testing.assert_close(batched[key][i], g, rtol=1e-4, atol=1e-5)
    assert any(float(g.abs().sum()) > 0 for g in batched.values())


@pytest.mark.parametrize("name", ["fl_cct_7_3x1", "fl_nf_resnet18"])
def test_vmap_grad_in_train_mode_with_dropout(name):
    """Local training runs in train mode: dropout / drop-path must work under vmap, per client."""
    _, classes = DEFAULTS[name]
    shape = GRAD_SHAPES.get(name, DEFAULTS[name][0])
    torch.manual_seed(0)
    kwargs = {"drop_path_rate": 0.2, "drop_rate": 0.2}
    model = build(name, input_shape=shape, **kwargs).train()
    same = [dict(model.named_parameters())] * NUM_CLIENTS
    params = {k: v.detach() for k, v in stack(same).items()}
    x = torch.randn(1, BATCH, *shape).expand(NUM_CLIENTS, *([-1] * (len(shape) + 1)))
    y = torch.randint(0, classes, (1, BATCH)).expand(NUM_CLIENTS, -1)

    def loss(p, xb, yb):
        return F.cross_entropy(functional_call(model, p, (xb,)), yb)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. a missing vmap batching rule (slow fallback)
        grads = vmap(grad(loss), randomness="different")(params, x, y)
        outs = vmap(lambda p, xb: functional_call(model, p, (xb,)), randomness="different")(
            params, x
        )
    assert all(torch.isfinite(g).all() for g in grads.values())
    # identical clients and data, yet different dropout masks per client
    assert not torch.allclose(outs[0], outs[1])


def test_public_classes_exported():
    assert isinstance(build("fl_cct_7_3x1"), flm.CompactTransformer)
    assert isinstance(build("fl_nf_resnet18"), flm.NfResNet)
    assert isinstance(build("fl_cnn_cifar"), flm.CnnCifar)
    assert isinstance(build("fl_cnn_mnist"), flm.CnnMnist)
    assert isinstance(build("fl_mlp"), flm.FeedForwardNet)
