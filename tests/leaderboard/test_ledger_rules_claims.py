"""The claims ledger's decision rules in leaderboard/claims/ (evaluation.py, results.py, quantities.py
and the decision parts of export.py), one test per rule, each written to fail when the rule is broken:
mutmut's survivors over those files (issue 48, benchmarks/perf/results/mutation_ledger.md). Every test
asserts what a reader of the page sees: a verdict, a number, a withdrawal, the exact text of a cell."""

from __future__ import annotations

from dataclasses import replace

import pytest

from leaderboard import claims as ledger
from leaderboard.claims.evaluation import degenerate
from leaderboard.claims.results import index_runs
from leaderboard.registration import Degeneracy, LedgerPlan
from leaderboard.runs import RunRecord
from tests.leaderboard.test_claims import BENCH, SEED_EFFECT, SUITE, claim_spec, paired_runs, run

NARROW = [0.02 + 0.001 * k for k in range(10)]  # A - B about +2.45 pp, a narrow interval


def evaluate(spec: dict, runs: list, plan: LedgerPlan | None = None) -> ledger.ClaimResult:
    return ledger.evaluate(ledger.parse_claims(spec, "x", "x/claims.yaml"), runs, plan)[0]


def why_withdrawn(runs: list[RunRecord], plan: LedgerPlan | None = None) -> str:
    return degenerate(index_runs(runs), SUITE, BENCH, plan or LedgerPlan())


def floored(config: str, seed: int, accuracy: float, worst5: float | None = 0.0) -> RunRecord:
    """A run whose worst 5 % of clients end at ``worst5`` (None: not logged)."""
    record = run(config, seed, accuracy)
    if worst5 is not None:
        record.histories["test_acc_worst5"] = [(40, worst5)]
    return record


# --- the degeneracy rule: a benchmark that cannot rank anything is withdrawn -------------------------

def test_a_constant_predictor_needs_four_runs_at_one_accuracy_and_says_its_accuracy():
    four = [run(c, s, 0.192) for c in "AB" for s in range(2)]
    assert why_withdrawn(four) == "every run of every configuration ends at 19.20 %: a constant predictor"
    assert why_withdrawn(four[:3]) == ""  # three runs are too few to call a benchmark degenerate


def test_a_constant_predictor_tolerates_less_than_a_millionth_of_a_point_and_no_more():
    # accuracies as fractions: 1e-8 is 1e-6 percentage points, exactly the tolerance
    below = [run(c, s, 0.0 if s else 9e-9) for c in "AB" for s in range(2)]
    assert why_withdrawn(below).endswith("a constant predictor")
    at = [run(c, s, 0.0 if s else 1e-8) for c in "AB" for s in range(2)]
    assert why_withdrawn(at) == ""
    apart = [run(c, s, 0.5 if s else 0.52) for c in "AB" for s in range(2)]
    assert why_withdrawn(apart) == ""


def test_a_constant_predictor_is_judged_only_when_the_plan_says_so():
    four = [run(c, s, 0.192) for c in "AB" for s in range(2)]
    plan = replace(LedgerPlan(), degeneracy=Degeneracy(constant_predictor=False, worst5_at_zero=True))
    assert why_withdrawn(four, plan) == ""


def test_worst_clients_at_zero_in_four_runs_withdraw_the_benchmark_with_its_counts_and_span():
    runs = [floored(c, s, 0.3 + 0.01 * s + (0.02 if c == "A" else 0.0)) for c in "AB" for s in range(2)]
    runs.append(floored("C", 0, 0.25))
    assert why_withdrawn(runs) == ("the worst 5 % of clients are at 0 % in all 5 runs of its 3 configurations; "
                                   "mean client accuracy 25.0-33.0 %: a degenerate benchmark")
    assert why_withdrawn(runs[:3]) == ""  # three runs are too few
    four = runs[:4]
    assert why_withdrawn(four).startswith("the worst 5 % of clients are at 0 % in all 4 runs of its 2 configurations")


def test_worst_clients_at_zero_must_hold_in_every_run():
    runs = [floored(c, s, 0.3 + 0.01 * s) for c in "AB" for s in range(2)]
    one_above = runs[:3] + [floored("B", 1, 0.31, worst5=0.01)]
    assert why_withdrawn(one_above) == ""
    one_unlogged = runs[:3] + [floored("B", 1, 0.31, worst5=None)]
    assert why_withdrawn(one_unlogged) == ""


def test_worst_clients_at_zero_is_judged_only_when_the_plan_says_so():
    runs = [floored(c, s, 0.3 + 0.01 * s) for c in "AB" for s in range(2)]
    plan = replace(LedgerPlan(), degeneracy=Degeneracy(constant_predictor=True, worst5_at_zero=False))
    assert why_withdrawn(runs, plan) == ""


def test_worst_clients_at_zero_without_a_mean_accuracy_names_no_span():
    runs = []
    for c in "AB":
        for s in range(2):
            record = floored(c, s, 0.3)
            del record.histories["test_acc_mean"]
            record.metrics.pop("test_acc_mean")
            runs.append(record)
    assert why_withdrawn(runs) == ("the worst 5 % of clients are at 0 % in all 4 runs of its 2 configurations: "
                                   "a degenerate benchmark")


