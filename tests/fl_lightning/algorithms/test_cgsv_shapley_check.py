"""CGSV's opt-in Fig. 1 check (Xu et al., NeurIPS 2021, Sec. 3.3): every k-th round, ψ (eq. 3)
and the sampled Shapley values φ̄ against the exact CGSV φ (eq. 2) on the round's uploads."""

import itertools
import math

import pytest
import torch
from lightning.pytorch.loggers import Logger

from fl_lightning.algorithms.cgsv import CGSV
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.metrics import pearson
from fl_lightning.metrics.shapley import (
    FIG1_PERMUTATIONS,
    exact_shapley,
    fig1_errors,
    sampled_shapley,
)
from tests import builders
from tests.builders import payload

CHECK = ("cgsv_shapley_l1", "cgsv_shapley_l2", "cgsv_shapley_pearson", "cgsv_shapley_sampled_l1",
         "cgsv_shapley_sampled_l2", "cgsv_shapley_sampled_pearson", "cgsv_time_s", "cgsv_shapley_time_s",
         "cgsv_shapley_exact_time_s", "cgsv_shapley_time_ratio", "cgsv_shapley_psi_sampled_pearson",
         "cgsv_shapley_l1_gap", "cgsv_shapley_l2_gap")


def cosine_game(u, r):
    """ν(S) = cos(Σ_{i∈S} r_i u_i, Σ_N r_i u_i) for one coalition (a tuple of agents), 0 for ∅."""
    grand = r @ u
    def value(coalition):
        if not coalition:
            return 0.0
        part = r[list(coalition)] @ u[list(coalition)]
        return float(part @ grand / (part.norm() * grand.norm()))
    return value


def shapley_by_orders(value, n):
    """φ_i = (1/n!) Σ_π [ν(S_{π,i} ∪ i) − ν(S_{π,i})], Definition 1, over every order."""
    phi = [0.0] * n
    orders = list(itertools.permutations(range(n)))
    for order in orders:
        for k, i in enumerate(order):
            phi[i] += value(tuple(sorted(order[:k + 1]))) - value(tuple(sorted(order[:k])))
    return torch.tensor(phi, dtype=torch.float64) / len(orders)


def members_game(value):
    """The same game in shapley.py's form: rows of a 0/1 members matrix -> their worth."""
    return lambda members: torch.tensor([value(tuple(row.nonzero().flatten().tolist())) for row in members],
                                        dtype=torch.float64)


def module_for(num_agents, **kwargs):
    """A module with D = 1220 parameters (logistic regression, 121 inputs -> 10 classes)."""
    module = CGSV(backbone="fl_logreg", num_classes=10, input_shape=(121,), **kwargs)
    module.materialise_client_states(num_agents)
    assert sum(module.round_engine.layout.numels) == 1220
    return module


class Recorded(Logger):
    """Every ``log_metrics`` call a run makes: [(step, metrics)]."""

    def __init__(self):
        super().__init__()
        self.calls = []

    name, version = "recorded", 0

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_metrics(self, metrics, step=None):
        self.calls.append((step, dict(metrics)))

    def at_step(self):
        """step -> everything logged with it."""
        merged = {}
        for step, metrics in self.calls:
            merged.setdefault(step, {}).update(metrics)
        return merged


def fit(num_rounds=4, **kwargs):
    data = FederatedDataModule(source="digits", num_clients=4, partition="iid", test_mode="global", seed=0)
    module = CGSV(backbone="fl_logreg", num_classes=data.num_classes, input_shape=data.input_shape,
                  num_rounds=num_rounds, batch_size=32, lr=0.1, seed=0, eval_every=num_rounds, **kwargs)
    logger = Recorded()
    builders.fit(module, data, logger=logger)
    return module, logger.at_step()


