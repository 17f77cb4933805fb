"""The claims ledger's decision rules, one test per rule, each written to fail when the rule is
broken (issue 48: the hand-made mutants a reviewer found, then mutmut's survivors, see
benchmarks/perf/results/mutation_ledger.md). Every test asserts what a reader of the page sees: a
verdict, an interval, a p-value, a convergence status, a refusal."""

from __future__ import annotations

import math
import statistics
import warnings

import pytest
from scipy import stats as sps

from fl_lightning.records.suite_format import AlgorithmEntry, SuiteFormatError, SuiteSpec
from leaderboard import claims as ledger
from leaderboard.claims.results import combine
from leaderboard.registration import LedgerPlan
from leaderboard.stats import (
    CONTRADICTED,
    INCONCLUSIVE,
    REPRODUCED,
    TOO_FEW,
    holm_adjust,
)
from tests.leaderboard.test_claims import SEED_EFFECT, claim_spec, paired_runs, run

SEEDS = 10
# a fixed pattern with mean 0 and sample sd 1: differences m + s * Z have sd s and a t of m sqrt(n) / s
_PATTERN = [1.0, -1.0, 2.0, -2.0, 0.5, -0.5, 1.5, -1.5, 0.25, -0.25]
Z = [v / statistics.stdev(_PATTERN) for v in _PATTERN]


def gap_with_p(p: float, sign: float = 1.0) -> list[float]:
    """Per-seed accuracy gaps (fractions) whose paired two-sided t-test over 10 seeds has this p."""
    t = float(sps.t.isf(p / 2, SEEDS - 1))
    mean_pp = sign * t / math.sqrt(SEEDS)  # sd 1 pp
    return [(mean_pp + z) / 100 for z in Z]


def family_runs(gaps: dict[str, list[float]], base: float = 0.8) -> list:
    """Baseline B and one treatment config per entry of ``gaps``, paired by seed (a shared seed effect)."""
    runs = []
    for seed in range(SEEDS):
        runs.append(run("B", seed, base + SEED_EFFECT[seed]))
        runs += [run(config, seed, base + SEED_EFFECT[seed] + gap[seed]) for config, gap in gaps.items()]
    return runs


def evaluate(spec: dict, runs: list, plan: LedgerPlan | None = None) -> ledger.ClaimResult:
    return ledger.evaluate(ledger.parse_claims(spec, "x", "x/claims.yaml"), runs, plan)[0]


def verdicts(result: ledger.ClaimResult) -> list[str]:
    return [c.verdict for c in result.comparisons]


# --- Holm's step-down within a claim (Holm 1979) ----------------------------------------------------

def test_holm_walks_the_p_values_from_the_smallest():
    """Rule: Holm judges the smallest p first, at alpha / m. Walking from the largest would judge
    p = 0.04 at 0.025 first, stop, and leave a claim whose every comparison holds inconclusive."""
    assert holm_adjust([0.04, 0.001]) == pytest.approx([0.04, 0.002])
    spec = claim_spec([{"treatment": "A", "baseline": "B"}, {"treatment": "C", "baseline": "B"}])
    result = evaluate(spec, family_runs({"A": gap_with_p(0.001), "C": gap_with_p(0.04)}))
    assert [c.result.p for c in result.comparisons] == pytest.approx([0.001, 0.04])
    assert verdicts(result) == [REPRODUCED, REPRODUCED]
    assert result.verdict == REPRODUCED
    assert [c.result.p_holm for c in result.comparisons] == pytest.approx([0.002, 0.04])


def test_holm_stays_stopped_after_its_first_non_rejection():
    """Rule: after the first comparison Holm does not reject, no later (larger p) comparison is
    rejected, even one whose own step level (alpha / 1) it would pass."""
    spec = claim_spec([{"treatment": c, "baseline": "B"} for c in ("A", "C", "D")])
    result = evaluate(spec, family_runs({"A": gap_with_p(0.001), "C": gap_with_p(0.03), "D": gap_with_p(0.04)}))
    assert [c.result.p for c in result.comparisons] == pytest.approx([0.001, 0.03, 0.04])
    assert verdicts(result) == [REPRODUCED, INCONCLUSIVE, INCONCLUSIVE]  # 0.04 < alpha / 1, yet not reached
    assert result.verdict == INCONCLUSIVE


