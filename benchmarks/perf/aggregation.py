"""Server aggregation time per round for every algorithm, next to loop transcriptions.

For m ∈ {10, 100} clients per round and d ≈ 0.2M / 0.8M parameters (the MLP
784-200-200-10 and an MLP 784-1000-10 on mnist5k, K = 100 clients; ``--sizes
nf_resnet18_fedlf nf_resnet18`` adds NF-ResNet-18 at 0.19M and 11.2M), every registered
algorithm's ``aggregate`` + ``on_round_end`` is timed on the same random round
(updates with a shared component plus noise, so that clients conflict), after one
warm-up round that fills histories. In the same process, direct loop transcriptions of
FedFV's and FedMGDA+'s server steps (``reference_loops.py``) run on the same round.

    python -m benchmarks.perf.aggregation [--repeats 3] [--device cpu] [--out
    benchmarks/perf/results/aggregation_cpu.json]

``python -m benchmarks.perf`` runs it as its aggregation section (m=100, d≈0.8M by default).
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from benchmarks.perf.machine import describe_machine
from benchmarks.perf.reference_loops import fedfv_server_step_loop, fedmgda_plus_server_step_loop
from fl_lightning.algorithms import ALGORITHMS
from fl_lightning.core.module import RoundPayload
from fl_lightning.core.payload import as_server_step
from fl_lightning.data.datamodule import FederatedDataModule

# size name -> (backbone, its arguments); the NF-ResNet-18s are FedLF's Table 9 model (Pan et al.,
# the FedLF code's three-stage layout, 0.19M) and the standard ResNet-18 widths (11.2M); counted on mnist5k-shaped
# input, 10 classes
MODELS: dict[str, tuple[str, dict]] = {
    "0.2M": ("fl_mlp", {"hidden_sizes": [200, 200]}),
    "0.8M": ("fl_mlp", {"hidden_sizes": [1000]}),
    "nf_resnet18_fedlf": ("fl_nf_resnet18_fedlf", {}),
    "nf_resnet18": ("fl_nf_resnet18_standard", {}),
}
FULL_PARTICIPATION = {"AFL", "CGSV", "Standalone", "DW", "RR", "EU"}
CPU = torch.device("cpu")


def random_round(
    module, data, m: int, round_index: int, generator: torch.Generator, device: torch.device = CPU
) -> RoundPayload:
    """A round of m clients' updates (drawn on the CPU, then moved to ``device``)."""
    d = module.num_parameters
    clients = torch.arange(m, device=device)
    shared = torch.randn(d, generator=generator)
    updates = 0.3 * shared + torch.randn(m, d, generator=generator)
    updates *= torch.rand(m, 1, generator=generator) * 2 + 0.1  # different magnitudes
    shards = module.round_context(round_index).client_shards(clients)
    return RoundPayload(
        round=round_index,
        clients=clients,
        updates=(updates * 0.01).to(device),
        losses=(torch.rand(m, generator=generator) * 2 + 0.5).to(device),
        accuracies=torch.rand(m, generator=generator).to(device),
        num_samples=shards.sizes.clone(),
        shards=shards,
        _context=module.round_context(round_index),
    )


