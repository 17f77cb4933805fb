"""Where a server step's time goes: ``torch.profiler`` over one step of each named algorithm
(after a warm-up step), on the aggregation benchmark's random round.

    python -m benchmarks.perf.profile_server --device cuda [--algorithms FedFV FedLF] [--size nf_resnet18]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.perf.aggregation import MODELS, build, random_round, server_step
from fl_lightning.algorithms import ALGORITHMS
from fl_lightning.data.datamodule import FederatedDataModule


def profile_step(name: str, size: str, m: int, device: torch.device, rows: int) -> str:
    """One server step of algorithm ``name`` (model ``size``, ``m`` mnist5k clients) profiled after
    a warm-up step: its ``rows`` most expensive operations, as a table under a ``##`` heading."""
    data = FederatedDataModule(source="mnist5k", num_clients=100, partition="iid", test_mode="local", seed=0)
    data.setup("fit")
    data.to(device)
    module = build(name, ALGORITHMS[name], size, m, data).to(device)
    generator = torch.Generator().manual_seed(0)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.no_grad():
        server_step(module, random_round(module, data, m, 0, generator, device))  # warm-up
        payload = random_round(module, data, m, 1, generator, device)
        with profile(activities=activities) as prof:
            server_step(module, payload)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
    key = "device_time_total" if device.type == "cuda" else "cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=rows)
    return f"## {name}, d={size} ({module.num_parameters:,} parameters), m={m}, {device}\n{table}\n"


def main(argv: list[str] | None = None) -> int:
    """Prints the profile of each ``--algorithms`` server step, and writes
    the tables to ``--out`` when given; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", nargs="+", default=["FedFV", "FedLF", "FedMGDAPlus"], choices=list(ALGORITHMS))
    parser.add_argument("--size", default="nf_resnet18", choices=list(MODELS))
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--rows", type=int, default=15)
    parser.add_argument("--out", type=Path, help="also write the tables here")
    args = parser.parse_args(argv)
    text = "".join(profile_step(name, args.size, args.clients, torch.device(args.device), args.rows)
                   for name in args.algorithms)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
