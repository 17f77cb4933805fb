"""``fl-lightning fit --config X.yaml``: LightningCLI over federated algorithms and data.

The algorithm is chosen by class path (``--model FedProx`` or
``--model fl_lightning.algorithms.FedProx``), the data by source/partition names, the
backbone by registered model name; anything can be overridden on the command line.
Without ``--config`` the embedded default runs (``configs/default.yaml``: FedAvg on the
offline mnist5k digits) and logs to the local MLflow store ``sqlite:///mlruns.db``.

Only ``fit`` is offered: every client is evaluated during the fit, every ``eval_every`` rounds
and after the last, and logged to the fit's MLflow run. A new run is named after what it is
(``1605-3fa2 FedFV(tau=1) seed 0 | mnist5k/dirichlet(alpha=0.5)``) unless
``--trainer.logger.init_args.run_name`` names it; a continued run keeps its name.

A checkpoint is saved after every round (``last.ckpt`` beside the per-round one, under
``checkpoints/<experiment id>/<run id>/checkpoints/``); ``--ckpt_path`` resumes from it, exactly,
and the resumed fit keeps logging into the interrupted fit's MLflow run.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger

from fl_lightning.algorithms import ALGORITHMS  # also registers the classes for --model
from fl_lightning.callbacks import LogHyperparameters, MLflowRunInfo, RoundProgressBar
from fl_lightning.callbacks.mlflow_run import saved_runs
from fl_lightning.callbacks.run_identity import loggable_hparams, run_name
from fl_lightning.core.module import FederatedModule
from fl_lightning.data.datamodule import FederatedDataModule

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "default.yaml"
DEFAULT_TRACKING_URI = "sqlite:///mlruns.db"
DEFAULT_UI_URL = "http://127.0.0.1:5000"  # where `mlflow ui` serves
EVALUATION_SUBCOMMANDS = ("validate", "test", "predict")


class MLflowSaveConfig(SaveConfigCallback):
    """Logs the resolved config as the run artifact ``config.yaml`` (not into a shared folder)."""

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        text = self.parser.dump(self.config, skip_none=False)
        for logger in trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                logger.experiment.log_text(logger.run_id, text, "config.yaml")


def unknown_algorithm(args: list[str]) -> str | None:
    """The value of ``--model`` when it names no known algorithm (a bare class name)."""
    for i, arg in enumerate(args):
        if arg == "--model" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--model="):
            value = arg.split("=", 1)[1]
        else:
            continue
        is_path = "." in value or "/" in value or value.startswith("{")
        if not is_path and value not in ALGORITHMS:
            return value
    return None


def _is_mlflow_logger(class_path: Any) -> bool:
    module, _, name = str(class_path).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, MLFlowLogger)


def _mlflow_logger_configs(config: Any) -> list[Any]:
    """The ``trainer.logger`` entries (class_path + init_args) that are MLflow loggers."""
    loggers = config.trainer.get("logger")
    return [
        logger for logger in (loggers if isinstance(loggers, list) else [loggers])
        if hasattr(logger, "class_path") and _is_mlflow_logger(logger.class_path)
    ]


def _tracking_uri(init_args: Any) -> str:
    """The store an MLFlowLogger with these init args logs to (its own defaults included)."""
    return (init_args.get("tracking_uri") or os.getenv("MLFLOW_TRACKING_URI")
            or f"file:{init_args.get('save_dir') or './mlruns'}")


DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


def _store_lock(tracking_uri: str) -> Any:
    """An inter-process lock for a SQLite store's file (a no-op for other stores); the lock
    file lives in the temporary folder, not beside the user's database."""
    if not tracking_uri.startswith("sqlite:///"):
        return contextlib.nullcontext()
    from filelock import FileLock  # a torch dependency

    database = Path(unquote(tracking_uri[len("sqlite:///"):].split("?", 1)[0])).resolve()
    digest = hashlib.sha1(str(database).encode()).hexdigest()[:16]
    return FileLock(Path(tempfile.gettempdir()) / f"fl-lightning-mlflow-{digest}.lock", timeout=300)


