"""The vectorised engine computes exactly what the sequential (plain PyTorch) engine does."""

import pytest
import torch
from torch import nn

from fl_lightning.core.engine_runner import choose_engine
from fl_lightning.core.engines import SequentialEngine, VectorisedEngine
from fl_lightning.core.flat import ParameterLayout
from fl_lightning.core.local import (
    ClientShards,
    LocalSGD,
    batch_order,
    masked_cross_entropy,
    steps_per_epoch,
)
from tests.accelerator import device, shards_on


def small_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))


def make_shards(sizes, seed=0, nan_padding=False) -> ClientShards:
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    x = torch.randn(total + 1, 5, generator=g)
    y = torch.randint(0, 3, (total + 1,), generator=g)
    if nan_padding:
        x[total] = float("nan")  # the padding sample: must never be trained on
    index = torch.full((len(sizes), max(sizes)), total, dtype=torch.long)
    start = 0
    for k, n in enumerate(sizes):
        index[k, :n] = torch.arange(start, start + n)
        start += n
    sizes_t = torch.tensor(sizes)
    return ClientShards(x, y, index, sizes_t, list(sizes))


def ce(logits, targets, mask, local_params, global_params):
    return masked_cross_entropy(logits, targets, mask)


def prox(mu):
    def objective(logits, targets, mask, local_params, global_params):
        penalty = sum((local_params[n] - global_params[n]).pow(2).flatten(1).sum(1) for n in global_params)
        return masked_cross_entropy(logits, targets, mask) + 0.5 * mu * penalty

    return objective


def run_both(sizes, sgd, objective=ce, nan_padding=False, clients_per_chunk=None, forward="auto"):
    model = small_net().to(device())
    layout = ParameterLayout.of(model)
    shards = shards_on(make_shards(sizes, nan_padding=nan_padding))
    order = batch_order(shards.sizes, shards.index.shape[1], sgd.epochs, torch.Generator().manual_seed(3))
    params = dict(model.named_parameters())
    engine = VectorisedEngine(clients_per_chunk, forward=forward)
    vec = engine.train(model, layout, params, shards, order, sgd, objective)
    assert engine.forward_kind == ("vmap" if forward == "vmap" else "stacked")
    seq = SequentialEngine().train(model, layout, params, shards, order, sgd, objective)
    return layout.flatten_stacked(vec), layout.flatten_stacked(seq), layout.flatten(params)


@pytest.mark.parametrize(
    "sgd",
    [
        LocalSGD(lr=0.1, epochs=1, batch_size=4),
        LocalSGD(lr=0.05, momentum=0.9, weight_decay=1e-3, epochs=2, batch_size=3),
        LocalSGD(lr=0.2, epochs=3, batch_size=None),
    ],
    ids=["plain", "momentum-wd-E2", "full-batch"],
)
@pytest.mark.parametrize("forward", ["auto", "vmap"])
def test_vectorised_equals_sequential(sgd, forward):
    vec, seq, start = run_both([7, 1, 12, 4, 9], sgd, forward=forward)
    assert torch.allclose(vec, seq, atol=1e-5), (vec - seq).abs().max()
    assert not torch.allclose(vec, start.expand_as(vec))  # every client trained


def test_vectorised_equals_sequential_with_proximal_term():
    sgd = LocalSGD(lr=0.1, momentum=0.5, epochs=2, batch_size=5)
    vec, seq, _ = run_both([11, 3, 6], sgd, objective=prox(mu=0.5))
    assert torch.allclose(vec, seq, atol=1e-5)
    vec0, _, _ = run_both([11, 3, 6], sgd, objective=ce)
    assert not torch.allclose(vec, vec0, atol=1e-4)  # the proximal term changes the result


@pytest.mark.parametrize("chunk", [1, 2, 4])
def test_chunked_vectorised_equals_sequential(chunk):
    vec, seq, _ = run_both([7, 1, 12, 4, 9], LocalSGD(lr=0.1, momentum=0.9, epochs=2, batch_size=4),
                           clients_per_chunk=chunk)
    assert torch.allclose(vec, seq, atol=1e-5)


@pytest.mark.parametrize("forward", ["auto", "vmap"])
def test_padding_never_trained_on(forward):
    vec, seq, _ = run_both([2, 9, 5], LocalSGD(lr=0.1, epochs=2, batch_size=4), nan_padding=True, forward=forward)
    assert torch.isfinite(vec).all() and torch.isfinite(seq).all()


def test_each_client_gets_its_own_steps():
    # With lr on a linear model, one client's result must not depend on who else trains.
    sgd = LocalSGD(lr=0.1, epochs=2, batch_size=3)
    together, _, _ = run_both([7, 2, 10], sgd)
    model = small_net().to(device())
    layout = ParameterLayout.of(model)
    shards = shards_on(make_shards([7, 2, 10]))
    order = batch_order(shards.sizes, 10, 2, torch.Generator().manual_seed(3))
    alone = ClientShards(shards.x, shards.y, shards.index[1:2, :2], shards.sizes[1:2], [2])
    single = VectorisedEngine().train(
        model, layout, dict(model.named_parameters()), alone, order[:, 1:2, :2], sgd, ce
    )
    assert torch.allclose(layout.flatten_stacked(single)[0], together[1], atol=1e-6)


def test_batch_order_is_a_permutation_of_each_clients_positions():
    sizes = torch.tensor([3, 6, 1])
    order = batch_order(sizes, 6, 4, torch.Generator().manual_seed(0))
    assert order.shape == (4, 3, 6)
    for e in range(4):
        for k, n in enumerate(sizes.tolist()):
            assert sorted(order[e, k, :n].tolist()) == list(range(n))
    # epochs are reshuffled
    assert not all(torch.equal(order[0, 1], order[e, 1]) for e in range(1, 4))


