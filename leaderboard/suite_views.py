"""The views across a suite's tables: the index, the algorithm x benchmark matrix, the gains over
FedAvg, variants against their control, and the papers' own numbers."""

from __future__ import annotations

from fl_lightning.records.vocabulary import Metric
from leaderboard.algorithms import interpretations
from leaderboard.papers import PaperNumber
from leaderboard.row_facts import (
    differs,
    marked_config,
    num_text,
    participation_note,
    row_fraction,
    seeds_text,
    task_fraction,
)
from leaderboard.summary import ControlGroup, SuiteSummary, matching_row
from leaderboard.tables import (
    COLUMNS,
    COLUMNS_BY_KEY,
    HEADLINE,
    MISSING,
    NO_FAIRNESS_NOTE,
    BenchmarkTable,
    ConfigRow,
    format_number,
    format_p,
)
from leaderboard.view_cells import FAIRNESS_SHORT, Cell, Header, TableView
from leaderboard.views import config_cell, replay_text, stat_cell, versions_text


def index_view(tables: list[BenchmarkTable]) -> TableView:
    """Every table of the store: its task, client test, seeds, runs, superseded runs, code versions."""
    headers = [
        Header(
            "Benchmark",
            "suite's benchmark name; a second line says what differs when its runs had several tasks",
            key="benchmark",
        ),
        Header("Suite", key="suite"),
        Header("Scale", key="scale"),
        Header(
            "Task",
            "main = the benchmark's table with the most configurations; other task = never ranked with the main table",
            key="task",
        ),
        Header("Client test", "how each client's accuracy was measured", key="client_test"),
        Header("Configurations", kind="num", first="desc", key="configs"),
        Header("Seeds", "seeds in the means per configuration", kind="num", first="desc", key="seeds"),
        Header("Runs", kind="num", first="desc", key="runs"),
        Header("Status", "runs per MLflow status", key="status"),
        Header(
            "Superseded",
            "older FINISHED runs replaced by a newer run of the same (configuration, seed)",
            kind="num",
            first="desc",
            key="superseded",
        ),
        Header("Code versions", "fl_lightning/ source tree (and commits) of the runs in the means", key="versions"),
        Header(
            "Replayed",
            "runs in the means fitted again from their logged settings by `fl-lightning replay`, "
            "and how many gave every number of every round again",
            key="replayed",
        ),
    ]
    view = TableView("benchmarks", headers)
    for table in tables:
        scale = ", ".join(s.upper() + "-SCALE" if s != "unknown" else "scale unknown" for s in table.scales) or "—"
        status = ", ".join(f"{k} {v}" for k, v in table.status_counts.items())
        task = ("main" if table.main else "other task") + (f": {table.difference}" if table.difference else "")
        versions = versions_text(table)
        view.rows.append(
            [
                Cell(table.benchmark, table.benchmark, link=f"benchmarks/{table.slug}"),
                Cell(table.suite, table.suite),
                Cell(scale, scale),
                Cell(task, task),
                Cell(table.client_test, table.client_test),
                Cell(str(len(table.rows)), str(len(table.rows))),
                Cell(table.seeds_text, str(max(table.seed_counts or [0]))),
                Cell(str(len(table.runs)), str(len(table.runs))),
                Cell(status, status),
                Cell(str(table.superseded_count), str(table.superseded_count)),
                Cell(("⚠ mixed: " if table.mixed_versions else "") + versions, versions, code=not table.mixed_versions),
                Cell(replay_text(table), str(table.replays[0])),
            ]
        )
        view.row_classes.append("" if table.main else "other-task")
    return view


def matrix_cell(summary: SuiteSummary, table: BenchmarkTable, config: str) -> Cell:
    """Headline mean ± std, n, rank and mark; below it the table's fairness value with its rank."""
    row, other = summary.cell(table, config)
    if row is None:
        if other is not None:
            return Cell("other task", link=f"benchmarks/{other.slug}", muted=True,
                        mark_title=f"ran only with another task ({other.difference}): not ranked here")
        return Cell(MISSING)
    cell = stat_cell(row, COLUMNS_BY_KEY[HEADLINE], table)
    if not row.ranked:
        cell.mark_title = "not ranked: no headline value (see its benchmark page)"
    fairness = table.fairness_key()
    if fairness is None:
        cell.extra.append(Cell(MISSING, label="fairness", note=NO_FAIRNESS_NOTE))
    else:
        column = COLUMNS_BY_KEY[fairness]
        value = stat_cell(row, column, table)
        verdict = row.verdicts.get(fairness)
        value.rank = f"#{verdict.rank}/{verdict.of}" if verdict else ""
        value.label, value.sub = FAIRNESS_SHORT[fairness], ""
        cell.extra.append(value)
    return cell


