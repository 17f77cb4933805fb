"""FederatedDataModule: every client's train/test data as tensors on one device.

After ``setup()`` the module holds, for K clients:

* ``train_x`` (N_train, *input_shape) float32 and ``train_y`` (N_train,) int64, with each
  client's samples stored contiguously;
* ``train_index`` (K, max_n_train) int64: row k lists client k's positions in ``train_x``,
  padded with 0 after ``train_sizes[k]``; ``train_sizes`` (K,) int64;
* the same four for the clients' local test sets (``test_*``);
* ``global_test_x`` / ``global_test_y``: the shared test set, or ``None``.

A Lightning epoch is one communication round and the federated module works on these
tensors directly, so each dataloader yields a single placeholder item per epoch.
Reports on the split (a text table, a figure) are in :mod:`fl_lightning.data.reports`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast, get_args

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities.parsing import AttributeDict
from torch.utils.data import DataLoader, Dataset

from fl_lightning import private_api
from fl_lightning.data.client_tensors import _digest_of_split, _matched_test_tensors, _pack_clients
from fl_lightning.data.noise import apply_client_noise, check_noise
from fl_lightning.data.partition import class_counts as client_class_counts
from fl_lightning.data.partition import split_train_test
from fl_lightning.data.partition_registry import (
    check_num_clients,
    check_partition_params,
    check_test_fraction,
    resolved_partition_params,
)
from fl_lightning.data.partition_registry import partition as make_partition
from fl_lightning.data.source_registry import (
    SourceData,
    SourceInfo,
    download_source,
    list_sources,
    load_source,
    source_info,
)
from fl_lightning.records.vocabulary import (
    DEFAULT_DATA_DIR,
    DEFAULT_LOCAL_TEST_FRACTION,
    DEFAULT_NUM_CLIENTS,
    DEFAULT_PARTITION,
    DEFAULT_SOURCE,
    DEFAULT_TEST_MODE,
    LOCAL_TEST_FRACTION,
)
from fl_lightning.seeding import run_seed

TestMode = Literal["local", "global", "matched"]
TEST_MODES: tuple[str, ...] = get_args(TestMode)
_TENSOR_NAMES = (
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
    "test_class_weights",
    "global_test_class_index",
    "global_test_class_sizes",
)


class _RoundMarker(Dataset):
    """One placeholder item: a dataloader over it marks one round (one epoch)."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.zeros(1)


@dataclass
class _Pool:
    """The samples handed to the partitioner, and the held-out shared test set."""

    x: torch.Tensor
    y: torch.Tensor
    client_ids: torch.Tensor | None
    global_x: torch.Tensor | None
    global_y: torch.Tensor | None
    client_test_x: torch.Tensor | None = None  # each client's own test samples, drawn by the source
    client_test_y: torch.Tensor | None = None
    client_test_ids: np.ndarray | None = None

    def with_test_appended(self) -> _Pool:
        """The pool with the clients' own test samples after the training samples."""
        assert self.client_test_x is not None and self.client_test_y is not None, "no client test samples"
        return _Pool(torch.cat([self.x, self.client_test_x]), torch.cat([self.y, self.client_test_y]),
                     self.client_ids, self.global_x, self.global_y)


