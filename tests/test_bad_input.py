"""Bad inputs and the errors they get: one table, one case per bad input.

Every case names the exception type and a regex on its message (or, for command-line
tools that print and exit, on stderr). The regexes ask for two things: that the message
says what was wrong (the bad value or the broken rule) and what to do about it (the valid
names, the valid range, the parameter to change, where to put the files ...).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch

import fl_lightning.data.datamodule as datamodule_module
from benchmarks import command_line, suites
from fl_lightning.algorithms import FedAvg
from fl_lightning.algorithms.qp import batched_min_norm_simplex, box_around, min_norm_simplex
from fl_lightning.cli import main as cli_main
from fl_lightning.cli.replay import main as replay_main
from fl_lightning.core.flat import ParameterLayout, layer_slices
from fl_lightning.core.gram import combine, conflict_counts, gram, layer_grams
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.data.partition import partition
from fl_lightning.metrics import (
    approximate_cgsv,
    exact_cgsv,
    fairness_summary,
    pearson,
    worst_fraction,
)
from fl_lightning.models import create_fl_model
from leaderboard.runs import LeaderboardError, load_runs

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

LABELS = np.arange(100) % 10  # 10 classes x 10 samples


@dataclass(frozen=True)
class Bad:
    """A bad input: ``call(tmp_path)`` must raise ``error`` whose message (or stderr,
    when ``stream="stderr"``) matches ``match``."""

    call: Callable[[Path], object]
    error: type[BaseException]
    match: str
    stream: str = "message"


def case(case_id: str, call, error, match, stream="message"):
    return pytest.param(Bad(call, error, match, stream), id=case_id)


# --------------------------------------------------------------------------- builders


def write_idx(path: Path, array: np.ndarray) -> None:
    """An IDX (ubyte) file as torchvision's MNIST reader expects."""
    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">I", 0x0800 + array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def mnist_files(root: Path, side: int = 28, num_labels: int = 10) -> str:
    """A tiny MNIST in torchvision's layout (images side x side, labels 0..num_labels-1)."""
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 60), ("t10k", 20)):
        write_idx(root / "MNIST" / "raw" / f"{prefix}-images-idx3-ubyte", rng.integers(0, 256, (n, side, side)))
        write_idx(root / "MNIST" / "raw" / f"{prefix}-labels-idx1-ubyte", np.arange(n) % num_labels)
    return str(root)


def corrupt_mnist(root: Path) -> str:
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                 "t10k-labels-idx1-ubyte"):
        (root / "MNIST" / "raw").mkdir(parents=True, exist_ok=True)
        (root / "MNIST" / "raw" / name).write_bytes(b"not an idx file")
    return str(root)


def corrupt_cifar10(root: Path) -> str:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta"):
        (folder / name).write_bytes(b"truncated")
    return str(root)


def setup_data(**kwargs) -> FederatedDataModule:
    data = FederatedDataModule(**({"partition": "iid", "test_mode": "local"} | kwargs))
    data.setup()
    return data


def fedavg(**kwargs) -> FedAvg:
    return FedAvg(**({"backbone": "fl_logreg", "num_classes": 10, "input_shape": (60,)} | kwargs))


def check_against_digits(**model_kwargs) -> None:
    """A model checked against the digits data module (1 x 8 x 8, 10 classes)."""
    module = FedAvg(**({"backbone": "fl_mlp", "num_classes": 10, "input_shape": (1, 8, 8)} | model_kwargs))
    module.attach_data(FederatedDataModule(source="digits", num_clients=5))
    module.on_validation_start()  # the same check as on_fit_start, before any round


def suite_file(root: Path, text: str) -> list:
    path = root / "suite.yaml"
    path.write_text(text)
    return suites.load_suite(str(path))


SUITE_HEAD = "suite: s\npaper: p\nscale: offline\nbase: {}\n"


def empty_store(root: Path) -> str:
    from mlflow import MlflowClient

    uri = f"sqlite:///{root / 'empty.db'}"
    MlflowClient(tracking_uri=uri).search_experiments()  # creates the store, with no runs
    return uri


def quiet(message: str) -> None:
    pass


NAN = float("nan")


# --------------------------------------------------------------------------- the table

