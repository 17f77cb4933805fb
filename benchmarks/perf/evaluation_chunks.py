"""Evaluation chunks sized by the model's activations against one chunk of everything, in one process.

The two evaluations of the claims ledger's slowest row (CGSV Table 2 with the McMahan MNIST CNN:
10 agents of 138 samples, a shared test set of 1,000): every agent's training loss under the shared
model before a round (``evaluate_clients``: 1,380 rows) and every agent's own model on the shared
test set (``evaluate_clients_stacked``: 10 models x 1,000 rows, vmap). ``chunked`` is the library's
default (chunks whose activations stay within ``ACTIVATION_BUDGET_BYTES``); ``whole`` sets the
budget so large that a chunk is 8,192 rows and a vmap pass one forward, as before the budget. The
pair alternates ``--pairs`` times; both must give the same bits (checked), and the ratio
whole / chunked is reported per pair with its median. One torch thread, as a fit uses.

    python -m benchmarks.perf.evaluation_chunks [--pairs 3] [--label after] [--out results/evaluation_chunks_cpu.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.perf.machine import describe_machine
from fl_lightning.core import evaluation
from fl_lightning.core.evaluation import evaluate_clients, evaluate_clients_stacked
from fl_lightning.core.flat import ParameterLayout, model_vector
from fl_lightning.models import create_fl_model


def cases() -> dict:
    """The two evaluations of the ledger's slowest row, by name, on seeded random MNIST-shaped data with the McMahan
    MNIST CNN: 10 clients' training losses (138 samples each) and 10 agents' models on a shared test set of 1,000."""
    generator = torch.Generator().manual_seed(0)
    model = create_fl_model("fl_cnn_mnist", 10, (1, 28, 28))
    layout = ParameterLayout.of(model)
    x, y = torch.randn(1380, 1, 28, 28, generator=generator), torch.randint(0, 10, (1380,), generator=generator)
    test_x = torch.randn(1000, 1, 28, 28, generator=generator)
    test_y = torch.randint(0, 10, (1000,), generator=generator)
    params = torch.stack([model_vector(model, layout) * (1 + 0.01 * k) for k in range(10)])
    return {
        "training_loss_before_round": lambda: evaluate_clients(
            model, x, y, torch.arange(1380).view(10, 138), torch.full((10,), 138)),
        "agents_on_shared_test": lambda: evaluate_clients_stacked(
            model, layout, params, test_x, test_y, torch.arange(1000).expand(10, 1000), torch.full((10,), 1000)),
    }


def seconds(run) -> tuple[float, tuple]:
    started = time.perf_counter()
    out = run()
    return time.perf_counter() - started, out


def main(argv: list[str] | None = None) -> int:
    """Times each case chunked and whole, alternating ``--pairs`` times, exits when the two differ, and appends
    the pairs and their median whole / chunked ratio (under ``--label``) to ``--out`` when given; returns 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--label", default="after")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    budget = evaluation.ACTIVATION_BUDGET_BYTES
    for name, run in cases().items():
        run()  # warm-up (and the activation probe)
        ratios, pairs = [], []
        for _ in range(args.pairs):
            chunked, a = seconds(run)
            evaluation.ACTIVATION_BUDGET_BYTES = 2**40
            try:
                whole, b = seconds(run)
            finally:
                evaluation.ACTIVATION_BUDGET_BYTES = budget
            if not all(torch.equal(p.nan_to_num(-1), q.nan_to_num(-1)) for p, q in zip(a, b)):
                raise SystemExit(f"{name}: the chunked evaluation differs from the whole one")
            pairs.append({"chunked_s": chunked, "whole_s": whole})
            ratios.append(whole / chunked)
            print(f"{name}: whole {whole:.2f}s chunked {chunked:.2f}s  x{whole / chunked:.2f}", flush=True)
        results.append({"case": name, "pairs": pairs, "whole_over_chunked_median": statistics.median(ratios)})
    entry = {"label": args.label, "machine": describe_machine(torch.device("cpu")), "results": results}
    if args.out is not None:
        existing = json.loads(args.out.read_text()) if args.out.exists() else {"benchmark": "evaluation_chunks",
                                                                                 "measurements": []}
        existing["measurements"].append(entry)
        args.out.write_text(json.dumps(existing, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
