"""Flat views, layer groups, Gram helpers, conflict counts and per-client evaluation."""

import pytest
import torch

from fl_lightning.algorithms import FedAvg
from fl_lightning.core.evaluation import SamplePositions, evaluate_clients, evaluate_clients_stacked
from fl_lightning.core.flat import (
    ParameterLayout,
    assign_model_vector,
    layer_names,
    layer_slices,
    model_vector,
)
from fl_lightning.core.gram import combine, conflict_counts, gram, layer_combination, layer_grams
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.models import create_fl_model
from tests.builders import fit


def test_layout_round_trips():
    model = create_fl_model("fl_cnn_cifar", 10, (3, 32, 32))
    layout = ParameterLayout.of(model)
    assert layout.num_parameters == 797_962
    flat = model_vector(model, layout)
    assert torch.equal(layout.flatten(layout.unflatten(flat)), flat)
    rows = torch.stack([flat, 2 * flat])
    assert torch.equal(layout.flatten_stacked(layout.unflatten_stacked(rows)), rows)
    assign_model_vector(model, layout, 3 * flat)
    assert torch.equal(model_vector(model, layout), 3 * flat)


def test_layer_groupings_of_the_mlp():
    model = create_fl_model("fl_mlp", 10, (1, 28, 28))
    layout = ParameterLayout.of(model)
    per_tensor = layer_slices(model, layout, "tensor")
    per_module = layer_slices(model, layout, "module")
    assert len(per_tensor) == 6 and len(per_module) == 3  # weight and bias of 3 linear layers
    assert [s.stop - s.start for s in per_module] == [784 * 200 + 200, 200 * 200 + 200, 200 * 10 + 10]
    assert per_module[-1].stop == layout.num_parameters
    assert len(layer_names(layout, "module")) == 3
    with pytest.raises(ValueError, match="tensor"):
        layer_slices(model, layout, "block")


def test_gram_blocks_sum_to_the_gram_and_combinations():
    torch.manual_seed(0)
    updates = torch.randn(5, 12)
    slices = [slice(0, 4), slice(4, 9), slice(9, 12)]
    blocks = layer_grams(updates, slices)
    assert torch.allclose(blocks.sum(0), gram(updates))
    coefficients = torch.rand(5)
    assert torch.allclose(combine(coefficients, updates), (coefficients[:, None] * updates).sum(0), atol=1e-6)
    per_layer = torch.rand(3, 5)
    expected = torch.cat([(per_layer[k][:, None] * updates[:, s]).sum(0) for k, s in enumerate(slices)])
    assert torch.allclose(layer_combination(per_layer, updates, slices), expected, atol=1e-6)


def test_conflict_counts_on_fedlf_two_layer_example():
    # FedLF appendix A.1: g1=(.1,.1,.2,-.1), g2=(-.1,.2,-.1,.4); averaging d = -(g1+g2)/2
    # is a common descent direction but conflicts with g1's second layer.
    g = torch.tensor([[0.1, 0.1, 0.2, -0.1], [-0.1, 0.2, -0.1, 0.4]])
    step = g.mean(0)  # the server moves by -step
    model_level, per_layer = conflict_counts(g, step, [slice(0, 2), slice(2, 4)])
    assert model_level == 0
    assert per_layer == [0, 1]


def test_stacked_evaluation_equals_one_model_per_client():
    data = FederatedDataModule(source="digits", num_clients=4, partition="iid", test_mode="local", seed=0)
    data.setup()
    model = create_fl_model("fl_mlp", 10, data.input_shape, hidden_sizes=[8])
    layout = ParameterLayout.of(model)
    flats = torch.stack([model_vector(model, layout) + 0.3 * k * torch.randn(layout.num_parameters) for k in range(4)])
    losses, accs = evaluate_clients_stacked(model, layout, flats, data.test_x, data.test_y, data.test_index,
                                            data.test_sizes, positions_per_pass=7, clients_per_pass=3)
    for k in range(4):
        assign_model_vector(model, layout, flats[k])
        loss_k, acc_k = evaluate_clients(
            model, data.test_x, data.test_y, data.test_index[k : k + 1], data.test_sizes[k : k + 1]
        )
        assert torch.allclose(losses[k], loss_k[0], atol=1e-5) and torch.allclose(accs[k], acc_k[0])


def test_clients_whose_samples_are_the_rows_in_order_give_the_bits_of_the_gather():
    """Every client of a client-grouped x (full participation): chunks are slices of x; the
    losses and accuracies equal, to the bit, those of the gathered path, also when a chunk
    boundary falls inside a client, and the kept positions are reused only for equal clients."""
    generator = torch.Generator().manual_seed(0)
    sizes = torch.tensor([300, 1, 517, 0, 212])
    x = torch.randn(int(sizes.sum()), 60, generator=generator)
    y = torch.randint(0, 10, (x.shape[0],), generator=generator)
    index = torch.zeros(5, int(sizes.max()), dtype=torch.long)
    for k, start in enumerate((sizes.cumsum(0) - sizes).tolist()):
        index[k, : sizes[k]] = torch.arange(start, start + int(sizes[k]))
    model = create_fl_model("fl_mlp", 10, (60,), hidden_sizes=[32])
    positions = SamplePositions(index, sizes)
    assert positions.in_order and positions.describes(index.clone(), sizes.clone())
    assert not positions.describes(index[:4], sizes[:4])
    gathered = SamplePositions(index, sizes)
    gathered.in_order = False  # the path of any other set of clients
    for chunk_size in (64, 8192):
        sliced = evaluate_clients(model, x, y, index, sizes, chunk_size=chunk_size, positions=positions)
        copied = evaluate_clients(model, x, y, index, sizes, chunk_size=chunk_size, positions=gathered)
        assert torch.equal(sliced[0].nan_to_num(-1), copied[0].nan_to_num(-1))
        assert torch.equal(sliced[1].nan_to_num(-1), copied[1].nan_to_num(-1))
    reordered = index[[2, 0, 1, 3, 4]], sizes[[2, 0, 1, 3, 4]]
    assert not SamplePositions(*reordered).in_order
    losses, _ = evaluate_clients(model, x, y, *reordered)
    assert torch.equal(losses.nan_to_num(-1), copied[0][[2, 0, 1, 3, 4]].nan_to_num(-1))


