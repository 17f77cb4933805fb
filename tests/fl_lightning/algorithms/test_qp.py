"""Tests of fl_lightning.algorithms.qp: min-norm QPs over the simplex (and FedMGDA+'s box)."""

from __future__ import annotations

import itertools
import math
import warnings

import cvxopt
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fl_lightning.algorithms.qp import (
    QPResult,
    batched_min_norm_simplex,
    box_around,
    min_norm,
    min_norm_simplex,
    simplex_projection,
    torch_solver,
)

SOLVERS = ["cvxopt", "torch"]
# (violation / max|G|, weight counted as active) per solver: cvxopt's interior point leaves up
# to ~3e-4 of weight on coordinates that should be 0 (objective still within 1e-7 · max|G|);
# the torch solver certifies suboptimality ≤ 1e-8 · max|G| and is exact on its face.
KKT = {"cvxopt": {"tol": 1e-5, "active": 1e-3}, "torch": {"tol": 1e-7, "active": 1e-4}}
F64 = torch.float64


def gram_of(vectors) -> torch.Tensor:
    v = torch.as_tensor(vectors, dtype=F64)
    return v @ v.T


def random_gram(generator: torch.Generator, n: int, d: int, spread: float = 0.0) -> torch.Tensor:
    """Gram of n random vectors in d dims (rank-deficient when n > d), norms over 10^±spread."""
    vectors = torch.randn(n, d, generator=generator, dtype=F64)
    vectors = vectors * torch.logspace(-spread, spread, n, dtype=F64)[:, None]
    return vectors @ vectors.T


def assert_feasible(weights, lower=None, upper=None, atol=1e-12):
    assert torch.isfinite(weights).all()
    assert abs(weights.sum().item() - 1) <= 1e-9
    assert (weights >= -atol).all()
    if lower is not None:
        assert (weights >= lower.to(weights) - atol).all()
        assert (weights <= upper.to(weights) + atol).all()


def assert_kkt(gram, weights, lower=None, upper=None, tol=1e-7, active=1e-4):
    """KKT of min λᵀGλ on the simplex ∩ box, as "no mass transfer helps".

    With g = Gλ: moving mass from j (λ_j above its lower bound) to k (λ_k below its upper
    bound) changes the objective at rate 2(g_k − g_j), so at the optimum
    max{g_j : λ_j > lower_j} ≤ min{g_k : λ_k < upper_k}. Without a box this is
    (Gλ)_k ≥ λᵀGλ for all k, with equality on the support of λ. Violations may be
    ``tol`` · max|G|; weights within ``active`` of a bound count as on it. An objective
    ≤ tol · max|G| is optimal to tol whatever g is, since f* ≥ 0.
    """
    scale = gram.abs().max().item()
    weights = weights.to(F64)
    g = gram @ weights
    objective = weights @ gram @ weights
    if objective <= tol * scale:
        return  # optimal to tol since f* >= 0 (0 in the hull: every λ with Gλ ≈ 0 is optimal)
    lower = torch.zeros_like(weights) if lower is None else lower.to(F64)
    upper = torch.ones_like(weights) if upper is None else upper.to(F64)
    can_give = weights > lower + active
    can_take = weights < upper - active
    if can_give.any() and can_take.any():
        assert g[can_give].max() <= g[can_take].min() + tol * scale
    if lower.sum() == 0 and (upper == 1).all():
        assert (g >= objective - tol * scale).all()
        assert ((g[can_give] - objective).abs() <= tol * scale).all()


# --------------------------------------------------------------------------- known answers


@pytest.mark.parametrize("solver", SOLVERS)
def test_orthogonal_unit_vectors_get_equal_weights(solver):
    result = min_norm_simplex(gram_of([[1.0, 0.0], [0.0, 1.0]]), solver=solver)
    assert isinstance(result, QPResult)
    assert result.status == "optimal" and result.fallback is None
    assert torch.allclose(result.weights, torch.tensor([0.5, 0.5], dtype=F64), atol=1e-7)
    assert result.objective == pytest.approx(0.5, abs=1e-7)


