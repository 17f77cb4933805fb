"""The fairness baselines of the FedFV and FedLF tables: q-FedAvg, AFL, FedFa, DRFL, FedGini."""

import math

import lightning.pytorch as pl
import pytest
import torch

from fl_lightning.algorithms.afl import AFL
from fl_lightning.algorithms.drfl import DRFL
from fl_lightning.algorithms.fedfa import FedFa
from fl_lightning.algorithms.fedgini import FedGini
from fl_lightning.algorithms.qfedavg import QFedAvg
from fl_lightning.data.datamodule import FederatedDataModule
from tests import builders

NUM_CLIENTS = 6


@pytest.fixture(scope="module")
def data():
    return FederatedDataModule(source="digits", num_clients=NUM_CLIENTS, partition="dirichlet",
                               partition_params={"alpha": 0.5}, test_mode="local", seed=0)


def make(cls, data=None, **kwargs):
    """A float64 module; with ``data`` its K-sized buffers are set up without a Trainer."""
    params = dict(backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8), lr=0.1, seed=0)
    module = cls(**(params | kwargs)).double()
    if data is not None:
        module.attach_data(data)
        module.setup("fit")
    return module


def payload(module, rows, losses=None, accuracies=None, clients=None, t=0):
    """Updates padded with zeros to the model's d (inner products and norms unchanged)."""
    rows = torch.as_tensor(rows, dtype=torch.float64)
    m = rows.shape[0]
    updates = torch.zeros(m, module.num_parameters, dtype=torch.float64)
    updates[:, : rows.shape[1]] = rows
    return builders.payload(updates, losses=torch.ones(m) if losses is None else losses,
                            accuracies=torch.full((m,), 0.5) if accuracies is None else accuracies,
                            clients=clients, round_index=t, dtype=torch.float64)


def fit(module, data, checkpoints=None):
    iterates = Iterates()
    builders.fit(module, data, enable_checkpointing=checkpoints is not None, default_root_dir=checkpoints,
                 callbacks=[iterates])
    return iterates


class Iterates(pl.Callback):
    """The global model and the logged metrics after every round."""

    def __init__(self):
        self.models, self.metrics = [], []

    def on_train_epoch_end(self, trainer, pl_module):
        self.models.append(pl_module.round_engine.global_vector().clone())
        self.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def fit_module(cls, data, **kwargs):
    params = dict(num_rounds=2, batch_size=32, lr=0.1, eval_every=1, seed=0)
    return cls(backbone="fl_logreg", num_classes=data.num_classes, input_shape=data.input_shape, **(params | kwargs))


# --------------------------------------------------------------------------- q-FedAvg
def test_qfedavg_q_zero_is_uniform_averaging():
    module = make(QFedAvg, q=0.0)
    rows = torch.randn(4, 7, dtype=torch.float64)
    step = module.propose(payload(module, rows, losses=[0.3, 2.0, 1.1, 0.7]))
    torch.testing.assert_close(step[:7], rows.mean(0))


def test_qfedavg_two_client_example_by_hand():
    # g1 = (1, 0), g2 = (0, 2), F = (1, 4), q = 1, L = 1/lr = 10:
    # Δ1 = 1·10·g1 = (10, 0), Δ2 = 4·10·g2 = (0, 80); h1 = 1·|10 g1|² + 10·1 = 110, h2 = 400 + 40 = 440
    module = make(QFedAvg, q=1.0)
    step = module.propose(payload(module, [[1.0, 0.0], [0.0, 2.0]], losses=[1.0, 4.0]))
    torch.testing.assert_close(step[:2], torch.tensor([10 / 550, 80 / 550], dtype=torch.float64))
    assert step[2:].abs().sum() == 0
    # L = 1 given: Δ = (g1, 4 g2) = ((1, 0), (0, 8)); h = (|g1|² + 1, |g2|² + 4) = (2, 8)
    step = make(QFedAvg, q=1.0, lipschitz=1.0).propose(payload(module, [[1.0, 0.0], [0.0, 2.0]], losses=[1.0, 4.0]))
    torch.testing.assert_close(step[:2], torch.tensor([0.1, 0.8], dtype=torch.float64))


# --------------------------------------------------------------------------- AFL
def test_afl_refuses_partial_participation_when_built(data):
    with pytest.raises(
        ValueError, match="AFL needs every client in every round, but fraction = 0.5: set fraction: 1.0"
    ):
        fit_module(AFL, data, fraction=0.5)
    assert make(AFL, data).hparams.fraction == 1.0  # its own default: every client


