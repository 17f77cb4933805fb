"""The claims ledger (leaderboard/claims.py, benchmarks/<paper>/claims.yaml): the files name suites,
benchmarks and configurations that exist; verdicts rest on paired per-seed differences."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import numpy as np
import pytest
import yaml
from scipy import stats

from benchmarks.suites import load_suite
from leaderboard import claims as ledger
from leaderboard.claims import spec as claims_spec
from leaderboard.runs import RunRecord
from leaderboard.stats import CONTRADICTED, INCONCLUSIVE, REPRODUCED, TOO_FEW
from tests.paths import REPO

SUITE = "ledger-offline"
BENCH = "mnist5k/pat-1/p0.1/fl_mlp"
OTHER = "mnist5k/pat-1/p0.1/fl_mlp/attacked"


def run(config: str, seed: int, accuracy: float | list[float], benchmark: str = BENCH, suite: str = SUITE,
        **metrics: float) -> RunRecord:
    """A finished run whose mean accuracy history is ``accuracy`` (a list: one value per evaluation)."""
    history = accuracy if isinstance(accuracy, list) else [accuracy] * 4
    histories = {"test_acc_mean": [(10 * (k + 1), v) for k, v in enumerate(history)]}
    when = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return RunRecord(
        run_id=f"{suite}-{benchmark}-{config}-{seed}", experiment=suite, status="FINISHED", start_time=when,
        end_time=when, tags={"suite": suite, "benchmark": benchmark, "algorithm_config": config, "seed": str(seed)},
        params={}, metrics={"test_acc_mean": history[-1], **metrics}, histories=histories)


def claim_spec(comparisons: list[dict], direction: str = "greater", quantity: str = "mean", **extra) -> dict:
    return {"paper": "x", "claims": [{"id": "c1", "where": "Table 1", "claim": "A beats B", "quantity": quantity,
                                      "direction": direction, "offline": {"suite": SUITE, "benchmark": BENCH},
                                      "comparisons": comparisons, **extra}]}


def evaluate(spec: dict, runs: list[RunRecord]) -> ledger.ClaimResult:
    return ledger.evaluate(ledger.parse_claims(spec, "x", "x/claims.yaml"), runs)[0]


# --- the ledger files ------------------------------------------------------------------------------

def test_every_claim_names_an_existing_suite_benchmark_and_configuration():
    claims = ledger.load_claims()
    suites = ledger.suite_files()
    assert len(claims) >= 25
    assert {c.paper for c in claims} == {"cgsv", "fedfv", "fedlf", "fedmgda_plus"}
    assert ledger.claim_problems(claims, suites) == []
    configs: dict[tuple[str, str], set[str]] = {}
    for suite in {c.offline.suite for c in claims if c.offline} | {
        a.location.suite for c in claims for a in c.ablations
    }:
        for cell in load_suite(suites[suite].path, [0]):
            configs.setdefault((suite, cell.benchmark), set()).add(cell.algorithm_config)
    for claim in claims:
        families = [(claim.offline.suite if claim.offline else "", claim.comparisons)]
        families += [(a.location.suite, a.comparisons) for a in claim.ablations]
        for suite, comparisons in families:
            for comparison in comparisons:
                for side in (comparison.treatment, comparison.baseline):
                    if side is not None:
                        assert side.config in configs[(suite, side.benchmark)], (claim.id, suite, side)
    untested = [c for c in claims
                if not (c.not_tested or c.stand_ins_only) and (c.offline is None or not c.comparisons)]
    assert not untested


def test_every_offline_suite_a_claim_rests_on_runs_ten_seeds():
    suites = ledger.suite_files()
    for claim in ledger.load_claims():
        for location in [claim.offline] + [a.location for a in claim.ablations]:
            if location is not None:
                seeds = {cell.seed for cell in load_suite(suites[location.suite].path)}
                assert len(seeds) >= 10, (claim.id, location.suite)


def test_claim_problems_names_what_is_missing():
    claims = ledger.parse_claims(claim_spec([{"treatment": "A", "baseline": "B"}]), "x")
    suites = {SUITE: ledger.SuiteFile(SUITE, "x/offline", ("another/benchmark",))}
    assert ledger.claim_problems(claims, suites) == [
        f"c1: comparison benchmark {BENCH!r} is not in suite {SUITE}",
        f"c1: offline benchmark {BENCH!r} is not in suite {SUITE}"]
    assert "is not defined" in ledger.claim_problems(claims, {})[0]


@pytest.mark.parametrize("change, message", [
    ({"quantity": "accuracy"}, "unknown quantity 'accuracy'"),
    ({"direction": "bigger"}, "direction 'bigger' is not one of"),
    ({"direction": "equal"}, "needs a positive `margin`"),
    ({"comparisons": [{"treatment": "A"}]}, "exactly one of `baseline` and `threshold`"),
    ({"comparisons": [{"treatment": "A", "baseline": "B", "threshold": 1}]}, "exactly one of"),
    ({"comparisons": []}, "or `not_tested` / `not_testable` / `not_implemented` with the reason"),
    ({"retired": {"date": "2026-01-01"}}, "`retired` is"),
    ({"quantity": "agent_r"}, "needs an agent"),
])
def test_a_malformed_claim_is_refused_with_what_is_wrong(change, message):
    spec = claim_spec([{"treatment": "A", "baseline": "B"}])
    spec["claims"][0].update(change)
    with pytest.raises(ledger.ClaimsError, match=message):
        ledger.parse_claims(spec, "x", "x/claims.yaml")


def test_a_yaml_error_names_the_file(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "claims.yaml").write_text("claims: [\n")
    with pytest.raises(ledger.ClaimsError, match="p/claims.yaml: not valid YAML"):
        ledger.load_claims(tmp_path)


# --- values at the convergence point ------------------------------------------------------------

def test_a_malformed_suite_file_is_refused_naming_it_not_skipped(tmp_path):
    """The claims' suites are read by the runner's own suite format: a suite file the runner would
    refuse is refused here too (once it was skipped, and its claims said "suite not defined")."""
    (tmp_path / "fedfv").mkdir()
    good = {"suite": "mine-offline", "paper": "fedfv", "scale": "offline", "base": {},
            "benchmarks": [{"name": "digits/iid/full/fl_logreg"}],
            "algorithms": [{"class_path": "fl_lightning.algorithms.FedAvg"}]}
    (tmp_path / "fedfv" / "mine.yaml").write_text(yaml.safe_dump(good))
    (tmp_path / "fedfv" / "claims.yaml").write_text("claims: []\n")  # beside the suites, not one
    suites = ledger.suite_files(tmp_path)
    assert list(suites) == ["mine-offline"] and suites["mine-offline"].benchmarks == ("digits/iid/full/fl_logreg",)
    (tmp_path / "fedfv" / "mine.yaml").write_text(yaml.safe_dump({**good, "benchmark": []}))
    with pytest.raises(ledger.ClaimsError, match=r"mine.yaml.*unknown key 'benchmark'.*did you mean 'benchmarks'"):
        ledger.suite_files(tmp_path)


def test_a_run_is_read_at_the_final_evaluation_or_the_mean_of_its_last_k():
    record = run("A", 0, [0.5, 0.7, 0.8, 0.9, 0.7])
    assert ledger.quantity_value(record, "mean") == pytest.approx(70.0)  # the plan's primary point: final
    assert ledger.quantity_value(record, "mean", 3) == pytest.approx(100 * (0.8 + 0.9 + 0.7) / 3)


def test_a_window_longer_than_the_run_averages_every_evaluation():
    record = run("A", 0, [0.5, 0.6, 0.7])
    assert ledger.quantity_value(record, "mean", 5) == pytest.approx(60.0)


def test_a_run_moving_at_its_end_is_unconverged_rising_or_falling():
    from leaderboard.convergence import CONVERGED, TOO_SHORT, UNCONVERGED, convergence_status
    rising = run("A", 0, [0.5 + 0.05 * k for k in range(12)])
    falling = run("A", 0, [0.8] * 6 + [0.78, 0.77, 0.76, 0.70, 0.69, 0.68])
    flat = run("A", 0, [0.5, 0.79, 0.80, 0.81, 0.80, 0.81, 0.805, 0.80, 0.81, 0.80, 0.81, 0.805])
    assert convergence_status(rising) == UNCONVERGED
    assert convergence_status(falling) == UNCONVERGED
    assert convergence_status(flat) == CONVERGED
    # six evaluations: the earlier window would start at the run's first rounds: too short to judge,
    # never flagged for the rise from its start (the old rule flagged this flat-at-its-end curve)
    assert convergence_status(run("A", 0, [0.2, 0.6, 0.8, 0.8, 0.8, 0.8])) == TOO_SHORT
    assert convergence_status(run("A", 0, [0.5, 0.6])) == TOO_SHORT


def test_both_arms_of_a_comparison_are_counted_for_convergence():
    rising = [0.5 + 0.05 * k for k in range(12)]
    runs = [run("A", s, [v + 0.01 + SEED_EFFECT[s] for v in rising]) for s in range(10)]
    runs += [run("B", s, [v + SEED_EFFECT[s] for v in rising]) for s in range(10)]
    entry = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs).comparisons[0]
    assert entry.unconverged == 20 and sum(entry.convergence.values()) == 20  # not 10: one run per seed merged
    assert "20 of 20 runs unconverged" in ledger.difference_text(entry, ledger.parse_claims(
        claim_spec([{"treatment": "A", "baseline": "B"}]), "x")[0])


def test_agent_quantities_read_that_agents_series():
    record = run("A", 0, 0.5, **{"cgsv_r/2": 0.125})
    assert ledger.quantity_value(record, "agent_r:2") == 0.125
    assert ledger.quantity_value(record, "agent_r:3") is None


def test_psi_and_sparsity_are_means_over_rounds_as_cgsv_sec_3_3_reports_them():
    """CGSV Sec. 3.3 prints psi and the download sparsity averaged over the iterations: the final value
    (0.3 and density 0.9 here) must not be what the ledger reads."""
    record = run("A", 0, 0.5, **{"cgsv_psi/1": 0.3, "cgsv_density/1": 0.9})
    record.histories |= {"cgsv_psi/1": [(1, 0.1), (2, 0.2), (3, 0.3)],
                         "cgsv_density/1": [(1, 0.3), (2, 0.6), (3, 0.9)]}
    assert ledger.quantity_value(record, "agent_psi:1") == pytest.approx(0.2)
    assert ledger.quantity_value(record, "agent_sparsity:1") == pytest.approx(100 * (1 - 0.6))  # in %
    assert ledger.quantity_value(record, "agent_psi:0") is None


# --- verdicts ------------------------------------------------------------------------------------

SEED_EFFECT = [0.02, -0.03, 0.01, 0.04, -0.02, 0.00, 0.03, -0.01, 0.02, -0.04]  # shared by both configs


def paired_runs(gap: list[float], base: float = 0.8) -> list[RunRecord]:
    runs = []
    for seed, (effect, delta) in enumerate(zip(SEED_EFFECT, gap)):
        runs += [run("A", seed, base + effect + delta), run("B", seed, base + effect)]
    return runs


def test_paired_difference_and_interval_equal_scipy_on_fixed_numbers():
    gap = [0.021, 0.018, 0.025, 0.015, 0.022, 0.019, 0.024, 0.02, 0.017, 0.023]
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), paired_runs(gap))
    entry = result.comparisons[0].result
    differences = 100 * np.array(gap)
    assert entry.n == 10
    assert entry.mean == pytest.approx(differences.mean())
    assert entry.p == pytest.approx(stats.ttest_1samp(differences, 0.0).pvalue)
    half = stats.t.ppf(0.975, 9) * differences.std(ddof=1) / np.sqrt(10)
    assert (entry.low, entry.high) == pytest.approx((differences.mean() - half, differences.mean() + half))
    assert result.verdict == REPRODUCED


def test_the_seed_effect_cancels_in_a_paired_comparison():
    # a 0.5 pp gap under a seed effect of +-4 pp: unpaired it would be lost, paired it is decided
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]),
                      paired_runs([0.005 + 0.0005 * (k % 3) for k in range(10)]))
    assert result.verdict == REPRODUCED
    assert stats.ttest_ind([r.final("test_acc_mean") for r in paired_runs([0.005] * 10)[::2]],
                           [r.final("test_acc_mean") for r in paired_runs([0.005] * 10)[1::2]]).pvalue > 0.05


def test_clearly_worse_is_contradicted_and_too_few_seeds_is_said():
    runs = paired_runs([-0.02 + 0.001 * k for k in range(10)])
    assert evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs).verdict == CONTRADICTED
    few = [r for r in runs if r.seed in ("0", "1")]
    assert evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), few).verdict == TOO_FEW


def test_equal_within_the_margin_and_noisy_inconclusive_with_its_detectable_effect():
    small = [0.001 * ((-1) ** k) for k in range(10)]
    spec = claim_spec([{"treatment": "A", "baseline": "B"}], direction="equal", margin=1.0)
    assert evaluate(spec, paired_runs(small)).verdict == REPRODUCED
    noisy = [0.05 * ((-1) ** k) + 0.002 for k in range(10)]
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), paired_runs(noisy))
    assert result.verdict == INCONCLUSIVE
    entry = result.comparisons[0].result
    assert entry.mde > abs(entry.mean)
    assert "detectable ≥" in ledger.difference_text(result.comparisons[0], result.claim)


def test_holm_within_a_claim_can_undo_a_comparison_that_passes_alone():
    # p ~ 0.03 alone; in a family of three with two undecided comparisons it is judged at 0.05 / 3
    gap = [0.01, 0.003, 0.012, -0.003, 0.008, 0.002, -0.002, 0.009, 0.004, 0.0]
    alone = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), paired_runs(gap))
    assert alone.comparisons[0].result.p < 0.05 and alone.verdict == REPRODUCED
    runs = paired_runs(gap) + [run("C", s, 0.8 + SEED_EFFECT[s] + 0.03 * (-1) ** s) for s in range(10)]
    family = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}, {"treatment": "C", "baseline": "B"},
                                  {"treatment": "C", "baseline": "A"}]), runs)
    assert family.comparisons[0].result.verdict == INCONCLUSIVE
    assert family.comparisons[0].result.p_holm > 0.05


def test_a_threshold_claim_and_a_difference_across_benchmarks():
    runs = [run("A", s, 0.8 + SEED_EFFECT[s], cgsv_rho=60.0 + s) for s in range(10)]
    spec = claim_spec([{"treatment": "A", "threshold": 50}], quantity="rho")
    assert evaluate(spec, runs).verdict == REPRODUCED
    runs = [run("A", s, 0.80 + SEED_EFFECT[s]) for s in range(10)]
    runs += [run("A", s, 0.70 + SEED_EFFECT[s] + 0.001 * s, benchmark=OTHER) for s in range(10)]
    spec = claim_spec([{"treatment": {"config": "A", "benchmark": OTHER}, "baseline": "A"}], direction="less")
    result = evaluate(spec, runs)
    assert result.verdict == REPRODUCED
    assert result.comparisons[0].result.mean == pytest.approx(-10 + 0.45, abs=1e-9)


def test_a_planned_seed_left_out_of_the_pairs_is_named_with_why():
    """A NaN rho (every agent at one accuracy) or an arm with no run of a seed drops that seed from
    the pairs: the row says how many seeds the verdict rests on of those with runs, which and why."""
    runs = [run("A", s, 0.8 + SEED_EFFECT[s], cgsv_rho=float("nan") if s in (2, 6, 7) else 60.0 + s)
            for s in range(10)]
    result = evaluate(claim_spec([{"treatment": "A", "threshold": 50}], quantity="rho"), runs)
    entry = result.comparisons[0]
    assert entry.result.n == 7 and list(entry.unpaired) == ["2", "6", "7"]
    text = ledger.difference_text(entry, result.claim)
    assert "7 seeds of 10 with runs (seeds 2, 6, 7 left out: A's CGSV rho is undefined in its run (every agent" in text
    runs = [run("A", s, 0.8 + SEED_EFFECT[s]) for s in range(10)] + [run("B", s, 0.7) for s in range(10) if s != 4]
    entry = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs).comparisons[0]
    assert entry.result.n == 9 and entry.unpaired == {"4": "B has no run of it"}
    complete = [run("A", s, 0.8) for s in range(10)] + [run("B", s, 0.7) for s in range(10)]
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), complete)
    assert result.comparisons[0].unpaired == {}
    assert "with runs" not in ledger.difference_text(result.comparisons[0], result.claim)


def test_a_benchmark_where_everything_is_a_constant_predictor_is_withdrawn():
    runs = [run(config, s, 0.192) for config in ("A", "B") for s in range(10)]
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs)
    assert result.verdict == ledger.WITHDRAWN
    assert "constant predictor" in ledger.difference_text(result.comparisons[0], result.claim)


def test_missing_runs_and_untested_claims_say_so():
    assert evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), []).verdict == ledger.NO_RUNS
    spec = claim_spec([], not_tested="no Shapley sampling here")
    assert evaluate(spec, []).verdict == ledger.NOT_TESTED


def test_the_reason_names_the_ablation_that_changes_the_verdict():
    runs = paired_runs([-0.02 + 0.001 * k for k in range(10)])
    runs += [run(c, s, r.final("test_acc_mean") + (0.03 if c == "A" else 0.0), benchmark=OTHER, suite="abl")
             for r in runs for c, s in [(r.config, int(r.seed))]]
    spec = claim_spec([{"treatment": "A", "baseline": "B"}],
                      ablations=[{"suite": "abl", "benchmark": OTHER, "factor": "the paper's rounds"}])
    result = evaluate(spec, runs)
    assert result.verdict == CONTRADICTED
    assert result.ablations[0].verdict == REPRODUCED
    assert "Changes the verdict: the paper's rounds (contradicted → reproduced)" in result.reason


def test_exports_hold_every_value_a_verdict_rests_on():
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), paired_runs([0.02] * 10))
    rows = ledger.export_rows([result])
    assert len(rows) == 20 and {r["side"] for r in rows} == {"treatment", "baseline"}
    csv_lines = ledger.export_csv([result]).splitlines()
    assert csv_lines[0].startswith("claim,family,comparison,side") and len(csv_lines) == 21
    data = json.loads(ledger.export_json([result]))["claims"]
    treatment = [r["value"] for r in rows if r["side"] == "treatment"]
    baseline = [r["value"] for r in rows if r["side"] == "baseline"]
    assert data[0]["comparisons"][0]["mean"] == pytest.approx(np.mean(np.subtract(treatment, baseline)))
    assert yaml.safe_load(yaml.safe_dump(data))  # plain data, no NaN


def test_a_malformed_ledger_stops_the_build_in_one_line_before_the_store_is_read(tmp_path, capsys):
    from leaderboard.__main__ import main as leaderboard_main

    (tmp_path / "papers" / "x").mkdir(parents=True)
    (tmp_path / "papers" / "x" / "claims.yaml").write_text(yaml.safe_dump(
        claim_spec([{"treatment": "A", "baseline": "B"}], quantity="acuracy")))
    out = tmp_path / "site"
    code = leaderboard_main(["build", "--tracking-uri", f"sqlite:///{tmp_path / 'missing.db'}",
                             "--paper-numbers", str(tmp_path / "papers"), "--out", str(out)])
    assert code == 2 and not out.exists() and not (tmp_path / "missing.db").exists()
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0 and "x/claims.yaml: claim c1: unknown quantity 'acuracy'" in error


# --- the registered plan: fragile verdicts, planned seeds, labels ----------------------------------

def test_a_verdict_that_flips_between_points_is_fragile():
    # A beats B at the final evaluation only; over the last 3 evaluations A is below B
    runs = []
    for s in range(10):
        runs.append(
            run("A", s, [0.70 + SEED_EFFECT[s]] * 3 + [0.60 + SEED_EFFECT[s]] * 2 + [0.82 + SEED_EFFECT[s] + 0.001 * s])
        )
        runs.append(run("B", s, [0.75 + SEED_EFFECT[s]] * 6))
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs)
    assert result.verdict == REPRODUCED
    assert result.fragile and dict(result.fragile_points)["last3"] == CONTRADICTED
    row = ledger.claim_rows([result], [], {})[0]
    assert "fragile" in row.badges and any("Fragile" in note for note in row.notes)
    steady = evaluate(
        claim_spec([{"treatment": "A", "baseline": "B"}]), paired_runs([0.02 + 0.001 * k for k in range(10)])
    )
    assert steady.verdict == REPRODUCED and not steady.fragile


def test_seeds_beyond_the_plan_are_an_extension_never_the_verdict():
    gap = [0.02 + 0.001 * k for k in range(10)] + [-0.5] * 10  # seeds 10-19 reverse the sign
    runs = []
    for s, delta in enumerate(gap):
        effect = SEED_EFFECT[s % 10]
        runs += [run("A", s, 0.8 + effect + delta), run("B", s, 0.8 + effect)]
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs)
    assert result.verdict == REPRODUCED and result.comparisons[0].result.n == 10  # the plan's 10 seeds
    assert result.extension_verdict == CONTRADICTED and result.comparisons[0].extension.n == 20
    assert "extension beyond the plan: 20 seeds" in ledger.difference_text(result.comparisons[0], result.claim)


def test_intervals_are_labelled_with_their_real_level():
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}, {"treatment": "A", "baseline": "B"}]),
                      paired_runs([0.02 + 0.001 * k for k in range(10)]))
    texts = [ledger.difference_text(c, result.claim) for c in result.comparisons]
    assert any("(97.5 % CI)" in t for t in texts) and any("(95 % CI)" in t for t in texts)
    equal = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}], direction="equal", margin=1.0),
                     paired_runs([0.001 * ((-1) ** k) for k in range(10)]))
    assert "(90 % CI)" in ledger.difference_text(equal.comparisons[0], equal.claim)


def test_an_equal_claim_reports_the_equivalence_margin_its_seeds_could_show():
    from leaderboard.stats import equivalence_detectable
    noisy = [0.05 * ((-1) ** k) + 0.002 for k in range(10)]
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}], direction="equal", margin=1.0),
                      paired_runs(noisy))
    entry = result.comparisons[0]
    assert result.verdict == INCONCLUSIVE
    sd = float(np.std(np.multiply(noisy, 100), ddof=1))
    expected = (stats.t.ppf(0.95, 9) + stats.t.ppf(0.9, 9)) * sd / np.sqrt(10)
    assert entry.detectable == pytest.approx(expected) == pytest.approx(equivalence_detectable(10, sd, 0.05))
    assert "equivalence detectable within ±" in ledger.difference_text(entry, result.claim)


def test_the_papers_effect_is_placed_against_the_interval():
    runs = paired_runs([0.02 + 0.001 * k for k in range(10)])  # about +2.45 pp, a narrow interval
    above = evaluate(claim_spec([{"treatment": "A", "baseline": "B", "paper": [60.0, 50.0]}]), runs)
    inside = evaluate(claim_spec([{"treatment": "A", "baseline": "B", "paper": [52.45, 50.0]}]), runs)
    assert above.comparisons[0].paper_position == "above"
    assert ledger.effect_summary(above) == "weaker than the paper's effect"
    assert inside.comparisons[0].paper_position == "inside"


def test_a_claim_not_testable_as_stated_is_never_contradicted_by_its_stand_in():
    runs = paired_runs([-0.02 + 0.001 * k for k in range(10)])
    spec = claim_spec([], not_testable="the paper's FedAvg scores each agent on its own model",
                      ablations=[{"suite": SUITE, "benchmark": BENCH, "factor": "our FedAvg, one shared model",
                                  "comparisons": [{"treatment": "A", "baseline": "B"}]}])
    result = evaluate(spec, runs)
    assert result.ablations[0].verdict == CONTRADICTED
    assert result.verdict == ledger.NOT_TESTABLE


def test_a_claim_true_by_construction_is_labelled_so_not_reproduced():
    spec = claim_spec([{"treatment": "A", "baseline": "B"}], by_construction="its QP forbids it")
    assert evaluate(spec, paired_runs([0.02 + 0.001 * k for k in range(10)])).verdict == ledger.BY_CONSTRUCTION
    # the runs still decide: a construction claim the runs contradict says so
    assert evaluate(spec, paired_runs([-0.02 + 0.001 * k for k in range(10)])).verdict == CONTRADICTED


def test_a_retired_claim_stays_on_the_page_outside_the_tally():
    spec = claim_spec(
        [{"treatment": "A", "baseline": "B"}], retired={"date": "2026-11-25", "reason": "our own reading"}
    )
    result = evaluate(spec, paired_runs([0.02 + 0.001 * k for k in range(10)]))
    row = ledger.claim_rows([result], [], {})[0]
    assert row.retired and "retired" in row.badges and "our own reading" in " ".join(row.notes)
    assert row.verdict == REPRODUCED  # its verdict is still computed


def test_a_degenerate_benchmark_with_worst_clients_at_zero_is_withdrawn():
    runs = [
        run(c, s, 0.3 + 0.01 * s + (0.02 if c == "A" else 0.0), test_acc_worst5=0.0) for c in "AB" for s in range(10)
    ]
    for r in runs:
        r.histories["test_acc_worst5"] = [(40, 0.0)]
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs)
    assert result.verdict == ledger.WITHDRAWN and "worst 5 %" in result.comparisons[0].withdrawn


# --- reasons filled from the runs ----------------------------------------------------------------

def test_a_reason_states_numbers_computed_from_the_runs():
    runs = paired_runs([0.02 + 0.001 * k for k in range(10)])
    reason = ("B reaches {{ arm('ledger-offline', '" + BENCH + "', 'B', 'mean').mean | num(2) }} %; "
              "{{ arm('ledger-offline', '" + BENCH + "', 'A', 'mean').count(80.0) }} seeds at 80; "
              "A - B: {{ comparison(1).mean | signed(2) }} pp")
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}], reason=reason), runs)
    b = np.mean([100 * (0.8 + e) for e in SEED_EFFECT])
    a_values = [100 * (0.8 + e + 0.02 + 0.001 * k) for k, e in enumerate(SEED_EFFECT)]
    assert f"B reaches {b:.2f} %" in result.reason
    assert f"{sum(abs(v - 80.0) < 1e-9 for v in a_values)} seeds at 80" in result.reason
    assert f"A - B: {np.mean(a_values) - b:+.2f} pp" in result.reason


def test_a_reason_naming_runs_the_store_lacks_says_so_and_the_published_build_refuses_it():
    spec = claim_spec(
        [{"treatment": "A", "baseline": "B"}], reason="{{ arm('ledger-offline', 'x', 'Z', 'mean').mean }}"
    )
    runs = paired_runs([0.02] * 10)
    result = evaluate(spec, runs)  # a store with only some suites still builds: the verdict stands
    assert result.verdict == REPRODUCED
    assert "this store lacks: no runs of 'Z' on ledger-offline / x" in result.reason
    with pytest.raises(ledger.ClaimsError, match="no runs of 'Z'"):
        ledger.evaluate(ledger.parse_claims(spec, "x"), runs, strict=True)


TYPED_NUMBER = __import__("re").compile(r"(?<![\w.=-])[-+]?\d+(?:\.\d+)?\s?(?:pp|%|ms)(?!\w)")


def typed_run_numbers(reason: str) -> list[str]:
    """The percentages, pp and ms typed into a reason's text (outside template expressions) that are
    neither the paper's ("paper" near them) nor a setting's label ("40 % noise", "10 % sampled", "worst 5 %")."""
    import re
    literal = re.sub(r"\{\{.*?\}\}|\{%.*?%\}", "{}", reason, flags=re.S)
    found = []
    for match in TYPED_NUMBER.finditer(literal):
        before, after = (
            literal[max(0, match.start() - 60) : match.start()].lower(),
            literal[match.end() : match.end() + 80].lower(),
        )
        clause = re.split(r"[()]|\.\s", after, maxsplit=1)[0]  # the rest of its sentence or parenthesis
        label = re.match(
            r"\s*((and|or|,)\s*\d+(\.\d+)?\s?%\s*)?(noise|sampled|of the|of clients|online|participation)", after
        ) or re.search(r"(worst|best)\s*$", before)
        if not ("paper" in before or "paper" in clause or "table" in before or label):
            found.append(match.group())
    return found


def test_typed_numbers_from_our_runs_are_found_in_a_reason():
    assert typed_run_numbers("FedAvg reaches 79.5 % here (paper: 53 %), at 10 % sampled") == ["79.5 %"]
    assert typed_run_numbers("FedAvg reaches {{ arm('s', 'b', 'FedAvg', 'mean').mean | num(1) }} %") == []


def test_no_shipped_reason_types_a_number_from_our_runs():
    """Every percentage, pp or ms in a reason comes from a template expression, or is the paper's."""
    for claim in ledger.load_claims():
        assert typed_run_numbers(claim.reason) == [], claim.id