@pytest.mark.parametrize("solver", SOLVERS)
def test_shorter_parallel_vector_takes_all_weight(solver):
    result = min_norm_simplex(gram_of([[1.0, 0.0], [2.0, 0.0]]), solver=solver)
    # cvxopt is an interior-point method: an inactive weight comes out around 1e-7, not 0
    assert torch.allclose(result.weights, torch.tensor([1.0, 0.0], dtype=F64), atol=1e-6)
    assert result.objective == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("solver", SOLVERS)
def test_opposite_vectors_reach_zero(solver):
    result = min_norm_simplex(gram_of([[1.0, 0.0], [-2.0, 0.0]]), solver=solver)
    assert result.objective == pytest.approx(0.0, abs=1e-7)
    assert torch.allclose(result.weights, torch.tensor([2 / 3, 1 / 3], dtype=F64), atol=1e-6)


FEDLF_CLIENTS = torch.tensor([[-1.0, 0.5, 0.0], [0.8, -1.0, 0.0], [1.0, 1.0, -1.0]], dtype=F64)


@pytest.mark.parametrize("solver", SOLVERS)
def test_fedlf_three_clients_min_norm_point_is_a_common_ascent_direction(solver):
    """fedlf_appendix.md Fig. 1: d* = Σλ g_i has d*·g_i ≥ ||d*||² > 0, so −d* descends for all."""
    gram = FEDLF_CLIENTS @ FEDLF_CLIENTS.T
    result = min_norm_simplex(gram, solver=solver)
    d = result.weights @ FEDLF_CLIENTS
    assert (d @ d).item() > 0.01
    assert (FEDLF_CLIENTS @ d >= (d @ d) - 1e-7).all()
    # Full support, so λ ∝ G⁻¹1 and the objective is 1 / (1ᵀG⁻¹1).
    exact = 1 / torch.linalg.solve(gram, torch.ones(3, dtype=F64)).sum()
    assert result.objective == pytest.approx(exact.item(), rel=1e-6)
    # What the paper contrasts it with (algorithms.md): the mean conflicts with client 1,
    # FedMGDA+ with ε = 0.1 around uniform weights with clients 1 and 2.
    assert (FEDLF_CLIENTS @ FEDLF_CLIENTS.mean(0))[0] < 0
    lower, upper = box_around(torch.full((3,), 1 / 3, dtype=F64), 0.1)
    boxed = min_norm_simplex(gram, lower, upper, solver=solver).weights @ FEDLF_CLIENTS
    assert ((FEDLF_CLIENTS @ boxed) < 0).tolist() == [True, True, False]


# --------------------------------------------------------------------------- KKT on random problems


@pytest.mark.parametrize("solver", SOLVERS)
def test_kkt_holds_on_random_grams(solver):
    generator = torch.Generator().manual_seed(0)
    for n, d in [(2, 5), (5, 3), (8, 100), (15, 4), (25, 25), (40, 10), (60, 2)]:
        gram = random_gram(generator, n, d)
        result = min_norm_simplex(gram, solver=solver)
        assert_feasible(result.weights)
        assert_kkt(gram, result.weights, **KKT[solver])
        assert result.objective == pytest.approx(
            (result.weights @ gram @ result.weights).item(), abs=1e-12
        )


def test_vectors_of_very_different_norms():
    """Norms over 10^±1.5 (G over 10^±3): cvxopt's objective is accurate to its tolerance
    (1e-7 of max|G|) though its weights may not be; the torch solver is exact on both."""
    generator = torch.Generator().manual_seed(17)
    for n, d in [(8, 100), (25, 25), (40, 5)]:
        gram = random_gram(generator, n, d, spread=1.5)
        by_cvxopt = min_norm_simplex(gram, solver="cvxopt")
        by_torch = min_norm_simplex(gram, solver="torch")
        assert_kkt(gram, by_torch.weights, tol=1e-7)
        scale = gram.abs().max().item()
        assert by_torch.objective <= by_cvxopt.objective + 1e-9 * scale
        assert by_cvxopt.objective == pytest.approx(by_torch.objective, abs=1e-6 * scale)


