"""The ledger's labels say what the test did (issue 48): the paper's effect on the right side for every
direction, comparisons Holm did not reach, knife-edge verdicts, one reading rule for every quantity
(means over rounds included), the scale on every verdict, and the convergence counts of both arms."""

from __future__ import annotations

import csv
import io
import math

import pytest

from leaderboard import claims as ledger
from leaderboard.claims import export as claims_export
from leaderboard.claims.evaluation import holm_family, knife_edge_seeds
from leaderboard.claims.spec import Comparison, Side
from leaderboard.registration import RegistrationError, parse_plan
from leaderboard.stats import CONTRADICTED, INCONCLUSIVE, REPRODUCED
from tests.leaderboard.test_claims import BENCH, SEED_EFFECT, claim_spec, paired_runs, run

NARROW = [0.02 + 0.001 * k for k in range(10)]  # A - B about +2.45 pp, a narrow interval


def evaluate(spec: dict, runs, plan=None) -> ledger.ClaimResult:
    return ledger.evaluate(ledger.parse_claims(spec, "x", "x/claims.yaml"), runs, plan)[0]


def one(paper: list[float], direction: str = "greater", gap=NARROW, **extra) -> ledger.ClaimResult:
    return evaluate(claim_spec([{"treatment": "A", "baseline": "B", "paper": paper}], direction=direction, **extra),
                    paired_runs(gap))


# --- the paper's effect against ours, in the claimed direction ---------------------------------------

@pytest.mark.parametrize(("direction", "gap", "paper", "position", "side", "summary"), [
    # greater: ours +2.45; the paper +10 lies above (further in the claimed direction): ours is weaker
    ("greater", NARROW, [60.0, 50.0], "above", "weaker", "weaker than the paper's effect"),
    ("greater", NARROW, [50.5, 50.0], "below", "stronger", "stronger than the paper's effect"),
    ("greater", NARROW, [52.45, 50.0], "inside", "inside", "paper's effect inside our interval"),
    # less: ours -2.45; the paper -10 lies below (further in the claimed direction): ours is weaker
    ("less", [-g for g in NARROW], [40.0, 50.0], "below", "weaker", "weaker than the paper's effect"),
    ("less", [-g for g in NARROW], [49.5, 50.0], "above", "stronger", "stronger than the paper's effect"),
    # equal: no claimed side, the paper's difference is placed as it lies
    ("equal", [0.001 * ((-1) ** k) for k in range(10)], [55.0, 50.0], "above", "above",
     "paper's difference above our interval"),
])
def test_the_papers_effect_is_weaker_or_stronger_in_the_claimed_direction(direction, gap, paper, position, side,
                                                                          summary):
    extra = {"margin": 1.0} if direction == "equal" else {}
    result = one(paper, direction, gap, **extra)
    entry = result.comparisons[0]
    assert entry.paper_position == position
    assert entry.paper_side == side
    assert ledger.effect_summary(result) == summary
    text = ledger.difference_text(entry, result.claim)
    if side == "weaker":
        assert "ours is weaker" in text and "stronger" not in text
    if side == "stronger":
        assert "ours is stronger" in text and "weaker" not in text


def test_a_less_claim_with_a_smaller_effect_than_the_papers_never_reads_larger():
    """fedfv-t2-spread: ours -1.45 against the paper's -2.87 was labelled 'larger than the paper's effect'."""
    gap = [-0.0145 + 0.0005 * ((-1) ** k) for k in range(10)]
    result = one([9.70, 12.57], "less", gap)
    assert result.comparisons[0].paper_side == "weaker"
    assert "larger" not in ledger.effect_summary(result) and "stronger" not in ledger.effect_summary(result)


# --- Holm's step-down: comparisons it did not reach ---------------------------------------------------

def _shifted(mean: float) -> list[float]:
    """Ten differences with sd sqrt(10/9) around ``mean``: the t statistic is mean * sqrt(10) / sd."""
    return [mean + (1.0 if k % 2 else -1.0) for k in range(10)]


