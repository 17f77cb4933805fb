"""Runs -> tables of like with like, seeds aggregated, verdicts only beyond seed noise.

A table is one (suite, benchmark name, task, client test): runs of one benchmark whose task
differs (rounds, clients, partition parameters, ...) land in separate tables, never ranked
together. A row is one algorithm configuration (``algorithm_config``). Per (configuration, seed)
the newest FINISHED run enters the means; older FINISHED runs of that seed are counted as
superseded; failed and unfinished runs are listed apart. Never silently dropped.

Verdicts (per ranked column): the top row by mean gets ★ only when a two-sided t-test separates
it from every other row (p < 0.05): paired by seed when the two rows share at least 3 seeds, else
Welch's (at least 2 seeds in both); otherwise the rows not separated from it are the tied
leaders, marked ≈.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field

from fl_lightning.records import vocabulary as schema
from fl_lightning.records.vocabulary import Metric, Tag
from leaderboard.papers import PaperNumber
from leaderboard.runs import CLIENT_TESTS_WITH_OWN_TEST, RunRecord
from leaderboard.stats import MIN_SEEDS, SIGNIFICANCE, p_between
from leaderboard.tasks import Task

MISSING = "—"
HEADLINE = Metric.TEST_ACC_MEAN
BEST, TIE = "best", "tie"
BEST_MARK, TIE_MARK = "★", "≈"
# No ★ on fewer seeds than the claims ledger's plan decides a claim on (benchmarks/ledger_plan.yaml
# star_min_seeds; a test pins the two together): a separated leader of 3 seeds shows no mark.
STAR_MIN_SEEDS = 10
DERIVED_NOTE = "†"  # headline = global_test_acc: one model shared by every client
NO_FAIRNESS_NOTE = "‡"  # fairness hidden: clients share one test set


@dataclass(frozen=True)
class Column:
    key: str  # a metric name, or a quantity derived from the histories
    label: str
    title: str  # the header's tooltip: what the number is
    better: str | None  # "max", "min", or None (shown, never judged)
    scale: float = 1.0  # displayed value = scale * logged value
    decimals: int = 4
    fairness: bool = False  # a spread across clients: shown only where each client has its own test


COLUMNS = (
    Column(HEADLINE, "Mean client acc. (%)", "Headline: mean over clients of each client's test accuracy under "
           "the model that client ends with, at the final evaluation, in %", "max", 100, 2),
    Column(Metric.GLOBAL_TEST_ACC, "Global acc. (%)", "Accuracy on the shared global test set, in % (secondary: "
           "not judged)", None, 100, 2),
    Column(Metric.TEST_ACC_STD, "Std (pp)", "Population std of the clients' test accuracies, in percentage points "
           "(FedFV's 'Var.' and FedMGDA+'s std are this quantity) (lower = fairer)", "min", 100, 2, True),
    Column(Metric.TEST_ACC_WORST10, "Worst 10% (%)", "Mean accuracy of the worst 10% of clients, in %", "max", 100, 2,
           True),
    Column(Metric.TEST_ACC_WORST5, "Worst 5% (%)", "Mean accuracy of the worst 5% of clients, in %", "max", 100, 2,
           True),
    # our variance (population, of accuracies in %) is Std²; FedFV's "Var." is a std (pp): see Std
    Column(Metric.TEST_ACC_VAR, "Variance (pp²)", "Population variance of the clients' test accuracies, in "
           "percentage points squared (= Std²; not FedFV's 'Var.', which is a std in pp: the Std column) "
           "(lower = fairer)", "min", 1e4, 2, True),
    Column(Metric.TEST_ACC_ANGLE, "Angle (rad)", "FedLF's fairness angle between the accuracy vector and 1, "
           "in radians (lower = fairer)", "min", 1, 3, True),
    Column(Metric.TEST_ACC_JAIN, "Jain", "Jain's fairness index of the clients' accuracies (1 = equal)", "max", 1, 4,
           True),
    Column(Metric.TEST_ACC_BEST5, "Best 5% (%)", "Mean accuracy of the best 5% of clients, in % (not a fairness "
           "verdict: not judged)", None, 100, 2, True),
    # CGSV's rho compares each agent's own models (standalone vs final): it is defined on the shared
    # test set (Xu et al., NeurIPS 2021, Sec. 4), so it is shown under client test `global` too
    Column(Metric.CGSV_RHO, "CGSV ρ", "CGSV's fairness: 100 × Pearson(standalone accuracies, final accuracies) "
           "of the clients", "max", 1, 2),
    Column(Metric.CGSV_RHO_R, "CGSV ρ_r", "100 × Pearson(CGSV's reputations r_i, final client accuracies)", "max",
           1, 2),
    Column(Metric.CONFLICTS_MODEL, "Conflicts / round", "Sampled clients whose update conflicts with the server step "
           "(model level), mean over rounds (a diagnostic: not judged)", None, 1, 2),
    Column("time_per_round", "Time / round (s)", f"{Metric.CLIENT_TIME_S} + {Metric.SERVER_TIME_S}, mean over "
           "rounds (depends on the machine: not judged)", None, 1, 3),
)
COLUMNS_BY_KEY = {c.key: c for c in COLUMNS}
# The fairness value of the index matrix: the first of these a table has.
MATRIX_FAIRNESS = (Metric.TEST_ACC_WORST10, Metric.TEST_ACC_WORST5, Metric.TEST_ACC_STD)


def headline_value(run: RunRecord) -> tuple[float | None, bool]:
    """(the run's headline value, whether it was derived). Where every client ends with the one
    shared model and is tested on the shared set, each client's accuracy is global_test_acc."""
    value = run.final(HEADLINE)
    if value is not None:
        return value, False
    if run.client_test == "global" and not run.per_client_models and run.final(Metric.GLOBAL_TEST_ACC) is not None:
        return run.final(Metric.GLOBAL_TEST_ACC), True
    return None, False


def run_value(run: RunRecord, key: str) -> float | None:
    """The per-run number behind a column: the headline, a final metric, or a mean over rounds."""
    if key == HEADLINE:
        return headline_value(run)[0]
    if key == "time_per_round":
        return run.time_per_round()
    if key == Metric.CONFLICTS_MODEL:
        return run.mean_over_rounds(Metric.CONFLICTS_MODEL)
    return run.final(key)


@dataclass(frozen=True)
class Stat:
    """Mean ± sample std (ddof=1) over seeds of a per-run value, with the values themselves and
    the seed of each (aligned with ``values``; empty when unknown)."""

    mean: float
    std: float | None  # None with a single seed
    n: int
    values: tuple[float, ...] = ()
    seeds: tuple[str, ...] = ()

    @classmethod
    def of(cls, values: list[float | None], seeds: list[str] | None = None) -> Stat | None:
        """The stat of the present (not None, not NaN) values; ``seeds``, when given, align with ``values``."""
        if seeds is not None and len(seeds) != len(values):
            raise ValueError(f"{len(seeds)} seeds for {len(values)} values")
        pairs = [(v, s) for v, s in zip(values, seeds if seeds is not None else [""] * len(values))
                 if v is not None and not math.isnan(v)]
        if not pairs:
            return None
        present = tuple(v for v, _ in pairs)
        std = statistics.stdev(present) if len(present) >= 2 else None
        kept = tuple(s for _, s in pairs) if seeds is not None else ()
        return cls(statistics.fmean(present), std, len(present), present, kept)


@dataclass(frozen=True)
class Verdict:
    """Where a row stands in one column: its rank by mean, its mark, the p-value behind the mark."""

    rank: int  # 1 + the number of rows with a strictly better mean
    of: int  # rows with a value in this column
    mark: str = ""  # BEST, TIE or ""
    # two-sided p against the top row (the top row: against the runner-up): paired t-test over the
    # shared seeds when >= PAIRED_MIN_SEEDS, else Welch (None: fewer than MIN_SEEDS seeds)
    p: float | None = None


def format_number(value: float | None, column: Column) -> str:
    if value is None or math.isnan(value):
        return MISSING
    return f"{value * column.scale:.{column.decimals}f}"


def format_stat(stat: Stat | None, column: Column) -> str:
    if stat is None:
        return MISSING
    text = format_number(stat.mean, column)
    if stat.std is not None:
        text += f" ± {format_number(stat.std, column)}"
    return text


def format_p(p: float | None) -> str:
    if p is None:
        return "no test (fewer than 2 seeds)"
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def run_time(run: RunRecord) -> float:
    moment = run.end_time or run.start_time
    return moment.timestamp() if moment else 0.0


def seed_order(run: RunRecord) -> tuple:
    seed = run.seed
    return (0, int(seed), "", run.run_id) if seed.lstrip("-").isdigit() else (1, 0, seed, run.run_id)


@dataclass
class ConfigRow:
    config: str
    runs: list[RunRecord]  # all runs of this configuration in the table, whatever their status
    used_runs: list[RunRecord] = field(default_factory=list)  # newest FINISHED run per seed
    superseded: dict[str, RunRecord] = field(default_factory=dict)  # run id -> the newer run used instead
    stats: dict[str, Stat | None] = field(default_factory=dict)
    verdicts: dict[str, Verdict] = field(default_factory=dict)

    @property
    def finished_runs(self) -> list[RunRecord]:
        return self.used_runs

    @property
    def seeds_finished(self) -> int:
        return len(self.used_runs)

    @property
    def seeds_total(self) -> int:
        return len({r.seed for r in self.runs})

    @property
    def algorithm(self) -> str:
        return ", ".join(sorted({r.tags.get(Tag.ALGORITHM, "") for r in self.runs} - {""}))

    @property
    def headline_derived(self) -> bool:
        return any(headline_value(r)[1] for r in self.used_runs)

    @property
    def ranked(self) -> bool:
        return self.stats.get(HEADLINE) is not None

    @property
    def rounds(self) -> list[int]:
        return [r for r in (run.rounds_completed() for run in self.used_runs) if r is not None]

    @property
    def rounds_text(self) -> str:
        """The rounds the row's runs completed ("60", or "40–60" where they differ), followed by "/ planned" when
        they share one planned length (the extended one where a run was extended); ``MISSING`` without any."""
        rounds = self.rounds
        if not rounds:
            return MISSING
        text = str(rounds[0]) if min(rounds) == max(rounds) else f"{min(rounds)}–{max(rounds)}"
        planned = {r.tags.get(Tag.EXTENDED_TO_ROUNDS) or r.params.get(schema.NUM_ROUNDS)
                   for r in self.used_runs} - {None}
        if len(planned) == 1:
            text += f" / {planned.pop()}"
        return text

    @property
    def rounds_sort(self) -> float | None:
        rounds = self.rounds
        return statistics.fmean(rounds) if rounds else None

    def cell_text(self, key: str) -> str:
        return format_stat(self.stats.get(key), COLUMNS_BY_KEY[key])

    def sort_value(self, key: str) -> float | None:
        stat = self.stats.get(key)
        return None if stat is None else stat.mean


def pick_used_runs(runs: list[RunRecord]) -> tuple[list[RunRecord], dict[str, RunRecord]]:
    """The newest FINISHED run per seed, and every older FINISHED run -> the run that replaced it."""
    by_seed: dict[str, list[RunRecord]] = {}
    for run in runs:
        if run.finished:
            by_seed.setdefault(run.seed, []).append(run)
    used, superseded = [], {}
    for seed_runs in by_seed.values():
        newest = max(seed_runs, key=lambda r: (run_time(r), r.run_id))
        used.append(newest)
        superseded.update({r.run_id: newest for r in seed_runs if r is not newest})
    return sorted(used, key=seed_order), superseded


def judge(rows: list[ConfigRow], column: Column) -> None:
    """Rank the rows in one column and mark the verdict: ★ on the top row when it is separated
    from every other row (two-sided p < 0.05: paired t-test over the seeds both rows share when
    there are >= PAIRED_MIN_SEEDS, else Welch); else ≈ on the top row and every row not separated from it."""
    scored = [(row, stat) for row in rows if (stat := row.stats.get(column.key))]
    if not scored or column.better is None:
        return
    sign = 1.0 if column.better == "max" else -1.0
    scored.sort(key=lambda pair: -sign * pair[1].mean)
    top_row, top = scored[0]
    p_values: dict[int, float | None] = {}
    for row, stat in scored[1:]:
        p_values[id(row)] = p_between(top.values, stat.values, top.seeds, stat.seeds)
    tied = {key for key, p in p_values.items() if p is None or p >= SIGNIFICANCE}
    runner_up_p = p_values[id(scored[1][0])] if len(scored) > 1 else None
    for row, stat in scored:
        better_rows = sum(1 for _, other in scored
                          if sign * (other.mean - stat.mean) > 1e-12 * max(1.0, abs(stat.mean)))
        if len(scored) < 2:
            mark = ""
        elif row is top_row:
            mark = TIE if tied else BEST if top.n >= STAR_MIN_SEEDS else ""
        else:
            mark = TIE if id(row) in tied else ""
        p = runner_up_p if row is top_row else p_values[id(row)]
        row.verdicts[column.key] = Verdict(1 + better_rows, len(scored), mark, p)


@dataclass
class PaperComparison:
    """A paper's reported numbers beside ours for the same setting and configuration label."""

    paper: PaperNumber
    ours: ConfigRow | None  # our row with the same algorithm_config label, if any


@dataclass
class BenchmarkTable:
    suite: str
    benchmark: str
    task: Task
    client_test: str
    rows: list[ConfigRow]
    runs: list[RunRecord]
    columns: tuple[Column, ...] = ()
    slug: str = ""
    difference: str = ""  # what sets this table's task apart from its benchmark's other tables
    main: bool = True  # the benchmark's main table (the most configurations); others: "other task"
    siblings: list[BenchmarkTable] = field(default_factory=list)  # the benchmark's other tables
    comparisons: list[PaperComparison] = field(default_factory=list)

    @property
    def key(self) -> str:
        """The title: benchmark name, and what differs when its runs had several tasks."""
        return f"{self.benchmark} · {self.difference}" if self.difference else self.benchmark

    @property
    def suites(self) -> list[str]:
        return [self.suite]

    @property
    def scales(self) -> list[str]:
        return sorted({r.scale for r in self.runs} - {""})  # a plain fit has none

    @property
    def papers(self) -> list[str]:
        return sorted({r.tags.get(Tag.PAPER, "") for r in self.runs} - {""})

    @property
    def offline(self) -> bool:
        return "offline" in self.scales

    @property
    def fairness_shown(self) -> bool:
        """Fairness statistics only where every client has a test of its own (local or matched)."""
        return self.client_test in CLIENT_TESTS_WITH_OWN_TEST

    @property
    def client_test_size(self) -> str:
        """The client test's size as the runs recorded it; where seeds drew different splits, the first
        seed's and how many other sizes there are (not one sentence per seed)."""
        sizes = sorted({r.client_test_size for r in self.runs if r.client_test_size})
        if len(sizes) > 3:
            first = min(self.runs, key=seed_order).client_test_size or sizes[0]
            return f"{first} (seed {min(self.runs, key=seed_order).seed}; {len(sizes) - 1} other sizes across seeds)"
        return "; ".join(sizes) if sizes else MISSING

    @property
    def client_test_text(self) -> str:
        """``local: 2-40 samples per client (median 10)``: the client test and its size, said once."""
        size = self.client_test_size
        if size.startswith(f"{self.client_test}:"):
            return size
        return f"{self.client_test}: {size}" if size != MISSING else f"{self.client_test} (size not recorded)"

    @property
    def description(self) -> str:
        """The suite's description (``suite_description`` tag of the newest run that has it)."""
        described = [r for r in self.runs if r.suite_description]
        return max(described, key=run_time).suite_description if described else ""

    @property
    def control(self) -> str:
        controls = sorted({r.control for r in self.runs} - {""})
        return controls[0] if controls else ""

    @property
    def used_runs(self) -> list[RunRecord]:
        return [r for row in self.rows for r in row.used_runs]

    @property
    def versions(self) -> list[tuple[str, int]]:
        """(code version or "unknown", runs) of the runs in the means, most runs first: the
        library's source tree at the run's commit (``RunRecord.code_version``)."""
        return Counter(r.code_version or "unknown" for r in self.used_runs).most_common()

    @property
    def commits(self) -> dict[str, list[str]]:
        """code version -> the commits (git sha) of the runs in the means that ran it."""
        found: dict[str, set[str]] = {}
        for run in self.used_runs:
            found.setdefault(run.code_version or "unknown", set()).add(run.git_sha or "unknown")
        return {version: sorted(shas) for version, shas in found.items()}

    @property
    def replays(self) -> tuple[int, int]:
        """(runs in the means replayed by ``fl-lightning replay``, of which identical)."""
        results = [r.tags.get(Tag.REPLAY_RESULT, "") for r in self.used_runs]
        return sum(1 for x in results if x), sum(1 for x in results if x == schema.REPLAY_IDENTICAL)

    @property
    def mixed_versions(self) -> bool:
        shas = dict(self.versions)
        return len(shas) > 1 or "unknown" in shas

    @property
    def superseded_count(self) -> int:
        return sum(len(row.superseded) for row in self.rows)

    @property
    def seed_counts(self) -> list[int]:
        return sorted({row.seeds_finished for row in self.rows if row.seeds_finished})

    @property
    def seeds_text(self) -> str:
        counts = self.seed_counts
        if not counts:
            return "0"
        return str(counts[0]) if len(counts) == 1 else f"{counts[0]}–{counts[-1]}"

    @property
    def status_counts(self) -> dict[str, int]:
        return dict(sorted(Counter(r.status for r in self.runs).items()))

    @property
    def problem_runs(self) -> list[RunRecord]:
        """Failed, killed and unfinished runs: listed in their own table."""
        return [r for r in self.runs if not r.finished]

    @property
    def unranked_rows(self) -> list[ConfigRow]:
        return [row for row in self.rows if not row.ranked]

    @property
    def multi_suite(self) -> bool:
        return False

    def in_means(self, run: RunRecord) -> bool:
        return any(run is used for row in self.rows for used in row.used_runs)

    def superseded_by(self, run: RunRecord) -> RunRecord | None:
        return next((row.superseded[run.run_id] for row in self.rows if run.run_id in row.superseded), None)

    def seed_finished_later(self, run: RunRecord) -> bool:
        """A failed/unfinished run whose (configuration, seed) has a FINISHED run too (a resumed suite)."""
        return any(r.finished and r.seed == run.seed and r.config == run.config for r in self.runs)

    def row(self, config: str) -> ConfigRow | None:
        return next((row for row in self.rows if row.config == config), None)

    def fairness_key(self) -> str | None:
        """The fairness value the index matrix shows for this table."""
        if not self.fairness_shown:  # clients share one test set: CGSV's rho is still defined there
            return Metric.CGSV_RHO if any(row.stats.get(Metric.CGSV_RHO) for row in self.rows) else None
        return next((key for key in MATRIX_FAIRNESS
                     if any(row.stats.get(key) for row in self.rows)), MATRIX_FAIRNESS[0])

    def paper_metric_columns(self) -> list[Column]:
        """The columns for which some matched paper entry reports a number."""
        reported = {k for c in self.comparisons for k in c.paper.metrics}
        return [c for c in COLUMNS if c.key in reported]


def welch_between(first: ConfigRow, second: ConfigRow, key: str = HEADLINE) -> float | None:
    """Two-sided p between two rows in one column: paired t-test over the seeds both share when
    there are >= PAIRED_MIN_SEEDS, else Welch (None with fewer than 2 seeds in either)."""
    a, b = first.stats.get(key), second.stats.get(key)
    if a is None or b is None or a.n < MIN_SEEDS or b.n < MIN_SEEDS:
        return None
    return p_between(a.values, b.values, a.seeds, b.seeds)