@pytest.mark.parametrize("solver", SOLVERS)
def test_kkt_holds_in_the_box(solver):
    generator = torch.Generator().manual_seed(1)
    for n, d, epsilon in [(3, 2, 0.05), (6, 10, 0.1), (10, 4, 0.2), (20, 50, 0.03), (30, 8, 0.5)]:
        gram = random_gram(generator, n, d)
        center = torch.rand(n, generator=generator, dtype=F64) + 0.2
        center = center / center.sum()
        lower, upper = box_around(center, epsilon)
        result = min_norm_simplex(gram, lower, upper, solver=solver)
        assert_feasible(result.weights, lower, upper)
        assert_kkt(gram, result.weights, lower, upper, **KKT[solver])


def test_cvxopt_and_torch_solvers_agree_with_the_box():
    generator = torch.Generator().manual_seed(2)
    for n in [4, 12, 30]:
        gram = random_gram(generator, n, 6, spread=0.5)
        lower, upper = box_around(torch.full((n,), 1 / n, dtype=F64), 0.5 / n)
        by_cvxopt = min_norm_simplex(gram, lower, upper, solver="cvxopt")
        by_torch = min_norm_simplex(gram, lower, upper, solver="torch")
        scale = gram.abs().max().item()
        assert by_cvxopt.objective == pytest.approx(by_torch.objective, abs=1e-6 * scale)


# --------------------------------------------------------------------------- batched solver


def test_batched_agrees_with_cvxopt_on_60_problems_in_one_call():
    """Sizes 2..30 in one (60, 30, 30) call: a k-problem is padded to 30 by repeating its
    first vector, which leaves the convex hull, and so the min norm, unchanged."""
    generator = torch.Generator().manual_seed(3)
    padded, expected = [], []
    for index in range(60):
        k = 2 + index % 29
        d = [2, 5, 50][index % 3]  # d = 2, 5 make most grams rank-deficient (k > d)
        gram = random_gram(generator, k, d, spread=[0.0, 1.0][index % 2])
        expected.append(min_norm_simplex(gram).objective / gram.abs().max().item())
        repeat = torch.cat([torch.arange(k), torch.zeros(30 - k, dtype=torch.long)])
        padded.append(gram[repeat][:, repeat])
    grams = torch.stack(padded)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        weights = batched_min_norm_simplex(grams)
    assert weights.shape == (60, 30) and weights.dtype == F64
    for b in range(60):
        assert_feasible(weights[b])
        assert_kkt(grams[b], weights[b], tol=1e-7)
        objective = (weights[b] @ grams[b] @ weights[b]).item() / grams[b].abs().max().item()
        assert objective == pytest.approx(expected[b], abs=1e-5)
        assert objective <= expected[b] + 1e-7  # at least as good as cvxopt's interior point


def test_batched_solver_converges_within_a_few_hundred_iterations():
    generator = torch.Generator().manual_seed(4)
    for n, d, spread in [(10, 3, 0), (30, 30, 1), (50, 10, 1.5), (50, 1000, 0)]:
        grams = torch.stack([random_gram(generator, n, d, spread) for _ in range(20)])
        solve = torch_solver._accelerated_projected_gradient(grams)
        assert solve.iterations <= 300
        assert (solve.gap <= 1e-8).all()


def test_dropping_finished_problems_changes_no_bit():
    """Problems that finish at different checks leave the batch (down to one left); every
    answer, gap and the iteration count equal those of the batch that keeps them all."""
    generator = torch.Generator().manual_seed(9)
    grams = torch.stack([random_gram(generator, 101, d, spread) for d, spread in
                         itertools.product([3, 60, 100, 400], [0.0, 1.0, 1.5])])
    kept = torch_solver._accelerated_projected_gradient(grams, drop_finished=False)
    dropped = torch_solver._accelerated_projected_gradient(grams)
    assert len(set(torch_solver._accelerated_projected_gradient(g[None]).iterations for g in grams)) > 3
    assert torch.equal(dropped.weights, kept.weights)
    assert torch.equal(dropped.gap, kept.gap)
    assert dropped.iterations == kept.iterations