def test_the_degeneracy_rule_reads_the_plans_primary_point():
    # every run ends at 50 %, but the mean of the last three evaluations differs: at last3 it ranks
    runs = [run(c, s, [0.1 * (s + 1), 0.2 + 0.1 * s, 0.3, 0.5]) for c in "AB" for s in range(2)]
    assert why_withdrawn(runs).endswith("ends at 50.00 %: a constant predictor")
    assert why_withdrawn(runs, replace(LedgerPlan(), primary_point="last3")) == ""


# --- what a comparison's cell says (results.difference_text and its parts) ---------------------------

from leaderboard.claims.results import ComparisonResult, level_text, unpaired_text  # noqa: E402
from leaderboard.claims.spec import Comparison, Side  # noqa: E402
from leaderboard.stats import CONTRADICTED, INCONCLUSIVE, REPRODUCED, TOO_FEW, PairedResult  # noqa: E402

CLAIM = ledger.parse_claims(claim_spec([{"treatment": "A", "baseline": "B"}]), "x", "x/claims.yaml")[0]


def comparison(quantity: str = "mean", direction: str = "greater", margin: float = 0.0,
               paper: tuple[float, ...] = (), threshold: float | None = None) -> Comparison:
    baseline = None if threshold is not None else Side("B", BENCH, quantity)
    return Comparison(Side("A", BENCH, quantity), baseline, threshold, direction, margin, paper)


def decided(mean: float = 2.17, low: float | None = 1.41, high: float | None = 2.93, n: int = 10,
            verdict: str = REPRODUCED, level: float = 0.975) -> PairedResult:
    return PairedResult(n, mean, 1.0, low, high, level, 0.001, 0.002, verdict, 0.9)


def cell(entry: ComparisonResult) -> str:
    return ledger.difference_text(entry, CLAIM)


@pytest.mark.parametrize(("level", "text"), [
    (0.95, "95 %"), (0.975, "97.5 %"), (0.9833333, "98.3 %"), (0.9, "90 %"), (1.0, "100 %"), (0.5, "50 %"),
])
def test_a_confidence_level_is_labelled_in_percent_without_trailing_zeros(level, text):
    assert level_text(level) == text


def test_unpaired_seeds_are_grouped_by_why_in_the_order_given():
    assert unpaired_text({"4": "B has no run of it"}) == "seed 4 left out: B has no run of it"
    assert unpaired_text({"2": "A's rho is undefined", "4": "B has no run of it", "6": "A's rho is undefined"}) == (
        "seeds 2, 6 left out: A's rho is undefined; seed 4 left out: B has no run of it")
    assert unpaired_text({}) == ""


def test_a_withdrawn_or_unpaired_comparison_says_so_instead_of_a_number():
    entry = ComparisonResult(comparison(), SUITE, decided(), {}, {}, withdrawn="every run ends at 10 %")
    assert cell(entry) == "withdrawn: every run ends at 10 %"
    assert cell(ComparisonResult(comparison(), SUITE, None, {}, {})) == "no paired runs"


def test_a_cell_reads_mean_interval_level_and_seeds():
    entry = ComparisonResult(comparison(), SUITE, decided(), {}, {})
    assert cell(entry) == "+2.17 pp [+1.41, +2.93] (97.5 % CI), 10 seeds"


def test_a_cell_in_another_unit_uses_its_unit_and_decimals():
    angle = ComparisonResult(comparison("angle"), SUITE, decided(0.1234, 0.05, 0.2, level=0.95), {}, {})
    assert cell(angle) == "+0.123 rad [+0.050, +0.200] (95 % CI), 10 seeds"
    rho = ComparisonResult(comparison("rho", threshold=50.0), SUITE, decided(-3.5, -5.0, -2.0, level=0.95), {}, {})
    assert cell(rho) == "-3.50 [-5.00, -2.00] (95 % CI), 10 seeds"  # no unit


def test_one_seed_without_an_interval_and_seeds_left_out_say_of_how_many():
    entry = ComparisonResult(comparison(), SUITE, decided(low=None, high=None, n=1, verdict=TOO_FEW), {}, {},
                             unpaired={"1": "B has no run of it", "2": "B has no run of it"})
    assert cell(entry) == "+2.17 pp, 1 seed of 3 with runs (seeds 1, 2 left out: B has no run of it)"
    only_low = ComparisonResult(comparison(), SUITE, decided(high=None), {}, {})
    assert cell(only_low) == "+2.17 pp, 10 seeds"


def test_an_inconclusive_cell_names_the_detectable_effect_of_its_test():
    entry = ComparisonResult(comparison(), SUITE, decided(0.3, -0.2, 0.8, verdict=INCONCLUSIVE), {}, {},
                             detectable=1.2345)
    assert cell(entry) == "+0.30 pp [-0.20, +0.80] (97.5 % CI), 10 seeds; detectable ≥ 1.23"
    equal = ComparisonResult(comparison(direction="equal", margin=0.2), SUITE,
                             decided(0.3, -0.2, 0.8, verdict=INCONCLUSIVE, level=0.9), {}, {}, detectable=0.456)
    assert cell(equal) == ("+0.30 pp [-0.20, +0.80] (90 % CI), 10 seeds; "
                           "equivalence detectable within ±0.46 (margin 0.2)")
    reproduced = ComparisonResult(comparison(), SUITE, decided(), {}, {}, detectable=1.2345)
    assert "detectable" not in cell(reproduced)


def test_a_comparison_holm_did_not_reach_shows_no_interval_and_no_detectable_effect():
    entry = ComparisonResult(comparison(), SUITE, decided(0.8, 0.1, 1.5, verdict=INCONCLUSIVE), {}, {},
                             detectable=1.0, holm_not_reached=True)
    assert cell(entry) == ("+0.80 pp (no interval: not reached by Holm, which stopped at an earlier comparison "
                           "of the claim), 10 seeds")


