"""test_mode='matched': a client's accuracy is its model's class-wise accuracy on a shared
pool weighted by the client's own training labels; synthetic clients' own test sets."""

import numpy as np
import pytest
import torch

from fl_lightning.algorithms import Ditto, FedAvg
from fl_lightning.core.evaluation import evaluate_clients
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.data.partition import resolved_partition_params


@pytest.fixture(scope="module")
def matched_data():
    data = FederatedDataModule(source="digits", num_clients=8, partition="pathological",
                               partition_params={"classes_per_client": 2}, test_mode="matched", seed=3)
    data.setup()
    return data


def module_for(cls, data, **kwargs):
    module = cls(backbone="fl_logreg", num_classes=10, input_shape=data.input_shape, num_rounds=1,
                 fraction=1.0, seed=1, **kwargs)
    module.attach_data(data)
    return module


def test_matched_accuracy_is_the_label_weighted_class_accuracy(matched_data):
    data = matched_data
    metrics = module_for(FedAvg, data).evaluate_all_clients()
    module = module_for(FedAvg, data)
    module.evaluate_all_clients()
    accuracies = torch.tensor(module.last_client_metrics["test_accuracy"])
    with torch.no_grad():
        correct = (module.model(data.global_test_x).argmax(1) == data.global_test_y).float()
    counts = data.class_counts
    for k in range(data.num_clients):  # by hand: sum_c p_k(c) * accuracy on the pool's class c
        expected = sum(counts[k, c] / counts[k].sum() * float(correct[data.global_test_y == c].mean())
                       for c in range(10) if counts[k, c])
        assert accuracies[k] == pytest.approx(expected, abs=1e-6)
    assert metrics["test_acc_mean"] == pytest.approx(float(accuracies.mean()), abs=1e-6)
    assert float(accuracies.std()) > 0  # clients with other labels see other accuracies
    held = [int((data.global_test_class_sizes * (counts[k] > 0)).sum()) for k in range(8)]
    assert module.last_client_metrics["num_test"] == held


def test_per_client_models_agree_with_the_shared_path(matched_data):
    """Ditto's personal models, all equal to the global model, give the shared model's values."""
    data = matched_data
    shared = module_for(FedAvg, data)
    shared.evaluate_all_clients()
    personal = module_for(Ditto, data)
    personal.setup("fit")
    personal.personal_models.copy_(shared.round_engine.global_vector().expand_as(personal.personal_models))
    personal.model.load_state_dict(shared.model.state_dict())
    personal.evaluate_all_clients()
    for key in ("test_accuracy", "test_loss"):
        assert np.allclose(personal.last_client_metrics[key], shared.last_client_metrics[key], atol=1e-5)


def test_matched_needs_every_held_class_in_the_pool():
    data = FederatedDataModule(source="digits", num_clients=4, partition="iid", test_mode="matched",
                               global_test_fraction=0.001, seed=0)
    with pytest.raises(ValueError, match="test_mode='matched' needs every class"):
        data.setup()


def test_class_values_of_a_shared_model_are_evaluate_clients_per_class(matched_data):
    data = matched_data
    model = module_for(FedAvg, data).model
    losses, accuracies = evaluate_clients(model, data.global_test_x, data.global_test_y,
                                          data.global_test_class_index, data.global_test_class_sizes)
    with torch.no_grad():
        correct = (model(data.global_test_x).argmax(1) == data.global_test_y).float()
    for c in range(10):
        assert float(accuracies[c]) == pytest.approx(float(correct[data.global_test_y == c].mean()), abs=1e-6)


def test_synthetic_clients_get_their_own_test_draws():
    plain = FederatedDataModule(source="synthetic", num_clients=10, partition="natural", test_mode="local",
                                local_test_fraction=0.0, seed=4)
    drawn = FederatedDataModule(source="synthetic", num_clients=10, partition="natural", test_mode="local",
                                source_params={"test_per_client": 50}, seed=4)
    plain.setup()
    drawn.setup()
    assert torch.equal(plain.train_x, drawn.train_x) and torch.equal(plain.train_sizes, drawn.train_sizes)
    assert drawn.test_sizes.tolist() == [50] * 10
    assert drawn.client_test_description() == "local: 50 samples per client"
    # drawn from the client's own distribution: nearer its own training mean than the others'
    means = [drawn.train_x[drawn.train_index[k, : drawn.train_sizes[k]]].mean(0) for k in range(10)]
    for k in range(10):
        test_mean = drawn.test_x[drawn.test_index[k, :50]].mean(0)
        distances = torch.stack([(test_mean - m).norm() for m in means])
        assert int(distances.argmin()) == k
    with pytest.raises(ValueError, match="natural clients differ in their inputs too"):
        FederatedDataModule(source="synthetic", num_clients=10, partition="natural", test_mode="matched")
    with pytest.raises(ValueError, match="needs partition='natural' and test_mode='local'"):
        FederatedDataModule(source="synthetic", num_clients=10, partition="iid",
                            source_params={"test_per_client": 50})


def test_resolved_partition_params_fill_the_defaults():
    assert resolved_partition_params("dirichlet", {}) == {"alpha": 0.5, "min_size": 10, "max_tries": 100}
    data = FederatedDataModule(source="digits", num_clients=5, partition="dirichlet", seed=2)
    assert data.hparams.partition_params["alpha"] == 0.5 and data.hparams_initial.data_seed == 2


def test_split_digest_tells_splits_apart():
    def digest(test_mode="local", **kwargs):
        data = FederatedDataModule(source="digits", num_clients=5, partition="iid", test_mode=test_mode, **kwargs)
        data.setup()
        return data.split_digest()

    assert digest(seed=1) == digest(seed=1) != digest(seed=2)
    assert digest(seed=1) != digest(seed=1, test_mode="matched")
