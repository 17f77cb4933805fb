"""Seed statistics without scipy: Welch's t-test and the Student t distribution it needs.

The two-sided p-value of a t statistic with ``df`` degrees of freedom is the regularized
incomplete beta function ``I_x(df/2, 1/2)`` at ``x = df / (df + t²)``; ``I_x(a, b)`` is evaluated
with its continued fraction (modified Lentz), using the symmetry ``I_x(a, b) = 1 - I_{1-x}(b, a)``
where the fraction converges slowly.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

SIGNIFICANCE = 0.05  # a difference is "beyond seed noise" when Welch's two-sided p is below this
MIN_SEEDS = 2  # fewer seeds in either row: no variance, so no test and no verdict

_TINY = 1e-300
_EPSILON = 1e-15
_MAX_TERMS = 10_000


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (without its prefactor), by the modified Lentz method."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    fraction = d
    for m in range(1, _MAX_TERMS + 1):
        # even step: d_{2m} = m (b - m) x / ((a + 2m - 1)(a + 2m))
        numerator = m * (b - m) * x / ((a + 2 * m - 1.0) * (a + 2 * m))
        d = 1.0 + numerator * d
        c = 1.0 + numerator / c
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = c if abs(c) > _TINY else _TINY
        fraction *= d * c
        # odd step: d_{2m+1} = -(a + m)(a + b + m) x / ((a + 2m)(a + 2m + 1))
        numerator = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1.0))
        d = 1.0 + numerator * d
        c = 1.0 + numerator / c
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = c if abs(c) > _TINY else _TINY
        step = d * c
        fraction *= step
        if abs(step - 1.0) < _EPSILON:
            return fraction
    raise ArithmeticError(f"the incomplete beta continued fraction did not converge (a={a}, b={b}, x={x})")


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) = B(x; a, b) / B(a, b) for a, b > 0 and 0 <= x <= 1."""
    if a <= 0 or b <= 0:
        raise ValueError(f"the incomplete beta needs a > 0 and b > 0, got a={a}, b={b}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"the incomplete beta needs 0 <= x <= 1, got x={x}")
    if x in (0.0, 1.0):
        return x
    log_prefactor = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                     + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_prefactor) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_prefactor) * _beta_continued_fraction(b, a, 1.0 - x) / b


def student_t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t distribution with ``df`` (> 0, may be fractional) degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be positive, got {df}")
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    return min(1.0, regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t * t)))


@dataclass(frozen=True)
class WelchResult:
    t: float
    df: float
    p: float  # two-sided


def welch_test(first: Sequence[float], second: Sequence[float]) -> WelchResult | None:
    """Welch's unequal-variance t-test of two samples (two-sided); None with fewer than two values
    in either sample. Two samples without spread are separated exactly when their means differ."""
    if len(first) < MIN_SEEDS or len(second) < MIN_SEEDS:
        return None
    mean_1, mean_2 = statistics.fmean(first), statistics.fmean(second)
    se2_1 = statistics.variance(first) / len(first)
    se2_2 = statistics.variance(second) / len(second)
    difference = mean_1 - mean_2
    if se2_1 + se2_2 == 0.0:
        separated = not math.isclose(mean_1, mean_2, rel_tol=1e-12, abs_tol=1e-15)
        return WelchResult(math.copysign(math.inf, difference) if separated else 0.0, math.inf,
                           0.0 if separated else 1.0)
    t = difference / math.sqrt(se2_1 + se2_2)
    df = (se2_1 + se2_2) ** 2 / (se2_1**2 / (len(first) - 1) + se2_2**2 / (len(second) - 1))
    return WelchResult(t, df, student_t_two_sided_p(t, df))


def separated(first: Sequence[float], second: Sequence[float], alpha: float = SIGNIFICANCE) -> bool:
    """Whether two rows' per-seed values differ beyond seed noise (Welch p < alpha)."""
    result = welch_test(first, second)
    return result is not None and result.p < alpha