@pytest.mark.parametrize(("direction", "paper", "words"), [
    ("greater", (60.0, 50.0), "beyond our interval in the claimed direction: ours is weaker"),
    ("greater", (51.0, 50.0), "short of our interval in the claimed direction: ours is stronger"),
    ("greater", (52.0, 50.0), "inside our interval"),
    ("less", (40.0, 50.0), "beyond our interval in the claimed direction: ours is weaker"),
    ("less", (55.0, 50.0), "short of our interval in the claimed direction: ours is stronger"),
    ("equal", (60.0, 50.0), "above our interval"),
    ("equal", (40.0, 50.0), "below our interval"),
])
def test_a_cell_places_the_papers_effect_in_words(direction, paper, words):
    margin = 1.0 if direction == "equal" else 0.0
    entry = ComparisonResult(comparison(direction=direction, margin=margin, paper=paper), SUITE, decided(), {}, {})
    sign = "+" if paper[0] > paper[1] else "-"
    assert cell(entry) == (f"+2.17 pp [+1.41, +2.93] (97.5 % CI), 10 seeds; paper {sign}{abs(paper[0] - paper[1]):.2f}"
                           f" ({words})")


def test_a_papers_effect_without_our_interval_is_quoted_unplaced():
    entry = ComparisonResult(comparison(paper=(60.0, 50.0)), SUITE, decided(low=None, high=None), {}, {})
    assert cell(entry) == "+2.17 pp, 10 seeds; paper +10.00"


def test_a_cell_names_knife_edge_seeds_unconverged_runs_the_extension_and_mixed_versions():
    entry = ComparisonResult(comparison(), SUITE, decided(), {}, {}, convergence={"converged": 16, "unconverged": 4},
                             versions=("v1", "v2"), knife_edge=("3", "9"),
                             extension=decided(2.0, 1.5, 2.5, n=20, verdict=REPRODUCED))
    assert cell(entry) == (
        "+2.17 pp [+1.41, +2.93] (97.5 % CI), 10 seeds; knife-edge: leaving out seeds 3, 9 alone changes the "
        "verdict; 4 of 20 runs unconverged; extension beyond the plan: 20 seeds +2.00 → reproduced (not the "
        "verdict); ⚠ runs of 2 code versions")
    one = ComparisonResult(comparison(), SUITE, decided(), {}, {}, convergence={"converged": 20},
                           versions=("v1",), knife_edge=("3",))
    assert cell(one) == ("+2.17 pp [+1.41, +2.93] (97.5 % CI), 10 seeds; knife-edge: leaving out seed 3 alone "
                         "changes the verdict")


# --- the verdict at a sensitivity point -------------------------------------------------------------

def test_a_comparison_without_a_verdict_at_a_point_counts_its_primary_verdict_there():
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), paired_runs(NARROW))
    assert result.verdict == REPRODUCED
    entry = result.comparisons[0]
    entry.at_points.clear()
    assert result.verdict_at("last3") == REPRODUCED and not result.fragile
    entry.at_points["last3"] = CONTRADICTED
    assert result.verdict_at("last3") == CONTRADICTED and result.fragile_points == [("last3", CONTRADICTED)]


# --- the reading rule: every quantity read at the plan's point or reading ----------------------------

from leaderboard.claims.quantities import over_rounds_value  # noqa: E402


def series_run(**series: list[tuple[int, float]]) -> RunRecord:
    record = run("A", 0, 0.5)
    record.histories.update(series)
    return record


def test_a_series_is_read_over_every_round_unless_a_reading_is_named():
    record = series_run(conflicts_model=[(1, 1.0), (2, 2.0), (3, 3.0), (4, 6.0)])
    assert over_rounds_value(record, "conflicts_model") == 3.0
    assert over_rounds_value(record, "conflicts_model", "final") == 6.0
    assert over_rounds_value(record, "missing") is None


def test_the_second_half_starts_at_half_the_last_logged_round():
    # the last round is 20: the second half is rounds 10 on (not from half the round before it, 10 / 2)
    record = series_run(conflicts_model=[(1, 1.0), (2, 2.0), (6, 6.0), (10, 10.0), (20, 30.0)])
    assert over_rounds_value(record, "conflicts_model", "second_half") == 20.0
    # values unlike their rounds: the cut is by round, not by value
    record = series_run(conflicts_model=[(2, 100.0), (4, 1.0), (6, 2.0), (8, 0.0)])
    assert over_rounds_value(record, "conflicts_model", "second_half") == 1.0


def test_server_time_is_in_milliseconds_and_absent_without_a_series():
    record = series_run(server_time_s=[(1, 0.5), (2, 0.7)])
    assert ledger.quantity_value(record, "server_time") == pytest.approx(600.0)
    assert ledger.quantity_value(record, "server_time", 1, "final") == pytest.approx(700.0)
    assert ledger.quantity_value(series_run(), "server_time") is None


def test_a_per_agent_quantity_is_read_at_the_point_or_reading_asked():
    record = series_run(**{"cgsv_r/2": [(10, 0.1), (20, 0.2), (30, 0.6)],
                           "cgsv_psi/1": [(1, 0.1), (2, 0.2), (3, 0.6)]})
    assert ledger.quantity_value(record, "agent_r:2", 3) == pytest.approx(0.3)
    assert ledger.quantity_value(record, "agent_psi:1", 1, "final") == pytest.approx(0.6)
    assert ledger.quantity_value(record, "agent_psi:1", 1, "second_half") == pytest.approx(0.4)


