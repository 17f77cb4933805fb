"""Building the tables from the runs: one per (suite, benchmark, task, client test), a row per
configuration with its seeds aggregated and its verdicts judged, the benchmark's main table
first, each table's slug and the paper numbers matched to it."""

from __future__ import annotations

import re
from collections import Counter

from leaderboard.papers import PaperNumber
from leaderboard.runs import RunRecord
from leaderboard.tables import (
    COLUMNS,
    HEADLINE,
    BenchmarkTable,
    ConfigRow,
    PaperComparison,
    Stat,
    judge,
    pick_used_runs,
    run_time,
    run_value,
    seed_order,
)
from leaderboard.tasks import UNRECORDED, Task, differences


def slugify(key: str, taken: set[str]) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", key.replace("/", "__")).strip("._") or "benchmark"
    candidate, n = slug, 2
    while candidate.lower() in taken:
        candidate, n = f"{slug}-{n}", n + 1
    taken.add(candidate.lower())
    return candidate


def _row_order(row: ConfigRow) -> tuple:
    accuracy = row.sort_value(HEADLINE)
    return (accuracy is None, -(accuracy or 0.0), row.config)


def make_table(suite: str, benchmark: str, task: Task, client_test: str, runs: list[RunRecord]) -> BenchmarkTable:
    """One table: a row per configuration, the seeds aggregated, the verdicts marked."""
    columns = tuple(c for c in COLUMNS if c.key == HEADLINE or any(run_value(r, c.key) is not None for r in runs))
    by_config: dict[str, list[RunRecord]] = {}
    for run in sorted(runs, key=seed_order):
        by_config.setdefault(run.config, []).append(run)
    rows = []
    for config, config_runs in by_config.items():
        used, superseded = pick_used_runs(config_runs)
        row = ConfigRow(config, config_runs, used, superseded)
        seeds = [r.seed for r in used]
        row.stats = {c.key: Stat.of([run_value(r, c.key) for r in used], seeds) for c in columns}
        rows.append(row)
    rows.sort(key=_row_order)
    table = BenchmarkTable(suite, benchmark, task, client_test, rows, runs, columns)
    for column in columns:
        if column.better and (table.fairness_shown or not column.fairness):
            judge(rows, column)
    return table


def _main_first(tables: list[BenchmarkTable]) -> list[BenchmarkTable]:
    """The benchmark's main table first: the most configurations, then the most runs, then the newest."""
    return sorted(tables, key=lambda t: (-len(t.rows), -len(t.used_runs), -max(map(run_time, t.runs))))


def split_by_task(suite: str, benchmark: str, runs: list[RunRecord]) -> list[BenchmarkTable]:
    """The tables of one benchmark of one suite: one per (task, client test). Runs without any
    task record that never finished join the main table's list of failed runs (nothing to rank)."""
    groups: dict[tuple, list[RunRecord]] = {}
    for run in runs:
        groups.setdefault((run.task.identity, run.client_test), []).append(run)
    strays: list[RunRecord] = []
    for key in [k for k in groups if k[0][0] == UNRECORDED]:
        if len(groups) > 1 and not any(r.finished for r in groups[key]):
            strays += groups.pop(key)
    tables = _main_first([make_table(suite, benchmark, group[0].task, client_test, group)
                          for (_, client_test), group in groups.items()])
    if strays:
        tables[0].runs.extend(strays)
        tables[0].rows = rows_with_strays(tables[0].rows, strays)
    texts = differences([t.task for t in tables])
    shared_task = len({t.task.identity for t in tables}) < len(tables)  # told apart by the client test only
    for index, (table, text) in enumerate(zip(tables, texts)):
        if shared_task:
            text = ", ".join(part for part in (text, f"client test {table.client_test}") if part)
        table.difference = text
        table.main = index == 0
        table.siblings = [t for t in tables if t is not table]
    return tables


def rows_with_strays(rows: list[ConfigRow], strays: list[RunRecord]) -> list[ConfigRow]:
    """Failed runs without a task record, added to their configuration's row (seeds all)."""
    by_config = {row.config: row for row in rows}
    for run in strays:
        row = by_config.get(run.config)
        if row is None:
            row = by_config[run.config] = ConfigRow(run.config, [])
            rows.append(row)
        row.runs.append(run)
    return rows


def build_tables(runs: list[RunRecord], paper_numbers: list[PaperNumber] = ()) -> list[BenchmarkTable]:
    """Every table, grouped by suite and benchmark (main table first), with slugs and paper entries."""
    by_benchmark: dict[tuple[str, str], list[RunRecord]] = {}
    for run in runs:
        by_benchmark.setdefault((run.suite, run.benchmark), []).append(run)
    benchmark_suites = Counter(benchmark for _, benchmark in by_benchmark)
    taken: set[str] = set()
    tables = []
    for suite, benchmark in sorted(by_benchmark):
        for table in split_by_task(suite, benchmark, by_benchmark[(suite, benchmark)]):
            base = f"{suite}/{benchmark}" if benchmark_suites[benchmark] > 1 else benchmark
            table.slug = slugify(base if table.main else f"{base}/task-{table.task.key[:8]}", taken)
            if table.main:
                for number in paper_numbers:
                    if number.matches_benchmark == benchmark:
                        table.comparisons.append(PaperComparison(number, table.row(number.algorithm_config)))
            tables.append(table)
    return tables


def unmatched_paper_numbers(paper_numbers: list[PaperNumber], tables: list[BenchmarkTable]) -> list[PaperNumber]:
    names = {t.benchmark for t in tables}
    return [p for p in paper_numbers if p.matches_benchmark not in names]
