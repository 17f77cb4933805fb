"""Issue 23: the private names of Lightning, MLflow and PyTorch live in ``fl_lightning.private_api``
only, and each still does what the project relies on in the installed versions (an upgrade that
renames one fails here, by name, not in the middle of a fit)."""

from __future__ import annotations

import re
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import MLFlowLogger

from fl_lightning import private_api

PACKAGE = Path(private_api.__file__).parent
PRIVATE_NAMES = re.compile(r"\._trainer\b|\._hparams(_initial)?\b|\._checkpoint_connector\b|\btrainer\._results\b"
                           r"|\b_initialize_tables\(|\._mlflow_client\b|\._version\b|\._buffers\b")


class Tiny(pl.LightningModule):
    def __init__(self, width: int = 2) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(width, 1)
        self.register_buffer("counts", torch.zeros(3))

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(2, 2)), batch_size=1)


def test_no_other_module_spells_a_private_name():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.name == "private_api.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#", 1)[0]
            if PRIVATE_NAMES.search(code) and "``" not in code:
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert not offenders, "use fl_lightning.private_api:\n" + "\n".join(offenders)


def test_lightning_private_names(tmp_path):
    module = Tiny()
    assert private_api.attached_trainer(module) is None
    private_api.record_hparams(module, {"width": 5})
    assert module.hparams.width == 5 and module.hparams_initial.width == 5

    seen = {}

    class Probe(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            pl_module.log("probe", 1.5, on_step=False, on_epoch=True)

        def on_train_epoch_end(self, trainer, pl_module):
            seen["trainer"] = private_api.attached_trainer(pl_module)
            seen["results"] = dict(private_api.running_epoch_results(trainer).metrics(on_step=False)["log"])
            seen["checkpoint"] = private_api.dump_checkpoint(trainer, weights_only=False)

    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=tmp_path, callbacks=[Probe()])
    trainer.fit(module)
    assert seen["trainer"] is trainer
    assert float(seen["results"]["probe"]) == 1.5
    assert seen["checkpoint"]["state_dict"].keys() == module.state_dict().keys()
    assert "optimizer_states" in seen["checkpoint"]


def test_mlflow_private_names(tmp_path):
    import sqlalchemy
    from mlflow.tracking import MlflowClient

    engine = sqlalchemy.create_engine(f"sqlite:///{tmp_path / 'template.db'}")
    private_api.initialize_mlflow_tables(engine)
    assert "experiments" in sqlalchemy.inspect(engine).get_table_names()

    logger = MLFlowLogger(experiment_name="x", tracking_uri=f"sqlite:///{tmp_path / 'runs.db'}")
    logger.experiment  # noqa: B018  # creates the run
    client = private_api.mlflow_client(logger)
    assert isinstance(client, MlflowClient)
    calls = []

    class Recording:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(client, name)

    private_api.replace_mlflow_client(logger, Recording())
    logger.log_metrics({"acc": 0.5}, step=0)  # the logger writes through what was put there
    assert "log_batch" in calls
    assert client.get_metric_history(logger.run_id, "acc")[0].value == 0.5


def test_torch_private_names():
    tensor = torch.zeros(3)
    before = private_api.tensor_version(tensor)
    tensor.add_(1)
    assert private_api.tensor_version(tensor) == before + 1
    module = Tiny()
    buffers = private_api.own_buffers(module)
    taken = buffers.pop("counts")
    module.to(torch.float64)  # what is taken out is not moved
    assert taken.dtype == torch.float32 and module.layer.weight.dtype == torch.float64
    buffers["counts"] = taken
    assert module.counts is taken
