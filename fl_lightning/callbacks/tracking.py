"""The MLflow side of a command-line fit: the store, the run it logs to, and what it prints.

A fit's MLflow loggers are configured (``trainer.logger``), but three of their constructor
arguments are only known later: the ``run_id`` of the run a checkpoint's fit logged to (a
resumed fit continues it), whether that run can take the new settings (MLflow keeps one value
per param), and the ``run_name`` of a new run (it says what the model and the data are).
Lightning's :class:`~lightning.pytorch.loggers.MLFlowLogger` opens its run lazily from exactly
these arguments, so :class:`MLflowFitSetup` decides them, in the two LightningCLI hooks the CLI
forwards to it:

1. ``before_instantiate_classes`` (nothing built yet): create each store's tables and
   experiment (a lock or retries for fits started together), and point a logger at the run
   the checkpoint recorded (``init_args.run_id``: the saved ``config.yaml`` names it);
2. ``instantiate_trainer`` (the model and the data exist): the trainer's loggers, each built
   with its final ``run_id`` and ``run_name``: a continued run whose params changed gives way
   to a new run, a new unnamed run is named by :func:`~fl_lightning.callbacks.run_identity.run_name`,
   and a continued run is logged through :class:`ContinuedRunLogger`, which leaves out the
   (metric, step) pairs the interrupted fit logged past its checkpoint.

The rest happens in callbacks, through public Lightning hooks and ``MlflowClient`` calls:
:class:`~fl_lightning.callbacks.mlflow_run.MLflowRunInfo` (tags, inputs, artifacts, the runs in
every checkpoint, a continued run marked RUNNING with its checkpoint's round restored),
:class:`FitReport` (the checkpoint a stopped fit resumes from and the command that does it;
at the end, the links that open each run in the MLflow UI) and :class:`MLflowSaveConfig`
(the resolved config as the run's ``config.yaml``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import random
import shlex
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import lightning.pytorch as pl
import torch
from jsonargparse import Namespace
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

from fl_lightning.callbacks.hparams import mlflow_params
from fl_lightning.callbacks.mlflow_run import CHECKPOINT_KEY, mlflow_loggers, saved_runs
from fl_lightning.callbacks.run_identity import loggable_hparams, run_name

DEFAULT_UI_URL = "http://127.0.0.1:5000"  # where `mlflow ui` serves
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


# --------------------------------------------------------------------------- the store


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


def run_exists(tracking_uri: str, run_id: str) -> bool:
    try:
        MlflowClient(tracking_uri).get_run(run_id)
    except MlflowException:
        return False
    return True


# --------------------------------------------------------------------------- logger configs


def is_mlflow_logger_config(entry: Any) -> bool:
    """Whether a ``trainer.logger`` entry (class_path + init_args) configures an MLFlowLogger."""
    if not isinstance(entry, Namespace) or not entry.get("class_path"):
        return False
    module, _, name = str(entry.class_path).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(cls, type) and issubclass(cls, MLFlowLogger)


def configured_tracking_uri(init_args: Namespace) -> str:
    """The store an MLFlowLogger built with these init args logs to (by the logger's own rule:
    ``tracking_uri``, else the ``file:`` store in ``save_dir``)."""
    return init_args.get("tracking_uri") or f"file:{init_args.get('save_dir', './mlruns')}"


def changed_params(client: MlflowClient, run_id: str, hparams: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """{name: (logged, new)} for the hyper-parameters whose value differs from the one the run
    holds (compared as MLFlowLogger logs them: flattened, as text)."""
    logged = client.get_run(run_id).data.params
    new = mlflow_params({k: v for k, v in hparams.items() if not str(k).startswith("_")})
    return {k: (logged[k], value) for k, value in new.items() if k in logged and logged[k] != value}


def logged_after(client: MlflowClient, run_id: str, rounds_completed: int) -> set[tuple[str, int]]:
    """The (metric, step) pairs the run holds past its checkpoint's round: what the interrupted
    fit logged after that checkpoint (e.g. the evaluation of the round it died in)."""
    return {
        (metric.key, metric.step)
        for key in client.get_run(run_id).data.metrics
        for metric in client.get_metric_history(run_id, key)
        if metric.step > rounds_completed
    }


class ContinuedRunLogger(MLFlowLogger):
    """An :class:`MLFlowLogger` for a continued run: the (metric, step) pairs of
    ``already_logged`` are left out of what it logs (MLflow would keep both values)."""

    def __init__(self, *args: Any, already_logged: Iterable[tuple[str, int]] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.already_logged = frozenset(already_logged)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        super().log_metrics({k: v for k, v in metrics.items() if (k, step or 0) not in self.already_logged}, step)


@functools.cache
def continued_run_class(cls: type[MLFlowLogger]) -> type[ContinuedRunLogger]:
    """``cls`` (MLFlowLogger or a subclass of it) with :class:`ContinuedRunLogger`'s filter."""
    if issubclass(cls, ContinuedRunLogger):
        return cls
    if cls is MLFlowLogger:
        return ContinuedRunLogger
    return type(cls.__name__, (ContinuedRunLogger, cls), {"__module__": cls.__module__})


