"""The claims ledger: every claim of the four papers, tested on our runs, paired by seed.

``benchmarks/<paper>/claims.yaml`` lists a paper's claims. Each claim names a quantity (mean client
accuracy, spread, worst 5 %, angle, rho, conflicts, server time, ...), a direction (``greater``,
``less``, or ``equal`` within a ``margin``), and comparisons ``treatment`` vs ``baseline`` (or vs a
``threshold``) on an offline benchmark. Configurations of one seed share that seed's partition and
initialisation, so a comparison is a paired one: the per-seed differences treatment - baseline,
their mean with a confidence interval, Holm-corrected within the claim (``leaderboard.stats.decide``).

What is tested is fixed by the registered plan (``leaderboard.registration``): a run is read at the
plan's primary point (the final evaluation), and a verdict that differs at a sensitivity point (the
mean of the last k evaluations) is marked fragile; the verdict uses the plan's seeds per suite (more
seeds are an extension, shown apart); runs are checked for convergence (``convergence.convergence_status``)
in both arms; a degenerate benchmark (a constant predictor, or worst clients at 0 everywhere) is
withdrawn. Each claim quotes its paper (``quote``, ``where``) and states the paper's bar (``bar``);
a claim the project cannot compute as the paper defines it is "not testable as stated", one whose
paper's method or baseline the project does not implement is "not implemented" (its stand-ins are
ablations, never its verdict), one that holds by the algorithm's construction says so (a single
comparison may be marked so: shown on its row, kept out of the verdict), words of a quote that no
comparison tests are listed as its untested parts, and a retired claim stays on the page. Each claim may
list ablations: the same comparisons on benchmarks that move the offline setup one factor toward the
paper's. A reason is a template filled from the runs at build time (``render_reason``).

The package: :mod:`.spec` (claims.yaml read and checked), :mod:`.quantities` (a run -> one
number), :mod:`.results` and :mod:`.evaluation` (verdicts), :mod:`.reasons` (reasons filled from
the runs) and :mod:`.export` (the claims table's rows, claims.csv and claims.json).
"""

from leaderboard.claims.evaluation import evaluate
from leaderboard.claims.export import (
    claim_rows,
    effect_summary,
    export_csv,
    export_json,
    export_rows,
    scale_text,
    seeds_text,
    summary_rows,
    tally_scale,
    with_passes,
)
from leaderboard.claims.quantities import QUANTITIES, quantity_value
from leaderboard.claims.results import ClaimResult, difference_text
from leaderboard.claims.spec import (
    BY_CONSTRUCTION,
    FILE_NAME,
    NO_RUNS,
    NOT_IMPLEMENTED,
    NOT_TESTABLE,
    NOT_TESTED,
    WITHDRAWN,
    Claim,
    ClaimsError,
    CoverageEntry,
    SuiteFile,
    claim_problems,
    coverage_problems,
    load_claims,
    load_coverage,
    parse_claims,
    suite_files,
)

__all__ = [
    "BY_CONSTRUCTION", "FILE_NAME", "NO_RUNS", "NOT_IMPLEMENTED", "NOT_TESTABLE", "NOT_TESTED", "QUANTITIES",
    "WITHDRAWN", "Claim",
    "ClaimResult", "ClaimsError", "CoverageEntry", "SuiteFile", "claim_problems", "claim_rows", "coverage_problems",
    "difference_text", "effect_summary", "evaluate", "export_csv", "export_json", "export_rows", "load_claims",
    "load_coverage", "parse_claims", "quantity_value", "scale_text", "seeds_text", "suite_files", "summary_rows",
    "tally_scale", "with_passes",
]