# ------------------------------------------------------------------------- the measurement
def test_sampled_shapley_converges_to_the_exact_value_of_a_tiny_cosine_game():
    """4 agents, weights r: the exact φ (all 24 orders, by hand) sums to ν(N) = 1, and the
    Monte-Carlo estimate's error shrinks like 1/√P: within 0.02 at 20,000 orders, far from it
    at 3 (where it is still a random guess)."""
    g = torch.Generator().manual_seed(7)
    u = torch.randn(4, 16, generator=g, dtype=torch.float64)
    u[3] = -0.3 * u[0] + 0.1 * torch.randn(16, generator=g, dtype=torch.float64)  # a partly opposed agent
    r = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    value = cosine_game(u, r)
    exact = shapley_by_orders(value, 4)
    assert exact.sum().item() == pytest.approx(1.0, abs=1e-12)
    assert torch.allclose(exact_shapley(members_game(value), 4), exact, atol=1e-12)
    errors = {}
    for orders in (3, 20_000):
        sampled = sampled_shapley(members_game(value), 4, orders, torch.Generator().manual_seed(0))
        assert sampled.sum().item() == pytest.approx(1.0, abs=1e-9)  # every order shares out ν(N)
        errors[orders] = (sampled - exact).abs().max().item()
    assert errors[20_000] < 0.02 < errors[3]


def test_fig1_errors_normalise_both_vectors_to_sum_one():
    estimate = torch.tensor([2.0, 1.0, 1.0])  # / 4 -> (0.5, 0.25, 0.25)
    exact = torch.tensor([0.4, 0.4, 0.2])
    l1, l2 = fig1_errors(estimate, exact)
    assert l1 == pytest.approx(0.1 + 0.15 + 0.05)
    assert l2 == pytest.approx(math.sqrt(0.1**2 + 0.15**2 + 0.05**2))
    assert fig1_errors(3 * exact, exact) == pytest.approx((0.0, 0.0))  # a scale is normalised away
    assert all(math.isnan(e) for e in fig1_errors(torch.tensor([1.0, -1.0, 0.0]), exact))  # sum 0: undefined
    assert FIG1_PERMUTATIONS == 150  # ⌈ln(2/0.1) / (2 · 0.1²)⌉, the paper's (0.1, 0.1)-approximation


def test_a_check_round_by_hand():
    """Three agents, round 1 (weights = data shares 1/2, 1/4, 1/4), uploads of different norms:
    the check values the Γ-normalised uploads, so φ is the by-hand CGSV of u_i = Γ g_i / ||g_i||
    under the data-share weights, ψ is the module's own cgsv_psi, and every logged error and
    correlation is what the logged per-agent values give."""
    module = module_for(3, shapley_check_every=1)
    g = torch.Generator().manual_seed(1)
    updates = torch.randn(3, 1220, generator=g)
    updates[1] = 5 * updates[0] + torch.randn(1220, generator=g)  # close to agent 0, much longer
    updates[2] = -0.5 * updates[0] + 2 * torch.randn(1220, generator=g)
    metrics = module.propose(payload(updates, [20, 10, 10])).metrics

    u = updates.double() / updates.double().norm(dim=1, keepdim=True)  # Γ cancels in every cosine
    exact = shapley_by_orders(cosine_game(u, torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)), 3)
    logged_phi = torch.tensor([metrics[f"cgsv_shapley/{i}"] for i in range(3)], dtype=torch.float64)
    assert torch.allclose(logged_phi, exact, atol=1e-6)
    psi = torch.tensor([metrics[f"cgsv_psi/{i}"] for i in range(3)], dtype=torch.float64)
    sampled = torch.tensor([metrics[f"cgsv_shapley_sampled/{i}"] for i in range(3)], dtype=torch.float64)
    assert sampled.sum().item() == pytest.approx(1.0, abs=1e-9)
    assert metrics["cgsv_shapley_pearson"] == pytest.approx(float(pearson(psi, logged_phi)), abs=1e-5)
    assert metrics["cgsv_shapley_sampled_pearson"] == pytest.approx(float(pearson(sampled, logged_phi)), abs=1e-9)
    assert metrics["cgsv_shapley_psi_sampled_pearson"] == pytest.approx(float(pearson(psi, sampled)), abs=1e-5)
    normalised = psi / psi.sum() - exact
    assert metrics["cgsv_shapley_l1"] == pytest.approx(normalised.abs().sum().item(), abs=1e-5)
    assert metrics["cgsv_shapley_l2"] == pytest.approx(normalised.norm().item(), abs=1e-5)
    assert metrics["cgsv_shapley_sampled_l1"] == pytest.approx((sampled - logged_phi).abs().sum().item(), abs=1e-9)
    assert metrics["cgsv_shapley_l1_gap"] == pytest.approx(
        metrics["cgsv_shapley_sampled_l1"] - metrics["cgsv_shapley_l1"])
    assert metrics["cgsv_shapley_l2_gap"] == pytest.approx(
        (sampled - logged_phi).norm().item() - metrics["cgsv_shapley_l2"], abs=1e-9)
    assert metrics["cgsv_shapley_time_ratio"] == pytest.approx(
        metrics["cgsv_shapley_time_s"] / max(metrics["cgsv_time_s"], 1e-9))
    assert all(metrics[name] >= 0 for name in ("cgsv_time_s", "cgsv_shapley_time_s", "cgsv_shapley_exact_time_s"))


