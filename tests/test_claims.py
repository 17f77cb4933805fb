"""The claims ledger (leaderboard/claims.py, benchmarks/<paper>/claims.yaml): the files name suites,
benchmarks and configurations that exist; verdicts rest on paired per-seed differences."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import numpy as np
import pytest
import yaml
from scipy import stats

from benchmarks.runner import load_suite
from leaderboard import claims as ledger
from leaderboard.runs import RunRecord
from leaderboard.stats import CONTRADICTED, INCONCLUSIVE, REPRODUCED, TOO_FEW

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
    for suite in {c.offline.suite for c in claims if c.offline} | {a.location.suite for c in claims for a in c.ablations}:
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
    untested = [c for c in claims if not c.not_tested and (c.offline is None or not c.comparisons)]
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
    ({"comparisons": []}, "or `not_tested` with the reason"),
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

def test_a_run_counts_at_the_mean_of_its_last_evaluations():
    record = run("A", 0, [0.5, 0.7, 0.8, 0.9, 0.7])
    assert ledger.quantity_value(record, "mean") == pytest.approx(100 * (0.8 + 0.9 + 0.7) / 3)


def test_a_run_still_rising_at_its_end_is_unconverged():
    assert ledger.still_improving(run("A", 0, [0.5, 0.55, 0.6, 0.65, 0.7, 0.75]))
    assert not ledger.still_improving(run("A", 0, [0.5, 0.79, 0.80, 0.81, 0.80, 0.81, 0.805]))
    assert not ledger.still_improving(run("A", 0, [0.5, 0.6]))  # too short to tell


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
    data = json.loads(ledger.export_json([result]))
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
