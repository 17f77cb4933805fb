"""Cosine gradient Shapley values (CGSV paper, Sec. 3.2-3.3): exact, sampled and approximate."""

import itertools
import math

import pytest
import torch

from fl_lightning.metrics import MAX_EXACT_AGENTS, approximate_cgsv, exact_cgsv, sampled_cgsv


def unit_vectors(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(n, d, generator=g, dtype=torch.float64)
    return u / u.norm(dim=1, keepdim=True)


def cgsv_by_permutations(u, r):
    """Eq. (2) transcribed: every order, every agent's gain in cosine to u_N when it joins."""
    n = u.shape[0]
    grand = (r[:, None] * u).sum(0)

    def value(coalition):
        if not coalition:
            return 0.0
        u_s = (r[list(coalition), None] * u[list(coalition)]).sum(0)
        return float(u_s @ grand / (u_s.norm() * grand.norm()))

    phi = [0.0] * n
    for order in itertools.permutations(range(n)):
        for k, i in enumerate(order):
            phi[i] += value(order[: k + 1]) - value(order[:k])
    return torch.tensor(phi, dtype=torch.float64) / math.factorial(n)


def test_exact_cgsv_equals_the_average_over_all_orders():
    g = torch.Generator().manual_seed(1)
    u = torch.randn(5, 7, generator=g, dtype=torch.float64)
    r = torch.rand(5, generator=g, dtype=torch.float64)
    assert torch.allclose(exact_cgsv(u, r), cgsv_by_permutations(u, r), atol=1e-12)


def test_efficiency_symmetry_and_null_player():
    g = torch.Generator().manual_seed(2)
    u = torch.randn(6, 50, generator=g, dtype=torch.float64)
    u[3] = u[1]  # agents 1 and 3 upload the same vector: symmetric (P2)
    u[5] = 0.0  # agent 5 uploads nothing: adds nothing to any coalition (P1)
    phi = exact_cgsv(u)
    # efficiency: the values share out ν(N) − ν(∅) = cos(u_N, u_N) − 0 = 1
    assert phi.sum().item() == pytest.approx(1.0, abs=1e-12)
    assert phi[1].item() == pytest.approx(phi[3].item(), abs=1e-12)
    assert abs(phi[5].item()) < 1e-12


def test_an_opposed_agent_gets_a_negative_value():
    """Sec. 3.2: φ_i < 0 when u_i points against the others."""
    u = torch.tensor([[1.0, 0.2], [1.0, -0.2], [0.9, 0.0], [-1.0, 0.0]], dtype=torch.float64)
    phi = exact_cgsv(u)
    assert phi[3] < 0 < phi[:3].min()


def test_approximation_is_the_cosine_to_the_weighted_grand_update():
    g = torch.Generator().manual_seed(3)
    u = torch.randn(4, 30, generator=g, dtype=torch.float64)
    r = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    grand = r @ u
    expected = torch.nn.functional.cosine_similarity(u, grand.expand_as(u), dim=1)
    assert torch.allclose(approximate_cgsv(u, r), expected, atol=1e-12)
    assert approximate_cgsv(torch.zeros(2, 3)).eq(0).all()  # no direction, no value


def test_sampling_is_reproducible_and_converges_to_the_exact_value():
    u = unit_vectors(6, 64, seed=4)
    exact = exact_cgsv(u)
    first = sampled_cgsv(u, 300, torch.Generator().manual_seed(0))
    again = sampled_cgsv(u, 300, torch.Generator().manual_seed(0))
    assert torch.equal(first, again)
    many = sampled_cgsv(u, 20_000, torch.Generator().manual_seed(1))
    assert (many - exact).abs().max() < 0.01
    assert many.sum().item() == pytest.approx(1.0, abs=1e-9)  # every order shares out exactly ν(N)


@pytest.mark.parametrize("n", [5, 6, 7, 8])
def test_fig1_normalised_approximation_beats_permutation_sampling(n):
    """Fig. 1: on random unit vectors in 1024 dims, normalised ψ is closer (L1) to the exact φ
    than permutation sampling, even when sampling gets 200 orders (far more time than ψ)."""

    def normalised(v):
        return v / v.sum()

    for seed in range(3):
        u = unit_vectors(n, 1024, seed=100 * n + seed)
        phi = normalised(exact_cgsv(u))
        psi_error = (normalised(approximate_cgsv(u)) - phi).abs().sum()
        sampled = normalised(sampled_cgsv(u, 200, torch.Generator().manual_seed(seed)))
        sampling_error = (sampled - phi).abs().sum()
        assert psi_error < 0.01
        assert psi_error < sampling_error


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="sampled_cgsv"):
        exact_cgsv(torch.randn(MAX_EXACT_AGENTS + 1, 3))
    with pytest.raises(ValueError, match="one entry per agent"):
        exact_cgsv(torch.randn(3, 4), torch.ones(2))
    with pytest.raises(ValueError, match="num_permutations"):
        sampled_cgsv(torch.randn(3, 4), 0)
    with pytest.raises(ValueError, match=r"\(N, d\)"):
        approximate_cgsv(torch.randn(4))