@pytest.mark.parametrize("name, shape", [("fl_cnn_mnist", (1, 28, 28)), ("fl_text_cnn", (40,)),
                                         ("fl_mlp", (1, 28, 28)), ("fl_logreg", (60,))])
def test_chunks_sized_by_the_activations_give_the_bits_of_one_chunk(name, shape, monkeypatch):
    """Evaluation chunks hold as many rows as keep their activations within the budget (128 rows
    of the MNIST CNN, 8,192 of an MLP): the losses and accuracies equal, to the bit, those of one
    chunk of every sample, through the shared path and the per-client (vmap) path (whose forward
    runs in pieces inside a pass of 256 positions)."""
    from fl_lightning.core import evaluation
    from fl_lightning.core.evaluation import activation_bytes_per_sample, rows_within_budget
    from fl_lightning.core.flat import ParameterLayout, model_vector

    generator = torch.Generator().manual_seed(1)
    model = create_fl_model(name, 10, shape)
    n = 600
    x = (torch.randint(0, 50, (n, *shape), generator=generator) if name == "fl_text_cnn"
         else torch.randn(n, *shape, generator=generator))
    y = torch.randint(0, 10, (n,), generator=generator)
    sizes = torch.tensor([250, 0, 350])
    index = torch.stack([torch.arange(350), torch.zeros(350, dtype=torch.long), torch.arange(250, 600)])
    rows = rows_within_budget(activation_bytes_per_sample(model, x[0]), 64, 8192)
    assert (rows < 8192) == name.startswith("fl_cnn") or name == "fl_text_cnn"
    assert evaluation._rows(model, torch.empty(5, *shape, device="meta"), 1, 64, 8192) == 8192  # not a CPU: as before
    chosen = evaluate_clients(model, x, y, index, sizes)
    whole = evaluate_clients(model, x, y, index, sizes, chunk_size=8192)
    assert all(torch.equal(a.nan_to_num(-1), b.nan_to_num(-1)) for a, b in zip(chosen, whole))
    layout = ParameterLayout.of(model)
    params = torch.stack([model_vector(model, layout) * (1 + 0.01 * k) for k in range(3)])
    chosen = evaluate_clients_stacked(model, layout, params, x, y, index, sizes)
    with monkeypatch.context() as patched:  # the budget of a whole pass in one forward
        patched.setattr(evaluation, "ACTIVATION_BUDGET_BYTES", 2**40)
        whole = evaluate_clients_stacked(model, layout, params, x, y, index, sizes)
    assert all(torch.equal(a.nan_to_num(-1), b.nan_to_num(-1)) for a, b in zip(chosen, whole))


def test_the_module_keeps_the_sample_positions_between_rounds():
    module = FedAvg(backbone="fl_logreg", num_classes=10, input_shape=(60,))
    kept = module.round_engine.evaluator.kept
    assert module.round_engine.evaluator.kept is kept  # one per module, not one per access
    index, sizes = torch.arange(6).view(2, 3), torch.tensor([3, 2])
    first = kept.of(index, sizes)
    assert kept.of(index.clone(), sizes.clone()) is first and kept.of(index, torch.tensor([3, 3])) is not first


class PersonalCopies(FedAvg):
    """Evaluates K identical copies of the global model through the per-client path."""

    def evaluation_params(self):
        return self.round_engine.global_vector().unsqueeze(0).expand(self.num_clients_total, -1)  # a test may peek


def test_per_client_evaluation_path_matches_the_shared_one():
    results = []
    for cls in (FedAvg, PersonalCopies):
        data = FederatedDataModule(source="digits", num_clients=6, partition="iid", test_mode="local", seed=0)
        module = cls(backbone="fl_logreg", num_classes=10, input_shape=data.input_shape, num_rounds=2, fraction=1.0,
                     lr=0.1, eval_every=1)
        results.append(fit(module, data).callback_metrics["test_acc_mean"].item())
    assert results[0] == pytest.approx(results[1], abs=1e-6)


def test_lr_decay_conflicts_and_improvement_are_logged():
    data = FederatedDataModule(source="digits", num_clients=6, partition="iid", test_mode="local", seed=0)
    module = FedAvg(backbone="fl_logreg", num_classes=10, input_shape=data.input_shape, num_rounds=3, eval_every=1,
                    fraction=1.0, lr=0.2, lr_decay=0.5, track_improvement=True, layer_grouping="module")
    assert module.round_engine.round_lr(0) == 0.2 and module.round_engine.round_lr(2) == pytest.approx(0.05)
    metrics = fit(module, data).callback_metrics
    assert 0 <= metrics["improved_fraction"].item() <= 1
    assert 0 <= metrics["conflicts_model"].item() <= 6
    assert [k for k in metrics if k.startswith("conflicts_layer/")] == ["conflicts_layer/fc"]