def open_mlflow_experiment(tracking_uri: str, name: str | None, artifact_location: str | None = None,
                           attempts: int = 10) -> None:
    """Create the store's tables and the experiment ``name`` if they do not exist yet.

    Fits started together on a fresh database store (``benchmarks`` ``--jobs``, several shells)
    would otherwise race: both create the schema and run its migrations ("table ... already
    exists", an alembic error, or a half-migrated store), or both create the experiment
    (RESOURCE_ALREADY_EXISTS), and one dies. A SQLite store is set up under a file lock, one
    process at a time; any other database is retried a few times (the loser of a race finds
    what the winner made). File and HTTP stores are opened once, as the logger would.
    """
    from mlflow.tracking import MlflowClient

    database = tracking_uri.split(":", 1)[0].split("+", 1)[0] in DATABASE_SCHEMES
    for attempt in range(attempts if database else 1):
        try:
            with _store_lock(tracking_uri):
                client = MlflowClient(tracking_uri)
                if name is not None and client.get_experiment_by_name(name) is None:
                    client.create_experiment(name, artifact_location=artifact_location)
            return
        except Exception as error:
            if not database or attempt == attempts - 1:
                raise RuntimeError(f"could not set up the MLflow store {tracking_uri}: {error}") from error
            time.sleep(random.uniform(0.1, 0.5) * (attempt + 1))


def _run_exists(tracking_uri: str, run_id: str) -> bool:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(tracking_uri).get_run(run_id)
    except MlflowException:
        return False
    return True


def continue_mlflow_runs(config: Any, ckpt_path: str) -> list[str]:
    """Point every MLflow logger of ``config`` (no ``run_id`` of its own) at the run the
    checkpoint's fit logged to, when that run is in the logger's store; the runs continued."""
    runs = saved_runs(torch.load(ckpt_path, map_location="cpu", weights_only=False, mmap=True))
    continued: list[str] = []
    if not runs:
        return continued
    for logger in _mlflow_logger_configs(config):
        init_args = logger.init_args
        if init_args.get("run_id"):
            continue
        uri = _tracking_uri(init_args)
        candidates = sorted(runs, key=lambda run: run["tracking_uri"] != uri)  # the same store first
        found = next((run for run in candidates if _run_exists(uri, run["run_id"])), None)
        if found is None:
            where = ", ".join(f"{run['run_id']} in {run['tracking_uri']}" for run in runs)
            print(f"Resuming from {ckpt_path}: its MLflow run ({where}) is not in {uri}, so the resumed fit "
                  "logs to a new run (pass --trainer.logger.init_args.tracking_uri to continue that run)")
            continue
        init_args.run_id = found["run_id"]
        continued.append(found["run_id"])
        print(f"Resuming from {ckpt_path}: continuing MLflow run {found['run_id']} in {uri}")
    return continued


