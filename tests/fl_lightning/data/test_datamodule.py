"""FederatedDataModule: clients' tensors, test modes, reports, round-marker loaders, errors."""

import struct
from collections import Counter

import numpy as np
import pytest
import torch

import fl_lightning.data.datamodule as datamodule_module
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.data.reports import BAR_CLIENTS_MAX, partition_figure, partition_table
from fl_lightning.data.sources import load_source

_LOADED = {}


def offline_source(name: str):
    """mnist5k / digits, loaded once per test session (mnist5k takes a second)."""
    if name not in _LOADED:
        _LOADED[name] = load_source(name)
    return _LOADED[name]


@pytest.fixture(autouse=True)
def cached_sources(monkeypatch):
    """Let the data module reuse the session's mnist5k / digits."""

    def load(name, data_dir="data", download=False, seed=0, **params):
        if name in ("mnist5k", "digits"):
            return offline_source(name)
        return load_source(name, data_dir, download, seed, **params)

    monkeypatch.setattr(datamodule_module, "load_source", load)


def write_idx(path, array: np.ndarray) -> None:
    """IDX (ubyte) file as torchvision's MNIST reads it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">I", 0x0800 + array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


@pytest.fixture
def mnist_dir(tmp_path):
    """A tiny MNIST (300 train, 60 official test images) in torchvision's layout."""
    rng = np.random.default_rng(0)
    for prefix, n in [("train", 300), ("t10k", 60)]:
        write_idx(
            tmp_path / "MNIST" / "raw" / f"{prefix}-images-idx3-ubyte",
            rng.integers(0, 256, (n, 28, 28)),
        )
        write_idx(tmp_path / "MNIST" / "raw" / f"{prefix}-labels-idx1-ubyte", np.arange(n) % 10)
    return str(tmp_path)


def build(**kwargs) -> FederatedDataModule:
    data = FederatedDataModule(**({"partition": "iid", "test_mode": "local"} | kwargs))
    data.setup()
    return data


def row_multiset(*tensors) -> Counter:
    """Each sample's bytes, counted: equal multisets = the same samples, each as often."""
    counter = Counter()
    for tensor in tensors:
        if tensor is not None:
            counter.update(row.numpy().tobytes() for row in tensor)
    return counter


def client_samples(x, index, sizes, k):
    return x[index[k, : sizes[k]]]


CONFIGS = [
    dict(partition="dirichlet", partition_params={"alpha": 0.5}, num_clients=20),
    dict(partition="shards", partition_params={"shards_per_client": 2}, num_clients=50),
    dict(partition="pathological", partition_params={"classes_per_client": 2}, num_clients=30),
    dict(partition="iid", num_clients=7),
]


# --------------------------------------------------------------------------- coverage and tensors


@pytest.mark.parametrize("test_mode", ["local", "global"])
@pytest.mark.parametrize("config", CONFIGS, ids=[c["partition"] for c in CONFIGS])
def test_every_sample_lands_exactly_once(config, test_mode):
    data = build(source="mnist5k", test_mode=test_mode, **config)
    source = offline_source("mnist5k")
    everything = row_multiset(data.train_x, data.test_x, data.global_test_x)
    assert everything == row_multiset(source.x_train)
    assert (
        data.train_x.shape[0]
        + data.test_x.shape[0]
        + (0 if data.global_test_x is None else data.global_test_x.shape[0])
        == 5000
    )