class FederatedDataModule(LightningDataModule):
    """Clients built from a data source and a partitioner.

    Args:
        source: a data source's name: ``mnist``, ``fashion_mnist``, ``cifar10``,
            ``cifar100``, ``emnist``, ``mnist5k``, ``digits``, ``synthetic`` or one added with
            :func:`fl_lightning.data.source_registry.register_source` (all: ``list_sources()``).
        num_clients: K, the number of clients.
        partition: a partitioner's name: ``dirichlet`` (the default, as the CLI's: Dir(0.5)
            label skew), ``iid``, ``pathological``, ``shards``, ``power_law``,
            ``linspace_classes``, ``class_assignment``, ``natural`` (keeps the source's own
            clients, ``synthetic``) or one added with
            :func:`fl_lightning.data.partition_registry.register_partitioner`.
        partition_params: the partitioner's parameters, e.g. ``{"alpha": 0.1}``; the ones left
            out take the partitioner's defaults (Dirichlet: ``alpha`` 0.5, ``min_size`` 10).
        test_mode: ``"matched"`` (the default, as the CLI's): the shared test set of
            ``"global"``, and each client's accuracy is the expectation over its own training
            label distribution of the class-wise accuracy on it, sum_c p_k(c) acc(c): the
            accuracy on a test set drawn to match the client's labels, not quantised by a few
            local test samples (for partitions that skew labels, not features; a ``natural``
            partition needs ``"local"``); ``"local"``: every client keeps
            ``local_test_fraction`` of its samples as its own test set; ``"global"``: one
            shared test set (the official test split, else a held-out
            ``global_test_fraction`` of the pool).
        local_test_fraction: share of each client's samples used as its local test set.
        merge_official_splits: in local mode, pool the official train and test splits
            before partitioning (as FedLF does); otherwise the official test split becomes
            the shared ``global_test_*``.
        global_test_fraction: share of the pool held out as the shared test set in global
            mode when the source has no official test split.
        source_params: the source's parameters, e.g. ``{"split": "letters"}`` for EMNIST.
        data_dir: where torchvision sources live.
        download: whether to download them.
        seed: seeds the source (synthetic), the partition and the train/test splits;
            ``None`` (the default) takes the run's seed (``seed_everything``), else 0.
            Logged as the hyper-parameter ``data_seed``.
        label_noise: {client id: fraction}: that fraction of the client's training labels is
            replaced by another class, e.g. ``{0: 0.2, 1: 0.4, 2: 0.6}`` (CGSV, Xu et al.
            NeurIPS 2021, Fig. 2); see :mod:`fl_lightning.data.noise`.
        feature_noise: {client id: std}: Gaussian noise added to the client's training inputs.
    """

    # The clients' tensors (see the module docstring): None until setup() has built them.
    train_x: torch.Tensor | None
    train_y: torch.Tensor | None
    train_index: torch.Tensor | None
    train_sizes: torch.Tensor | None
    test_x: torch.Tensor | None
    test_y: torch.Tensor | None
    test_index: torch.Tensor | None
    test_sizes: torch.Tensor | None
    global_test_x: torch.Tensor | None
    global_test_y: torch.Tensor | None
    test_class_weights: torch.Tensor | None
    global_test_class_index: torch.Tensor | None
    global_test_class_sizes: torch.Tensor | None

    def __init__(
        self,
        source: str = DEFAULT_SOURCE,
        num_clients: int = DEFAULT_NUM_CLIENTS,
        partition: str = DEFAULT_PARTITION,
        partition_params: dict | None = None,
        test_mode: TestMode = DEFAULT_TEST_MODE,
        local_test_fraction: float = DEFAULT_LOCAL_TEST_FRACTION,
        merge_official_splits: bool = True,
        global_test_fraction: float = 0.2,
        source_params: dict | None = None,
        data_dir: str = DEFAULT_DATA_DIR,
        download: bool = False,
        seed: int | None = None,
        label_noise: dict[int, float] | None = None,
        feature_noise: dict[int, float] | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["seed"])
        self.label_noise = check_noise("label_noise", label_noise, num_clients, upper=1.0)
        self.feature_noise = check_noise("feature_noise", feature_noise, num_clients, upper=None)
        self.seed = run_seed(seed, "data.seed")
        params = _as_params("partition_params", partition_params, "{alpha: 0.5}")
        self.source_params, info = self._checked_source(source, num_clients, source_params)
        self._check_arguments(
            info, num_clients, partition, params, test_mode, local_test_fraction,
            global_test_fraction,
        )
        self.partition_params = resolved_partition_params(partition, params)
        self._record_resolved_hparams(partition_params=dict(self.partition_params), data_seed=self.seed)
        self.source_info = info
        self.num_clients = num_clients
        self.num_classes = info.num_classes
        self.input_shape = tuple(info.input_shape)
        for name in _TENSOR_NAMES:
            setattr(self, name, None)
        self._class_counts: np.ndarray | None = None

    @property
    def hparams(self) -> AttributeDict:
        """The saved settings (Lightning's), typed as the ``AttributeDict`` they are."""
        return cast(AttributeDict, super().hparams)

    def _record_resolved_hparams(self, **values) -> None:
        """Log what the run really used (defaults filled in), not what was typed."""
        private_api.record_hparams(self, values)

    # ------------------------------------------------------------------ validation
    # Each input is checked once, where it is owned: source names and parameters by the
    # source registry, partition names and parameters by the partition registry, num_clients
    # and the local test fraction by the partition module's checks; here only what combines
    # them. test_mode is a Literal: the command line refuses other values before this runs.

    @staticmethod
    def _checked_source(source: str, num_clients: int, source_params) -> tuple[dict, SourceInfo]:
        """The source's parameters (num_clients passed on to a source with natural clients)
        and its info; the registry checks the name and the parameters."""
        params = _as_params("source_params", source_params, "{split: letters}")
        info = source_info(source, **params)
        if info.natural_clients:
            given = params.setdefault("num_clients", num_clients)
            if given != num_clients:
                raise ValueError(
                    f"source_params['num_clients']={given} disagrees with num_clients="
                    f"{num_clients}; drop it from source_params (num_clients is passed on)."
                )
            info = source_info(source, **params)  # the source checks the count it is given
        return params, info

    def _check_arguments(
        self, info, num_clients, partition, params, test_mode, local_fraction, global_fraction
    ):
        check_num_clients(num_clients)
        natural = partition == "natural"  # the data module passes the source's client ids on
        check_partition_params(
            partition, params, supplied=("client_ids",) if natural else (), setting="partition"
        )
        if natural and not info.natural_clients:
            sources = [s for s in list_sources() if source_info(s).natural_clients]
            raise ValueError(
                f"partition 'natural' needs a source with its own clients ({sources}); "
                f"{info.name!r} has none. Choose another partition, e.g. 'dirichlet'."
            )
        if test_mode not in TEST_MODES:  # for Python callers; the CLI checks the Literal
            raise ValueError(f"test_mode must be one of {list(TEST_MODES)}, got {test_mode!r}.")
        check_test_fraction(local_fraction, LOCAL_TEST_FRACTION)
        if not 0 < global_fraction < 1:
            raise ValueError(f"global_test_fraction must be in (0, 1), got {global_fraction}.")
        if test_mode == "matched" and partition == "natural":
            raise ValueError(
                "partition='natural' needs test_mode='local' (test_mode='matched', the default, weights a "
                "shared test pool by each client's labels, but natural clients differ in their inputs too); "
                "synthetic: source_params {test_per_client: 100} draws each client's own test set."
            )
        if self.source_params.get("test_per_client") and (partition != "natural" or test_mode != "local"):
            raise ValueError(
                f"source_params test_per_client={self.source_params['test_per_client']} draws each natural "
                f"client's own test set: it needs partition='natural' and test_mode='local', got "
                f"partition={partition!r}, test_mode={test_mode!r}."
            )

    # ------------------------------------------------------------------ setup

    def prepare_data(self) -> None:
        """Download the source's files if asked (Lightning calls this on one process)."""
        if self.hparams.download:
            download_source(self.hparams.source, self.hparams.data_dir, **self.source_params)

    def setup(self, stage: str | None = None) -> None:
        """Load the source and build the clients (only once).

        All-or-nothing: everything is built in local variables and assigned at the end, so
        a setup that fails (missing files, an infeasible partition) leaves the module as it
        was and a later ``setup()`` starts again from scratch."""
        if self.train_x is not None:
            return
        hp = self.hparams
        data = load_source(hp.source, hp.data_dir, hp.download, self.seed, **self.source_params)
        _check_loaded(data, self.source_info)
        pool = self._make_pool(data)
        clients = self._partition(pool)
        if pool.client_test_ids is not None:  # the source drew each client's own test set
            train_lists = clients
            assert pool.client_ids is not None, "a source's own client test sets come with its natural clients"
            ids = np.unique(pool.client_ids.numpy())  # client k is the k-th natural id (``natural``)
            test_lists = [np.flatnonzero(pool.client_test_ids == ids[k]) + len(pool.y)
                          for k in range(len(clients))]
            pool = pool.with_test_appended()
        elif hp.test_mode == "local":
            train_lists, test_lists = split_train_test(
                clients, hp.local_test_fraction, _derived_seed(self.seed, "local_test_split")
            )
        else:
            train_lists, test_lists = clients, [np.empty(0, np.int64)] * len(clients)
        train_x, train_y, train_index, train_sizes = _pack_clients(pool.x, pool.y, train_lists)
        train_x, train_y = apply_client_noise(train_x, train_y, train_sizes, self.num_classes,
                                              _derived_seed(self.seed, "client_noise"),
                                              self.label_noise, self.feature_noise)
        built = dict(zip(_TENSOR_NAMES[:4], (train_x, train_y, train_index, train_sizes)))
        built |= dict(zip(_TENSOR_NAMES[4:8], _pack_clients(pool.x, pool.y, test_lists)))
        built |= {"global_test_x": pool.global_x, "global_test_y": pool.global_y}
        class_counts = client_class_counts(pool.y.numpy(), train_lists, self.num_classes)
        built |= _matched_test_tensors(hp.test_mode, class_counts, pool.global_y, self.num_classes)
        self._class_counts = class_counts
        for name in _TENSOR_NAMES:  # train_x last: it marks the setup as done
            if name != "train_x":
                setattr(self, name, built[name])
        self.train_x = built["train_x"]
        self._split_digest = _digest_of_split(train_lists, test_lists, pool.global_y)

    def _make_pool(self, data: SourceData) -> _Pool:
        """What the partitioner splits, and what is held out as the shared test set."""
        hp = self.hparams
        if data.client_of_test is not None and hp.test_mode == "local" and hp.partition == "natural":
            return _Pool(data.x_train, data.y_train, data.client_of_train, None, None,
                         data.x_client_test, data.y_client_test, data.client_of_test.numpy())
        if data.x_test is not None and data.y_test is not None:
            if hp.test_mode == "local" and hp.merge_official_splits:  # as FedLF: pool both
                x = torch.cat([data.x_train, data.x_test])
                y = torch.cat([data.y_train, data.y_test])
                return _Pool(x, y, None, None, None)
            return _Pool(data.x_train, data.y_train, data.client_of_train, data.x_test, data.y_test)
        if hp.test_mode == "local":
            return _Pool(data.x_train, data.y_train, data.client_of_train, None, None)
        return self._hold_out_global_test(data)

    def _hold_out_global_test(self, data: SourceData) -> _Pool:
        """Without an official test split: a random ``global_test_fraction`` of the
        training split becomes the shared test set, taken before partitioning."""
        rng = np.random.default_rng(_derived_seed(self.seed, "global_test_holdout"))
        order = torch.as_tensor(rng.permutation(len(data.y_train)))
        num_held_out = int(round(self.hparams.global_test_fraction * len(order)))
        held, kept = order[:num_held_out], order[num_held_out:]
        client_ids = None if data.client_of_train is None else data.client_of_train[kept]
        x, y = data.x_train, data.y_train
        return _Pool(x[kept], y[kept], client_ids, x[held], y[held])

    def _partition(self, pool: _Pool) -> list[np.ndarray]:
        hp = self.hparams
        params = dict(self.partition_params)
        if hp.partition == "natural":
            if pool.client_ids is None:
                raise ValueError(
                    f"source {hp.source!r} gave no natural client ids for partition 'natural'."
                )
            params["client_ids"] = pool.client_ids.numpy()
            present = len(np.unique(params["client_ids"]))
            if hp.test_mode != "local" and present < hp.num_clients:
                raise ValueError(
                    f"the shared test set held out {hp.global_test_fraction:g} of {hp.source!r} "
                    f"and took every sample of {hp.num_clients - present} of its "
                    f"{hp.num_clients} natural clients, leaving them no training data; lower "
                    "global_test_fraction or use test_mode='local'."
                )
        try:
            return make_partition(hp.partition, pool.y.numpy(), hp.num_clients, self.seed, **params)
        except ValueError as error:
            raise ValueError(
                f"cannot build {hp.num_clients} clients from {hp.source!r} ({len(pool.y)} samples) "
                f"with partition={hp.partition!r}, partition_params={self.partition_params}: {error}"
            ) from error

    # ------------------------------------------------------------------ what the run used

    def split_digest(self) -> str:
        """A digest of which samples went to which client (train and test) and of the shared
        test set: two runs with the same digest trained and tested on the same split."""
        self._require_setup()
        return self._split_digest

    def client_test_description(self) -> str:
        """How each client's test accuracy is measured and on how many samples, in words."""
        self._require_setup()
        mode = self.hparams.test_mode
        if mode == "matched":
            assert self.global_test_class_sizes is not None
            sizes = self.global_test_class_sizes.cpu().numpy()
            return (f"matched: {int(sizes.sum()):,}-sample shared pool ({int(sizes.min())}-{int(sizes.max())} "
                    "per class), each client's accuracy weighted by its own label distribution")
        if mode == "global":
            assert self.global_test_y is not None
            return f"global: one shared test set of {len(self.global_test_y):,} samples"
        assert self.test_sizes is not None
        sizes = self.test_sizes.cpu().numpy()
        if sizes.min() == sizes.max():
            return f"local: {int(sizes.min())} samples per client"
        return (f"local: {int(sizes.min())}-{int(sizes.max())} samples per client "
                f"(median {np.median(sizes):g})")

    # ------------------------------------------------------------------ tensors

    def to(self, device: torch.device | str) -> FederatedDataModule:
        """Move every client tensor to ``device``; returns self."""
        for name in _TENSOR_NAMES:
            tensor = getattr(self, name)
            if tensor is not None:
                setattr(self, name, tensor.to(device))
        return self

    @property
    def class_counts(self) -> np.ndarray:
        """(K, C) training-set class counts per client."""
        self._require_setup()
        assert self._class_counts is not None
        return self._class_counts

    def _require_setup(self) -> None:
        if self.train_x is None:
            raise RuntimeError("the clients are built in setup(): call datamodule.setup() first.")

    # ------------------------------------------------------------------ loaders (round markers)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(_RoundMarker(), batch_size=1)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(_RoundMarker(), batch_size=1)

    def test_dataloader(self) -> DataLoader:
        return DataLoader(_RoundMarker(), batch_size=1)


