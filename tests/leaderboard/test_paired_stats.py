"""Paired seed statistics (leaderboard.stats) against scipy and hand-computed numbers, and the
leaderboard's ★/≈ verdict (leaderboard.tables.judge) paired by seed."""

from __future__ import annotations

import math
import statistics
import sys
import warnings

import numpy as np
import pytest
from scipy import stats as sps

from tests.paths import REPO

ROOT = REPO
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the leaderboard package lives at the repository root

from leaderboard.stats import (  # noqa: E402
    CONTRADICTED,
    INCONCLUSIVE,
    PAIRED_MIN_SEEDS,
    REPRODUCED,
    TOO_FEW,
    decide,
    holm_adjust,
    minimum_detectable_effect,
    p_between,
    paired_differences,
    welch_test,
)
from leaderboard.tables import COLUMNS_BY_KEY, HEADLINE, ConfigRow, Stat, judge, welch_between  # noqa: E402

TREATMENT = {"0": 0.81, "1": 0.79, "2": 0.84, "3": 0.80, "10": 0.83, "4": math.nan, "7": 0.5}
BASELINE = {"0": 0.78, "1": 0.77, "2": 0.80, "3": 0.79, "10": 0.80, "4": 0.70, "5": 0.9}
SEEDS = ("0", "1", "2", "3", "10")  # in both and not NaN, numeric order
NOISY = [0.05, -0.04, 0.06, -0.03, 0.02]  # two-sided p 0.59
BARELY = [0.031, 0.002, 0.045, 0.008, 0.027]  # two-sided p 0.045: passes alone, not as one of 3


def t_interval(values, level):
    n = len(values)
    half = sps.t.ppf(1 - (1 - level) / 2, n - 1) * np.std(values, ddof=1) / math.sqrt(n)
    return np.mean(values) - half, np.mean(values) + half


# --- differences, Holm --------------------------------------------------------------------------

def test_paired_differences_keep_common_seeds_in_order_and_drop_nan():
    differences = paired_differences(TREATMENT, BASELINE)
    assert differences == pytest.approx([TREATMENT[s] - BASELINE[s] for s in SEEDS])
    assert paired_differences({"a": 1.0}, {"b": 1.0}) == []


