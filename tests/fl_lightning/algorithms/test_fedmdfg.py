"""FedMDFG (fedlf_appendix.md A.3): MGDA with fair guidance, absent clients, line search."""

import math

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from cvxopt import matrix, solvers

from fl_lightning.algorithms.fedmdfg import FedMDFG, fair_guidance, fairness_angle
from fl_lightning.core.evaluation import evaluate_clients
from fl_lightning.core.flat import model_vector
from fl_lightning.data.datamodule import FederatedDataModule
from tests import builders


def fedmdfg(d, num_clients=8, **kwargs):
    params = dict(backbone="fl_logreg", num_classes=2, input_shape=(1,), fraction=1.0, lr=1.0)
    module = FedMDFG(**(params | kwargs))
    module.register_client_history(d)  # the hand-made vectors' d
    module.materialise_client_states(num_clients)
    return module


def payload(updates, losses, clients=None, t=0):
    return builders.payload(updates, losses=losses, clients=clients, round_index=t)


def min_norm_point(vectors):
    """argmin ||Σλ_j v_j|| over the simplex, with cvxopt directly: returns Σλ_j v_j."""
    n = vectors.shape[0]
    solvers.options["show_progress"] = False
    solution = solvers.qp(matrix((2 * vectors @ vectors.T).numpy()), matrix(np.zeros(n)),
                          matrix(-np.eye(n)), matrix(np.zeros(n)),
                          matrix(np.ones((1, n))), matrix(np.ones(1)))
    return torch.tensor(np.array(solution["x"]).ravel()) @ vectors


def transcribed_step(g, losses, eta, guided):
    """Steps 2, 3 and 5 written out: equalised norms, g_h = Σh_i ĝ_i, MGDA, rescaling."""
    g = g.double()
    g_hat = g / g.norm(dim=1, keepdim=True) * g.norm(dim=1).mean()
    vectors = g_hat
    if guided:
        F = losses.double() / losses.double().norm()
        one = torch.ones_like(F) / math.sqrt(len(F))
        h = (F @ one) * F - one  # −(projection of 1̂ on the normal plane of F)
        vectors = torch.cat([g_hat, (h / h.norm()) @ g_hat.unsqueeze(0)])
    u = min_norm_point(vectors)
    return eta * u / u.norm() * g_hat.mean(0).norm()  # the server step −η d


G = torch.tensor([[3.0, 0.0, 1.0], [-1.0, 2.0, 0.0]])


def test_below_theta_the_guidance_is_off_and_fedmdfg_is_mgda():
    losses = torch.tensor([1.0, 1.05])
    assert fairness_angle(losses) < 11.25
    module = fedmdfg(3, lr=0.5)
    result = module.propose(payload(G * 0.5, losses))  # updates = η_t g
    step = result.direction
    assert result.metrics["fedmdfg_guided"] == 0
    assert torch.allclose(step.double(), transcribed_step(G, losses, 0.5, guided=False), atol=1e-5)
    assert (G @ step > 0).all()  # a common descent direction


def test_above_theta_the_guidance_favours_the_client_with_the_larger_loss():
    g = torch.tensor([[2.0, 0.0, 0.5], [0.0, 2.0, 0.5]])  # symmetric: MGDA treats them equally
    fair, unfair = torch.tensor([1.0, 1.0]), torch.tensor([0.5, 2.0])
    plain = fedmdfg(3).propose(payload(g, fair)).direction
    module = fedmdfg(3)
    result = module.propose(payload(g, unfair))
    guided = result.direction
    assert result.metrics["fedmdfg_guided"] == 1
    assert torch.allclose(guided.double(), transcribed_step(g, unfair, 1.0, guided=True), atol=1e-5)
    descent_plain, descent_guided = g @ plain, g @ guided  # each client's first-order loss decrease
    assert torch.isclose(descent_plain[0], descent_plain[1])
    assert descent_guided[1] > descent_guided[0] > 0  # client 2 (loss 2.0) gains more, client 1 still gains


def test_guidance_switches_on_exactly_above_theta():
    for offset, on in ((-0.5, False), (0.5, True)):
        losses = torch.tensor([1.0, math.tan(math.radians(45 + 11.25 + offset))])
        assert math.isclose(fairness_angle(losses), 11.25 + offset, abs_tol=1e-4)
        module = fedmdfg(3)
        result = module.propose(payload(G, losses))
        assert result.metrics["fedmdfg_guided"] == float(on)
    losses = torch.tensor([0.5, 2.0, 1.0])
    h = fair_guidance(losses)
    assert math.isclose(float(h.norm()), 1.0) and abs(float(h @ losses.double())) < 1e-12  # h ⊥ F
    assert float(h @ torch.ones(3).double()) < 0  # the opposite of 1's projection


