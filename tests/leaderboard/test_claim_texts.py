"""Claim texts equal to their tests (issue 48): a comparison that holds by construction is shown and
kept out of its claim's verdict; the words of a quote no comparison tests are listed with why and
rendered; a claim whose paper method is not implemented here says so instead of "not testable"; CGSV's
standalone accuracy and rho_r are read from a run's logged metrics; one margin rule for every "equal"
claim, its arithmetic in the bar."""

from __future__ import annotations

import json
import re

import jinja2
import pytest

from leaderboard import claims as ledger
from leaderboard.claims.quantities import QUANTITIES, quantity_value
from leaderboard.stats import CONTRADICTED, REPRODUCED
from tests.leaderboard.test_claims import SUITE, claim_spec, evaluate, run
from tests.paths import REPO

TEMPLATES = REPO / "leaderboard" / "templates"


def three_arms(c_gap: float = -0.03) -> list:
    """A above B by about 2 pp on every seed; C below B by ``-c_gap`` (a contradicted C - B)."""
    runs = []
    for seed in range(10):
        noise = 0.001 * ((seed * 7) % 5)
        runs += [run("A", seed, 0.82 + noise), run("B", seed, 0.80), run("C", seed, 0.80 + c_gap + noise)]
    return runs


CONSTRUCTED = "its QP leaves no conflict"


# --- a comparison that holds by construction -------------------------------------------------------

def test_a_by_construction_comparison_is_kept_out_of_the_claims_verdict():
    comparisons = [{"treatment": "A", "baseline": "B"},
                   {"treatment": "C", "baseline": "B", "by_construction": CONSTRUCTED}]
    result = evaluate(claim_spec(comparisons), three_arms())
    assert [c.verdict for c in result.comparisons] == [REPRODUCED, CONTRADICTED]  # still computed
    assert result.data_verdict == REPRODUCED and result.verdict == REPRODUCED
    assert result.verdict_at("last3") == REPRODUCED
    unmarked = evaluate(claim_spec([comparisons[0], {"treatment": "C", "baseline": "B"}]), three_arms())
    assert unmarked.verdict == CONTRADICTED  # the same runs without the mark


def test_a_by_construction_comparison_is_marked_on_its_row_and_in_the_exports():
    comparisons = [{"treatment": "A", "baseline": "B"},
                   {"treatment": "C", "baseline": "B", "by_construction": CONSTRUCTED}]
    result = evaluate(claim_spec(comparisons), three_arms())
    row = ledger.claim_rows([result], [], {})[0]
    (_, first, first_css), (_, second, second_css) = row.lines
    assert first_css == "reproduced" and "by construction" not in first
    assert second_css == "by-construction"
    assert "holds by construction, not counted in the claim's verdict (contradicted on the runs)" in second
    assert CONSTRUCTED in second
    assert "1 more by construction, not counted" in row.verdict_detail
    exported = json.loads(ledger.export_json([result]))["claims"][0]
    assert [c["by_construction"] for c in exported["comparisons"]] == [None, CONSTRUCTED]
    assert ledger.summary_rows([result])[0]["by_construction_comparisons"] == 1


def test_a_claim_whose_every_comparison_holds_by_construction_is_refused():
    spec = claim_spec([{"treatment": "A", "baseline": "B", "by_construction": CONSTRUCTED}])
    with pytest.raises(ledger.ClaimsError, match="mark the claim `by_construction` instead"):
        ledger.parse_claims(spec, "x", "x/claims.yaml")


def test_an_ablation_keeps_its_by_construction_comparison_out_of_its_verdict():
    ablation = {"suite": SUITE, "benchmark": "mnist5k/pat-1/p0.1/fl_mlp", "factor": "the same runs",
                "comparisons": [{"treatment": "A", "baseline": "B"},
                                {"treatment": "C", "baseline": "B", "by_construction": CONSTRUCTED}]}
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}], ablations=[ablation]), three_arms())
    assert result.ablations[0].verdict == REPRODUCED


