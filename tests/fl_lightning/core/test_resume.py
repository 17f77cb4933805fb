"""Exact resume: a run killed after round 2 and resumed from its Lightning checkpoint ends
bit for bit where the uninterrupted run ends (every algorithm, on the CPU).

The uninterrupted run saves a checkpoint after every round (as the CLI does); the resumed
run is a fresh module, data module and Trainer given the round-2 checkpoint, i.e. what a
killed process restarted with ``--ckpt_path`` sees. Client sampling (fraction < 1),
simulated dropout and client momentum are all on, and evaluation runs every third round,
so state carried across the cut (per-client buffers, per-layer conflict sums) shows.
"""

from __future__ import annotations

import math

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities import rank_zero_only

from fl_lightning.algorithms import ALGORITHMS
from fl_lightning.data.datamodule import FederatedDataModule
from tests.accelerator import accelerator

FULL_PARTICIPATION = {"AFL", "CGSV", "Standalone", "DW", "RR", "EU", "CFFL", "ECI"}
NUM_ROUNDS, STOP_AFTER, EVAL_EVERY = 4, 2, 3
TIMINGS = ("client_time_s", "server_time_s")  # wall-clock, never reproducible

pytestmark = [
    pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty"),
    pytest.mark.usefixtures("one_thread"),
]




class MemoryLogger(Logger):
    """Every ``log_metrics`` call, in order: (step, metrics)."""

    def __init__(self) -> None:
        super().__init__()
        self.history: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> str:
        return "0"

    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    @rank_zero_only
    def log_metrics(self, metrics, step=None) -> None:
        self.history.append((step, {k: float(v) for k, v in metrics.items()}))


def without_timings(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if not any(k.startswith(t) for t in TIMINGS)}


def rounds_after(history, first_step: int) -> list[tuple[int, dict[str, float]]]:
    return [(step, without_timings(m)) for step, m in history if step is not None and step > first_step]


# variants whose state only some settings use: FedFV's external step (history within τ
# rounds, random projection order), CGSV's standalone models, the full-batch client signal
VARIANTS = {
    "FedFV-external": ("FedFV", {"tau": 1, "order": "random"}),
    "CGSV-standalone": ("CGSV", {"track_standalone": True}),
    "FedLF-full_batch": ("FedLF", {"gradient": "full_batch", "qp_solver": "cvxopt"}),
    "FedMDFG-full_batch": ("FedMDFG", {"gradient": "full_batch", "larger_steps": True}),
    # a model that draws from the global generator in training (dropout, stochastic depth): fails
    # when a resume does not restore the global generators (issue 33)
    "FedAvg-dropout": ("FedAvg", {"backbone": "fl_cct_7_3x1", "backbone_kwargs": {
        "embed_dim": 8, "depth": 1, "num_heads": 2, "mlp_ratio": 1.0, "drop_rate": 0.3, "drop_path_rate": 0.3}}),
}
CASES = {name: (name, {}) for name in ALGORITHMS} | VARIANTS


def make_run(case: str):
    name, extra = CASES[case]
    data = FederatedDataModule(source="digits", num_clients=8, partition="dirichlet",
                               partition_params={"alpha": 0.5, "min_size": 10}, test_mode="local", seed=3)
    module = ALGORITHMS[name](**{
        "backbone": "fl_logreg", "num_classes": data.num_classes, "input_shape": data.input_shape,
        "num_rounds": NUM_ROUNDS, "eval_every": EVAL_EVERY,
        "fraction": 1.0 if name in FULL_PARTICIPATION else 0.5, "dropout_prob": 0.2,
        "batch_size": 16, "lr": 0.05, "momentum": 0.5, "seed": 3, **extra,
    })
    return module, data


def make_trainer(checkpoints, logger) -> pl.Trainer:
    every_round = ModelCheckpoint(dirpath=checkpoints, filename="{epoch}", save_top_k=-1, every_n_epochs=1)
    return pl.Trainer(
        accelerator=accelerator(), logger=logger, callbacks=[every_round], max_epochs=-1,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        log_every_n_steps=1, deterministic=True,
    )


def same_numbers(a: dict[str, float], b: dict[str, float]) -> bool:
    """Same keys and bit-equal values (NaN equals NaN)."""
    return a.keys() == b.keys() and all(a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])) for k in a)


def differences(have: dict[str, float], want: dict[str, float]) -> dict[str, tuple]:
    return {k: (have.get(k), want.get(k)) for k in have.keys() | want.keys() if have.get(k) != want.get(k)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_resumed_run_ends_bit_for_bit_like_the_uninterrupted_one(name, tmp_path):
    module, data = make_run(name)
    full_log = MemoryLogger()
    full = make_trainer(tmp_path / "full", full_log)
    full.fit(module, datamodule=data)
    assert full.current_epoch == NUM_ROUNDS

    resumed_module, resumed_data = make_run(name)
    resumed_log = MemoryLogger()
    resumed = make_trainer(tmp_path / "full", resumed_log)  # as a restarted CLI run
    checkpoint = tmp_path / "full" / f"epoch={STOP_AFTER - 1}.ckpt"  # saved after round 2
    resumed.fit(resumed_module, datamodule=resumed_data, ckpt_path=checkpoint)
    assert resumed.current_epoch == NUM_ROUNDS

    # everything logged after the cut, step by step; the resumed run logs no earlier step again
    assert all(step > STOP_AFTER for step, _ in resumed_log.history)
    expected, got = rounds_after(full_log.history, STOP_AFTER), rounds_after(resumed_log.history, 0)
    assert [s for s, _ in got] == [s for s, _ in expected]
    for (step, want), (_, have) in zip(expected, got):
        assert same_numbers(have, want), (step, differences(have, want))
    # the final callback_metrics; the uninterrupted run's also hold keys last logged before the
    # cut (e.g. a per-agent value of an agent that dropped out since), which Lightning does not
    # checkpoint: those are the only ones the resumed run may lack
    final_full = without_timings({k: float(v) for k, v in full.callback_metrics.items()})
    final_resumed = without_timings({k: float(v) for k, v in resumed.callback_metrics.items()})
    logged_after_cut = set().union(*(m.keys() for _, m in expected))
    assert not (final_full.keys() - final_resumed.keys()) & logged_after_cut
    assert same_numbers(final_resumed, {k: final_full[k] for k in final_resumed})

    want_state, have_state = module.state_dict(), resumed_module.state_dict()
    assert have_state.keys() == want_state.keys()
    for key, value in want_state.items():
        assert torch.equal(have_state[key], value), key
    assert resumed.global_step == full.global_step