def run_name_for(init_args: Mapping[str, Any], model: pl.LightningModule, datamodule: Any = None) -> str | None:
    """The name of the run an MLFlowLogger with these init args logs to: its ``run_name``, or
    for a new run named neither there nor in its tags, one that says what the run is; None for
    a continued run (``run_id``: it keeps the name it has)."""
    if init_args.get("run_id"):
        return None
    if init_args.get("run_name"):
        return str(init_args["run_name"])
    tags = init_args.get("tags") or {}
    if MLFLOW_RUN_NAME in tags:  # named through the logger's tags
        return None
    return run_name(model, datamodule, tags)


class MLflowFitSetup:
    """The MLflow loggers of one fit, from its parsed config (see the module's docstring)."""

    def __init__(self, config: Namespace, ckpt_path: str | None = None) -> None:
        """Before the loggers' clients open the stores: create each store and experiment, and
        point every MLflow logger with no ``run_id`` of its own at the run ``ckpt_path``'s fit
        logged to, when that run is in the logger's store."""
        entries = config.trainer.get("logger")
        self.entries = entries if isinstance(entries, list) else [entries]
        for entry in self.mlflow_configs():
            init_args = entry.init_args
            name = None if init_args.get("run_id") else init_args.get("experiment_name")
            open_mlflow_experiment(configured_tracking_uri(init_args), name, init_args.get("artifact_location"))
        self.resumed: dict[str, Any] = {}
        self.continued: set[str] = set()
        if ckpt_path and Path(ckpt_path).is_file():
            checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=False, mmap=True)
            self.resumed = checkpoint.get(CHECKPOINT_KEY) or {}
            self._continue_runs(ckpt_path, saved_runs(checkpoint))

    def mlflow_configs(self) -> list[Namespace]:
        return [entry for entry in self.entries if is_mlflow_logger_config(entry)]

    def _continue_runs(self, ckpt_path: str, runs: list[dict[str, str]]) -> None:
        if not runs:
            return
        for entry in self.mlflow_configs():
            init_args = entry.init_args
            if init_args.get("run_id"):
                continue
            uri = configured_tracking_uri(init_args)
            candidates = sorted(runs, key=lambda run: run["tracking_uri"] != uri)  # the same store first
            found = next((run for run in candidates if run_exists(uri, run["run_id"])), None)
            if found is None:
                where = ", ".join(f"{run['run_id']} in {run['tracking_uri']}" for run in runs)
                print(f"Resuming from {ckpt_path}: its MLflow run ({where}) is not in {uri}, so the resumed fit "
                      "logs to a new run (pass --trainer.logger.init_args.tracking_uri to continue that run)")
                continue
            init_args.run_id = found["run_id"]
            self.continued.add(found["run_id"])
            print(f"Resuming from {ckpt_path}: continuing MLflow run {found['run_id']} in {uri}")

    def trainer_loggers(self, built: Any, model: pl.LightningModule, datamodule: Any = None) -> Any:
        """The trainer's ``logger`` argument: ``built`` (LightningCLI's instances of the configured
        loggers, one per entry) with every MLflow logger built with its final run_id and name."""
        instances = built if isinstance(built, list) else [built]
        final = [self._final_logger(entry, logger, model, datamodule)
                 for entry, logger in zip(self.entries, instances, strict=True)]
        return final if isinstance(built, list) else final[0]

    def _final_logger(self, entry: Any, logger: Any, model: pl.LightningModule, datamodule: Any) -> Any:
        if not isinstance(logger, MLFlowLogger) or not is_mlflow_logger_config(entry):
            return logger
        init_args = entry.init_args
        given = (init_args.get("run_id"), init_args.get("run_name"))
        already_logged: set[tuple[str, int]] = set()
        if given[0] in self.continued:
            client = MlflowClient(configured_tracking_uri(init_args))
            changed = changed_params(client, given[0], loggable_hparams(model, datamodule))
            if changed:  # MLflow keeps one value per parameter: logging another fails the fit
                shown = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in sorted(changed.items()))
                print(f"The resumed fit changes settings of MLflow run {given[0]} ({shown}); "
                      "MLflow keeps one value per parameter, so it logs to a new run")
                init_args.run_id = None  # the saved config.yaml names the run the fit logs to
            else:
                already_logged = logged_after(client, given[0], int(self.resumed.get("rounds_completed", 0)))
        run_id = init_args.get("run_id")
        name = given[1] if run_id else run_name_for(init_args, model, datamodule)
        if (run_id, name) == given and not already_logged:
            return logger  # built with its final arguments
        kwargs = {**init_args.as_dict(), "run_id": run_id, "run_name": name}
        if already_logged:
            return continued_run_class(type(logger))(**kwargs, already_logged=already_logged)
        return type(logger)(**kwargs)


