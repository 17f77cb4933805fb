"""Ditto (Li et al. 2021, Alg. 1): FedAvg's global model plus prox-regularised personal models."""

import copy

import lightning.pytorch as pl
import pytest
import torch

from fl_lightning.algorithms.ditto import Ditto
from fl_lightning.algorithms.fedavg import FedAvg
from fl_lightning.core.evaluation import evaluate_clients
from fl_lightning.core.flat import assign_model_vector
from fl_lightning.core.local import batch_order
from fl_lightning.core.module import round_generator
from fl_lightning.data.datamodule import FederatedDataModule
from tests import builders


def digits(num_clients=3, **kwargs):
    params = dict(source="digits", num_clients=num_clients, partition="iid", test_mode="local", local_test_fraction=0.2,
                  seed=0)
    params.update(kwargs)
    return FederatedDataModule(**params)


def fit(cls, data, callbacks=(), **kwargs):
    params = dict(backbone="fl_logreg", num_classes=data.num_classes,
                  input_shape=data.input_shape, num_rounds=2, fraction=1.0, batch_size=32, lr=0.1, eval_every=1, seed=0)
    params.update(kwargs)
    module = cls(**params)
    builders.fit(module, data, callbacks=list(callbacks))
    return module


class Recorder(pl.Callback):
    """w^0 and, after every round, the global model and the personal models."""

    def on_train_start(self, trainer, module):
        self.start = module.round_engine.global_vector().clone()
        self.servers, self.personal = [], []

    def on_train_epoch_end(self, trainer, module):
        self.servers.append(module.round_engine.global_vector().clone())
        self.personal.append(module.personal_models.clone())


def plain_local_sgd(module, data, client, start, rounds, lr):
    """Local SGD of one client from ``start`` over the given rounds, written out with an
    ordinary model and torch.optim.SGD on the minibatches the core draws for each round
    (full participation: the round's clients are 0..K-1, in order)."""
    model = copy.deepcopy(module.model)
    assign_model_vector(model, module.round_engine.layout, start)
    K = data.num_clients
    max_n = int(data.train_sizes.max())
    n = int(data.train_sizes[client])
    for t in rounds:
        order = batch_order(data.train_sizes, max_n, 1, round_generator(module.hparams.seed, t, "shuffle"))
        optimizer = torch.optim.SGD(model.parameters(), lr=lr * module.hparams.lr_decay**t)
        positions = order[0, client, :n]
        assert order.shape[1] == K
        for first in range(0, n, module.hparams.batch_size):
            rows = data.train_index[client, positions[first : first + module.hparams.batch_size]]
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(data.train_x[rows]), data.train_y[rows]).backward()
            optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_lambda_zero_personal_models_are_pure_local_training_and_global_is_fedavg():
    data = digits()
    recorder = Recorder()
    ditto = fit(Ditto, data, callbacks=[recorder], lam=0.0, lr_decay=0.9)
    for client in range(3):
        alone = plain_local_sgd(ditto, data, client, recorder.start, rounds=[0, 1], lr=0.1)
        assert torch.allclose(ditto.personal_models[client], alone, atol=1e-5)
    fedavg = fit(FedAvg, data, lr_decay=0.9)
    assert torch.equal(ditto.round_engine.global_vector(), fedavg.round_engine.global_vector())  # Alg. 1 line 9: FedAvg


def test_prox_pulls_towards_the_current_global_model():
    """Full batch, one step per round, λ = 1/η: v ← v − η(∇F_k(v) + λ(v − w^t)) = w^t − η ∇F_k(v),
    so after round 2 the personal model is the round's global model w^1 minus one gradient
    step taken at the previous personal model v^1 (λ → ∞ would leave v = w^t)."""
    data = digits()
    recorder = Recorder()
    lr = 0.5
    ditto = fit(Ditto, data, callbacks=[recorder], lam=1 / lr, lr=lr, batch_size=None)
    model = copy.deepcopy(ditto.model)
    for client in range(3):
        assign_model_vector(model, ditto.round_engine.layout, recorder.personal[0][client])
        rows = data.train_index[client, : int(data.train_sizes[client])]
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(data.train_x[rows]), data.train_y[rows]).backward()
        gradient = torch.cat([p.grad.flatten() for p in model.parameters()])
        expected = recorder.servers[0] - lr * gradient
        assert torch.allclose(ditto.personal_models[client], expected, atol=1e-5)


def test_personal_models_stay_closer_to_the_anchor_as_lambda_grows():
    """The prox pulls v_k towards the round's global model w^t (its anchor): the larger λ,
    the closer v_k^{t+1} ends to w^t (λ → ∞: v_k = w^t)."""
    data = digits(3, partition="pathological", partition_params={"classes_per_client": 4})
    distance = {}
    for lam in (0.0, 2.0, 10.0):  # lr = 0.1: λ·lr up to 1
        recorder = Recorder()
        module = fit(Ditto, data, callbacks=[recorder], lam=lam)
        anchor = recorder.servers[-2]  # w^t of the last round
        distance[lam] = (module.personal_models - anchor).norm(dim=1).mean().item()
    assert distance[0.0] > distance[2.0] > distance[10.0]
    assert distance[10.0] < 0.5 * distance[0.0]


def test_personal_models_beat_the_global_model_on_pathological_clients():
    """Two classes per client: the personal models fit their client's classes; fairness and
    accuracy are evaluated on them (logged test_acc_*), and they beat the global model there.
    Half the clients per round: the others keep their personal models untouched."""
    data = digits(10, partition="pathological", partition_params={"classes_per_client": 2})
    recorder = Recorder()
    module = fit(Ditto, data, callbacks=[recorder], num_rounds=4, fraction=0.5, local_epochs=3)
    personal = torch.tensor(module.last_client_metrics["test_accuracy"])
    _, global_acc = evaluate_clients(module.model, data.test_x, data.test_y, data.test_index, data.test_sizes)
    assert personal.mean() > global_acc.mean() + 0.1
    assert module.trainer.callback_metrics["test_acc_mean"].item() == pytest.approx(personal.mean().item(), abs=1e-6)
    previous = recorder.start.expand(10, -1)
    for t, now in enumerate(recorder.personal):
        sampled = module.sample_clients(module.round_context(t))
        idle = torch.ones(10, dtype=torch.bool)
        idle[sampled] = False
        assert torch.equal(now[idle], previous[idle]) and not torch.equal(now[sampled], previous[sampled])
        previous = now
    assert "personal_models" in module.state_dict()


@pytest.mark.parametrize(
    "bad, message", [(dict(lam=-0.1), "lam"), (dict(lam=25.0, lr=0.1), "lower lam or lr")]
)
def test_bad_values_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        Ditto(**bad)
