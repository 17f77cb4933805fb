"""Run lengths long enough to judge (issue 48): for each offline suite of the claims ledger (and each
benchmark in it), the rounds and evaluation cadence of the confirmatory pass, chosen from the
exploratory runs committed in ``evidence/exploratory/``. Torch-free; prints a Markdown report
(committed as ``evidence/exploratory/run_lengths.md``)::

    python -m leaderboard.run_lengths > evidence/exploratory/run_lengths.md

The plan's convergence rule (``leaderboard/convergence.py``): the mean accuracy of the last w = 3
evaluations against the w before, both windows in the second half of the run; a change over 1 pp is
unconverged. With evaluations every k rounds up to R = n k, the earlier window starts at
(n - 2w + 1) k, which is at or after R / 2 only when n >= 4 w - 2 = 10. The chosen cadence is
therefore k = R / 10: every run is judged, and the rule compares rounds 0.5-0.7 R with 0.8-1.0 R,
the whole second half (a finer cadence would compare the last few rounds only and call more runs
converged for a weaker reason).

How a run's change at a new length R is predicted:

- its accuracy curve (``accuracy_history``: mean client accuracy, else the global one) is fitted by a
  saturating curve acc(r) = a - b exp(-r / c) (c on a log grid, a and b by least squares) on its
  evaluations from 0.2 of its rounds on (all of them where fewer than 4 remain; the first rounds'
  steep rise would otherwise pull c down);
- the trend's change at R is d(R) = mean acc(0.8R, 0.9R, R) - mean acc(0.5R, 0.6R, 0.7R), in points;
- the evaluations scatter around the curve with the residual sd s of its cell's fits (pooled over the
  seeds), so the observed change is d(R) + noise of sd s sqrt(2 / w), and the run is converged with
  probability P(|d + noise| <= 1 pp). The expected converged share is the mean of these probabilities.
- backtest: every run judgeable today is refitted on the first half of its evaluations only and its
  probability at its own length compared with its status (the "backtest" line of each suite).

Time: a run's wall time (its export's start and end, at ``--jobs 2`` on the 2-core CPU) is a start
(START_S) plus the rest, scaled by the larger of the rounds' and the evaluations' growth (an upper
bound: the rest is part rounds, part evaluations). A suite's time at ``--jobs 2`` is its runs' time
over 2 (the exploratory pass: 7.6 h of run time in 3.9 h of suite time).

Benchmarks whose name states a number of rounds (``rounds-200``, ``server-time-20-rounds``), and the
Shapley measurement (its quantity is the approximation error over its 10 rounds, not accuracy), keep
their rounds: only the cadence changes, so that the rule judges them.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from leaderboard.convergence import CONVERGED, TOO_SHORT, UNCONVERGED, accuracy_history, convergence_status
from leaderboard.evidence import EXPLORATORY
from leaderboard.export_reading import read_export
from leaderboard.papers import DEFAULT_ROOT
from leaderboard.registration import load_plan

ROOT = DEFAULT_ROOT  # the plan: benchmarks/ledger_plan.yaml
EXPORTS = EXPLORATORY  # evidence/exploratory/: the exploratory runs, one export per suite
START_S = 0.6  # a run's start in a warm worker: the smallest wall time less rounds x time per round seen
JOBS = 2
TARGET = 0.80  # "most runs converged": the share a benchmark's length aims at
GROWTHS = (1.0, 1.5, 2.0, 2.5, 3.0, 4.0)  # the lengths tried (x its rounds today): at most 4x
KNEE = 0.02  # where no length reaches TARGET: the shortest within this of the best share (the ceiling is the scatter)
LONG_S, LONG_GROWTH = 1800.0, 2.0  # a benchmark over 30 min at --jobs 2 today grows at most 2x
FIXED_ROUNDS = re.compile(r"rounds-\d+|\d+-rounds")  # a name that states its rounds
FIXED_SUITES = {"cgsv-shapley-offline": "its quantity is the Shapley approximation error over its rounds"}
# the confirmatory pass's cadence where it is not R / 10 (a benchmark's rounds fixed at a number that
# 10 does not divide)


@dataclass
class Run:
    suite: str
    benchmark: str
    cell: str
    rounds: int
    every: int
    status: str
    wall: float
    history: list[tuple[int, float]]
    fit: tuple[float, float, float] | None = None
    residual_ss: float = 0.0
    dof: int = 0


@dataclass
class Choice:
    suite: str
    benchmark: str
    runs: list[Run]
    rounds: int
    every: int
    fixed: str = ""
    growth: float = 1.0
    tried: dict[float, tuple[int, float | None, float]] = field(default_factory=dict)  # growth: length, share, s

    @property
    def share(self) -> float | None:
        return self.tried[self.growth][1]

    @property
    def seconds(self) -> float:
        return self.tried[self.growth][2]


def min_evaluations(window: int) -> int:
    """The fewest evaluations (every k rounds up to R = n k) whose last 2 ``window`` lie in the second half."""
    return 4 * window - 2


def curve(params: tuple[float, float, float], rounds: np.ndarray) -> np.ndarray:
    a, b, c = params
    return a - b * np.exp(-rounds / c)


def fit_curve(points: list[tuple[int, float]], length: int) -> tuple[tuple[float, float, float], float, int] | None:
    """(a, b, c), the residual sum of squares and its degrees of freedom of acc = a - b exp(-r / c)."""
    late = [(r, v) for r, v in points if r >= 0.2 * length]
    use = late if len(late) >= 4 else points
    if len(use) < 3:
        return None
    r = np.array([p[0] for p in use], float)
    y = np.array([p[1] for p in use], float)
    best = None
    for c in np.geomspace(max(length, 1) / 100, max(length, 1) * 20, 120):
        x = np.column_stack([np.ones_like(r), -np.exp(-r / c)])
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        ss = float(np.sum((x @ coef - y) ** 2))
        if best is None or ss < best[1]:
            best = ((float(coef[0]), float(coef[1]), float(c)), ss)
    assert best is not None
    return best[0], best[1], max(len(use) - 3, 0)


def trend_change(params: tuple[float, float, float], length: float, window: int) -> float:
    """The change in points of the fitted curve between the two windows of a run of ``length`` rounds
    evaluated every length / (4 w - 2) rounds."""
    n = min_evaluations(window)
    rounds = np.array([length * i / n for i in range(n - 2 * window + 1, n + 1)])
    values = curve(params, rounds)
    return 100 * float(values[window:].mean() - values[:window].mean())


def p_converged(change: float, sd: float, change_pp: float) -> float:
    if sd <= 0:
        return 1.0 if abs(change) <= change_pp else 0.0
    phi = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))  # noqa: E731
    return phi((change_pp - change) / sd) - phi((-change_pp - change) / sd)


def noise_sd(runs: list[Run]) -> float:
    """The scatter (points) of a cell's evaluations around their trend: from the second differences
    y[i+1] - 2 y[i] + y[i-1] of the evaluations in the second half of each run (variance 6 s^2 for
    independent scatter; a smooth late trend adds almost nothing), pooled over the seeds; the curve's
    residual sd where no run has three evaluations in its second half."""
    squares, count = 0.0, 0
    for run in runs:
        late = [v for r, v in run.history if r >= run.rounds / 2]
        for i in range(1, len(late) - 1):
            squares += (late[i + 1] - 2 * late[i] + late[i - 1]) ** 2 / 6
            count += 1
    if count:
        return 100 * math.sqrt(squares / count)
    ss, dof = sum(r.residual_ss for r in runs), sum(r.dof for r in runs)
    return 100 * math.sqrt(ss / dof) if dof else 0.0


def load_runs(exports: Path = EXPORTS) -> list[Run]:
    """The FINISHED runs of every export folder under ``exports``, each with its
    rounds, evaluation cadence, convergence status, wall time and accuracy history."""
    folders = sorted(p for p in exports.iterdir() if p.is_dir() and not p.name.startswith("."))
    contents = read_export(folders, progress=lambda _: None)
    runs = []
    for record in contents.runs:
        if record.status != "FINISHED":
            continue
        rounds = int(record.params.get("num_rounds", 0))
        every = int(record.params.get("eval_every", 1))
        wall = (record.end_time - record.start_time).total_seconds()
        runs.append(Run(record.suite, record.benchmark, record.cell, rounds, every, convergence_status(record),
                        wall, accuracy_history(record)))
    return runs


def choose(runs: list[Run], window: int, change_pp: float) -> list[Choice]:
    """Each benchmark's run length (the module docstring's method): every run's curve fitted, the lengths
    of ``GROWTHS`` tried (a fixed benchmark keeps its rounds), and one growth per suite chosen, the
    shortest whose predicted converged share reaches ``TARGET`` or comes within ``KNEE`` of the best."""
    sd_of_cell: dict[tuple[str, str], float] = {}
    by_cell: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for run in runs:
        fitted = fit_curve(run.history, run.rounds)
        if fitted is not None:
            run.fit, run.residual_ss, run.dof = fitted
        by_cell[(run.suite, run.cell)].append(run)
    for key, cell_runs in by_cell.items():
        sd_of_cell[key] = noise_sd(cell_runs)
    by_benchmark: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for run in runs:
        by_benchmark[(run.suite, run.benchmark)].append(run)
    n = min_evaluations(window)
    choices = []
    for (suite, benchmark), bench_runs in sorted(by_benchmark.items()):
        old = max(r.rounds for r in bench_runs)
        fixed = FIXED_SUITES.get(suite, "")
        if not fixed and FIXED_ROUNDS.search(benchmark):
            fixed = "its name states its rounds"
        choice = Choice(suite, benchmark, bench_runs, old, 0, fixed)
        for growth in (1.0,) if fixed else GROWTHS:
            length = int(round(old * growth / n) * n) or n
            probabilities = []
            for run in bench_runs:
                if run.fit is None:
                    continue
                sd = sd_of_cell[(run.suite, run.cell)] * math.sqrt(2 / window)
                probabilities.append(p_converged(trend_change(run.fit, length, window), sd, change_pp))
            choice.tried[growth] = (length, sum(probabilities) / len(probabilities) if probabilities else None,
                                    sum(new_wall(r, length, length // n) for r in bench_runs))
        choices.append(choice)
    for suite in sorted({c.suite for c in choices}):
        rows = [c for c in choices if c.suite == suite]
        free = [c for c in rows if not c.fixed]
        today_s = sum(r.wall for c in free for r in c.runs) / JOBS
        growths = [g for g in GROWTHS if today_s <= LONG_S or g <= LONG_GROWTH]
        shares = {}
        for growth in growths:  # the suite's share: over its runs with a fitted curve
            weighted = [(c.tried[growth][1], sum(r.fit is not None for r in c.runs)) for c in free]
            total = sum(w for share, w in weighted if share is not None)
            if total:
                shares[growth] = sum(share * w for share, w in weighted if share is not None) / total
        best = max(shares.values(), default=0.0)
        chosen = min((g for g in shares if shares[g] >= min(TARGET, best - KNEE)), default=1.0)
        for c in rows:
            c.growth = 1.0 if c.fixed else chosen
            c.rounds = c.tried[c.growth][0]
            c.every = max(c.rounds // n, 1)
    return choices


def new_wall(run: Run, rounds: int, every: int) -> float:
    evaluations_old = math.ceil(run.rounds / run.every)
    evaluations_new = math.ceil(rounds / every)
    growth = max(rounds / run.rounds, evaluations_new / evaluations_old)
    return START_S + max(run.wall - START_S, 0.0) * growth


def backtest(runs: list[Run], window: int, change_pp: float) -> tuple[int, float, int]:
    """Runs judged today refitted on the first half of their evaluations: (runs, predicted converged
    share at their own length, observed converged count)."""
    predicted, observed, count = 0.0, 0, 0
    residuals: dict[str, list[tuple[float, int]]] = defaultdict(list)
    fits = []
    for run in runs:
        if run.status == TOO_SHORT:
            continue
        half = [(r, v) for r, v in run.history if r <= run.rounds / 2]
        fitted = fit_curve(half, run.rounds // 2)
        if fitted is None:
            continue
        fits.append((run, fitted[0]))
        residuals[run.cell].append((fitted[1], fitted[2]))
    by_cell: dict[str, list[Run]] = defaultdict(list)
    for run, _ in fits:
        by_cell[run.cell].append(Run(run.suite, run.benchmark, run.cell, run.rounds // 2, run.every, run.status,
                                     run.wall, [(r, v) for r, v in run.history if r <= run.rounds / 2]))
    for run, params in fits:
        sd = noise_sd(by_cell[run.cell]) * math.sqrt(2 / window)
        n = len(run.history)
        earlier = [r for r, _ in run.history[-2 * window:-window]]
        last = [r for r, _ in run.history[-window:]]
        values = curve(params, np.array(earlier + last, float))
        change = 100 * float(values[window:].mean() - values[:window].mean())
        predicted += p_converged(change, sd, change_pp) if n >= 2 * window else 0.0
        observed += run.status == CONVERGED
        count += 1
    return count, predicted / count if count else 0.0, observed


def hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def report(exports: Path = EXPORTS) -> str:
    """The Markdown report: per suite, a table of each benchmark's runs, lengths today and chosen, convergence counts,
    predicted shares and times, and the suite's backtest; then the whole pass and what the lengths cannot do."""
    plan = load_plan(ROOT)
    window, change_pp = plan.convergence.window, plan.convergence.change_pp
    runs = load_runs(exports)
    choices = choose(runs, window, change_pp)
    lines = [
        "# Run lengths long enough to judge (confirmatory pass, plan version 2)",
        "",
        f"Written by `python -m leaderboard.run_lengths` from the {len(runs):,} FINISHED exploratory runs in "
        "`evidence/exploratory/`; the method is in that script's docstring. The plan's rule: last "
        f"{window} evaluations against the {window} before, both in the second half, |change| > {change_pp:g} pp "
        f"unconverged; so a run needs at least {min_evaluations(window)} evaluations, every R / "
        f"{min_evaluations(window)} rounds (the cadence chosen everywhere).",
        "",
        "Columns: runs; rounds / eval cadence today and chosen; today's converged / unconverged / too short; "
        "the predicted converged share at the chosen length (every run judged); run time today and "
        f"estimated (sum of the runs' wall times at `--jobs {JOBS}`, each run's time as measured in the "
        "exploratory pass, which ran at --jobs 2).",
        "",
    ]
    total_old = total_new = 0.0
    today = {CONVERGED: 0, UNCONVERGED: 0, TOO_SHORT: 0}
    expected_total = 0.0
    predicted_runs = 0
    for suite in sorted({c.suite for c in choices}):
        rows = [c for c in choices if c.suite == suite]
        suite_runs = [r for c in rows for r in c.runs]
        old_time = sum(r.wall for r in suite_runs)
        new_time = sum(c.seconds for c in rows)
        total_old += old_time
        total_new += new_time
        lines += [f"## {suite}", "",
                  "| benchmark | runs | today R / k | today conv / unconv / short | chosen R / k | "
                  "expected converged | shares at the lengths tried | time today | time chosen |",
                  "|---|---:|---:|---:|---:|---:|---|---:|---:|"]
        for c in rows:
            counts = {s: sum(r.status == s for r in c.runs) for s in today}
            for s in today:
                today[s] += counts[s]
            every_old = max(r.every for r in c.runs)
            share = c.share
            fitted = sum(r.fit is not None for r in c.runs)
            if share is not None:
                expected_total += share * fitted
                predicted_runs += fitted
            tried = ", ".join(f"{length}: {value:.0%}" for length, value, _ in c.tried.values() if value is not None)
            note = f" ({c.fixed})" if c.fixed else ""
            lines.append(
                f"| {c.benchmark}{note} | {len(c.runs)} | {max(r.rounds for r in c.runs)} / "
                f"{every_old} | {counts[CONVERGED]} / {counts[UNCONVERGED]} / {counts[TOO_SHORT]} | "
                f"{c.rounds} / {c.every} | {'—' if share is None else f'{share:.0%}'} | {tried or 'no fit'} | "
                f"{hours(sum(r.wall for r in c.runs) / JOBS)} | {hours(c.seconds / JOBS)} |")
        count, predicted, observed = backtest(suite_runs, window, change_pp)
        lines.append("")
        free = [c for c in rows if not c.fixed]
        weights = [(c.share, sum(r.fit is not None for r in c.runs)) for c in rows if c.share is not None]
        suite_share = sum(v * w for v, w in weights) / max(sum(w for _, w in weights), 1)
        lines.append(("" if not free else f"Chosen: {max(c.growth for c in free):g} x today's rounds for every "
                      "benchmark whose rounds are not fixed (one factor per suite, so that an arm and its control "
                      "keep equal lengths). ")
                     + (f"Expected converged: {suite_share:.0%} of the suite's runs. " if weights else "")
                     + f"Suite time at `--jobs {JOBS}`: {hours(old_time / JOBS)} today, about "
                     f"{hours(new_time / JOBS)} at the chosen lengths (x{new_time / old_time:.1f}).")
        if count:
            lines.append(f"Backtest: {count} runs judged today, refitted on the first half of their evaluations: "
                         f"predicted {predicted:.0%} converged at their own length, observed {observed / count:.0%}.")
        lines.append("")
    lines += [
        "## The whole pass",
        "",
        f"- Today: {today[CONVERGED]:,} converged, {today[UNCONVERGED]:,} unconverged, {today[TOO_SHORT]:,} too "
        f"short to judge of {len(runs):,} runs.",
        f"- Chosen lengths: every run judged; expected converged {expected_total / max(predicted_runs, 1):.0%} of the "
        f"{predicted_runs:,} runs with a fitted curve (about {expected_total:,.0f} runs).",
        f"- Time at `--jobs {JOBS}` on the 2-core CPU: {hours(total_old / JOBS)} of suite time for the exploratory "
        f"pass's runs (measured: 3.9 h), about {hours(total_new / JOBS)} for the confirmatory pass "
        f"(x{total_new / total_old:.1f}); an upper bound, run starts and evaluations scaled with the rounds.",
        "",
        "## What the lengths cannot do",
        "",
        "- **The ceiling is the scatter, not the length.** Most benchmarks' predicted share levels off at "
        "50-70 % by 2-3x today's rounds: their evaluations scatter by 1-2 pp around the trend (partial "
        "participation, attacks, dropout), so the mean of 3 evaluations against the 3 before moves by more than "
        "1 pp at any length. Longer runs buy little there; a wider window or a change threshold set from the "
        "scatter would (a plan rule, not a run length). Such runs read \"unconverged\" for noise, not trend: a "
        "verdict on them rests on the primary point and its sensitivity points, as the plan already says.",
        "- **The predictions are rough.** The backtests miss the observed share by up to 35 points, in both "
        "directions (under for fedfv and fedmgda ablations, over for fedlf-offline): read the shares as about "
        "+-30 pp. The confirmatory pass's own counts are what the page shows.",
        "- **Fixed lengths.** Benchmarks whose name states their rounds, and the Shapley measurement, keep their "
        "rounds and only get a cadence of R / 10; `fedlf-ablations-offline` (20 rounds, a timing ablation) and "
        "`cgsv-shapley-offline` (10 rounds) have no accuracy history long enough to fit, so no share is "
        "predicted; their claims read times and approximation errors, not accuracy.",
        "- **The CNN ablation** (`cgsv-ablations-offline`, fl_cnn_mnist: 1.2 h of the 1.3 h today) is held to 2x "
        "at most; the suite's predicted share is best at its current length, so it keeps 60 rounds, judged at "
        "a cadence of 6.",
        "",
    ]
    return "\n".join(lines)


def overrides(exports: Path = EXPORTS) -> dict[str, dict[str, dict[str, int]]]:
    """suite -> benchmark -> {num_rounds, eval_every}: the chosen lengths, as ledger_confirmatory.yaml lists them."""
    plan = load_plan(ROOT)
    chosen: dict[str, dict[str, dict[str, int]]] = {}
    for c in choose(load_runs(exports), plan.convergence.window, plan.convergence.change_pp):
        chosen.setdefault(c.suite, {})[c.benchmark] = {"num_rounds": c.rounds, "eval_every": c.every}
    return chosen


if __name__ == "__main__":
    if sys.argv[1:] == ["--overrides"]:
        print(json.dumps(overrides(), indent=1))
    else:
        print(report())