def matrix_view(summary: SuiteSummary, view_id: str) -> TableView:
    """Algorithm configuration x benchmark (main tables) of one suite."""
    headers = [Header("Configuration", "algorithm_config; rows by average headline rank", key="config")]
    for table, label in zip(summary.tables, summary.column_labels):
        fairness = table.fairness_key()
        title = (f"{table.benchmark}: headline mean client accuracy (%) ± std over seeds, n seeds, rank; then "
                 + (f"{FAIRNESS_SHORT[fairness]} ({COLUMNS_BY_KEY[fairness].label}) with its rank" if fairness
                    else f"fairness {NO_FAIRNESS_NOTE} not shown (client test {table.client_test})"))
        if table.mixed_versions:
            title += f". ⚠ runs from several code versions: {versions_text(table)}"
        label += " ⚠" if table.mixed_versions else ""
        headers.append(Header(label, title, "num", "desc", table.slug, link=f"benchmarks/{table.slug}"))
    view = TableView(view_id, headers, css_class="matrix")
    marked: dict[str, float] = {}
    references = []
    for config in summary.configs:
        runs = [run for table in summary.tables for row in table.rows if row.config == config for run in row.runs]
        fraction, reference = matrix_participation(summary, config)
        if differs(fraction, reference):
            marked[config] = fraction
            references.append(reference)
        cells = [Cell(marked_config(config, fraction, reference), config, sub=interpretations(runs))]
        cells += [matrix_cell(summary, table, config) for table in summary.tables]
        view.rows.append(cells)
    if marked and len(set(references)) == 1:
        view.notes.append(participation_note(marked, references[0]))
    return view


def matrix_participation(summary: SuiteSummary, config: str) -> tuple[float | None, float | None]:
    """(the configuration's participation, the column's) for the first column where they differ
    (its row in another task's table, or its runs' own ``fraction``); else (None, None)."""
    for table in summary.tables:
        row, other = summary.cell(table, config)
        if row is None and other is not None:
            row, owner = other.row(config), other
        else:
            owner = table
        if row is None:
            continue
        fraction, reference = row_fraction(row, owner), task_fraction(table)
        if differs(fraction, reference):
            return fraction, reference
    return None, None


def percent_change(value: float | None) -> str:
    return MISSING if value is None else f"{100 * value:+.1f} %"


def gains_view(summary: SuiteSummary, view_id: str) -> TableView:
    """The suite page's table of gains over FedAvg: per benchmark and configuration, our relative gain
    (with its p against FedAvg's seeds) beside the paper's, with the paper's source and setting."""
    headers = [Header("Our benchmark", key="benchmark"), Header("Configuration", key="config"),
               Header("Ours: gain over FedAvg", "(ours − FedAvg) / FedAvg of the headline means in the same "
                      "table; p against FedAvg's seeds (paired by seed, or Welch)", "num", "desc", "ours"),
               Header("Paper: gain over FedAvg", "(paper − paper's FedAvg) / paper's FedAvg, same paper table",
                      "num", "desc", "paper"),
               Header("Paper source", key="source"), Header("Paper setting", key="setting")]
    view = TableView(view_id, headers)
    for gain in summary.gains:
        ours = Cell(percent_change(gain.ours), num_text(gain.ours))
        if gain.ours is not None:
            ours.sub = format_p(gain.ours_p) + (" (within seed noise)" if gain.ours_p is None or gain.ours_p >= 0.05
                                                else "")
        view.rows.append([
            Cell(gain.table.benchmark, gain.table.benchmark, link=f"benchmarks/{gain.table.slug}"),
            Cell(gain.config, gain.config, sub=f"the paper's: {gain.paper_config}" if gain.paper_config else ""),
            ours, Cell(percent_change(gain.paper), num_text(gain.paper),
                       sub=f"not comparable: {gain.caveat}" if gain.caveat else ""),
            Cell(gain.source, gain.source), Cell(gain.setting, gain.setting),
        ])
    return view


def short_name(name: str, control: str) -> str:
    """A variant's name without the part it shares with its control (``.../bias-attack-10`` -> ``bias-attack-10``)."""
    prefix = control.rsplit("/", 1)[0] + "/" if "/" in control else ""
    return name[len(prefix):] if prefix and name.startswith(prefix) else name


ATTACK_ARGUMENTS = ("attack", "attack_client", "attack_strength")


def without_attack(config: str) -> str:
    """``config`` without the attack's arguments: ``QFedAvg(attack_strength=30.0,q=5.0)`` -> ``QFedAvg(q=5.0)``."""
    name, bracket, arguments = config.partition("(")
    if not bracket or not arguments.endswith(")"):
        return config
    kept = [a for a in arguments[:-1].split(",") if a.split("=", 1)[0].strip() not in ATTACK_ARGUMENTS]
    return f"{name}({','.join(kept)})" if kept else name