# --------------------------------------------------------------------------- what a fit says


def ui_links(tracking_uri: str, experiment_id: str, run_id: str) -> tuple[str, str]:
    """(the experiment's runs view, the run's page) in the MLflow UI: on the tracking server
    itself, or where ``mlflow ui`` serves a local store."""
    base = tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else DEFAULT_UI_URL
    runs = f"{base}/#/experiments/{experiment_id}/runs"
    return runs, f"{runs}/{run_id}"


def results_text(logger: MLFlowLogger) -> str:
    """Where a fit's MLflow run is and the links that open it."""
    client, run_id = logger.experiment, str(logger.run_id)
    uri = client.tracking_uri
    run = client.get_run(run_id)
    experiment = client.get_experiment(run.info.experiment_id)
    runs_view, run_page = ui_links(uri, experiment.experiment_id, run_id)
    served = uri.startswith(("http://", "https://"))
    how = "Open them at:" if served else f"Open them with:  mlflow ui --backend-store-uri {uri}   then browse"
    return (f"\nResults: MLflow run '{run.info.run_name}' ({run_id}) in experiment "
            f"'{experiment.name}' at {uri}\n"
            f"{how}\n  the experiment's runs: {runs_view}\n  this run:              {run_page}")


def resume_command(args: list[str], checkpoint: str) -> str:
    """The command line that resumes the fit ``fl-lightning <args>`` from ``checkpoint``."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--ckpt_path":
            skip = True
        elif not arg.startswith("--ckpt_path="):
            kept.append(arg)
    return shlex.join(["fl-lightning", *kept, "--ckpt_path", checkpoint])


class FitReport(Callback):
    """What a command-line fit says (rank 0): at the start, the checkpoint a stopped or killed
    fit resumes from and the command that resumes it; at the end, the last checkpoint and the
    MLflow UI links of every run. A lone default ``ModelCheckpoint`` also keeps ``last.ckpt``,
    every round (Lightning's ``save_last``)."""

    def __init__(self, command_args: list[str]) -> None:
        self.command_args = [str(arg) for arg in command_args]

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        checkpoints = [cb for cb in trainer.callbacks if isinstance(cb, ModelCheckpoint)]  # type: ignore[attr-defined]
        if len(checkpoints) == 1 and checkpoints[0].save_last is None and checkpoints[0].monitor is None:
            checkpoints[0].save_last = True

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        checkpoint = trainer.checkpoint_callback
        if not trainer.is_global_zero or not isinstance(checkpoint, ModelCheckpoint) or not checkpoint.dirpath:
            return
        last = Path(checkpoint.dirpath) / f"{checkpoint.CHECKPOINT_NAME_LAST}{checkpoint.FILE_EXTENSION}"
        print(f"Checkpoint after every round: {last}\nIf the fit stops, resume it with:  "
              f"{resume_command(self.command_args, str(last))}", flush=True)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:  # under DDP, rank 0 reports
            return
        checkpoint = trainer.checkpoint_callback
        if isinstance(checkpoint, ModelCheckpoint) and (checkpoint.last_model_path or checkpoint.best_model_path):
            print(f"\nCheckpoint: {checkpoint.last_model_path or checkpoint.best_model_path}")
        for logger in mlflow_loggers(trainer):
            print(results_text(logger))


class MLflowSaveConfig(SaveConfigCallback):
    """Logs the resolved config as the run artifact ``config.yaml`` (not into a shared folder)."""

    def save_config(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        text = self.parser.dump(self.config, skip_none=False)
        for logger in mlflow_loggers(trainer):
            logger.experiment.log_text(logger.run_id, text, "config.yaml")
