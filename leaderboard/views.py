"""Tables as rows of cells, rendered by both the HTML and the Markdown templates (same rows, same
verdicts in both)."""

from __future__ import annotations

from dataclasses import dataclass, field

from fl_lightning import run_schema as schema
from fl_lightning.run_schema import Metric
from leaderboard.algorithms import interpretations
from leaderboard.papers import PaperNumber
from leaderboard.runs import CONVERGENCE_WINDOW, STILL_IMPROVING_PP, RunRecord, still_improving
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
    Stat,
    format_number,
    format_p,
    format_stat,
    seed_order,
)

MARKS = {BEST: BEST_MARK, TIE: TIE_MARK}
MARK_TITLES = {BEST: "best, separated from every other row beyond seed noise (p < 0.05: paired by seed, or Welch)",
               TIE: "tied for the lead: not separable from the top row (p ≥ 0.05, or fewer than 2 seeds)"}
FAIRNESS_SHORT = {Metric.TEST_ACC_WORST10: "worst 10%", Metric.TEST_ACC_WORST5: "worst 5%", Metric.TEST_ACC_STD: "std",
                  Metric.CGSV_RHO: "CGSV ρ"}


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
    mark_title: str = ""  # why the mark (the p: paired by seed, or Welch)
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
    notes: list[str] = field(default_factory=list)  # footnotes printed under the table (HTML and Markdown)


# --- what a row ran with: participation, local optimiser, FedMGDA+'s improvement share -------------

IMPROVEMENT = Column(
    Metric.IMPROVED_FRACTION, "Loss not increased (%)",
    "Share of the round's participants whose training loss did not increase after the server step "
    "(FedMGDA+ Fig. 4, footnote 6; logged with track_improvement), mean over rounds, in % "
    "(a diagnostic: not judged)", None, 100, 1)
OPTIMISER_KEY = "optimiser"
CGSV_RHO_KEYS = (Metric.CGSV_RHO, Metric.CGSV_RHO_R)
CGSV_MATCHED_NOTE = (
    "CGSV ρ under client test matched: each agent is scored on the shared pool weighted by its own "
    "training label distribution, not on one shared test set as in the paper (Xu et al., NeurIPS 2021, "
    "Sec. 4). An agent that holds a single class then scores about 100 % standalone, which can flip "
    "the sign of ρ (e.g. on CLA); this ρ is not the paper's quantity.")


