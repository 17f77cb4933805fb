"""CFFL (Lyu et al. 2020) and ECI (CGSV Sec. 4.1) against their definitions on hand-checked
cases, the Shapley estimators they use, the server's validation set, and short fits."""

import math

import pytest
import torch

from fl_lightning.algorithms import ALGORITHMS, CFFL, ECI
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.metrics.shapley import exact_shapley, sampled_shapley
from tests import builders

# A 3-player game: ν(∅)=0, ν(0)=1, ν(1)=2, ν(2)=0, ν(01)=4, ν(02)=1, ν(12)=2, ν(012)=5.
TABLE = {(): 0.0, (0,): 1.0, (1,): 2.0, (2,): 0.0, (0, 1): 4.0, (0, 2): 1.0, (1, 2): 2.0, (0, 1, 2): 5.0}
# φ_0 = 1/3·1 + 1/6·(4−2) + 1/6·(1−0) + 1/3·(5−2); φ_1 = 1/3·2 + 1/6·3 + 1/6·2 + 1/3·4; φ_2 = 1/3·(5−4)
HAND_PHI = [1 / 3 + 2 / 6 + 1 / 6 + 1, 2 / 3 + 3 / 6 + 2 / 6 + 4 / 3, 1 / 3]


def table_value(members):
    return torch.tensor([TABLE[tuple(row.nonzero().flatten().tolist())] for row in members], dtype=torch.float64)


def test_exact_shapley_matches_the_hand_computed_values():
    assert exact_shapley(table_value, 3).tolist() == pytest.approx(HAND_PHI)


def test_sampled_shapley_converges_to_the_exact_value_and_is_reproducible():
    estimate = sampled_shapley(table_value, 3, 3000, torch.Generator().manual_seed(0))
    assert estimate.tolist() == pytest.approx(HAND_PHI, abs=0.06)
    assert float(estimate.sum()) == pytest.approx(5.0)  # every order's gains sum to ν(N) − ν(∅)
    again = sampled_shapley(table_value, 3, 3000, torch.Generator().manual_seed(0))
    assert torch.equal(estimate, again)
    with pytest.raises(ValueError, match="num_permutations"):
        sampled_shapley(table_value, 3, 0)
    with pytest.raises(ValueError, match="sampled_shapley"):
        exact_shapley(table_value, 11)


# ------------------------------------------------------------------ the validation set
def digits(num_clients=4):
    data = FederatedDataModule(source="digits", num_clients=num_clients, partition="iid", test_mode="global", seed=0)
    data.setup()
    return data


def attached(cls, data, **kwargs):
    kwargs.setdefault("seed", 0)
    module = cls(backbone="fl_logreg", num_classes=data.num_classes, input_shape=data.input_shape, fraction=1.0,
                 **kwargs)
    module.attach_data(data)
    module.materialise_client_states(data.num_clients)
    return module


def test_validation_set_is_held_out_of_every_agents_training_data():
    data = digits()
    module = attached(CFFL, data, validation_fraction=0.2)
    training, held = module.validation_split(module.federated_data)
    sizes = data.train_sizes.tolist()
    assert training.train_sizes.tolist() == [n - round(0.2 * n) for n in sizes]
    assert held.numel() == sum(round(0.2 * n) for n in sizes)
    shards = module.client_shards(torch.arange(data.num_clients))
    trained_on = {int(i) for k, n in enumerate(shards.sizes_cpu) for i in shards.index[k, :n]}
    everything = {int(i) for k, n in enumerate(sizes) for i in data.train_index[k, :n]}
    assert trained_on.isdisjoint(held.tolist()) and trained_on | set(held.tolist()) == everything
    again = (lambda m: m.validation_split(m.federated_data))(attached(CFFL, digits(), validation_fraction=0.2))[1]
    assert torch.equal(held, again)  # drawn from the seed
    assert not torch.equal(
        held,
        (lambda m: m.validation_split(m.federated_data))(attached(CFFL, digits(), validation_fraction=0.2, seed=1))[1],
    )