# --- a claim's verdict from its comparisons ---------------------------------------------------------

def test_a_claim_is_reproduced_only_when_every_comparison_reproduces():
    """Rule: one inconclusive comparison leaves the claim inconclusive (not 'any reproduces')."""
    spec = claim_spec([{"treatment": "A", "baseline": "B"}, {"treatment": "C", "baseline": "B"}])
    noise = [0.01 * z for z in Z]  # mean 0: p = 1
    result = evaluate(spec, family_runs({"A": gap_with_p(0.0001), "C": noise}))
    assert verdicts(result) == [REPRODUCED, INCONCLUSIVE]
    assert result.verdict == INCONCLUSIVE


@pytest.mark.parametrize(("verdicts_in", "expected"), [
    ([], ledger.NO_RUNS),
    ([REPRODUCED, REPRODUCED], REPRODUCED),
    ([REPRODUCED, INCONCLUSIVE], INCONCLUSIVE),
    ([REPRODUCED, CONTRADICTED], CONTRADICTED),
    ([INCONCLUSIVE, CONTRADICTED], CONTRADICTED),
    ([REPRODUCED, TOO_FEW], TOO_FEW),
    ([CONTRADICTED, ledger.NO_RUNS, TOO_FEW], ledger.NO_RUNS),
    ([TOO_FEW, ledger.NO_RUNS, ledger.WITHDRAWN], ledger.WITHDRAWN),
])
def test_a_claim_verdict_combines_its_comparisons(verdicts_in, expected):
    """Rule: withdrawn, then no runs, then too few seeds override; else every comparison must
    reproduce, and one contradicted comparison contradicts the claim."""
    assert combine(verdicts_in) == expected


# --- the plan's primary point ---------------------------------------------------------------------

def flip_runs() -> list:
    """A beats B at the final evaluation; over the last 3 evaluations A is below B."""
    runs = []
    for s in range(SEEDS):
        effect = SEED_EFFECT[s]
        runs.append(run("A", s, [0.70 + effect] * 3 + [0.60 + effect] * 2 + [0.82 + effect + 0.001 * s]))
        runs.append(run("B", s, [0.75 + effect] * 6))
    return runs


def test_the_verdict_is_read_at_the_plans_primary_point():
    """Rule: the verdict is read at the plan's primary point (here the mean of the last 3
    evaluations), not at the final evaluation whatever the plan says; the final evaluation is then
    a sensitivity point, and the claim is fragile."""
    spec = claim_spec([{"treatment": "A", "baseline": "B"}])
    final_first = evaluate(spec, flip_runs())
    assert final_first.verdict == REPRODUCED
    plan = LedgerPlan(primary_point="last3", sensitivity_points=("final",))
    result = evaluate(spec, flip_runs(), plan)
    entry = result.comparisons[0]
    assert result.verdict == CONTRADICTED and entry.result.mean < 0
    assert entry.at_points == {"final": REPRODUCED}
    assert result.fragile_points == [("final", REPRODUCED)]


# --- where the paper's effect lies against our interval --------------------------------------------

@pytest.mark.parametrize("direction", ["greater", "less"])
@pytest.mark.parametrize(("paper_gap", "position"), [(-5.0, "below"), (-2.45, "inside"), (-1.0, "above"),
                                                     (5.0, "above")])
def test_the_papers_effect_is_placed_on_its_numeric_side_for_every_direction(direction, paper_gap, position):
    """Rule: 'above' means the paper's effect is a larger number than our interval's upper end and
    'below' a smaller number than its lower end, for a 'less' claim as for a 'greater' one (our
    difference here is about -2.45 pp, a narrow interval)."""
    runs = paired_runs([-0.02 - 0.001 * k for k in range(SEEDS)])
    spec = claim_spec([{"treatment": "A", "baseline": "B", "paper": [50.0 + paper_gap, 50.0]}], direction=direction)
    entry = evaluate(spec, runs).comparisons[0]
    assert entry.result.low < -2.45 < entry.result.high < -2.0
    assert entry.paper_position == position


# --- fragile: the raw data verdict at every point --------------------------------------------------