# --- the claim's row: effect summary, scale, convergence per arm, its notes (export.py) --------------

from leaderboard.claims import export as claims_export  # noqa: E402
from leaderboard.claims.results import ClaimResult  # noqa: E402


def placed(paper: tuple[float, ...], label: str = "A") -> ComparisonResult:
    """A comparison whose interval is [+1.41, +2.93] and the paper's effect ``paper``."""
    entry = ComparisonResult(comparison(paper=paper), SUITE, decided(), {}, {})
    return replace(entry, comparison=replace(entry.comparison, treatment=replace(entry.comparison.treatment,
                                                                                  config=label)))


def test_the_effect_summary_counts_each_side_most_common_first():
    inside, weaker, stronger = (52.0, 50.0), (60.0, 50.0), (50.5, 50.0)
    assert ledger.effect_summary(ClaimResult(CLAIM, [placed(())])) == ""
    assert ledger.effect_summary(ClaimResult(CLAIM, [placed(weaker)])) == "weaker than the paper's effect"
    assert ledger.effect_summary(ClaimResult(CLAIM, [placed(weaker), placed(weaker)])) == (
        "weaker than the paper's effect (2 of 2)")
    mixed = ClaimResult(CLAIM, [placed(inside), placed(stronger), placed(inside), placed(())])
    assert ledger.effect_summary(mixed) == "paper's effect: inside 2 of 3, ours stronger 1 of 3"


def test_the_scale_names_the_dataset_and_model_of_the_offline_benchmark_and_the_papers():
    assert claims_export.scale_text(CLAIM) == "offline scale: mnist5k, fl_mlp"
    paper = replace(CLAIM, paper_scale=replace(CLAIM.offline, benchmark="cifar10/dir-0.5/full/fl_ffn"))
    assert claims_export.scale_text(paper) == "offline scale: mnist5k, fl_mlp (the paper: cifar10, fl_ffn)"
    assert claims_export.scale_text(replace(CLAIM, offline=None)) == ""


def test_the_tally_scale_names_every_dataset_and_model_of_the_claims_with_comparisons():
    other = replace(CLAIM, offline=replace(CLAIM.offline, benchmark="synthetic/iid/full/fl_logreg"))
    untested = replace(CLAIM, offline=replace(CLAIM.offline, benchmark="cifar10/iid/full/fl_ffn"))
    results = [ClaimResult(CLAIM, [placed(())]), ClaimResult(other, [placed(())]), ClaimResult(untested, []),
               ClaimResult(replace(CLAIM, offline=None), [placed(())])]
    assert claims_export.tally_scale(results) == "offline scale (mnist5k, synthetic; fl_logreg, fl_mlp)"
    assert claims_export.tally_scale([ClaimResult(untested, [])]) == ""


def test_convergence_per_arm_counts_a_run_shared_by_two_comparisons_once():
    first = replace(placed(()), convergence_arms={"treatment": {"a0": "converged", "a1": "unconverged"},
                                                  "baseline": {"b0": "converged", "b1": "too short to judge"}})
    second = replace(placed((), "C"), convergence_arms={"treatment": {"c0": "converged"},
                                                        "baseline": {"b0": "converged", "b1": "too short to judge"}})
    assert claims_export.convergence_by_arm([first, second]) == [
        ("treatment", "2 converged, 1 unconverged, 0 too short to judge"),
        ("baseline", "1 converged, 0 unconverged, 1 too short to judge")]
    assert claims_export.convergence_by_arm([placed(())]) == []


def row_of(result: ClaimResult, plan: LedgerPlan | None = None) -> claims_export.ClaimRow:
    return ledger.claim_rows([result], [], {}, plan)[0]


def test_a_claims_notes_name_fragile_points_knife_edge_seeds_holm_and_the_runs_read():
    first = replace(placed((), "A"), knife_edge=("3", "9"), at_points={"last3": CONTRADICTED}, planned_seeds=10,
                    convergence_arms={"treatment": {"a0": "converged"}, "baseline": {"b0": "unconverged"}})
    second = replace(placed((), "C"), result=decided(0.5, -0.1, 1.1, verdict=INCONCLUSIVE), knife_edge=("4",),
                     holm_not_reached=True, at_points={"last3": INCONCLUSIVE}, planned_seeds=10)
    result = ClaimResult(CLAIM, [first, second], plan=LedgerPlan())
    row = row_of(result, LedgerPlan())
    assert row.verdict == INCONCLUSIVE and row.verdict_detail == "1/2 comparisons reproduced"
    assert row.badges == ("fragile", "knife-edge")
    assert row.notes == (
        "Fragile: at the final evaluation it is inconclusive; at the mean of the last 3 evaluations contradicted.",
        "Knife-edge: A − B: leaving out seeds 3, 9 alone changes its verdict; C − B: leaving out seed 4 alone "
        "changes its verdict.",
        "Not reached by Holm: C − B (Holm's step-down stopped at an earlier comparison, so these are inconclusive "
        "and their own intervals are not shown).",
        "Runs read: treatment: 1 converged, 0 unconverged, 0 too short to judge; "
        "baseline: 0 converged, 1 unconverged, 0 too short to judge.")