@pytest.mark.parametrize("config", CONFIGS, ids=[c["partition"] for c in CONFIGS])
def test_index_rows_point_at_each_clients_samples(config):
    data = build(source="mnist5k", **config)
    num_clients = config["num_clients"]
    for split in ("train", "test"):
        x, y = getattr(data, f"{split}_x"), getattr(data, f"{split}_y")
        index, sizes = getattr(data, f"{split}_index"), getattr(data, f"{split}_sizes")
        assert index.shape == (num_clients, max(1, int(sizes.max()))) and index.dtype == torch.int64
        assert sizes.dtype == torch.int64 and int(sizes.sum()) == x.shape[0] == y.shape[0]
        offsets = torch.cumsum(sizes, 0) - sizes
        for k in range(num_clients):
            n = int(sizes[k])
            assert torch.equal(index[k, :n], offsets[k] + torch.arange(n))  # contiguous
            assert (index[k, n:] == 0).all()  # padding
    counts = np.stack(
        [
            np.bincount(
                data.train_y[data.train_index[k, : data.train_sizes[k]]].numpy(), minlength=10
            )
            for k in range(num_clients)
        ]
    )
    np.testing.assert_array_equal(counts, data.class_counts)
    assert data.class_counts.shape == (num_clients, 10)
    assert data.train_x.dtype == torch.float32 and data.train_y.dtype == torch.int64
    assert data.train_x.shape[1:] == data.input_shape == (1, 28, 28)


def test_pathological_clients_hold_two_classes_in_train_plus_test():
    data = build(
        source="mnist5k",
        partition="pathological",
        partition_params={"classes_per_client": 2},
        num_clients=30,
    )
    for k in range(30):
        labels = torch.cat(
            [
                client_samples(data.train_y, data.train_index, data.train_sizes, k),
                client_samples(data.test_y, data.test_index, data.test_sizes, k),
            ]
        )
        assert len(labels.unique()) == 2


def test_local_mode_keeps_the_local_test_fraction():
    data = build(
        source="mnist5k", partition="iid", num_clients=10, local_test_fraction=1 / 6
    )  # FedLF: 1/6
    assert data.test_sizes.tolist() == [83] * 10 and data.train_sizes.tolist() == [417] * 10
    assert data.global_test_x is None and data.global_test_y is None


def test_global_mode_without_official_split_holds_out_a_fraction():
    data = build(
        source="mnist5k",
        partition="iid",
        num_clients=10,
        test_mode="global",
        global_test_fraction=0.3,
    )
    assert data.global_test_x.shape == (1500, 1, 28, 28) and data.global_test_y.shape == (1500,)
    assert data.test_sizes.tolist() == [0] * 10 and data.test_index.shape == (10, 1)
    assert (data.test_index == 0).all() and data.test_x.shape == (0, 1, 28, 28)
    assert int(data.train_sizes.sum()) == 3500


# --------------------------------------------------------------------------- official test splits


def test_local_mode_merges_official_splits(mnist_dir):
    data = build(source="mnist", data_dir=mnist_dir, partition="iid", num_clients=6)
    assert int(data.train_sizes.sum() + data.test_sizes.sum()) == 360 and data.global_test_x is None


def test_local_mode_without_merging_keeps_the_official_test_shared(mnist_dir):
    data = build(
        source="mnist",
        data_dir=mnist_dir,
        partition="iid",
        num_clients=6,
        merge_official_splits=False,
    )
    source = load_source("mnist", data_dir=mnist_dir)
    assert int(data.train_sizes.sum() + data.test_sizes.sum()) == 300
    assert row_multiset(data.train_x, data.test_x) == row_multiset(source.x_train)
    assert torch.equal(data.global_test_x, source.x_test) and torch.equal(
        data.global_test_y, source.y_test
    )


def test_global_mode_uses_the_official_test_split(mnist_dir):
    data = build(
        source="mnist", data_dir=mnist_dir, partition="shards", num_clients=10, test_mode="global"
    )
    source = load_source("mnist", data_dir=mnist_dir)
    assert torch.equal(data.global_test_y, source.y_test) and int(data.train_sizes.sum()) == 300
    assert data.test_sizes.tolist() == [0] * 10


# --------------------------------------------------------------------------- natural clients