# ------------------------------------------------------------------ CFFL by hand
def tiny(cls, num_agents=3, **kwargs):
    """D = 4 parameters (logistic regression 1 -> 2), global model w_g = 0."""
    module = cls(backbone="fl_logreg", num_classes=2, input_shape=(1,), fraction=1.0, **kwargs)
    for p in module.model.parameters():
        torch.nn.init.zeros_(p)
    module.materialise_client_states(num_agents)
    return module


def payload(delta_w, num_samples):
    """A round's uploads from the agents' updates Δw_i (the payload holds g_i = −Δw_i)."""
    return builders.payload(-torch.as_tensor(delta_w, dtype=torch.float32), num_samples)


UPDATES = [[1.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 4.0]]


def sinh_reputations(scores, alpha=5.0, fade=0.8):
    raw = [math.sinh(alpha * (1 - fade) * s) for s in scores]
    return [v / sum(raw) for v in raw]


def test_cffl_validation_reputations_threshold_and_downloads_by_hand(monkeypatch):
    module = tiny(CFFL, threshold=0.5)
    monkeypatch.setattr(
        module, "validation_accuracy", lambda context, models: torch.tensor([0.9, 0.6, 0.3], dtype=torch.float64)
    )
    before = module.agent_models.clone()
    step = module.server_round(payload(UPDATES, [1, 1, 2]))
    # s = vacc / Σ vacc = [1/2, 1/3, 1/6]; r = sinh(5 · 0.2 s), normalised
    r = sinh_reputations([1 / 2, 1 / 3, 1 / 6])
    assert r[2] < 0.5 / 3 < r[1]  # κ/|R| = 1/6: agent 2 leaves R
    expected = [r[0] / (r[0] + r[1]), r[1] / (r[0] + r[1]), 0.0]
    assert module.r.tolist() == pytest.approx(expected)
    assert module.reputable.tolist() == [True, True, False]
    # Δw_g = Σ_R a_j Δw_j with a = n / Σ n over the round's R (all three before the threshold)
    delta_g = torch.tensor([0.25, 0.5, 0.0, 2.0])
    assert torch.allclose(-step, delta_g)
    moved = module.agent_models - before
    # agent 0 (max r): all of Δw_g, plus its own update less its share: (1 − 1/4) Δw_0
    assert torch.allclose(moved[0], delta_g + 0.75 * torch.tensor(UPDATES[0]))
    # agent 1: ⌊4 r_1/r_0⌋ largest entries of Δw_g (|1.0| then |0.5| ...) plus (1 − 1/4) Δw_1
    quota = math.floor(4 * expected[1] / expected[0])
    kept = torch.zeros(4)
    kept[torch.tensor([3, 1, 0, 2])[:quota]] = 1
    assert torch.allclose(moved[1], delta_g * kept + 0.75 * torch.tensor(UPDATES[1]))
    # agent 2 left R: it keeps its own training only
    assert torch.allclose(moved[2], torch.tensor(UPDATES[2]))
    # next round: agent 2 is neither aggregated nor rewarded
    module.agent_models.copy_(before)
    monkeypatch.setattr(
        module, "validation_accuracy", lambda context, models: torch.tensor([0.5, 0.5, 0.9], dtype=torch.float64)
    )
    step = module.server_round(payload(UPDATES, [1, 1, 2]))
    assert torch.allclose(-step, torch.tensor([0.5, 1.0, 0.0, 0.0]))
    assert module.r[2] == 0 and not module.reputable[2]


def test_cffl_leave_one_out_scores_by_hand(monkeypatch):
    module = tiny(CFFL, reputation="leave_one_out")
    calls = []

    def accuracies(context, models):
        calls.append(models.clone())
        return torch.tensor([0.8, 0.6, 0.8, 0.9], dtype=torch.float64)  # all, without 0, without 1, without 2

    monkeypatch.setattr(module, "validation_accuracy", accuracies)
    module.server_round(payload(UPDATES, [1, 1, 2]))
    delta_g = torch.tensor([0.25, 0.5, 0.0, 2.0])
    assert torch.allclose(calls[0][0], delta_g)  # w_g + Δw_g (w_g = 0)
    assert torch.allclose(calls[0][3], delta_g - 0.5 * torch.tensor(UPDATES[2]))  # without agent 2 (a_2 = 1/2)
    f = [1 / (1 + math.exp(-15 * (0.8 / (0.8 + acc) - 0.5))) for acc in (0.6, 0.8, 0.9)]
    assert module.r.tolist() == pytest.approx(sinh_reputations([v / sum(f) for v in f]))


