"""Issue 5: a run on 2 processes (DDP over gloo, CPU) equals the single-process run.

Each rank trains its block of every round's clients and evaluates its block of the
clients; uploads and evaluations are all-gathered and every rank aggregates the same J.
The final checkpoint (model, histories, personal models) and the logged metrics must
agree with the single-process run to 1e-5.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.integration

COMMON = [
    "--data.source=synthetic", "--data.num_clients=10", "--data.partition=natural", "--data.test_mode=local",
    "--model.backbone=fl_logreg", "--model.num_rounds=3", "--model.fraction=0.7",
    "--model.dropout_prob=0.2", "--model.momentum=0.5", "--trainer.accelerator=cpu",
]


def fit(folder: Path, devices: int, *extra: str) -> tuple[dict, dict]:
    folder.mkdir()
    uri = f"sqlite:///{folder / 'runs.db'}"
    strategy = ["--trainer.strategy=ddp", f"--trainer.devices={devices}"] if devices > 1 else ["--trainer.devices=1"]
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "fl_lightning.cli", "fit", *COMMON, *strategy, *extra,
         f"--trainer.logger.init_args.tracking_uri={uri}"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint = next(folder.glob("checkpoints/**/*.ckpt"))
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name("fl-lightning").experiment_id])
    return state, run.data.metrics


@pytest.mark.parametrize("algorithm", [
    ["--model=FedFV", "--model.tau=1"],  # K x d history, last-seen rounds
    ["--model=Ditto"],  # personal models, per-client-model evaluation split across ranks
])
def test_two_processes_equal_one(tmp_path, algorithm):
    single_state, single_metrics = fit(tmp_path / "one", 1, *algorithm)
    ddp_state, ddp_metrics = fit(tmp_path / "two", 2, *algorithm)
    assert single_state.keys() == ddp_state.keys()
    for name, value in single_state.items():
        if value.is_floating_point():
            torch.testing.assert_close(ddp_state[name], value, rtol=0, atol=1e-5, msg=name)
        else:
            assert torch.equal(ddp_state[name], value), name
    per_process = ("_time_s", "chunk_size")  # wall times; each rank stacks only its block
    compared = [k for k in single_metrics if not k.endswith(per_process)]
    assert "test_acc_mean" in compared and "clients_aggregated" in compared
    assert set(compared) <= set(ddp_metrics)
    for key in compared:
        assert ddp_metrics[key] == pytest.approx(single_metrics[key], abs=1e-5), key
