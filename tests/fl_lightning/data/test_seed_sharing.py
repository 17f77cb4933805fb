"""Configurations of one seed share its partition and initialisation: cells of a suite built as
the benchmark runner builds them (``load_suite``, ``seed_everything: <seed>``, the CLI in a reused
worker process) give every algorithm configuration of a seed the same clients (samples, train /
test split) and the same initial model; another seed gives another partition and initialisation."""

import sys

import pytest
import torch
import yaml
from lightning.pytorch import Trainer

from benchmarks.launchers import _fit_in_this_process
from benchmarks.suites import load_suite
from fl_lightning.algorithms import ALGORITHMS
from fl_lightning.seeding import SEED_ENV

SUITE = {
    "suite": "seed-sharing", "paper": "test", "scale": "offline", "seeds": [0, 1],
    "base": {
        "trainer": {"enable_checkpointing": False, "logger": False},
        "model": {"init_args": {"backbone": "fl_logreg", "num_rounds": 1, "fraction": 0.5, "batch_size": 16}},
        "data": {"source": "digits", "num_clients": 4, "partition": "dirichlet", "partition_params": {"alpha": 0.5},
                 "test_mode": "local", "local_test_fraction": 0.2},
    },
    "benchmarks": [{"name": "digits/dirichlet-0.5/p0.5/fl_logreg"}],
    "algorithms": [
        {"class_path": "fl_lightning.algorithms.FedAvg"},
        {"class_path": "fl_lightning.algorithms.QFedAvg", "grid": {"q": [1.0]}},
        {"class_path": "fl_lightning.algorithms.FedFV", "init_args": {"alpha": 0.1, "tau": 0}},
    ],
}
DATA = ("train_x", "train_y", "train_sizes", "test_x", "test_y", "test_sizes")  # clients' samples, packed


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """{(algorithm configuration, seed): (initial global model, data tensors, split digest)}, each
    cell through the runner's in-process fit (``trainer.fit`` stopped before the first round),
    one after the other in this process as in a reused worker, the global generators disturbed
    between cells."""
    folder = tmp_path_factory.mktemp("seed_sharing")
    suite_file = folder / "suite.yaml"
    suite_file.write_text(yaml.safe_dump(SUITE))
    found = {}

    def stop_before_training(trainer, model, datamodule=None, **kwargs):
        found["model"] = model.round_engine.global_vector().detach().clone()
        found["data"] = {name: getattr(datamodule, name).clone() for name in DATA}
        found["digest"] = datamodule.split_digest()

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(Trainer, "fit", stop_before_training)
    monkeypatch.chdir(folder)
    monkeypatch.delenv(SEED_ENV, raising=False)
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # as a worker hides the runner's command line
    results = {}
    try:
        for number, cell in enumerate(load_suite(str(suite_file))):
            assert cell.config["seed_everything"] == cell.seed  # the runner's seed: model and data take it
            config_file = folder / f"cell{number}.yaml"
            config_file.write_text(yaml.safe_dump(cell.config, sort_keys=False))
            log = folder / f"cell{number}.log"
            found.clear()
            torch.rand(1000)  # what an earlier cell of a reused worker may leave in the global generator
            code = _fit_in_this_process(str(config_file), str(log))
            assert code == 0 and "model" in found, log.read_text()[-3000:]
            results[cell.algorithm_config, cell.seed] = (found["model"], found["data"], found["digest"])
    finally:
        monkeypatch.undo()
    return results


CONFIGS = ("FedAvg", "QFedAvg(q=1.0)", "FedFV")


def test_the_suite_expands_to_three_configurations_at_two_seeds(built):
    assert sorted(built) == sorted((config, seed) for config in CONFIGS for seed in (0, 1))


@pytest.mark.parametrize("seed", [0, 1])
def test_every_configuration_of_a_seed_gets_the_same_clients_and_initial_model(built, seed):
    model, data, digest = built["FedAvg", seed]
    assert data["train_sizes"].numel() == 4 and int(data["test_sizes"].sum()) > 0  # local test sets
    for config in CONFIGS[1:]:
        other_model, other_data, other_digest = built[config, seed]
        assert other_digest == digest  # which samples each client trains and tests on
        for name in DATA:
            assert torch.equal(other_data[name], data[name]), (config, name)
        assert torch.equal(other_model, model), config


def test_another_seed_gets_other_clients_and_another_initial_model(built):
    model_0, data_0, digest_0 = built["FedAvg", 0]
    model_1, data_1, digest_1 = built["FedAvg", 1]
    assert digest_0 != digest_1
    assert not torch.equal(data_0["train_sizes"], data_1["train_sizes"])  # Dirichlet sizes differ
    assert not torch.equal(data_0["train_y"], data_1["train_y"])
    assert not torch.equal(model_0, model_1)


def test_every_registered_algorithm_starts_from_the_seeds_model(monkeypatch):
    """Any algorithm built with the run's seed (``seed_everything`` sets it in the environment;
    the module's ``seed`` left at None, as the CLI leaves it) starts from the same parameters."""
    monkeypatch.setenv(SEED_ENV, "3")
    full = {"AFL", "CGSV", "Standalone", "DW", "RR", "EU", "CFFL", "ECI"}  # every agent, every round
    initial = {}
    for name, cls in sorted(ALGORITHMS.items()):
        torch.rand(100)  # the global generator's state must not matter
        module = cls(backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8),
                     fraction=1.0 if name in full else 0.5)
        initial[name] = module.round_engine.global_vector().detach()
        assert module.hparams.seed == 3, name
    reference = initial["FedAvg"]
    assert len(initial) == len(ALGORITHMS) > 20
    assert {name for name, params in initial.items() if not torch.equal(params, reference)} == set()
    monkeypatch.setenv(SEED_ENV, "4")
    assert not torch.equal(ALGORITHMS["FedAvg"](backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8))
                           .round_engine.global_vector(), reference)