def test_the_check_is_reproducible_and_leaves_the_round_unchanged():
    """Same step and state as without the check; the sampled orders come from (seed, round), so
    the same round gives the same φ̄ twice and another round other orders."""
    updates = torch.randn(5, 1220, generator=torch.Generator().manual_seed(2))
    plain, checked = module_for(5), module_for(5, shapley_check_every=1, shapley_permutations=7)
    step, step_checked = plain.propose(payload(updates, [1] * 5)), checked.propose(payload(updates, [1] * 5))
    assert torch.equal(step.direction, step_checked.direction)
    assert torch.equal(step.new_state["r"], step_checked.new_state["r"])
    again = checked.propose(payload(updates, [1] * 5)).metrics
    later = checked.propose(payload(updates, [1] * 5, round_index=1)).metrics
    sampled = [[m[f"cgsv_shapley_sampled/{i}"] for i in range(5)] for m in (step_checked.metrics, again, later)]
    assert sampled[0] == sampled[1] != sampled[2]
    assert step_checked.metrics["cgsv_shapley/0"] == later["cgsv_shapley/0"]  # the exact φ does not sample


def test_more_than_ten_agents_skip_the_exact_value():
    metrics = module_for(11, shapley_check_every=1).propose(
        payload(torch.randn(11, 1220, generator=torch.Generator().manual_seed(3)), [1] * 11)).metrics
    assert "cgsv_shapley_sampled/10" in metrics and math.isfinite(metrics["cgsv_shapley_psi_sampled_pearson"])
    assert not any(k.startswith("cgsv_shapley_l") or k.startswith("cgsv_shapley/") for k in metrics)
    assert "cgsv_shapley_exact_time_s" not in metrics and "cgsv_shapley_pearson" not in metrics


# ---------------------------------------------------------------------------- in a real run
def test_off_by_default_logs_nothing():
    module, logged = fit(num_rounds=2)
    assert module.hparams.shapley_check_every == 0
    assert sorted(logged) == [1, 2] and all("cgsv_psi_mean" in logged[step] for step in (1, 2))
    assert not any(k.startswith("cgsv_shapley") or k == "cgsv_time_s" for r in logged.values() for k in r)


def test_every_k_rounds_logs_at_the_round_step():
    """k = 2 over 4 rounds: steps 2 and 4 (rounds completed) carry the check, steps 1 and 3 do
    not; ψ of 4 agents on real digits gradients ranks them as the exact φ does (pearson > 0.9),
    and the logged pearson and ℓ1 error are those of the logged per-agent ψ and φ."""
    _, logged = fit(num_rounds=4, shapley_check_every=2)
    assert [step for step in sorted(logged) if "cgsv_shapley_pearson" in logged[step]] == [2, 4]
    assert all("cgsv_psi_mean" in logged[step] for step in (1, 2, 3, 4))
    for step in (2, 4):
        r = logged[step]
        assert set(CHECK) <= r.keys()
        assert r["cgsv_shapley_pearson"] > 0.9
        psi = torch.tensor([r[f"cgsv_psi/{i}"] for i in range(4)], dtype=torch.float64)
        phi = torch.tensor([r[f"cgsv_shapley/{i}"] for i in range(4)], dtype=torch.float64)
        assert r["cgsv_shapley_pearson"] == pytest.approx(float(pearson(psi, phi)), abs=1e-4)
        assert r["cgsv_shapley_l1"] == pytest.approx(((psi / psi.sum()) - phi).abs().sum().item(), abs=1e-4)


@pytest.mark.parametrize("bad, message", [(dict(shapley_check_every=-1), "shapley_check_every"),
                                          (dict(shapley_permutations=0), "shapley_permutations")])
def test_bad_values_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        CGSV(**bad)
