"""Issue 35: the ledger's registered plan and its amendments are declared formats (pydantic models,
``extra="forbid"``): a misspelt key is refused with a did-you-mean instead of ignored or listed
bare, a wrong value in one line naming the key, and the shipped files read as before."""

from __future__ import annotations

import pytest

from leaderboard.registration import (
    RegistrationError,
    load_amendments,
    load_plan,
    parse_amendments,
    parse_plan,
)

AMENDMENT = {"id": "A1", "date": "2026-11-27", "target": "c1", "before": "a", "after": "b", "reason": "r",
             "results_seen": True}


@pytest.mark.parametrize("raw, message", [
    ({"alpah": 0.05}, "unknown key 'alpah'; did you mean 'alpha'?"),
    ({"convergence": {"windw": 3}}, "unknown key 'convergence.windw'; did you mean 'window'?"),
    ({"alpha": 0.7}, "`alpha` input should be less than 0.5, got 0.7"),
    ({"primary_point": "last0"}, "unknown point 'last0'"),
    ({"seeds": {"default": 0}}, "`seeds.default` input should be greater than 0"),
    ({"seeds": {"suites": {"s": 2.5}}}, "`seeds.suites.s` input should be a valid integer"),
    ({"degeneracy": {"worst5_at_zero": "yes"}}, "`degeneracy.worst5_at_zero` input should be a valid boolean"),
])
def test_a_wrong_plan_is_refused_in_one_line_naming_the_key(raw, message):
    with pytest.raises(RegistrationError) as raised:
        parse_plan(raw)
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_an_amendment_with_a_misspelt_or_missing_key_is_refused():
    with pytest.raises(RegistrationError, match="entry 1: unknown key 'dat'; did you mean 'date'"):
        parse_amendments({"amendments": [{**AMENDMENT, "dat": "x"}]})
    with pytest.raises(RegistrationError, match="entry 1: missing date, target"):
        parse_amendments({"amendments": [{"id": "A1"}]})
    with pytest.raises(RegistrationError, match="`date` must be YYYY-MM-DD, got 'soon'"):
        parse_amendments({"amendments": [{**AMENDMENT, "date": "soon"}]})


def test_the_shipped_plan_and_amendments_read_as_declared():
    plan = load_plan()
    assert (plan.primary_point, plan.alpha, plan.default_seeds, plan.convergence.window) == ("final", 0.05, 10, 3)
    amendments = load_amendments()
    assert [a.id for a in amendments] == [f"A{n}" for n in range(1, len(amendments) + 1)]