def test_afl_weights_by_client_id_and_moves_lambda_towards_the_worst_client(data):
    module = make(AFL, data, lr_lambda=0.1)
    clients = [3, 1, 0, 2]  # clients 4 and 5 did not answer
    rows = torch.randn(4, 5, dtype=torch.float64)
    p = payload(module, rows, losses=[0.1, 0.2, 3.0, 0.5], clients=clients)
    uniform = module.mixture.clone()
    module.mixture.copy_(torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0, 0.0]))
    answer = module.propose(p)  # γ_w Σ λ_k g_k / lr with γ_w = lr: λ read by client id
    step = answer.direction
    torch.testing.assert_close(step[:5], torch.tensor([0.4, 0.2, 0.1, 0.3], dtype=torch.float64) @ rows)
    # the mixture the step used is logged by client id, absent clients included
    assert [answer.metrics[f"afl_lambda/{k}"] for k in range(NUM_CLIENTS)] == pytest.approx([0.1, 0.2, 0.3, 0.4, 0, 0])
    assert answer.metrics["afl_lambda_max"] == pytest.approx(0.4)

    module.mixture.copy_(uniform)
    module.on_round_end(module.with_round_context(p), step)
    shifted = uniform + 0.1 * torch.tensor([3.0, 0.2, 0.5, 0.1, 0.0, 0.0])  # λ + γ_λ F, F by client id
    expected = shifted - (shifted.sum() - 1) / NUM_CLIENTS  # the projection when no weight hits 0
    assert (expected > 0).all()
    torch.testing.assert_close(module.mixture, expected.to(module.mixture.dtype))
    assert int(module.mixture.argmax()) == 0 and module.mixture[0] > 1 / NUM_CLIENTS  # the worst client


def test_afl_fit_keeps_lambda_on_the_simplex_and_averages_iterates(data, tmp_path):
    module = fit_module(AFL, data, lr_lambda=0.5, num_rounds=3)
    iterates = fit(module, data, checkpoints=tmp_path)
    lam = module.mixture
    assert lam.shape == (NUM_CLIENTS,) and (lam >= 0).all() and abs(float(lam.sum()) - 1) < 1e-6
    assert not torch.allclose(lam, torch.full_like(lam, 1 / NUM_CLIENTS))  # λ moved
    assert int(module.num_averaged) == 3
    torch.testing.assert_close(module.averaged_model, torch.stack(iterates.models).mean(0))
    assert module.evaluation_params() is module.averaged_model
    assert "test_acc_mean" in iterates.metrics[-1]
    restored = AFL.load_from_checkpoint(next(tmp_path.rglob("*.ckpt")))
    assert torch.equal(restored.mixture, module.mixture) and torch.equal(restored.averaged_model, module.averaged_model)


# --------------------------------------------------------------------------- FedFa
def test_fedfa_three_client_round_by_hand(data):
    module = make(FedFa, data, beta=0.5, gamma=0.9, eta=0.5)
    module.participation[[0, 1, 2]] = torch.tensor([2.0, 0.0, 1.0], dtype=module.participation.dtype)
    rows = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    p = payload(module, rows, accuracies=[0.5, 0.25, 0.25], clients=[0, 1, 2])
    step = module.server_round(p)

    assert module.participation.tolist() == [3, 1, 2, 0, 0, 0]  # f_i counts this round
    acc_info = [-math.log2(a / 1.0 + 1e-6) for a in (0.5, 0.25, 0.25)]  # ≈ (1, 2, 2)
    freq_info = [-math.log2(1 - f / 6 + 1e-5) for f in (3, 1, 2)]  # ≈ (1, .263, .585)
    p_i = [0.5 * a / sum(acc_info) + 0.5 * f / sum(freq_info) for a, f in zip(acc_info, freq_info)]
    assert p_i == pytest.approx([0.3706, 0.2712, 0.3583], abs=1e-4)  # (.2, .4, .4)/2 + (.541, .142, .317)/2
    averaged = sum(w * r for w, r in zip(p_i, rows))  # w - w_new
    momentum = 0.1 * -averaged  # m = γ·0 + (1 - γ) dw
    torch.testing.assert_close(step[:2], averaged + 0.5 * momentum)  # w - (w_new - η m)
    torch.testing.assert_close(module.server_momentum[:2], momentum)

    second = module.server_round(p)  # m <- γ m + (1 - γ) dw with the new weights
    assert module.participation.tolist() == [4, 2, 3, 0, 0, 0]
    weights = module.client_weights(p.accuracies, torch.tensor([4.0, 2.0, 3.0]))
    averaged2 = weights @ rows
    torch.testing.assert_close(module.server_momentum[:2], 0.9 * momentum - 0.1 * averaged2)
    torch.testing.assert_close(second[:2], averaged2 + 0.5 * module.server_momentum[:2])