def _float(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if number != number else number


def participation_text(fraction: float) -> str:
    """``all clients each round`` / ``20% of the clients each round``."""
    return "all clients each round" if fraction >= 1 else f"{100 * fraction:g}% of the clients each round"


def task_fraction(table: BenchmarkTable | None) -> float | None:
    """The share of clients sampled per round in the table's task (None when not recorded)."""
    return None if table is None or table.task is None else _float(table.task.fields.get(schema.FRACTION))


def row_fraction(row: ConfigRow, table: BenchmarkTable | None = None) -> float | None:
    """The share of clients the row's runs sampled per round: their ``fraction`` param where all
    agree, else the task's."""
    runs = row.used_runs or row.runs
    logged = {_float(r.params.get(schema.FRACTION)) for r in runs} - {None}
    if len(logged) == 1:
        return logged.pop()
    return task_fraction(table)


def differs(fraction: float | None, reference: float | None) -> bool:
    return fraction is not None and reference is not None and abs(fraction - reference) > 1e-9


def marked_config(config: str, fraction: float | None, reference: float | None) -> str:
    """``AFL · all clients each round`` where the row's participation is not the reference's."""
    return f"{config} · {participation_text(fraction)}" if differs(fraction, reference) else config


OTHER_TASK = "Those values come from runs of that other task (never ranked with these rows)."
SAME_TABLE = ("Its runs sampled otherwise than this table's task records: its rank here is not a "
              "like-for-like comparison.")


def participation_note(marked: dict[str, float], reference: float, tail: str = OTHER_TASK) -> str:
    names = ", ".join(f"{config} ({participation_text(fraction)})" for config, fraction in marked.items())
    return f"Participation differs: {names}; the other rows sample {participation_text(reference)}. {tail}"


def optimiser_text(run: RunRecord) -> str:
    """``lr 0.05 × 0.999^t, momentum 0.9``: the run's local SGD from its MLflow params ("" without lr)."""
    lr = _float(run.params.get(schema.LR))
    if lr is None:
        return ""
    text = f"lr {lr:g}"
    decay = _float(run.params.get(schema.LR_DECAY))
    if decay not in (None, 0.0, 1.0):
        text += f" × {decay:g}^t"
    for name, label in (("momentum", "momentum"), ("weight_decay", "weight decay")):
        value = _float(run.params.get(name))
        if value:
            text += f", {label} {value:g}"
    return text


def row_optimiser(row: ConfigRow) -> tuple[str, float | None]:
    """(the row's local SGD in words, its lr for sorting); several texts when its runs differ."""
    runs = row.used_runs or row.runs
    texts = list(dict.fromkeys(t for t in (optimiser_text(r) for r in runs) if t))
    rates = [lr for r in runs if (lr := _float(r.params.get(schema.LR))) is not None]
    return "; ".join(texts), (min(rates) if rates else None)


def improvement_stat(row: ConfigRow) -> Stat | None:
    """Mean over seeds of each run's mean over rounds of ``improved_fraction`` (its history)."""
    return Stat.of([r.mean_over_rounds(IMPROVEMENT.key) for r in row.used_runs])


def cgsv_rho_shown(table: BenchmarkTable) -> bool:
    """A CGSV-family ρ is shown in the table (CGSV, DW, RR, EU log it)."""
    return any(row.stats.get(key) for row in table.rows for key in CGSV_RHO_KEYS)


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
    optimisers = {id(row): row_optimiser(row) for row in table.rows}
    show_optimiser = any(text for text, _ in optimisers.values())
    improvements = {id(row): improvement_stat(row) for row in table.rows}
    show_improvement = any(improvements.values())
    headers = [Header("Configuration", "algorithm_config tag of the runs", key="config"),
               Header("Algorithm", "algorithm class", key="algorithm")]
    if show_optimiser:
        headers.append(Header("Local SGD", "each client's local optimiser, from the runs' MLflow params: learning "
                              "rate lr (× lr_decay^t where it decays per round), momentum and weight decay where "
                              "nonzero", "num", "asc", OPTIMISER_KEY))
    headers += [_metric_header(c, c.fairness and not table.fairness_shown) for c in table.columns]
    if show_improvement:
        headers.append(_metric_header(IMPROVEMENT))
    headers.append(Header("Rounds", "rounds completed (of planned num_rounds), runs in the means", "num", "desc",
                          "rounds"))
    headers.append(Header("Seeds", "seeds in the means (newest FINISHED run per seed) / seeds run", "num", "desc",
                          "seeds"))
    headers.append(Header("Superseded", "older FINISHED runs of a seed that was run again with this task "
                          "(not in the means)", "num", "desc", "superseded"))
    view = TableView(f"leaderboard-{table.slug}", headers)
    reference = task_fraction(table)
    marked: dict[str, float] = {}
    for row in table.rows:
        fraction = row_fraction(row, table)
        if differs(fraction, reference):
            marked[row.config] = fraction
        cells = [Cell(marked_config(row.config, fraction, reference), row.config),
                 Cell(row.algorithm or MISSING, row.algorithm, sub=interpretations(row.algorithm))]
        if show_optimiser:
            text, lr = optimisers[id(row)]
            cells.append(Cell(text or MISSING, _num(lr)))
        cells += [stat_cell(row, column, table) for column in table.columns]
        if show_improvement:
            stat = improvements[id(row)]
            cells.append(Cell(MISSING) if stat is None else Cell(
                format_number(stat.mean, IMPROVEMENT), _num(stat.mean),
                sub=(f"± {format_number(stat.std, IMPROVEMENT)} · " if stat.std is not None else "")
                + seeds_text(stat.n)))
        cells.append(Cell(row.rounds_text, _num(row.rounds_sort)))
        cells.append(Cell(f"{row.seeds_finished} / {row.seeds_total}", str(row.seeds_finished)))
        cells.append(Cell(str(len(row.superseded)), str(len(row.superseded))))
        view.rows.append(cells)
    if marked and reference is not None:
        view.notes.append(participation_note(marked, reference, SAME_TABLE))
    texts = {text for text, _ in optimisers.values() if text}
    if len(texts) > 1:
        view.notes.append("⚠ The rows differ in their local learning rate or optimiser (column Local SGD: "
                          + "; ".join(sorted(texts)) + "): their accuracies differ by the step size too, "
                          "not by the algorithm alone.")
    if show_improvement:
        view.notes.append(f"{IMPROVEMENT.label}: {IMPROVEMENT.title}.")
    if table.client_test == "matched" and cgsv_rho_shown(table):
        view.notes.append(CGSV_MATCHED_NOTE)
    unconverged = [run for run in table.used_runs if still_improving(run)]
    if unconverged:
        view.notes.append(
            f"⚠ {len(unconverged)} of {len(table.used_runs)} runs in the means were still improving at their end (mean "
            f"accuracy of the last {CONVERGENCE_WINDOW} evaluations more than {STILL_IMPROVING_PP:g} pp above the "
            f"{CONVERGENCE_WINDOW} before): unconverged. This table shows the final evaluation; the claims ledger "
            f"counts each run at the mean of its last {CONVERGENCE_WINDOW} evaluations.")
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
        paper = comparison.paper
        ours = comparison.ours or table.row(paper.our_config)
        cells = [config_cell(paper), Cell(paper.source, paper.source)]
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
    if table.client_test == "matched" and any(c.key in CGSV_RHO_KEYS for c in columns):
        view.notes.append(CGSV_MATCHED_NOTE)
    return view


def config_cell(number: PaperNumber) -> Cell:
    """A paper entry's configuration under our label (``counterpart_config`` where it differs, e.g.
    ``FedFV(alpha=2/3,tau=0)`` for the paper-scale ``alpha=0.6666666666666666``): one configuration
    is never shown under two labels."""
    return Cell(number.our_config, number.our_config)


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


def replay_text(table: BenchmarkTable) -> str:
    """"2 of 50: 2 identical", "3 of 50: ⚠ 1 diverged", or "none"."""
    replayed, identical = table.replays
    if not replayed:
        return "none"
    diverged = replayed - identical
    return f"{replayed} of {len(table.used_runs)}: " + (f"⚠ {diverged} diverged" if diverged else f"{identical} identical")


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
               Header("Code versions", "fl_lightning/ source tree (and commits) of the runs in the means", key="versions"),
               Header("Replayed", "runs in the means fitted again from their logged settings by `fl-lightning replay`, "
                      "and how many gave every number of every round again", key="replayed")]
    view = TableView("benchmarks", headers)
    for table in tables:
        scale = ", ".join(s.upper() + "-SCALE" if s != "unknown" else "scale unknown" for s in table.scales) or "—"
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
            Cell(replay_text(table), str(table.replays[0])),
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
    marked: dict[str, float] = {}
    references = []
    for config in summary.configs:
        algorithm = next((row.algorithm for table in summary.tables for row in table.rows if row.config == config), "")
        fraction, reference = matrix_participation(summary, config)
        if differs(fraction, reference):
            marked[config] = fraction
            references.append(reference)
        cells = [Cell(marked_config(config, fraction, reference), config, sub=interpretations(algorithm))]
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
    headers = [Header("Our benchmark", key="benchmark"), Header("Configuration", key="config"),
               Header("Ours: gain over FedAvg", "(ours − FedAvg) / FedAvg of the headline means in the same "
                      "table; p against FedAvg's seeds (paired by seed, or Welch)", "num", "desc", "ours"),
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
            Cell(gain.config, gain.config, sub=f"the paper's: {gain.paper_config}" if gain.paper_config else ""),
            ours, Cell(percent_change(gain.paper), _num(gain.paper),
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
        cells = [Cell(number.setting, number.setting), config_cell(number)]
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
    if view.notes:
        lines.append("")
        lines += [f"- {note}" for note in view.notes]
    return "\n".join(lines)
