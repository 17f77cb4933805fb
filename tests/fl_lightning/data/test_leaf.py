"""LEAF sources (shakespeare, femnist) on fixture files in LEAF's JSON format, the offline
pydoc_chars stand-in, and the fl_lstm_chars / fl_cnn_femnist models."""

import json
import os

import lightning.pytorch as pl
import numpy as np
import pytest
import timm
import torch

from fl_lightning.algorithms import FedAvg
from fl_lightning.core.engines import SequentialEngine, VectorisedEngine
from fl_lightning.core.flat import ParameterLayout
from fl_lightning.core.local import ClientShards, LocalSGD, batch_order, masked_cross_entropy
from fl_lightning.data import FederatedDataModule, load_source
from fl_lightning.data.leaf import LEAF_LETTERS, encode_text
from fl_lightning.data.sources import missing_files

LINES = "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer! " * 3


def write_leaf(folder, users, make_sample, counts, name="all_data_0.json"):
    """One LEAF JSON file: {"users", "num_samples", "user_data": {u: {"x": [...], "y": [...]}}}."""
    os.makedirs(folder, exist_ok=True)
    user_data = {}
    for u, n in zip(users, counts):
        samples = [make_sample(u, i) for i in range(n)]
        user_data[u] = {"x": [s[0] for s in samples], "y": [s[1] for s in samples]}
    blob = {"users": list(users), "num_samples": list(counts), "user_data": user_data}
    with open(os.path.join(folder, name), "w") as handle:
        json.dump(blob, handle)


def shakespeare_sample(user, i):
    start = (len(user) * 7 + i) % 150
    return LINES[start:start + 80], LINES[start + 80]


ROLES = [f"THE_TRAGEDY_{k}_ROLE" for k in range(8)]


@pytest.fixture()
def shakespeare_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FL_LIGHTNING_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "data" / "shakespeare"
    write_leaf(root / "train", ROLES[:5], shakespeare_sample, [3, 5, 2, 4, 6], "train_0.json")
    write_leaf(root / "train", ROLES[5:], shakespeare_sample, [2, 3, 1], "train_1.json")
    write_leaf(root / "test", ROLES, shakespeare_sample, [1, 2, 1, 1, 2, 1, 1, 1], "test_0.json")
    return str(tmp_path / "data")


def test_vocabulary_is_leafs_80_letters():
    assert len(LEAF_LETTERS) == len(set(LEAF_LETTERS)) == 80
    assert encode_text("ab#").tolist() == [LEAF_LETTERS.index("a"), LEAF_LETTERS.index("b"), 1]


def test_shakespeare_loads_natural_clients_with_their_own_tests(shakespeare_dir):
    data = load_source("shakespeare", shakespeare_dir, seed=0, num_clients=8)
    sorted_roles = sorted(ROLES)
    train_counts = dict(zip(ROLES, [3, 5, 2, 4, 6, 2, 3, 1]))
    test_counts = dict(zip(ROLES, [1, 2, 1, 1, 2, 1, 1, 1]))
    assert data.info.num_classes == 80 and data.info.natural_clients
    assert data.x_train.shape == (26, 80) and data.x_train.dtype == torch.float32
    assert data.client_of_train.bincount().tolist() == [train_counts[r] for r in sorted_roles]
    assert data.client_of_test.bincount().tolist() == [test_counts[r] for r in sorted_roles]
    assert data.y_client_test.dtype == torch.int64 and len(data.x_client_test) == 10
    # client 0's first sample is the first sample of the first role in name order
    x, y = shakespeare_sample(sorted_roles[0], 0)
    assert data.x_train[0].long().tolist() == encode_text(x).tolist()
    assert int(data.y_train[0]) == LEAF_LETTERS.index(y)


def test_shakespeare_user_selection_is_deterministic_in_the_seed(shakespeare_dir):
    def chosen(seed):
        data = load_source("shakespeare", shakespeare_dir, seed=seed, num_clients=3)
        return data.client_of_train.bincount().tolist(), data.x_train.sum().item()

    assert chosen(1) == chosen(1)
    assert len({str(chosen(s)) for s in range(6)}) > 1
    assert len(chosen(1)[0]) == 3
    with pytest.raises(ValueError, match="asked for 9 users"):
        load_source("shakespeare", shakespeare_dir, num_clients=9)