def test_fragile_compares_the_data_verdicts_not_the_claims_label():
    """Rule: a claim true by construction (label 'by construction', data 'reproduced') whose runs
    reproduce at every point is not fragile: points are compared with the data verdict."""
    spec = claim_spec([{"treatment": "A", "baseline": "B"}], by_construction="its QP forbids it")
    result = evaluate(spec, paired_runs([0.02 + 0.001 * k for k in range(SEEDS)]))
    assert result.verdict == ledger.BY_CONSTRUCTION and result.data_verdict == REPRODUCED
    assert result.verdict_at("last3") == REPRODUCED
    assert result.fragile_points == [] and not result.fragile


# --- the suite format: an empty grid list is refused ----------------------------------------------

GRID_HEAD = {"suite": "s", "paper": "p", "scale": "offline", "base": {}, "benchmarks": [{"name": "b"}]}


@pytest.mark.parametrize("empty", [[], None])
def test_an_empty_grid_list_is_refused_naming_the_file_the_algorithm_and_the_key(empty):
    """Rule: a grid key with no values would expand to no configuration, so the algorithm would
    vanish from the suite in silence; it is refused in one line that names the suite file, the
    algorithm and the key, and says what to write."""
    raw = {**GRID_HEAD, "algorithms": [{"class_path": "fl_lightning.algorithms.FedAvg"},
                                       {"class_path": "fl_lightning.algorithms.FedProx", "grid": {"mu": empty}}]}
    with pytest.raises(SuiteFormatError) as refused:
        SuiteSpec.parse(raw, "'benchmarks/fedmgda_plus/offline.yaml'")
    text = str(refused.value)
    assert "\n" not in text
    assert text.startswith("suite 'benchmarks/fedmgda_plus/offline.yaml': fl_lightning.algorithms.FedProx: "
                           "grid 'mu' is empty")
    assert "no configuration" in text and "list at least one value (e.g. mu: [0.1]) or remove 'mu'" in text


def test_an_empty_grid_list_is_refused_when_the_runner_loads_the_suite_file(tmp_path):
    """Rule: the runner's own loading of a suite file refuses the empty grid too (it does not run
    the suite without that algorithm)."""
    from benchmarks.suites import load_suite

    path = tmp_path / "mine.yaml"
    path.write_text("suite: s\npaper: p\nscale: offline\nbase: {}\nbenchmarks: [{name: b}]\n"
                    "algorithms:\n  - class_path: FedAvg\n  - class_path: FedProx\n    grid: {mu: []}\n")
    with pytest.raises(SystemExit) as refused:
        load_suite(str(path))
    assert str(refused.value).startswith(f"suite '{path}': FedProx: grid 'mu' is empty")


def test_an_algorithm_entry_checked_alone_refuses_an_empty_grid():
    """Rule: an algorithms list read on its own (expand_algorithms) refuses it the same way."""
    with pytest.raises(SuiteFormatError, match=r"^suite \(algorithms\): FedProx: grid 'mu' is empty"):
        AlgorithmEntry.parse({"class_path": "FedProx", "grid": {"mu": []}}, 1, "(algorithms)")


