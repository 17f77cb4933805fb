"""Noisy clients (CGSV Fig. 2): exact fractions, determinism, clean tests, clear errors, identity."""

import pytest
import torch

from fl_lightning.callbacks.run_identity import dataset_name, task
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.data.noise import apply_client_noise, corrupt_labels, noisy_label_positions

NOISE = {0: 0.2, 1: 0.4, 2: 0.6}


def clients(seed=1, **noise):
    datamodule = FederatedDataModule(source="mnist5k", num_clients=5, partition="iid",
                                     partition_params={"total_size": 3000}, test_mode="local", seed=seed, **noise)
    datamodule.setup()
    return datamodule


def per_client(datamodule, tensor):
    offsets = (torch.cumsum(datamodule.train_sizes, 0) - datamodule.train_sizes).tolist()
    return [tensor[o:o + int(n)] for o, n in zip(offsets, datamodule.train_sizes)]


def test_each_noisy_client_has_exactly_its_fraction_of_wrong_labels_and_the_rest_is_clean():
    noisy, clean = clients(label_noise=NOISE), clients()
    wrong = [int((a != b).sum()) for a, b in zip(per_client(noisy, noisy.train_y), per_client(clean, clean.train_y))]
    sizes = noisy.train_sizes.tolist()
    assert wrong == [round(0.2 * sizes[0]), round(0.4 * sizes[1]), round(0.6 * sizes[2]), 0, 0]
    assert torch.equal(noisy.train_x, clean.train_x)  # labels only
    assert torch.equal(noisy.test_y, clean.test_y) and torch.equal(noisy.test_x, clean.test_x)


def test_label_noise_is_deterministic_in_the_seed_and_the_client():
    labels = torch.arange(100) % 10
    first = corrupt_labels(labels, 0.3, 10, seed=5, client=2)
    assert torch.equal(first, corrupt_labels(labels, 0.3, 10, seed=5, client=2))
    assert not torch.equal(first, corrupt_labels(labels, 0.3, 10, seed=6, client=2))
    assert not torch.equal(first, corrupt_labels(labels, 0.3, 10, seed=5, client=3))
    assert torch.equal(clients(label_noise=NOISE).train_y, clients(label_noise=NOISE).train_y)
    assert not torch.equal(clients(label_noise=NOISE).train_y, clients(seed=2, label_noise=NOISE).train_y)


def test_a_corrupted_label_is_always_another_class_and_every_other_class_is_drawn():
    labels = torch.zeros(3000, dtype=torch.long)
    out = corrupt_labels(labels, 1.0, 10, seed=0, client=0)
    assert (out != 0).all() and set(out.tolist()) == set(range(1, 10))
    assert len(noisy_label_positions(7, 0.5, 0, 0)) == 4  # round(3.5) = 4 (numpy rounds half to even: 4)


def test_feature_noise_changes_only_the_listed_clients_inputs():
    x, y = torch.zeros(6, 3), torch.zeros(6, dtype=torch.long)
    noisy_x, noisy_y = apply_client_noise(x, y, torch.tensor([2, 4]), 10, 0, {}, {1: 0.5})
    assert torch.equal(noisy_x[:2], x[:2]) and (noisy_x[2:] != 0).all() and torch.equal(noisy_y, y)
    assert 0.2 < float(noisy_x[2:].std()) < 0.9


@pytest.mark.parametrize("noise, message", [
    ({"label_noise": {5: 0.1}}, r"label_noise: client 5 does not exist \(num_clients=5: ids 0..4\)"),
    ({"label_noise": {0: 1.2}}, r"label_noise\[0\] must be in \[0, 1\], got 1.2"),
    ({"feature_noise": {0: -1.0}}, r"feature_noise\[0\] must be >= 0"),
    ({"label_noise": [0.2]}, r"label_noise must map client ids to values"),
])
def test_a_wrong_noise_setting_is_refused_when_the_data_module_is_built(noise, message):
    with pytest.raises(ValueError, match=message):
        FederatedDataModule(source="mnist5k", num_clients=5, **noise)


def test_noisy_clients_are_another_task_and_named_in_the_dataset():
    noisy, clean = clients(label_noise=NOISE), clients()
    module = type("M", (), {"hparams": {"backbone": "fl_mlp"}})()
    assert task(module, noisy) != task(module, clean)
    assert task(module, noisy)["label_noise"] == {"0": 0.2, "1": 0.4, "2": 0.6}
    assert dataset_name(noisy).endswith("/5 clients/label_noise(0=0.2,1=0.4,2=0.6)")
    assert noisy.hparams["label_noise"] == NOISE  # saved: logged to MLflow with the data's params


@pytest.mark.integration
def test_noise_set_on_the_command_line_reaches_mlflow_and_cgsv_logs_each_agent(tmp_path, monkeypatch):
    import json

    import mlflow

    from fl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    main(["fit", f"--trainer.logger.init_args.tracking_uri={uri}", "--model=CGSV", "--model.fraction=1.0",
          "--model.num_rounds=2", "--model.eval_every=2", "--data.num_clients=5", "--data.partition=iid",
          "--data.label_noise={0: 0.2, 1: 0.4, 2: 0.6}", "--data.feature_noise={4: 0.1}"])
    run = mlflow.search_runs(experiment_names=["fl-lightning"]).iloc[0]
    assert run["status"] == "FINISHED"
    params = {k[len("params."):]: v for k, v in run.items() if k.startswith("params.") and v is not None}
    logged = {k: v for k, v in params.items() if "noise" in k}
    assert logged, params.keys()
    text = " ".join(f"{k}={v}" for k, v in logged.items())
    assert "0.6" in text and "0.1" in text
    task = json.loads(run["tags.task"])
    assert task["label_noise"] == {"0": 0.2, "1": 0.4, "2": 0.6} and task["feature_noise"] == {"4": 0.1}
    for series in ("cgsv_r", "cgsv_psi", "cgsv_density", "cgsv_distance"):
        assert all(f"metrics.{series}/{agent}" in run for agent in range(5)), series