# --- the papers' words and coverage ----------------------------------------------------------------

def test_every_claim_quotes_its_paper_and_its_where_names_a_covered_item():
    claims = ledger.load_claims()
    coverage = ledger.load_coverage()
    assert {e.paper for e in coverage} == {"cgsv", "fedfv", "fedlf", "fedmgda_plus"}
    assert ledger.coverage_problems(claims, coverage) == []
    assert all(claim.bar for claim in claims), [c.id for c in claims if not c.bar]


def test_coverage_problems_names_a_missing_quote_an_unknown_item_and_an_unlisted_claim():
    claims = ledger.parse_claims(claim_spec([{"treatment": "A", "baseline": "B"}]), "x")
    coverage = [ledger.CoverageEntry("x", "Table 2", ("c9",))]
    problems = ledger.coverage_problems(claims, coverage)
    assert "c1: no `quote` (the paper's words, verbatim)" in problems
    assert any("names no item" in p for p in problems) and any("no coverage entry lists it" in p for p in problems)
    assert any("unknown claim 'c9'" in p for p in problems)
    assert not claims_spec._names("Table 21", "Table 2") and claims_spec._names("Sec. 5, Table 2, p. 6", "Table 2")


PAPERS = {"cgsv": "cgsv_neurips21.md", "fedfv": "fedfv_ijcai21.md", "fedlf": "fedlf_appendix.md",
          "fedmgda_plus": "fedmgda_plus.md"}


