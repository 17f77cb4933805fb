"""Tables as rows of cells, rendered by both the HTML and the Markdown templates (same rows, same
verdicts in both)."""

from __future__ import annotations

from dataclasses import dataclass, field

from leaderboard.algorithms import interpretations
from leaderboard.papers import PaperNumber
from leaderboard.summary import ControlGroup, SuiteSummary, matching_row
from leaderboard.tables import (
    BEST,
    BEST_MARK,
    COLUMNS,
    COLUMNS_BY_KEY,
    DERIVED_NOTE,
    HEADLINE,
    MISSING,
    NO_FAIRNESS_NOTE,
    TIE,
    TIE_MARK,
    BenchmarkTable,
    Column,
    ConfigRow,
    format_number,
    format_p,
    format_stat,
    seed_order,
)

MARKS = {BEST: BEST_MARK, TIE: TIE_MARK}
MARK_TITLES = {BEST: "best, separated from every other row beyond seed noise (Welch p < 0.05)",
               TIE: "tied for the lead: not separable from the top row (Welch p ≥ 0.05, or fewer than 2 seeds)"}
FAIRNESS_SHORT = {"test_acc_worst10": "worst 10%", "test_acc_worst5": "worst 5%", "test_acc_std": "std",
                  "cgsv_rho": "CGSV ρ"}


@dataclass
class Header:
    label: str
    title: str = ""
    kind: str = "text"  # "text" or "num": how the inline script sorts the column
    first: str = "asc"  # the direction of the first click ("desc" where higher is better)
    key: str = ""
    link: str | None = None


@dataclass
class Cell:
    text: str  # the value (first line)
    sort: str = ""  # the raw value the script sorts by ("" = missing, sorted last)
    mark: str = ""  # BEST, TIE or ""
    mark_title: str = ""  # why the mark (the Welch p)
    rank: str = ""  # "#2/6": rank by mean among the rows with a value
    note: str = ""  # a footnote marker (†, ‡)
    sub: str = ""  # second line: "± 1.04 · n=2"
    extra: list[Cell] = field(default_factory=list)  # further values in the cell (the matrix's fairness)
    label: str = ""  # a prefix of an extra value ("worst 10%")
    link: str | None = None
    code: bool = False  # shown in a monospace font (ids, shas)
    detail: str = ""  # longer text, shown on demand in HTML (a failed run's log tail)
    muted: bool = False  # a value that is not ranked (another task)

    @property
    def best(self) -> bool:
        return self.mark == BEST

    @property
    def symbol(self) -> str:
        return MARKS.get(self.mark, "")


@dataclass
class TableView:
    id: str
    headers: list[Header]
    rows: list[list[Cell]] = field(default_factory=list)
    sortable: bool = True
    row_classes: list[str] = field(default_factory=list)
    css_class: str = ""  # e.g. "matrix": a compact table, not stretched to the page's width