# --- untested parts of a quote ---------------------------------------------------------------------

UNTESTED = [{"quote": "q-FedAvg is the most affected", "why": "a difference of two falls, which no comparison tests"}]


def test_untested_parts_are_read_and_exported():
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}], untested=UNTESTED), three_arms())
    assert result.claim.untested == (ledger.spec.Untested(UNTESTED[0]["quote"], UNTESTED[0]["why"]),)
    row = ledger.claim_rows([result], [], {})[0]
    assert row.untested == ((UNTESTED[0]["quote"], UNTESTED[0]["why"]),)
    assert json.loads(ledger.export_json([result]))["claims"][0]["untested"] == UNTESTED
    assert ledger.summary_rows([result])[0]["untested_parts"] == 1
    assert result.verdict == REPRODUCED  # an untested part changes no verdict


@pytest.mark.parametrize("part, message", [
    ({"quote": "words"}, "untested part 1: `untested` is a list of"),
    ({"quote": "words", "why": "why", "wy": "typo"}, "untested part 1"),
])
def test_an_untested_part_without_its_reason_is_refused(part, message):
    with pytest.raises(ledger.ClaimsError, match=message):
        ledger.parse_claims(claim_spec([{"treatment": "A", "baseline": "B"}], untested=[part]), "x", "x/claims.yaml")


def _template_lines(name: str, needle: str) -> str:
    return "\n".join(line for line in (TEMPLATES / name).read_text().splitlines() if needle in line)


@pytest.mark.parametrize("name, autoescape", [("claims.html", True), ("claims.md.j2", False)])
def test_the_page_renders_each_untested_part_with_its_reason(name, autoescape):
    result = evaluate(claim_spec([{"treatment": "A", "baseline": "B"}], untested=UNTESTED), three_arms())
    row = ledger.claim_rows([result], [], {})[0]
    source = _template_lines(name, "row.untested")
    assert source, f"{name} does not render row.untested"
    if name.endswith(".j2"):  # the line is the whole table row: keep from the untested loop on
        source = "{% for quote" + source.split("{% for quote", 1)[1].rsplit(" |", 1)[0]
    text = jinja2.Environment(autoescape=autoescape).from_string(source).render(row=row)
    assert "q-FedAvg is the most affected" in text and "a difference of two falls" in text
    assert "Not tested" in text


# --- not implemented ---------------------------------------------------------------------------------

def test_a_claim_whose_paper_method_is_not_implemented_says_so_and_is_never_contradicted():
    ablation = {"suite": SUITE, "benchmark": "mnist5k/pat-1/p0.1/fl_mlp", "factor": "stand-in baseline",
                "comparisons": [{"treatment": "C", "baseline": "B"}]}
    spec = claim_spec([], not_implemented="no FedAvg with a model per agent is implemented",
                      ablations=[ablation])
    del spec["claims"][0]["offline"]
    result = evaluate(spec, three_arms())
    assert result.ablations[0].verdict == CONTRADICTED
    assert result.verdict == ledger.NOT_IMPLEMENTED == "not implemented"
    assert not result.fragile_points
    row = ledger.claim_rows([result], [], {})[0]
    assert row.verdict_class == "not-implemented"
    assert any(note.startswith("Not implemented: no FedAvg with a model per agent") for note in row.notes)
    assert json.loads(ledger.export_json([result]))["claims"][0]["not_implemented"]
    assert "Changes the verdict" not in result.reason


def test_a_claim_cannot_be_both_not_testable_and_not_implemented():
    spec = claim_spec([], not_testable="a", not_implemented="b")
    with pytest.raises(ledger.ClaimsError, match="give one of `not_testable`"):
        ledger.parse_claims(spec, "x", "x/claims.yaml")


# --- the new quantities, from a run's logged metrics -------------------------------------------------