def test_fedfa_clients_use_momentum_gamma_unless_told_otherwise():
    assert make(FedFa).round_engine.local_sgd.momentum == 0.9 and make(FedFa, gamma=0.5).hparams.momentum == 0.5
    assert make(FedFa, momentum=0.0).round_engine.local_sgd.momentum == 0.0


# --------------------------------------------------------------------------- DRFL and FedGini
@pytest.mark.parametrize("q, weights", [(0.0, [0.5, 0.5]), (1.0, [0.25, 0.75]), (2.0, [0.1, 0.9])])
def test_drfl_weights_grow_with_loss_to_the_power_q(q, weights):
    module = make(DRFL, q=q)
    rows = [[1.0, 0.0], [0.0, 1.0]]
    step = module.propose(payload(module, rows, losses=[1.0, 3.0]))
    torch.testing.assert_close(step[:2], torch.tensor(weights, dtype=torch.float64))


def gini_penalised_mean(F, penalty):
    """P(F) = mean(F) (1 + λ Gini(F)), Gini = Σ_i Σ_j |F_i - F_j| / (2 m² mean(F))."""
    m = F.numel()
    gini = (F[:, None] - F[None, :]).abs().sum() / (2 * m**2 * F.mean())
    return F.mean() * (1 + penalty * gini)


def test_fedgini_weights_are_the_gradient_of_the_gini_penalised_mean():
    module = make(FedGini, penalty=0.5)
    losses = torch.tensor([0.5, 2.0, 1.0, 0.7], dtype=torch.float64, requires_grad=True)
    gini_penalised_mean(losses, 0.5).backward()
    torch.testing.assert_close(module.gini_weights(losses.detach()), losses.grad)
    # m = 3 by hand: ranks (1, 3, 2) -> c = (1 + .5 (2r - 4) / 3) / 3 = (2/9, 4/9, 1/3)
    step = module.propose(payload(module, torch.eye(3), losses=[0.5, 2.0, 1.0]))
    torch.testing.assert_close(step[:3], torch.tensor([2 / 9, 4 / 9, 1 / 3], dtype=torch.float64))
    tied = module.gini_weights(torch.tensor([1.0, 1.0, 2.0]))  # ties share their mean rank
    torch.testing.assert_close(tied, torch.tensor([5 / 18, 5 / 18, 4 / 9], dtype=torch.float64))
    assert torch.equal(
        make(FedGini, penalty=0.0).gini_weights(torch.rand(5)), torch.full((5,), 0.2, dtype=torch.float64)
    )


def test_fedgini_reference_weighting_transcribes_the_fedlf_code():
    module = make(FedGini, weighting="reference", epsilon=0.5)
    losses = [0.3, 1.7, 0.9, 1.2]
    m = len(losses)
    denominator = 1 / 3 * (m - 1) * m * (m + 1)
    raw = [0.5 / m * (1 + (1 - 0.5) * (i + 1) * i / denominator) for i in range(m)]
    rank = sorted(range(m), key=lambda i: -losses[i])  # np.argsort(-l)
    current = [raw[r] for r in rank]
    expected = torch.tensor(current, dtype=torch.float64) / sum(current)
    torch.testing.assert_close(module.reference_weights(torch.tensor(losses)), expected)


@pytest.mark.parametrize(
    "cls, kwargs",
    [
        (DRFL, {"q": -1.0}),
        (FedGini, {"penalty": 1.5}),
        (FedGini, {"weighting": "owa"}),
        (QFedAvg, {"q": -0.5}),
        (QFedAvg, {"lipschitz": 0.0}),
        (AFL, {"lr_lambda": 0.0}),
        (FedFa, {"beta": 2.0}),
        (FedFa, {"gamma": 1.0}),
    ],
)
def test_bad_hyper_parameters_are_refused(cls, kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        make(cls, **kwargs)


# --------------------------------------------------------------------------- short fits
@pytest.mark.parametrize("cls", [QFedAvg, FedFa, DRFL, FedGini])
def test_short_fit(cls, data):
    module = fit_module(cls, data, fraction=0.5)
    start = module.round_engine.global_vector().clone()
    iterates = fit(module, data)
    end = module.round_engine.global_vector()
    assert torch.isfinite(end).all() and not torch.equal(end, start)
    assert {"conflicts_model", "server_step_norm", "test_acc_mean"} <= set(iterates.metrics[-1])
    if cls is FedFa:
        assert int(module.participation.sum()) == 2 * 3  # 3 clients answered in each of 2 rounds
        assert module.server_momentum.norm() > 0