# ------------------------------------------------------------------ ECI by hand
@pytest.mark.parametrize("num_permutations", [None, 4000])
def test_eci_shapley_of_validation_accuracy_and_downloads_by_hand(monkeypatch, num_permutations):
    module = tiny(ECI, num_permutations=num_permutations, alpha=0.95)
    # ν(S) = first coordinate of w_g + FedAvg of S: with equal sizes, the mean of x = [1, 0, 0] over S
    monkeypatch.setattr(module, "validation_accuracy", lambda context, models: models[:, 0].double())
    before = module.agent_models.clone()
    updates = [[1.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 4.0]]
    step = module.server_round(payload(updates, [1, 1, 1]))
    # φ_0 = 1/3·1 + 1/6·(1/2) + 1/6·(1/2) + 1/3·(1/3); φ_1 = φ_2 = 1/6·(1/2 − 1) + 1/3·(1/3 − 1/2)
    phi = [1 / 3 + 1 / 12 + 1 / 12 + 1 / 9, -1 / 12 - 1 / 18, -1 / 12 - 1 / 18]
    tolerance = 1e-6 if num_permutations is None else 0.03  # float32 models
    assert module.phi.tolist() == pytest.approx(phi, abs=tolerance)
    r = [max(0.05 * p, 1e-3) for p in phi]
    assert module.r.tolist() == pytest.approx([v / sum(r) for v in r], abs=tolerance)
    delta_n = torch.tensor([1.0, 2.0, 0.0, 4.0]) / 3  # FedAvg
    assert torch.allclose(-step, delta_n)
    moved = module.agent_models - before
    assert torch.allclose(moved[0], delta_n)  # the top agent downloads all of Δw_N
    assert torch.equal(moved[1:], torch.zeros(2, 4))  # ⌊4 · 0.001/0.0306⌋ = 0 entries


def test_eci_refuses_an_exact_value_over_too_many_agents(monkeypatch):
    module = tiny(ECI, num_agents=11, num_permutations=None)
    monkeypatch.setattr(module, "validation_accuracy", lambda context, models: models[:, 0].double())
    with pytest.raises(ValueError, match="num_permutations"):
        module.propose(payload(torch.zeros(11, 4), [1] * 11))


# ------------------------------------------------------------------ fits and registry
def fit(cls, **kwargs):
    data = FederatedDataModule(source="digits", num_clients=4, partition="iid", test_mode="global", seed=0)
    module = cls(backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8), num_rounds=3, batch_size=32, lr=0.1,
                 eval_every=1, seed=0, fraction=1.0, **kwargs)
    return module, builders.fit(module, data)


@pytest.mark.parametrize("cls, kwargs", [
    (CFFL, {}), (CFFL, {"reputation": "leave_one_out", "upload_fraction": 0.5, "clip": 0.05}),
    (ECI, {"num_permutations": 5}), (ECI, {"num_permutations": None}),
])
def test_short_fits_train_every_agent(cls, kwargs):
    module, trainer = fit(cls, **kwargs)
    assert float(trainer.callback_metrics["test_acc_mean"]) > 0.5  # 3 rounds of digits: well above chance
    assert float(module.r.sum()) == pytest.approx(1.0)
    assert not torch.equal(module.agent_models[0], module.agent_models[1])  # personalised models


def test_new_baselines_are_registered():
    assert ALGORITHMS["CFFL"] is CFFL and ALGORITHMS["ECI"] is ECI
    with pytest.raises(ValueError, match="fraction=1.0"):
        CFFL(fraction=0.5)
    with pytest.raises(ValueError, match="validation_fraction"):
        ECI(validation_fraction=0.0)