def test_a_comparison_after_holms_first_non_rejection_is_not_reached_and_shows_no_interval():
    # raw p about 0.03 (judged at 0.025: not rejected) and 0.04 (its own step, 0.05, would reject it)
    first, second = _shifted(0.857), _shifted(0.797)
    comparisons = [Comparison(Side("A", BENCH, "mean"), Side("B", BENCH, "mean"), None, "greater", 0.0),
                   Comparison(Side("C", BENCH, "mean"), Side("B", BENCH, "mean"), None, "greater", 0.0)]
    results, not_reached = holm_family(comparisons, [first, second], 0.05)
    assert 0.025 < results[0].p < 0.05 and results[0].p < results[1].p < 0.05
    assert results[0].verdict == INCONCLUSIVE and results[1].verdict == INCONCLUSIVE
    assert not_reached == {1}
    # on the page: no interval beside "inconclusive" for the comparison Holm did not reach
    runs = []
    for seed in range(10):
        base = 0.8 + SEED_EFFECT[seed]
        runs += [run("B", seed, base), run("A", seed, base + first[seed] / 100),
                 run("C", seed, base + second[seed] / 100)]
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}, {"treatment": "C", "baseline": "B"}]), runs)
    reached, stopped = result.comparisons
    assert not reached.holm_not_reached and stopped.holm_not_reached
    assert "CI)" in ledger.difference_text(reached, result.claim)
    text = ledger.difference_text(stopped, result.claim)
    assert "CI)" not in text and "not reached by Holm" in text and "detectable" not in text
    row = ledger.claim_rows([result], [], {})[0]
    assert any(note.startswith("Not reached by Holm: C − B") for note in row.notes)


# --- knife-edge: one seed decides ----------------------------------------------------------------------

def test_a_verdict_that_one_seed_decides_is_knife_edge_and_a_clear_one_is_not():
    comparison = [Comparison(Side("A", BENCH, "mean"), Side("B", BENCH, "mean"), None, "greater", 0.0)]
    seeds = [str(s) for s in range(10)]
    base = dict.fromkeys(seeds, 0.0)
    # p just under 0.05: dropping the seed with the largest difference makes it inconclusive
    edge = _shifted(0.75)
    edge[9] += 0.3
    flips = knife_edge_seeds(comparison, [(dict(zip(seeds, edge)), base)], 0.05)[0]
    assert "9" in flips
    clear = knife_edge_seeds(comparison, [(dict(zip(seeds, _shifted(3.0))), base)], 0.05)[0]
    assert clear == []
    runs = []
    for seed in range(10):
        b = 0.8 + SEED_EFFECT[seed]
        runs += [run("B", seed, b), run("A", seed, b + edge[seed] / 100)]
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs)
    assert result.comparisons[0].knife_edge and "9" in result.comparisons[0].knife_edge
    row = ledger.claim_rows([result], [], {})[0]
    assert "knife-edge" in row.badges
    assert "knife-edge: leaving out seed" in ledger.difference_text(result.comparisons[0], result.claim)


# --- one reading rule: means over rounds have sensitivity readings too ------------------------------

PLAN_V2 = {"primary_point": "final", "sensitivity_points": ["last3", "last5"],
           "over_rounds": {"primary": "all", "sensitivity": ["second_half", "final"]}}


def conflicts_run(config: str, seed: int, series: list[float]) -> object:
    record = run(config, seed, 0.8 + 0.01 * seed + (0.005 if config == "A" else 0.0))
    record.histories["conflicts_model"] = [(k + 1, v) for k, v in enumerate(series)]
    return record


def test_a_mean_over_rounds_is_fragile_when_its_last_round_says_otherwise():
    """cgsv-fig1-shapley read the mean over rounds only; at its last round the verdict flipped unseen."""
    runs = []
    for seed in range(10):
        wobble = 0.01 * seed
        runs.append(conflicts_run("A", seed, [10.0 + wobble] * 9 + [1.0 + wobble]))  # above B but at its end
        runs.append(conflicts_run("B", seed, [5.0] * 10))
    plan = parse_plan(PLAN_V2)
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}], quantity="conflicts"), runs, plan)
    assert result.verdict == REPRODUCED  # mean over every round: 9.1 > 5
    assert dict(result.fragile_points) == {"last5": CONTRADICTED}  # paired with the last round: 1 < 5
    row = ledger.claim_rows([result], [], {}, plan)[0]
    assert "fragile" in row.badges
    assert any("at the last round contradicted" in note for note in row.notes)


