"""Hand-derived gradients of feed-forward nets (core.fused): equal to autograd's, used by the
vectorised engine only where they apply, and the engines still agree."""

import pytest
import torch

from fl_lightning.algorithms import FedAvg, FedProx
from fl_lightning.core.engines import VectorisedEngine
from fl_lightning.core.flat import ParameterLayout
from fl_lightning.core.fused import (
    FeedForwardGradients,
    feedforward_gradients,
    mean_cross_entropy_objective,
)
from fl_lightning.core.local import LocalSGD, batch_order, masked_cross_entropy
from fl_lightning.models import create_fl_model
from fl_lightning.models.stacked import stacked_forward
from tests.accelerator import device
from tests.fl_lightning.models.test_stacked import train_both


@mean_cross_entropy_objective
def marked(logits, targets, mask, local_params, anchor):
    return masked_cross_entropy(logits, targets, mask)


def unmarked(logits, targets, mask, local_params, anchor):
    return masked_cross_entropy(logits, targets, mask)


def feedforward(hidden=(8, 8), input_shape=(2, 3, 3)):
    torch.manual_seed(0)
    return create_fl_model("fl_mlp", 4, input_shape, hidden_sizes=hidden)


@pytest.mark.parametrize("hidden", [(), (8,), (8, 6)])
def test_gradients_equal_autograd_of_the_summed_mean_cross_entropy(hidden):
    model = feedforward(hidden)
    names = [n for n, _ in model.named_parameters()]
    g = torch.Generator().manual_seed(1)
    m, batch = 3, 5
    params = [p.detach() + 0.3 * torch.randn(m, *p.shape, generator=g) for p in model.parameters()]
    x = torch.randn(m, batch, 2, 3, 3, generator=g)
    y = torch.randint(0, 4, (m, batch), generator=g)
    mask = torch.ones(m, batch)
    mask[1, 3:] = 0  # a partial last batch
    mask[2, 1:] = 0
    model.to(device())
    params, x, y, mask = [p.to(device()) for p in params], x.to(device()), y.to(device()), mask.to(device())
    live = [p.clone().requires_grad_() for p in params]
    forward, _ = stacked_forward(model)
    total = masked_cross_entropy(forward(dict(zip(names, live)), x), y, mask).sum()
    expected = torch.autograd.grad(total, live)
    got = FeedForwardGradients(model, names)(params, x, y, mask)
    for name, a, b in zip(names, got, expected):
        assert a.shape == b.shape, name
        assert torch.allclose(a, b, atol=1e-6), (name, (a - b).abs().max())
    assert got[names.index("fc.weight")][2].abs().sum() > 0
    # one client on its own (no client dimension: 2-D products) gives that client's gradient
    alone = FeedForwardGradients(model, names)([p[1] for p in params], x[1], y[1], mask[1])
    for name, a, b in zip(names, alone, expected):
        assert a.shape == b.shape[1:], name
        assert torch.allclose(a, b[1], atol=1e-6), (name, (a - b[1]).abs().max())


@pytest.mark.parametrize("name", ["fl_logreg", "fl_mlp", "fl_ffn"])
def test_fused_engine_equals_sequential(name, one_thread, gathering):
    """Momentum, weight decay, two epochs, uneven clients (partial last batches), and full batch."""
    shape = {"fl_logreg": (6,), "fl_mlp": (1, 4, 4), "fl_ffn": (3, 4, 4)}[name]
    torch.manual_seed(0)
    model = create_fl_model(name, 3, shape, **({} if name == "fl_logreg" else {"hidden_sizes": (8, 8)}))
    for sgd in (LocalSGD(lr=0.05, momentum=0.9, weight_decay=1e-3, epochs=2, batch_size=3),
                LocalSGD(lr=0.1, epochs=2, batch_size=None)):
        engine, vec, seq, layout = train_both(model, sgd, objective=marked)
        assert engine.forward_kind == "fused"
        assert torch.allclose(vec, seq, atol=1e-5), (vec - seq).abs().max()
        assert not torch.allclose(vec, layout.flatten(dict(model.named_parameters())).expand_as(vec))