def control_view(group: ControlGroup, view_id: str) -> TableView:
    """Every configuration under the control and each variant, Δ = variant − control (same configuration,
    the control's table with the closest task)."""
    control_label = short_name(group.control, group.control)
    keys = [HEADLINE] + ([Metric.TEST_ACC_WORST10] if any(
        t.fairness_shown and any(r.stats.get(Metric.TEST_ACC_WORST10) for r in t.rows)
        for t in group.control_tables + [t for _, ts in group.variants for t in ts]) else [])
    headers = [Header("Configuration", key="config")]
    for key in keys:
        column = COLUMNS_BY_KEY[key]
        headers.append(Header(f"control {control_label}: {column.label}", f"{column.title}; the declared control",
                              "num", "desc", f"control:{key}"))
    for name, _ in group.variants:
        for key in keys:
            column = COLUMNS_BY_KEY[key]
            headers.append(Header(f"{short_name(name, group.control)}: {column.label} (Δ vs {control_label})",
                                  f"{column.title}; Δ = this variant − its declared control {group.control}, "
                                  "same configuration", "num", "desc", f"{name}:{key}"))
    view = TableView(view_id, headers)

    def control_of(config: str, like: BenchmarkTable | None = None) -> tuple[ConfigRow | None, BenchmarkTable | None]:
        """The control's row of ``config``, else of ``config`` without its attack arguments (an
        attacked configuration is compared with the same algorithm unattacked)."""
        row, table = matching_row(group.control_tables, config, like=like)
        if row is None and without_attack(config) != config:
            row, table = matching_row(group.control_tables, without_attack(config), like=like)
        return row, table

    main_control = next((t for t in group.control_tables if t.main), None)
    reference = task_fraction(main_control)
    marked: dict[str, float] = {}
    for config in group.configs():
        control_rows = {}
        for name, tables in group.variants:
            row, table = matching_row(tables, config)
            control_rows[name] = control_of(config, like=table)
        base_row, base_table = control_of(config)
        used = [(base_row, base_table)] + [matching_row(tables, config) for _, tables in group.variants]
        fraction = next((f for row, table in used if row is not None
                         and differs(f := row_fraction(row, table), reference)), None)
        if fraction is not None:
            marked[config] = fraction
        cells = [Cell(marked_config(config, fraction, reference), config)]
        for key in keys:
            cells.append(_value_cell(base_row, base_table, key))
        for name, tables in group.variants:
            row, table = matching_row(tables, config)
            control_row, control_table = control_rows[name]
            for key in keys:
                cells.append(_value_cell(row, table, key, control_row, control_table))
        view.rows.append(cells)
    if marked and reference is not None:
        view.notes.append(participation_note(marked, reference))
    return view


def _value_cell(row: ConfigRow | None, table: BenchmarkTable | None, key: str,
                control_row: ConfigRow | None = None, control_table: BenchmarkTable | None = None) -> Cell:
    column = COLUMNS_BY_KEY[key]
    if row is None or table is None:
        return Cell(MISSING)
    if column.fairness and not table.fairness_shown:
        return Cell(MISSING, note=NO_FAIRNESS_NOTE)
    stat = row.stats.get(key)
    if stat is None:
        return Cell(MISSING)
    cell = Cell(format_number(stat.mean, column), num_text(stat.mean), sub=seeds_text(stat.n))
    if control_row is not None:
        base = control_row.stats.get(key)
        if base is not None and not (column.fairness and not control_table.fairness_shown):
            cell.text += f" (Δ {format_number(stat.mean - base.mean, column)})"
        elif control_table is None or base is None:
            cell.sub += "; no control value"
    return cell


def paper_numbers_view(numbers: list[PaperNumber], known: set[str], table_id: str) -> TableView:
    """One paper's reported numbers (only the metrics it reports) that no benchmark of ours matches."""
    reported = {k for p in numbers for k in p.metrics}
    columns = [c for c in COLUMNS if c.key in reported]
    extra = sorted(reported - {c.key for c in columns})
    headers = [Header("Setting (paper-scale)", key="setting"), Header("Configuration", key="config")]
    headers += [Header(c.label, c.title, "num", "desc" if c.better == "max" else "asc", c.key) for c in columns]
    headers += [Header(name, kind="num", key=name) for name in extra]
    headers += [Header("Source", key="source"), Header("matches_benchmark", key="matches")]
    view = TableView(table_id, headers)
    for number in numbers:
        cells = [Cell(number.setting, number.setting), config_cell(number)]
        for column in columns:
            value = number.metrics.get(column.key)
            cells.append(Cell(format_number(value, column), num_text(value)))
        for name in extra:
            value = number.metrics.get(name)
            cells.append(Cell(MISSING if value is None else f"{value:g}", num_text(value)))
        cells.append(Cell(number.source, number.source))
        if number.matches_benchmark is None:
            matches = "null (no offline counterpart)"
        elif number.matches_benchmark not in known:
            matches = f"{number.matches_benchmark} (no runs in this store)"
        else:
            matches = number.matches_benchmark
        cells.append(Cell(matches, matches))
        view.rows.append(cells)
    return view