def test_synthetic_natural_clients():
    data = build(source="synthetic", partition="natural", num_clients=8, seed=3)
    source = load_source("synthetic", seed=3, num_clients=8)
    natural_sizes = torch.bincount(source.client_of_train)
    assert torch.equal(data.train_sizes + data.test_sizes, natural_sizes)
    assert data.input_shape == (60,) and data.num_classes == 10
    for k in range(8):  # client k's samples are natural client k's
        mine = client_samples(data.train_x, data.train_index, data.train_sizes, k)
        assert row_multiset(mine) <= row_multiset(source.x_train[source.client_of_train == k])


def test_synthetic_source_num_clients_must_agree():
    with pytest.raises(ValueError, match="disagrees with num_clients=8"):
        FederatedDataModule(
            source="synthetic", partition="natural", num_clients=8, source_params={"num_clients": 9}
        )


# --------------------------------------------------------------------------- lifecycle


def test_info_is_known_before_setup():
    data = FederatedDataModule(source="digits", num_clients=5)
    assert data.num_classes == 10 and data.input_shape == (1, 8, 8) and data.train_x is None
    assert data.hparams.source == "digits" and data.hparams.num_clients == 5
    with pytest.raises(RuntimeError, match="call datamodule.setup"):
        _ = data.class_counts


def test_setup_is_idempotent_and_seeded():
    data = build(
        source="digits",
        partition="dirichlet",
        partition_params={"alpha": 0.3},
        num_clients=5,
        seed=1,
    )
    first = data.train_x
    data.setup("fit")
    assert data.train_x is first
    same = build(
        source="digits",
        partition="dirichlet",
        partition_params={"alpha": 0.3},
        num_clients=5,
        seed=1,
    )
    other = build(
        source="digits",
        partition="dirichlet",
        partition_params={"alpha": 0.3},
        num_clients=5,
        seed=2,
    )
    assert torch.equal(same.train_y, data.train_y) and torch.equal(
        same.train_sizes, data.train_sizes
    )
    assert not torch.equal(other.train_sizes, data.train_sizes)


def test_to_moves_every_tensor_and_returns_self():
    data = build(source="digits", num_clients=4, test_mode="global")
    assert data.to("meta") is data
    for name in (
        "train_x",
        "train_y",
        "train_index",
        "train_sizes",
        "test_x",
        "test_y",
        "test_index",
        "test_sizes",
        "global_test_x",
        "global_test_y",
    ):
        assert getattr(data, name).device.type == "meta", name


@pytest.mark.parametrize("download", [False, True])
def test_prepare_data_downloads_only_when_asked(monkeypatch, download):
    fetched = []
    monkeypatch.setattr(
        datamodule_module, "download_source", lambda *args, **kwargs: fetched.append(args)
    )
    FederatedDataModule(source="mnist", data_dir="somewhere", download=download).prepare_data()
    assert fetched == ([("mnist", "somewhere")] if download else [])


@pytest.mark.parametrize("loader", ["train_dataloader", "val_dataloader", "test_dataloader"])
def test_each_loader_yields_one_round_marker(loader):
    data = FederatedDataModule(source="digits", num_clients=4)
    batches = list(getattr(data, loader)())
    assert len(batches) == 1 and batches[0].shape == (1, 1)


# --------------------------------------------------------------------------- reports


def test_partition_table_small_and_large():
    small = build(
        source="digits",
        partition="pathological",
        partition_params={"classes_per_client": 4},
        num_clients=3,
    )
    table = partition_table(small)
    lines = table.splitlines()
    assert "partition=pathological" in lines[0] and "n_train" in lines[2] and "c9" in lines[2]
    for k in range(3):
        row = lines[3 + k].split()
        assert int(row[0]) == k and int(row[1]) == int(small.train_sizes[k])
        assert [int(v) for v in row[3:]] == small.class_counts[k].tolist()
    large = partition_table(build(source="mnist5k", partition="iid", num_clients=100))
    assert (
        "... 85 more clients ..." in large
        and "n_train: min=40" in large
        and len(large.splitlines()) < 30
    )


