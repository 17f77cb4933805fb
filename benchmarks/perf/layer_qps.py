"""FedLF's per-layer QPs (Pan et al., AAAI 2024, App. A.1, Problem (3)): the batched interior-point
solver (issue 49, ``qp.interior_point``) against the FISTA solver before it
(``qp.torch_solver._accelerated_projected_gradient``), on the Grams of a real FedLF server step.

One FedLF server step of the aggregation benchmark's random round (NF-ResNet-18 in the FedLF
code's layout, 100 clients by default) is run once to record the Grams its layer QPs solve;
then, in the same process, each recorded batch is solved ``--repeats`` times both ways,
alternating, and the medians, their ratio, the iteration counts (of the batch, and of each
problem solved alone), the largest certified gap of each and how far the weights differ are
written to the results file, with the machine's load average before and after (the machine may
be shared). An earlier results file's content is kept under "before".

    python -m benchmarks.perf.layer_qps [--device cpu] [--size nf_resnet18_fedlf] [--clients 100] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

import fl_lightning.algorithms.fedlf as fedlf
from benchmarks.perf.aggregation import MODELS, build, random_round, server_step
from benchmarks.perf.machine import describe_machine
from fl_lightning.algorithms import ALGORITHMS
from fl_lightning.algorithms.qp.interior_point import _interior_point, _solve_batch
from fl_lightning.algorithms.qp.problem import _DEFAULT_MAX_ITER, _DEFAULT_TOL
from fl_lightning.algorithms.qp.torch_solver import _accelerated_projected_gradient, _TorchSolve
from fl_lightning.data.datamodule import FederatedDataModule

SOLVERS: dict[str, Callable[[torch.Tensor], _TorchSolve]] = {
    "interior_point": lambda grams: _solve_batch(grams, _DEFAULT_MAX_ITER, _DEFAULT_TOL),  # solve_min_norm_batch's
    "fista": lambda grams: _accelerated_projected_gradient(grams),  # the solver before issue 49
}


def recorded_grams(size: str, m: int, device: torch.device) -> tuple[list[torch.Tensor], float]:
    """The Gram batches one FedLF server step solves (after a warm-up step), and that step's seconds."""
    data = FederatedDataModule(source="mnist5k", num_clients=100, partition="iid", test_mode="local", seed=0)
    data.setup("fit")
    data.to(device)
    module = build("FedLF", ALGORITHMS["FedLF"], size, m, data).to(device)
    generator = torch.Generator().manual_seed(0)
    batches: list[torch.Tensor] = []
    solver = fedlf.solve_min_norm_batch

    def recording(grams: torch.Tensor, *args, **kwargs):
        batches.append(grams.detach().clone())
        return solver(grams, *args, **kwargs)

    with torch.no_grad():
        server_step(module, random_round(module, data, m, 0, generator, device))
        payload = random_round(module, data, m, 1, generator, device)
        fedlf.solve_min_norm_batch = recording
        try:
            synchronize(device)
            start = time.perf_counter()
            server_step(module, payload)
            synchronize(device)
            seconds = time.perf_counter() - start
        finally:
            fedlf.solve_min_norm_batch = solver
    return batches, seconds


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_solve(grams: torch.Tensor, solver: str) -> tuple[float, _TorchSolve]:
    synchronize(grams.device)
    start = time.perf_counter()
    solve = SOLVERS[solver](grams)
    synchronize(grams.device)
    return time.perf_counter() - start, solve


def compare(grams: torch.Tensor, repeats: int) -> dict:
    """Both solvers, alternating, ``repeats`` times: medians, ratio, iterations, gaps, weights."""
    times: dict[str, list[float]] = {name: [] for name in SOLVERS}
    solves: dict[str, _TorchSolve] = {}
    for _ in range(repeats):
        for name in SOLVERS:
            seconds, solves[name] = timed_solve(grams, name)
            times[name].append(seconds)
    new, old = solves["interior_point"], solves["fista"]
    scaled = grams.double() / grams.double().abs().amax(dim=(-1, -2), keepdim=True)
    objective = torch.einsum("bi,bij,bj->b", old.weights.double(), scaled, old.weights.double())
    unique = objective > _DEFAULT_TOL  # min norm > 0: away from Pareto-stationary layers, whose optimum is a set
    difference = (new.weights - old.weights).abs().amax(-1)
    alone = {  # counted on the CPU
        "interior_point": [_interior_point(gram[None].cpu()).iterations for gram in grams],
        "fista": [_accelerated_projected_gradient(gram[None].cpu()).iterations for gram in grams],
    }
    medians = {name: statistics.median(values) for name, values in times.items()}
    return {
        "problems": grams.shape[0],
        "n": grams.shape[-1],
        "seconds_interior_point": medians["interior_point"],
        "seconds_fista": medians["fista"],
        "speedup": medians["fista"] / medians["interior_point"],
        "seconds_each": times,
        "iterations_interior_point": new.iterations,
        "iterations_fista": old.iterations,
        "iterations_per_problem_alone_interior_point": sorted(alone["interior_point"]),
        "iterations_per_problem_alone_fista": sorted(alone["fista"]),
        "largest_gap_interior_point": float(new.gap.max()),
        "largest_gap_fista": float(old.gap.max()),
        "uncertified_interior_point": int((new.gap > _DEFAULT_TOL).sum()),
        "uncertified_fista": int((old.gap > _DEFAULT_TOL).sum()),
        "max_abs_weight_difference": float(difference.max()),
        "problems_with_min_norm_above_tol": int(unique.sum()),
        "max_abs_weight_difference_there": float(difference[unique].max()) if bool(unique.any()) else 0.0,
    }


