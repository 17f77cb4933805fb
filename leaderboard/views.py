"""Tables as rows of cells, rendered by both the HTML and the Markdown templates (same rows in both)."""

from __future__ import annotations

from dataclasses import dataclass, field

from leaderboard.papers import PaperNumber
from leaderboard.tables import (
    ALL_COLUMNS,
    COLUMNS_BY_KEY,
    MISSING,
    BenchmarkTable,
    Column,
    format_number,
    format_stat,
    seed_order,
)

BEST_MARK = "★"


@dataclass
class Header:
    label: str
    title: str = ""
    kind: str = "text"  # "text" or "num": how the inline script sorts the column
    first: str = "asc"  # the direction of the first click ("desc" where higher is better)
    key: str = ""


@dataclass
class Cell:
    text: str
    sort: str = ""  # the raw value the script sorts by ("" = missing, sorted last)
    best: bool = False
    link: str | None = None
    code: bool = False  # shown in a monospace font (ids, shas)
    detail: str = ""  # longer text, shown on demand in HTML (a failed run's log tail)


@dataclass
class TableView:
    id: str
    headers: list[Header]
    rows: list[list[Cell]] = field(default_factory=list)
    sortable: bool = True
    row_classes: list[str] = field(default_factory=list)


def _num(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _metric_header(column: Column) -> Header:
    direction = {"max": "higher is better", "min": "lower is better"}.get(column.better, "")
    title = f"{column.title} ({direction}; ★ = best)" if direction else column.title
    return Header(column.label, title, "num", "desc" if column.better == "max" else "asc", column.key)


def leaderboard_view(table: BenchmarkTable) -> TableView:
    headers = [Header("Configuration", "algorithm_config tag of the runs", key="config")]
    if table.multi_suite:
        headers.append(Header("Suite", "the suite (MLflow experiment) of the runs", key="suite"))
    headers.append(Header("Algorithm", "algorithm class", key="algorithm"))
    headers += [_metric_header(c) for c in table.columns]
    headers.append(Header("Rounds", "rounds completed (of planned num_rounds), finished seeds", "num", "desc", "rounds"))
    headers.append(Header("Seeds", "finished / all runs of this configuration", "num", "desc", "seeds"))
    view = TableView(f"leaderboard-{table.slug}", headers)
    for row in table.rows:
        cells = [Cell(row.config, row.config)]
        if table.multi_suite:
            cells.append(Cell(row.suite, row.suite))
        cells.append(Cell(row.algorithm or MISSING, row.algorithm))
        for column in table.columns:
            cells.append(Cell(row.cell_text(column.key), _num(row.sort_value(column.key)), column.key in row.best))
        cells.append(Cell(row.rounds_text, _num(row.rounds_sort)))
        cells.append(Cell(f"{row.seeds_finished} / {row.seeds_total}", str(row.seeds_finished)))
        view.rows.append(cells)
    return view


def comparison_view(table: BenchmarkTable) -> TableView:
    """Paper vs ours, column by column, for the entries whose setting matches this benchmark."""
    columns = table.paper_metric_columns()
    headers = [Header("Configuration", key="config"), Header("Source", "where the paper reports it", key="source")]
    for column in columns:
        headers.append(Header(f"{column.label} paper", column.title, "num", "desc" if column.better == "max" else "asc"))
        headers.append(Header(f"{column.label} ours", column.title + " (our finished runs, mean ± std over seeds)",
                              "num", "desc" if column.better == "max" else "asc"))
    view = TableView(f"papers-{table.slug}", headers)
    for comparison in table.comparisons:
        paper, ours = comparison.paper, comparison.ours
        cells = [Cell(paper.algorithm_config, paper.algorithm_config), Cell(paper.source, paper.source)]
        for column in columns:
            value = paper.metrics.get(column.key)
            cells.append(Cell(format_number(value, column), _num(value)))
            stat = ours.stats.get(column.key) if ours else None
            cells.append(Cell(format_stat(stat, column), _num(stat.mean if stat else None)))
        view.rows.append(cells)
    return view


def problem_runs_view(table: BenchmarkTable) -> TableView:
    headers = [Header("Run id", key="run_id"), Header("Configuration", key="config"),
               Header("Suite", key="suite"), Header("Seed", kind="num", key="seed"),
               Header("Status", "MLflow status; RUNNING = not finished when the site was built", key="status"),
               Header("Rounds reached", kind="num", key="rounds"), Header("Error", key="error")]
    view = TableView(f"problems-{table.slug}", headers)
    for run in sorted(table.problem_runs, key=lambda r: (r.config, seed_order(r))):
        rounds = run.rounds_completed()
        status = run.status if run.status != "RUNNING" else "RUNNING (unfinished)"
        if table.seed_finished_later(run):
            status += "; this seed also has a FINISHED run"
        view.rows.append([
            Cell(run.run_id, run.run_id, code=True), Cell(run.config, run.config), Cell(run.suite, run.suite),
            Cell(run.seed, run.seed if run.seed.lstrip("-").isdigit() else ""), Cell(status, run.status),
            Cell(MISSING if rounds is None else str(rounds), _num(rounds)),
            Cell(short_error(run.error), run.error, detail=run.error if short_error(run.error) != run.error else ""),
        ])
        view.row_classes.append(run.status.lower())
    return view


def runs_view(table: BenchmarkTable) -> TableView:
    acc = COLUMNS_BY_KEY["test_acc_mean"]
    headers = [Header("Run id", key="run_id"), Header("Configuration", key="config"),
               Header("Seed", kind="num", key="seed"), Header("Status", key="status"),
               Header(acc.label, "final mean client accuracy of this run", "num", "desc", acc.key),
               Header("Rounds", kind="num", key="rounds"),
               Header("In the means", "yes: one FINISHED run per seed (the latest) enters the leaderboard",
                      key="used"),
               Header("git sha", key="git_sha")]
    view = TableView(f"runs-{table.slug}", headers)
    for run in sorted(table.runs, key=lambda r: (r.config, seed_order(r))):
        rounds = run.rounds_completed()
        final = run.final(acc.key)
        used = "yes" if table.in_means(run) else "no"
        view.rows.append([
            Cell(run.run_id, run.run_id, code=True), Cell(run.config, run.config),
            Cell(run.seed, run.seed if run.seed.lstrip("-").isdigit() else ""), Cell(run.status, run.status),
            Cell(format_number(final, acc), _num(final)), Cell(MISSING if rounds is None else str(rounds), _num(rounds)),
            Cell(used, used), Cell(run.tags.get("git_sha", "")[:10] or MISSING, run.tags.get("git_sha", ""), code=True),
        ])
    return view


def index_view(tables: list[BenchmarkTable]) -> TableView:
    headers = [Header("Benchmark", "dataset / partition / participation / model", key="benchmark"),
               Header("Scale", key="scale"), Header("Suites", key="suites"), Header("Papers", key="papers"),
               Header("Configurations", kind="num", first="desc", key="configs"),
               Header("Runs", kind="num", first="desc", key="runs"),
               Header("Status", "runs per MLflow status", key="status"),
               Header("Top mean accuracy", "the configuration with the best mean client accuracy", key="top")]
    view = TableView("benchmarks", headers)
    for table in tables:
        top = table.rows[0] if table.rows and table.rows[0].stats.get("test_acc_mean") else None
        top_text = f"{top.config} ({top.cell_text('test_acc_mean')} %)" if top else MISSING
        scale = ", ".join(s.upper() + "-SCALE" if s != "unknown" else "scale unknown" for s in table.scales)
        status = ", ".join(f"{k} {v}" for k, v in table.status_counts.items())
        view.rows.append([
            Cell(table.key, table.key, link=f"benchmarks/{table.slug}"), Cell(scale, scale),
            Cell(", ".join(table.suites), ", ".join(table.suites)), Cell(", ".join(table.papers) or MISSING),
            Cell(str(len(table.rows)), str(len(table.rows))), Cell(str(len(table.runs)), str(len(table.runs))),
            Cell(status, status), Cell(top_text, top_text),
        ])
    return view


def paper_numbers_view(numbers: list[PaperNumber], known: set[str], table_id: str) -> TableView:
    """One paper's reported numbers (only the metrics it reports) that no benchmark of ours matches."""
    reported = {k for p in numbers for k in p.metrics}
    columns = [c for c in ALL_COLUMNS if c.key in reported]
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


def markdown_table(view: TableView, link_suffix: str = ".md") -> str:
    """A GitHub-flavoured Markdown table of the view; best values in bold with the ★ marker."""
    lines = ["| " + " | ".join(escape_markdown_cell(h.label) for h in view.headers) + " |",
             "|" + "|".join("---:" if h.kind == "num" else "---" for h in view.headers) + "|"]
    for row in view.rows:
        texts = []
        for cell in row:
            text = escape_markdown_cell(cell.text)
            if cell.code and text != MISSING:
                text = f"`{text}`"
            if cell.link:
                text = f"[{text}]({cell.link}{link_suffix})"
            if cell.best:
                text = f"**{text}** {BEST_MARK}"
            texts.append(text)
        lines.append("| " + " | ".join(texts) + " |")
    return "\n".join(lines)



def variant_groups(tables: list[BenchmarkTable]) -> list[tuple[str, list[BenchmarkTable]]]:
    """Benchmarks that are variants of one setting: the same key up to its last part
    (``synthetic/natural/p0.2/fl_logreg/{no-attack, bias-attack-10, dropout-0.5}``)."""
    groups: dict[str, list[BenchmarkTable]] = {}
    for table in tables:
        if "/" in table.key:
            groups.setdefault(table.key.rsplit("/", 1)[0], []).append(table)
    return [(prefix, members) for prefix, members in groups.items() if len(members) > 1]


def variants_view(prefix: str, tables: list[BenchmarkTable], view_id: str,
                  keys: tuple[str, ...] = ("test_acc_mean", "test_acc_worst5")) -> TableView:
    """One row per algorithm configuration, mean and worst-client accuracy under every
    variant of the setting, and the change from the reference variant (``no-attack`` if
    there is one, else the first): how an attack or a fault moves each algorithm."""
    names = [t.key.rsplit("/", 1)[1] for t in tables]
    reference = names.index("no-attack") if "no-attack" in names else 0
    order = [reference] + [i for i in range(len(tables)) if i != reference]
    headers = [Header("Configuration", key="config")]
    for i in order:
        for key in keys:
            column = COLUMNS_BY_KEY[key]
            change = "" if i == reference else f"; Δ = change from {names[reference]}"
            headers.append(Header(f"{names[i]}: {column.label}", f"{column.title}{change}", "num",
                                  "desc" if column.better == "max" else "asc", f"{names[i]}:{key}"))
    view = TableView(view_id, headers)
    rows = {t_index: {row.config: row for row in table.rows} for t_index, table in enumerate(tables)}
    configs = list(dict.fromkeys(row.config for table in tables for row in table.rows))
    for config in configs:
        cells = [Cell(config, config)]
        base = rows[reference].get(config)
        for i in order:
            row = rows[i].get(config)
            for key in keys:
                column = COLUMNS_BY_KEY[key]
                value = row.sort_value(key) if row else None
                text = format_number(value, column) if value is not None else MISSING
                base_value = base.sort_value(key) if base else None
                if i != reference and value is not None and base_value is not None:
                    text += f" (Δ {format_number(value - base_value, column)})"
                cells.append(Cell(text, _num(value)))
        view.rows.append(cells)
    return view
