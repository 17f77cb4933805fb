"""What checkpoints cost a command-line fit: bytes on disk and seconds spent writing them.

Every case is one ``fl-lightning fit`` in a fresh process and an empty folder, under two
checkpoint policies:

* ``every_round``: Lightning's ``ModelCheckpoint`` with ``save_last=True``, the CLI's policy
  before issue 13 (the best ``epoch=N-step=N.ckpt`` and an identical ``last.ckpt``, both
  rewritten every round);
* ``round_checkpoint``: the CLI's default now, ``RoundCheckpoint`` (``last.ckpt`` only, every N
  rounds with N chosen from the cost of a write, and after the last round).

Client histories are stored compactly under both (``core.state``), so the difference between
the policies is the number of files and writes. Seconds are the time inside the checkpoint
file writer (``TorchCheckpointIO.save_checkpoint``) and inside Lightning's ``dump_checkpoint``
(which includes the in-memory checkpoints of rounds not written); the load average is recorded.

    python -m benchmarks.perf.checkpoint_cost                       # every case
    python -m benchmarks.perf.checkpoint_cost --cases fedfv_full main_job --out results/checkpoints_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fl_lightning.records.vocabulary import FRACTION

CASES: dict[str, list[str]] = {
    "fedfv_10pct": ["--model", "FedFV", "--model.num_rounds", "20", "--data.num_clients", "100"],
    "fedfv_full": ["--model", "FedFV", "--model.num_rounds", "20", "--data.num_clients", "100",
                   f"--model.{FRACTION}", "1.0"],
    "fedfv_10pct_bf16": ["--model", "FedFV", "--model.num_rounds", "20", "--data.num_clients", "100",
                         "--model.history_dtype", "bfloat16"],
    "main_job": [],  # the README's `fl-lightning fit`: FedAvg, 100 rounds, 10 of 100 clients
}
POLICIES: dict[str, list[str]] = {
    "every_round": ["--trainer.callbacks", "ModelCheckpoint", "--trainer.callbacks.save_last", "true"],
    "round_checkpoint": [],
}


def child(args: list[str]) -> None:
    """Runs one fit in this process with the checkpoint writer timed; prints one JSON line."""
    from lightning.pytorch.plugins.io import TorchCheckpointIO
    from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

    spent = {"write_s": 0.0, "writes": 0, "dump_s": 0.0, "dumps": 0}
    save, dump = TorchCheckpointIO.save_checkpoint, _CheckpointConnector.dump_checkpoint

    def timed_save(self, *a, **k):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        save(self, *a, **k)
        spent["write_s"] += time.perf_counter() - started
        spent["writes"] += 1

    def timed_dump(self, *a, **k):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        result = dump(self, *a, **k)
        spent["dump_s"] += time.perf_counter() - started
        spent["dumps"] += 1
        return result

    TorchCheckpointIO.save_checkpoint, _CheckpointConnector.dump_checkpoint = timed_save, timed_dump
    from fl_lightning.cli.lightning_cli import run

    started = time.perf_counter()
    run(["fit", *args])
    files = sorted(Path("checkpoints").rglob("*.ckpt"))
    print("RESULT " + json.dumps({
        **spent, "fit_wall_s": time.perf_counter() - started, "files": [p.name for p in files],
        "bytes_on_disk": sum(p.stat().st_size for p in files), "load_average": os.getloadavg()[0],
    }), flush=True)


def measure(case: str, policy: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="fl-ckpt-") as folder:
        command = [sys.executable, "-m", "benchmarks.perf.checkpoint_cost", "--child", *CASES[case], *POLICIES[policy]]
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
        lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
        if done.returncode != 0 or not lines:
            raise RuntimeError(f"{case}/{policy} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
        return {"case": case, "policy": policy, **json.loads(lines[-1][len("RESULT "):])}


def main(argv: list[str] | None = None) -> None:
    """Fits every case under every checkpoint policy, each in a fresh process,
    prints their writes, seconds and bytes on disk, and writes them with the machine
    to ``--out`` when given; ``--child`` runs one fit in this process instead."""
    if argv is None and sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    parser.add_argument("--policies", nargs="+", choices=sorted(POLICIES), default=list(POLICIES))
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    options = parser.parse_args(argv)
    results = []
    for case in options.cases:
        for policy in options.policies:
            result = measure(case, policy)
            results.append(result)
            print(f"{case:18s} {policy:17s} {result['writes']:4d} writes {result['write_s']:6.2f} s writing "
                  f"{result['dump_s']:5.2f} s dumping  {result['bytes_on_disk'] / 1e6:7.1f} MB on disk  "
                  f"fit {result['fit_wall_s']:6.1f} s  load {result['load_average']:.2f}", flush=True)
    if options.out is not None:
        import torch

        from benchmarks.perf.machine import describe_machine

        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(json.dumps({"machine": describe_machine(torch.device("cpu")), "results": results},
                                          indent=2))


if __name__ == "__main__":
    main()
