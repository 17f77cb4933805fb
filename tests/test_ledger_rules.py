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

from fl_lightning.suite_format import AlgorithmEntry, SuiteFormatError, SuiteSpec
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
from tests.test_claims import SEED_EFFECT, SUITE, claim_spec, paired_runs, run

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