def test_no_warning_escapes_a_verdict():
    """Guard for the rules above: deciding a family raises no warning (scipy's precision notes are
    silenced inside the statistics, nothing else is)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), family_runs({"A": gap_with_p(0.01)}))


# --- leaderboard.stats: Welch between two rows -----------------------------------------------------

from leaderboard.stats import (  # noqa: E402
    WelchResult,
    decide,
    equivalence_detectable,
    minimum_detectable_effect,
    p_between,
    paired_differences,
    paired_p,
    welch_test,
)


def test_welch_needs_two_values_in_each_row():
    """Rule: fewer than 2 values in either row: no variance, no test (None)."""
    assert welch_test([1.0, 2.0], [3.0, 5.0]) is not None
    assert welch_test([1.0], [3.0, 5.0]) is None and welch_test([1.0, 2.0], [3.0]) is None


def test_welch_without_spread_separates_exactly_when_the_means_differ():
    """Rule: two rows without spread are apart (t = +-inf, p = 0) exactly when their means differ
    beyond float noise (relative 1e-12, absolute 1e-15), else p = 1."""
    assert welch_test([1.0, 1.0], [2.0, 2.0]) == WelchResult(-math.inf, math.inf, 0.0)
    assert welch_test([2.0, 2.0], [1.0, 1.0]) == WelchResult(math.inf, math.inf, 0.0)
    assert welch_test([1.0, 1.0], [1.0, 1.0]) == WelchResult(0.0, math.inf, 1.0)
    assert welch_test([1.0, 1.0], [1.0 + 1e-10] * 2).p == 0.0  # a real, tiny difference
    assert welch_test([0.0, 0.0], [1e-16, 1e-16]).p == 1.0  # float noise


def test_welch_with_spread_in_one_row_is_scipys_test():
    """Rule: one constant row and one with spread go to Welch's test as scipy computes it (t, df, p)."""
    first, second = [1.0, 1.0, 1.0], [1.0, 2.0, 4.0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = sps.ttest_ind(first, second, equal_var=False)
    for a, b, sign in ((first, second, 1), (second, first, -1)):
        result = welch_test(a, b)
        assert result.t == pytest.approx(sign * expected.statistic)
        assert result.df == pytest.approx(expected.df) and result.p == pytest.approx(expected.pvalue)


def test_near_constant_rows_are_tested_without_a_warning():
    """Rule: scipy's precision note on near-constant samples is silenced, and the test still runs."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = welch_test([1.0, 1.0 + 1e-15, 1.0], [2.0, 2.0 + 1e-15, 2.0])
        differences = [1.0, 1.0 + 1e-15, 1.0]
        paired = decide([differences], "greater")[0]
    assert result is not None and result.p < 1e-6
    assert paired.p is not None and paired.verdict == REPRODUCED


# --- leaderboard.stats: paired values, Holm, the paired p ------------------------------------------

def test_seeds_pair_in_numeric_order_then_named_seeds_in_name_order():
    """Rule: the differences follow the seeds' order: integer seeds numerically (negative ones
    too), then named seeds by name."""
    seeds = ["10", "2", "-1", "b", "a", "X3"]
    treatment = {seed: float(k) for k, seed in enumerate(seeds)}
    baseline = dict.fromkeys(seeds, 0.0)
    order = ["-1", "2", "10", "X3", "a", "b"]
    assert paired_differences(treatment, baseline) == [treatment[s] for s in order]


def test_holm_refuses_a_p_value_outside_0_1_and_caps_at_1():
    """Rule: a p-value must lie in [0, 1] (the refusal says so); an adjusted p is capped at 1."""
    with pytest.raises(ValueError, match=r"p-values must lie in \[0, 1\], got \[0.1, 1.5\]"):
        holm_adjust([0.1, 1.5])
    assert holm_adjust([0.6, 0.7]) == [1.0, 1.0]


def test_the_paired_p_without_spread_and_with_spread():
    """Rule: fewer than 3 pairs: no p; no spread: p = 0 for a nonzero mean, 1 for a zero mean;
    else the two-sided paired t-test (an sd of exactly 1 included)."""
    assert paired_p([0.5, 0.5]) is None
    assert paired_p([0.5, 0.5, 0.5]) == 0.0 and paired_p([0.0, 0.0, 0.0]) == 1.0
    assert paired_p([1.0, 2.0, 3.0]) == pytest.approx(sps.ttest_1samp([1.0, 2.0, 3.0], 0.0).pvalue)


def test_rows_whose_seeds_do_not_align_with_their_values_fall_back_to_welch():
    """Rule: pairing needs a seed for every value of both rows; else Welch's test."""
    first, second = [0.81, 0.79, 0.84, 0.80], [0.78, 0.77, 0.80, 0.70]
    welch = welch_test(first, second).p
    assert p_between(first, second, ["0", "1", "2", "3"], ["0", "1", "2"]) == pytest.approx(welch)
    assert p_between(first, second, ["0", "1", "2"], ["0", "1", "2", "3"]) == pytest.approx(welch)
    paired = p_between(first, second, ["0", "1", "2", "3"], ["0", "1", "2", "3"])
    assert paired == pytest.approx(paired_p([a - b for a, b in zip(first, second)]))


# --- leaderboard.stats: decide ----------------------------------------------------------------------