def test_batched_fedlf_layers_float32():
    """FedLF's per-layer QPs: 60 layers x 20 clients, float32 in, float32 out."""
    generator = torch.Generator().manual_seed(5)
    slices = torch.randn(60, 20, 30, generator=generator)
    slices = slices / slices.norm(dim=-1, keepdim=True)  # equal norms, as FedLF rescales them
    grams = slices @ slices.transpose(1, 2)
    weights = batched_min_norm_simplex(grams)
    assert weights.dtype == torch.float32 and weights.shape == (60, 20)
    directions = torch.einsum("bn,bnd->bd", weights.double(), slices.double())
    inner = torch.einsum("bnd,bd->bn", slices.double(), directions)
    squared_norm = (directions**2).sum(-1, keepdim=True)
    assert (inner >= squared_norm - 1e-5).all()  # no layer slice conflicts with its direction


def test_batched_degenerate_inputs():
    zero = batched_min_norm_simplex(torch.zeros(3, 4, 4, dtype=F64))
    assert torch.allclose(zero, torch.full((3, 4), 0.25, dtype=F64))
    single = batched_min_norm_simplex(torch.rand(5, 1, 1, dtype=F64))
    assert torch.equal(single, torch.ones(5, 1, dtype=F64))
    assert batched_min_norm_simplex(torch.zeros(0, 3, 3)).shape == (0, 3)
    mixed = torch.stack([torch.zeros(3, 3, dtype=F64), gram_of([[1, 0], [0, 1], [1, 1]])])
    weights = batched_min_norm_simplex(mixed)
    assert torch.allclose(weights[0], torch.full((3,), 1 / 3, dtype=F64))
    assert torch.allclose(weights[1], torch.tensor([0.5, 0.5, 0.0], dtype=F64), atol=1e-9)


def test_batched_warns_when_out_of_iterations():
    generator = torch.Generator().manual_seed(6)
    grams = torch.stack([random_gram(generator, 30, 3) for _ in range(4)])
    with pytest.warns(RuntimeWarning, match="did not reach"):
        weights = batched_min_norm_simplex(grams, max_iter=1)
    for w in weights:
        assert_feasible(w)


def test_batched_rejects_bad_input():
    with pytest.raises(ValueError, match=r"\(B, n, n\)"):
        batched_min_norm_simplex(torch.eye(3))
    with pytest.raises(ValueError, match="square"):
        batched_min_norm_simplex(torch.zeros(2, 3, 4))
    bad = torch.eye(3).repeat(2, 1, 1)
    bad[1, 0, 0] = math.nan
    with pytest.raises(ValueError, match="NaN or inf"):
        batched_min_norm_simplex(bad)


# --------------------------------------------------------------------------- FedMGDA+'s box


@pytest.mark.parametrize("solver", SOLVERS)
def test_epsilon_zero_returns_the_centre_exactly(solver):
    """FedMGDA+ with ε = 0 is FedAvg(-n) with weights λ0 (fedmgda_plus.md after eq. (25))."""
    center = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=F64)
    gram = random_gram(torch.Generator().manual_seed(7), 4, 3)
    result = min_norm_simplex(gram, *box_around(center, 0.0), solver=solver)
    assert torch.equal(result.weights, center)
    assert result.status == "optimal" and result.fallback is None


@pytest.mark.parametrize("solver", SOLVERS)
def test_epsilon_one_is_the_unboxed_problem(solver):
    center = torch.full((5,), 0.2, dtype=F64)
    gram = random_gram(torch.Generator().manual_seed(8), 5, 3)
    assert box_around(center, 1.0) == (None, None)
    assert box_around(center, 3.0) == (None, None)
    free = min_norm_simplex(gram, solver=solver)
    trivial_box = min_norm_simplex(
        gram, torch.zeros(5, dtype=F64), torch.ones(5, dtype=F64), solver=solver
    )
    assert trivial_box.objective == pytest.approx(free.objective, abs=1e-7)


