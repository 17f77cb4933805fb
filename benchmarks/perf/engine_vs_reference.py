"""Local training speed against the way other FL frameworks train clients, in one process.

For each task, one round of local training (E epochs of minibatch SGD on every sampled
client, from the same global model) is timed three ways on the same data:

* ``reference``: the per-client loop of most FL code bases (e.g. the FedAvg reference
  implementations of McMahan et al. 2017 and their descendants): for each client, a copy
  of the model, a ``DataLoader`` over its ``TensorDataset`` (shuffled), ``torch.optim.SGD``.
* ``sequential``: fl-lightning's ``SequentialEngine`` (one client at a time, shared
  minibatch order, no DataLoader).
* ``vectorised``: fl-lightning's ``VectorisedEngine`` (all clients of the round stacked).

The result is client-samples per second (samples x epochs / seconds, median of the timed
repeats after a warm-up) and the ratios ``vectorised / reference`` and
``vectorised / sequential``, measured in the same process, so that the ratios hold on a
shared machine better than absolute seconds do.

    python -m benchmarks.perf.engine_vs_reference                     # every task
    python -m benchmarks.perf.engine_vs_reference --tasks synthetic_logreg_all mnist5k_mlp
    python -m benchmarks.perf.engine_vs_reference --repeats 7 --out results/engines_cpu.json
    cd /tmp/before && python -m benchmarks.perf.engine_vs_reference --label before --out <this results file>

For a before/after pair, run the "before" from a worktree of the older commit (``-m`` puts the
working directory first on ``sys.path``, ahead of ``PYTHONPATH``): each entry records the
``library`` folder it timed.

Tasks (``TASKS``): Synthetic(0.5, 0.5) with its natural partition of 100 clients, logistic
regression, E=1, B=10, lr 0.01, all clients and 10 of them (seeded sample); mnist5k (IID,
100 clients of 40 samples) with the 784-200-200-10 MLP; seeded random 3x32x32 images for the
CIFAR CNN and NF-ResNet-18 (20 samples per client) and CCT-7/3x1 (10; timing does not depend on
pixel values).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import fl_lightning
from benchmarks.perf.data import RandomImageData
from benchmarks.perf.machine import describe_machine
from fl_lightning.core.engines import SequentialEngine, VectorisedEngine
from fl_lightning.core.flat import ParameterLayout
from fl_lightning.core.fused import mean_cross_entropy_objective
from fl_lightning.core.local import (
    ClientDataSlicer,
    ClientShards,
    LocalSGD,
    batch_order,
    masked_cross_entropy,
)
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.models import create_fl_model

RESULTS_DIR = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Task:
    """One local-training setting: data, model, clients per round and local SGD."""

    name: str
    model: str
    source: str  # a FederatedDataModule source, or "random_images"
    num_clients: int
    clients_per_round: int
    lr: float
    batch_size: int = 10
    epochs: int = 1
    partition: str = "natural"
    samples_per_client: int | None = None  # iid: a subset of num_clients x this many samples


TASKS = {
    t.name: t
    for t in [
        Task("synthetic_logreg_all", "fl_logreg", "synthetic", 100, 100, lr=0.01),
        Task("synthetic_logreg_10pct", "fl_logreg", "synthetic", 100, 10, lr=0.01),
        Task("mnist5k_mlp", "fl_mlp", "mnist5k", 100, 100, lr=0.05, partition="iid", samples_per_client=40),
        Task("mnist5k_mlp_10pct", "fl_mlp", "mnist5k", 100, 10, lr=0.05, partition="iid", samples_per_client=40),
        Task("cifar_cnn", "fl_cnn_cifar", "random_images", 20, 20, lr=0.05, samples_per_client=20),
        Task("nf_resnet18", "fl_nf_resnet18", "random_images", 10, 10, lr=0.05, samples_per_client=20),
        Task("cct_7_3x1", "fl_cct_7_3x1", "random_images", 4, 4, lr=0.05, samples_per_client=10),
    ]
}


def build_data(task: Task, seed: int) -> FederatedDataModule:
    if task.source == "random_images":
        data: FederatedDataModule = RandomImageData(task.num_clients, task.samples_per_client or 20, seed=seed)
    else:
        params = {"total_size": task.num_clients * task.samples_per_client} if task.samples_per_client else {}
        data = FederatedDataModule(source=task.source, num_clients=task.num_clients, partition=task.partition,
                                   partition_params=params, test_mode="local", local_test_fraction=0.0, seed=seed)
    data.setup("fit")
    return data


def reference_round(model: nn.Module, data: FederatedDataModule, clients: list[int], sgd: LocalSGD,
                    seed: int) -> list[dict[str, torch.Tensor]]:
    """The per-client loop: a model copy, a shuffled DataLoader over the client's
    TensorDataset and torch.optim.SGD per client; every client's trained state dict."""
    trained = []
    generator = torch.Generator().manual_seed(seed)
    for k in clients:
        n_k = int(data.train_sizes[k])
        rows = data.train_index[k, :n_k]
        loader = DataLoader(TensorDataset(data.train_x[rows], data.train_y[rows]),
                            batch_size=sgd.batch_size or n_k, shuffle=True, generator=generator)
        local = copy.deepcopy(model)
        optimizer = torch.optim.SGD(local.parameters(), lr=sgd.lr, momentum=sgd.momentum,
                                    weight_decay=sgd.weight_decay)
        for _ in range(sgd.epochs):
            for xb, yb in loader:
                optimizer.zero_grad()
                nn.functional.cross_entropy(local(xb), yb).backward()
                optimizer.step()
        trained.append(local.state_dict())
    return trained