def cgsv_run(seed: int, standalone: list[float], rho_r: list[float], accuracy: float = 0.75):
    record = run("CGSV(beta=1.0)", seed, accuracy)
    steps = [step for step, _ in record.histories["test_acc_mean"]]
    record.histories["standalone_test_acc_mean"] = list(zip(steps, standalone))
    record.histories["cgsv_rho_r"] = list(zip(steps, rho_r))
    record.metrics.update(standalone_test_acc_mean=standalone[-1], cgsv_rho_r=rho_r[-1])
    return record


def test_standalone_and_rho_r_are_read_from_the_runs_logged_metrics():
    record = cgsv_run(0, [0.40, 0.44, 0.46, 0.48], [50.0, 60.0, 70.0, 80.0])
    assert quantity_value(record, "standalone") == pytest.approx(48.0)  # percent, at the final evaluation
    assert quantity_value(record, "standalone", 2) == pytest.approx(47.0)  # mean of the last 2 evaluations
    assert quantity_value(record, "rho_r") == pytest.approx(80.0)
    assert quantity_value(record, "rho_r", 3) == pytest.approx(70.0)
    assert QUANTITIES["standalone"].unit == "%" and QUANTITIES["rho_r"].unit == ""
    assert quantity_value(cgsv_run(1, [0.4] * 4, [float("nan")] * 4), "rho_r") is None  # undefined


def test_cgsv_against_its_own_standalone_agents_is_paired_within_each_run():
    runs = [cgsv_run(seed, [0.48 + 0.001 * seed] * 4, [70.0] * 4, accuracy=0.75 + 0.002 * seed)
            for seed in range(10)]
    comparison = {"treatment": "CGSV(beta=1.0)", "baseline": {"config": "CGSV(beta=1.0)", "quantity": "standalone"}}
    result = evaluate(claim_spec([comparison]), runs)
    entry = result.comparisons[0]
    assert entry.comparison.label == "CGSV(beta=1.0) mean − standalone"
    assert entry.result.mean == pytest.approx(27.0 + 0.1 * 4.5)
    assert result.verdict == REPRODUCED


# --- the shipped ledger ------------------------------------------------------------------------------

def test_the_shipped_claims_label_missing_implementations_and_constructions():
    claims = {c.id: c for c in ledger.load_claims()}
    for claim_id in ("cgsv-t1-cla", "cgsv-t1-uni-pow", "cgsv-t1-mr"):
        assert claims[claim_id].not_implemented and not claims[claim_id].not_testable
    layer = claims["fedlf-t4-conflicts-layer"]
    assert [bool(c.by_construction) for c in layer.comparisons] == [False, False, True, True]
    assert "waits for" not in layer.reason
    assert {"cgsv-t1-standalone", "cgsv-t7-rho-r"} <= set(claims)
    assert claims["fedmgda-robust-30"].untested and claims["fedmgda-t7-bias"].untested
    assert claims["cgsv-fig3-spread"].untested and "POW" not in claims["cgsv-fig3-spread"].text.split("(")[0]


def test_every_equal_claim_applies_the_one_margin_rule_in_its_bar():
    """The margin of an "equal" comparison is the pooled run-to-run sd of the paper's two rows, its
    arithmetic shown; where the paper reports no spread, the bar says so (and quotes the gap it calls equal)."""
    pooled = re.compile(r"sqrt\(\(([\d.]+)² \+ ([\d.]+)²\) / 2\) = ([\d.]+)")
    for claim in ledger.load_claims():
        for comparison in claim.comparisons:
            if comparison.direction != "equal":
                continue
            match = pooled.search(claim.bar)
            if match is None:
                assert "no spread" in claim.bar, (claim.id, claim.bar)
                continue
            s1, s2, stated = (float(v) for v in match.groups())
            assert round(((s1 ** 2 + s2 ** 2) / 2) ** 0.5, 2) == pytest.approx(stated), claim.id
            assert comparison.margin == pytest.approx(stated), (claim.id, comparison.margin, stated)
