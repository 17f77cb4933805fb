"""Which MLflow run a command-line fit logs to, and the loggers that log to it.

A fit's MLflow loggers are configured (``trainer.logger``), but three of their constructor
arguments are only known later: the ``run_id`` of the run a checkpoint's fit logged to (a
resumed fit continues it), whether that run can take the new settings (MLflow keeps one value
per param), and the ``run_name`` of a new run (it says what the model and the data are).
Lightning's :class:`~lightning.pytorch.loggers.MLFlowLogger` opens its run lazily from exactly
these arguments, so :class:`MLflowFitSetup` decides them, in the two LightningCLI hooks the CLI
forwards to it:

1. ``before_instantiate_classes`` (nothing built yet): refuse a resume with fewer rounds than
   its checkpoint completed, before anything is created; set the rounds a resumed fit plans;
   find the run the checkpoint recorded, in the logger's store or, when none was given, in the
   store the checkpoint recorded (a store given explicitly that lacks the run gets a new run,
   and a line naming the store to pass);
2. ``instantiate_trainer`` (the model and the data exist, every check has passed): create each
   store's tables and experiment (a lock or retries for fits started together:
   :func:`~fl_lightning.callbacks.mlflow_store.open_mlflow_experiment`), point a logger
   at the run the checkpoint recorded (``init_args.run_id``: the saved ``config.yaml`` names
   it), and build the trainer's loggers, each with its final ``run_id`` and ``run_name``: a
   continued run whose params changed gives way to a new run (``num_rounds`` excepted: a resume
   may extend the run), a new unnamed run is named by
   :func:`~fl_lightning.callbacks.run_identity.run_name`, and a continued run is logged through
   :class:`ContinuedRunLogger`, which leaves out the (metric, step) pairs the interrupted fit
   logged past its checkpoint and the params MLflow keeps from the run's start.

Extending a run: resumed with a larger ``--model.num_rounds``, a fit continues to the new count
in the same run, its model bit for bit like an uninterrupted fit of that length (unless the
algorithm's schedule depends on ``num_rounds``, as FedMGDA's decay does); its history also holds
the evaluation at the earlier fit's last round, so ``replay`` follows the run's route (tag
``fit_lengths``). LightningCLI replaces the model's
settings with the checkpoint's before any hook, so the CLI reads the requested count first
(``fl_lightning.cli.settings.given_settings``) and passes it to :class:`MLflowFitSetup`. MLflow keeps one value
per param: the run's ``num_rounds`` param keeps the first value, and the tag
``extended_to_rounds`` (``vocabulary.Tag.EXTENDED_TO_ROUNDS``) and the ``task`` tag hold the new count.

The rest happens in callbacks, through public Lightning hooks and ``MlflowClient`` calls:
:class:`~fl_lightning.callbacks.mlflow_run.MLflowRunInfo` (tags, inputs, artifacts, the runs in
every checkpoint, a continued run marked RUNNING with its checkpoint's round restored) and
:mod:`~fl_lightning.callbacks.fit_report` (what the fit prints, the run's ``config.yaml``).
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, cast

import lightning.pytorch as pl
import torch
from jsonargparse import Namespace
from lightning.pytorch.loggers import MLFlowLogger
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

from fl_lightning.callbacks.hparams import mlflow_params
from fl_lightning.callbacks.mlflow_run import CHECKPOINT_KEY, saved_runs
from fl_lightning.callbacks.mlflow_store import (
    DEFAULT_STORES,
    open_mlflow_experiment,
    run_exists,
    same_store,
)
from fl_lightning.callbacks.mlflow_ui import chart_aliases
from fl_lightning.callbacks.run_identity import loggable_hparams, run_name
from fl_lightning.records.store_uri import local_store_missing

TRACKING_URI_OPTION = "--trainer.logger.init_args.tracking_uri"
RESUMABLE_CHANGES = frozenset({"num_rounds"})  # params a continued run may change (it keeps the first value)


def refuse(message: str) -> None:
    """A resume that cannot work: one line, exit code 2, before anything is created."""
    print(f"error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(2)


# --------------------------------------------------------------------------- rounds


def checkpoint_rounds(checkpoint: Mapping[str, Any]) -> tuple[int, int | None]:
    """(rounds the checkpoint completed, the num_rounds its fit planned)."""
    record = checkpoint.get(CHECKPOINT_KEY) or {}
    if "rounds_completed" in record:
        done = int(record["rounds_completed"])
    else:  # a checkpoint from elsewhere: the fit loop's count
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {})
        done = int(progress.get("processed", checkpoint.get("epoch", -1) + 1))
    planned = (checkpoint.get("hyper_parameters") or {}).get("num_rounds")
    return done, None if planned is None else int(planned)


def resumed_rounds(ckpt_path: str, checkpoint: Mapping[str, Any], requested: int | None,
                   unfinished_run: bool = False) -> int | None:
    """The num_rounds a fit resumed from ``checkpoint`` plans: ``requested`` (the command line's),
    else the checkpoint's; refused (one line, exit 2) when it is fewer than the checkpoint
    completed, or when nothing is left to do: every round done and its run finished (a run
    whose fit died after its last round, ``unfinished_run``, is finished by the resume: its
    last metrics, final artefacts and end)."""
    done, planned = checkpoint_rounds(checkpoint)
    rounds = requested if requested is not None else planned
    if rounds is None:
        return None
    if rounds < done:
        refuse(f"--model.num_rounds {rounds} is fewer than the {done} rounds {ckpt_path} completed: a run cannot "
               f"be shortened; pass more than {done} to extend it, or leave --model.num_rounds out to finish it")
    if rounds == done and unfinished_run:
        print(f"Resuming from {ckpt_path}: all {done} rounds were done, but its run was not ended; the resumed fit "
              "ends it (its last metrics and final artefacts)", flush=True)
    elif rounds == done:
        refuse(f"{ckpt_path} completed all {done} rounds its fit planned, so there is nothing to resume; "
               f"to extend the run, pass --model.num_rounds with more than {done}")
    if planned is not None and rounds != planned:
        print(f"Resuming from {ckpt_path}: the run planned {planned} rounds and completed {done}; it continues to "
              f"{rounds} (--model.num_rounds)", flush=True)
    return rounds


def run_status(run: Mapping[str, str]) -> str | None:
    """The status of a run a checkpoint recorded, read from its store (None where the store or
    the run cannot be read; no store is created)."""
    if local_store_missing(run["tracking_uri"]):
        return None
    try:
        return str(MlflowClient(run["tracking_uri"]).get_run(run["run_id"]).info.status)
    except Exception:  # noqa: BLE001 - an unreadable store is only "not known" here
        return None


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
    ``already_logged`` (what the interrupted fit logged past its checkpoint; MLflow would keep
    both values) and the params of ``kept_params`` (values MLflow keeps from the run's start,
    e.g. the ``num_rounds`` of an extended run) are left out of what it logs."""

    def __init__(self, *args: Any, already_logged: Iterable[tuple[str, int]] = (),
                 kept_params: Iterable[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.already_logged = frozenset(already_logged)
        self.kept_params = frozenset(kept_params)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        super().log_metrics({k: v for k, v in metrics.items() if (k, step or 0) not in self.already_logged}, step)

    def log_hyperparams(self, params: Any) -> None:
        if self.kept_params and isinstance(params, Mapping):
            params = {k: v for k, v in params.items() if k not in self.kept_params}
        super().log_hyperparams(params)


class AccuracyChartsFirst(MLFlowLogger):
    """An :class:`MLFlowLogger` that also logs the accuracy and fairness metrics under a chart
    section that MLflow's run page shows first (:func:`~fl_lightning.callbacks.mlflow_ui.chart_aliases`)."""

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        super().log_metrics({**metrics, **chart_aliases(metrics)}, step)


@functools.cache
def fit_logger_class(cls: type[MLFlowLogger], continued: bool) -> type[MLFlowLogger]:
    """``cls`` (MLFlowLogger or a subclass) as a command-line fit logs with it: accuracy charts
    first (:class:`AccuracyChartsFirst`), and for a continued run :class:`ContinuedRunLogger`'s filters."""
    bases = (AccuracyChartsFirst, continued_run_class(cls)) if continued else (AccuracyChartsFirst, cls)
    return type(cls.__name__, bases, {"__module__": cls.__module__})


@functools.cache
def continued_run_class(cls: type[MLFlowLogger]) -> type[ContinuedRunLogger]:
    """``cls`` (MLFlowLogger or a subclass of it) with :class:`ContinuedRunLogger`'s filters."""
    if issubclass(cls, ContinuedRunLogger):
        return cls
    if cls is MLFlowLogger:
        return ContinuedRunLogger
    return type(cls.__name__, (ContinuedRunLogger, cls), {"__module__": cls.__module__})


# --------------------------------------------------------------------------- the fit's loggers


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

    def __init__(self, config: Namespace, ckpt_path: str | None = None, num_rounds: int | None = None) -> None:
        """Before the loggers' clients open the stores: for a resumed fit (``ckpt_path``), the
        rounds it plans (``num_rounds``: what the command line asked for, read before LightningCLI
        replaced the model's settings with the checkpoint's) and the run it continues, in the
        logger's store or the one the checkpoint recorded (read, never created); a resume that
        cannot work is refused before anything is created. The stores are created later, by
        :meth:`open_stores`, once the data is built."""
        entries = config.trainer.get("logger")
        self.entries_given = entries
        self.entries = entries if isinstance(entries, list) else [entries]
        self.resumed: dict[str, Any] = {}
        self.continued: set[str] = set()
        self.moved: set[str] = set()  # runs continued in the store their checkpoint recorded
        self.elsewhere: set[str] = set()  # runs in their recorded store, not in the one given
        runs: list[dict[str, str]] = []
        found: list[dict[str, str] | None] = []
        if ckpt_path and Path(ckpt_path).is_file():
            checkpoint = torch.load(ckpt_path, map_location="cpu", weights_only=True, mmap=True)
            self.resumed = checkpoint.get(CHECKPOINT_KEY) or {}
            rounds = resumed_rounds(ckpt_path, checkpoint, num_rounds,
                                    any(run_status(run) not in (None, "FINISHED") for run in saved_runs(checkpoint)))
            model = config.get("model")
            if rounds is not None and model is not None and model.get("init_args") is not None:
                model.init_args.num_rounds = rounds
            runs = saved_runs(checkpoint)
            found = self._find_runs(ckpt_path, runs)  # reads the stores; creates nothing
        self.ckpt_path, self.runs, self.found = ckpt_path or "", runs, found

    def open_stores(self) -> None:
        """Create each store and experiment, and point every MLflow logger with no ``run_id`` of
        its own at the run the checkpoint's fit logged to: after every check has passed (the
        data built), so that a refused fit leaves no store behind."""
        for entry in self.mlflow_configs():
            init_args = entry.init_args
            name = None if init_args.get("run_id") else init_args.get("experiment_name")
            open_mlflow_experiment(configured_tracking_uri(init_args), name, init_args.get("artifact_location"))
        if self.runs:
            self._continue_runs(self.ckpt_path, self.runs, self.found)

    def mlflow_configs(self) -> list[Namespace]:
        return [entry for entry in self.entries if is_mlflow_logger_config(entry)]

    def _find_runs(self, ckpt_path: str, runs: list[dict[str, str]]) -> list[dict[str, str] | None]:
        """For each MLflow logger (None where it has a run_id of its own), the checkpoint's run it
        continues: in the logger's store, else in the store the checkpoint recorded, which the
        logger then logs to when no store was given (a relative default names another file in
        another directory). A store given explicitly that lacks the run gets a new run (with a
        line naming the store that holds it), as does a run in neither store."""
        found: list[dict[str, str] | None] = []
        for entry in self.mlflow_configs():
            init_args = entry.init_args
            if init_args.get("run_id") or not runs:
                found.append(None)
                continue
            uri = configured_tracking_uri(init_args)
            here = next((run for run in runs if run_exists(uri, run["run_id"])), None)
            if here is not None:
                found.append(here)
                continue
            recorded = next((run for run in runs if not same_store(run["tracking_uri"], uri)
                             and run_exists(run["tracking_uri"], run["run_id"])), None)
            if recorded is None:
                found.append(None)
                continue
            if uri not in DEFAULT_STORES:
                print(
                    f"Resuming from {ckpt_path}: its MLflow run {recorded['run_id']} is in {recorded['tracking_uri']}, "
                    f"not in {uri}, so the resumed fit logs to a new run in {uri}; to continue that run, pass "
                    f"{TRACKING_URI_OPTION} {recorded['tracking_uri']}",
                    flush=True,
                )
                self.elsewhere.add(recorded["run_id"])
                found.append(None)
                continue
            init_args.tracking_uri = recorded["tracking_uri"]
            self.moved.add(recorded["run_id"])
            found.append(recorded)
        return found

    def _continue_runs(self, ckpt_path: str, runs: list[dict[str, str]], found: list[dict[str, str] | None]) -> None:
        for entry, run in zip(self.mlflow_configs(), found, strict=True):
            init_args = entry.init_args
            if init_args.get("run_id"):
                continue
            uri = configured_tracking_uri(init_args)
            if run is None:
                if not self.elsewhere:  # said already when the run is in another store
                    where = ", ".join(f"{run['run_id']} in {run['tracking_uri']}" for run in runs)
                    print(f"Resuming from {ckpt_path}: its MLflow run ({where}) is not in {uri}, so the resumed fit "
                          f"logs to a new run", flush=True)
                continue
            init_args.run_id = run["run_id"]
            self.continued.add(run["run_id"])
            how = f"{uri} (the store the checkpoint recorded)" if run["run_id"] in self.moved else uri
            print(f"Resuming from {ckpt_path}: continuing MLflow run {run['run_id']} in {how}", flush=True)

    def held_back(self, logger: Any) -> Any:
        """The ``trainer.logger`` value LightningCLI instantiates: the configured one with every
        MLflow logger left out (None in its place). Building an MLflow logger opens its store (an
        ``MlflowClient`` creates a missing SQLite database), so they are built by
        :meth:`trainer_loggers`, after every check has passed."""
        if isinstance(logger, list):
            return [None if is_mlflow_logger_config(entry) else entry for entry in logger]
        return None if is_mlflow_logger_config(logger) else logger

    def trainer_loggers(self, built: Any, model: pl.LightningModule, datamodule: Any = None) -> Any:
        """The trainer's ``logger`` argument: ``built`` (LightningCLI's instances of the configured
        loggers, one per entry, None for the MLflow ones: :meth:`held_back`) with every MLflow
        logger built, in its store, with its final run_id and name."""
        self.open_stores()
        instances = built if isinstance(built, list) else [built]
        final = [self._final_logger(entry, logger, model, datamodule)
                 for entry, logger in zip(self.entries, instances, strict=True)]
        return final if isinstance(self.entries_given, list) else final[0]

    def _final_logger(self, entry: Any, logger: Any, model: pl.LightningModule, datamodule: Any) -> Any:
        if not is_mlflow_logger_config(entry):
            return logger
        init_args = entry.init_args
        given = (init_args.get("run_id"), init_args.get("run_name"))
        already_logged: set[tuple[str, int]] = set()
        kept: set[str] = set()
        if given[0] in self.continued:
            client = MlflowClient(configured_tracking_uri(init_args))
            changed = changed_params(client, given[0], loggable_hparams(model, datamodule))
            kept = set(changed) & RESUMABLE_CHANGES  # e.g. an extended run's num_rounds
            changed = {k: v for k, v in changed.items() if k not in kept}
            if changed:  # MLflow keeps one value per parameter: logging another fails the fit
                shown = ", ".join(f"{k} {old} -> {new}" for k, (old, new) in sorted(changed.items()))
                print(f"The resumed fit changes settings of MLflow run {given[0]} ({shown}); "
                      "MLflow keeps one value per parameter, so it logs to a new run", flush=True)
                init_args.run_id = None  # the saved config.yaml names the run the fit logs to
                kept = set()
            else:
                already_logged = logged_after(client, given[0], int(self.resumed.get("rounds_completed", 0)))
        run_id = init_args.get("run_id")
        name = given[1] if run_id else run_name_for(init_args, model, datamodule)
        kwargs = {**init_args.as_dict(), "run_id": run_id, "run_name": name}
        module, _, class_name = str(entry.class_path).rpartition(".")
        cls = getattr(importlib.import_module(module), class_name)
        if already_logged or kept:
            continued = cast(type[ContinuedRunLogger], fit_logger_class(cls, True))  # a ContinuedRunLogger subclass
            return continued(**kwargs, already_logged=already_logged, kept_params=kept)
        return fit_logger_class(cls, False)(**kwargs)