def profile_solve(grams: torch.Tensor, rows: int = 20) -> str:
    """torch.profiler's table over one whole interior-point solve of one batch."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if grams.device.type == "cuda" else [])
    SOLVERS["interior_point"](grams)  # warm-up
    with profile(activities=activities) as prof:
        solve = SOLVERS["interior_point"](grams)
        synchronize(grams.device)
    key = "device_time_total" if grams.device.type == "cuda" else "cpu_time_total"
    return (f"## {grams.shape[0]} layer QPs of n={grams.shape[-1]}, the whole interior-point solve "
            f"({solve.iterations} iterations), {grams.device}, load average {os.getloadavg()}\n"
            + prof.key_averages().table(sort_by=key, row_limit=rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    """Records the layer QPs of one FedLF server step, solves each batch both ways ``--repeats``
    times, and writes the timings, iterations, gaps and weight differences (an earlier file's
    content kept under "before") to ``--out``; ``--profile`` also profiles one solve. Returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="nf_resnet18_fedlf", choices=list(MODELS))
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="default: benchmarks/perf/results/layer_qps_<device>.json")
    parser.add_argument("--profile", type=Path,
                        help="also profile one interior-point solve of the largest batch into this file")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    batches, step_seconds = recorded_grams(args.size, args.clients, device)
    print(f"FedLF server step, {args.size}, m={args.clients}, {device}: {step_seconds:.3f} s "
          f"({len(batches)} QP batches)", flush=True)
    load_before = os.getloadavg()
    results = []
    for grams in batches:
        result = compare(grams, args.repeats)
        results.append(result)
        print(
            f"  {result['problems']:3d} QPs of n={result['n']}: "
            f"interior point {result['seconds_interior_point'] * 1e3:.1f} ms "
            f"({result['iterations_interior_point']} iterations, "
            f"largest gap {result['largest_gap_interior_point']:.1e}), "
            f"FISTA {result['seconds_fista'] * 1e3:.1f} ms "
            f"({result['iterations_fista']} iterations, largest gap {result['largest_gap_fista']:.1e}): "
            f"{result['speedup']:.1f}x; weights differ by {result['max_abs_weight_difference']:.1e} "
            f"({result['max_abs_weight_difference_there']:.1e} where the min norm is above tol)",
            flush=True,
        )
    load_after = os.getloadavg()
    print(f"load average {load_before} before, {load_after} after")
    if args.profile:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            args.profile.write_text(profile_solve(max(batches, key=len)))
        print(f"wrote {args.profile}")
    out = args.out or Path(f"benchmarks/perf/results/layer_qps_{device.type}.json")
    report = {
        "benchmark": "layer_qps",
        "machine": describe_machine(device),
        "load_average_before": list(load_before),
        "load_average_after": list(load_after),
        "settings": f"FedLF defaults, {args.size}, {args.clients} clients of 100, mnist5k iid, the aggregation "
                    f"benchmark's random round 1 after a warm-up round; medians of {args.repeats} alternating solves "
                    f"(interior point, then FISTA), tol {_DEFAULT_TOL:g} of max|G|, max_iter {_DEFAULT_MAX_ITER}",
        "server_step_seconds": step_seconds,
        "batches": results,
    }
    if out.exists():  # keep the file's content from before issue 49 (FISTA, keeping vs dropping finished problems)
        previous = json.loads(out.read_text())
        report["before"] = previous.get("before", previous)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".json.partial")
    partial.write_text(json.dumps(report, indent=2))
    partial.replace(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
