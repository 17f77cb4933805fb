"""Issue 50: a Trainer script's run is a run like the CLI's. With Lightning's ``MLFlowLogger`` and
the CLI's ``MLflowRunInfo`` (as the Trainer-script guide builds them), the run is named as the CLI
names its runs, logs a ``config.yaml`` that ``fl-lightning replay`` fits again (identical), and the
script prints neither Lightning's ``log_every_n_steps`` warning nor torch's pynvml FutureWarning."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import lightning.pytorch as pl
import pytest
import yaml
from lightning.pytorch.loggers import MLFlowLogger
from mlflow.tracking import MlflowClient

from fl_lightning.algorithms import FedFV
from fl_lightning.callbacks import MLflowRunInfo
from fl_lightning.callbacks.run_identity import NAME_SEPARATOR
from fl_lightning.cli import replay
from fl_lightning.data.datamodule import FederatedDataModule


def script_fit(tmp_path, **logger_kwargs):
    """The guide's MLflow script, small: digits, 6 clients, 2 rounds."""
    pl.seed_everything(1)
    data = FederatedDataModule(source="digits", num_clients=6, partition="dirichlet", test_mode="matched")
    module = FedFV(backbone="fl_logreg", num_classes=data.num_classes, input_shape=data.input_shape,
                   num_rounds=2, fraction=0.5, lr=0.05, alpha=0.1)
    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    logger = MLFlowLogger(experiment_name="scripts", tracking_uri=uri, **logger_kwargs)
    trainer = pl.Trainer(max_epochs=2, logger=logger, callbacks=[MLflowRunInfo()], enable_checkpointing=False,
                         num_sanity_val_steps=0, enable_progress_bar=False, default_root_dir=tmp_path)
    trainer.fit(module, datamodule=data)
    return uri, logger.run_id


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("PL_GLOBAL_SEED", "PL_SEED_WORKERS"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_a_trainer_script_run_is_named_like_a_cli_run_and_keeps_a_name_it_was_given(in_tmp):
    uri, run_id = script_fit(in_tmp)
    name = MlflowClient(uri).get_run(run_id).info.run_name
    # lr 0.05 and alpha 0.1 are FedFV's defaults: no settings in the name, as for a CLI fit of them
    assert name.startswith("FedFV seed 1" + NAME_SEPARATOR + "digits/dirichlet(alpha=0.5"), name
    uri, run_id = script_fit(in_tmp, run_name="mine")
    assert MlflowClient(uri).get_run(run_id).info.run_name == "mine"


def test_a_trainer_script_run_logs_a_config_that_replay_fits_again_identically(in_tmp, capsys):
    uri, run_id = script_fit(in_tmp)
    client = MlflowClient(uri)
    config = yaml.safe_load(open(client.download_artifacts(run_id, "config.yaml", str(in_tmp))).read())
    assert config["seed_everything"] == 1
    assert config["model"]["class_path"].endswith("FedFV") and config["model"]["init_args"]["alpha"] == 0.1
    assert "num_classes" not in config["model"]["init_args"]  # linked from the data by the CLI
    assert config["data"]["partition_params"]["alpha"] == 0.5 and config["data"]["seed"] == 1
    capsys.readouterr()
    assert replay.main([run_id, "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert re.search(r": identical: 2 rounds, \d+ metrics", out), out
    assert client.get_run(run_id).data.tags["replay_result"] == "identical"


SCRIPT = textwrap.dedent("""
    import warnings
    import lightning.pytorch as pl
    from fl_lightning.algorithms import FedAvg
    from fl_lightning.data.datamodule import FederatedDataModule

    PYNVML = ("The pynvml package is deprecated. Please install nvidia-ml-py instead. If you did not install "
              "pynvml directly, please report this to the maintainers of the package that installed pynvml for you.")

    class LikeTorch(pl.Callback):  # where torch, with pynvml installed, raises it: after the closing line
        def teardown(self, trainer, pl_module, stage):
            warnings.warn(PYNVML, FutureWarning)

    data = FederatedDataModule(source="digits", num_clients=6, partition="iid", test_mode="local", seed=1)
    module = FedAvg(backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8), num_rounds=2, fraction=0.5,
                    lr=0.1, eval_every=1, seed=1)
    trainer = pl.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, num_sanity_val_steps=0,
                         callbacks=[LikeTorch()])
    trainer.fit(module, datamodule=data)
    print("logging interval", trainer.log_every_n_steps)
""")


@pytest.mark.slow
def test_a_trainer_script_prints_no_logging_interval_or_pynvml_warning(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("PYTHONWARNINGS", None)
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    assert "Done: 2 rounds" in said and "logging interval 1" in said
    assert "log_every_n_steps" not in said and "pynvml" not in said and "Warning" not in said, said