def test_box_around_clips_to_unit_interval_and_checks_epsilon():
    lower, upper = box_around(torch.tensor([0.05, 0.95]), 0.1)
    assert torch.allclose(lower, torch.tensor([0.0, 0.85]))
    assert torch.allclose(upper, torch.tensor([0.15, 1.0]))
    with pytest.raises(ValueError, match="epsilon"):
        box_around(torch.tensor([0.5, 0.5]), -0.1)


@pytest.mark.parametrize("solver", SOLVERS)
def test_pinned_and_float32_boxes(solver):
    gram = random_gram(torch.Generator().manual_seed(9), 4, 2)
    # some coordinates fixed (lower == upper), the rest free
    lower = torch.tensor([0.3, 0.0, 0.2, 0.0], dtype=F64)
    upper = torch.tensor([0.3, 1.0, 0.2, 1.0], dtype=F64)
    result = min_norm_simplex(gram, lower, upper, solver=solver)
    assert result.fallback is None
    assert_feasible(result.weights, lower, upper)
    assert result.weights[[0, 2]].tolist() == [0.3, 0.2]
    assert_kkt(gram, result.weights, lower, upper, **KKT[solver])
    # λ0 in float32 sums to 1 only up to rounding: still accepted, still feasible
    center = torch.rand(7, generator=torch.Generator().manual_seed(0)).float()
    center = center / center.sum()
    gram7 = random_gram(torch.Generator().manual_seed(10), 7, 3)
    result = min_norm_simplex(gram7, *box_around(center, 0.0), solver=solver)
    assert torch.allclose(result.weights, center.double(), atol=1e-6)
    assert_feasible(result.weights)


# --------------------------------------------------------------------------- simplex projection


def brute_force_simplex_projection(v: torch.Tensor) -> torch.Tensor:
    """Nearest point of the simplex: the best feasible projection onto the hull of any face."""
    n, best, best_distance = v.numel(), None, math.inf
    for size in range(1, n + 1):
        for support in itertools.combinations(range(n), size):
            idx = list(support)
            point = torch.zeros_like(v)
            point[idx] = v[idx] - (v[idx].sum() - 1) / size
            if (point >= 0).all() and (distance := (point - v).norm().item()) < best_distance:
                best, best_distance = point, distance
    return best


def test_simplex_projection_matches_brute_force():
    generator = torch.Generator().manual_seed(11)
    for n in [1, 2, 3, 4, 5]:
        for _ in range(20):
            v = 2 * torch.randn(n, generator=generator, dtype=F64)
            assert torch.allclose(
                simplex_projection(v), brute_force_simplex_projection(v), atol=1e-12
            )


def test_simplex_projection_is_batched_and_checks_input():
    v = torch.randn(3, 4, 6, generator=torch.Generator().manual_seed(12), dtype=F64)
    projected = simplex_projection(v)
    assert projected.shape == v.shape
    assert torch.allclose(projected, simplex_projection(v.reshape(12, 6)).reshape(3, 4, 6))
    assert torch.allclose(
        simplex_projection(torch.tensor([0.2, 0.3, 0.5])), torch.tensor([0.2, 0.3, 0.5])
    )
    with pytest.raises(ValueError, match="NaN or inf"):
        simplex_projection(torch.tensor([0.5, math.inf]))


finite_vectors = arrays(
    np.float64,
    st.tuples(st.integers(1, 4), st.integers(1, 12)),
    elements=st.floats(-1e3, 1e3, allow_nan=False),
)


@settings(max_examples=50, deadline=None)
@given(finite_vectors)
def test_simplex_projection_properties(array):
    v = torch.from_numpy(array)
    projected = simplex_projection(v)
    assert (projected >= 0).all()
    assert torch.allclose(projected.sum(-1), torch.ones(v.shape[0], dtype=F64), atol=1e-9)
    assert torch.allclose(simplex_projection(projected), projected, atol=1e-9)  # idempotent
    # optimality: (v − p)·(q − p) ≤ 0 for every vertex q of the simplex
    residual = v - projected
    vertex_terms = residual - (residual * projected).sum(-1, keepdim=True)
    assert (vertex_terms <= 1e-9 * (1 + v.abs().max())).all()