# --------------------------------------------------------------------------- helpers


def _as_params(name: str, params, example: str) -> dict:
    """A copy of a ``*_params`` argument, which must be a mapping (or None for none)."""
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise ValueError(
            f"{name} must be a mapping of parameter names to values, e.g. {example}, got "
            f"{type(params).__name__} {params!r} (on the command line, quote a YAML/JSON "
            f"mapping: --data.{name} '{example}')."
        )
    return dict(params)


def _check_loaded(data: SourceData, info) -> None:
    """The loaded tensors agree with what the source promised (shape, dtypes, classes)."""
    for split, x, y in (("train", data.x_train, data.y_train), ("test", data.x_test, data.y_test)):
        if x is None or y is None:
            continue
        problem = None
        if tuple(x.shape[1:]) != tuple(info.input_shape):
            problem = f"inputs of shape {tuple(x.shape[1:])}, expected {tuple(info.input_shape)}"
        elif not x.is_floating_point():
            problem = f"inputs of dtype {x.dtype}, expected floating point"
        elif y.dtype != torch.int64 or y.shape != x.shape[:1]:
            problem = f"labels of dtype {y.dtype} and shape {tuple(y.shape)}, expected int64 ({len(x)},)"
        elif len(y) and not 0 <= int(y.min()) <= int(y.max()) < info.num_classes:
            problem = (
                f"labels from {int(y.min())} to {int(y.max())}, expected 0..{info.num_classes - 1}"
            )
        if problem is not None:
            raise ValueError(
                f"source {info.name!r} loaded {split} {problem}; its files may be corrupted or of "
                "another dataset: delete them and download again (download=True)."
            )


def _derived_seed(seed: int, purpose: str) -> int:
    """An independent seed for one use of the run seed (e.g. the local test split)."""
    entropy = [seed, *purpose.encode()]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])