def test_missing_leaf_files_say_where_and_how(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no LEAF JSON files in .*shakespeare.*train.*preprocess\.sh"):
        load_source("shakespeare", str(tmp_path))
    missing, obtain = missing_files("femnist", str(tmp_path))
    assert len(missing) == 2 and "preprocess.sh" in obtain


def femnist_sample(user, i):
    rng = np.random.default_rng([len(user), i])
    return (rng.integers(0, 256, 784) / 255.0).tolist(), int((len(user) + i) % 62)


def test_femnist_loads_writers_as_clients(tmp_path, monkeypatch):
    monkeypatch.setenv("FL_LIGHTNING_CACHE", str(tmp_path / "cache"))
    writers = ["f0001_41", "f0002_07", "f0100_33"]
    write_leaf(tmp_path / "femnist" / "train", writers, femnist_sample, [4, 2, 3])
    write_leaf(tmp_path / "femnist" / "test", writers, femnist_sample, [1, 1, 2])
    data = load_source("femnist", str(tmp_path))
    assert data.x_train.shape == (9, 1, 28, 28) and data.info.num_classes == 62
    assert data.client_of_train.tolist() == [0] * 4 + [1] * 2 + [2] * 3
    assert data.client_of_test.tolist() == [0, 1, 2, 2]
    x, y = femnist_sample(writers[2], 1)
    assert torch.allclose(data.x_train[7].flatten(), torch.tensor(x, dtype=torch.float32))
    assert int(data.y_train[7]) == y
    two = load_source("femnist", str(tmp_path), seed=3, num_clients=2)
    assert two.client_of_train.unique().tolist() == [0, 1]
    assert torch.equal(two.x_train, load_source("femnist", str(tmp_path), seed=3, num_clients=2).x_train)


def test_pydoc_chars_is_deterministic_with_per_client_tests():
    a = load_source("pydoc_chars", num_clients=4, max_samples_per_client=50)
    b = load_source("pydoc_chars", num_clients=4, max_samples_per_client=50, seed=7)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_client_test, b.y_client_test)
    assert a.x_train.shape == (200, 80) and a.client_of_train.bincount().tolist() == [50] * 4
    assert a.client_of_test.bincount().tolist() == [12] * 4
    assert 0 <= int(a.y_train.min()) and int(a.y_train.max()) < 80


def test_models_forward_shapes():
    lstm = timm.create_model("fl_lstm_chars")
    assert lstm(torch.randint(0, 80, (3, 80)).float()).shape == (3, 80)
    cnn = timm.create_model("fl_cnn_femnist")
    assert cnn(torch.randn(2, 1, 28, 28)).shape == (2, 62)
    assert sum(p.numel() for p in cnn.parameters()) == 1_206_590  # FedMGDA+ Table 4


@pytest.mark.parametrize("forward", ["auto", "vmap"])
def test_lstm_vectorised_equals_sequential(forward):
    torch.manual_seed(0)
    model = timm.create_model("fl_lstm_chars", input_shape=(12,), hidden_size=16, embedding_dim=4)
    sizes = [5, 2, 7]
    g = torch.Generator().manual_seed(1)
    total = sum(sizes)
    x = torch.randint(0, 80, (total + 1, 12), generator=g).float()
    y = torch.randint(0, 80, (total + 1,), generator=g)
    index = torch.full((len(sizes), max(sizes)), total, dtype=torch.long)
    start = 0
    for k, n in enumerate(sizes):
        index[k, :n] = torch.arange(start, start + n)
        start += n
    shards = ClientShards(x, y, index, torch.tensor(sizes), list(sizes))
    order = batch_order(shards.sizes, max(sizes), 2, torch.Generator().manual_seed(3))
    sgd = LocalSGD(lr=0.5, momentum=0.5, epochs=2, batch_size=3)
    layout = ParameterLayout.of(model)
    params = dict(model.named_parameters())

    def ce(logits, targets, mask, local_params, global_params):
        return masked_cross_entropy(logits, targets, mask)

    engine = VectorisedEngine(forward=forward)
    vec = layout.flatten_stacked(engine.train(model, layout, params, shards, order, sgd, ce))
    assert engine.forward_kind == ("vmap" if forward == "vmap" else "stacked"), engine.forward_reason
    seq = layout.flatten_stacked(SequentialEngine().train(model, layout, params, shards, order, sgd, ce))
    assert torch.allclose(vec, seq, atol=1e-5), (vec - seq).abs().max()
    assert not torch.allclose(vec, layout.flatten(params).expand_as(vec))


def test_cnn_femnist_has_a_stacked_forward():
    from fl_lightning.models.stacked import why_not_stacked

    assert why_not_stacked(timm.create_model("fl_cnn_femnist")) is None


def test_fedavg_fits_pydoc_chars_with_the_lstm():
    data = FederatedDataModule(source="pydoc_chars", num_clients=4, partition="natural", test_mode="local",
                               source_params={"max_samples_per_client": 20}, seed=0)
    module = FedAvg(backbone="fl_lstm_chars", backbone_kwargs={"hidden_size": 32},
                    num_classes=data.num_classes, input_shape=data.input_shape, num_rounds=2,
                    fraction=1.0, batch_size=10, lr=0.5, seed=0, engine="vectorised")
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(module, datamodule=data)
    assert module.round_engine.runner.engine_used == "vectorised"
    assert trainer.current_epoch == 2
    assert all(torch.isfinite(p).all() for p in module.model.parameters())


def test_shakespeare_through_the_data_module(shakespeare_dir):
    data = FederatedDataModule(source="shakespeare", data_dir=shakespeare_dir, num_clients=5,
                               partition="natural", test_mode="local", seed=2)
    data.setup("fit")
    again = FederatedDataModule(source="shakespeare", data_dir=shakespeare_dir, num_clients=5,
                                partition="natural", test_mode="local", seed=2)
    again.setup("fit")
    assert data.num_classes == 80 and data.input_shape == (80,)
    assert len(data.train_sizes) == 5 and torch.equal(data.train_x, again.train_x)
    source = load_source("shakespeare", shakespeare_dir, seed=2, num_clients=5)
    assert data.train_sizes.tolist() == source.client_of_train.bincount().tolist()
    assert data.test_sizes.tolist() == source.client_of_test.bincount().tolist()  # LEAF's own test files