def test_a_row_counts_by_construction_comparisons_apart_and_a_single_comparison_has_no_count():
    assert row_of(ClaimResult(CLAIM, [placed(())])).verdict_detail == ""
    built = replace(placed((), "C"), comparison=replace(placed((), "C").comparison, by_construction="C is B"))
    assert row_of(ClaimResult(CLAIM, [placed(()), built])).verdict_detail == "1 more by construction, not counted"
    three = ClaimResult(CLAIM, [placed(()), placed((), "D"), built])
    assert row_of(three).verdict_detail == "2/2 comparisons reproduced; 1 more by construction, not counted"
    untested = replace(CLAIM, not_tested="no Shapley sampling here")
    assert row_of(ClaimResult(untested, [placed(()), placed((), "D")])).verdict_detail == "no Shapley sampling here"


@pytest.mark.parametrize(("n", "note"), [(1, "Only 1 paired seeds of the plan's 10."), (9, "Only 9 paired seeds "
                                         "of the plan's 10."), (10, None)])
def test_a_row_says_when_fewer_seeds_than_the_plans_star_minimum_were_paired(n, note):
    entry = replace(placed(()), result=decided(n=n), planned_seeds=10)
    notes = row_of(ClaimResult(CLAIM, [entry]), LedgerPlan()).notes
    assert [n for n in notes if n.startswith("Only")] == ([note] if note else [])
    assert not [n for n in row_of(ClaimResult(CLAIM, [entry])).notes if n.startswith("Only")]  # no plan, no note
    none = replace(placed(()), result=None, planned_seeds=10)
    assert not [n for n in row_of(ClaimResult(CLAIM, [none]), LedgerPlan()).notes if n.startswith("Only")]


def test_a_timing_claim_without_runs_read_has_no_runs_note():
    timing = ledger.parse_claims(claim_spec([{"treatment": "A", "baseline": "B"}], direction="less",
                                            quantity="server_time"), "x", "x/claims.yaml")[0]
    assert not [n for n in row_of(ClaimResult(timing, [placed(())])).notes if n.startswith("Runs read")]
    read = replace(placed(()), convergence_arms={"treatment": {"a0": "too short to judge"},
                                                 "baseline": {"b0": "too short to judge"}})
    assert [n for n in row_of(ClaimResult(timing, [read])).notes if n.startswith("Runs read")] == [
        "Runs read: 2 timing runs (a timing run measures steady-state rounds: the convergence rule does not judge it)."]


def test_a_rows_labels_say_retired_amended_by_construction_stand_ins_extension_and_versions():
    from leaderboard.claims.spec import Retirement
    from leaderboard.registration import Amendment
    claim = replace(CLAIM, retired=Retirement("2026-11-30", "the paper's own reading."),
                    by_construction="A is B plus one.", not_implemented="no FedLF here.")
    amendments = (Amendment("A7", "2026-11-28", "c1", "x", "margin 0.5 pp", "why", False),
                  Amendment("A9", "2026-11-29", "c1", "y", "seeds 0-19", "why", True))
    entry = replace(placed(()), versions=("v1", "v2"), planned_seeds=10,
                    extension=decided(2.0, 1.5, 2.5, n=20, verdict=CONTRADICTED))
    row = row_of(ClaimResult(claim, [entry], amendments=amendments))
    assert row.badges == ("retired", "amended", "by construction")
    assert row.notes == (
        "Retired 2026-11-30: the paper's own reading. Its verdict on today's runs is still shown, and not counted "
        "in the tally.",
        "Amended: A7 (2026-11-28): margin 0.5 pp; A9 (2026-11-29): seeds 0-19",
        "Holds by construction: A is B plus one.",
        "Not implemented: no FedLF here. The project's stand-ins are the ablations below, never the verdict.",
        "Seeds beyond the plan's 10 give contradicted; an extension, not the verdict.",
        "⚠ Paired runs come from 2 code versions.")
    stand_in = row_of(ClaimResult(replace(CLAIM, not_testable="the paper's baseline is not logged."), [entry]))
    assert "Not testable as stated: the paper's baseline is not logged. The project's stand-ins are the ablations " \
           "below." in stand_in.notes


# --- the unpaired-seed rule: a verdict rests on the planned seeds both arms have ---------------------

from leaderboard.claims.evaluation import knife_edge_seeds  # noqa: E402


def test_the_values_a_verdict_rests_on_are_the_planned_seeds_of_each_arm():
    runs = [run(c, s, 0.8 + (0.02 if c == "A" else 0.0) + 0.001 * s) for c in "AB" for s in range(20)]
    entry = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs).comparisons[0]
    planned_seeds = {str(s) for s in range(10)}
    assert set(entry.treatment_values) == planned_seeds and set(entry.baseline_values) == planned_seeds
    csv_seeds = {row["seed"] for row in claims_export.export_rows([evaluate(
        claim_spec([{"treatment": "A", "baseline": "B"}]), runs)])}
    assert csv_seeds == planned_seeds


def test_convergence_and_code_versions_count_only_the_paired_runs():
    runs = paired_runs(NARROW)
    for record in runs:
        record.known_code_version = "v1"
    runs = [r for r in runs if not (r.config == "B" and r.seed == "4")]
    unpaired = next(r for r in runs if r.config == "A" and r.seed == "4")
    unpaired.known_code_version = "v2"
    entry = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs).comparisons[0]
    assert sum(entry.convergence.values()) == 18  # 9 pairs; A's run of seed 4 has no partner
    assert entry.versions == ("v1",) and "code versions" not in ledger.difference_text(entry, CLAIM)
    assert len(entry.convergence_arms["treatment"]) == 9 and len(entry.convergence_arms["baseline"]) == 9