def test_over_rounds_readings_reduce_the_series_as_named():
    record = conflicts_run("A", 0, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert ledger.quantity_value(record, "conflicts") == pytest.approx(3.5)
    assert ledger.quantity_value(record, "conflicts", 1, "second_half") == pytest.approx((3 + 4 + 5 + 6) / 4)
    assert ledger.quantity_value(record, "conflicts", 1, "final") == 6.0
    with pytest.raises(ValueError, match="unknown reading over rounds"):
        ledger.quantity_value(record, "conflicts", 1, "median")


def test_rho_is_read_at_the_point_like_any_final_quantity():
    record = run("A", 0, 0.8)
    record.histories["cgsv_rho"] = [(10, 90.0), (20, 60.0), (30, 30.0)]
    assert ledger.quantity_value(record, "rho") == 30.0
    assert ledger.quantity_value(record, "rho", 3) == pytest.approx(60.0)


def test_a_plan_pairs_one_over_rounds_reading_with_each_sensitivity_point():
    plan = parse_plan(PLAN_V2)
    assert plan.over_rounds_at("final") == "all"
    assert plan.over_rounds_at("last3") == "second_half" and plan.over_rounds_at("last5") == "final"
    assert plan.reading_label("last3", over_rounds=True) == "mean over the second half of the rounds"
    assert plan.reading_label("last3") == "mean of the last 3 evaluations"
    with pytest.raises(RegistrationError, match="one reading over rounds for each sensitivity point"):
        parse_plan({**PLAN_V2, "over_rounds": {"primary": "all", "sensitivity": ["final"]}})
    with pytest.raises(RegistrationError, match="unknown reading over rounds"):
        parse_plan({**PLAN_V2, "over_rounds": {"primary": "everything", "sensitivity": ["final", "final"]}})


# --- the scale and the convergence counts on every row -----------------------------------------------

def test_every_verdict_names_the_scale_it_was_measured_at():
    result = one([60.0, 50.0], paper_scale={"suite": "x-paper", "benchmark": "cifar10/pat-1/p0.1/fl_cnn"})
    assert claims_export.scale_text(result.claim) == \
        "offline scale: mnist5k, fl_mlp (the paper: cifar10, fl_cnn)"
    row = ledger.claim_rows([result], [], {})[0]
    assert row.scale.startswith("offline scale: mnist5k")
    rows = list(csv.DictReader(io.StringIO(ledger.export_csv([result]))))
    assert rows and all(r["scale"] == "offline scale: mnist5k, fl_mlp (the paper: cifar10, fl_cnn)" for r in rows)
    assert ledger.summary_rows([result])[0]["scale"] == row.scale
    assert claims_export.tally_scale([result]) == "offline scale (mnist5k; fl_mlp)"


def test_each_claim_row_counts_converged_unconverged_and_too_short_runs_per_arm():
    runs = []
    for seed in range(10):
        rising = [0.5 + 0.05 * k for k in range(10)]  # +15 pp between its last two windows: unconverged
        flat = [0.8] * 10
        runs += [run("A", seed, rising if seed < 3 else flat), run("B", seed, [0.7, 0.7] if seed == 0 else flat)]
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs)
    row = ledger.claim_rows([result], [], {})[0]
    note = next(n for n in row.notes if n.startswith("Runs read:"))
    assert "treatment: 7 converged, 3 unconverged, 0 too short to judge" in note
    assert "baseline: 9 converged, 0 unconverged, 1 too short to judge" in note
    assert not math.isnan(result.comparisons[0].result.mean)


# --- the tally says whether its verdicts are exploratory ---------------------------------------------