def test_fused_gradients_only_where_they_apply():
    model = feedforward()
    names = list(ParameterLayout.of(model).names)
    assert feedforward_gradients(model, names, marked, None)[0] is not None
    assert "not the plain mean cross-entropy" in feedforward_gradients(model, names, unmarked, None)[1]
    assert "autocast" in feedforward_gradients(model, names, marked, "bf16")[1]
    cnn = create_fl_model("fl_cnn_mnist", 3, (1, 8, 8), hidden_size=8)
    assert "not a FeedForwardNet" in feedforward_gradients(cnn, list(ParameterLayout.of(cnn).names), marked, None)[1]
    assert "frozen or missing" in feedforward_gradients(model, names[:-1], marked, None)[1]
    sgd = LocalSGD(lr=0.05, batch_size=3)
    assert train_both(model, sgd, objective=unmarked)[0].forward_kind == "stacked"
    assert train_both(model, sgd, objective=marked, forward="stacked")[0].forward_kind == "stacked"


def test_the_default_objective_is_marked_and_an_override_is_not():
    common = dict(backbone="fl_logreg", num_classes=3, input_shape=(6,))
    assert getattr(FedAvg(**common).client_objective, "mean_cross_entropy", False)
    assert not getattr(FedProx(mu=0.1, **common).client_objective, "mean_cross_entropy", False)


def test_a_non_finite_sample_stays_in_its_own_client(one_thread, gathering):
    model = feedforward()
    from fl_lightning.core.engines import VectorisedEngine
    from fl_lightning.core.local import batch_order
    from tests.fl_lightning.models.test_stacked import image_shards

    shards = image_shards([4, 2, 5], (2, 3, 3), model=model)
    shards.x[0, 0] = float("nan")  # client 0's first sample
    sgd = LocalSGD(lr=0.05, batch_size=3)
    order = batch_order(shards.sizes, 5, 1, torch.Generator().manual_seed(1))
    start = {n: p.detach() for n, p in model.named_parameters()}
    engine = VectorisedEngine()
    trained = ParameterLayout.of(model).flatten_stacked(engine.train(model, ParameterLayout.of(model), start, shards,
                                                                     order, sgd, marked))
    assert engine.forward_kind == "fused"
    assert not torch.isfinite(trained[0]).all() and torch.isfinite(trained[1:]).all()


@pytest.mark.parametrize("bad_sample, finite", [(5 + 2, [True, False, True, True]),  # a client that never steps alone
                                                # the client that ends alone
                                                (5 + 6 + 3 + 9, [True, True, True, False])])
def test_fused_a_non_finite_sample_stays_in_its_own_client(gathering, bad_sample, finite):
    """Hand-derived gradients, both gatherings: a NaN sample makes its own client's model
    non-finite and no other's, also in the client whose last steps it takes alone (2-D
    products); the padding sample is NaN too and is never trained on."""
    from tests.fl_lightning.core.test_engines import make_shards

    model = create_fl_model("fl_logreg", 3, (5,))
    layout = ParameterLayout.of(model)
    shards = make_shards([5, 6, 3, 11], nan_padding=True)  # 4 steps of 4: client 3 is alone at the last
    shards.x[bad_sample] = float("nan")
    sgd = LocalSGD(lr=0.1, momentum=0.5, epochs=2, batch_size=4)
    order = batch_order(shards.sizes, shards.index.shape[1], sgd.epochs, torch.Generator().manual_seed(1))
    engine = VectorisedEngine(None)
    trained = layout.flatten_stacked(engine.train(model, layout, dict(model.named_parameters()), shards, order,
                                                  sgd, marked))
    assert engine.forward_kind == "fused"
    assert torch.isfinite(trained).all(dim=1).tolist() == finite
