"""What a round through ``Trainer.fit`` costs beyond the engine's own round, in one process.

Synthetic(0.5, 0.5) with its natural partition of 100 clients, logistic regression, FedAvg,
E = 1, B = 10, lr 0.01, at 10 % and 100 % participation. Two ways, same process:

* ``fit``: a plain ``Trainer.fit`` (no logger, no checkpoints, no progress bar, no evaluation
  inside the timed rounds); a round is timed from the start to the end of its Lightning epoch
  (``benchmarks.perf.cell.RoundTimer``), after ``--warmup`` rounds.
* ``engine``: the engine's own round on the same module and the same rounds' clients: only
  ``EngineRunner.train_across_ranks`` (local training of the sampled clients from the global
  model), with the shards, the batch order and the SGD settings built beforehand, at the fit's
  own thread count (``threads``; its default ``auto`` is the cores the process is given).

The ratio ``fit / engine`` is what Lightning's loop, the callbacks, the clients' loss before
training, the server step and the round's bookkeeping add to the training itself.

    python -m benchmarks.perf.round_overhead [--rounds 40] [--label after] [--out results/round_overhead_cpu.json]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

import lightning.pytorch as pl
import torch

from benchmarks.perf.cell import RoundTimer
from benchmarks.perf.machine import append_measurement, describe_machine
from fl_lightning.algorithms import ALGORITHMS
from fl_lightning.core.local import batch_order
from fl_lightning.core.simulation import round_generator
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.records.vocabulary import Metric


def build(fraction: float, rounds: int):
    data = FederatedDataModule(source="synthetic", num_clients=100, partition="iid", test_mode="local", seed=0)
    module = ALGORITHMS["FedAvg"](backbone="fl_logreg", num_classes=10, input_shape=(60,), num_rounds=rounds,
                                  fraction=fraction, local_epochs=1, batch_size=10, lr=0.01, eval_every=10**9,
                                  seed=0)
    return data, module


def fit_rounds(fraction: float, rounds: int, warmup: int) -> tuple[list[float], list[float], object]:
    """Seconds of each timed round through Trainer.fit, the module's own client-time metric, the module."""
    data, module = build(fraction, warmup + rounds)
    timer = RoundTimer(warmup=warmup)
    trainer = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                         limit_val_batches=0, max_epochs=warmup + rounds, callbacks=[timer])
    trainer.fit(module, datamodule=data)
    return timer.seconds[warmup:], timer.client_seconds[warmup:], module


def engine_rounds(module, rounds: int, warmup: int) -> list[float]:
    """Seconds of the engine's own round for the same rounds' clients, from the fitted module
    (the engine's internals, called as the module calls them: what the round costs inside them)."""
    seconds = []
    torch.set_num_threads(module.fit_threads.threads)  # the fit's own count (the fit put the process's back)
    for t in range(warmup + rounds):
        context = module.round_context(t)
        shards = context.client_shards(module.sample_clients(context))
        sgd = replace(module.round_engine.local_sgd, lr=context.lr)
        order = batch_order(shards.sizes, shards.index.shape[1], sgd.epochs,
                            round_generator(module.hparams.seed, t, "shuffle"))
        start = context.global_params
        began = time.perf_counter()
        module.round_engine.runner.train_across_ranks(None, module.model, context.layout, shards, order, start, start,
                                                      sgd, module.client_objective)
        if t >= warmup:
            seconds.append(time.perf_counter() - began)
    return seconds


def main(argv: list[str] | None = None) -> int:
    """For each participation of ``--fractions``, times rounds through ``Trainer.fit`` and the engine's
    own rounds, and appends their medians and ratio (under ``--label``) to ``--out``; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="timed rounds per way (medians are reported)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.1, 1.0])
    parser.add_argument("--label", default=None)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/perf/results/round_overhead_cpu.json"))
    args = parser.parse_args(argv)
    results = []
    for fraction in args.fractions:
        fit, client, module = fit_rounds(fraction, args.rounds, args.warmup)
        engine = engine_rounds(module, args.rounds, args.warmup)
        entry = {
            "fraction": fraction,
            "fit_seconds_per_round": statistics.median(fit),
            "module_client_time_s": statistics.median(client),
            "engine_seconds_per_round": statistics.median(engine),
            "fit_over_engine": statistics.median(fit) / statistics.median(engine),
            "fit_threads": module.fit_threads.threads,
        }
        results.append(entry)
        print(f"fraction {fraction:.1f}: fit round {entry['fit_seconds_per_round'] * 1e3:.2f} ms, "
              f"engine round {entry['engine_seconds_per_round'] * 1e3:.2f} ms at {entry['fit_threads']} thread(s) "
              f"(fit / engine = {entry['fit_over_engine']:.2f}x; the module's {Metric.CLIENT_TIME_S} "
              f"{entry['module_client_time_s'] * 1e3:.2f} ms)", flush=True)
    measurement = {"label": args.label, "machine": describe_machine(torch.device("cpu")),
                   "torch_threads": torch.get_num_threads(), "rounds": args.rounds, "warmup": args.warmup,
                   "results": results}
    append_measurement(args.out, "round_overhead", measurement)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