def test_coverage_items_and_quotes_exist_in_the_papers_text():
    """Where the papers' texts sit beside the checkout (../shared/papers), every table and figure a
    coverage entry names appears in its paper."""
    import re
    folder = REPO.parent / "shared" / "papers"
    if not folder.is_dir():
        pytest.skip("the papers' texts are not beside this checkout")
    for entry in ledger.load_coverage():
        text = " ".join((folder / PAPERS[entry.paper]).read_text().split())
        match = re.match(r"(Table|Fig\.|Figure) (\d+)", entry.label)
        if match:
            number = match.group(2)
            assert re.search(rf"(Table|Fig\.|Figure|Tab\.)\s*{number}\b", text), (entry.paper, entry.item)


def test_no_greater_or_less_claim_is_stronger_than_the_papers_own_numbers():
    for claim in ledger.load_claims():
        for comparison in claim.comparisons:
            difference = comparison.paper_difference
            if difference is None or comparison.direction == "equal":
                continue
            assert (difference > 0) if comparison.direction == "greater" else (difference < 0), (
                claim.id, comparison.label, comparison.paper)


def test_every_equal_claim_derives_its_margin_in_its_bar():
    for claim in ledger.load_claims():
        for comparison in claim.comparisons:
            if comparison.direction == "equal":
                assert f"{comparison.margin:g}" in claim.bar, (claim.id, comparison.margin, claim.bar)


