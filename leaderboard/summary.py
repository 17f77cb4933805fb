"""What the index page says per suite: the algorithm x benchmark matrix, our gains over FedAvg
beside the paper's, and each variant (attack, fault) against its declared control."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from leaderboard.papers import PaperNumber
from leaderboard.tables import HEADLINE, BenchmarkTable, ConfigRow, run_time, welch_between
from leaderboard.tasks import differences

BASELINE = "FedAvg"  # relative gains are over this configuration of the same table


@dataclass
class Gain:
    """One configuration's relative gain over FedAvg, ours (same table) beside the paper's."""

    table: BenchmarkTable
    config: str
    ours: float | None  # (ours - FedAvg) / FedAvg of the headline means
    ours_p: float | None  # p of the configuration against FedAvg in our table (paired by seed, or Welch)
    paper: float | None
    source: str  # the paper's table
    setting: str  # the paper's setting
    paper_config: str = ""  # the paper's configuration, where ours is another of the same algorithm
    caveat: str = ""  # why the paper's gain does not compare with ours (its own or its FedAvg entry's)


@dataclass
class ControlGroup:
    """The variants of one suite whose declared control is the same benchmark."""

    control: str  # the control's benchmark name
    control_tables: list[BenchmarkTable]
    variants: list[tuple[str, list[BenchmarkTable]]]  # (variant benchmark name, its tables)

    def configs(self) -> list[str]:
        tables = self.control_tables + [t for _, tables in self.variants for t in tables]
        return list(dict.fromkeys(row.config for t in tables for row in t.rows))


@dataclass
class SuiteSummary:
    name: str
    description: str
    scales: list[str]
    papers: list[str]
    tables: list[BenchmarkTable]  # the main table of each benchmark, by benchmark name
    other_tables: list[BenchmarkTable]  # tables of another task than their benchmark's main one
    configs: list[str] = field(default_factory=list)  # the matrix's rows, best average rank first
    gains: list[Gain] = field(default_factory=list)
    control_groups: list[ControlGroup] = field(default_factory=list)

    @property
    def column_labels(self) -> list[str]:
        return short_labels([t.benchmark for t in self.tables])[0]

    @property
    def column_pattern(self) -> str:
        """The benchmark names of the matrix's columns, with … for the part each column shows."""
        return short_labels([t.benchmark for t in self.tables])[1]

    def cell(self, table: BenchmarkTable, config: str) -> tuple[ConfigRow | None, BenchmarkTable | None]:
        """(the row in the benchmark's main table, else None and the other-task table that has it)."""
        row = table.row(config)
        if row is not None:
            return row, None
        other = next((t for t in table.siblings if t.row(config) is not None), None)
        return None, other


def common_parts(names: list[str]) -> tuple[int, int]:
    """How many leading and trailing ``/`` parts all names share (each name keeps at least one part)."""
    if len(names) < 2:
        return 0, 0
    split = [name.split("/") for name in names]
    shortest = min(len(parts) for parts in split)
    lead = 0
    while lead < shortest - 1 and len({parts[lead] for parts in split}) == 1:
        lead += 1
    trail = 0
    while lead + trail < shortest - 1 and len({parts[-1 - trail] for parts in split}) == 1:
        trail += 1
    return lead, trail


def short_labels(names: list[str]) -> tuple[list[str], str]:
    """Column labels without the parts every benchmark shares, and the shared pattern
    (``synthetic/natural/p0.2/fl_logreg/…``); the full names where nothing is shared."""
    lead, trail = common_parts(names)
    if not lead and not trail:
        return list(names), ""
    split = [name.split("/") for name in names]
    labels = ["/".join(parts[lead:len(parts) - trail]) for parts in split]
    pattern = "/".join(split[0][:lead] + ["…"] + (split[0][-trail:] if trail else []))
    return labels, pattern


def matrix_order(tables: list[BenchmarkTable]) -> list[str]:
    """Configurations by their average headline rank over the benchmarks they ran on (unranked last)."""
    ranks: dict[str, list[int]] = {}
    for table in tables:
        for row in table.rows:
            verdict = row.verdicts.get(HEADLINE)
            ranks.setdefault(row.config, [])
            if verdict:
                ranks[row.config].append(verdict.rank)
    for table in tables:
        for sibling in table.siblings:
            for row in sibling.rows:
                ranks.setdefault(row.config, [])

    def order(config: str) -> tuple:
        values = ranks[config]
        return (not values, sum(values) / len(values) if values else 0.0, config)

    return sorted(ranks, key=order)


def baseline_row(table: BenchmarkTable) -> ConfigRow | None:
    row = table.row(BASELINE)
    if row is None:
        candidates = [r for r in table.rows if r.algorithm == BASELINE]
        row = candidates[0] if len(candidates) == 1 else None
    return row if row is not None and row.ranked else None


