"""The ledger page with both passes (issue 51), in a real headless Chromium: a claim whose exploratory
and confirmatory verdicts agree, one where they disagree (with what differs), and the tally, which counts
the confirmatory verdicts only; at 1,400 and 800 px the table does not scroll sideways. Screenshots go
to ``$BROWSER_SCREENSHOT_DIR`` when it is set. Skipped where Chromium or playwright is missing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_leaderboard_page import BENCHMARKS, CHROMIUM, SUITE, log_run, open_page

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Chromium is missing")

FRESH = (1000, 1001, 1002)
PLAN = """version: 2
registered: 2026-12-06
primary_point: final
sensitivity_points: [last3]
alpha: 0.05
multiplicity: holm within a family
seeds: {default: 3, suites: {}}
min_seeds: 3
star_min_seeds: 3
convergence: {window: 3, change_pp: 1.0}
"""
CLAIMS = f"""paper: fixture
claims:
  - {{id: fixture-agree, where: Table 1, claim: FedAvg is more accurate than q-FedAvg, quantity: mean,
     direction: greater, offline: {{suite: {SUITE}, benchmark: {BENCHMARKS[0]}}},
     quote: 'FedAvg beats q-FedAvg (Table 1).', bar: 'direction only',
     comparisons: [{{treatment: FedAvg, baseline: 'qFedAvg(q=1)'}}]}}
  - {{id: fixture-disagree, where: Table 1, claim: FedAvg is more accurate than FedFV, quantity: mean,
     direction: greater, offline: {{suite: {SUITE}, benchmark: {BENCHMARKS[0]}}},
     quote: 'FedAvg beats FedFV (Table 1).', bar: 'direction only',
     comparisons: [{{treatment: FedAvg, baseline: 'FedFV(alpha=0.1,tau=1)'}}]}}
coverage:
  - {{item: Table 1, claims: [fixture-agree, fixture-disagree]}}
"""


@pytest.fixture(scope="module")
def two_pass_site(tmp_path_factory):
    from mlflow.tracking import MlflowClient

    from leaderboard.__main__ import main as leaderboard_main
    from leaderboard.registration import CONFIRMATORY, LEDGER_PASS_TAG, PLAN_HASH_TAG, register

    tmp = tmp_path_factory.mktemp("two-passes")
    root = tmp / "papers"
    papers = root / "fixture"
    papers.mkdir(parents=True)
    (papers / "offline.yaml").write_text(
        f"suite: {SUITE}\npaper: fixture\nscale: offline\nbase: {{}}\nbenchmarks:\n  - name: {BENCHMARKS[0]}\n"
        "algorithms:\n  - class_path: fl_lightning.algorithms.FedAvg\n")
    (papers / "claims.yaml").write_text(CLAIMS)
    (root / "ledger_plan.yaml").write_text(PLAN)
    (root / "ledger_confirmatory.yaml").write_text(
        "pass: confirmatory\nplan_version: 2\n"
        "seeds: {rule: fixture, first: 1000, count: 3, values: [1000, 1001, 1002]}\nlengths: {}\n")
    registration, _ = register(root)
    uri = f"sqlite:///{tmp / 'runs.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment(SUITE, artifact_location=(tmp / "artifacts").as_uri())
    confirmatory = {LEDGER_PASS_TAG: CONFIRMATORY, PLAN_HASH_TAG: registration}
    for config in ("FedAvg", "FedFV(alpha=0.1,tau=1)", "qFedAvg(q=1)"):
        for seed in (0, 1, 2):
            log_run(client, experiment, BENCHMARKS[0], config, seed)
        for seed in FRESH:  # on the fresh seeds FedFV ends 10 points higher: FedAvg no longer beats it
            log_run(client, experiment, BENCHMARKS[0], config, seed, extra_tags=confirmatory,
                    shift=0.10 if config.startswith("FedFV") else 0.0)
    out = tmp / "site"
    assert leaderboard_main(["build", "--tracking-uri", uri, "--out", str(out), "--paper-numbers", str(root)]) == 0
    return out


@pytest.mark.parametrize("width", [1400, 800])
def test_each_claim_shows_both_passes_and_the_tally_counts_the_confirmatory_ones(two_pass_site, browser_context,
                                                                                 width):
    page, errors = open_page(browser_context, (two_pass_site / "index.html").as_uri())
    page.set_viewport_size({"width": width, "height": 900})
    agree = page.locator("#claims-table tbody#claim-fixture-agree")
    disagree = page.locator("#claims-table tbody#claim-fixture-disagree")
    verdict = agree.locator("tr.claim .verdict").inner_text()
    assert "confirmatory: reproduced" in verdict and "passes agree" in verdict and "exploratory: reproduced" in verdict
    verdict = disagree.locator("tr.claim .verdict").inner_text()
    assert "confirmatory: contradicted" in verdict and "passes disagree" in verdict
    assert "exploratory: reproduced" in verdict
    for summary in page.locator("#claims-table details summary").all():
        summary.click()
    details = disagree.locator("details").inner_text()
    assert "Confirmatory (seeds 1000-1002): contradicted (counted in the tally)" in details
    assert "Exploratory (seeds 0-2): reproduced" in details
    assert ("The passes disagree. What differs: exploratory reproduced on 3 seeds, confirmatory contradicted on 3"
            in details)
    assert "Runs read: treatment:" in details
    tally = page.inner_text("#tally")
    assert "Confirmatory verdicts (seeds 1000-1002)" in tally and "2 of 2 claims counted" in tally
    assert "1 reproduced" in tally and "1 contradicted" in tally and "the two passes disagree on 1" in tally
    assert "not counted" in page.inner_text(".tally-exploratory")
    assert not page.locator("p.banner").count()  # every claim's confirmatory verdict counts: no exploratory banner
    wrap = page.eval_on_selector("#claims-table", "t => [t.scrollWidth, t.parentElement.clientWidth]")
    assert wrap[0] <= wrap[1] + 1, f"the claims table scrolls sideways at {width} px: {wrap}"
    shots = os.environ.get("BROWSER_SCREENSHOT_DIR")
    if shots:
        page.locator("#claims").screenshot(path=str(Path(shots) / f"two-passes-{width}.png"))
    assert not errors, errors