def test_partition_table_with_many_classes_lists_the_top_ones(tmp_path):
    raw = tmp_path / "EMNIST" / "raw"  # a tiny EMNIST "balanced" split: 47 classes
    for part, n in [("train", 470), ("test", 94)]:
        images = np.random.default_rng(0).integers(0, 256, (n, 28, 28))
        write_idx(raw / f"emnist-balanced-{part}-images-idx3-ubyte", images)
        write_idx(raw / f"emnist-balanced-{part}-labels-idx1-ubyte", np.arange(n) % 47)
    data = build(
        source="emnist",
        data_dir=str(tmp_path),
        partition="pathological",
        partition_params={"classes_per_client": 3},
        num_clients=16,
    )
    lines = partition_table(data).splitlines()
    assert "top classes (count)" in lines[2] and "c46" not in lines[2]
    assert all(int(row.split()[3]) == 3 for row in lines[3:])  # 3 classes held per client
    assert len(partition_figure(data).axes[0].containers) == 47


@pytest.mark.parametrize("num_clients", [3, 100])
def test_partition_figure_has_one_stacked_bar_per_client(num_clients):
    """Up to BAR_CLIENTS_MAX clients, a bar series per class; beyond, one filled step outline
    per class, its steps standing on the classes below. Either way the drawn heights are the
    clients' class counts."""
    data = build(source="mnist5k", partition="iid", num_clients=num_clients)
    figure = partition_figure(data)
    axes = figure.axes[0]
    if num_clients <= BAR_CLIENTS_MAX:
        assert len(axes.containers) == 10  # one colour (bar series) per class
        heights = np.array([[bar.get_height() for bar in series] for series in axes.containers]).T
    else:
        steps = [patch.get_data() for patch in axes.patches]
        assert len(steps) == 10  # one colour (step outline) per class
        heights = np.array([values - baseline for values, _, baseline in steps]).T
        np.testing.assert_array_equal(steps[0].baseline, 0)
        for below, above in zip(steps, steps[1:]):
            np.testing.assert_array_equal(above.baseline, below.values)  # stacked
    np.testing.assert_array_equal(heights, data.class_counts)  # (clients, classes)
    assert axes.get_legend() is not None
    figure.canvas.draw()  # renders with Agg


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(source="imagenet"), "unknown data source 'imagenet'; valid names: .*mnist5k"),
        (dict(partition="random"), "unknown partition 'random'; valid names: .*dirichlet"),
        (dict(num_clients=0), "num_clients must be a positive integer"),
        (dict(test_mode="both"), r"test_mode must be one of \['local', 'global', 'matched'\]"),
        (dict(local_test_fraction=1.0), r"local_test_fraction must be in \[0, 1\)"),
        (dict(global_test_fraction=0.0), r"global_test_fraction must be in \(0, 1\)"),
        (
            dict(partition="natural"),
            "partition 'natural' needs a source with its own clients.*synthetic",
        ),
        (dict(partition="pathological"), "needs parameter.*'classes_per_client'"),
        (dict(partition="iid", partition_params={"alpha": 1}), "unknown parameter.*'alpha'"),
        (dict(source="emnist", source_params={"split": "nope"}), "unknown EMNIST split"),
    ],
)
def test_bad_arguments_fail_in_init(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FederatedDataModule(**kwargs)


def test_a_partition_that_leaves_a_client_empty_fails_at_setup():
    data = FederatedDataModule(
        source="digits",
        partition="power_law",
        num_clients=200,
        partition_params={"total_size": 300},
        test_mode="local",
    )
    with pytest.raises(ValueError, match="with partition='power_law'.*no samples.*total_size"):
        data.setup()


def test_infeasible_dirichlet_names_what_to_change():
    data = FederatedDataModule(
        source="digits",
        partition="dirichlet",
        num_clients=100,
        partition_params={"alpha": 0.01, "max_tries": 3},
        test_mode="local",
    )
    with pytest.raises(ValueError, match="min_size.*alpha.*num_clients"):
        data.setup()