def relative(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return (value - base) / base


def normalized_setting(setting: str) -> str:
    """A setting string for comparison: case, spacing and punctuation do not matter."""
    return " ".join(re.sub(r"[^a-z0-9.%/+-]+", " ", setting.lower()).split())


def paper_baseline(number: PaperNumber, numbers: list[PaperNumber]) -> PaperNumber | None:
    """The paper's FedAvg entry that ``number``'s gain is taken against: the same paper table
    (``source``) and the same ``offline_counterpart``; where the FedAvg entry names no counterpart,
    the same table and the same setting (compared without case, spacing and punctuation). The
    setting strings of one table's entries need not be identical."""
    candidates = [n for n in numbers if n.paper == number.paper and n.source == number.source
                  and n.algorithm_config == BASELINE and HEADLINE in n.metrics]
    same_counterpart = [n for n in candidates if number.offline_counterpart
                        and n.offline_counterpart == number.offline_counterpart]
    if same_counterpart:
        return same_counterpart[0]
    setting = normalized_setting(number.setting)
    return next((n for n in candidates if not n.offline_counterpart and normalized_setting(n.setting) == setting),
                None)


def algorithm_of(config: str) -> str:
    """``CGSV(beta=1.5)`` -> ``CGSV``."""
    return config.split("(", 1)[0]


def configs_that_ran(table: BenchmarkTable, config: str) -> list[tuple[ConfigRow, bool]]:
    """The ranked rows of ``table`` that stand for the paper's ``config``: its own row where it ran,
    else every ranked configuration of the same algorithm (``True``: a stand-in, another setting of
    the paper's method), else none; a configuration without runs is never shown as ours."""
    own = table.row(config)
    if own is not None and own.ranked:
        return [(own, False)]
    return [(row, True) for row in table.rows
            if row.ranked and algorithm_of(row.config) == algorithm_of(config) and row.config != BASELINE]


def paper_gains(numbers: list[PaperNumber], tables: list[BenchmarkTable]) -> list[Gain]:
    """For every paper entry with an ``offline_counterpart`` among these tables and a FedAvg entry of
    the same paper table and counterpart (``paper_baseline``): the paper's relative gain beside ours
    in the counterpart, under our configuration label (``counterpart_config`` where it differs)."""
    by_benchmark = {t.benchmark: t for t in tables}
    gains = []
    for number in numbers:
        table = by_benchmark.get(number.offline_counterpart or "")
        if table is None or number.algorithm_config == BASELINE or HEADLINE not in number.metrics:
            continue
        paper_base = paper_baseline(number, numbers)
        if paper_base is None:
            continue
        paper_gain = relative(number.metrics[HEADLINE], paper_base.metrics[HEADLINE])
        ours_base = baseline_row(table)
        for row, stand_in in configs_that_ran(table, number.our_config):
            ours = ours_p = None
            if ours_base is not None:
                ours = relative(row.stats[HEADLINE].mean, ours_base.stats[HEADLINE].mean)
                ours_p = welch_between(row, ours_base)
            gains.append(Gain(table, row.config, ours, ours_p, paper_gain, number.source, number.setting,
                              number.our_config if stand_in else "",
                              " ".join(dict.fromkeys(c for c in (paper_base.caveat, number.caveat) if c))))
    return gains


def control_groups(tables: list[BenchmarkTable]) -> list[ControlGroup]:
    """Variant benchmarks (``control`` tag) grouped by the control they declare."""
    by_name: dict[str, list[BenchmarkTable]] = {}
    for table in tables:
        by_name.setdefault(table.benchmark, []).append(table)
    groups: dict[str, list[str]] = {}
    for name, named in by_name.items():
        control = next((t.control for t in named if t.control), "")
        if control:
            groups.setdefault(control, []).append(name)
    return [ControlGroup(control, by_name.get(control, []), [(name, by_name[name]) for name in sorted(names)])
            for control, names in sorted(groups.items())]


def matching_row(tables: list[BenchmarkTable], config: str, like: BenchmarkTable | None = None
                 ) -> tuple[ConfigRow | None, BenchmarkTable | None]:
    """The configuration's row among one benchmark's tables: in the table whose task is closest to
    ``like``'s (fewest differing fields), else in the main table first."""
    having = [t for t in tables if t.row(config) is not None]
    if not having:
        return None, None
    if like is not None:
        having.sort(key=lambda t: (task_distance(t, like), not t.main))
    return having[0].row(config), having[0]


def task_distance(table: BenchmarkTable, other: BenchmarkTable) -> int:
    if table.task.identity == other.task.identity:
        return 0
    first, second = differences([table.task, other.task])
    return first.count(",") + 1 if first else 0


def summarize(tables: list[BenchmarkTable], numbers: list[PaperNumber] = ()) -> list[SuiteSummary]:
    """One summary per suite, suites by name."""
    summaries = []
    for suite in sorted({t.suite for t in tables}):
        suite_tables = [t for t in tables if t.suite == suite]
        main = sorted((t for t in suite_tables if t.main), key=lambda t: t.benchmark)
        papers = sorted({p for t in suite_tables for p in t.papers})
        described = [t for t in suite_tables if t.description]
        newest = max(described, key=lambda t: max(map(run_time, t.runs))) if described else None
        summaries.append(SuiteSummary(
            name=suite,
            description=newest.description if newest else "",
            scales=sorted({s for t in suite_tables for s in t.scales}),
            papers=papers,
            tables=main,
            other_tables=[t for t in suite_tables if not t.main],
            configs=matrix_order(main),
            gains=paper_gains([n for n in numbers if n.paper in papers or not papers], main),
            control_groups=control_groups(suite_tables),
        ))
    return summaries