# --------------------------------------------------------------------------- failures and fallbacks


def fake_qp_unknown(*args, **kwargs):
    n = args[0].size[0]
    return {"status": "unknown", "x": cvxopt.matrix(np.full(n, 1.0 / n))}


def fake_qp_raises(*args, **kwargs):
    raise ArithmeticError("singular KKT matrix")


def fake_qp_nan(*args, **kwargs):
    n = args[0].size[0]
    return {"status": "optimal", "x": cvxopt.matrix(np.full(n, math.nan))}


@pytest.mark.parametrize("fake", [fake_qp_unknown, fake_qp_raises, fake_qp_nan])
@pytest.mark.parametrize("boxed", [False, True])
def test_cvxopt_failure_falls_back_to_projected_gradient(monkeypatch, fake, boxed):
    gram = random_gram(torch.Generator().manual_seed(13), 6, 3)
    lower, upper = box_around(torch.full((6,), 1 / 6, dtype=F64), 0.1) if boxed else (None, None)
    expected = min_norm_simplex(gram, lower, upper)
    monkeypatch.setattr(cvxopt.solvers, "qp", fake)
    with pytest.warns(RuntimeWarning, match="falling back"):
        result = min_norm_simplex(gram, lower, upper)
    assert result.fallback == "projected_gradient"
    assert result.status != "optimal" and "cvxopt" in result.status
    assert_feasible(result.weights, lower, upper)
    assert result.objective == pytest.approx(expected.objective, abs=1e-6)


def test_double_failure_returns_the_centre(monkeypatch):
    gram = random_gram(torch.Generator().manual_seed(14), 5, 3)
    lower, upper = box_around(torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3], dtype=F64), 0.05)

    def broken_torch_solver(grams, *args, **kwargs):
        nan = torch.full(grams.shape[:2], math.nan, dtype=F64)
        return torch_solver._TorchSolve(weights=nan, gap=torch.full(grams.shape[:1], math.nan), iterations=1)

    monkeypatch.setattr(cvxopt.solvers, "qp", fake_qp_raises)
    monkeypatch.setattr(min_norm, "_accelerated_projected_gradient", broken_torch_solver)
    with pytest.warns(RuntimeWarning):
        result = min_norm_simplex(gram, lower, upper)
    assert result.fallback == "centre"
    assert "non-finite" in result.status
    assert torch.allclose(result.weights, torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3], dtype=F64))
    assert math.isfinite(result.objective)


def test_cvxopt_is_silent_and_global_options_untouched(capsys):
    cvxopt.solvers.options["maxiters"] = 77
    try:
        before = dict(cvxopt.solvers.options)
        min_norm_simplex(random_gram(torch.Generator().manual_seed(15), 8, 4), reltol=1e-7)
        assert cvxopt.solvers.options == before
    finally:
        del cvxopt.solvers.options["maxiters"]
    assert capsys.readouterr().out == ""


# --------------------------------------------------------------------------- errors and degenerate inputs


@pytest.mark.parametrize(
    "gram, message",
    [
        (torch.tensor([[1.0, math.nan], [math.nan, 1.0]]), "NaN or inf"),
        (torch.tensor([[1.0, 0.0], [0.0, math.inf]]), "NaN or inf"),
        (torch.ones(2, 3), "square"),
        (torch.ones(2, 2, 2), "square"),
        (torch.ones(0, 0), "empty"),
    ],
)
def test_invalid_grams_raise(gram, message):
    with pytest.raises(ValueError, match=message):
        min_norm_simplex(gram)


@pytest.mark.parametrize(
    "lower, upper, message",
    [
        ([0.5, 0.4, 0.3], None, "lower bounds sum to 1.2 > 1"),
        (None, [0.3, 0.3, 0.3], "increase the upper bounds"),
        ([0.0, 0.5, 0.0], [1.0, 0.4, 1.0], r"lower > upper .* weights \[1\]"),
        ([0.0, 0.0], None, "one entry per vector"),
    ],
)
def test_infeasible_or_malformed_box_raises(lower, upper, message):
    as_tensor = lambda b: None if b is None else torch.tensor(b, dtype=F64)  # noqa: E731
    with pytest.raises(ValueError, match=message):
        min_norm_simplex(torch.eye(3, dtype=F64), as_tensor(lower), as_tensor(upper))