def test_unpaired_seeds_are_listed_in_numeric_order():
    plan = replace(LedgerPlan(), default_seeds=12)
    runs = [run(c, s, 0.8 + (0.02 if c == "A" else 0.0) + 0.001 * s) for c in "AB" for s in range(12)
            if not (c == "B" and s in (2, 10))]
    entry = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs, plan).comparisons[0]
    assert list(entry.unpaired) == ["2", "10"]
    assert "(seeds 2, 10 left out: B has no run of it)" in ledger.difference_text(entry, CLAIM)


def test_an_arm_with_no_run_at_all_leaves_every_seed_out_saying_so():
    runs = [run("A", s, 0.8) for s in range(3)]
    entry = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs).comparisons[0]
    assert entry.verdict == ledger.NO_RUNS
    assert entry.unpaired == dict.fromkeys(["0", "1", "2"], "B has no run of it")


def test_a_seed_whose_quantity_is_undefined_without_a_known_cause_says_only_that():
    runs = paired_runs(NARROW)
    for record in runs:
        if record.config == "A" and record.seed == "3":
            record.histories["test_acc_mean"] = []
            record.metrics.pop("test_acc_mean")
    entry = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs).comparisons[0]
    assert entry.unpaired == {"3": "A's mean client accuracy is undefined in its run"}


def test_knife_edge_seeds_are_listed_in_numeric_order():
    comparisons = [Comparison(Side("A", BENCH, "mean"), Side("B", BENCH, "mean"), None, "greater", 0.0)]
    seeds = [str(s) for s in range(12)]
    differences = [0.45 + (1.0 if k % 2 else -1.0) for k in range(12)]
    differences[2] += 1.0
    differences[10] += 1.0
    flips = knife_edge_seeds(comparisons, [(dict(zip(seeds, differences)), dict.fromkeys(seeds, 0.0))], 0.05)[0]
    assert flips == ["1", "2", "3", "5", "7", "9", "10", "11"]


def test_worst_clients_and_the_accuracy_span_are_read_at_the_plans_primary_point():
    # worst 5 % at 0 at the final evaluation, not over the last three; the span is of the last three's mean
    runs = []
    for c in "AB":
        for s in range(2):
            record = run(c, s, [0.2, 0.3, 0.4 + 0.1 * s, 0.5])
            record.histories["test_acc_worst5"] = [(10, 0.1), (20, 0.1), (30, 0.1), (40, 0.0)]
            runs.append(record)
    worst_only = Degeneracy(constant_predictor=False)
    assert why_withdrawn(runs, replace(LedgerPlan(), degeneracy=worst_only)).endswith(
        "mean client accuracy 50.0-50.0 %: a degenerate benchmark")
    assert why_withdrawn(runs, replace(LedgerPlan(), primary_point="last3", degeneracy=worst_only)) == ""
    for record in runs:
        record.histories["test_acc_worst5"] = [(10, 0.0), (20, 0.0), (30, 0.0), (40, 0.0)]
    assert why_withdrawn(runs, replace(LedgerPlan(), primary_point="last3")).endswith(
        "mean client accuracy 40.0-43.3 %: a degenerate benchmark")


# --- Holm's family and the plan's settings inside evaluate_family -----------------------------------

from leaderboard.registration import Convergence  # noqa: E402
from tests.leaderboard.test_ledger_rules import family_runs, gap_with_p  # noqa: E402

TWO = claim_spec([{"treatment": "A", "baseline": "B"}, {"treatment": "C", "baseline": "B"}])


def test_holm_walks_from_the_smallest_p_whatever_the_order_of_the_comparisons():
    # the comparison listed first has the larger p: judged second, at alpha / 1, it still holds
    result = evaluate(TWO, family_runs({"A": gap_with_p(0.04), "C": gap_with_p(0.001)}))
    assert [c.verdict for c in result.comparisons] == [REPRODUCED, REPRODUCED]
    assert [c.result.level for c in result.comparisons] == pytest.approx([0.95, 0.975])
    assert not any(c.holm_not_reached for c in result.comparisons)


def test_a_comparison_alone_is_decided_at_the_plans_alpha():
    plan = replace(LedgerPlan(), alpha=0.10)
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), family_runs({"A": gap_with_p(0.07)}), plan)
    assert result.verdict == REPRODUCED and result.comparisons[0].result.level == pytest.approx(0.90)
    assert evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]),
                    family_runs({"A": gap_with_p(0.07)})).verdict == INCONCLUSIVE


def test_holm_judges_equivalence_against_the_claims_margin():
    # two "equal" comparisons, both within 0.05 pp of B: equivalent within 1 pp, not within 0.01 pp
    tiny = {"A": [0.0005 * ((-1) ** k) for k in range(10)], "C": [0.0004 * ((-1) ** k) for k in range(10)]}
    pairs = [{"treatment": "A", "baseline": "B"}, {"treatment": "C", "baseline": "B"}]
    wide = evaluate(claim_spec(pairs, direction="equal", margin=1.0), family_runs(tiny))
    assert [c.verdict for c in wide.comparisons] == [REPRODUCED, REPRODUCED]
    narrow = evaluate(claim_spec(pairs, direction="equal", margin=0.01), family_runs(tiny))
    assert REPRODUCED not in [c.verdict for c in narrow.comparisons]