CASES = [
    # ---- names: sources, partitions, models, algorithms, engines, layer groupings
    case("unknown-source", lambda tmp: FederatedDataModule(source="mnist2"),
         ValueError, r"unknown data source 'mnist2'; valid names: \[.*'mnist5k'"),
    case("unknown-partition", lambda tmp: FederatedDataModule(partition="dirichlett"),
         ValueError, r"unknown partition 'dirichlett'; valid names: \[.*'dirichlet'"),
    case("unknown-partitioner-function", lambda tmp: partition("nope", LABELS, 2),
         ValueError, r"unknown partitioner 'nope'; valid names: \[.*'shards'"),
    case("unknown-partition-parameter",
         lambda tmp: FederatedDataModule(partition="dirichlet", partition_params={"beta": 1}),
         ValueError, r"unknown parameter\(s\) \['beta'\]; it takes: alpha, min_size"),
    case("missing-partition-parameter", lambda tmp: FederatedDataModule(partition="pathological"),
         ValueError, r"needs parameter\(s\) \['classes_per_client'\].*Pass them in partition_params"),
    case("unknown-source-parameter",
         lambda tmp: FederatedDataModule(source="mnist5k", source_params={"split": "letters"}),
         ValueError, r"source 'mnist5k' got unknown parameter\(s\) \['split'\]; it takes: no parameters"),
    case("unknown-emnist-split", lambda tmp: FederatedDataModule(source="emnist", source_params={"split": "x"}),
         ValueError, r"unknown EMNIST split 'x'; valid splits: \[.*'letters'"),
    case("unknown-test-mode", lambda tmp: FederatedDataModule(test_mode="both"),
         ValueError, r"test_mode must be one of \['local', 'global', 'matched'\], got 'both'"),
    case("natural-partition-without-natural-clients", lambda tmp: FederatedDataModule(partition="natural"),
         ValueError, r"partition 'natural' needs a source with its own clients \(\[.*'synthetic'\]\).*"
                     r"Choose another partition"),
    case("unknown-backbone", lambda tmp: create_fl_model("fl_cnn", 10, (1, 28, 28)),
         ValueError, r"unknown fl-lightning model 'fl_cnn'; valid names: .*fl_cnn_mnist.*fl_mlp"),
    case("unknown-backbone-in-module", lambda tmp: fedavg(backbone="resnet18"),
         ValueError, r"unknown fl-lightning model 'resnet18'; valid names: .*fl_logreg"),
    case("unknown-engine", lambda tmp: fedavg(engine="gpu"),
         ValueError, r"unknown engine 'gpu'; valid: 'auto', 'vectorised', 'sequential'"),
    case("unknown-layer-grouping", lambda tmp: fedavg(layer_grouping="layer"),
         ValueError, r"unknown layer_grouping 'layer'; valid: 'tensor', 'module'"),
    case("unknown-layer-grouping-function",
         lambda tmp: layer_slices(torch.nn.Linear(2, 2), ParameterLayout.of(torch.nn.Linear(2, 2)), "block"),
         ValueError, r"unknown layer_grouping 'block'; valid: 'tensor', 'module'"),
    # ---- config values: partitions
    case("dirichlet-alpha-zero",
         lambda tmp: FederatedDataModule(partition="dirichlet", partition_params={"alpha": 0}),
         ValueError, r"dirichlet: alpha must be > 0 \(a finite number\), got 0; fix it in partition_params"),
    case("dirichlet-alpha-negative", lambda tmp: partition("dirichlet", LABELS, 5, alpha=-1.0),
         ValueError, r"alpha must be > 0.*got -1\.0.*e\.g\. \{'alpha': 0\.5\}"),
    case("dirichlet-alpha-nan", lambda tmp: partition("dirichlet", LABELS, 5, alpha=NAN),
         ValueError, r"alpha must be > 0 \(a finite number\), got nan"),
    case("dirichlet-alpha-string", lambda tmp: partition("dirichlet", LABELS, 5, alpha="0.5"),
         ValueError, r"alpha must be > 0 \(a finite number\), got '0\.5'"),
    case("dirichlet-infeasible-min-size", lambda tmp: partition("dirichlet", LABELS, 20, min_size=6),
         ValueError, r"cannot give 20 clients min_size=6 samples each from 100 samples; lower min_size or num_clients"),
    case("pat-k-above-num-classes", lambda tmp: partition("pathological", LABELS, 5, classes_per_client=11),
         ValueError, r"classes_per_client must be between 1 and the number of classes \(10\), got 11"),
    case("pat-k-not-an-integer", lambda tmp: partition("pathological", LABELS, 5, classes_per_client=2.5),
         ValueError, r"classes_per_client must be an integer >= 1, got 2\.5; fix it in partition_params"),
    case("pat-too-few-owners", lambda tmp: partition("pathological", LABELS, 3, classes_per_client=2),
         ValueError, r"num_clients \* classes_per_client = 6 is fewer than the 10 classes.*raise classes_per_client or num_clients"),
    case("shards-do-not-divide", lambda tmp: partition("shards", LABELS, 7, num_shards=20, shards_per_client=2),
         ValueError, r"num_shards \(20\) must equal num_clients \* shards_per_client \(7 \* 2 = 14\).*leave num_shards unset"),
    case("shards-more-than-samples", lambda tmp: partition("shards", LABELS, 50, shards_per_client=3),
         ValueError, r"num_shards \(150\) exceeds the number of samples \(100\); lower num_shards"),
    case("linspace-too-many-clients", lambda tmp: partition("linspace_classes", LABELS, 60),
         ValueError, r"cannot serve 60 clients from 100 samples.*Use fewer clients"),
    case("class-assignment-wrong-length", lambda tmp: partition("class_assignment", LABELS, 3, assignment=[[0], [1]]),
         ValueError, r"has 2 class lists but num_clients=3; give exactly one list of classes per client"),
    case("class-assignment-names-not-ids", lambda tmp: partition("class_assignment", LABELS, 2, assignment=[["cat"], [1]]),
         ValueError, r"class_assignment\[0\] = \['cat'\] must be a list of non-negative integer class ids"),
    case("partition-params-not-a-mapping",
         lambda tmp: FederatedDataModule(partition="dirichlet", partition_params="alpha: 0.1"),
         ValueError, r"partition_params must be a mapping.*got str 'alpha: 0\.1'.*--data\.partition_params '\{alpha: 0\.5\}'"),
    # ---- sizes: clients vs samples, empty clients (refused when partitioning)
    case("more-clients-than-samples", lambda tmp: setup_data(source="digits", num_clients=2000),
         ValueError, r"cannot build 2000 clients from 'digits' \(1797 samples\).*more than the 1797 samples.*use fewer clients"),
    case("partition-leaves-a-client-empty",
         lambda tmp: setup_data(source="digits", num_clients=20, partition="power_law", partition_params={"total_size": 30}),
         ValueError, r"partition='power_law'.*left client\(s\) \[0\] with no samples.*raise total_size.*fewer clients"),
    case("class-with-fewer-samples-than-owners",
         lambda tmp: partition("pathological", np.array([0] * 50 + [1]), 10, classes_per_client=1),
         ValueError, r"left client\(s\) \[.*\] with no samples; a class has fewer samples than owners; lower num_clients"),
    case("held-out-test-set-empties-natural-clients",
         lambda tmp: setup_data(source="synthetic", num_clients=5, partition="natural", test_mode="global",
                                global_test_fraction=0.999),
         ValueError, r"took every sample of 4 of its 5 natural clients.*lower global_test_fraction or use test_mode='local'"),
    case("natural-client-count-mismatch", lambda tmp: partition("natural", LABELS, 3, client_ids=np.arange(100) % 4),
         ValueError, r"num_clients=3 but the data has 4 natural clients; set num_clients=4"),
    case("num-clients-zero", lambda tmp: FederatedDataModule(num_clients=0),
         ValueError, r"num_clients must be a positive integer, got 0"),
    case("num-clients-not-an-integer", lambda tmp: partition("iid", LABELS, 2.5),
         ValueError, r"num_clients must be a positive integer, got 2\.5"),
    case("local-test-fraction-one", lambda tmp: FederatedDataModule(local_test_fraction=1.0),
         ValueError, r"local_test_fraction must be in \[0, 1\), got 1\.0"),
    # ---- config values: the federated module and local SGD
    case("fraction-zero", lambda tmp: fedavg(fraction=0.0),
         ValueError, r"fraction must be in \(0, 1\] \(1\.0 = full participation\), got 0\.0"),
    case("fraction-above-one", lambda tmp: fedavg(fraction=1.5),
         ValueError, r"fraction must be in \(0, 1\].*got 1\.5"),
    case("dropout-prob-one", lambda tmp: fedavg(dropout_prob=1.0),
         ValueError, r"dropout_prob must be in \[0, 1\), got 1\.0"),
    case("negative-lr", lambda tmp: fedavg(lr=-0.1),
         ValueError, r"lr must be > 0, got -0\.1"),
    case("momentum-one", lambda tmp: fedavg(momentum=1.0),
         ValueError, r"momentum must be in \[0, 1\), got 1\.0"),
    case("batch-size-zero", lambda tmp: fedavg(batch_size=0),
         ValueError, r"batch_size must be a positive integer or null \(full batch\), got 0"),
    case("local-epochs-zero", lambda tmp: fedavg(local_epochs=0),
         ValueError, r"local epochs must be >= 1, got 0"),
    case("server-lr-zero", lambda tmp: fedavg(server_lr=0.0),
         ValueError, r"server_lr must be > 0, got 0\.0"),
    case("num-classes-zero", lambda tmp: create_fl_model("fl_mlp", 0, (1, 28, 28)),
         ValueError, r"num_classes must be a positive integer \(the number of output logits.*got 0; it must match the data"),
    case("num-classes-not-an-integer", lambda tmp: create_fl_model("fl_mlp", 2.5, (1, 28, 28)),
         ValueError, r"num_classes must be a positive integer.*got 2\.5"),
    case("image-model-on-feature-vectors", lambda tmp: create_fl_model("fl_cnn_mnist", 10, (60,)),
         ValueError, r"fl_cnn_mnist is an image model and needs input_shape=\(C, H, W\), got \(60,\); use fl_logreg, fl_mlp or fl_ffn"),
    case("input-too-small-for-model", lambda tmp: create_fl_model("fl_cnn_cifar", 10, (3, 8, 8)),
         ValueError, r"needs H, W >= 16, got input_shape=\(3, 8, 8\)"),
    case("num-classes-model-vs-data", lambda tmp: check_against_digits(num_classes=3),
         ValueError, r"the model has 3 classes but the data has 10: set model\.num_classes to match"),
    case("input-shape-model-vs-data", lambda tmp: check_against_digits(input_shape=(1, 28, 28)),
         ValueError, r"the model expects inputs \(1, 28, 28\) but the data has \(1, 8, 8\): set model\.input_shape to match"),
    # ---- files
    case("mnist-files-missing", lambda tmp: setup_data(source="mnist", data_dir=str(tmp)),
         FileNotFoundError, r"MNIST not found: torchvision expects the files \[.*'train-images-idx3-ubyte'.*in the folder "
                            r"'.*MNIST/raw'.*Pass download=True \(CLI: --data\.download true\).*or copy the files there"),
    case("cifar10-files-missing", lambda tmp: setup_data(source="cifar10", data_dir=str(tmp)),
         FileNotFoundError, r"CIFAR10 not found.*'data_batch_1'.*'.*cifar-10-batches-py'.*download=True"),
    case("mnist-files-corrupted", lambda tmp: setup_data(source="mnist", data_dir=corrupt_mnist(tmp)),
         RuntimeError, r"MNIST files .* are present but torchvision rejected them \(AssertionError\); they may be "
                       r"corrupted or truncated.*Delete the files.*download=True"),
    case("cifar10-files-corrupted", lambda tmp: setup_data(source="cifar10", data_dir=corrupt_cifar10(tmp)),
         RuntimeError, r"CIFAR10 files .* rejected them.*md5.*Delete the files.*download=True"),
    case("mnist-files-of-another-image-size", lambda tmp: setup_data(source="mnist", data_dir=mnist_files(tmp, side=8)),
         ValueError, r"source 'mnist' loaded train inputs of shape \(1, 8, 8\), expected \(1, 28, 28\).*download again"),
    case("mnist-labels-out-of-range", lambda tmp: setup_data(source="mnist", data_dir=mnist_files(tmp, num_labels=20)),
         ValueError, r"source 'mnist' loaded train labels from 0 to 19, expected 0\.\.9.*corrupted or of another dataset"),
    # ---- dtypes and shapes of tensors
    case("float-labels", lambda tmp: partition("iid", LABELS.astype(float), 5),
         ValueError, r"labels must be integer class ids, got dtype float64; pass integer labels \(e\.g\. labels\.astype"),
    case("float-labels-torch", lambda tmp: partition("dirichlet", torch.arange(10.0), 2, min_size=1),
         ValueError, r"labels must be integer class ids, got dtype float32"),
    case("negative-labels", lambda tmp: partition("iid", np.array([0, -1, 2]), 2),
         ValueError, r"labels must be non-negative class ids, found -1"),
    case("two-dimensional-labels", lambda tmp: partition("iid", LABELS.reshape(10, 10), 2),
         ValueError, r"labels must be a non-empty 1-D array, got shape \(10, 10\)"),
    case("float-client-ids", lambda tmp: partition("natural", LABELS, 4, client_ids=np.arange(100) % 4 + 0.5),
         ValueError, r"client_ids must be integer client ids.*got dtype float64; convert them with client_ids\.astype"),
    case("qp-gram-not-square", lambda tmp: min_norm_simplex(torch.ones(2, 3)),
         ValueError, r"gram must be square \(n x n\), got shape \(2, 3\): pass the Gram matrix G = J Jᵀ of the vectors"),
    case("qp-batched-gram-not-square", lambda tmp: batched_min_norm_simplex(torch.ones(4, 2, 3)),
         ValueError, r"must be square \(n x n\), got shape \(4, 2, 3\): pass the Gram matrix G = J Jᵀ"),
    case("qp-gram-not-symmetric", lambda tmp: min_norm_simplex(torch.tensor([[1.0, 5.0], [0.0, 1.0]])),
         ValueError, r"gram is not symmetric \(max \|G - Gᵀ\| = 1 of max\|G\|\).*build it with core\.gram\.gram"),
    case("qp-gram-negative-diagonal", lambda tmp: min_norm_simplex(torch.tensor([[1.0, 0.0], [0.0, -1.0]])),
         ValueError, r"gram has a negative diagonal entry.*squared norms.*pass inner products of vectors"),
    case("qp-gram-nan", lambda tmp: min_norm_simplex(torch.tensor([[1.0, NAN], [NAN, 1.0]])),
         ValueError, r"gram has NaN or inf entries: drop the clients whose updates are not finite"),
    case("qp-nan-in-updates", lambda tmp: min_norm_simplex(gram(torch.tensor([[1.0, 2.0], [NAN, 1.0]]))),
         ValueError, r"NaN or inf entries: drop the clients whose updates are not finite before building the Gram"),
    case("qp-complex-gram", lambda tmp: min_norm_simplex(torch.eye(2, dtype=torch.complex64)),
         TypeError, r"gram must hold real numbers .*got dtype torch\.complex64"),
    case("qp-box-lower-bounds-too-large",
         lambda tmp: min_norm_simplex(torch.eye(3), lower=torch.full((3,), 0.5), upper=torch.ones(3)),
         ValueError, r"the lower bounds sum to 1\.5 > 1.*decrease the lower bounds"),
    case("qp-box-negative-epsilon", lambda tmp: box_around(torch.full((2,), 0.5), -0.1),
         ValueError, r"epsilon must be a finite number >= 0 \(the box half-width\), got -0\.1"),
    case("gram-of-one-update-vector", lambda tmp: gram(torch.ones(5)),
         ValueError, r"updates must be 2-D \(m clients x d parameters\), got shape \(5,\).*updates\[None\]"),
    case("gram-of-integer-updates", lambda tmp: gram(torch.ones(3, 4, dtype=torch.int64)),
         TypeError, r"updates must be floating point .*got dtype torch\.int64; convert with updates\.float\(\)"),
    case("combine-coefficients-mismatch", lambda tmp: combine(torch.ones(2), torch.ones(3, 4)),
         ValueError, r"coefficients must have one entry per row of updates \(3,\), got shape \(2,\)"),
    case("layer-slice-outside-updates", lambda tmp: layer_grams(torch.ones(3, 4), [slice(0, 2), slice(2, 10)]),
         ValueError, r"layer slice 1 = slice\(2, 10, None\) does not lie inside the 4 columns.*core\.flat\.layer_slices"),
    case("conflict-step-mismatch", lambda tmp: conflict_counts(torch.ones(3, 4), torch.ones(5)),
         ValueError, r"step must be a flat vector with one entry per column of updates \(4,\), got shape \(5,\)"),
    # ---- metrics
    case("fairness-summary-empty", lambda tmp: fairness_summary(torch.tensor([])),
         ValueError, r"values is empty: a fairness metric needs at least one client"),
    case("fairness-summary-nan", lambda tmp: fairness_summary(torch.tensor([0.5, NAN, 0.7])),
         ValueError, r"values is NaN for clients \[1\] \(of 3 clients\); evaluate or drop those clients"),
    case("fairness-summary-matrix", lambda tmp: fairness_summary(torch.ones(2, 3)),
         ValueError, r"values must be a 1-D tensor with one value per client, got shape \(2, 3\)"),
    case("fairness-summary-strings", lambda tmp: fairness_summary(["0.5", "0.7"]),
         TypeError, r"values must be numbers, one per client \(a 1-D tensor, array or list of floats\)"),
    case("worst-fraction-zero", lambda tmp: worst_fraction(torch.ones(4), 0.0),
         ValueError, r"fraction must be in \(0, 1\], got 0\.0"),
    case("pearson-length-mismatch", lambda tmp: pearson(torch.ones(3), torch.ones(4)),
         ValueError, r"x and y must have one value per client each, got 3 and 4"),
    case("cgsv-weights-mismatch", lambda tmp: exact_cgsv(torch.ones(3, 4), torch.ones(4)),
         ValueError, r"weights must have one entry per agent \(3\), got shape \(4,\)"),
    case("cgsv-updates-not-a-matrix", lambda tmp: approximate_cgsv(torch.ones(4)),
         ValueError, r"updates must be \(N, d\) with one row per agent, got shape \(4,\)"),
    case("cgsv-nan-updates", lambda tmp: approximate_cgsv(torch.tensor([[1.0, 2.0], [NAN, 1.0]])),
         ValueError, r"updates of agents \[1\] hold NaN or inf.*drop those agents"),
    case("cgsv-exact-too-many-agents", lambda tmp: exact_cgsv(torch.ones(11, 2)),
         ValueError, r"limited to N <= 10 agents, got N = 11: use sampled_cgsv .* or approximate_cgsv"),
    # ---- command line (errors are printed, then SystemExit)
    case("cli-unknown-algorithm", lambda tmp: cli_main(["fit", "--model", "FedAvgg"]),
         SystemExit, r"unknown algorithm 'FedAvgg'; valid: .*FedAvg, .*FedLF.*or the class path of a FederatedModule subclass",
         "stderr"),
    case("cli-wrong-typed-value", lambda tmp: cli_main(["fit", "--data.num_clients", "ten"]),
         SystemExit, r"error: data\.num_clients must be an int, got 'ten'", "stderr"),
    # values only the class can check: its own message, not jsonargparse's Union dump
    case("cli-unknown-engine", lambda tmp: cli_main(["fit", "--model.engine", "gpu", "--trainer.logger", "false"]),
         SystemExit, r"error: unknown engine 'gpu'; valid: 'auto', 'vectorised', 'sequential'\n?$", "stderr"),
    case("cli-unknown-source", lambda tmp: cli_main(["fit", "--data.source", "mnist2", "--trainer.logger", "false"]),
         SystemExit, r"error: unknown data source 'mnist2'; valid names: \[.*'mnist5k'.*\]", "stderr"),
    case("cli-unknown-attack", lambda tmp: cli_main(["fit", "--model.attack", "sybil", "--trainer.logger", "false"]),
         SystemExit, r"error: unknown attack 'sybil'; valid: null \(no attacker\), 'bias', 'scaling'", "stderr"),
    case("cli-bad-chunk", lambda tmp: cli_main(["fit", "--model.clients_per_chunk", "0", "--trainer.logger", "false"]),
         SystemExit, r"error: clients_per_chunk must be an integer >= 1, 'auto' or null", "stderr"),
    case("cli-mistyped-setting", lambda tmp: cli_main(["fit", "--model", "FedFV", "--model.alpah", "0.2", "--trainer.logger", "false"]),
         SystemExit, r"error: FedFV has no setting 'alpah'; did you mean 'alpha'\?", "stderr"),
    case("cli-abbreviated-setting",  # argparse took the start of a name as the name: a typo passed in silence
         lambda tmp: cli_main(["fit", "--data.num_client", "5", "--trainer.logger", "false"]),
         SystemExit, r"error: unknown setting 'data\.num_client'; did you mean 'data\.num_clients'\?", "stderr"),
    case("cli-unknown-choice-of-an-algorithm", lambda tmp: cli_main(["fit", "--model", "FedFV", "--model.order", "up", "--trainer.logger", "false"]),
         SystemExit, r"error: unknown order 'up'; valid: 'loss', 'random', 'reverse'\n?$", "stderr"),
    case("cli-old-threads-flag", lambda tmp: cli_main(["fit", "--threads", "two", "--trainer.logger", "false"]),
         SystemExit, r"error: --threads is now the run's own setting --model.threads N \(default auto: the cores the fit is given\)", "stderr"),
    case("cli-bad-threads", lambda tmp: cli_main(["fit", "--model.threads", "0", "--trainer.logger", "false"]),
         SystemExit, r"error: .*threads.*>= 1", "stderr"),
    case("cli-missing-config-file", lambda tmp: cli_main(["fit", "--config", str(tmp / "nope.yaml")]),
         SystemExit, r"error: --config .*nope\.yaml: no such file", "stderr"),
    # ---- leaderboard builder
    case("leaderboard-missing-sqlite-store", lambda tmp: load_runs(f"sqlite:///{tmp / 'nope.db'}", progress=quiet),
         LeaderboardError, r"no MLflow store at sqlite:///.*nope\.db: the file .* does not exist\. Pass the store .* --tracking-uri"),
    case("leaderboard-missing-file-store", lambda tmp: load_runs(f"file://{tmp / 'mlruns'}", progress=quiet),
         LeaderboardError, r"no MLflow store at file://.*mlruns: the folder .* does not exist\. Pass the store .* --tracking-uri"),
    case("leaderboard-store-without-runs",
         lambda tmp: load_runs(empty_store(tmp), experiments=["fedfv-offline"], progress=quiet),
         LeaderboardError, r"unknown experiment\(s\): fedfv-offline\. Experiments in the store: Default\. "
                           r"Pass one of those to --experiments, or leave --experiments out"),
    # ---- benchmark runner
    case("runner-unknown-suite", lambda tmp: suites.load_suite("fedfv/offlin"),
         SystemExit, r"unknown suite 'fedfv/offlin'; valid: .*fedfv/offline.*or a path to a suite YAML"),
    case("runner-suite-not-yaml", lambda tmp: suite_file(tmp, "suite: [a\nb: :"),
         SystemExit, r"suite .*suite\.yaml.* is not valid YAML: .*line"),
    case("runner-suite-not-a-mapping", lambda tmp: suite_file(tmp, "- fedfv\n- fedlf\n"),
         SystemExit, r"the file must hold a mapping \(suite:, paper:, scale:, base:, benchmarks:\), got list"),
    case("runner-suite-missing-benchmarks", lambda tmp: suite_file(tmp, SUITE_HEAD),
         SystemExit, r"it has no 'benchmarks' entry; see the format at the top of fl_lightning/records/suite_format\.py"),
    case("runner-algorithm-without-class-path",
         lambda tmp: suite_file(tmp, SUITE_HEAD + "benchmarks: [{name: b}]\nalgorithms: [{init_args: {mu: 0.1}}]\n"),
         SystemExit, r"algorithm entry 0 must be a mapping with a 'class_path' \(e\.g\. class_path: fl_lightning"),
    case("runner-grid-not-a-list",
         lambda tmp: suite_file(tmp, SUITE_HEAD + "benchmarks: [{name: b}]\nalgorithms: [{class_path: FedProx, grid: {mu: 0.1}}]\n"),
         SystemExit, r"FedProx: grid 'mu' must be a non-empty list of values \(e\.g\. mu: \[0\.1\]\), got 0\.1"),
    case("runner-misspelt-suite-key",  # was ignored in silence: every benchmark ran without these algorithms
         lambda tmp: suite_file(tmp, SUITE_HEAD + "benchmarks: [{name: b, algorithms: [{class_path: FedAvg}]}]\n"
                                                  "algoritms: [{class_path: FedProx}]\n"),
         SystemExit, r"unknown key 'algoritms' in the suite; did you mean 'algorithms'\?"),
    case("runner-misspelt-algorithm-key",  # was ignored: one configuration instead of the grid's two
         lambda tmp: suite_file(tmp, SUITE_HEAD + "benchmarks: [{name: b}]\n"
                                                  "algorithms: [{class_path: FedProx, grids: {mu: [0.1, 1.0]}}]\n"),
         SystemExit, r"unknown key 'grids' in algorithm entry FedProx; did you mean 'grid'\?"),
    case("runner-jobs-zero", lambda tmp: command_line.main(["run", "fedfv/offline", "--jobs", "0"]),
         SystemExit, r"--jobs must be >= 1", "stderr"),
    # ---- read-only commands (runner, leaderboard)
    # (that no store is created or altered, byte for byte: tests/leaderboard/test_leaderboard_build_command.py, tests/benchmarks/test_runner.py)
    case("leaderboard-empty-sqlite-file",  # touch() is None: `or` goes on to the build's reader
         lambda tmp: (tmp / "empty.db").touch() or load_runs(f"sqlite:///{tmp / 'empty.db'}", progress=quiet),
         LeaderboardError, r"the store sqlite:///.*empty\.db is an empty file .*: nothing was logged to it, and a "
                           r"build does not make it a store\. Pass the store the runs were logged to with --tracking-uri"),
    case("leaderboard-store-is-a-folder", lambda tmp: load_runs(f"sqlite:///{tmp}", progress=quiet),
         LeaderboardError, r"\(the store sqlite:///.*\) is a folder, not an MLflow SQLite store; pass the store the "
                           r"runs were logged to with --tracking-uri"),
    case("leaderboard-tracking-server-unreachable", lambda tmp: load_runs("http://127.0.0.1:9", progress=quiet),
         LeaderboardError, r"cannot reach the MLflow tracking server http://127\.0\.0\.1:9 \(.*\): start it .*"
                           r"or pass a local store with --tracking-uri sqlite:///mlruns\.db"),
    case("runner-dry-run-store-is-a-folder",
         lambda tmp: command_line.main(["run", "fedfv/offline", "--dry-run", "--tracking-uri", f"sqlite:///{tmp}"]),
         SystemExit, r"\(the store sqlite:///.*\) is a folder, not an MLflow SQLite store; pass another store "
                     r"with --tracking-uri"),
    case("runner-store-folder-missing",
         lambda tmp: command_line.main(["run", "fedfv/offline", "--dry-run", "--tracking-uri",
                                  f"sqlite:///{tmp / 'no' / 'runs.db'}"]),
         SystemExit, r"the folder of the MLflow store sqlite:///.*runs\.db does not exist \(.*no\): create it, or "
                     r"pass another store with --tracking-uri"),
    case("runner-tracking-server-unreachable",
         lambda tmp: command_line.main(["run", "fedfv/offline", "--dry-run", "--tracking-uri", "http://127.0.0.1:9"]),
         SystemExit, r"cannot reach the MLflow tracking server http://127\.0\.0\.1:9 \(.*\): start it .*"
                     r"or pass a local store with --tracking-uri"),
    case("runner-seeds-not-integers", lambda tmp: command_line.main(["run", "fedfv/offline", "--seeds", "one"]),
         SystemExit, r"^python -m benchmarks run: error: argument --seeds: invalid int value: 'one' "
                     r"\(see python -m benchmarks run --help\)\n$", "stderr"),
    case("replay-option-mistyped", lambda tmp: replay_main(["--sampel", "5"]),
         SystemExit, r"^fl-lightning replay: error: unrecognized arguments: --sampel; did you mean '--sample'\? "
                     r"\(see fl-lightning replay --help\)\n$", "stderr"),
    case("runner-option-mistyped", lambda tmp: command_line.main(["run", "fedfv/offline", "--jobz", "2"]),
         SystemExit, r"^python -m benchmarks run: error: unrecognized arguments: --jobz 2; did you mean '--jobs'\? "
                     r"\(see python -m benchmarks run --help\)\n$", "stderr"),
]


