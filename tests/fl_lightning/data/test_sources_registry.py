"""The data side's registries: a source of one's own through ``register_source``, each input
checked once (with the valid names and a suggestion), the typed choices the command line
lists, and the reports on a split taken out of the data module."""

import typing

import numpy as np
import pytest
import torch

import fl_lightning.data.datamodule as datamodule_module
from fl_lightning.cli import main as cli_main
from fl_lightning.data import partition_registry, source_registry
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.data.partition import partition
from fl_lightning.data.reports import partition_figure, partition_table
from fl_lightning.data.sources import (
    SourceData,
    SourceInfo,
    list_sources,
    load_source,
    register_source,
    source_info,
)

BLOBS = SourceInfo("blobs", 3, (2,), has_official_test=False, natural_clients=False)


def load_blobs(data_dir: str, download: bool, seed: int, spread: float = 1.0) -> SourceData:
    """Three Gaussian blobs of 100 points each (what a user's own dataset module would hold)."""
    generator = torch.Generator().manual_seed(seed)
    y = torch.arange(300) % 3
    x = y[:, None] + spread * torch.randn(300, 2, generator=generator)
    return SourceData(x, y, None, None, BLOBS)


@pytest.fixture
def blobs(monkeypatch):
    """``blobs`` registered from this module, in a copy of the registry that the test drops."""
    monkeypatch.setattr(source_registry, "_SOURCES", dict(source_registry._SOURCES))
    assert register_source("blobs", info=BLOBS)(load_blobs) is load_blobs
    return "blobs"


# --------------------------------------------------------------------------- register_source


def test_a_source_registered_from_another_module_builds_clients(blobs):
    assert blobs in list_sources() and source_info(blobs) == BLOBS
    data = FederatedDataModule(source=blobs, num_clients=4, partition="dirichlet",
                               partition_params={"alpha": 1.0, "min_size": 5}, test_mode="local",
                               source_params={"spread": 0.5}, seed=0)
    assert data.num_classes == 3 and data.input_shape == (2,)
    data.setup()
    assert int(data.train_sizes.sum() + data.test_sizes.sum()) == 300
    loaded = load_source(blobs, seed=0, spread=0.5)
    assert sorted(data.train_x[:, 0].tolist() + data.test_x[:, 0].tolist()) == sorted(
        loaded.x_train[:, 0].tolist()
    )  # the clients hold the points of the loader, with the source parameter passed on
    assert "source=blobs partition=dirichlet" in partition_table(data)


def test_a_registered_source_gets_its_parameters_checked_by_the_registry(blobs):
    with pytest.raises(ValueError, match=r"source 'blobs' got unknown parameter\(s\) \['sprad'\]; "
                                         r"it takes: spread=1\.0; remove them from source_params; did you mean 'spread'\?"):
        FederatedDataModule(source=blobs, source_params={"sprad": 0.5})


def test_register_source_refuses_a_taken_name_and_a_loader_of_another_shape(blobs):
    with pytest.raises(ValueError, match="data source 'mnist' is already registered"):
        register_source("mnist", info=BLOBS)(load_blobs)
    register_source(blobs, info=BLOBS)(load_blobs)  # the same loader again (a re-import): fine

    def no_seed(data_dir, download):
        raise AssertionError("never called")

    def no_default(data_dir, download, seed, spread):
        raise AssertionError("never called")

    with pytest.raises(TypeError, match="each with a default"):
        register_source("other", info=BLOBS)(no_default)
    with pytest.raises(TypeError, match=r"load\(data_dir, download, seed, <source parameters, each with a default>\)"):
        register_source("other", info=BLOBS)(no_seed)


# --------------------------------------------------------------------------- one check, good messages


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(source="mnist_5k"), r"unknown data source 'mnist_5k'; valid names: \[.*\]; did you mean 'mnist5k'"),
        (dict(partition="dirichlett"), r"unknown partition 'dirichlett'; valid names: \[.*\]; did you mean 'dirichlet'\?"),
        (dict(source="emnist", source_params={"split": "leters"}), r"unknown EMNIST split 'leters'; valid splits: \[.*\]; did you mean 'letters'\?"),
        (dict(partition="dirichlet", partition_params={"alpah": 0.1}),
         r"partition 'dirichlet' got unknown parameter\(s\) \['alpah'\]; it takes: alpha, min_size, max_tries "
         r"\(defaults: alpha=0\.5, min_size=10, max_tries=100\); remove them from partition_params; did you mean 'alpha'\?"),
        (dict(source="synthetic", partition="natural", num_clients=30, partition_params={"client_ids": [0]}),
         r"partition_params must not contain \['client_ids'\]: the partition 'natural' takes them from the data source"),
        (dict(source="synthetic", partition="natural", num_clients=30, source_params={"alpha": -1.0}),
         r"synthetic alpha and beta must be >= 0"),  # a source's values: checked before any data is made
    ],
)
def test_a_bad_name_or_parameter_is_refused_with_the_valid_ones_and_a_suggestion(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FederatedDataModule(**kwargs)


def test_partition_parameters_are_checked_once_per_call(monkeypatch):
    calls = []
    original = partition_registry.check_partition_values
    monkeypatch.setattr(partition_registry, "check_partition_values",
                        lambda *args: calls.append(args) or original(*args))
    partition("dirichlet", np.arange(100) % 10, 5, alpha=0.5)
    assert len(calls) == 1
    calls.clear()
    monkeypatch.setattr(datamodule_module, "check_partition_params", partition_registry.check_partition_params)
    FederatedDataModule(source="digits", num_clients=5, partition="dirichlet", partition_params={"alpha": 0.5})
    assert len(calls) == 1  # in the data module's constructor: the registry, once


def test_a_source_is_described_once_per_load(monkeypatch):
    calls = []
    entry = source_registry._SOURCES["synthetic"]
    monkeypatch.setitem(source_registry._SOURCES, "synthetic", source_registry._Source(
        lambda **params: calls.append(params) or entry.describe(**params), entry.load, entry.defaults))
    load_source("synthetic", num_clients=3)
    assert len(calls) == 1 and calls[0]["num_clients"] == 3


# --------------------------------------------------------------------------- typed choices


@pytest.mark.filterwarnings("ignore::UserWarning")  # LightningCLI: args given beside pytest's argv
def test_test_mode_is_a_literal_the_command_line_lists_and_checks(capsys):
    hints = typing.get_type_hints(FederatedDataModule.__init__)
    assert typing.get_args(hints["test_mode"]) == ("local", "global", "matched")
    assert hints["source"] is str and hints["partition"] is str  # registry names: open sets
    with pytest.raises(SystemExit):
        cli_main(["fit", "--help"])
    help_text = capsys.readouterr().out
    block = help_text[help_text.index("--data.test_mode"):][:400]
    assert all(mode in block for mode in ("local", "global", "matched")), block
    with pytest.raises(SystemExit):
        cli_main(["fit", "--data.test_mode", "both", "--trainer.logger", "false"])
    error = capsys.readouterr().err
    assert "test_mode" in error and "both" in error and "matched" in error, error


# --------------------------------------------------------------------------- reports


def test_reports_need_the_clients_built_first():
    data = FederatedDataModule(source="digits", num_clients=5)
    for report in (partition_table, partition_figure):
        with pytest.raises(RuntimeError, match="call datamodule.setup"):
            report(data)
