"""FedLF's per-layer QPs (Pan et al., AAAI 2024, App. A.1, Problem (3)): the batched solver with
finished problems dropped from the batch, against the same solver keeping them (the solver before
the change, same answers to the bit), on the Grams of a real FedLF server step.

One FedLF server step of the aggregation benchmark's random round (NF-ResNet-18 in the FedLF
code's layout, 100 clients by default) is run once to record the Grams its layer QPs solve;
then, in the same process, each recorded batch is solved ``--repeats`` times both ways,
alternating, and the medians, their ratio, the iteration counts and a bit-for-bit comparison are
written to the results file.

    python -m benchmarks.perf.layer_qps [--device cpu] [--size nf_resnet18_fedlf] [--clients 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path

import torch

import fl_lightning.algorithms.fedlf as fedlf
from benchmarks.perf.aggregation import MODELS, build, random_round, server_step
from benchmarks.perf.machine import describe_machine
from fl_lightning.algorithms import ALGORITHMS
from fl_lightning.algorithms.qp.torch_solver import _accelerated_projected_gradient
from fl_lightning.data.datamodule import FederatedDataModule


def recorded_grams(size: str, m: int, device: torch.device) -> tuple[list[torch.Tensor], float]:
    """The Gram batches one FedLF server step solves (after a warm-up step), and that step's seconds."""
    data = FederatedDataModule(source="mnist5k", num_clients=100, partition="iid", seed=0)
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


def timed_solve(grams: torch.Tensor, drop_finished: bool) -> tuple[float, object]:
    synchronize(grams.device)
    start = time.perf_counter()
    solve = _accelerated_projected_gradient(grams, drop_finished=drop_finished)
    synchronize(grams.device)
    return time.perf_counter() - start, solve


def compare(grams: torch.Tensor, repeats: int) -> dict:
    """Both ways, alternating, ``repeats`` times: medians, ratio, iterations, bit-for-bit."""
    kept_times, dropped_times = [], []
    for _ in range(repeats):
        seconds, kept = timed_solve(grams, drop_finished=False)
        kept_times.append(seconds)
        seconds, dropped = timed_solve(grams, drop_finished=True)
        dropped_times.append(seconds)
    alone = [_accelerated_projected_gradient(gram[None].cpu()).iterations for gram in grams]  # counted on the CPU
    extra = {}
    if grams.device.type != "cpu":  # the same batch solved on the host, transfers included
        host_times = []
        for _ in range(repeats):
            synchronize(grams.device)
            start = time.perf_counter()
            _accelerated_projected_gradient(grams.cpu()).weights.to(grams.device)
            synchronize(grams.device)
            host_times.append(time.perf_counter() - start)
        extra["seconds_on_host_cpu_dropping_finished"] = statistics.median(host_times)
    return {**extra,
        "problems": grams.shape[0],
        "n": grams.shape[-1],
        "seconds_keeping_finished": statistics.median(kept_times),
        "seconds_dropping_finished": statistics.median(dropped_times),
        "speedup": statistics.median(kept_times) / statistics.median(dropped_times),
        "iterations": dropped.iterations,
        "iterations_per_problem_alone_on_cpu": sorted(alone),
        "problem_iterations_total": sum(alone),
        "identical_weights": bool(torch.equal(kept.weights, dropped.weights)),
        "identical_gaps": bool(torch.equal(kept.gap, dropped.gap)),
    }


def profile_iterations(grams: torch.Tensor, iterations: int, rows: int = 20) -> str:
    """torch.profiler's table over the first ``iterations`` iterations of one batch (a whole
    solve has too many events for the profiler to report in reasonable time on a GPU)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if grams.device.type == "cuda" else [])
    _accelerated_projected_gradient(grams, max_iter=iterations)  # warm-up
    with profile(activities=activities) as prof:
        _accelerated_projected_gradient(grams, max_iter=iterations)
        synchronize(grams.device)
    key = "device_time_total" if grams.device.type == "cuda" else "cpu_time_total"
    return (f"## {grams.shape[0]} layer QPs of n={grams.shape[-1]}, first {iterations} iterations, {grams.device}\n"
            + prof.key_averages().table(sort_by=key, row_limit=rows) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="nf_resnet18_fedlf", choices=list(MODELS))
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="default: benchmarks/perf/results/layer_qps_<device>.json")
    parser.add_argument("--profile", type=Path, help="also profile 20 iterations of the largest batch into this file")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    batches, step_seconds = recorded_grams(args.size, args.clients, device)
    print(f"FedLF server step, {args.size}, m={args.clients}, {device}: {step_seconds:.3f} s "
          f"({len(batches)} QP batches)", flush=True)
    results = []
    for grams in batches:
        result = compare(grams, args.repeats)
        results.append(result)
        print(
            f"  {result['problems']:3d} QPs of n={result['n']}: "
            f"keeping finished {result['seconds_keeping_finished']:.3f} s, "
            f"dropping them {result['seconds_dropping_finished']:.3f} s ({result['speedup']:.2f}x), "
            f"{result['iterations']} iterations, identical: {result['identical_weights'] and result['identical_gaps']}"
            + (
                f", on the host CPU {result['seconds_on_host_cpu_dropping_finished']:.3f} s"
                if "seconds_on_host_cpu_dropping_finished" in result
                else ""
            ),
            flush=True,
        )
    if args.profile:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # 20 iterations do not converge
            args.profile.write_text(profile_iterations(max(batches, key=len), 20))
        print(f"wrote {args.profile}")
    report = {
        "benchmark": "layer_qps",
        "machine": describe_machine(device),
        "settings": f"FedLF defaults, {args.size}, {args.clients} clients of 100, mnist5k iid, the aggregation "
                    f"benchmark's random round 1 after a warm-up round; medians of {args.repeats} alternating solves",
        "server_step_seconds": step_seconds,
        "batches": results,
    }
    out = args.out or Path(f"benchmarks/perf/results/layer_qps_{device.type}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".json.partial")
    partial.write_text(json.dumps(report, indent=2))
    partial.replace(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