@pytest.mark.parametrize(("arguments", "message"), [
    ({"direction": "more"}, "direction must be one of ('greater', 'less', 'equal'), got 'more'"),
    ({"direction": "equal"}, "an 'equal' claim needs a margin > 0, got 0.0"),
    ({"alpha": 0.0}, "need 0 < alpha < power < 1, got alpha=0.0, power=0.8"),
    ({"alpha": 0.8}, "need 0 < alpha < power < 1, got alpha=0.8, power=0.8"),
    ({"power": 1.0}, "need 0 < alpha < power < 1, got alpha=0.05, power=1.0"),
])
def test_decide_refuses_a_wrong_direction_margin_alpha_or_power_saying_which(arguments, message):
    """Rule: a claim's test needs a known direction, a positive margin for 'equal', and
    0 < alpha < power < 1; the refusal names what is wrong."""
    with pytest.raises(ValueError) as refused:
        decide([[0.1, 0.2, 0.3]], **{"direction": "greater", **arguments})
    assert str(refused.value) == message


def test_a_p_value_equal_to_alpha_is_not_below_it():
    """Rule: a comparison holds when its (Holm) p is strictly below alpha: at p == alpha it is
    inconclusive, for greater/less as for equal."""
    sample = [0.031, 0.002, 0.045, 0.008, 0.027]
    p = decide([sample], "greater")[0].p
    assert decide([sample], "greater", alpha=p)[0].verdict == INCONCLUSIVE
    assert decide([sample], "greater", alpha=p * 1.000001)[0].verdict == REPRODUCED
    near = [0.001, -0.002, 0.0015, -0.0005, 0.0004]
    tost = decide([near], "equal", margin=0.01)[0].p
    assert decide([near], "equal", margin=0.01, alpha=tost)[0].verdict == INCONCLUSIVE
    assert decide([near], "equal", margin=0.01, alpha=tost * 1.000001)[0].verdict == REPRODUCED


def test_an_equal_claim_is_contradicted_only_by_an_interval_wholly_outside_the_margin():
    """Rule (TOST, Schuirmann 1987): 'equal' is contradicted when the interval lies wholly beyond
    +margin or wholly below -margin; an interval touching -margin, or straddling it, is inconclusive."""
    below = decide([[-2.0, -2.1, -1.9, -2.05]], "equal", margin=1.0)[0]
    assert below.verdict == CONTRADICTED
    touching = decide([[-1.0, -1.0, -1.0]], "equal", margin=1.0)[0]  # no spread: the interval is the point -1
    assert (touching.low, touching.high, touching.verdict) == (-1.0, -1.0, INCONCLUSIVE)
    straddling = decide([[-3.0, 0.5, -2.0, 0.2]], "equal", margin=1.0)[0]
    assert straddling.high < 1.0 and straddling.low < -1.0 < straddling.high
    assert straddling.verdict == INCONCLUSIVE


def test_a_comparison_with_too_few_seeds_keeps_its_spread_and_unadjusted_level():
    """Rule: a comparison with fewer than 3 pairs leaves the family as 'too few seeds', and still
    shows its sd and its (unadjusted) level 1 - alpha."""
    (few,) = decide([[0.1, 0.3]], "greater")
    assert few.verdict == TOO_FEW and few.sd == pytest.approx(statistics.stdev([0.1, 0.3]))
    assert few.level == pytest.approx(0.95) and few.p is None and few.low is None


def test_the_detectable_effect_uses_the_asked_power():
    """Rule: the minimum detectable effect is at the power the caller asks for."""
    sample = [0.05, -0.04, 0.06, -0.03, 0.02]
    at_90 = decide([sample], "greater", power=0.9)[0].mde
    assert at_90 == pytest.approx(minimum_detectable_effect(5, statistics.stdev(sample), 0.05, 0.9))
    assert at_90 > decide([sample], "greater")[0].mde


# --- leaderboard.stats: power -----------------------------------------------------------------------

def power_at(effect: float, n: int, sd: float, alpha: float) -> float:
    """The two-sided one-sample t-test's power at a true mean ``effect`` (both tails, noncentral t)."""
    critical = sps.t.ppf(1 - alpha / 2, n - 1)
    ncp = effect * math.sqrt(n) / sd
    return float(sps.nct.sf(critical, n - 1, ncp) + sps.nct.cdf(-critical, n - 1, ncp))


