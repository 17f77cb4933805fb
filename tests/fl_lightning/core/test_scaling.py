"""Issue 5 on one device: automatic client chunks, out-of-memory fallback, mixed
precision for local training, and history buffers stored in another dtype or offloaded."""

import pytest
import torch

from fl_lightning.algorithms import FedAvg, FedFV
from fl_lightning.core.engines import SequentialEngine, VectorisedEngine, auto_chunk_size
from fl_lightning.core.flat import ParameterLayout
from fl_lightning.core.local import ClientShards, LocalSGD, batch_order, masked_cross_entropy
from fl_lightning.models import create_fl_model
from tests.fl_lightning.core.test_module import Recorder, digits_data, fit, module_for


def objective(logits, targets, mask, *_):
    return masked_cross_entropy(logits, targets, mask)


@pytest.fixture()
def round_of_clients():
    torch.manual_seed(0)
    model = create_fl_model("fl_mlp", 10, (60,), hidden_sizes=[32])
    layout = ParameterLayout.of(model)
    x, y = torch.randn(400, 60), torch.randint(0, 10, (400,))
    m = 12
    index = torch.randperm(400)[: m * 30].view(m, 30)
    sizes = torch.full((m,), 30)
    sizes[3], sizes[7] = 17, 4
    shards = ClientShards(x, y, index, sizes, sizes.tolist())
    order = batch_order(sizes, 30, 2, torch.Generator().manual_seed(1))
    sgd = LocalSGD(lr=0.1, momentum=0.5, epochs=2, batch_size=10)
    params = dict(model.named_parameters())
    reference = SequentialEngine().train(model, layout, params, shards, order, sgd, objective)
    return model, layout, params, shards, order, sgd, reference


def largest_difference(a, b):
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def test_auto_chunk_size_on_the_cpu_keeps_a_chunk_within_32_mb():
    cpu = torch.device("cpu")
    assert auto_chunk_size(100, 610, cpu) == 100  # logistic regression: everyone at once
    assert auto_chunk_size(100, 199_210, cpu) == 32 * 2**20 // (16 * 199_210) == 10
    assert auto_chunk_size(100, 11_000_000, cpu) == 1  # never zero


def test_auto_chunks_train_what_the_sequential_engine_trains(round_of_clients):
    model, layout, params, shards, order, sgd, reference = round_of_clients
    engine = VectorisedEngine("auto")
    trained = engine.train(model, layout, params, shards, order, sgd, objective)
    assert engine.chunk_size == 12
    assert largest_difference(trained, reference) < 1e-5


def test_out_of_memory_halves_the_chunk_and_loses_no_client(round_of_clients, monkeypatch):
    model, layout, params, shards, order, sgd, reference = round_of_clients
    real = VectorisedEngine.train_lockstep

    def small_memory(model, chunk_params, *args):
        if next(iter(chunk_params.values())).shape[0] > 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(model, chunk_params, *args)

    monkeypatch.setattr(VectorisedEngine, "train_lockstep", staticmethod(small_memory))
    engine = VectorisedEngine(None)
    with pytest.warns(UserWarning, match="out of memory training 12 clients at once; retrying in chunks of 6"):
        trained = engine.train(model, layout, params, shards, order, sgd, objective)
    assert (engine.chunk_size, engine.oom_retries) == (3, 2)
    assert largest_difference(trained, reference) < 1e-5


def test_other_errors_and_one_client_out_of_memory_still_raise(round_of_clients, monkeypatch):
    model, layout, params, shards, order, sgd, _ = round_of_clients

    def broken(*args):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(VectorisedEngine, "train_lockstep", staticmethod(broken))
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        VectorisedEngine(4).train(model, layout, params, shards, order, sgd, objective)

    def no_memory(*args):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(VectorisedEngine, "train_lockstep", staticmethod(no_memory))
    with pytest.warns(UserWarning), pytest.raises(torch.OutOfMemoryError):
        VectorisedEngine(2).train(model, layout, params, shards, order, sgd, objective)


