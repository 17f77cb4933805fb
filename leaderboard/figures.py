"""Per-benchmark figures (matplotlib ``Figure`` objects, no pyplot global state, PNG via Agg).

- ``curves``: mean client accuracy and a fairness indicator against rounds, mean over seeds
  (band: ± std over seeds), one line per configuration (fairness only where it is shown: client
  test local or matched);
- ``clients``: the distribution of the final client accuracies of each configuration
  (all clients of all finished seeds);
- ``pareto``: mean accuracy against unfairness (std of client accuracy; angle when logged),
  the Pareto-optimal configurations highlighted and labelled;
- ``agents``: CGSV's Fig. 2 view, one line of panels per configuration that logged per-agent
  series (CGSV and its variants): each agent's reputation r, contribution ψ and download density
  q/D against rounds (mean over seeds), and its final l2 distance to the server model (mean ± std
  over seeds); agents with noisy data are labelled with their noise (the task's label_noise /
  feature_noise).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Annotation
from matplotlib.ticker import MaxNLocator

from fl_lightning.records.vocabulary import Metric, agent_metric, agent_of
from leaderboard.runs import is_agent_series
from leaderboard.tables import BenchmarkTable, ConfigRow, Stat

DPI = 100


def row_label(row: ConfigRow, table: BenchmarkTable) -> str:
    return f"{row.config} [{row.suite}]" if table.multi_suite else row.config


def palette(n: int) -> list:
    cmap = matplotlib.colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def mean_curve(row: ConfigRow, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(steps, mean over seeds, std over seeds) of a metric's history; steps any seed logged."""
    histories = [dict(r.histories[metric]) for r in row.finished_runs if r.histories.get(metric)]
    if not histories:
        return None
    steps = np.array(sorted({s for h in histories for s in h}))
    values = np.array([[h.get(s, np.nan) for s in steps] for h in histories], dtype=float)
    counts = np.sum(~np.isnan(values), axis=0)
    mean = np.nanmean(values, axis=0)
    centred = np.where(np.isnan(values), 0.0, values - mean)
    std = np.sqrt(np.sum(centred**2, axis=0) / np.maximum(counts - 1, 1))
    std[counts < 2] = np.nan
    return steps, mean, std


def fairness_metric(table: BenchmarkTable) -> str:
    """The angle (FedLF) when any finished run logged it, else the std of client accuracy."""
    has_angle = any(r.histories.get(Metric.TEST_ACC_ANGLE) for row in table.rows for r in row.finished_runs)
    return Metric.TEST_ACC_ANGLE if has_angle else Metric.TEST_ACC_STD


FAIRNESS_AXIS = {
    Metric.TEST_ACC_ANGLE: ("fairness angle (rad, lower = fairer)", 1.0),
    Metric.TEST_ACC_STD: ("std of client accuracy (pp, lower = fairer)", 100.0),
}
FAIRNESS_NAME = {Metric.TEST_ACC_ANGLE: "FedLF's fairness angle", Metric.TEST_ACC_STD: "std of the client accuracies"}


def headline_metric(row: ConfigRow) -> str:
    """The history behind the row's headline: global_test_acc where the headline was derived from it."""
    return Metric.GLOBAL_TEST_ACC if row.headline_derived else Metric.TEST_ACC_MEAN


def fairness_panel(table: BenchmarkTable) -> str | None:
    """The fairness history the curves figure plots beside the accuracy: only where fairness is
    shown (client test local or matched) and some finished run logged it."""
    if not table.fairness_shown:
        return None
    fairness = fairness_metric(table)
    logged = any(r.histories.get(fairness) for row in table.rows for r in row.finished_runs)
    return fairness if logged else None


def curves_caption(table: BenchmarkTable) -> str:
    """What the curves figure of this table plots (the fairness panel only where it is drawn)."""
    accuracy = "Mean client accuracy"
    if any(row.headline_derived for row in table.rows):
        accuracy += " (global test accuracy for the † rows)"
    fairness = fairness_panel(table)
    if fairness is not None:
        return f"{accuracy} and {FAIRNESS_NAME[fairness]} across clients against rounds (mean over seeds ± std)"
    return f"{accuracy} against rounds (mean over seeds ± std)"