@pytest.mark.parametrize("power", [0.1, 0.5, 0.8])
def test_the_minimum_detectable_effect_has_the_asked_power_counting_both_tails(power):
    """Rule: at the minimum detectable effect the two-sided t-test's power, both tails counted, is
    the asked power (a low power puts the effect below one sd: the search starts at 0)."""
    mde = minimum_detectable_effect(10, 1.0, 0.05, power)
    assert power_at(mde, 10, 1.0, 0.05) == pytest.approx(power, abs=1e-9)


@pytest.mark.parametrize(("arguments", "message"), [
    ((1, 1.0, 0.05), "the minimum detectable effect needs n >= 2, got 1"),
    ((5, 1.0, 0.0), "need 0 < alpha < power < 1, got alpha=0.0, power=0.8"),
    ((5, 1.0, 0.8), "need 0 < alpha < power < 1, got alpha=0.8, power=0.8"),
    ((5, 1.0, 0.05, 1.0), "need 0 < alpha < power < 1, got alpha=0.05, power=1.0"),
    ((5, 1.0, 0.05, 1.5), "need 0 < alpha < power < 1, got alpha=0.05, power=1.5"),
])
def test_the_minimum_detectable_effect_refuses_what_has_none(arguments, message):
    """Rule: n >= 2 and 0 < alpha < power < 1, said in the refusal."""
    with pytest.raises(ValueError) as refused:
        minimum_detectable_effect(*arguments)
    assert str(refused.value) == message


def test_the_detectable_equivalence_margin_from_two_pairs_on():
    """Rule: two pairs suffice for the detectable equivalence margin (one does not)."""
    expected = (sps.t.ppf(0.95, 1) + sps.t.ppf(0.9, 1)) * 1.0 / math.sqrt(2)
    assert equivalence_detectable(2, 1.0, 0.05) == pytest.approx(expected)


@pytest.mark.parametrize(("arguments", "message"), [
    ((1, 1.0, 0.05), "the detectable equivalence margin needs n >= 2, got 1"),
    ((5, 1.0, 0.0), "need 0 < alpha < 0.5 and 0 < power < 1, got alpha=0.0, power=0.8"),
    ((5, 1.0, 0.5), "need 0 < alpha < 0.5 and 0 < power < 1, got alpha=0.5, power=0.8"),
    ((5, 1.0, 0.6), "need 0 < alpha < 0.5 and 0 < power < 1, got alpha=0.6, power=0.8"),
    ((5, 1.0, 0.05, 0.0), "need 0 < alpha < 0.5 and 0 < power < 1, got alpha=0.05, power=0.0"),
    ((5, 1.0, 0.05, 1.0), "need 0 < alpha < 0.5 and 0 < power < 1, got alpha=0.05, power=1.0"),
    ((5, 1.0, 0.05, 1.5), "need 0 < alpha < 0.5 and 0 < power < 1, got alpha=0.05, power=1.5"),
])
def test_the_detectable_equivalence_margin_refuses_what_has_none(arguments, message):
    """Rule: n >= 2, 0 < alpha < 0.5 and 0 < power < 1, said in the refusal."""
    with pytest.raises(ValueError) as refused:
        equivalence_detectable(*arguments)
    assert str(refused.value) == message


# --- leaderboard.convergence ------------------------------------------------------------------------

from leaderboard.convergence import (  # noqa: E402
    CONVERGED,
    TOO_SHORT,
    UNCONVERGED,
    accuracy_history,
    converged,
    convergence_change,
    convergence_status,
    still_improving,
    value_at,
)


def at_rounds(rounds: list[int], values: list[float], metric: str = "test_acc_mean"):
    """A run whose ``metric`` history is ``values`` at these rounds."""
    record = run("A", 0, values[-1])
    record.histories = {metric: list(zip(rounds, values))}
    return record


def test_a_run_is_read_at_its_final_evaluation_by_default_and_over_the_convergence_window():
    """Rule: the default point is the final evaluation; ``converged`` is the mean of the last 3."""
    record = at_rounds([10, 20, 30, 40], [0.5, 0.6, 0.7, 0.9])
    assert value_at(record, "test_acc_mean") == 0.9
    assert converged(record, "test_acc_mean") == pytest.approx((0.6 + 0.7 + 0.9) / 3)