def changed_params(tracking_uri: str, run_id: str, hparams: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """{name: (logged, new)} for the hyper-parameters whose value differs from the one the run
    holds (compared as MLFlowLogger logs them: flattened, as text)."""
    from lightning.fabric.utilities.logger import _convert_params, _flatten_dict
    from mlflow.tracking import MlflowClient

    params = _flatten_dict(_convert_params({k: v for k, v in hparams.items() if not str(k).startswith("_")}))
    logged = MlflowClient(tracking_uri).get_run(run_id).data.params
    new = {k: str(v)[:250] for k, v in params.items()}
    return {k: (logged[k], value) for k, value in new.items() if k in logged and logged[k] != value}


def resume_command(args: list[str], checkpoint: str) -> str:
    """The command line that resumes this fit from ``checkpoint``."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--ckpt_path":
            skip = True
        elif not arg.startswith("--ckpt_path="):
            kept.append(arg)
    return shlex.join(["fl-lightning", *kept, "--ckpt_path", checkpoint])


class ResumeHint(Callback):
    """Says, when the fit starts, which checkpoint a stopped or killed fit resumes from, and how."""

    def __init__(self, args: list[str]) -> None:
        self.args = args

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        checkpoint = trainer.checkpoint_callback
        if not trainer.is_global_zero or not isinstance(checkpoint, ModelCheckpoint) or not checkpoint.dirpath:
            return
        last = Path(checkpoint.dirpath) / f"{checkpoint.CHECKPOINT_NAME_LAST}{checkpoint.FILE_EXTENSION}"
        print(f"Checkpoint after every round: {last}\nIf the fit stops, resume it with:  "
              f"{resume_command(self.args, str(last))}", flush=True)


def refused_subcommand(args: list[str]) -> str | None:
    """The one-line answer to ``fl-lightning validate|test|predict`` (None for anything else)."""
    command = next((arg for arg in args if not arg.startswith("-")), None)
    if command not in EVALUATION_SUBCOMMANDS:
        return None
    return (f"fl-lightning {command}: not a command here; every client is evaluated during `fl-lightning fit` "
            "every --model.eval_every rounds and after the last, and logged to its MLflow run")


def ui_links(tracking_uri: str, experiment_id: str, run_id: str) -> tuple[str, str]:
    """(the experiment's runs view, the run's page) in the MLflow UI: on the tracking server
    itself, or where ``mlflow ui`` serves a local store."""
    base = tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else DEFAULT_UI_URL
    runs = f"{base}/#/experiments/{experiment_id}/runs"
    return runs, f"{runs}/{run_id}"


def name_new_runs(loggers: list[Any], model: pl.LightningModule, datamodule: Any) -> None:
    """Give every MLflow logger that will create a run and has no name for it one that says
    what the run is (a continued run, ``run_id`` set, keeps its name)."""
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

    for logger in loggers:
        if not isinstance(logger, MLFlowLogger) or logger._run_id is not None or logger._run_name is not None:
            continue
        if MLFLOW_RUN_NAME in (logger.tags or {}):  # named through the logger's tags
            continue
        logger._run_name = run_name(model, datamodule, logger.tags)  # read when the run is created


def readable_error(error: BaseException) -> str:
    """The class's own message out of jsonargparse's "Does not validate against any of the
    Union subtypes" text (which lists one error per subtype, e.g. FederatedModule | None)."""
    text = str(error)
    if "Does not validate against any of the Union subtypes" not in text:
        return text
    reasons = [line.strip()[2:] for line in text.splitlines() if line.strip().startswith("- ")]
    reasons = [r for r in reasons if not r.startswith("Expected a <class 'NoneType'>")]
    return "; ".join(reasons) or text


class FederatedCLI(LightningCLI):
    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Only ``fit``: evaluation runs inside it (``validate``/``test`` would evaluate data
        built from the defaults, not the fit's)."""
        return {"fit": LightningCLI.subcommands()["fit"]}

    def parse_arguments(self, parser: Any, args: Any) -> None:
        self.command_args = [str(a) for a in (sys.argv[1:] if args is None else args)]
        refusal = refused_subcommand(self.command_args)
        if refusal is not None:
            print(refusal, file=sys.stderr)
            raise SystemExit(2)
        name = unknown_algorithm(list(sys.argv[1:] if args is None else args))
        if name is not None:
            parser.error(
                f"unknown algorithm {name!r}; valid: {', '.join(sorted(ALGORITHMS))} "
                "(or the class path of a FederatedModule subclass, e.g. mypackage.MyAlgorithm)"
            )
        super().parse_arguments(parser, args)

    def add_arguments_to_parser(self, parser: Any) -> None:
        parser.link_arguments("data.num_classes", "model.init_args.num_classes", apply_on="instantiate")
        parser.link_arguments("data.input_shape", "model.init_args.input_shape", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        for logger in _mlflow_logger_configs(config):  # before the loggers' clients open the store
            init_args = logger.init_args
            name = None if init_args.get("run_id") else init_args.get("experiment_name")
            open_mlflow_experiment(_tracking_uri(init_args), name, init_args.get("artifact_location"))
        ckpt_path = config.get("ckpt_path") if self.subcommand == "fit" else None
        self.continued_runs = []
        if ckpt_path and Path(ckpt_path).is_file():
            self.continued_runs = continue_mlflow_runs(config, ckpt_path)

    def instantiate_classes(self) -> None:
        """A wrong value that only the class itself can check (``--model.engine gpu``, an
        unknown source) exits with the class's own message, not jsonargparse's Union dump."""
        try:
            super().instantiate_classes()
        except (ValueError, TypeError) as error:
            self.parser.error(readable_error(error))

    def before_fit(self) -> None:
        hparams = loggable_hparams(self.model, self.datamodule)
        for logger in self.trainer.loggers:
            if not isinstance(logger, MLFlowLogger):
                continue
            run_id = logger._run_id
            if run_id is None or run_id not in self.continued_runs:
                continue
            changed = changed_params(logger._tracking_uri, run_id, hparams)
            if changed:  # MLflow keeps one value per parameter: logging another fails the fit
                shown = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in sorted(changed.items()))
                print(f"The resumed fit changes settings of MLflow run {run_id} ({shown}); "
                      "MLflow keeps one value per parameter, so it logs to a new run")
                logger._run_id = None  # nothing has opened the run yet: the logger creates a new one
        name_new_runs(self.trainer.loggers, self.model, self.datamodule)
        callbacks: list[Callback] = self.trainer.callbacks  # type: ignore[attr-defined]
        checkpoints = [cb for cb in callbacks if isinstance(cb, ModelCheckpoint)]
        if len(checkpoints) == 1 and checkpoints[0].save_last is None and checkpoints[0].monitor is None:
            checkpoints[0].save_last = True  # Lightning's default: also keep last.ckpt, every round
        if checkpoints:
            callbacks.append(ResumeHint(getattr(self, "command_args", [])))

    def after_fit(self) -> None:
        if not self.trainer.is_global_zero:  # under DDP, rank 0 reports
            return
        checkpoint = getattr(self.trainer.checkpoint_callback, "last_model_path", "") or getattr(
            self.trainer.checkpoint_callback, "best_model_path", "")
        if checkpoint:
            print(f"\nCheckpoint: {checkpoint}")
        for logger in self.trainer.loggers:
            if isinstance(logger, MLFlowLogger):
                print(results_text(logger))


def results_text(logger: MLFlowLogger) -> str:
    """Where a fit's MLflow run is and the links that open it."""
    uri, run_id = logger._tracking_uri, str(logger.run_id)
    run = logger.experiment.get_run(run_id)
    experiment = logger.experiment.get_experiment(run.info.experiment_id)
    runs_view, run_page = ui_links(uri, experiment.experiment_id, run_id)
    served = uri.startswith(("http://", "https://"))
    how = "Open them at:" if served else f"Open them with:  mlflow ui --backend-store-uri {uri}   then browse"
    return (f"\nResults: MLflow run '{run.info.run_name}' ({run_id}) in experiment "
            f"'{experiment.name}' at {uri}\n"
            f"{how}\n  the experiment's runs: {runs_view}\n  this run:              {run_page}")


def trainer_defaults() -> dict[str, Any]:
    return {
        "logger": {
            "class_path": "lightning.pytorch.loggers.MLFlowLogger",
            "init_args": {"experiment_name": "fl-lightning", "tracking_uri": DEFAULT_TRACKING_URI},
        },
        "callbacks": [RoundProgressBar(), MLflowRunInfo(), LogHyperparameters()],
        "default_root_dir": "checkpoints",  # checkpoints/<experiment id>/<run id>/checkpoints/
        "max_epochs": -1,  # the module sets it to num_rounds when the fit starts
        "num_sanity_val_steps": 0,
        "log_every_n_steps": 1,
        "enable_model_summary": False,
        "enable_autolog_hparams": False,  # LogHyperparameters logs them, without LightningCLI's "_" entries
    }


def main(args: list[str] | None = None) -> None:
    """The ``fl-lightning`` console script (``args`` lets tests call it in-process)."""
    FederatedCLI(
        FederatedModule,
        FederatedDataModule,
        subclass_mode_model=True,
        save_config_callback=MLflowSaveConfig,
        save_config_kwargs={"save_to_log_dir": False},
        trainer_defaults=trainer_defaults(),
        parser_kwargs={"fit": {"default_config_files": [str(DEFAULT_CONFIG)]}},
        args=args,
        auto_configure_optimizers=False,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
