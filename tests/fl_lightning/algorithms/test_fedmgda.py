"""FedMGDA+ and its named variants (fedmgda_plus.md, Alg. 1 and eq. 25)."""

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from cvxopt import matrix, solvers

from fl_lightning.algorithms.fedmgda import FedAvgN, FedMGDA, FedMGDAPlus, MGDAProx
from fl_lightning.algorithms.fedprox import FedProx
from fl_lightning.data.datamodule import FederatedDataModule
from tests import builders

MODEL = dict(backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8), seed=0)


def make(cls=FedMGDAPlus, **kwargs):
    return cls(**(MODEL | kwargs)).double()


def payload(updates, num_samples, t=0):
    return builders.payload(updates, num_samples, losses=torch.ones(updates.shape[0]), round_index=t,
                            dtype=torch.float64)


def random_round(m, d, seed):
    generator = torch.Generator().manual_seed(seed)
    shared = torch.randn(d, generator=generator, dtype=torch.float64)
    sides = torch.randn(m, 1, generator=generator, dtype=torch.float64)
    magnitudes = torch.rand(m, 1, generator=generator, dtype=torch.float64) * 5 + 0.1
    updates = (sides * shared + torch.randn(m, d, generator=generator, dtype=torch.float64)) * magnitudes
    return updates, torch.randint(5, 200, (m,), generator=generator)


def normalised(updates):
    return updates / (updates.norm(dim=1, keepdim=True) + 1e-8)


def d_dims(g3, d):
    """Pad 3-dimensional vectors with zeros to the model's d (inner products unchanged)."""
    g = torch.zeros(g3.shape[0], d, dtype=torch.float64)
    g[:, :3] = g3
    return g


@pytest.mark.parametrize("epsilon", [0.02, 0.1, 0.3])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lambda_satisfies_kkt_of_the_boxed_qp(epsilon, seed):
    module = make(epsilon=epsilon)
    updates, n = random_round(8, module.num_parameters, seed)
    lam = module.propose(payload(updates, n)).details["lambda"]
    lam0 = n.double() / n.sum()
    lower, upper = (lam0 - epsilon).clamp(min=0), (lam0 + epsilon).clamp(max=1)
    g = normalised(updates)
    gradient = g @ g.T @ lam  # ∇(λᵀĜλ)/2
    tol = 1e-5
    assert abs(float(lam.sum()) - 1) < 1e-9
    assert (lam >= lower - 1e-9).all() and (lam <= upper + 1e-9).all()
    at_lower, at_upper = lam <= lower + tol, lam >= upper - tol
    free = ~at_lower & ~at_upper
    if epsilon < 0.05:
        assert (lam - lam0).abs().max() > epsilon - tol, "a small box must bind"
    # KKT: ∃c with ∇_i = c on free coordinates, ∇_i >= c at the lower bound, ∇_i <= c at the upper one
    largest_below = gradient[free | at_upper].max()
    smallest_above = gradient[free | at_lower].min()
    assert largest_below <= smallest_above + tol


def test_epsilon_zero_is_fedavg_n():
    module = make(FedAvgN)
    updates, n = random_round(6, module.num_parameters, 3)
    result = module.propose(payload(updates, n))
    step = result.direction
    lam0 = n.double() / n.sum()
    torch.testing.assert_close(result.details["lambda"], lam0, rtol=0, atol=1e-12)
    torch.testing.assert_close(step, lam0 @ normalised(updates), rtol=1e-10, atol=1e-12)


def min_norm_by_cvxopt(updates):
    """MGDA's eq. (23) straight from cvxopt: min λᵀGλ on the simplex."""
    G = (updates @ updates.T).numpy()
    m = G.shape[0]
    solution = solvers.qp(matrix(2 * G), matrix(np.zeros(m)), matrix(-np.eye(m)), matrix(np.zeros(m)),
                          matrix(np.ones((1, m))), matrix(1.0), options={"show_progress": False, "reltol": 1e-10,
                                                                          "abstol": 1e-12, "feastol": 1e-12})
    return torch.tensor(np.array(solution["x"]).ravel()) @ updates


def test_fedmgda_is_the_plain_min_norm_point():
    module = make(FedMGDA)
    assert module.hparams.epsilon == 1.0 and module.hparams.normalize is False
    updates, n = random_round(6, module.num_parameters, 4)
    step = module.propose(payload(updates, n)).direction
    expected = min_norm_by_cvxopt(updates)
    # min_norm_simplex solves to reltol 1e-6 on the objective; since ||d - d*||² <= ||d||² - ||d*||²
    # on a convex set, d is then within 1e-3 ||d*|| of the min-norm point
    assert step @ step <= (expected @ expected) * (1 + 1e-6)
    assert (step - expected).norm() <= 1e-3 * expected.norm()
    # the min-norm point d is a common descent direction: g_i · d >= ||d||²
    assert (updates @ step >= step @ step * (1 - 1e-3)).all()


