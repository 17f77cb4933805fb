"""Seed statistics on scipy: Welch's t-test (Welch 1947) between two rows' seeds, the paired
t-test (Student 1908) over the seeds two rows share, Holm's step-down correction (Holm 1979),
two one-sided tests for equivalence (TOST, Schuirmann 1987) and the power of the t-test from
the noncentral t distribution (the minimum detectable effect).
"""

from __future__ import annotations

import math
import statistics
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy import optimize
from scipy import stats as sps

SIGNIFICANCE = 0.05  # a difference is "beyond seed noise" when the two-sided p is below this
MIN_SEEDS = 2  # fewer seeds in either row: no variance, so no Welch test and no verdict
PAIRED_MIN_SEEDS = 3  # fewer common seeds: verdict "too few seeds", no paired test

REPRODUCED, CONTRADICTED, INCONCLUSIVE, TOO_FEW = "reproduced", "contradicted", "inconclusive", "too few seeds"
DIRECTIONS = ("greater", "less", "equal")


# --- Welch's test between two rows -----------------------------------------------------------

@dataclass(frozen=True)
class WelchResult:
    t: float
    df: float
    p: float  # two-sided


def welch_test(first: Sequence[float], second: Sequence[float]) -> WelchResult | None:
    """Welch's unequal-variance t-test (Welch 1947), two-sided; None with fewer than MIN_SEEDS
    values in either sample. Two samples without spread are separated exactly when their means differ."""
    if len(first) < MIN_SEEDS or len(second) < MIN_SEEDS:
        return None
    if statistics.variance(first) == 0.0 and statistics.variance(second) == 0.0:  # exact (rational) sums
        difference = statistics.fmean(first) - statistics.fmean(second)
        apart = not math.isclose(statistics.fmean(first), statistics.fmean(second), rel_tol=1e-12, abs_tol=1e-15)
        return WelchResult(math.copysign(math.inf, difference) if apart else 0.0, math.inf, 0.0 if apart else 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # near-constant samples: scipy's precision note
        result = sps.ttest_ind(first, second, equal_var=False)
    return WelchResult(float(result.statistic), float(result.df), float(result.pvalue))


def separated(first: Sequence[float], second: Sequence[float], alpha: float = SIGNIFICANCE) -> bool:
    """Whether two rows' per-seed values differ beyond seed noise (Welch p < alpha)."""
    result = welch_test(first, second)
    return result is not None and result.p < alpha


# --- paired statistics -----------------------------------------------------------------------

@dataclass(frozen=True)
class PairedResult:
    """One paired comparison of a claim's family, decided (see ``decide``)."""

    n: int  # pairs (seeds present in both)
    mean: float  # mean of treatment - baseline (NaN when n == 0)
    sd: float | None  # sample std (ddof=1) of the differences, None when n < 2
    low: float | None  # confidence interval of the mean difference at `level` (None: too few seeds)
    high: float | None
    level: float  # confidence level of [low, high]: Holm's step level for this comparison's rank
    p: float | None  # raw p: two-sided paired t (greater/less), TOST p (equal)
    p_holm: float | None  # Holm-adjusted p within the claim's family
    verdict: str  # REPRODUCED, CONTRADICTED, INCONCLUSIVE or TOO_FEW
    mde: float | None  # smallest |true mean difference| detected with `power` at two-sided 1 - level


def _seed_key(seed: str) -> tuple:
    return (0, int(seed), "") if seed.lstrip("-").isdigit() else (1, 0, seed)


def _missing(value: float | None) -> bool:
    return value is None or math.isnan(value)


def paired_differences(treatment: Mapping[str, float], baseline: Mapping[str, float]) -> list[float]:
    """Differences treatment[s] - baseline[s] for the seeds s present in both, in sorted seed order
    (integer seeds numerically first); NaN values dropped."""
    common = sorted(set(treatment) & set(baseline), key=_seed_key)
    return [treatment[s] - baseline[s] for s in common if not (_missing(treatment[s]) or _missing(baseline[s]))]


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm (1979) step-down adjusted p-values, monotone, capped at 1, in the input order."""
    if any(not 0.0 <= p <= 1.0 for p in p_values):  # NaN fails too
        raise ValueError(f"p-values must lie in [0, 1], got {list(p_values)}")
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def _t_p(differences: Sequence[float], popmean: float, alternative: str) -> float:
    """p of the one-sample t-test of the differences (sd > 0) against popmean."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # near-constant samples: scipy's precision note
        return float(sps.ttest_1samp(differences, popmean, alternative=alternative).pvalue)


def paired_p(differences: Sequence[float]) -> float | None:
    """Two-sided paired t-test p of per-seed differences (Student 1908); None with fewer than
    PAIRED_MIN_SEEDS pairs. Without spread: 0 for a nonzero mean, 1 for a zero mean."""
    if len(differences) < PAIRED_MIN_SEEDS:
        return None
    if statistics.stdev(differences) == 0.0:
        return 0.0 if statistics.mean(differences) != 0.0 else 1.0
    return _t_p(differences, 0.0, "two-sided")


def p_between(first: Sequence[float], second: Sequence[float],
              first_seeds: Sequence[str] = (), second_seeds: Sequence[str] = ()) -> float | None:
    """Two-sided p between two rows' per-seed values: the paired t-test over the seeds both share
    when there are at least PAIRED_MIN_SEEDS (a shared seed effect cancels), else Welch's test
    (None with fewer than MIN_SEEDS values in either). Seeds align with the values; none: Welch."""
    if len(first_seeds) == len(first) and len(second_seeds) == len(second):
        differences = paired_differences(dict(zip(first_seeds, first)), dict(zip(second_seeds, second)))
        if len(differences) >= PAIRED_MIN_SEEDS:
            return paired_p(differences)
    result = welch_test(first, second)
    return None if result is None else result.p


def _tost_p(differences: Sequence[float], mean: float, sd: float, margin: float) -> float:
    """TOST p (Schuirmann 1987): the larger one-sided p against -margin and +margin."""
    if sd == 0.0:
        return 0.0 if abs(mean) < margin else 1.0
    return max(_t_p(differences, -margin, "greater"), _t_p(differences, margin, "less"))


def _interval(mean: float, sd: float, n: int, level: float) -> tuple[float, float]:
    """The t-interval of the mean at confidence ``level``."""
    half = float(sps.t.ppf(0.5 + level / 2.0, n - 1)) * sd / math.sqrt(n) if sd > 0.0 else 0.0
    return mean - half, mean + half


def minimum_detectable_effect(n: int, sd: float, alpha: float, power: float = 0.8) -> float:
    """Smallest true mean difference d > 0 at which the two-sided one-sample (paired) t-test at
    significance ``alpha`` with n pairs and this sd reaches ``power`` (noncentral t)."""
    if n < 2:
        raise ValueError(f"the minimum detectable effect needs n >= 2, got {n}")
    if not 0.0 < alpha < power < 1.0:
        raise ValueError(f"need 0 < alpha < power < 1, got alpha={alpha}, power={power}")
    if sd == 0.0:
        return 0.0
    df = n - 1
    critical = float(sps.t.ppf(1.0 - alpha / 2.0, df))

    def shortfall(ncp: float) -> float:  # lower tail as sf at -ncp: scipy's nct.cdf far out can be NaN
        return float(sps.nct.sf(critical, df, ncp) + sps.nct.sf(critical, df, -ncp)) - power

    high = max(1.0, critical)
    while shortfall(high) < 0.0:
        high *= 2.0
    ncp = optimize.brentq(shortfall, 0.0, high, xtol=1e-12)
    return ncp * sd / math.sqrt(n)


def decide(differences: Sequence[Sequence[float]], direction: str, margin: float = 0.0,
           alpha: float = 0.05, power: float = 0.8) -> list[PairedResult]:
    """One claim's family of paired comparisons (each a list of per-seed differences treatment -
    baseline), in the input order. direction: "greater" (paper says treatment > baseline), "less",
    or "equal" (|difference| <= margin, by TOST; Schuirmann 1987). Comparisons with fewer than
    PAIRED_MIN_SEEDS pairs are TOO_FEW and leave the family; the rest are Holm-corrected (Holm
    1979) and each interval is at its Holm step level: 1 - alpha/(m - rank) for greater/less,
    1 - 2 alpha/(m - rank) for equal (rank 0-based in ascending raw p, m the family's size)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if direction == "equal" and not margin > 0.0:
        raise ValueError(f"an 'equal' claim needs a margin > 0, got {margin}")
    if not 0.0 < alpha < power < 1.0:
        raise ValueError(f"need 0 < alpha < power < 1, got alpha={alpha}, power={power}")
    equal = direction == "equal"
    samples = [[float(d) for d in sample if not math.isnan(d)] for sample in differences]
    summaries = []
    for sample in samples:
        n = len(sample)
        mean = float(statistics.mean(sample)) if n else math.nan  # exact: a constant sample's own value
        sd = statistics.stdev(sample) if n >= 2 else None
        summaries.append((n, mean, sd))
    family = [i for i, (n, _, _) in enumerate(summaries) if n >= PAIRED_MIN_SEEDS]
    raw: dict[int, float] = {}
    for i in family:
        n, mean, sd = summaries[i]
        assert sd is not None
        if equal:
            raw[i] = _tost_p(samples[i], mean, sd, margin)
        else:
            raw[i] = 0.0 if sd == 0.0 and mean != 0.0 else 1.0 if sd == 0.0 else _t_p(samples[i], 0.0, "two-sided")
    m = len(family)
    adjusted = dict(zip(family, holm_adjust([raw[i] for i in family])))
    ranks = {index: rank for rank, index in enumerate(sorted(family, key=lambda i: raw[i]))}
    results = []
    for i, (n, mean, sd) in enumerate(summaries):
        step = alpha / (m - ranks[i]) if i in ranks else alpha  # TOO_FEW: the unadjusted level
        level = 1.0 - 2.0 * step if equal else 1.0 - step
        mde = minimum_detectable_effect(n, sd, 1.0 - level, power) if sd is not None else None
        if i not in ranks:
            results.append(PairedResult(n, mean, sd, None, None, level, None, None, TOO_FEW, mde))
            continue
        assert sd is not None
        low, high = _interval(mean, sd, n, level)
        if equal:
            outer_low, outer_high = _interval(mean, sd, n, 1.0 - step)
            if adjusted[i] < alpha:
                verdict = REPRODUCED
            elif outer_low > margin or outer_high < -margin:
                verdict = CONTRADICTED
            else:
                verdict = INCONCLUSIVE
        elif adjusted[i] < alpha:
            on_side = mean > 0.0 if direction == "greater" else mean < 0.0
            verdict = REPRODUCED if on_side else CONTRADICTED
        else:
            verdict = INCONCLUSIVE
        results.append(PairedResult(n, mean, sd, low, high, level, raw[i], adjusted[i], verdict, mde))
    return results


def equivalence_detectable(n: int, sd: float, alpha: float, power: float = 0.8) -> float:
    """Smallest margin m at which two one-sided tests (each at ``alpha``) with n pairs and this sd
    show |difference| < m with probability ``power`` when the true difference is 0 (Schuirmann 1987):
    m = (t_{1-alpha} + t_{(1+power)/2}) sd / sqrt(n), both quantiles with n - 1 degrees of freedom."""
    if n < 2:
        raise ValueError(f"the detectable equivalence margin needs n >= 2, got {n}")
    if not 0.0 < alpha < 0.5 or not 0.0 < power < 1.0:
        raise ValueError(f"need 0 < alpha < 0.5 and 0 < power < 1, got alpha={alpha}, power={power}")
    df = n - 1
    return (float(sps.t.ppf(1.0 - alpha, df)) + float(sps.t.ppf((1.0 + power) / 2.0, df))) * sd / math.sqrt(n)
