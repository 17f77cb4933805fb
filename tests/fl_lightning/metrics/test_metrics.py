"""Tests of fl_lightning.metrics.fairness against hand-computed values and properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fl_lightning.metrics import (
    SUMMARY_KEYS,
    best_fraction,
    fairness_summary,
    fedlf_angle,
    jain_index,
    mean,
    pearson,
    std,
    variance,
    worst_fraction,
)

FOUR = [0.2, 0.4, 0.6, 0.8]
# 20 clients in no particular order: lowest 0.10, 0.15; highest 1.00, 0.99
TWENTY = [
    0.30,
    0.95,
    0.55,
    0.10,
    0.80,
    0.65,
    0.90,
    0.45,
    0.70,
    0.25,
    0.85,
    0.60,
    0.35,
    0.75,
    0.50,
    0.40,
    1.00,
    0.20,
    0.15,
    0.99,
]


def f64(values):
    return torch.tensor(values, dtype=torch.float64)


# --------------------------------------------------------------------------- hand-computed


def test_four_clients_by_hand():
    a = f64(FOUR)
    assert float(mean(a)) == pytest.approx(0.5)
    # deviations -0.3, -0.1, 0.1, 0.3 -> squares sum to 0.2, over K = 4 (population)
    assert float(variance(a)) == pytest.approx(0.05)
    assert float(std(a)) == pytest.approx(math.sqrt(0.05))
    # ceil(0.05 * 4) = ceil(0.1 * 4) = 1 client; ceil(0.5 * 4) = 2; ceil(0.26 * 4) = ceil(1.04) = 2
    assert float(worst_fraction(a, 0.05)) == pytest.approx(0.2)
    assert float(best_fraction(a, 0.05)) == pytest.approx(0.8)
    assert float(worst_fraction(a, 0.10)) == pytest.approx(0.2)
    assert float(worst_fraction(a, 0.5)) == pytest.approx(0.3)
    assert float(best_fraction(a, 0.5)) == pytest.approx(0.7)
    assert float(worst_fraction(a, 0.26)) == pytest.approx(0.3)
    assert float(worst_fraction(a, 1.0)) == pytest.approx(0.5)
    # sum = 2.0, sum of squares = 0.04 + 0.16 + 0.36 + 0.64 = 1.2
    assert float(jain_index(a)) == pytest.approx(2.0**2 / (4 * 1.2))
    assert float(jain_index(a)) == pytest.approx(5 / 6)
    # cos = 2.0 / (sqrt(1.2) * sqrt(4)); also tan(angle) = std / mean = sqrt(0.05) / 0.5
    assert float(fedlf_angle(a)) == pytest.approx(math.acos(2.0 / (math.sqrt(1.2) * 2.0)))
    assert float(fedlf_angle(a)) == pytest.approx(math.atan(math.sqrt(0.05) / 0.5))


def test_twenty_clients_by_hand():
    a = f64(TWENTY)
    k = len(TWENTY)
    total = sum(TWENTY)
    squares = sum(v * v for v in TWENTY)
    avg = total / k
    assert float(mean(a)) == pytest.approx(avg)
    assert float(variance(a)) == pytest.approx(squares / k - avg**2)
    # 5% of 20 = 1 client: the single lowest / highest; 10% = 2 clients
    assert float(worst_fraction(a, 0.05)) == pytest.approx(0.10)
    assert float(best_fraction(a, 0.05)) == pytest.approx(1.00)
    assert float(worst_fraction(a, 0.10)) == pytest.approx((0.10 + 0.15) / 2)
    assert float(best_fraction(a, 0.10)) == pytest.approx((1.00 + 0.99) / 2)
    assert float(jain_index(a)) == pytest.approx(total**2 / (k * squares))
    assert float(fedlf_angle(a)) == pytest.approx(
        math.acos(total / (math.sqrt(squares) * math.sqrt(k)))
    )


def test_fraction_count_ignores_float_noise():
    # 0.07 * 100 = 7.000000000000001 in floating point: still the 7 lowest, not 8
    a = f64(list(range(100)))
    assert float(worst_fraction(a, 0.07)) == pytest.approx(sum(range(7)) / 7)
    assert float(best_fraction(a, 0.07)) == pytest.approx(sum(range(93, 100)) / 7)


def test_summary_keys_and_values():
    summary = fairness_summary(f64(TWENTY), prefix="test_acc_")
    assert list(summary) == [f"test_acc_{key}" for key in SUMMARY_KEYS]
    assert set(SUMMARY_KEYS) == {
        "mean",
        "std",
        "var",
        "min",
        "max",
        "worst5",
        "best5",
        "worst10",
        "best10",
        "angle",
        "jain",
    }
    assert all(isinstance(v, float) for v in summary.values())
    assert summary["test_acc_min"] == pytest.approx(0.10)
    assert summary["test_acc_max"] == pytest.approx(1.00)
    assert summary["test_acc_worst5"] == pytest.approx(0.10)
    assert summary["test_acc_worst10"] == pytest.approx(0.125)
    assert summary["test_acc_best10"] == pytest.approx(0.995)
    assert summary["test_acc_std"] == pytest.approx(float(np.std(TWENTY)))
    assert summary["test_acc_var"] == pytest.approx(float(np.var(TWENTY)))
    assert list(fairness_summary(FOUR)) == list(SUMMARY_KEYS)


def test_accepts_lists_ints_and_float32():
    assert float(mean([1, 2, 3])) == pytest.approx(2.0)
    assert mean(torch.tensor([1, 2, 3])).is_floating_point()
    assert mean(torch.tensor(FOUR, dtype=torch.float32)).dtype == torch.float32
    assert mean(f64(FOUR)).dtype == torch.float64


# --------------------------------------------------------------------------- edge cases


def test_one_client():
    s = fairness_summary([0.7])
    assert s["mean"] == pytest.approx(0.7)
    assert s["std"] == 0.0 and s["var"] == 0.0
    assert s["worst5"] == s["best5"] == s["worst10"] == s["best10"] == pytest.approx(0.7)
    assert s["angle"] == pytest.approx(0.0, abs=1e-7)
    assert s["jain"] == pytest.approx(1.0)


@pytest.mark.parametrize("value", [0.5, 0.1, 0.93, 3.0])
def test_all_equal(value):
    a = torch.full((10,), value)
    assert float(std(a)) == pytest.approx(0.0, abs=1e-6)
    assert float(fedlf_angle(a)) == pytest.approx(0.0, abs=1e-6)
    assert float(jain_index(a)) == pytest.approx(1.0, abs=1e-6)
    assert float(worst_fraction(a, 0.1)) == pytest.approx(value)


def test_all_zero_is_defined():
    a = torch.zeros(8)
    assert float(fedlf_angle(a)) == 0.0  # defined: all clients are equal
    assert float(jain_index(a)) == 1.0  # defined: all clients are equal
    assert float(std(a)) == 0.0
    s = fairness_summary(a)
    assert all(math.isfinite(v) for v in s.values())


def test_one_client_has_everything():
    a = f64([0.0, 0.0, 0.0, 1.0])
    assert float(jain_index(a)) == pytest.approx(1 / 4)
    # angle between e_4 and the ones vector: arccos(1 / 2)
    assert float(fedlf_angle(a)) == pytest.approx(math.pi / 3)


def test_nan_names_the_clients():
    with pytest.raises(ValueError, match=r"NaN for clients \[1, 3\]"):
        fairness_summary([0.5, float("nan"), 0.2, float("nan")])
    with pytest.raises(ValueError, match=r"NaN for clients \[0\]"):
        mean(torch.tensor([float("nan"), 1.0]))
    with pytest.raises(ValueError, match=r"infinite for clients \[2\]"):
        jain_index([0.1, 0.2, float("inf")])
    with pytest.raises(ValueError, match="clients"):
        pearson([0.1, float("nan")], [0.2, 0.3])


def test_bad_shapes_and_fractions():
    with pytest.raises(ValueError, match="1-D"):
        mean(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="empty"):
        mean(torch.zeros(0))
    for fraction in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="fraction"):
            worst_fraction(FOUR, fraction)


def test_angle_is_differentiable():
    a = torch.tensor([0.3, 0.5, 0.9, 0.4], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fedlf_angle, (a,))
    assert torch.autograd.gradcheck(jain_index, (a,))


# --------------------------------------------------------------------------- pearson


@pytest.mark.parametrize("seed", range(5))
def test_pearson_matches_numpy(seed):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=12), rng.normal(size=12)
    y = y + seed * 0.3 * x  # from uncorrelated to strongly correlated
    assert float(pearson(torch.from_numpy(x), torch.from_numpy(y))) == pytest.approx(
        np.corrcoef(x, y)[0, 1], abs=1e-12
    )


def test_pearson_perfect_and_scaled():
    x = f64([1.0, 2.0, 3.0, 4.0])
    assert float(pearson(x, 2 * x + 1)) == pytest.approx(1.0)
    assert float(pearson(x, -x)) == pytest.approx(-1.0)
    assert float(pearson(x, torch.tensor([1, 2, 3, 4]))) == pytest.approx(1.0)


def test_pearson_constant_is_nan_with_reason():
    with pytest.warns(RuntimeWarning, match="y is constant"):
        assert math.isnan(float(pearson([0.1, 0.2, 0.3], [0.5, 0.5, 0.5])))
    with pytest.warns(RuntimeWarning, match="x and y are constant"):
        assert math.isnan(float(pearson([0.1, 0.1], [0.5, 0.5])))
    with pytest.warns(RuntimeWarning, match="at least 2 clients"):
        assert math.isnan(float(pearson([0.1], [0.5])))
    with pytest.raises(ValueError, match="one value per client"):
        pearson([0.1, 0.2], [0.1, 0.2, 0.3])


# --------------------------------------------------------------------------- properties

accuracies = st.lists(
    st.floats(min_value=0.0, max_value=1.0, allow_nan=False), min_size=1, max_size=120
)
fractions = st.floats(min_value=1e-3, max_value=1.0)


@settings(max_examples=150, deadline=None)
@given(accuracies)
def test_jain_between_one_over_k_and_one(values):
    jain = float(jain_index(f64(values)))
    assert 1 / len(values) - 1e-9 <= jain <= 1 + 1e-9


@settings(max_examples=150, deadline=None)
@given(accuracies)
def test_angle_between_zero_and_right_angle(values):
    angle = float(fedlf_angle(f64(values)))
    assert -1e-12 <= angle <= math.pi / 2 + 1e-9


@settings(max_examples=150, deadline=None)
@given(accuracies, fractions)
def test_worst_mean_best_ordering(values, fraction):
    a = f64(values)
    worst, avg, best = (
        float(worst_fraction(a, fraction)),
        float(mean(a)),
        float(best_fraction(a, fraction)),
    )
    assert min(values) - 1e-12 <= worst <= avg + 1e-12
    assert avg - 1e-12 <= best <= max(values) + 1e-12
    assert float(worst_fraction(a, 0.05)) <= float(worst_fraction(a, 0.10)) + 1e-12


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(min_value=0.01, max_value=1.0), min_size=2, max_size=120))
def test_angle_and_jain_identities(values):
    # independent of the definitions: tan(angle) = std / mean, jain = mean^2 / (mean^2 + var)
    avg, var = float(np.mean(values)), float(np.var(values))
    assert float(fedlf_angle(f64(values))) == pytest.approx(
        math.atan(math.sqrt(var) / avg), abs=1e-9
    )
    assert float(jain_index(f64(values))) == pytest.approx(avg**2 / (avg**2 + var), abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=-10, max_value=10), min_size=3, max_size=50), st.randoms())
def test_pearson_property_matches_numpy(values, rnd):
    other = [v * rnd.uniform(-1, 1) + rnd.uniform(-1, 1) for v in values]
    x, y = np.array(values), np.array(other)
    if np.ptp(x) < 1e-6 or np.ptp(y) < 1e-6:
        return  # constant (or nearly) vectors: covered by the nan test
    r = float(pearson(torch.from_numpy(x), torch.from_numpy(y)))
    assert -1.0 <= r <= 1.0
    assert r == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-6)