# --- amendments --------------------------------------------------------------------------------------

def test_the_shipped_plan_and_amendments_load_and_name_real_claims():
    from leaderboard.registration import load_amendments, load_plan
    plan = load_plan()
    assert plan.primary_point == "final" and plan.sensitivity_points and plan.default_seeds == 10
    amendments = load_amendments()
    ids = {c.id for c in ledger.load_claims()}
    assert all(a.target in ids or a.on_plan for a in amendments), [a.target for a in amendments]
    targets = {a.target for a in amendments}
    # the past changes issue 32 names: a retired claim, seeds added after looking, rho's bar
    assert {"cgsv-fig2-reputation", "fedfv-t4-order", "cgsv-t2-rho"} <= targets


@pytest.mark.parametrize("entries, message", [
    ([{"id": "A2"}], "should be A1"),
    ([{"id": "A1", "date": "2026-11-27"}, {"id": "A2", "date": "2026-11-20"}], "appended in time order"),
    ([{"id": "A1", "results_seen": "yes"}], "true or false"),
])
def test_an_amendments_file_that_was_edited_in_the_middle_is_refused(entries, message):
    from leaderboard.registration import RegistrationError, parse_amendments
    base = {"id": "A1", "date": "2026-11-27", "target": "c1", "before": "a", "after": "b", "reason": "r",
            "results_seen": True}
    with pytest.raises(RegistrationError, match=message):
        parse_amendments({"amendments": [{**base, **e} for e in entries]})