def test_an_inconclusive_comparison_in_a_family_names_its_detectable_effect():
    result = evaluate(TWO, family_runs({"A": gap_with_p(0.001), "C": gap_with_p(0.3)}))
    entry = result.comparisons[1]
    assert entry.verdict == INCONCLUSIVE and not entry.holm_not_reached
    assert entry.detectable == pytest.approx(entry.result.mde) and entry.result.sd == pytest.approx(1.0)
    assert f"; detectable ≥ {entry.result.mde:.2f}" in ledger.difference_text(entry, CLAIM)


def test_two_seeds_are_too_few_to_decide_but_their_detectable_effect_is_reported():
    runs = [r for r in paired_runs(NARROW) if int(r.seed) < 2]
    entry = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs).comparisons[0]
    assert entry.verdict == TOO_FEW and entry.result.n == 2
    assert entry.detectable is not None and entry.detectable == pytest.approx(entry.result.mde)


def test_a_suites_own_seed_count_in_the_plan_picks_its_planned_seeds():
    plan = replace(LedgerPlan(), suite_seeds={SUITE: 5})
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), paired_runs(NARROW), plan)
    entry = result.comparisons[0]
    assert entry.result.n == 5 and entry.planned_seeds == 5 and set(entry.treatment_values) == set("01234")
    assert result.extension_verdict == REPRODUCED  # seeds 5-9 are beyond this suite's plan


def long_run(config: str, seed: int, level: float, rise: float) -> RunRecord:
    """Twelve evaluations at ``level``, the last three ``rise`` (a fraction) higher."""
    return run(config, seed, [level] * 9 + [level + rise] * 3)


def test_convergence_is_judged_with_the_plans_threshold():
    runs = [long_run(c, s, 0.8 + SEED_EFFECT[s] + (0.02 + 0.001 * s if c == "A" else 0.0), 0.02)
            for c in "AB" for s in range(10)]
    spec = claim_spec([{"treatment": "A", "baseline": "B"}])
    strict = evaluate(spec, runs).comparisons[0]
    assert strict.convergence == {"unconverged": 20}  # a 2-point change against the default 1 point
    loose = evaluate(spec, runs, replace(LedgerPlan(), convergence=Convergence(3, 5.0))).comparisons[0]
    assert loose.convergence == {"converged": 20}
    assert set(loose.convergence_arms["treatment"].values()) == {"converged"}
    assert set(loose.convergence_arms["baseline"].values()) == {"converged"}


def test_paired_runs_of_two_code_versions_are_flagged():
    runs = paired_runs(NARROW)
    for record in runs:
        record.known_code_version = "v2" if record.seed == "0" else "v1"
    entry = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs).comparisons[0]
    assert entry.versions == ("v1", "v2")
    assert ledger.difference_text(entry, CLAIM).endswith("; ⚠ runs of 2 code versions")


def test_a_row_with_fewer_paired_seeds_than_planned_names_the_plans_count():
    runs = [r for r in paired_runs(NARROW) if int(r.seed) < 7]
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs)
    assert "Only 7 paired seeds of the plan's 10." in row_of(result, LedgerPlan()).notes
    assert claims_export.export_rows([result])[0]["suite"] == SUITE


def test_sensitivity_points_are_read_on_the_planned_seeds_only():
    # seeds 0-9 (planned): A above B; seeds 10-19: A far below B. Read on every seed, last3 would flip
    runs = [run(c, s, 0.8 + (0.02 + 0.001 * (s % 10) if c == "A" else 0.0) - (0.1 if c == "A" and s >= 10 else 0.0))
            for c in "AB" for s in range(20)]
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs)
    assert result.verdict == REPRODUCED and result.comparisons[0].at_points == {"last3": REPRODUCED}
    assert not result.fragile


def test_a_withdrawn_benchmark_is_withdrawn_at_every_point_too():
    runs = [run(c, s, 0.192) for c in "AB" for s in range(10)]
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs)
    assert result.comparisons[0].at_points == {"last3": ledger.WITHDRAWN} and not result.fragile


def test_an_extension_needs_more_paired_seeds_than_the_plan():
    spec = claim_spec([{"treatment": "A", "baseline": "B"}])
    # seed 15 in one arm only: nothing pairs beyond the plan
    extra = evaluate(spec, paired_runs(NARROW) + [run("A", 15, 0.9)])
    assert extra.comparisons[0].extension is None and extra.extension_verdict == ""
    # only unplanned seeds pair: no verdict, and no extension beside it
    late = [run(c, s, 0.8 + (0.02 + 0.001 * s if c == "A" else 0.0)) for c in "AB" for s in range(10, 15)]
    result = evaluate(spec, late)
    assert result.verdict == ledger.NO_RUNS and result.comparisons[0].extension is None
    # one arm only, beyond the plan too: nothing pairs anywhere
    alone = evaluate(spec, [run("A", s, 0.8 + 0.001 * s) for s in range(12)])
    assert alone.verdict == ledger.NO_RUNS and alone.comparisons[0].extension is None


def test_a_not_tested_claim_shows_no_comparison_even_when_it_lists_some():
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}], not_tested="the paper's data"),
                      paired_runs(NARROW))
    assert result.verdict == ledger.NOT_TESTED and result.comparisons == []