def time_call(fn, repeats: int, device: torch.device = CPU) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` calls (device synchronised)."""
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def build(name: str, cls, size: str, m: int, data) -> object:
    """Algorithm ``name`` with the backbone of ``size`` (``MODELS``), m of the K clients a round."""
    fraction = 1.0 if name in FULL_PARTICIPATION else m / data.num_clients
    backbone, backbone_kwargs = MODELS[size]
    module = cls(backbone=backbone, backbone_kwargs=backbone_kwargs, num_classes=10,
                 input_shape=data.input_shape, num_rounds=100, fraction=fraction, lr=0.1, eval_every=1, seed=0)
    module.attach_data(data)
    module.setup("fit")
    return module


def server_step(module, payload):
    step = as_server_step(module.aggregate(payload))
    module.on_round_end(payload, step.direction)
    return step


def measure(
    sizes: list[str],
    clients: list[int],
    algorithms: list[str],
    repeats: int,
    device: torch.device = CPU,
    loops: bool = True,
) -> list[dict]:
    """One result per (size, m): each algorithm's median server-step seconds (``seconds``)
    and, for an algorithm that fails, its error (``errors``), the other algorithms going on;
    with ``loops``, the loop transcriptions of FedFV and FedMGDA+ on the same round."""
    data = FederatedDataModule(source="mnist5k", num_clients=100, partition="iid", test_mode="local", seed=0)
    data.setup("fit")
    data.to(device)
    results = []
    for size in sizes:
        for m in clients:
            cell: dict = {"d": size, "m": m, "seconds": {}, "errors": {}}
            payload = None
            for name in algorithms:
                if name not in ALGORITHMS:
                    cell["errors"][name] = f"unknown algorithm {name!r}; valid: {', '.join(ALGORITHMS)}"
                    continue
                if name in FULL_PARTICIPATION and m != data.num_clients:
                    continue
                try:
                    module = build(name, ALGORITHMS[name], size, m, data).to(device)
                    generator = torch.Generator().manual_seed(0)
                    with torch.no_grad():
                        server_step(module, random_round(module, data, m, 0, generator, device))  # warm-up
                        payload = random_round(module, data, m, 1, generator, device)
                        seconds = time_call(partial(server_step, module, payload), repeats, device)
                except Exception as error:  # recorded; the other algorithms go on
                    cell["errors"][name] = f"{type(error).__name__}: {error}"
                    print(f"d={size} m={m:3d} {name:12s} ERROR {cell['errors'][name]}", flush=True)
                    continue
                cell["seconds"][name] = seconds
                cell["num_parameters"] = module.num_parameters
                print(f"d={size} m={m:3d} {name:12s} {seconds * 1000:9.1f} ms", flush=True)
            if loops and payload is not None:
                add_loop_transcriptions(cell, payload, m, repeats, device)
            results.append(cell)
    return results


def add_loop_transcriptions(cell: dict, payload: RoundPayload, m: int, repeats: int, device: torch.device) -> None:
    """Times the loop transcriptions of FedFV's and FedMGDA+'s server steps on the
    cell's round (after a FedFV step that fills its history) into ``cell["seconds"]``,
    with the modules' speed-ups over the loops and FedLF's time over FedMGDA+'s."""
    grads = list(payload.updates.unbind(0))
    losses = payload.losses.tolist()
    history: dict = {}
    last: dict = {}
    fedfv_server_step_loop(grads, losses, 0.1, history, last, list(range(m)), 9, 10)
    cell["seconds"]["FedFV (loop transcription)"] = time_call(
        partial(fedfv_server_step_loop, grads, losses, 0.1, history, last, list(range(m)), 10, 10),
        repeats, device)
    cell["seconds"]["FedMGDA+ (loop transcription)"] = time_call(
        partial(fedmgda_plus_server_step_loop, grads, payload.num_samples.tolist(), 0.1, 1.0),
        repeats, device)
    for key in ("FedFV (loop transcription)", "FedMGDA+ (loop transcription)"):
        print(f"d={cell['d']} m={m:3d} {key:30s} {cell['seconds'][key] * 1000:9.1f} ms", flush=True)
    seconds = cell["seconds"]
    if "FedFV" in seconds:
        cell["fedfv_speedup_over_loop"] = seconds["FedFV (loop transcription)"] / seconds["FedFV"]
    if "FedMGDAPlus" in seconds:
        cell["fedmgda_plus_speedup_over_loop"] = seconds["FedMGDA+ (loop transcription)"] / seconds["FedMGDAPlus"]
        if "FedLF" in seconds:
            cell["fedlf_over_fedmgda_plus"] = seconds["FedLF"] / seconds["FedMGDAPlus"]


def main(argv: list[str] | None = None) -> None:
    """Times every algorithm's server step for each model size and client count (and the loop transcriptions
    unless ``--no-loops``) and writes the report, with the machine and the algorithms' defaults, to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--sizes", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), help="names from ALGORITHMS")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--no-loops", action="store_true", help="skip the loop transcriptions")
    parser.add_argument("--out", default="benchmarks/perf/results/aggregation_cpu.json")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    results = measure(args.sizes, args.clients, args.algorithms, args.repeats, device, loops=not args.no_loops)
    report = {
        "benchmark": "aggregation",
        "machine": describe_machine(device),
        "settings": "median of --repeats server steps (aggregate + on_round_end) after one warm-up round; "
                    "FedFV alpha=0.1 tau=10 in both the module (its defaults) and the loop",
        "algorithm_defaults": {name: str(inspect.signature(cls.__init__)) for name, cls in ALGORITHMS.items()},
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