def test_the_module_keeps_the_smaller_chunk_after_running_out_of_memory(monkeypatch):
    real = VectorisedEngine.train_lockstep
    sizes = []

    def small_memory(model, chunk_params, *args):
        sizes.append(next(iter(chunk_params.values())).shape[0])
        if sizes[-1] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory")
        return real(model, chunk_params, *args)

    monkeypatch.setattr(VectorisedEngine, "train_lockstep", staticmethod(small_memory))
    data = digits_data(num_clients=8)
    module = module_for(data, engine="vectorised", num_rounds=2)
    recorder = Recorder()
    with pytest.warns(UserWarning, match="out of memory"):
        fit(module, data, callbacks=[recorder])
    assert sizes[:3] == [8, 4, 2]  # round 1 halves twice ...
    assert set(sizes[3:]) == {2}  # ... and the later rounds start from the size that fitted
    assert [r["chunk_size"] for r in recorder.rounds] == [2.0, 2.0]
    assert recorder.rounds[-1]["oom_retries"] == 2.0


def test_bf16_autocast_trains_close_to_float32_but_not_identically(round_of_clients):
    model, layout, params, shards, order, sgd, reference = round_of_clients
    for engine in (VectorisedEngine(None, "bf16"), SequentialEngine("bf16")):
        trained = engine.train(model, layout, params, shards, order, sgd, objective)
        assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in trained.values())
        difference = largest_difference(trained, reference)
        assert 1e-5 < difference < 5e-2, engine.name


def test_a_bf16_run_learns(tmp_path):
    data = digits_data(num_clients=5)
    full = module_for(data, num_rounds=4)
    mixed = module_for(data, num_rounds=4, local_autocast="bf16")
    fit(full, data)
    fit(mixed, data)
    acc_full = full.evaluate_all_clients()["test_acc_mean"]
    acc_mixed = mixed.evaluate_all_clients()["test_acc_mean"]
    assert acc_mixed > 0.5 and abs(acc_mixed - acc_full) < 0.1


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fedfv_history_in_a_smaller_dtype(dtype):
    data = digits_data(num_clients=6)
    module = module_for(data, cls=FedFV, fraction=0.5, num_rounds=3, tau=2, history_dtype=dtype)
    fit(module, data)
    assert module.history.dtype == getattr(torch, dtype)
    # rows of clients last seen in the window a later round reads are kept (the rest are zeroed)
    in_window = module.last_seen >= max(module.first_round_read(3), 0)
    assert in_window.sum() >= 3 and (module.history[in_window].abs().sum(dim=1) > 0).all()
    reference = module_for(data, cls=FedFV, fraction=0.5, num_rounds=3, tau=2)
    fit(reference, data)
    assert torch.allclose(module.history.float(), reference.history, atol=1e-2)


def test_an_offloaded_history_stays_in_host_memory_when_the_module_moves():
    data = digits_data(num_clients=6)
    module = module_for(data, cls=FedFV, fraction=0.5, num_rounds=2, tau=1, history_device="cpu")
    fit(module, data)
    history = module.history
    module.register_buffer("probe", torch.zeros(1))
    module.double()  # every other floating buffer and parameter follows the move/cast
    assert module.history is history and module.history.dtype == torch.float32
    assert module.probe.dtype == torch.float64
    assert next(module.model.parameters()).dtype == torch.float64


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("clients_per_chunk", 0, "clients_per_chunk must be an integer >= 1, 'auto' or null"),
        ("clients_per_chunk", "many", "clients_per_chunk must be an integer >= 1, 'auto' or null"),
        ("local_autocast", "int8", "unknown local_autocast 'int8'; valid: null"),
        (
            "history_dtype",
            "int8",
            "unknown history_dtype 'int8'; valid: null \\(the parameters' dtype\\), 'float32', 'bfloat16', 'float16'",
        ),
        ("history_device", "disk", "unknown history_device 'disk'; valid: 'model', 'cpu'"),
    ],
)
def test_scaling_options_are_checked(option, value, message):
    with pytest.raises(ValueError, match=message):
        FedAvg(**{option: value})