def test_unknown_solver_raises():
    with pytest.raises(ValueError, match="'cvxopt' or 'torch'"):
        min_norm_simplex(torch.eye(2), solver="gurobi")


@pytest.mark.parametrize("solver", SOLVERS)
def test_degenerate_inputs(solver):
    one = min_norm_simplex(torch.tensor([[4.0]]), solver=solver)
    assert one.weights.tolist() == [1.0] and one.objective == 4.0
    zero = min_norm_simplex(torch.zeros(4, 4), solver=solver)
    assert torch.allclose(zero.weights, torch.full((4,), 0.25)) and zero.objective == 0.0
    assert zero.status == "optimal"
    lower = torch.tensor([0.0, 0.1, 0.2], dtype=F64)
    upper = torch.tensor([0.5, 0.5, 0.6], dtype=F64)
    boxed_zero = min_norm_simplex(torch.zeros(3, 3, dtype=F64), lower, upper, solver=solver)
    assert_feasible(boxed_zero.weights, lower, upper)


def test_dtype_and_device_follow_the_gram():
    gram32 = random_gram(torch.Generator().manual_seed(16), 5, 3).float()
    for solver in SOLVERS:
        result = min_norm_simplex(gram32, solver=solver)
        assert result.weights.dtype == torch.float32 and result.weights.device == gram32.device
        assert isinstance(result.objective, float)


# --------------------------------------------------------------------------- property tests


@st.composite
def psd_grams(draw):
    n = draw(st.integers(1, 12))
    d = draw(st.integers(1, 8))
    vectors = draw(arrays(np.float64, (n, d), elements=st.floats(-100, 100, allow_nan=False)))
    scale = draw(st.sampled_from([1e-6, 1.0, 1e4]))
    v = torch.from_numpy(vectors) * scale
    return v @ v.T


@settings(max_examples=50, deadline=None)
@given(psd_grams(), st.sampled_from(SOLVERS))
def test_any_psd_gram_gives_finite_simplex_weights(gram, solver):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no solver failure on valid input
        result = min_norm_simplex(gram, solver=solver)
    assert_feasible(result.weights)
    assert math.isfinite(result.objective) and result.objective >= -1e-9 * gram.abs().max().item()
    best_vertex = gram.diagonal().min().item()
    assert result.objective <= best_vertex + 1e-6 * gram.abs().max().item()


@settings(max_examples=50, deadline=None)
@given(st.lists(psd_grams(), min_size=1, max_size=4))
def test_batched_any_psd_grams_give_finite_simplex_weights(grams):
    n = grams[0].shape[0]
    batch = torch.stack([g for g in grams if g.shape[0] == n])
    weights = batched_min_norm_simplex(batch)
    assert weights.shape == batch.shape[:2]
    for gram, w in zip(batch, weights):
        assert_feasible(w)
        assert_kkt(gram, w, tol=1e-6)


def test_solve_min_norm_batch_counts_the_qps_stopped_at_max_iter():
    from fl_lightning.algorithms.qp import solve_min_norm_batch

    generator = torch.Generator().manual_seed(3)
    vectors = torch.randn(4, 6, 40, generator=generator, dtype=torch.float64)
    grams = vectors @ vectors.transpose(-1, -2)
    done = solve_min_norm_batch(grams)
    assert done.unconverged == 0 and done.largest_gap <= 1e-8 and done.iterations >= 1
    assert torch.equal(done.weights, batched_min_norm_simplex(grams))
    with pytest.warns(RuntimeWarning, match="of 4 QPs did not reach tol"):
        stopped = solve_min_norm_batch(grams, max_iter=1, tol=1e-14)
    assert 1 <= stopped.unconverged <= 4 and stopped.largest_gap > 1e-14 and stopped.iterations == 1
    assert torch.allclose(stopped.weights.sum(-1), torch.ones(4, dtype=torch.float64))  # feasible