def test_absent_clients_are_those_of_the_previous_round_and_zero_updates_are_left_out():
    module = fedmdfg(3, num_clients=5)
    rounds = [([0, 1, 2], []), ([1, 3], [0, 2]), ([0, 1, 2, 3], []), ([4], [0, 1, 2, 3])]
    for t, (online, absent) in enumerate(rounds):
        g = torch.randn(len(online), 3, generator=torch.Generator().manual_seed(t))
        p = payload(g, torch.rand(len(online)).tolist(), clients=online, t=t)
        assert module.absent_clients(p.clients).tolist() == absent, t
        result = module.propose(p)
        assert result.metrics["fedmdfg_absent_added"] == len(absent)
        module.on_round_end(module.with_round_context(p), result.direction)
    # a client whose update is zero is left out of the QP and of the history
    p = payload([[1.0, 0.5, 0.0], [0.0, 0.0, 0.0]], [1.0, 2.0], clients=[0, 1], t=4)
    result = module.propose(p)
    step = result.direction
    assert result.metrics["fedmdfg_zero_clients"] == 1 and torch.isfinite(step).all()
    module.on_round_end(module.with_round_context(p), step)
    assert module.last_seen.tolist() == [4, 2, 2, 2, 3]


# ------------------------------------------------------------------ federated fits
class Recorder(pl.Callback):
    def __init__(self):
        self.rounds = []

    def on_train_epoch_end(self, trainer, pl_module):
        self.rounds.append({k: float(v) for k, v in trainer.callback_metrics.items()})


class LossWatchingFedMDFG(FedMDFG):
    """Measures the online clients' mean training loss before and after each applied step."""

    def on_round_end(self, payload, server_step):
        super().on_round_end(payload, server_step)
        shards = payload.shards
        after, _ = evaluate_clients(self.model, shards.x, shards.y, shards.index, shards.sizes)
        self.watched = [*getattr(self, "watched", []), (float(payload.losses.mean()), float(after.mean()))]


@pytest.fixture(scope="module")
def data():
    return FederatedDataModule(source="digits", num_clients=8, partition="dirichlet",
                               partition_params={"alpha": 0.3}, test_mode="local", local_test_fraction=0.2, seed=0)


def fit(data, cls=FedMDFG, **kwargs):
    params = dict(backbone="fl_mlp", backbone_kwargs={"hidden_sizes": [16]}, num_classes=data.num_classes,
                  input_shape=data.input_shape, num_rounds=3, fraction=0.5, batch_size=16, lr=0.1, eval_every=1, seed=0)
    module = cls(**(params | kwargs))
    recorder = Recorder()
    builders.fit(module, data, callbacks=[recorder])
    return module, recorder.rounds


@pytest.mark.parametrize("theta", [11.25, 1.0])  # 1°: the guidance (and its cosine test) is on
def test_line_search_never_accepts_a_step_that_increases_the_mean_loss(data, theta):
    # lr = 3 is far too large a step: the search has to shrink it or give up
    module, rounds = fit(data, cls=LossWatchingFedMDFG, lr=3.0, num_rounds=5, theta_degrees=theta)
    assert len(module.watched) == 5
    assert all(r["fedmdfg_guided"] == float(r["fedmdfg_fairness_angle"] > theta) for r in rounds)
    assert all(after <= before + 1e-6 for before, after in module.watched), module.watched
    evaluations = [r["fedmdfg_line_search_evals"] for r in rounds]
    assert all(n >= 1 for n in evaluations) and max(evaluations) > 1  # it had to search
    assert any(r["fedmdfg_step_size"] < 3.0 for r in rounds)


def test_larger_steps_option_tries_steps_above_the_clients_lr(data):
    _, rounds = fit(data, lr=0.01, fraction=1.0, larger_steps=True, num_rounds=2)
    assert rounds[0]["fedmdfg_step_size"] > 0.01
    _, rounds = fit(data, lr=0.01, fraction=1.0, num_rounds=2)
    assert all(r["fedmdfg_step_size"] <= 0.01 for r in rounds)


@pytest.mark.parametrize("gradient", ["update", "full_batch"])
def test_fit_is_a_common_descent_with_history(data, gradient):
    module, rounds = fit(data, gradient=gradient, num_rounds=3, dropout_prob=0.2)
    assert len(rounds) == 3
    assert all(r["conflicts_model"] == 0 for r in rounds)
    assert all("fedmdfg_guided" in r and "fedmdfg_fairness_angle" in r for r in rounds)
    assert rounds[0]["fedmdfg_absent_added"] == 0 and any(r["fedmdfg_absent_added"] > 0 for r in rounds[1:])
    assert torch.isfinite(model_vector(module.model, module.round_engine.layout)).all()
    assert int(module.last_seen.max()) == 2
    assert {"history", "last_seen"} <= set(module.state_dict())  # checkpoints hold the state
    seen = module.last_seen >= 0
    assert module.history[seen].norm(dim=1).gt(0).all() and not module.history[~seen].any()


@pytest.mark.parametrize(
    "kwargs",
    [dict(theta_degrees=0.0), dict(theta_degrees=90.0), dict(line_search_steps=-1), dict(gradient="sgd")],
)
def test_bad_hyper_parameters_are_rejected(kwargs):
    with pytest.raises(ValueError):
        FedMDFG(backbone="fl_logreg", num_classes=2, input_shape=(1,), **kwargs)
