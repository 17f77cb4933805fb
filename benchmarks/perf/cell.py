"""One cell of the performance suite, timed in the calling process: seconds per round of one
(model, clients, engine[, algorithm, participation]).

A cell builds ``clients`` clients of ``samples_per_client`` samples each
(``benchmarks.perf.data``), a module of ``algorithm`` (FedAvg by default, with full
participation so all ``clients`` train every round), and fits ``warmup + rounds`` rounds with
Lightning; a round is timed from the start to the end of its Lightning epoch (sampling, the
clients' loss before training, local training, aggregation, the server step). The median of
the rounds after the warm-up is the cell's seconds per round. ``round_throughput`` runs a cell
in a process of its own; ``run_cell_here`` in this one.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time

import lightning.pytorch as pl
import torch

from benchmarks.perf.data import IMAGE_SHAPE, RandomImageData, clients_for
from benchmarks.perf.machine import proc_kib_as_mib
from fl_lightning.algorithms import ALGORITHMS
from fl_lightning.core.engines import is_out_of_memory
from fl_lightning.core.simulation import clients_per_round
from fl_lightning.records.vocabulary import Metric

# a throughput cell's settings where its spec (round_throughput.run_cell) leaves them out
CELL_DEFAULTS = {
    "rounds": 3,  # timed rounds (the median is reported)
    "warmup": 1,  # untimed rounds first: allocations, the first vmap trace
    "samples_per_client": 20,
    "batch_size": 10,
    "local_epochs": 1,
    "lr": 0.05,
    "device": "cpu",
    "seed": 0,
    "threads": None,  # torch.set_num_threads in the cell's process (None: PyTorch's default)
    "max_timed_seconds": 120.0,  # stop timing (after at least one timed round) once this is spent
    "options": {},  # extra FederatedModule arguments, e.g. {"local_autocast": "bf16"}
    "algorithm": "FedAvg",  # a name from fl_lightning.algorithms.ALGORITHMS
    "fraction": 1.0,  # clients sampled per round, of `clients`
    "num_classes": None,  # None: the model's offline source; a number: random 3x32x32 images with that many classes
}


class RoundTimer(pl.Callback):
    """Wall-clock seconds of every round (= Lightning epoch), device work included, and
    the module's own split of it into local training and server time.

    Once ``warmup`` rounds have run and the timed rounds have taken ``max_timed_seconds``
    (at least one timed round), the fit stops: slow cells time fewer rounds."""

    def __init__(self, warmup: int = 0, max_timed_seconds: float = float("inf")) -> None:
        self.warmup = warmup
        self.max_timed_seconds = max_timed_seconds
        self.seconds: list[float] = []
        self.client_seconds: list[float] = []
        self.server_seconds: list[float] = []

    def _sync(self, module: pl.LightningModule) -> None:
        if module.device.type == "cuda":
            torch.cuda.synchronize(module.device)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._sync(pl_module)
        self._start = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        """Records the round's wall-clock seconds (device synchronised) and the module's client and
        server seconds; stops the fit once the timed rounds have taken ``max_timed_seconds``."""
        self._sync(pl_module)
        self.seconds.append(time.perf_counter() - self._start)
        metrics = trainer.callback_metrics
        for key, store in ((Metric.CLIENT_TIME_S, self.client_seconds), (Metric.SERVER_TIME_S, self.server_seconds)):
            if key in metrics:
                store.append(float(metrics[key]))
        timed = self.seconds[self.warmup:]
        if timed and sum(timed) >= self.max_timed_seconds:
            trainer.should_stop = True


def rss_mib() -> float | None:
    """The resident set size of this process now (Linux), MiB."""
    return proc_kib_as_mib("/proc/self/status", "VmRSS:")


def peak_rss_mib() -> float:
    """The peak resident set size of this process so far, MiB (ru_maxrss: KiB on Linux,
    bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def run_cell(spec: dict) -> dict:
    """Time one cell in this process; ``spec`` has ``model``, ``clients``, ``engine`` and
    any of ``CELL_DEFAULTS``. Returns the cell's entry (raises on failure)."""
    spec = {**CELL_DEFAULTS, **spec}
    device = torch.device(spec["device"])
    if spec["threads"] is not None:
        torch.set_num_threads(spec["threads"])
    if spec["num_classes"] is None:
        data = clients_for(spec["model"], spec["clients"], spec["samples_per_client"], spec["seed"])
    else:  # a paper's shape: random images of IMAGE_SHAPE with the paper's number of classes
        data = RandomImageData(spec["clients"], spec["samples_per_client"], IMAGE_SHAPE, spec["num_classes"],
                               spec["seed"])
        data.setup("fit")
    module = ALGORITHMS[spec["algorithm"]](
        backbone=spec["model"], num_classes=data.num_classes, input_shape=data.input_shape,
        num_rounds=spec["warmup"] + spec["rounds"], fraction=spec["fraction"], local_epochs=spec["local_epochs"],
        batch_size=spec["batch_size"], lr=spec["lr"], engine=spec["engine"], eval_every=10**9,
        seed=spec["seed"], threads=spec["threads"] or torch.get_num_threads(), **spec["options"],
    )
    timer = RoundTimer(spec["warmup"], spec["max_timed_seconds"])
    trainer = pl.Trainer(
        accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0, max_epochs=spec["warmup"] + spec["rounds"], callbacks=[timer],
    )
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    setup_rss = rss_mib()
    trainer.fit(module, datamodule=data)

    timed = timer.seconds[spec["warmup"]:]
    if not timed:
        raise RuntimeError(f"no timed round: {len(timer.seconds)} rounds ran, warmup={spec['warmup']}")
    seconds = statistics.median(timed)
    # every client holds samples_per_client samples: a round trains m of them
    samples_per_round = (clients_per_round(spec["clients"], spec["fraction"]) * spec["samples_per_client"]
                         * spec["local_epochs"])
    entry = {
        "num_parameters": module.num_parameters,
        "torch_threads": torch.get_num_threads(),
        "engine_used": module.round_engine.runner.engine_used,
        "chunk_size": getattr(module, "last_chunk_size", None),
        "oom_retries": getattr(module, "oom_retries", None),
        "rounds_timed": len(timed),
        "seconds_per_round": seconds,
        "seconds_per_round_all": timed,
        "warmup_seconds": timer.seconds[: spec["warmup"]],
        "client_samples_per_round": samples_per_round,
        "client_samples_per_second": samples_per_round / seconds,
        "local_training_seconds_per_round": median_or_none(timer.client_seconds[spec["warmup"]:]),
        "server_seconds_per_round": median_or_none(timer.server_seconds[spec["warmup"]:]),
    }
    if device.type == "cuda":
        entry |= {
            "peak_memory_mib": torch.cuda.max_memory_allocated(device) / 2**20,
            "peak_memory_kind": "cuda_max_memory_allocated",
        }
    else:
        peak = peak_rss_mib()
        entry |= {
            # the kernel's RSS counters are approximate: clamp a peak read just below the setup RSS
            "peak_memory_mib": max(0.0, peak - setup_rss) if setup_rss is not None else peak,
            "peak_memory_kind": "cpu_peak_rss_minus_setup_rss" if setup_rss is not None else "cpu_peak_rss",
            "peak_rss_mib": peak,
            "setup_rss_mib": setup_rss,
        }
    return entry


def run_cell_here(cell: dict) -> dict:
    """Runs one cell in this process (``--in-process``: no interpreter start per cell, for a
    short GPU lease); its entry, never raising. Peak GPU memory is still the cell's own (the
    peak is reset before each fit); a crash ends the suite, the partial results file stays."""
    spec = {key: value for key, value in cell.items() if key not in ("variant", "status", "error")}
    started = time.perf_counter()
    try:
        entry = {"status": "ok", **run_cell(spec)}
    except Exception as error:  # recorded, not raised: the suite goes on with the next cell
        entry = {"status": "out_of_memory" if is_out_of_memory(error) else "error",
                 "error": f"{type(error).__name__}: {error}"}
    finally:
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    entry["cell_seconds"] = time.perf_counter() - started
    return entry