def test_fedlf_three_client_example():
    """FedLF appendix, Fig. 1: FedMGDA+ (ε = 0.1, uniform λ0) conflicts with clients 1 and 2;
    MGDA's min-norm point conflicts with none."""
    plus = make(epsilon=0.1)
    g = d_dims(torch.tensor([[-1.0, 0.5, 0.0], [0.8, -1.0, 0.0], [1.0, 1.0, -1.0]]), plus.num_parameters)
    step = plus.propose(payload(g, [10, 10, 10])).direction
    assert (g @ step < 0).tolist() == [True, True, False]
    plain = make(FedMGDA).propose(payload(g, [10, 10, 10])).direction
    assert (g @ plain > 0).all()


def test_decay_schedule():
    module = make(num_rounds=1000, decay=0.1, global_lr=1.5)
    beta = 0.1 ** (100 / 1000)
    def at(m, t):
        return m.global_lr_at(m.round_context(t))
    assert at(module, 0) == at(module, 99) == 1.5
    assert at(module, 100) == pytest.approx(1.5 * beta)
    assert at(module, 999) == pytest.approx(1.5 * 0.1**0.9)
    assert at(make(num_rounds=1000), 999) == 1.0  # decay = 1: constant
    assert at(make(global_lr=None, lr=0.05, lr_decay=0.99), 7) == pytest.approx(0.05 * 0.99**7)
    updates, n = random_round(4, module.num_parameters, 5)
    first = module.propose(payload(updates, n, t=0)).direction
    later = module.propose(payload(updates, n, t=250)).direction
    torch.testing.assert_close(later, beta**2 * first)


def test_named_variants_and_defaults():
    plus = make()
    assert (plus.hparams.epsilon, plus.hparams.normalize, plus.hparams.global_lr, plus.hparams.decay,
            plus.hparams.mu, plus.hparams.track_improvement) == (0.1, True, 1.0, 1.0, 0.0, True)
    assert (make(FedAvgN).hparams.epsilon, make(FedAvgN).hparams.normalize) == (0.0, True)
    assert make(MGDAProx).hparams.mu == 0.1 and make(MGDAProx).hparams.epsilon == 0.1


def test_mgda_prox_objective_is_fedprox_objective():
    prox, ours = FedProx(**MODEL, mu=0.1), MGDAProx(**MODEL)
    generator = torch.Generator().manual_seed(0)
    m, batch = 3, 5
    logits = torch.randn(m, batch, 10, generator=generator)
    targets = torch.randint(0, 10, (m, batch), generator=generator)
    mask = torch.ones(m, batch)
    global_params = {n: p.detach() for n, p in ours.model.named_parameters()}
    local = {n: p + 0.1 * torch.randn(m, *p.shape, generator=generator) for n, p in global_params.items()}
    expected = prox.client_objective(logits, targets, mask, local, global_params)
    got = ours.client_objective(logits, targets, mask, local, global_params)
    torch.testing.assert_close(got, expected)
    plain = FedMGDAPlus(**MODEL).client_objective(logits, targets, mask, local, global_params)
    assert (got > plain).all()


@pytest.mark.parametrize(
    "kwargs, message",
    [({"epsilon": -0.1}, "epsilon"), ({"global_lr": 0.0}, "global_lr"), ({"decay": 0.0}, "decay"),
     ({"decay": 1.5}, "decay"), ({"mu": -1.0}, "mu")],
)
def test_bad_hyper_parameters_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FedMGDAPlus(**MODEL, **kwargs)


class Rounds(pl.Callback):
    def __init__(self):
        self.metrics, self.details = [], []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.details.append(outputs["outcome"].details)  # the round's ServerStep.details

    def on_train_epoch_end(self, trainer, pl_module):
        self.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def test_short_fit_logs_qp_and_improvement():
    data = FederatedDataModule(source="digits", num_clients=8, partition="dirichlet",
                               partition_params={"alpha": 0.5}, test_mode="local", seed=0)
    module = FedMGDAPlus(backbone="fl_logreg", num_classes=data.num_classes, input_shape=data.input_shape,
                         num_rounds=2, fraction=0.5, batch_size=32, lr=0.1, eval_every=1, seed=0)
    rounds = Rounds()
    builders.fit(module, data, callbacks=[rounds])
    assert torch.isfinite(module.round_engine.global_vector()).all()
    assert len(rounds.metrics) == 2
    for metrics in rounds.metrics:
        assert {"qp_fallback", "qp_fallbacks_total", "global_lr", "improved_fraction"} <= set(metrics)
        assert 0 <= metrics["improved_fraction"] <= 1
    lam = rounds.details[-1]["lambda"]
    assert abs(float(lam.sum()) - 1) < 1e-6 and len(lam) == 4
    assert rounds.details[-1]["qp_status"] == "optimal"