def test_the_page_is_exploratory_unless_every_claims_confirmatory_verdict_counts():
    from leaderboard.claims.passes import evaluate_passes
    from leaderboard.registration import CONFIRMATORY, LEDGER_PASS_TAG, PLAN_HASH_TAG
    from leaderboard.site import exploratory_text

    registered = parse_plan({**PLAN_V2, "version": 2, "registered": "2026-12-06", "registered_hash": "ab" * 32})
    claims = ledger.parse_claims(claim_spec([{"treatment": "A", "baseline": "B"}]), "x", "x/claims.yaml")
    fresh_seeds = tuple(range(1000, 1010))

    def banner(plan, runs) -> str:
        return exploratory_text(plan, evaluate_passes(claims, runs, plan, (), fresh_seeds))

    runs = paired_runs(NARROW)
    text = banner(registered, runs)
    assert text.startswith("Every verdict on this page is exploratory")
    assert "registration abababababab" in text and "no confirmatory run is read here yet" in text
    fresh = paired_runs(NARROW)
    for record in fresh:
        record.run_id += "-fresh"
        record.tags |= {LEDGER_PASS_TAG: CONFIRMATORY, PLAN_HASH_TAG: "ab" * 32, "seed": str(1000 + int(record.seed))}
    assert banner(registered, runs + fresh) == ""
    fresh[0].tags[PLAN_HASH_TAG] = "cd" * 32  # one run of another registration: never mixed in silently
    text = banner(registered, runs + fresh)
    assert "decides 0 of the 1 claims" in text and "tally counts confirmatory verdicts only" in text
    unregistered = parse_plan(PLAN_V2)
    assert "not registered yet" in banner(unregistered, paired_runs(NARROW))


def test_a_by_construction_comparison_stays_out_of_holms_family():
    """A comparison that holds by construction (FedLF - 0 = 0) must not take a Holm step from the tested ones."""
    tested, built = _shifted(0.797), _shifted(0.0)  # raw p about 0.04; exactly 1 (no difference)
    plain = [Comparison(Side("C", BENCH, "mean"), Side("B", BENCH, "mean"), None, "greater", 0.0)]
    marked = plain + [Comparison(Side("A", BENCH, "mean"), Side("B", BENCH, "mean"), None, "greater", 0.0,
                                 by_construction="zero by design")]
    unmarked = plain + [Comparison(Side("A", BENCH, "mean"), Side("B", BENCH, "mean"), None, "greater", 0.0)]
    alone = holm_family(plain, [tested], 0.05)[0][0]
    with_marked = holm_family(marked, [tested, built], 0.05)[0][0]
    with_unmarked = holm_family(unmarked, [tested, built], 0.05)[0][0]
    assert alone.verdict == REPRODUCED and with_marked.verdict == REPRODUCED
    assert with_marked.level == alone.level == 0.95 and with_marked.p_holm == alone.p_holm
    assert with_unmarked.verdict == INCONCLUSIVE and with_unmarked.level == pytest.approx(0.975)  # the step it cost


def test_a_timing_claim_counts_timing_runs_without_judging_their_convergence():
    runs = []
    for seed in range(10):
        for config, ms in (("A", 0.030), ("B", 0.120 + 0.001 * seed)):
            record = run(config, seed, [0.8, 0.8 + 0.01 * seed])  # two evaluations: too short to judge
            record.histories["server_time_s"] = [(k, ms) for k in range(1, 21)]
            runs.append(record)
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}], direction="less", quantity="server_time"),
                      runs)
    assert result.verdict == REPRODUCED
    notes = ledger.claim_rows([result], [], {})[0].notes
    assert "Runs read: 20 timing runs (a timing run measures steady-state rounds: the convergence rule does not " \
           "judge it)." in notes
    assert not any("too short to judge" in note for note in notes)


def test_a_quotes_subscripts_render_as_subscripts_and_nothing_else_as_html():
    from leaderboard.site import subscripts

    assert str(subscripts("q-FedAvg<sub>|q=5.0</sub> & <b>x</b>")) == \
        "q-FedAvg<sub>|q=5.0</sub> &amp; &lt;b&gt;x&lt;/b&gt;"
