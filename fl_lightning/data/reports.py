"""Reports on a federated split: a text table and a figure of every client's data.

    >>> data = FederatedDataModule(source="digits", num_clients=5)
    >>> data.setup()
    >>> print(partition_table(data))  # sizes and class counts per client
    >>> partition_figure(data).savefig("partition.png")  # stacked class counts per client

:func:`client_table` and :func:`class_count_figure` draw the same from a ``(K, C)`` table of
class counts and the clients' sizes, without a data module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch
    from matplotlib.figure import Figure

    from fl_lightning.data.datamodule import FederatedDataModule

TABLE_MAX_ROWS = 20  # larger tables show the first and last clients and a summary
TABLE_MAX_CLASS_COLUMNS = 20  # more classes: show "classes held" and the top classes
BAR_CLIENTS_MAX = 30  # more clients: each class drawn as one filled step outline, not a bar per client


def partition_table(datamodule: FederatedDataModule) -> str:
    """A text table of every client's sizes and training class counts, headed by the source,
    partition and test mode (call ``datamodule.setup()`` first)."""
    counts = datamodule.class_counts  # raises if the clients are not built yet
    hp = datamodule.hparams
    train_sizes, test_sizes = _numpy(datamodule.train_sizes), _numpy(datamodule.test_sizes)
    params = f" {datamodule.partition_params}" if datamodule.partition_params else ""
    global_test = datamodule.global_test_y
    held_out = 0 if global_test is None else len(global_test)
    lines = [
        f"source={hp['source']} partition={hp['partition']}{params} clients={len(counts)} "
        f"classes={counts.shape[1]} test_mode={hp['test_mode']}",
        f"train samples={int(train_sizes.sum())}, local test samples="
        f"{int(test_sizes.sum())}, global test samples={held_out}",
    ]
    return "\n".join(lines + client_table(counts, train_sizes, test_sizes))


def partition_figure(datamodule: FederatedDataModule) -> Figure:
    """Stacked bars of each client's training class counts (one colour per class; call
    ``datamodule.setup()`` first)."""
    counts = datamodule.class_counts  # raises if the clients are not built yet
    hp = datamodule.hparams
    return class_count_figure(counts, f"{hp['source']} / {hp['partition']}")


def client_table(counts: np.ndarray, train_sizes, test_sizes) -> list[str]:
    """The table's lines: a header and one row per client (sizes, then the class counts, or
    the number of classes held and the top three when there are over 20 classes); over 20
    clients, the first 10 and last 5 rows and a summary of sizes and classes held."""
    header, rows = _client_rows(counts, train_sizes, test_sizes)
    if len(rows) > TABLE_MAX_ROWS:
        rows = rows[:10] + [f"... {len(rows) - 15} more clients ..."] + rows[-5:]
    lines = [header, *rows]
    if len(counts) > TABLE_MAX_ROWS:
        lines.append(_size_summary("n_train", np.asarray(train_sizes)))
        lines.append(_size_summary("classes held", (counts > 0).sum(axis=1)))
    return lines


def _numpy(sizes: torch.Tensor | None) -> np.ndarray:
    assert sizes is not None  # built by setup(), which class_counts has checked
    return sizes.cpu().numpy()


def _client_rows(counts: np.ndarray, train_sizes, test_sizes) -> tuple[str, list[str]]:
    num_classes = counts.shape[1]
    if num_classes <= TABLE_MAX_CLASS_COLUMNS:
        header = f"{'client':>6} {'n_train':>7} {'n_test':>6} " + " ".join(
            f"{f'c{c}':>5}" for c in range(num_classes)
        )
        rows = [
            f"{k:>6} {train_sizes[k]:>7} {test_sizes[k]:>6} "
            + " ".join(f"{n:>5}" for n in counts[k])
            for k in range(len(counts))
        ]
        return header, rows
    header = f"{'client':>6} {'n_train':>7} {'n_test':>6} {'classes':>7}  top classes (count)"
    rows = []
    for k, row in enumerate(counts):
        top = [c for c in np.argsort(-row, kind="stable")[:3] if row[c] > 0]
        rows.append(
            f"{k:>6} {train_sizes[k]:>7} {test_sizes[k]:>6} {(row > 0).sum():>7}  "
            + ", ".join(f"{c} ({row[c]})" for c in top)
        )
    return header, rows


def _size_summary(label: str, values: np.ndarray) -> str:
    return (
        f"{label}: min={values.min()} median={np.median(values):g} "
        f"mean={values.mean():.1f} max={values.max()}"
    )


def class_count_figure(counts: np.ndarray, title: str) -> Figure:
    """One bar per client, stacked by class, from a ``(K, C)`` table of class counts; vertical
    bars, tick labels thinned for many clients, a legend for up to 20 classes (a colour bar
    beyond). Beyond ``BAR_CLIENTS_MAX`` clients each class is one filled step outline across the
    clients (C artists instead of K x C bars: 100 clients of 10 classes draw in a fifth of
    the time, and the bars would touch anyway). Drawn with matplotlib's object-oriented API (no
    pyplot state)."""
    from matplotlib import colormaps
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure

    num_clients, num_classes = counts.shape
    width = min(16.0, max(6.5, 4.0 + 0.12 * num_clients))  # inches: room for title and legend
    figure = Figure(figsize=(width, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    cmap = colormaps["tab10" if num_classes <= 10 else "tab20" if num_classes <= 20 else "viridis"]
    clients = np.arange(num_clients)
    bottom = np.zeros(num_clients)
    edges = np.arange(num_clients + 1) - 0.5
    for cls in range(num_classes):
        colour = cmap(cls if num_classes <= 20 else cls / max(1, num_classes - 1))
        if num_clients > BAR_CLIENTS_MAX:
            top = bottom + counts[:, cls]
            axes.stairs(top, edges, baseline=bottom, fill=True, color=colour, label=f"class {cls}")
        else:
            axes.bar(
                clients, counts[:, cls], bottom=bottom, width=0.85, color=colour, label=f"class {cls}"
            )
        bottom = bottom + counts[:, cls]
    step = max(1, int(np.ceil(num_clients / 25)))
    axes.set_xticks(clients[::step])
    axes.set_xlim(-0.6, num_clients - 0.4)
    axes.set_xlabel("client")
    axes.set_ylabel("training samples")
    axes.set_title(f"class counts per client: {title}")
    if num_classes <= 20:
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small", title="class")
    else:
        mappable = ScalarMappable(norm=Normalize(0, num_classes - 1), cmap=cmap)
        figure.colorbar(mappable, ax=axes, label="class")
    return figure