def test_ablations_are_decided_under_the_plan():
    runs = paired_runs(NARROW)
    runs += [run(r.config, int(r.seed), r.final("test_acc_mean"), suite="abl") for r in paired_runs(NARROW)]
    spec = claim_spec([{"treatment": "A", "baseline": "B"}],
                      ablations=[{"suite": "abl", "benchmark": BENCH, "factor": "the paper's rounds"}])
    plan = replace(LedgerPlan(), suite_seeds={"abl": 4})
    result = evaluate(spec, runs, plan)
    assert result.ablations[0].comparisons[0].result.n == 4 and result.comparisons[0].result.n == 10


def test_a_retirement_reason_loses_only_its_final_full_stop():
    from leaderboard.claims.spec import Retirement
    row = row_of(ClaimResult(replace(CLAIM, retired=Retirement("2026-11-30", "superseded by Table X.")),
                             [placed(())]))
    assert row.notes[0].startswith("Retired 2026-11-30: superseded by Table X. Its verdict")


def test_several_fragile_points_and_several_unreached_comparisons_are_listed_in_one_note_each():
    plan = replace(LedgerPlan(), sensitivity_points=("last3", "last5"))
    first = replace(placed((), "A"), at_points={"last3": CONTRADICTED, "last5": INCONCLUSIVE})
    second = replace(placed((), "C"), holm_not_reached=True, at_points={"last3": REPRODUCED, "last5": REPRODUCED})
    third = replace(placed((), "D"), holm_not_reached=True, at_points={"last3": REPRODUCED, "last5": REPRODUCED})
    row = row_of(ClaimResult(CLAIM, [first, second, third], plan=plan), plan)
    assert row.notes[0] == ("Fragile: at the final evaluation it is reproduced; at the mean of the last 3 "
                            "evaluations contradicted; at the mean of the last 5 evaluations inconclusive.")
    assert row.notes[1].startswith("Not reached by Holm: C − B, D − B (Holm's step-down")


def test_a_row_carries_the_claims_words_its_evidence_pages_and_the_commands_that_rerun_it():
    from types import SimpleNamespace

    from leaderboard.claims.spec import SuiteFile
    abl_bench = BENCH + "/attacked"
    spec = claim_spec([{"treatment": "A", "baseline": "B"}], quote="A is better.", bar="A above B.",
                      reason="Because.", paper_scale={"suite": "paper-scale", "benchmark": "cifar10/iid/full/fl_ffn"},
                      ablations=[{"suite": "abl", "benchmark": abl_bench, "factor": "the attack"},
                                 {"suite": SUITE, "benchmark": BENCH, "factor": "same suite again"}])
    spec["name"], spec["citation"] = "Paper (X et al.)", "X et al. 2021"
    runs = paired_runs(NARROW) + [run(r.config, int(r.seed), r.final("test_acc_mean"), benchmark=abl_bench,
                                      suite="abl") for r in paired_runs(NARROW)]
    result = evaluate(spec, runs)
    tables = [SimpleNamespace(suite=SUITE, benchmark=BENCH, main=True, slug="main-page"),
              SimpleNamespace(suite="abl", benchmark=abl_bench, main=True, slug="abl-page")]
    suites = {SUITE: SuiteFile(SUITE, "x/offline", (BENCH,)), "abl": SuiteFile("abl", "x/abl", (abl_bench,)),
              "paper-scale": SuiteFile("paper-scale", "x/paper", ("cifar10/iid/full/fl_ffn",))}
    row = ledger.claim_rows([result], tables, suites)[0]
    assert (row.paper, row.citation, row.where, row.claim, row.quote, row.bar, row.claim_id) == (
        "Paper (X et al.)", "X et al. 2021", "Table 1", "A beats B", "A is better.", "A above B.", "c1")
    assert row.effect == ledger.effect_summary(result) and row.reason == result.reason and "Because." in row.reason
    assert row.evidence == (claims_export.Link(BENCH, "benchmarks/main-page.html"),)
    assert row.commands == ("fl-benchmarks run x/offline --jobs 2", "fl-benchmarks run x/abl --jobs 2",
                            "fl-benchmarks run x/paper   # paper scale: needs the data and a GPU")
    assert [(factor, page) for factor, _, _, page, _ in row.ablations] == [
        ("the attack", claims_export.Link(abl_bench, "benchmarks/abl-page.html")),
        ("same suite again", claims_export.Link(BENCH, "benchmarks/main-page.html"))]


def test_a_shared_model_tested_on_the_shared_set_reads_its_global_accuracy_as_the_clients():
    from fl_lightning.records.vocabulary import Tag
    record = run("A", 0, 0.5)
    del record.histories["test_acc_mean"]
    record.metrics.pop("test_acc_mean")
    record.tags[Tag.CLIENT_TEST] = "global"
    record.histories["global_test_acc"] = [(10, 0.6), (20, 0.7)]
    record.metrics["global_test_acc"] = 0.7
    assert ledger.quantity_value(record, "mean") == pytest.approx(70.0)
    assert ledger.quantity_value(record, "mean", 2) == pytest.approx(65.0)


def test_a_quantity_is_named_by_what_precedes_its_first_colon():
    from leaderboard.claims.quantities import quantity_of
    assert quantity_of("agent_r:1:2").label == "reputation r"
    with pytest.raises(KeyError, match="nope:1"):
        quantity_of("nope:1")


def test_an_agents_sparsity_without_its_series_is_undefined():
    record = series_run(**{"cgsv_density/1": [(1, 0.2), (2, 0.4)]})
    assert ledger.quantity_value(record, "agent_sparsity:1") == pytest.approx(70.0)
    assert ledger.quantity_value(record, "agent_sparsity:5") is None