def test_the_accuracy_history_falls_back_to_the_global_accuracy():
    """Rule: a run that logged no mean client accuracy is judged on its global test accuracy."""
    record = at_rounds([10, 20], [0.5, 0.6], metric="global_test_acc")
    assert accuracy_history(record) == [(10, 0.5), (20, 0.6)]


def test_the_change_is_in_points_between_the_last_two_windows():
    """Rule: the change is 100 x (mean of the last window - mean of the window before), in points."""
    record = at_rounds(list(range(10, 130, 10)), [0.5] * 6 + [0.80, 0.80, 0.80, 0.81, 0.82, 0.825])
    assert convergence_change(record) == pytest.approx(100 * (0.81 + 0.82 + 0.825 - 2.4) / 3)
    assert convergence_change(record, window=2) == pytest.approx(100 * (0.82 + 0.825 - 0.80 - 0.81) / 2)


def test_a_change_of_exactly_the_threshold_is_converged():
    """Rule: unconverged means the change is MORE than the threshold; the window is the one asked."""
    record = at_rounds(list(range(10, 130, 10)), [0.5] * 6 + [0.80, 0.80, 0.80, 0.81, 0.82, 0.825])
    change = convergence_change(record)
    assert convergence_status(record, change_pp=change) == CONVERGED
    assert convergence_status(record, change_pp=change * 0.999) == UNCONVERGED
    by_two = convergence_change(record, window=2)  # 1.75 pp, below the 3-window change (1.83 pp)
    assert convergence_status(record, window=2, change_pp=by_two) == CONVERGED
    assert convergence_status(record, change_pp=by_two) == UNCONVERGED


def test_two_windows_in_the_second_half_are_enough_to_judge():
    """Rule: exactly two windows are enough when the earlier starts at or after half the last round
    (evaluations at rounds 50-100 of a run logged from round 50)."""
    record = at_rounds([50, 60, 70, 80, 90, 100], [0.8] * 6)
    assert convergence_status(record) == CONVERGED and not still_improving(record)


def test_the_earlier_window_must_start_at_half_the_last_evaluated_round():
    """Rule: the earlier window's FIRST evaluation must be at or after half the LAST evaluated round."""
    assert convergence_status(at_rounds([10, 20, 30, 40, 50, 60, 70, 80], [0.8] * 8)) == TOO_SHORT  # 30 < 40
    assert convergence_status(at_rounds([50, 51, 52, 53, 54, 110], [0.8] * 6)) == TOO_SHORT  # 50 < 55
    assert convergence_status(at_rounds([45, 50, 55, 60, 70, 90], [0.8] * 6)) == CONVERGED  # 45 >= 45


def test_still_improving_is_unconverged_at_the_end():
    """Rule: still improving = unconverged (rising or falling) under the default window and threshold."""
    rising = at_rounds(list(range(10, 130, 10)), [0.5 + 0.05 * k for k in range(12)])
    assert still_improving(rising)


# --- fl_lightning.records.suite_format: each refusal names the entry and what to write ----------------------

SUITE_ONE = {"suite": "s", "paper": "p", "scale": "offline", "base": {}, "benchmarks": [{"name": "b"}],
             "algorithms": [{"class_path": "FedAvg"}]}
TAKES = "class_path, init_args, grid, label, label_args"