CPU = torch.device("cpu")


def median_seconds(run, repeats: int, warmup: int, device: torch.device = CPU) -> tuple[float, list[float]]:
    """Median wall-clock seconds of ``run()`` (device synchronised) after ``warmup`` calls."""
    def synchronise() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        synchronise()
        start = time.perf_counter()
        run()
        synchronise()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def time_task(task: Task, repeats: int, warmup: int, seed: int = 0, device: torch.device = CPU) -> dict:
    """Seconds per round of local training for the three ways (same data, model, SGD, device)."""
    torch.manual_seed(seed)
    data = build_data(task, seed)
    data.to(device)
    model = create_fl_model(task.model, num_classes=data.num_classes, input_shape=data.input_shape).to(device)
    layout = ParameterLayout.of(model)
    start = {n: p.detach() for n, p in model.named_parameters()}
    sgd = LocalSGD(lr=task.lr, epochs=task.epochs, batch_size=task.batch_size)
    picked = torch.randperm(data.num_clients, generator=torch.Generator().manual_seed(seed))[: task.clients_per_round]
    clients = sorted(picked.tolist())
    shards: ClientShards = ClientDataSlicer().shards(data, torch.tensor(clients))
    samples = sum(shards.sizes_cpu) * task.epochs

    @mean_cross_entropy_objective  # as FederatedModule's default: the engine may use its fused gradients
    def objective(logits, targets, mask, local_params, anchor):
        return masked_cross_entropy(logits, targets, mask)

    def engine_round(engine) -> None:
        order = batch_order(shards.sizes, shards.index.shape[1], sgd.epochs, torch.Generator().manual_seed(seed))
        engine.train(model, layout, start, shards, order, sgd, objective)

    vectorised = VectorisedEngine(clients_per_chunk="auto")  # FederatedModule's default
    ways = {
        "reference": lambda: reference_round(model, data, clients, sgd, seed),
        "sequential": lambda: engine_round(SequentialEngine()),
        "vectorised": lambda: engine_round(vectorised),
    }
    seconds: dict[str, float] = {}
    entry: dict = {"task": asdict(task), "clients": len(clients), "client_samples_per_round": samples,
                   "num_parameters": layout.num_parameters, "max_client_samples": max(shards.sizes_cpu)}
    for name, run in ways.items():
        seconds[name], all_times = median_seconds(run, repeats, warmup, device)
        entry[name] = {"seconds_per_round": seconds[name], "seconds_all": all_times,
                       "client_samples_per_second": samples / seconds[name]}
        print(f"  {task.name:24s} {name:10s} {seconds[name]:8.4f} s/round  {samples / seconds[name]:10.0f} samples/s",
              flush=True)
    entry["forward_kind"] = getattr(vectorised, "forward_kind", "vmap")
    entry["chunk_size"] = vectorised.chunk_size
    entry["vectorised_over_reference"] = seconds["reference"] / seconds["vectorised"]
    entry["vectorised_over_sequential"] = seconds["sequential"] / seconds["vectorised"]
    entry["sequential_over_reference"] = seconds["reference"] / seconds["sequential"]
    print(f"  {task.name:24s} vectorised = {entry['vectorised_over_reference']:.1f}x reference, "
          f"{entry['vectorised_over_sequential']:.1f}x sequential", flush=True)
    return entry


def main(argv: list[str] | None = None) -> int:
    """Times every ``--tasks`` task the three ways and appends the measurement (under
    ``--label``, with the machine, thread count and load average) to ``--out``; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS), metavar="TASK",
                        help=f"default: all of {', '.join(TASKS)}")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds per way (the median is kept)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: PyTorch's)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--label", default=None, help="a name for this measurement (e.g. 'before', 'after')")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "engine_vs_reference_cpu.json",
                        help="results file; a run is appended under its label")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    library = str(Path(fl_lightning.__file__).resolve().parent)  # a before/after pair must name two copies
    print(f"timing fl_lightning from {library}", flush=True)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    device = torch.device(args.device)
    results = [time_task(TASKS[name], args.repeats, args.warmup, device=device) for name in args.tasks]
    measurement = {
        "label": args.label, "library": library, "machine": describe_machine(device),
        "torch_threads": torch.get_num_threads(), "repeats": args.repeats, "warmup": args.warmup,
        "load_average_1min_before": load_before, "load_average_1min_after": os.getloadavg()[0],
        "wall_seconds": time.perf_counter() - started, "results": results,
    }
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {"measurements": []}
    previous["measurements"].append(measurement)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(previous, indent=1))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
