"""Tables as rows of cells, rendered by both the HTML and the Markdown templates (same rows, same
verdicts in both): the cell types and one benchmark's tables (leaderboard, comparison, runs)."""

from __future__ import annotations

from leaderboard.algorithms import interpretations
from leaderboard.convergence import CONVERGENCE_WINDOW, STILL_IMPROVING_PP, still_improving
from leaderboard.markdown import short_error
from leaderboard.papers import PaperNumber
from leaderboard.row_facts import (
    CGSV_MATCHED_NOTE,
    CGSV_RHO_KEYS,
    IMPROVEMENT,
    OPTIMISER_KEY,
    SAME_TABLE,
    cgsv_rho_shown,
    differs,
    improvement_stat,
    marked_config,
    metric_header,
    num_text,
    participation_note,
    row_fraction,
    row_optimiser,
    seeds_text,
    task_fraction,
)
from leaderboard.tables import (
    COLUMNS_BY_KEY,
    DERIVED_NOTE,
    HEADLINE,
    MISSING,
    NO_FAIRNESS_NOTE,
    BenchmarkTable,
    Column,
    ConfigRow,
    format_number,
    format_p,
    format_stat,
    seed_order,
)
from leaderboard.view_cells import MARK_TITLES, Cell, Header, TableView


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
    cell = Cell(format_number(stat.mean, column), num_text(stat.mean), sub=sub)
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
    """A benchmark's leaderboard table: one row per configuration with its algorithm,
    local optimiser (where shown), every column's mean, rounds and seeds, and notes on
    differing participation or learning rates and on runs still improving at their end."""
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
    headers += [metric_header(c, c.fairness and not table.fairness_shown) for c in table.columns]
    if show_improvement:
        headers.append(metric_header(IMPROVEMENT))
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
                 Cell(row.algorithm or MISSING, row.algorithm, sub=interpretations(row.runs))]
        if show_optimiser:
            text, lr = optimisers[id(row)]
            cells.append(Cell(text or MISSING, num_text(lr)))
        cells += [stat_cell(row, column, table) for column in table.columns]
        if show_improvement:
            stat = improvements[id(row)]
            cells.append(Cell(MISSING) if stat is None else Cell(
                format_number(stat.mean, IMPROVEMENT), num_text(stat.mean),
                sub=(f"± {format_number(stat.std, IMPROVEMENT)} · " if stat.std is not None else "")
                + seeds_text(stat.n)))
        cells.append(Cell(row.rounds_text, num_text(row.rounds_sort)))
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
        headers.append(
            Header(f"{column.label} paper", column.title, "num", "desc" if column.better == "max" else "asc")
        )
        headers.append(Header(f"{column.label} ours", column.title + " (our runs in the means, mean ± std over seeds)",
                              "num", "desc" if column.better == "max" else "asc"))
    view = TableView(f"papers-{table.slug}", headers)
    for comparison in table.comparisons:
        paper = comparison.paper
        ours = comparison.ours or table.row(paper.our_config)
        cells = [config_cell(paper), Cell(paper.source, paper.source)]
        for column in columns:
            value = paper.metrics.get(column.key)
            cells.append(Cell(format_number(value, column), num_text(value)))
            if column.fairness and not table.fairness_shown:
                cells.append(Cell(MISSING, note=NO_FAIRNESS_NOTE))
                continue
            stat = ours.stats.get(column.key) if ours else None
            text = format_stat(stat, column)
            cells.append(Cell(text.split(" ± ")[0], num_text(stat.mean if stat else None),
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
    """The benchmark's failed, killed and unfinished runs, one row each: configuration,
    seed, status (noting a seed that also has a FINISHED run), rounds reached and error."""
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
            Cell(MISSING if rounds is None else str(rounds), num_text(rounds)),
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
    """Every run of the benchmark, one row each: configuration, seed, status, final
    mean client accuracy, rounds, whether it enters the means, and its git sha."""
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
        view.rows.append(
            [
                Cell(run.run_id, run.run_id, code=True),
                Cell(run.config, run.config),
                Cell(run.seed, run.seed if run.seed.lstrip("-").isdigit() else ""),
                Cell(run.status, run.status),
                Cell(format_number(final, acc), num_text(final)),
                Cell(MISSING if rounds is None else str(rounds), num_text(rounds)),
                Cell(used, used),
                Cell(run.git_sha[:10] or MISSING, run.git_sha, code=True),
            ]
        )
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
    return f"{replayed} of {len(table.used_runs)}: " + (
        f"⚠ {diverged} diverged" if diverged else f"{identical} identical"
    )