def test_holm_adjust_by_hand():
    assert holm_adjust([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])  # 3p, 2p, max(p, 0.06)
    assert holm_adjust([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1, then monotone
    assert holm_adjust([0.02]) == [0.02] and holm_adjust([]) == []
    with pytest.raises(ValueError):
        holm_adjust([0.1, math.nan])


# --- decide against scipy -----------------------------------------------------------------------

def test_one_comparison_matches_scipy_paired_t():
    treatment = [TREATMENT[s] for s in SEEDS]
    baseline = [BASELINE[s] for s in SEEDS]
    (result,) = decide([paired_differences(TREATMENT, BASELINE)], "greater")
    differences = np.subtract(treatment, baseline)
    assert result.n == 5 and result.level == pytest.approx(0.95)
    assert result.mean == pytest.approx(differences.mean()) and result.sd == pytest.approx(differences.std(ddof=1))
    assert result.p == pytest.approx(sps.ttest_rel(treatment, baseline).pvalue, rel=1e-9)
    assert result.p_holm == result.p  # a family of one
    assert (result.low, result.high) == pytest.approx(t_interval(differences, 0.95), rel=1e-9)
    assert result.p < 0.05 and result.verdict == REPRODUCED


def test_a_family_gets_holm_p_and_step_level_intervals():
    family = [NOISY, paired_differences(TREATMENT, BASELINE), BARELY]
    results = decide(family, "greater")
    raw = [sps.ttest_1samp(d, 0).pvalue for d in family]
    assert [r.p for r in results] == pytest.approx(raw, rel=1e-9)
    assert [r.p_holm for r in results] == pytest.approx(holm_adjust(raw))
    for result, d, rank in zip(results, family, (2, 0, 1)):  # ranks by ascending raw p
        level = 1 - 0.05 / (3 - rank)
        assert result.level == pytest.approx(level)
        assert (result.low, result.high) == pytest.approx(t_interval(d, level), rel=1e-9)


def test_equal_claims_use_tost_and_its_interval():
    within = [0.001, -0.002, 0.0015, 0.004, -0.001, 0.0005]
    (result,) = decide([within], "equal", margin=0.01)
    one_sided = (sps.ttest_1samp(within, -0.01, alternative="greater").pvalue,
                 sps.ttest_1samp(within, 0.01, alternative="less").pvalue)
    assert result.p == pytest.approx(max(one_sided), rel=1e-9) and result.verdict == REPRODUCED
    assert result.level == pytest.approx(0.90)  # TOST at 0.05 = the 90 % interval inside the margin
    assert (result.low, result.high) == pytest.approx(t_interval(within, 0.90), rel=1e-9)
    assert -0.01 < result.low < result.high < 0.01
    with pytest.raises(ValueError):
        decide([within], "equal")  # no margin
    with pytest.raises(ValueError):
        decide([within], "sideways")


# --- verdict rules ------------------------------------------------------------------------------

def test_verdicts_on_constructed_cases():
    better = [0.031, 0.029, 0.035, 0.030, 0.033]
    worse = [-d for d in better]
    assert decide([better], "greater")[0].verdict == REPRODUCED
    assert decide([worse], "greater")[0].verdict == CONTRADICTED
    assert decide([worse], "less")[0].verdict == REPRODUCED
    assert decide([better], "less")[0].verdict == CONTRADICTED
    assert decide([better], "equal", margin=0.01)[0].verdict == CONTRADICTED  # 0.03 ± tiny: beyond 0.01
    assert decide([better], "equal", margin=0.05)[0].verdict == REPRODUCED
    # beyond the margin by the 90 % (TOST) interval but not by the 95 % one: not shown to differ
    beyond = [0.02, 0.031, 0.009, 0.0255, 0.0145]
    assert t_interval(beyond, 0.90)[0] > 0.01 > t_interval(beyond, 0.95)[0]
    assert decide([beyond], "equal", margin=0.01)[0].verdict == INCONCLUSIVE


def test_too_few_seeds_leave_the_family():
    few, kept = decide([[0.5, 0.6], [0.031, 0.029, 0.035, 0.030, 0.033]], "greater")
    assert few.verdict == TOO_FEW and few.n == 2 == PAIRED_MIN_SEEDS - 1
    assert few.mean == pytest.approx(0.55) and few.p is None and few.p_holm is None and few.low is None
    assert kept.p_holm == kept.p and kept.level == pytest.approx(0.95)  # a family of one, not two
    (none,) = decide([[]], "greater")
    assert none.verdict == TOO_FEW and none.n == 0 and none.sd is None and none.mde is None


def test_noisy_comparison_is_inconclusive_and_says_what_it_could_detect():
    (result,) = decide([NOISY], "greater")
    assert result.verdict == INCONCLUSIVE and result.p > 0.5
    assert result.low < 0 < result.high
    assert result.mde > abs(result.mean) * 3  # far more than what was observed


def test_holm_changes_a_verdict():
    alone = decide([BARELY], "greater")[0]
    assert alone.p < 0.05 and alone.verdict == REPRODUCED
    in_family = decide([NOISY, BARELY, [0.01, -0.02, 0.015, -0.005, 0.004]], "greater")[1]
    assert in_family.p == pytest.approx(alone.p) and in_family.p_holm == pytest.approx(3 * alone.p)
    assert in_family.verdict == INCONCLUSIVE and in_family.level == pytest.approx(1 - 0.05 / 3)


def test_zero_spread_is_decided_exactly_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        up, flat = decide([[0.01] * 4, [0.0] * 4], "greater")
        inside, outside, edge = decide([[0.01] * 4, [0.05] * 4, [0.02] * 3], "equal", margin=0.02)
    assert (up.p, up.verdict, up.low, up.high, up.mde) == (0.0, REPRODUCED, 0.01, 0.01, 0.0)
    assert (flat.p, flat.verdict, flat.sd) == (1.0, INCONCLUSIVE, 0.0)
    assert (inside.p, inside.verdict) == (0.0, REPRODUCED)
    assert outside.verdict == CONTRADICTED and edge.verdict == INCONCLUSIVE  # |0.02| is not < 0.02


# --- minimum detectable effect ------------------------------------------------------------------

def test_minimum_detectable_effect_has_the_asked_power():
    n, sd, alpha = 6, 0.02, 0.05
    mde = minimum_detectable_effect(n, sd, alpha)
    rng = np.random.default_rng(0)  # simulate the paired t-test at a true difference of mde
    samples = rng.normal(mde, sd, size=(40_000, n))
    p = sps.ttest_1samp(samples, 0.0, axis=1).pvalue
    assert np.mean(p < alpha) == pytest.approx(0.8, abs=0.01)
    assert 2.80 < minimum_detectable_effect(200, 1.0, 0.05) * math.sqrt(200) < 2.83  # (z.975 + z.8) ≈ 2.80
    assert minimum_detectable_effect(5, 1.0, 0.01) > minimum_detectable_effect(5, 1.0, 0.05)  # stricter: larger
    (result,) = decide([NOISY], "greater")
    assert result.mde == pytest.approx(minimum_detectable_effect(5, statistics.stdev(NOISY), 0.05))
    assert decide([[0.1, 0.3]], "greater")[0].mde == pytest.approx(minimum_detectable_effect(2, 0.1 * 2**0.5, 0.05))


# --- the leaderboard verdict, paired by seed ----------------------------------------------------

def row(name: str, values: list[float], seeds: bool = True) -> ConfigRow:
    labels = [str(i) for i in range(len(values))]
    config_row = ConfigRow(name, [])
    config_row.stats = {HEADLINE: Stat.of(list(values), labels if seeds else None)}
    return config_row


def marks(rows: list[ConfigRow]) -> dict[str, str]:
    judge(rows, COLUMNS_BY_KEY[HEADLINE])
    return {r.config: r.verdicts[HEADLINE].mark for r in rows}


def test_top_row_needs_to_be_separated_from_every_row_not_only_the_runner_up():
    top = [0.90, 0.91, 0.92, 0.90, 0.91] * 2  # 10 seeds: the star needs the plan's STAR_MIN_SEEDS
    runner_up = [0.80, 0.81, 0.80, 0.82, 0.81] * 2
    noisy = [0.10, 0.99, 0.30, 0.98, 1.00] * 2  # lower mean (0.67), huge spread
    assert statistics.fmean(noisy) < statistics.fmean(runner_up) < statistics.fmean(top)
    for seeds in (True, False):  # paired and Welch alike
        rows = [row("top", top, seeds), row("runner-up", runner_up, seeds), row("noisy", noisy, seeds)]
        assert marks(rows) == {"top": "tie", "runner-up": "", "noisy": "tie"}, seeds
        assert rows[0].verdicts[HEADLINE].p == rows[1].verdicts[HEADLINE].p < 0.05  # top: p vs runner-up
    assert marks([row("top", top), row("runner-up", runner_up)]) == {"top": "best", "runner-up": ""}
    assert marks([row("top", top[:5]), row("runner-up", runner_up[:5])]) == {"top": "", "runner-up": ""}  # 5 < 10


def test_pairing_by_seed_separates_what_welch_cannot():
    seed_effect = np.array([0.60, 0.80, 0.70, 0.90, 0.65, 0.75, 0.85, 0.62, 0.78, 0.68])  # 10 seeds
    better = list(seed_effect + 0.02 + np.array([0.001, -0.002, 0.0015, 0.0, -0.001] * 2))
    worse = list(seed_effect + np.array([0.0005, 0.001, -0.001, 0.0, 0.0015] * 2))
    assert marks([row("better", better), row("worse", worse)]) == {"better": "best", "worse": ""}
    paired = [row("better", better), row("worse", worse)]
    assert welch_between(*paired) == pytest.approx(sps.ttest_rel(better, worse).pvalue, rel=1e-9)
    welch = [row("better", better, seeds=False), row("worse", worse, seeds=False)]
    assert marks(welch) == {"better": "tie", "worse": "tie"}  # Welch alone: the seed effect hides it
    assert welch_between(*welch) == pytest.approx(sps.ttest_ind(better, worse, equal_var=False).pvalue, rel=1e-9)


def test_too_few_shared_seeds_fall_back_to_welch():
    first, second = [0.6, 0.8, 0.7], [0.5, 0.9, 0.65]
    welch = welch_test(first, second).p
    assert p_between(first, second, ("0", "1", "2"), ("2", "3", "4")) == pytest.approx(welch)  # 1 shared
    assert p_between(first, second, ("0", "1", "2"), ("0", "1", "9")) == pytest.approx(welch)  # 2 shared
    assert p_between(first, second, ("0", "1", "2"), ("0", "1", "2")) == pytest.approx(
        sps.ttest_rel(first, second).pvalue)
    assert p_between([0.5], [0.4, 0.6]) is None


def test_stat_keeps_each_values_seed():
    stat = Stat.of([0.5, None, math.nan, 0.7], ["0", "1", "2", "3"])
    assert stat.values == (0.5, 0.7) and stat.seeds == ("0", "3") and stat.n == 2
    assert Stat.of([0.5, 0.7]).seeds == ()
    with pytest.raises(ValueError):
        Stat.of([0.5, 0.7], ["0"])


def test_tables_from_runs_pair_by_their_seed_tags():
    from leaderboard.runs import RunRecord
    from leaderboard.table_building import build_tables

    def run(config: str, seed: int, value: float) -> RunRecord:
        return RunRecord(f"{config}-{seed}", "paired", "FINISHED", None, None,
                         {"benchmark": "b", "algorithm_config": config, "seed": str(seed)}, {},
                         {HEADLINE: value})

    seed_effect = [0.60, 0.80, 0.70, 0.90, 0.65, 0.75, 0.85, 0.62, 0.78, 0.68]  # the star needs 10 seeds
    runs = ([run("better", s, v + 0.02 + 0.001 * (-1) ** s) for s, v in enumerate(seed_effect)]
            + [run("worse", s, v) for s, v in reversed(list(enumerate(seed_effect)))])  # other order
    (table,) = build_tables(runs)
    by_config = {r.config: r for r in table.rows}
    assert by_config["better"].stats[HEADLINE].seeds == tuple(str(s) for s in range(10))
    assert by_config["better"].verdicts[HEADLINE].mark == "best"
    assert by_config["worse"].verdicts[HEADLINE].mark == ""