def _num(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _metric_header(column: Column, hidden: bool = False) -> Header:
    direction = {"max": "higher is better", "min": "lower is better"}.get(column.better or "", "")
    title = column.title + (f" ({direction}; {BEST_MARK} / {TIE_MARK}: see the rules)" if direction else "")
    if hidden:
        title += f" — {NO_FAIRNESS_NOTE} not shown: the clients share one test set"
    return Header(column.label, title, "num", "desc" if column.better == "max" else "asc", column.key)


def seeds_text(n: int) -> str:
    return f"n={n}"


def stat_cell(row: ConfigRow, column: Column, table: BenchmarkTable) -> Cell:
    """A row's mean in one column, ± std and n on the second line, its mark and rank."""
    if column.fairness and not table.fairness_shown:
        return Cell(MISSING, note=NO_FAIRNESS_NOTE)
    stat = row.stats.get(column.key)
    if stat is None:
        note = "not ranked: no headline value" if column.key == HEADLINE else ""
        return Cell(MISSING, mark_title=note)
    verdict = row.verdicts.get(column.key)
    sub = (f"± {format_number(stat.std, column)} · " if stat.std is not None else "") + seeds_text(stat.n)
    cell = Cell(format_number(stat.mean, column), _num(stat.mean), sub=sub)
    if column.key == HEADLINE and row.headline_derived:
        cell.note = DERIVED_NOTE
    if verdict is not None:
        cell.mark = verdict.mark
        cell.rank = f"#{verdict.rank}/{verdict.of}" if column.key == HEADLINE else ""
        cell.mark_title = f"rank {verdict.rank} of {verdict.of} by mean; " + (
            f"{format_p(verdict.p)} against the runner-up" if verdict.rank == 1 and verdict.of > 1
            else f"{format_p(verdict.p)} against the top row" if verdict.of > 1 else "the only row")
        if verdict.mark:
            cell.mark_title = MARK_TITLES[verdict.mark] + "; " + cell.mark_title
    return cell


def leaderboard_view(table: BenchmarkTable) -> TableView:
    headers = [Header("Configuration", "algorithm_config tag of the runs", key="config"),
               Header("Algorithm", "algorithm class", key="algorithm")]
    headers += [_metric_header(c, c.fairness and not table.fairness_shown) for c in table.columns]
    headers.append(Header("Rounds", "rounds completed (of planned num_rounds), runs in the means", "num", "desc",
                          "rounds"))
    headers.append(Header("Seeds", "seeds in the means (newest FINISHED run per seed) / seeds run", "num", "desc",
                          "seeds"))
    headers.append(Header("Superseded", "older FINISHED runs of a seed that was run again with this task "
                          "(not in the means)", "num", "desc", "superseded"))
    view = TableView(f"leaderboard-{table.slug}", headers)
    for row in table.rows:
        cells = [Cell(row.config, row.config),
                 Cell(row.algorithm or MISSING, row.algorithm, sub=interpretations(row.algorithm))]
        cells += [stat_cell(row, column, table) for column in table.columns]
        cells.append(Cell(row.rounds_text, _num(row.rounds_sort)))
        cells.append(Cell(f"{row.seeds_finished} / {row.seeds_total}", str(row.seeds_finished)))
        cells.append(Cell(str(len(row.superseded)), str(len(row.superseded))))
        view.rows.append(cells)
    return view


def comparison_view(table: BenchmarkTable) -> TableView:
    """Paper vs ours, column by column, for the entries whose setting matches this benchmark."""
    columns = table.paper_metric_columns()
    headers = [Header("Configuration", key="config"), Header("Source", "where the paper reports it", key="source")]
    for column in columns:
        headers.append(Header(f"{column.label} paper", column.title, "num", "desc" if column.better == "max" else "asc"))
        headers.append(Header(f"{column.label} ours", column.title + " (our runs in the means, mean ± std over seeds)",
                              "num", "desc" if column.better == "max" else "asc"))
    view = TableView(f"papers-{table.slug}", headers)
    for comparison in table.comparisons:
        paper, ours = comparison.paper, comparison.ours
        cells = [Cell(paper.algorithm_config, paper.algorithm_config), Cell(paper.source, paper.source)]
        for column in columns:
            value = paper.metrics.get(column.key)
            cells.append(Cell(format_number(value, column), _num(value)))
            if column.fairness and not table.fairness_shown:
                cells.append(Cell(MISSING, note=NO_FAIRNESS_NOTE))
                continue
            stat = ours.stats.get(column.key) if ours else None
            text = format_stat(stat, column)
            cells.append(Cell(text.split(" ± ")[0], _num(stat.mean if stat else None),
                              sub=(f"± {text.split(' ± ')[1]} · " if " ± " in text else "") + seeds_text(stat.n)
                              if stat else ""))
        view.rows.append(cells)
    return view


def problem_runs_view(table: BenchmarkTable) -> TableView:
    headers = [Header("Run id", key="run_id"), Header("Configuration", key="config"),
               Header("Seed", kind="num", key="seed"),
               Header("Status", "MLflow status; RUNNING = not finished when the site was built", key="status"),
               Header("Rounds reached", kind="num", key="rounds"), Header("Error", key="error")]
    view = TableView(f"problems-{table.slug}", headers)
    for run in sorted(table.problem_runs, key=lambda r: (r.config, seed_order(r))):
        rounds = run.rounds_completed()
        status = run.status if run.status != "RUNNING" else "RUNNING (unfinished)"
        if table.seed_finished_later(run):
            status += "; this seed also has a FINISHED run"
        view.rows.append([
            Cell(run.run_id, run.run_id, code=True), Cell(run.config, run.config),
            Cell(run.seed, run.seed if run.seed.lstrip("-").isdigit() else ""), Cell(status, run.status),
            Cell(MISSING if rounds is None else str(rounds), _num(rounds)),
            Cell(short_error(run.error), run.error, detail=run.error if short_error(run.error) != run.error else ""),
        ])
        view.row_classes.append(run.status.lower())
    return view


def used_text(table: BenchmarkTable, run) -> str:
    if table.in_means(run):
        return "yes"
    newer = table.superseded_by(run)
    if newer is not None:
        return f"no: superseded by {newer.run_id[:8]}"
    return "no"


def runs_view(table: BenchmarkTable) -> TableView:
    acc = COLUMNS_BY_KEY[HEADLINE]
    headers = [Header("Run id", key="run_id"), Header("Configuration", key="config"),
               Header("Seed", kind="num", key="seed"), Header("Status", key="status"),
               Header(acc.label, "final mean client accuracy of this run", "num", "desc", acc.key),
               Header("Rounds", kind="num", key="rounds"),
               Header("In the means", "yes: the newest FINISHED run of its seed enters the means", key="used"),
               Header("git sha", key="git_sha")]
    view = TableView(f"runs-{table.slug}", headers)
    for run in sorted(table.runs, key=lambda r: (r.config, seed_order(r))):
        rounds = run.rounds_completed()
        final = run.final(acc.key)
        used = used_text(table, run)
        view.rows.append([
            Cell(run.run_id, run.run_id, code=True), Cell(run.config, run.config),
            Cell(run.seed, run.seed if run.seed.lstrip("-").isdigit() else ""), Cell(run.status, run.status),
            Cell(format_number(final, acc), _num(final)), Cell(MISSING if rounds is None else str(rounds), _num(rounds)),
            Cell(used, used), Cell(run.git_sha[:10] or MISSING, run.git_sha, code=True),
        ])
    return view


def versions_text(table: BenchmarkTable) -> str:
    """Each code version with its runs, and the commits that ran it when it is the library's tree."""
    commits = table.commits
    parts = []
    for version, n in table.versions:
        shas = commits.get(version, [])
        via = f", commits {', '.join(s[:7] for s in shas)}" if version.startswith("fl_lightning@") else ""
        shown = version if version.startswith("fl_lightning@") else version[:10]
        parts.append(f"{shown} ({n} run{'s' if n != 1 else ''}{via})")
    return "; ".join(parts) or MISSING


def index_view(tables: list[BenchmarkTable]) -> TableView:
    """Every table of the store: its task, client test, seeds, runs, superseded runs, code versions."""
    headers = [Header("Benchmark", "suite's benchmark name; a second line says what differs when its runs had "
                      "several tasks", key="benchmark"),
               Header("Suite", key="suite"), Header("Scale", key="scale"),
               Header("Task", "main = the benchmark's table with the most configurations; other task = never "
                      "ranked with the main table", key="task"),
               Header("Client test", "how each client's accuracy was measured", key="client_test"),
               Header("Configurations", kind="num", first="desc", key="configs"),
               Header("Seeds", "seeds in the means per configuration", kind="num", first="desc", key="seeds"),
               Header("Runs", kind="num", first="desc", key="runs"),
               Header("Status", "runs per MLflow status", key="status"),
               Header("Superseded", "older FINISHED runs replaced by a newer run of the same (configuration, seed)",
                      kind="num", first="desc", key="superseded"),
               Header("Code versions", "fl_lightning/ source tree (and commits) of the runs in the means", key="versions")]
    view = TableView("benchmarks", headers)
    for table in tables:
        scale = ", ".join(s.upper() + "-SCALE" if s != "unknown" else "scale unknown" for s in table.scales)
        status = ", ".join(f"{k} {v}" for k, v in table.status_counts.items())
        task = ("main" if table.main else "other task") + (f": {table.difference}" if table.difference else "")
        versions = versions_text(table)
        view.rows.append([
            Cell(table.benchmark, table.benchmark, link=f"benchmarks/{table.slug}"),
            Cell(table.suite, table.suite), Cell(scale, scale), Cell(task, task),
            Cell(table.client_test, table.client_test),
            Cell(str(len(table.rows)), str(len(table.rows))), Cell(table.seeds_text, str(max(table.seed_counts or [0]))),
            Cell(str(len(table.runs)), str(len(table.runs))), Cell(status, status),
            Cell(str(table.superseded_count), str(table.superseded_count)),
            Cell(("⚠ mixed: " if table.mixed_versions else "") + versions, versions, code=not table.mixed_versions),
        ])
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
    for config in summary.configs:
        algorithm = next((row.algorithm for table in summary.tables for row in table.rows if row.config == config), "")
        cells = [Cell(config, config, sub=interpretations(algorithm))]
        cells += [matrix_cell(summary, table, config) for table in summary.tables]
        view.rows.append(cells)
    return view


def percent_change(value: float | None) -> str:
    return MISSING if value is None else f"{100 * value:+.1f} %"


def gains_view(summary: SuiteSummary, view_id: str) -> TableView:
    headers = [Header("Our benchmark", key="benchmark"), Header("Configuration", key="config"),
               Header("Ours: gain over FedAvg", "(ours − FedAvg) / FedAvg of the headline means in the same "
                      "table; Welch p against FedAvg's seeds", "num", "desc", "ours"),
               Header("Paper: gain over FedAvg", "(paper − paper's FedAvg) / paper's FedAvg, same paper table",
                      "num", "desc", "paper"),
               Header("Paper source", key="source"), Header("Paper setting", key="setting")]
    view = TableView(view_id, headers)
    for gain in summary.gains:
        ours = Cell(percent_change(gain.ours), _num(gain.ours))
        if gain.ours is not None:
            ours.sub = format_p(gain.ours_p) + (" (within seed noise)" if gain.ours_p is None or gain.ours_p >= 0.05
                                                else "")
        view.rows.append([
            Cell(gain.table.benchmark, gain.table.benchmark, link=f"benchmarks/{gain.table.slug}"),
            Cell(gain.config, gain.config), ours, Cell(percent_change(gain.paper), _num(gain.paper)),
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
    keys = [HEADLINE] + (["test_acc_worst10"] if any(
        t.fairness_shown and any(r.stats.get("test_acc_worst10") for r in t.rows)
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

    for config in group.configs():
        cells = [Cell(config, config)]
        control_rows = {}
        for name, tables in group.variants:
            row, table = matching_row(tables, config)
            control_rows[name] = control_of(config, like=table)
        base_row, base_table = control_of(config)
        for key in keys:
            cells.append(_value_cell(base_row, base_table, key))
        for name, tables in group.variants:
            row, table = matching_row(tables, config)
            control_row, control_table = control_rows[name]
            for key in keys:
                cells.append(_value_cell(row, table, key, control_row, control_table))
        view.rows.append(cells)
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
    cell = Cell(format_number(stat.mean, column), _num(stat.mean), sub=seeds_text(stat.n))
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
        cells = [Cell(number.setting, number.setting), Cell(number.algorithm_config, number.algorithm_config)]
        for column in columns:
            value = number.metrics.get(column.key)
            cells.append(Cell(format_number(value, column), _num(value)))
        for name in extra:
            value = number.metrics.get(name)
            cells.append(Cell(MISSING if value is None else f"{value:g}", _num(value)))
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


def short_error(error: str, limit: int = 240) -> str:
    """A failed run's error in one line: the first line and, for a log tail, its last line (the exception)."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    if not lines:
        return MISSING
    text = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def escape_markdown_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def cell_markdown(cell: Cell, link_suffix: str = ".md") -> str:
    """One cell in Markdown: the value (bold when ★), its mark, rank and note, then ± std · n, then
    any extra values after a semicolon."""
    text = escape_markdown_cell(cell.text)
    if cell.code and text != MISSING:
        text = f"`{text}`"
    if cell.link:
        text = f"[{text}]({cell.link}{link_suffix})"
    if cell.best:
        text = f"**{text}**"
    if cell.label:
        text = f"{cell.label} {text}"
    parts = [text + cell.note] + [p for p in (cell.symbol, cell.rank) if p]
    if cell.sub:
        parts.append(f"({escape_markdown_cell(cell.sub)})")
    text = " ".join(parts)
    for extra in cell.extra:
        text += "; " + cell_markdown(extra, link_suffix)
    return text


def markdown_table(view: TableView, link_suffix: str = ".md") -> str:
    """A GitHub-flavoured Markdown table of the view, with the same marks as the HTML."""
    labels = []
    for header in view.headers:
        label = escape_markdown_cell(header.label)
        labels.append(f"[{label}]({header.link}{link_suffix})" if header.link else label)
    lines = ["| " + " | ".join(labels) + " |",
             "|" + "|".join("---:" if h.kind == "num" else "---" for h in view.headers) + "|"]
    for row in view.rows:
        lines.append("| " + " | ".join(cell_markdown(cell, link_suffix) for cell in row) + " |")
    return "\n".join(lines)