@pytest.mark.parametrize(("change", "message"), [
    ({"algorithms": ["FedAvg"]}, "algorithm entry 0 must be a mapping with a 'class_path' (e.g. class_path: "
                                 "fl_lightning.algorithms.FedAvg), got 'FedAvg'"),
    ({"benchmarks": ["b"]}, "benchmark entry 0 must be a mapping with a 'name' (e.g. name: mnist5k/iid/p0.1/fl_mlp), "
                            "got 'b'"),
    ({"benchmarks": [{"name": 5}]}, "benchmark entry 0: 'name' must be a string, got 5"),
    ({"algorithms": [{"class_path": 5}]}, "algorithm entry 0: 'class_path' must be a string, got 5"),
    ({"algorithms": [{"class_path": "FedAvg", "label_args": [5]}]}, "FedAvg: 'label_args 0' must be a string, got 5"),
    ({"algorithms": [{"class_path": "FedAvg", "label_args": 5}]}, "FedAvg: 'label_args' must be a list, got 5"),
    ({"algorithms": [{"class_path": "FedAvg", "grids": {}}]},
     "unknown key 'grids' in algorithm entry FedAvg; did you mean 'grid'?"),
    ({"algorithms": [{"class_path": "FedAvg", "zzz": {}}]},
     f"unknown key 'zzz' in algorithm entry FedAvg; algorithm entry FedAvg takes {TAKES}"),
    ({"benchmarks": [{"name": "b", "zzz": 1}]},
     "unknown key 'zzz' in benchmark 'b'; benchmark 'b' takes name, config, algorithms, control"),
    ({"benchmarks": [{"name": "b", "algorithms": []}]},
     "benchmark 'b': 'algorithms' must be a non-empty list of values, got []"),
    ({"scale": 5}, "'scale' must be a string, got 5"),
    ({"benchmarks": None}, "it has no 'benchmarks' entry"),
])
def test_a_wrong_entry_is_refused_naming_it_and_what_to_write(change, message):
    """Rule: every refusal of a suite is one line naming the entry (by class path, name or
    number) and what is wrong, with the value found."""
    raw = {**SUITE_ONE, **change}
    if change.get("benchmarks", "") is None:
        del raw["benchmarks"]
    with pytest.raises(SuiteFormatError) as refused:
        SuiteSpec.parse(raw, "'t'")
    assert str(refused.value) == (f"suite 't': {message}; see the format at the top of "
                                  "fl_lightning/records/suite_format.py")


def test_a_file_that_is_not_a_mapping_is_refused_saying_what_it_holds():
    """Rule: a suite file holding a list (or any non-mapping) is refused naming what it holds."""
    with pytest.raises(SuiteFormatError, match=r"^suite 't': the file must hold a mapping \(suite:, paper:, scale:, "
                                               r"base:, benchmarks:\), got list;"):
        SuiteSpec.parse([1, 2], "'t'")


def test_an_algorithm_entry_read_alone_is_named_by_its_number_in_the_list():
    """Rule: an algorithms list read on its own names an entry without a class path by its number."""
    with pytest.raises(SuiteFormatError, match=r"^suite \(algorithms\): algorithm entry 3 must be a mapping with a "
                                               r"'class_path' \(e\.g\. class_path: fl_lightning\.algorithms\.FedAvg\), "
                                               r"got \{'init_args': \{\}\};"):
        AlgorithmEntry.parse({"init_args": {}}, 3, "(algorithms)")


def test_a_grid_expands_to_one_model_config_per_combination():
    """Rule: each configuration is a LightningCLI model config (class_path, init_args) with the
    grid's values over the entry's init_args, labelled by the class name and the varied values."""
    entry = AlgorithmEntry.parse({"class_path": "fl_lightning.algorithms.FedProx", "init_args": {"lr": 1},
                                  "grid": {"mu": [0.1, 1], "tau": [0]}}, 0, "x")
    assert entry.configurations() == [
        ("FedProx(mu=0.1,tau=0)", {"class_path": "fl_lightning.algorithms.FedProx",
                                   "init_args": {"lr": 1, "mu": 0.1, "tau": 0}}),
        ("FedProx(mu=1,tau=0)", {"class_path": "fl_lightning.algorithms.FedProx",
                                 "init_args": {"lr": 1, "mu": 1, "tau": 0}})]


def test_two_rows_are_separated_when_welchs_p_is_below_alpha():
    """Rule (the tables' star): separated when Welch's two-sided p is strictly below alpha; never
    with fewer than 2 values in a row."""
    from leaderboard.stats import separated

    assert separated([1.0, 1.0], [2.0, 2.0]) and not separated([1.0, 1.0], [1.0, 1.0])
    assert not separated([1.0], [2.0, 2.0])
    first, second = [0.81, 0.79, 0.84, 0.80], [0.78, 0.77, 0.80, 0.70]
    p = welch_test(first, second).p
    assert not separated(first, second, alpha=p) and separated(first, second, alpha=p * 1.000001)