def curves_figure(table: BenchmarkTable) -> Figure | None:
    """Accuracy against rounds; beside it the fairness indicator, only where fairness is shown."""
    fairness = fairness_panel(table)
    colors = palette(len(table.rows))
    figure = Figure(figsize=(11 if fairness else 7.5, 4.2), dpi=DPI, layout="constrained")
    if fairness is not None:
        acc_axes, fair_axes = figure.subplots(1, 2)
        panels = ((acc_axes, None, 100.0), (fair_axes, fairness, FAIRNESS_AXIS[fairness][1]))
    else:
        acc_axes, fair_axes = figure.subplots(), None
        panels = ((acc_axes, None, 100.0),)
    drawn = False
    for row, color in zip(table.rows, colors):
        label = row_label(row, table)
        for axes, metric, scale in panels:
            curve = mean_curve(row, metric or headline_metric(row))
            if curve is None:
                continue
            steps, mean, std = curve
            axes.plot(steps, mean * scale, color=color, label=label, marker="o" if len(steps) <= 12 else None,
                      markersize=3, linewidth=1.6)
            if not np.all(np.isnan(std)):
                axes.fill_between(steps, (mean - std) * scale, (mean + std) * scale, color=color, alpha=0.15,
                                  linewidth=0)
            drawn = True
    if not drawn:
        return None
    acc_axes.set(xlabel="round", ylabel="mean client test accuracy (%)", title="Mean accuracy (mean over seeds ± std)")
    if fair_axes is not None:
        fair_axes.set(xlabel="round", ylabel=FAIRNESS_AXIS[fairness][0], title="Fairness across clients")
    for axes in [a for a, _, _ in panels]:
        axes.grid(True, alpha=0.3)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    handles, labels = acc_axes.get_legend_handles_labels()
    if handles:
        figure.legend(handles, labels, loc="outside right upper", fontsize=8, title="configuration",
                      title_fontsize=8, frameon=False)
    return figure


def clients_figure(table: BenchmarkTable) -> Figure | None:
    """The final client accuracies of each configuration as a horizontal box plot over all clients of all finished
    seeds, the points jittered over it; None where fairness is not shown or no run has client accuracies."""
    if not table.fairness_shown:  # clients share one test set: their spread is not a fairness statement
        return None
    rows = [row for row in table.rows if any(r.client_accuracies() for r in row.finished_runs)]
    if not rows:
        return None
    colors = dict(zip((id(r) for r in table.rows), palette(len(table.rows))))
    data = [np.array([a for r in row.finished_runs for a in r.client_accuracies()]) * 100 for row in rows]
    labels = [row_label(row, table) for row in rows]
    figure = Figure(figsize=(11, 1.2 + 0.55 * len(rows)), dpi=DPI, layout="constrained")
    axes = figure.subplots()
    positions = np.arange(len(rows))[::-1] + 1  # the best row (first) at the top
    style = dict(positions=positions, widths=0.6, showmeans=True, patch_artist=True,
                 meanprops=dict(marker="D", markerfacecolor="black", markeredgecolor="black", markersize=4),
                 medianprops=dict(color="black"), flierprops=dict(marker=".", markersize=3, alpha=0.5))
    try:
        boxes = axes.boxplot(data, orientation="horizontal", **style)
    except TypeError:  # matplotlib < 3.10
        boxes = axes.boxplot(data, vert=False, **style)
    for patch, row in zip(boxes["boxes"], rows):
        patch.set_facecolor(colors[id(row)])
        patch.set_alpha(0.55)
    rng = np.random.default_rng(0)
    for values, position in zip(data, positions):
        jitter = rng.uniform(-0.18, 0.18, size=len(values))
        axes.scatter(values, position + jitter, s=6, color="black", alpha=0.35, linewidths=0, zorder=3)
    axes.set_yticks(positions, labels, fontsize=8)
    axes.set(xlabel="final test accuracy of a client (%)",
             title="Final client accuracies (all clients of all finished seeds; ◆ = mean)")
    axes.grid(True, axis="x", alpha=0.3)
    return figure