def test_the_table_is_large_enough():
    assert len(CASES) >= 35
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("bad", CASES)
def test_bad_input_gets_an_error_that_says_what_to_do(bad: Bad, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # nothing a failing call might write lands in the repository
    with pytest.raises(bad.error) as caught:
        bad.call(tmp_path)
    text = capsys.readouterr().err if bad.stream == "stderr" else str(caught.value)
    assert re.search(bad.match, text, re.S), f"{type(caught.value).__name__}: {text}"


# ------------------------------------------------- fl-lightning fit: refused before anything runs


def foreign_checkpoint(tmp: Path) -> str:
    torch.save({"weights": torch.ones(3)}, tmp / "foreign.ckpt")  # a torch archive, not ours
    return str(tmp / "foreign.ckpt")


def garbage_checkpoint(tmp: Path) -> str:
    (tmp / "garbage.ckpt").write_bytes(np.random.default_rng(0).bytes(4096))
    return str(tmp / "garbage.ckpt")


def typo_config(tmp: Path) -> str:
    (tmp / "typo.yaml").write_text("modle:\n  class_path: FedAvg\n")
    return str(tmp / "typo.yaml")


FIT_REFUSALS = [  # (id, extra arguments given tmp_path, the one line it must print)
    ("shards-more-than-samples", lambda tmp: ["--data.partition", "shards", "--data.partition_params",
                                              '{"num_shards": 100000, "shards_per_client": 1000}'],
     r"cannot build 100 clients from 'mnist5k' \(4000 samples\).*shards"),  # 1,000 held out: the matched test pool
    ("shards-not-clients-times-per-client", lambda tmp: ["--data.partition", "shards", "--data.partition_params",
                                                         '{"num_shards": 300, "shards_per_client": 2}'],
     r"num_shards \(300\) must equal num_clients \* shards_per_client"),
    ("more-clients-than-samples", lambda tmp: ["--data.num_clients", "100000"],
     r"num_clients=100000 is more than the 4000 samples to share; use fewer clients"),
    ("data-files-missing", lambda tmp: ["--data.source", "mnist", "--data.data_dir", str(tmp / "nothing")],
     r"MNIST not found: .*copy the files there"),
    ("checkpoint-missing", lambda tmp: ["--ckpt_path", str(tmp / "nope.ckpt")],
     r"--ckpt_path .*nope\.ckpt: no such file.*last\.ckpt is the latest"),
    ("checkpoint-random-bytes", lambda tmp: ["--ckpt_path", garbage_checkpoint(tmp)],
     r"--ckpt_path .*garbage\.ckpt is not a checkpoint \(not a torch archive"),
    ("checkpoint-foreign", lambda tmp: ["--ckpt_path", foreign_checkpoint(tmp)],
     r"--ckpt_path .*foreign\.ckpt is not an fl-lightning checkpoint \(it has no state_dict"),
    ("tracking-server-unreachable", lambda tmp: ["--trainer.logger.init_args.tracking_uri", "http://127.0.0.1:9/"],
     r"cannot reach the MLflow tracking server http://127\.0\.0\.1:9/ .*sqlite:///mlruns\.db"),
    ("sqlite-store-folder-missing", lambda tmp: ["--trainer.logger.init_args.tracking_uri",
                                                 f"sqlite:///{tmp / 'no' / 'such' / 'runs.db'}"],
     r"the folder of the MLflow store .* does not exist"),
    ("seed-negative", lambda tmp: ["--seed_everything", "-1"],
     r"seed_everything must be an integer in \[0, 2\*\*32\), got -1"),
    ("accelerator-gpu-without-one", lambda tmp: ["--trainer.accelerator", "gpu"],
     r"--trainer.accelerator gpu asks for a GPU, but this machine has none"),
    ("config-key-misspelt", lambda tmp: ["--config", typo_config(tmp)],
     r"unknown setting 'modle\.class_path'; did you mean 'model'\?"),
    ("lr-nan", lambda tmp: ["--model.lr", "nan"], r"lr must be a finite number, got nan"),
    ("lr-negative", lambda tmp: ["--model.lr=-1"], r"lr must be > 0, got -1"),
]


@pytest.mark.parametrize(("extra", "match"), [pytest.param(extra, match, id=case_id)
                                              for case_id, extra, match in FIT_REFUSALS])
def test_fit_refuses_bad_input_in_one_line_before_any_run_or_checkpoint(extra, match, tmp_path, monkeypatch, capsys):
    if "accelerator" in str(extra(tmp_path)) and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.chdir(tmp_path)
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    args = ["fit", "--trainer.logger.init_args.tracking_uri", store, "--model.num_rounds", "1", *extra(tmp_path)]
    with pytest.raises(SystemExit) as caught:
        cli_main(args)
    err = capsys.readouterr().err
    assert caught.value.code == 2
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.search(match, errors[0]), err
    assert not (tmp_path / "checkpoints").exists()  # no checkpoint folder
    if (tmp_path / "runs.db").exists():  # the store may exist (its tables), never a run
        from mlflow import MlflowClient

        assert MlflowClient(store).search_runs([e.experiment_id for e in MlflowClient(store).search_experiments()]) == []


# --------------------------------------------------------------------------- no state is lost


def test_a_failed_setup_leaves_nothing_half_built_and_a_retry_succeeds(tmp_path, monkeypatch):
    """Setup fails at its very last step: no client tensor may be left behind (a half-built
    module would make the next setup() return early with test tensors missing)."""
    data = FederatedDataModule(source="digits", num_clients=5, partition="iid", test_mode="local")
    original = datamodule_module.client_class_counts
    calls = []

    def fails_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError("simulated failure at the end of setup")
        return original(*args, **kwargs)

    monkeypatch.setattr(datamodule_module, "client_class_counts", fails_once)
    with pytest.raises(MemoryError):
        data.setup()
    assert all(getattr(data, name) is None for name in datamodule_module._TENSOR_NAMES)
    with pytest.raises(RuntimeError, match="call datamodule.setup"):
        data.class_counts  # noqa: B018  (the property raises)
    data.setup()  # the retry builds everything
    assert data.train_x is not None and data.test_x is not None and data.class_counts.shape == (5, 10)
    assert int(data.train_sizes.sum() + data.test_sizes.sum()) == 1797


def test_missing_files_then_copied_in_a_retry_of_the_same_module_works(tmp_path):
    """The user's fix for the missing-files error (copy them there) works without rebuilding
    the data module: the failed setup kept no state."""
    data = FederatedDataModule(source="mnist", num_clients=4, partition="iid", test_mode="local", data_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="copy the files there"):
        data.setup()
    assert data.train_x is None
    mnist_files(tmp_path)
    data.setup()
    assert data.train_x.shape[1:] == (1, 28, 28) and int(data.train_sizes.sum() + data.test_sizes.sum()) == 80


def test_a_rejected_partition_parameter_leaves_the_datamodule_unbuilt():
    """An infeasible partition is refused at setup, before any client tensor exists."""
    data = FederatedDataModule(source="digits", num_clients=100, partition="pathological",
                               partition_params={"classes_per_client": 20})
    with pytest.raises(ValueError, match="classes_per_client must be between 1 and the number of classes"):
        data.setup()
    assert all(getattr(data, name) is None for name in datamodule_module._TENSOR_NAMES)