def test_an_amended_claim_carries_its_amendments():
    from leaderboard.registration import Amendment
    amendment = Amendment("A1", "2026-11-27", "c1", "rho > 50", "rho > 80", "the paper's bar", True)
    result = ledger.evaluate(ledger.parse_claims(claim_spec([{"treatment": "A", "baseline": "B"}]), "x"),
                             paired_runs([0.02] * 10), amendments=[amendment])[0]
    assert result.amended and "amended" in ledger.claim_rows([result], [], {})[0].badges


def test_the_tables_star_rule_is_the_plans():
    from leaderboard.registration import load_plan
    from leaderboard.tables import STAR_MIN_SEEDS
    assert STAR_MIN_SEEDS == load_plan().star_min_seeds


def test_a_seed_whose_runs_failed_says_why_in_the_row():
    """Issue 51: the dir-0.1 partition of fedlf-offline cannot be drawn on two fresh seeds, so every
    arm's run of them FAILED before training. The pairs leave those seeds out (the plan decides on the
    seeds both arms have), and the row gives the runs' own error line, not "has no run of it"."""
    error = ("exit code 2; log benchmark_logs/x.log:\nerror: cannot build 100 clients from 'mnist5k' with "
             "partition='dirichlet': after max_tries=1000 draws some client still had fewer than min_size=3 "
             "samples (smallest in the last draw: 0). Lower min_size, raise alpha or raise max_tries.\n")
    runs = [run("A", s, 0.8 + SEED_EFFECT[s]) for s in range(10) if s not in (5, 6)]
    runs += [run("B", s, 0.7) for s in range(10) if s not in (5, 6)]
    for config in ("A", "B"):
        for seed in (5, 6):
            failed = run(config, seed, 0.0)
            failed.status, failed.tags = "FAILED", {**failed.tags, "error": error}
            runs.append(failed)
    entry = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs).comparisons[0]
    assert entry.result.n == 8
    why = ("A's run FAILED: cannot build 100 clients from 'mnist5k' with partition='dirichlet': after "
           "max_tries=1000 draws some client still had fewer than min_size=3 samples (smallest in the last draw: 0).")
    assert entry.unpaired == {"5": why, "6": why}
    assert f"seeds 5, 6 left out: {why}" in ledger.difference_text(entry, ledger.parse_claims(
        claim_spec([{"treatment": "A", "baseline": "B"}]), "x", "x/claims.yaml")[0])
    # a finished run of the seed wins over an earlier failure of it: nothing left out
    runs += [run(config, seed, 0.8 if config == "A" else 0.7) for config in ("A", "B") for seed in (5, 6)]
    assert evaluate(claim_spec([{"treatment": "A", "baseline": "B"}]), runs).comparisons[0].unpaired == {}
    # a finished run whose quantity is undefined says so, whatever failed before it on that seed
    runs = [run("A", s, 0.8, cgsv_rho=float("nan") if s == 2 else 60.0 + s) for s in range(10)]
    earlier = run("A", 2, 0.0)
    earlier.status, earlier.tags = "FAILED", {**earlier.tags, "error": error}
    entry = evaluate(claim_spec([{"treatment": "A", "threshold": 50}], quantity="rho"), runs + [earlier]).comparisons[0]
    assert list(entry.unpaired) == ["2"] and entry.unpaired["2"].startswith("A's CGSV rho is undefined in its run")


def test_a_failure_is_said_in_one_sentence():
    from leaderboard.claims.results import failure_text

    assert failure_text("exit code 2; log a.log:\nerror: no data. Download it first.\n") == "no data."
    assert failure_text("exit code 1\nerrors were logged\nerror: the real cause. More.") == "the real cause."
    assert failure_text("CUDA out of memory\nmore") == "CUDA out of memory"
    assert failure_text("") == "no error recorded"