def test_steps_per_epoch():
    assert steps_per_epoch([10, 11, 1], 5) == [2, 3, 1]
    assert steps_per_epoch([10, 11, 1], None) == [1, 1, 1]


def test_masked_cross_entropy_is_per_client_and_ignores_masked_samples():
    logits = torch.tensor([[[2.0, 0.0], [0.0, 5.0]], [[1.0, 1.0], [3.0, 0.0]]])
    targets = torch.tensor([[0, 0], [1, 0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    expected = torch.stack([
        nn.functional.cross_entropy(logits[0, :1], targets[0, :1]),
        nn.functional.cross_entropy(logits[1], targets[1]),
    ])
    assert torch.allclose(masked_cross_entropy(logits, targets, mask), expected)


@pytest.mark.parametrize("bad", [dict(lr=0), dict(batch_size=0), dict(epochs=0), dict(momentum=1.0)])
def test_local_sgd_rejects_bad_values(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        LocalSGD(**bad)


def test_engine_choice():
    assert choose_engine("auto", 10, 1000, 10**9).name == "vectorised"
    assert choose_engine("auto", 100, 10**8, 10**9).name == "sequential"
    assert choose_engine("sequential", 10, 10, 10**9).name == "sequential"
    with pytest.raises(ValueError, match="valid"):
        choose_engine("turbo", 1, 1, 1)
    with pytest.raises(ValueError, match="unknown forward 'fast'; valid: 'auto', 'stacked', 'vmap'"):
        VectorisedEngine(forward="fast")


def test_per_client_starting_points_and_anchor():
    """Personal models: each client starts from its own parameters, proximal to a shared anchor."""
    model = small_net()
    layout = ParameterLayout.of(model)
    shards = make_shards([5, 8, 3])
    order = batch_order(shards.sizes, 8, 2, torch.Generator().manual_seed(1))
    sgd = LocalSGD(lr=0.1, momentum=0.5, epochs=2, batch_size=3)
    anchor = {n: p.detach() for n, p in model.named_parameters()}
    starts = {n: p.unsqueeze(0) + 0.1 * torch.randn(3, *p.shape) for n, p in anchor.items()}
    vec = VectorisedEngine().train(model, layout, starts, shards, order, sgd, prox(1.0), anchor=anchor)
    seq = SequentialEngine().train(model, layout, starts, shards, order, sgd, prox(1.0), anchor=anchor)
    assert torch.allclose(layout.flatten_stacked(vec), layout.flatten_stacked(seq), atol=1e-5)
    # client 1 alone, from its own start, gives the same parameters
    alone = ClientShards(shards.x, shards.y, shards.index[1:2], shards.sizes[1:2], [8])
    one = VectorisedEngine().train(
        model, layout, {n: p[1:2] for n, p in starts.items()}, alone, order[:, 1:2], sgd, prox(1.0), anchor=anchor
    )
    assert torch.allclose(layout.flatten_stacked(one)[0], layout.flatten_stacked(vec)[1], atol=1e-6)
    with pytest.raises(ValueError, match="anchor"):
        VectorisedEngine().train(model, layout, starts, shards, order, sgd, ce)


@pytest.mark.parametrize("forward", ["auto", "vmap"])
def test_both_gatherings_equal_sequential_and_never_train_on_padding(gathering, forward):
    sgd = LocalSGD(lr=0.05, momentum=0.9, weight_decay=1e-3, epochs=2, batch_size=3)
    vec, seq, _ = run_both([7, 1, 12, 4, 9], sgd, forward=forward)
    assert torch.allclose(vec, seq, atol=1e-5), (vec - seq).abs().max()
    vec, seq, _ = run_both([2, 9, 5], LocalSGD(lr=0.1, epochs=2, batch_size=4), nan_padding=True, forward=forward)
    assert torch.isfinite(vec).all() and torch.isfinite(seq).all()


@pytest.mark.parametrize("forward", ["auto", "vmap"])
def test_padding_first_met_after_the_first_step_is_never_trained_on(gathering, forward):
    """Issue 50: step 0 is full for every client (8, 6, 5 samples, batches of 4); the partial
    batches come at step 1. Their padded positions point at a NaN sample: blanked, every model
    stays finite (a check of step 0's padding alone would let the NaN in)."""
    vec, seq, _ = run_both([8, 6, 5], LocalSGD(lr=0.1, epochs=2, batch_size=4), nan_padding=True, forward=forward)
    assert torch.isfinite(vec).all() and torch.isfinite(seq).all()
    assert torch.allclose(vec, seq, atol=1e-5)


@pytest.mark.parametrize("forward", ["auto", "vmap"])
def test_a_non_finite_sample_stays_in_its_own_client(gathering, forward):
    """Client 1's third sample is NaN: client 1's model goes non-finite, no other client's does
    (the padding of the other clients' partial batches points at other clients' samples)."""
    model = small_net()
    layout = ParameterLayout.of(model)
    shards = make_shards([5, 6, 3, 7])
    shards.x[5 + 2] = float("nan")
    sgd = LocalSGD(lr=0.1, epochs=2, batch_size=4)
    order = batch_order(shards.sizes, shards.index.shape[1], sgd.epochs, torch.Generator().manual_seed(1))
    trained = layout.flatten_stacked(VectorisedEngine(None, forward=forward).train(
        model, layout, dict(model.named_parameters()), shards, order, sgd, ce))
    finite = torch.isfinite(trained).all(dim=1)
    assert finite.tolist() == [True, False, True, True]
