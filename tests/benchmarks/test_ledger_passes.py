"""The ledger's two passes (issue 51): every claim decided on the exploratory seeds and, apart, on the
registered fresh seeds of the confirmatory pass; the tally counts confirmatory verdicts only; a claim
amended after the confirmatory runs began, or read from runs of several registrations, reads exploratory."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import pytest

from leaderboard import claims as ledger
from leaderboard.claims import passes as two
from leaderboard.registration import CONFIRMATORY, LEDGER_PASS_TAG, PLAN_HASH_TAG, Amendment, parse_plan
from leaderboard.stats import CONTRADICTED, INCONCLUSIVE, REPRODUCED
from tests.leaderboard.test_claims import claim_spec, paired_runs
from tests.leaderboard.test_ledger_labels import PLAN_V2

HASH = "ab" * 32
FRESH = tuple(range(1000, 1010))
NARROW = [0.02 + 0.001 * k for k in range(10)]  # A - B about +2.45 pp: reproduced
NONE = [0.003 * ((-1) ** k) for k in range(10)]  # A - B about 0: inconclusive
WORSE = [-0.02 - 0.001 * k for k in range(10)]  # A - B about -2.45 pp: contradicted
BEGAN = datetime(2026, 12, 7, 3, 25, tzinfo=timezone.utc)


def plan(registered_hash: str = HASH):
    return parse_plan({**PLAN_V2, "version": 2, "registered": "2026-12-06", "registered_hash": registered_hash})


def fresh(gap: list[float], registration: str = HASH, rounds: int | None = None) -> list:
    """Confirmatory runs: seeds 1000-1009, tagged with the pass and ``registration``, started on BEGAN."""
    runs = paired_runs(gap)
    for record in runs:
        seed = 1000 + int(record.seed)
        record.run_id = f"{record.run_id}-confirmatory-{seed}"
        record.tags |= {"seed": str(seed), LEDGER_PASS_TAG: CONFIRMATORY, PLAN_HASH_TAG: registration}
        record.start_time = BEGAN
        if rounds is not None:
            record.params = {"num_rounds": str(rounds)}
    return runs


def seen(gap: list[float], rounds: int | None = None) -> list:
    runs = paired_runs(gap)
    if rounds is not None:
        for record in runs:
            record.params = {"num_rounds": str(rounds)}
    return runs


def claims(**extra):
    return ledger.parse_claims(claim_spec([{"treatment": "A", "baseline": "B"}], **extra), "x", "x/claims.yaml")


def amendment(date: str, target: str = "c1", number: int = 1) -> Amendment:
    return Amendment(f"A{number}", date, target, "before", "after", "why", True)


def passes(runs, amendments=(), registered_hash=HASH, changed=False):
    return two.evaluate_passes(claims(), runs, plan(registered_hash), amendments, FRESH,
                               registration_changed=changed)


def test_each_pass_is_decided_on_its_own_seeds_and_a_disagreement_says_what_differs():
    (entry,) = passes(seen(NARROW, rounds=100) + fresh(NONE, rounds=300))
    assert entry.exploratory.verdict == REPRODUCED and entry.exploratory.seeds == 10
    assert entry.confirmatory.verdict == INCONCLUSIVE and entry.confirmatory.seeds == 10
    assert entry.counted and entry.agree is False
    assert entry.difference.startswith("exploratory reproduced on 10 seeds, confirmatory inconclusive on 10")
    assert "run length 100 → 300 rounds" in entry.difference
    assert "; A − B: +2.45 pp [+2.23, +2.67] (95 % CI), reproduced → +0.00 pp [" in entry.difference
    assert entry.difference.endswith("(95 % CI), inconclusive")


def test_passes_that_agree_say_nothing_differs():
    (entry,) = passes(seen(NARROW) + fresh([g + 0.001 for g in NARROW]))
    assert entry.agree is True and entry.difference == "" and entry.counted


def test_confirmatory_runs_on_other_seeds_than_the_fresh_ones_give_no_verdict():
    runs = fresh(NARROW)
    for record in runs:
        record.tags["seed"] = str(int(record.seed) - 1000)  # tagged confirmatory, but on seeds 0-9
    (entry,) = passes(seen(NARROW) + runs)
    assert entry.confirmatory.verdict == ledger.NO_RUNS


def test_the_tally_counts_confirmatory_verdicts_only():
    (entry,) = passes(seen(NARROW) + fresh(WORSE))
    counted, waiting = two.tally([entry])
    assert counted == {CONTRADICTED: 1} and not waiting
    (pending,) = passes(seen(NARROW))
    counted, waiting = two.tally([pending])
    assert not counted and waiting == {two.NO_CONFIRMATORY_RUNS: 1}


def test_a_claim_amended_after_the_confirmatory_runs_began_reads_exploratory():
    runs = seen(NARROW) + fresh(NARROW)
    (before,) = passes(runs, [amendment("2026-12-06")])
    assert before.counted and before.status == ""
    (same_day,) = passes(runs, [amendment("2026-12-07")])  # a date has no hour: the day the runs began counts
    assert same_day.status == two.AMENDED_AFTER and not same_day.counted
    (on_plan,) = passes(runs, [amendment("2026-12-08", target="plan:alpha")])
    assert on_plan.status == two.AMENDED_AFTER
    (other,) = passes(runs, [amendment("2026-12-08", target="another-claim")])
    assert other.counted
    counted, waiting = two.tally([same_day])
    assert not counted and waiting == {two.AMENDED_AFTER: 1}


def test_runs_of_several_registrations_are_never_mixed_into_a_confirmatory_verdict():
    runs = fresh(NARROW)
    runs[0].tags[PLAN_HASH_TAG] = "cd" * 32
    (entry,) = passes(seen(NARROW) + runs)
    assert entry.status == two.SEVERAL_REGISTRATIONS.format(count=2) and not entry.counted


def test_runs_of_an_older_registration_count_only_when_an_amendment_since_explains_it():
    runs = seen(NARROW) + fresh(NARROW, registration="cd" * 32)
    (unexplained,) = passes(runs)
    assert unexplained.status.startswith("exploratory (its confirmatory runs carry registration cdcdcdcdcdcd")
    (explained,) = passes(runs, [amendment("2026-12-08", target="another-claim")])
    assert explained.counted


def test_changed_registered_files_count_no_confirmatory_verdict():
    (entry,) = passes(seen(NARROW) + fresh(NARROW), changed=True)
    assert entry.status == two.CHANGED_FILES and not entry.counted


def test_a_confirmatory_plan_plans_the_fresh_seeds_for_every_suite():
    registered = plan()
    assert registered.seed_names("any-suite") == frozenset(str(k) for k in range(10))
    confirmatory = registered.for_confirmatory(FRESH)
    assert confirmatory.seed_names("any-suite") == frozenset(map(str, FRESH))
    assert confirmatory.seeds_for("any-suite") == 10
    assert replace(registered, suite_seeds={"s": 20}).for_confirmatory((7, 9)).seed_names("s") == {"7", "9"}


@pytest.mark.parametrize("values", [[], [1000, 1000], ["1000"], [-1]])
def test_fresh_seeds_that_are_not_distinct_integers_are_refused(tmp_path, values):
    from leaderboard.registration import RegistrationError, load_fresh_seeds

    (tmp_path / "ledger_confirmatory.yaml").write_text(f"seeds:\n  values: {values}\n")
    with pytest.raises(RegistrationError, match="seeds.values"):
        load_fresh_seeds(tmp_path)


def test_the_repository_registers_ten_fresh_seeds():
    from leaderboard.registration import load_fresh_seeds

    assert load_fresh_seeds() == FRESH


def test_a_benchmark_table_never_mixes_the_confirmatory_pass_with_the_exploratory_runs():
    from leaderboard.tasks import task_of

    tags = {"task": '{"num_rounds": 100}', "task_key": "k"}
    plain, confirmatory = task_of(tags, {}), task_of(tags | {LEDGER_PASS_TAG: CONFIRMATORY}, {})
    assert plain.key == "k" and confirmatory.key != plain.key
    assert confirmatory.fields == {"num_rounds": 100, LEDGER_PASS_TAG: CONFIRMATORY}
    assert task_of(tags | {LEDGER_PASS_TAG: CONFIRMATORY}, {}).key == confirmatory.key  # one key per pass


def test_claims_json_and_the_summary_carry_both_passes():
    import json

    (entry,) = passes(seen(NARROW) + fresh(WORSE))
    document = json.loads(ledger.export_json([entry.exploratory], passes=[entry]))["claims"][0]
    assert document["verdict"] == REPRODUCED
    confirmatory = document["confirmatory"]
    assert confirmatory["verdict"] == CONTRADICTED and confirmatory["counted"] and confirmatory["agrees"] is False
    assert confirmatory["seeds"] == 10 and confirmatory["comparisons"][0]["n"] == 10
    assert confirmatory["difference"].startswith("exploratory reproduced")
    row = ledger.summary_rows([entry.exploratory], [entry])[0]
    assert (row["verdict"], row["confirmatory_verdict"], row["passes_agree"]) == (REPRODUCED, CONTRADICTED, False)
    assert "confirmatory" not in json.loads(ledger.export_json([entry.exploratory]))["claims"][0]
