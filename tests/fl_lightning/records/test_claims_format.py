"""Issue 35: ``claims.yaml`` is a declared format (pydantic models, ``extra="forbid"``). A
misspelt key is refused with a did-you-mean instead of being ignored, a refusal names the claim
and the item inside it, and the shipped files parse to exactly what the hand-written checks made
(the claims and coverage compared field by field when the models came in)."""

from __future__ import annotations

import pytest

import leaderboard.claims as ledger
from tests.leaderboard.test_claims import claim_spec


def refusal(change: dict, at_file: dict | None = None) -> str:
    spec = claim_spec([{"treatment": "A", "baseline": "B"}])
    spec["claims"][0].update(change)
    spec.update(at_file or {})
    with pytest.raises(ledger.ClaimsError) as raised:
        ledger.parse_claims(spec, "x", "x/claims.yaml")
    message = str(raised.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("change, at_file, message", [
    ({"quantitty": "mean"}, None, "x/claims.yaml: claim c1: unknown key 'quantitty'; did you mean 'quantity'"),
    ({"comparisons": [{"treatment": "A", "baselin": "B"}]}, None,
     "claim c1: comparison 1: unknown key 'baselin'; did you mean 'baseline'?"),
    ({"ablations": [{"suite": "s", "benchmark": "b", "factor": "f",
                     "comparisons": [{"treatment": "A", "baseline": "B", "paper": ["x"]}]}]}, None,
     "claim c1: ablation 1, comparison 1: `paper` is a list of the paper's numbers"),
    ({"offline": "somewhere"}, None, "claim c1: expected {suite: ..., benchmark: ...}, got 'somewhere'"),
    ({"ablations": [{"suite": "s", "benchmark": "b"}]}, None, "ablation 1: say which factor it changes"),
    ({}, {"coverge": []}, "x/claims.yaml: unknown key 'coverge'; did you mean 'coverage'?"),
])
def test_a_misspelt_or_misshapen_entry_is_refused_where_it_is(change, at_file, message):
    assert message in refusal(change, at_file)


def test_a_claim_without_its_required_fields_is_refused():
    spec = {"paper": "x", "claims": [{"id": "c1", "where": "Table 1", "claim": "A beats B", "quantity": "mean"}]}
    with pytest.raises(ledger.ClaimsError, match="x/claims.yaml: claim c1: missing direction"):
        ledger.parse_claims(spec, "x", "x/claims.yaml")
    with pytest.raises(ledger.ClaimsError, match="expected a mapping with `paper`, `citation` and a list `claims`"):
        ledger.parse_claims({"paper": "x"}, "x", "x/claims.yaml")


def test_yaml_dates_read_as_written():
    spec = claim_spec([{"treatment": "A", "baseline": "B"}])
    import datetime

    spec["claims"][0]["retired"] = {"date": datetime.date(2026, 1, 1), "reason": "replaced  by c2"}
    (claim,) = ledger.parse_claims(spec, "x", "x/claims.yaml")
    assert (claim.retired.date, claim.retired.reason) == ("2026-01-01", "replaced by c2")