def pareto_front(points: list[tuple[float, float]]) -> list[bool]:
    """Which (unfairness, accuracy) points no other point beats: lower x and higher y, one strictly."""
    front = []
    for i, (x, y) in enumerate(points):
        dominated = any(
            (x2 <= x and y2 >= y) and (x2 < x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i
        )
        front.append(not dominated)
    return front


def pareto_rows(table: BenchmarkTable, fairness: str) -> list[tuple[ConfigRow, Stat, Stat, bool]]:
    """(row, fairness stat, accuracy stat, on the front) for rows with both numbers."""
    pairs = [(row, row.stats.get(fairness), row.stats.get(Metric.TEST_ACC_MEAN)) for row in table.rows]
    pairs = [(row, x, y) for row, x, y in pairs if x is not None and y is not None]
    front = pareto_front([(x.mean, y.mean) for _, x, y in pairs])
    return [(row, x, y, on) for (row, x, y), on in zip(pairs, front)]


def pareto_metrics(table: BenchmarkTable) -> list[str]:
    """The unfairness axes of the Pareto figure: std and angle, where some row has both numbers."""
    if not table.fairness_shown:
        return []
    return [m for m in (Metric.TEST_ACC_STD, Metric.TEST_ACC_ANGLE) if len(pareto_rows(table, m)) >= 1]


def label_directions(points: list[tuple[float, float]], labelled: list[int]) -> dict[int, tuple[float, float]]:
    """For each labelled point, a unit direction (in axes-normalised units) pointing away from the
    other points (inverse-square repulsion), so that its label is placed on its own side and never
    beside a neighbour; up-right when it stands alone."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    span_x, span_y = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
    scaled = [((x - min(xs)) / span_x, (y - min(ys)) / span_y) for x, y in points]
    directions = {}
    for i in labelled:
        push_x = push_y = 0.0
        for j, (x, y) in enumerate(scaled):
            dx, dy = scaled[i][0] - x, scaled[i][1] - y
            distance = (dx * dx + dy * dy) ** 0.5
            if j == i or distance == 0:
                continue
            push_x, push_y = push_x + dx / distance**3, push_y + dy / distance**3
        norm = (push_x * push_x + push_y * push_y) ** 0.5
        directions[i] = (push_x / norm, push_y / norm) if norm > 0 else (0.7071, 0.7071)
    return directions


LABEL_DISTANCE = 16  # points between a Pareto point and the near corner of its label


def pareto_figure(table: BenchmarkTable) -> Figure | None:
    """Mean client accuracy against each unfairness axis (std, and angle where logged), ± std over seeds,
    the Pareto-optimal configurations highlighted, joined and labelled; None without both numbers."""
    metrics = pareto_metrics(table)
    if not metrics:
        return None
    colors = dict(zip((id(r) for r in table.rows), palette(len(table.rows))))
    figure = Figure(figsize=(5.5 * len(metrics) + 0.5, 4.6), dpi=DPI, layout="constrained")
    axes_list = np.atleast_1d(figure.subplots(1, len(metrics)))
    for axes, metric in zip(axes_list, metrics):
        label, scale = FAIRNESS_AXIS[metric]
        entries = pareto_rows(table, metric)
        for row, x, y, on_front in entries:
            axes.errorbar(x.mean * scale, y.mean * 100, xerr=(x.std or 0) * scale, yerr=(y.std or 0) * 100,
                          fmt="o", color=colors[id(row)], alpha=1.0 if on_front else 0.45,
                          markersize=9 if on_front else 6, markeredgecolor="black" if on_front else "none",
                          markeredgewidth=1.2, elinewidth=0.8, capsize=2, zorder=3 if on_front else 2)
        points = [(x.mean * scale, y.mean * 100) for _, x, y, _ in entries]
        front = sorted((i for i, entry in enumerate(entries) if entry[3]), key=lambda i: (points[i][0], -points[i][1]))
        if len(front) >= 2:
            axes.plot([points[i][0] for i in front], [points[i][1] for i in front], linestyle="--", color="black",
                      linewidth=1, alpha=0.6, zorder=1, label="Pareto front")
        # each label at its own configuration's point (the same entry's coordinates), pushed away
        # from the other points and tied to its point by a line in the row's colour
        for i, (dx, dy) in label_directions(points, front).items():
            row = entries[i][0]
            axes.annotate(row_label(row, table), points[i], xytext=(LABEL_DISTANCE * dx, LABEL_DISTANCE * dy),
                          textcoords="offset points", fontsize=8, fontweight="bold",
                          ha="left" if dx >= 0 else "right", va="bottom" if dy >= 0 else "top",
                          arrowprops=dict(arrowstyle="-", color=colors[id(row)], linewidth=0.8,
                                          shrinkA=0, shrinkB=4),
                          gid=f"pareto-label:{row.config}")
        axes.set(
            xlabel=label,
            ylabel="mean client test accuracy (%)",
            title=f"Accuracy vs {'angle' if metric == Metric.TEST_ACC_ANGLE else 'std'} (labelled: Pareto-optimal)",
        )
        axes.grid(True, alpha=0.3)
        axes.margins(x=0.25, y=0.2)
    handles = [Line2D([], [], marker="o", linestyle="", color=colors[id(row)],
                                       label=row_label(row, table)) for row in table.rows]
    figure.legend(handles=handles, loc="outside right upper", fontsize=8, title="configuration",
                  title_fontsize=8, frameon=False)
    keep_labels_inside(figure)
    return figure


def keep_labels_inside(figure: Figure, pad: float = 6.0) -> None:
    """Widen each axes' limits until its annotations (labels pushed away from the points) lie inside
    it, so that no label runs over an axis label; a label's extent beyond its anchor, in pixels,
    does not depend on the limits."""
    renderer = FigureCanvasAgg(figure).get_renderer()
    for _ in range(3):  # the layout moves a little with the limits: settle in a few passes
        figure.draw(renderer)
        for axes in figure.axes:
            labels = [t for t in axes.texts if isinstance(t, Annotation)]
            if not labels:
                continue
            box = axes.get_window_extent(renderer)
            for get, set_, low, high, size in ((axes.get_xlim, axes.set_xlim, "x0", "x1", box.width),
                                               (axes.get_ylim, axes.set_ylim, "y0", "y1", box.height)):
                lower, upper = get()
                axis = 0 if get == axes.get_xlim else 1
                for label in labels:
                    extent = label.get_window_extent(renderer)
                    anchor = axes.transData.transform(label.xy)[axis]
                    before = (anchor - getattr(extent, low) + pad) / size  # share of the axes needed below
                    after = (getattr(extent, high) - anchor + pad) / size
                    value = label.xy[axis]
                    if 0 < before < 0.9:
                        lower = min(lower, (value - before * upper) / (1 - before))
                    if 0 < after < 0.9:
                        upper = max(upper, (value - after * lower) / (1 - after))
                set_(lower, upper)


AGENT_PANELS = (
    (Metric.CGSV_R, "reputation r"),
    (Metric.CGSV_PSI, "contribution ψ (eq. 3)"),
    (Metric.CGSV_DENSITY, "download density q/D (reward)"),
)


def agent_ids(row: ConfigRow) -> list[int]:
    """The agents whose per-agent series the row's finished runs logged."""
    agents = (agent_of(name) for r in row.finished_runs for name in r.histories if is_agent_series(name))
    return sorted({agent[1] for agent in agents if agent is not None})


def noise_labels(table: BenchmarkTable) -> dict[int, str]:
    """{agent: "40% noisy labels, noise std 0.5"} from the table's task (label_noise / feature_noise)."""
    fields = table.task.fields if table.task is not None else {}
    labels: dict[int, list[str]] = {}
    for name, text in (("label_noise", "{:.0%} noisy labels"), ("feature_noise", "input noise std {:g}")):
        spec = fields.get(name)
        if isinstance(spec, dict):
            for agent, value in spec.items():
                try:
                    labels.setdefault(int(agent), []).append(text.format(float(value)))
                except (TypeError, ValueError):
                    continue
    return {agent: ", ".join(parts) for agent, parts in labels.items()}


def final_values(row: ConfigRow, metric: str) -> list[float]:
    """The metric's last logged value in each finished run that logged it."""
    return [max(r.histories[metric])[1] for r in row.finished_runs if r.histories.get(metric)]


def agents_figure(table: BenchmarkTable) -> Figure | None:
    """Per agent: r, ψ and download density against rounds, and the final distance to the server."""
    rows = [(row, agents) for row in table.rows if (agents := agent_ids(row))]
    if not rows:
        return None
    noise = noise_labels(table)
    num_agents = max(max(agents) for _, agents in rows) + 1
    colors = palette(num_agents)
    figure = Figure(figsize=(14, 2.9 * len(rows) + 0.6), dpi=DPI, layout="constrained")
    grid = np.atleast_2d(figure.subplots(len(rows), len(AGENT_PANELS) + 1, squeeze=False))
    handles = {}
    for axes_row, (row, agents) in zip(grid, rows):
        label = row_label(row, table)
        for axes, (series, title) in zip(axes_row, AGENT_PANELS):
            for agent in agents:
                curve = mean_curve(row, agent_metric(series, agent))
                if curve is None:
                    continue
                steps, mean, std = curve
                (line,) = axes.plot(steps, mean, color=colors[agent], linewidth=1.4,
                                    linestyle="-" if agent not in noise else "--")
                handles.setdefault(agent, line)
                if not np.all(np.isnan(std)):
                    axes.fill_between(steps, mean - std, mean + std, color=colors[agent], alpha=0.12, linewidth=0)
            axes.set_title(f"{label}: {title}", fontsize=9)
            axes.set_xlabel("round", fontsize=8)
            axes.grid(True, alpha=0.3)
            axes.xaxis.set_major_locator(MaxNLocator(integer=True))
            axes.tick_params(labelsize=8)
        bars = axes_row[-1]
        for agent in agents:
            values = final_values(row, agent_metric(Metric.CGSV_DISTANCE, agent))
            if not values:
                continue
            spread = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
            drawn = bars.bar(agent, float(np.mean(values)), yerr=spread, color=colors[agent], capsize=3,
                             hatch="//" if agent in noise else None,
                             edgecolor="white" if agent not in noise else "black")
            bars.bar_label(drawn, fmt="%.2g", fontsize=7, padding=2)  # a clean agent's ~0 stays readable
        bars.set_title(f"{label}: final ‖w_i − w‖ (l2 to server)", fontsize=9)
        bars.set_xlabel("agent", fontsize=8)
        bars.set_xticks(agents)
        bars.grid(True, axis="y", alpha=0.3)
        bars.tick_params(labelsize=8)
    if not handles:
        return None
    ordered = sorted(handles)
    labels = [f"agent {a}" + (f" ({noise[a]})" if a in noise else " (clean)" if noise else "") for a in ordered]
    figure.legend([handles[a] for a in ordered], labels, loc="outside lower center", ncols=min(len(ordered), 5),
                  fontsize=8, frameon=False)
    return figure


def save(figure: Figure, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI)


def pareto_caption(table: BenchmarkTable) -> str:
    axes = " and ".join(FAIRNESS_NAME[m] for m in pareto_metrics(table)) or "unfairness"
    return (f"Mean client accuracy against unfairness ({axes}), mean over seeds ± std; the Pareto-optimal "
            "configurations are labelled, each label tied to its own point")


def agents_caption(table: BenchmarkTable) -> str:
    text = ("Per agent (CGSV Fig. 2): reputation r, contribution ψ and download density (the reward) against "
            "rounds, mean over seeds ± std; final l2 distance of each agent's model to the server's")
    return text + (" (dashed / hatched: noisy agents)" if noise_labels(table) else "")


Caption = Callable[[BenchmarkTable], str]
FIGURES: tuple[tuple[str, Caption, Callable[[BenchmarkTable], Figure | None]], ...] = (
    ("curves", curves_caption, curves_figure),
    ("clients", lambda table: "Distribution of the final client accuracies (all clients of all finished seeds)",
     clients_figure),
    ("pareto", pareto_caption, pareto_figure),
    ("agents", agents_caption, agents_figure),
)


def write_figures(table: BenchmarkTable, folder: Path) -> list[tuple[str, str]]:
    """Write the benchmark's figures into ``folder``; (file name, caption) of those that had data,
    each caption saying what this table's figure plots."""
    written = []
    for name, caption, make in FIGURES:
        figure = make(table)
        if figure is None:
            continue
        save(figure, folder / f"{name}.png")
        written.append((f"{name}.png", caption(table)))
    return written
