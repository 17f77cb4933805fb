"""One paper-scale-shaped round per paper, timed: the paper's algorithm, model, clients,
participation, batch size and samples per client, on seeded random tensors of the real
shapes (3x32x32 images; CIFAR-10/100 files are not offline here, and timing does not depend
on pixel values).

    python -m benchmarks.perf.paper_cells --device cuda [--rounds 3] [--out results/paper_cells_cuda.json]

Cells (``PAPER_CELLS``), each from the paper's own setting (and our ``benchmarks/<paper>/paper.yaml``):

* FedFV (Wang et al., IJCAI 2021, Sec. 5): CIFAR-10, 100 clients, 10% sampled, the
  2x200 feed-forward net, full batch, E=1, lr 0.1; 400 training samples per client (500 x 0.8).
* FedMGDA+ (Hu et al., IEEE TNSE 2022, Sec. 6): CIFAR-10, 100 clients, p=0.1, b=10, the CNN of
  its Table 2, E=1, lr 0.01; 400 samples per client.
* FedLF (Pan et al., FedLF appendix B): CIFAR-100, 100 clients, 10% online, batch 50, E=1,
  NF-ResNet-18 in the FedLF code's layout, lr 0.05; 500 samples per client (60,000 x 0.8333 / 100).
* CGSV (Xu et al., NeurIPS 2021, Table 4): CIFAR-10, 10 agents, all participate, B=128, the
  3-layer CNN, lr 0.025; 2,000 samples per agent (total 20,000).

Each entry is ``cell.run_cell``'s (seconds per round, the module's own split into
local training and server, peak memory) with the cell's name and paper.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from benchmarks.perf.cell import CELL_DEFAULTS, run_cell_here
from benchmarks.perf.machine import describe_machine
from benchmarks.perf.suite import write_report

RESULTS_DIR = Path(__file__).resolve().parent / "results"

PAPER_CELLS: dict[str, dict] = {
    "fedfv_cifar10": dict(paper="FedFV (Wang et al., IJCAI 2021)", algorithm="FedFV", model="fl_ffn",
                          clients=100, fraction=0.1, samples_per_client=400, batch_size=None, lr=0.1,
                          num_classes=10),
    "fedmgda_plus_cifar10": dict(paper="FedMGDA+ (Hu et al., IEEE TNSE 2022)", algorithm="FedMGDAPlus",
                                 model="fl_cnn_cifar", clients=100, fraction=0.1, samples_per_client=400,
                                 batch_size=10, lr=0.01, num_classes=10),
    "fedlf_cifar100": dict(paper="FedLF (Pan et al.)", algorithm="FedLF", model="fl_nf_resnet18_fedlf",
                           clients=100, fraction=0.1, samples_per_client=500, batch_size=50, lr=0.05,
                           num_classes=100),
    "cgsv_cifar10": dict(paper="CGSV (Xu et al., NeurIPS 2021)", algorithm="CGSV", model="fl_cnn_cifar",
                         clients=10, fraction=1.0, samples_per_client=2000, batch_size=128, lr=0.025,
                         num_classes=10),
}


def seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:.4f} s"


def main(argv: list[str] | None = None) -> int:
    """Times the rounds of each ``--cells`` cell in this process and writes
    the report to ``--out`` after every cell; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", default=list(PAPER_CELLS), choices=list(PAPER_CELLS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    parser.add_argument("--engine", default="vectorised", choices=["vectorised", "sequential"])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (the median is kept)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--out", type=Path, help="results file (default results/paper_cells_<device>.json)")
    args = parser.parse_args(argv)
    out = args.out or RESULTS_DIR / f"paper_cells_{args.device}.json"
    report: dict = {"benchmark": "paper_cells", "machine": describe_machine(torch.device(args.device)),
                    "settings": {"engine": args.engine, "rounds_timed": args.rounds, "warmup_rounds": args.warmup,
                                 "data": "seeded N(0, 1) 3x32x32 images, uniform labels"},
                    "cells": []}
    started = time.perf_counter()
    for name in args.cells:
        cell = {**CELL_DEFAULTS, **PAPER_CELLS[name], "name": name, "device": args.device, "engine": args.engine,
                "rounds": args.rounds, "warmup": args.warmup, "variant": None}
        spec = {key: value for key, value in cell.items() if key not in ("name", "paper")}
        cell |= run_cell_here(spec)
        shown = (f"{cell['seconds_per_round']:.3f} s/round (local {seconds(cell['local_training_seconds_per_round'])}, "
                 f"server {seconds(cell['server_seconds_per_round'])}), peak {cell['peak_memory_mib']:.0f} MiB"
                 if cell["status"] == "ok" else f"{cell['status']}: {cell['error']}")
        print(f"{name:22s} {shown}", flush=True)
        report["cells"].append(cell)
        write_report(out, report)
    report["wall_seconds"] = time.perf_counter() - started
    write_report(out, report)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
