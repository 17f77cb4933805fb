"""The LightningCLI behind ``fl-lightning fit --config X.yaml``: federated algorithms and data.

The algorithm is chosen by class path (``--model FedProx`` or
``--model fl_lightning.algorithms.FedProx``), the data by source/partition names, the
backbone by registered model name; anything can be overridden on the command line.
Without ``--config`` the embedded default runs (``configs/default.yaml``: FedAvg on the
offline mnist5k digits) and logs to the local MLflow store ``sqlite:///mlruns.db``.

Only ``fit`` is offered: every client is evaluated during the fit, every ``eval_every`` rounds
and after the last, and logged to the fit's MLflow run. A new run is named after what it is
(``FedFV seed 0 (tau=1) | mnist5k/dirichlet(alpha=0.5) | 1605-3fa2``) unless
``--trainer.logger.init_args.run_name`` names it; a continued run keeps its name.

A checkpoint, ``last.ckpt``, is saved every few rounds (as often as costs at most 10% of the fit's
time), after the last one and when a fit is stopped or fails (the last round it completed), under
``checkpoints/<experiment id>/<run id>/checkpoints/``; ``--ckpt_path`` resumes from it, exactly,
and the resumed fit keeps logging into the interrupted fit's MLflow run.

This module is the LightningCLI wiring only: parsing, the one command, one-line errors
(``fl_lightning.cli`` is the console script: it answers the top-level ``--help`` without
importing Lightning, and hands everything else to :func:`run`). The
MLflow stores, runs, names and resumes are :mod:`fl_lightning.callbacks.fit_runs`'s, which two
LightningCLI hooks forward to (``before_instantiate_classes``, ``instantiate_trainer``).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import time
import warnings
from pathlib import Path
from typing import Any, NoReturn

import torch
from jsonargparse import DefaultHelpFormatter, Namespace
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import MLFlowLogger
from mlflow.tracking import MlflowClient

from fl_lightning.algorithms import ALGORITHMS  # also registers the classes for --model
from fl_lightning.callbacks import LogHyperparameters, MLflowRunInfo, RoundProgressBar
from fl_lightning.callbacks.checkpointing import default_checkpoint
from fl_lightning.callbacks.fit_report import FitReport, MLflowSaveConfig
from fl_lightning.callbacks.fit_runs import MLflowFitSetup, configured_tracking_uri
from fl_lightning.callbacks.signals import StopOnSignal
from fl_lightning.choices import unknown_algorithm, unknown_algorithm_message
from fl_lightning.cli.command_line import read_command_line
from fl_lightning.cli.parse_errors import diagnose, union_reasons
from fl_lightning.cli.preflight import (
    PreflightError,
    check_accelerator,
    check_checkpoint,
    check_config_files,
    check_fit_length,
    check_resume,
    check_seed,
    check_tracking_store,
)
from fl_lightning.cli.settings import (
    BASE_MODULE_PATHS,
    DATA_LINKS,
    config_paths,
    fill_partition_params,
    fit_model_defaults,
    given_model_settings,
    given_settings,
    mlflow_logger_configs,
    model_help_request,
    print_config_words,
    refused_subcommand,
    restore_own_defaults,
)
from fl_lightning.configs import DEFAULT_CONFIG
from fl_lightning.core.module import FederatedModule
from fl_lightning.core.progress import LIGHTNING_DEPRECATIONS
from fl_lightning.core.settings import setting_rule, signature_types
from fl_lightning.core.threads import set_threads
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.faults import FitFaults, fault_line, save_traceback
from fl_lightning.records.fit_lock import RunLock, check_writable_folder, release_all
from fl_lightning.records.vocabulary import DEFAULT_EXPERIMENT, DEFAULT_TRACKING_URI
from fl_lightning.seeding import SEED_ENV

HELP_WIDTH = 100  # columns: ``fit --help`` stays readable in a wide terminal too


class NarrowHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help, at most ``HELP_WIDTH`` columns wide (argparse fills the terminal)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["width"] = min(kwargs.get("width") or shutil.get_terminal_size().columns - 2, HELP_WIDTH)
        super().__init__(*args, **kwargs)


class ReadableArgumentParser(LightningArgumentParser):
    """LightningCLI's parser, whose errors are one line that says what is wrong, without the
    usage text (``--help`` shows it), and whose help is at most ``HELP_WIDTH`` columns wide.

    A refused command line is explained from the settings it gives (``parse_errors.diagnose``),
    not from jsonargparse's text; ``command_words`` is the command line being parsed."""

    command_words: list[str] = []
    # set by FederatedCLI.parse_arguments for the one parse of a command line that asks for them:
    fit_help_defaults: tuple[type, dict[str, Any]] | None = None  # --model.help X: X and a fit's settings of it
    printed_model_settings: dict[str, Any] | None = None  # --print_config: the model settings given

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["formatter_class"] = NarrowHelpFormatter
        kwargs["allow_abbrev"] = False  # a misspelt name that is the start of a real one is refused too
        super().__init__(*args, **kwargs)

    def add_class_arguments(self, class_type: Any, nested_key: str | None = None, *args: Any,
                            **kwargs: Any) -> list[str]:
        """jsonargparse's arguments of ``class_type``, each help ending with the rule its type
        states ("Must be in (0, 1]."): jsonargparse reads the signature without ``Annotated``'s
        metadata, so the help would say only ``float``. Serves ``--help`` and ``--model.help X``."""
        added = super().add_class_arguments(class_type, nested_key, *args, **kwargs)
        try:
            types = signature_types(class_type)
        except TypeError:  # annotations that do not resolve at run time: the help as jsonargparse writes it
            return added
        prefix = f"{nested_key}." if nested_key else ""
        for action in self._actions:
            rule = setting_rule(types.get(action.dest[len(prefix):])) if action.dest.startswith(prefix) else None
            if rule and "Must be " not in (action.help or ""):
                said = f"Must be {rule.replace('%', '%%')}."  # argparse %-formats a help
                action.help = f"{action.help.rstrip()} {said}" if action.help else said
        if nested_key == "model" and self.fit_help_defaults is not None and self.fit_help_defaults[0] is class_type:
            self.show_fit_defaults(self.fit_help_defaults[1])
        return added

    def show_fit_defaults(self, settings: dict[str, Any]) -> None:
        """``--model.help X``'s defaults made the ones a fit of X gets (``fit_model_defaults``):
        jsonargparse's help parser shows the class's signature, not the default config's values
        (lr 0.05, eval_every 5) nor the data's (num_classes). Only the help's own parser is changed."""
        for action in self._actions:
            name = action.dest.removeprefix("model.")
            if action.dest.startswith("model.") and name in settings:
                action.default = settings[name]

    def dump(self, namespace: Namespace, *args: Any, **kwargs: Any) -> str:
        """jsonargparse's dump; for ``--print_config`` (printed inside the parse, before
        :meth:`FederatedCLI.parse_arguments` restores the algorithm's own defaults), the config with
        them restored, as the fit gets it (AFL's fraction 1.0, not FedAvg's 0.1 carried over), and
        the partitioner's defaults filled in (``fill_partition_params``): fed back as ``--config``,
        it gives the same run."""
        given = self.printed_model_settings
        if given is not None and isinstance(namespace, Namespace):
            namespace = namespace.clone()
            if not namespace.get("ckpt_path"):
                restore_own_defaults(namespace.get("model"), given)
            fill_partition_params(namespace.get("data"))
        return super().dump(namespace, *args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> Any:
        if not self.exit_on_error:  # jsonargparse trying an alternative: it catches the error
            return super().error(message, ex)
        refuse(diagnose(self.command_words) or union_reasons(message))


def refuse(message: str) -> NoReturn:
    """Exit with status 2 after one line, ``error: message``."""
    sys.stderr.write(f"error: {message}\n")
    raise SystemExit(2)


class FederatedCLI(LightningCLI):
    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """Only ``fit``: evaluation runs inside it (``validate``/``test`` would evaluate data
        built from the defaults, not the fit's)."""
        return {"fit": LightningCLI.subcommands()["fit"]}

    def parse_arguments(self, parser: Any, args: Any) -> None:
        """Parses the command line into ``self.config`` and refuses, with one ``error:`` line and exit 2, what
        would fail later: an evaluation subcommand, an unknown algorithm, a bad config file, and, before any store
        or checkpoint folder is touched, a bad seed, fit length, accelerator, checkpoint, resume or tracking
        store. A new fit gets the chosen algorithm's own defaults back; a resumed one takes its run's lock."""
        command_args = list(read_command_line(args).words)  # run() gives the words read once
        ReadableArgumentParser.command_words = command_args  # the subcommand's parser reports the errors
        refusal = refused_subcommand(command_args)
        if refusal is not None:
            print(refusal, file=sys.stderr)
            raise SystemExit(2)
        name = unknown_algorithm(command_args, ALGORITHMS)
        if name is not None:
            refuse(unknown_algorithm_message(name, ALGORITHMS))
        try:
            check_config_files(config_paths(command_args))
        except PreflightError as error:
            refuse(str(error))
        help_asked, printed = model_help_request(command_args), print_config_words(command_args)
        try:  # what jsonargparse prints inside the parse (--model.help, --print_config) is what the fit gets
            if help_asked is not None:
                before, name = help_asked
                ReadableArgumentParser.fit_help_defaults = fit_model_defaults(parser, [*before, "--model", name])
            if printed:
                words = [word for word in command_args if word not in printed]
                ReadableArgumentParser.printed_model_settings = given_model_settings(parser, words)
            # LightningCLI's own parse of a list of words (its warning about sys.argv beside ``args``
            # does not apply: the words are the command line, read once)
            self.config = parser.parse_args(command_args)
        finally:
            ReadableArgumentParser.fit_help_defaults = ReadableArgumentParser.printed_model_settings = None
        subcommand = self.config.get("subcommand")
        config = self.config.get(subcommand) if subcommand else self.config
        given = given_settings(parser, command_args)
        model_given = given.get("model") if isinstance(given.get("model"), Namespace) else Namespace()
        init_given = model_given.get("init_args")
        init_given = init_given.as_dict() if isinstance(init_given, Namespace) else {}
        # the rounds asked for, read before LightningCLI replaces the model's settings with a checkpoint's
        self.requested_rounds = init_given.get("num_rounds") if config.get("ckpt_path") else None
        if not config.get("ckpt_path"):  # a resumed fit keeps its checkpoint's settings
            restore_own_defaults(config.get("model"), init_given)
        try:  # before anything is created: no MLflow store touched, no checkpoint folder
            check_seed(config.get("seed_everything"))
            trainer_given = given.get("trainer")
            check_fit_length(trainer_given.as_dict() if isinstance(trainer_given, Namespace) else {})
            check_accelerator(config.trainer.get("accelerator"), config.trainer.get("devices"))
            checkpoint = check_checkpoint(config.get("ckpt_path"))
            if checkpoint is not None:
                model_class = model_given.get("class_path")
                check_resume(config.ckpt_path, checkpoint,
                             None if model_class in BASE_MODULE_PATHS else model_class, init_given,
                             config.data.as_dict(), config.get("seed_everything"))
            for entry in mlflow_logger_configs(config.trainer.get("logger")):
                check_tracking_store(configured_tracking_uri(entry.init_args))
            if checkpoint is not None:  # last: one fit per run (released however this fit ends)
                RunLock.acquire(Path(config.ckpt_path).resolve().parent)
        except PreflightError as error:
            refuse(str(error))

    def add_arguments_to_parser(self, parser: Any) -> None:
        for name in DATA_LINKS:
            parser.link_arguments(f"data.{name}", f"model.init_args.{name}", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        """The MLflow stores and the run a checkpoint continues, before the loggers are built."""
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        ckpt_path = config.get("ckpt_path") if self.subcommand == "fit" else None
        self.mlflow_setup = MLflowFitSetup(config, ckpt_path, num_rounds=self.requested_rounds)

    def instantiate_classes(self) -> None:
        """A wrong value that only the class itself can check (an unknown source) exits with the
        class's own message, not jsonargparse's Union dump. The MLflow loggers are left out
        (:meth:`MLflowFitSetup.held_back`): built, they would create their stores before the data
        is checked."""
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        configured = config.trainer.get("logger")
        config.trainer.logger = self.mlflow_setup.held_back(configured)  # built once the data is
        try:
            super().instantiate_classes()
        except (ValueError, TypeError) as error:  # the class's own message
            refuse(union_reasons(str(error)))
        finally:
            config.trainer.logger = configured  # the run's config.yaml shows it

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The trainer, with its MLflow loggers built for this fit's run (continued or named).

        The data is built first, before the trainer and the fit's MLflow run exist: missing
        files and partitions the source cannot fill are refused first (``setup`` runs once;
        the fit reuses it)."""
        self.model.fit_threads.start()  # the run's own count, before the data is built
        try:
            self.datamodule.prepare_data()
            self.datamodule.setup("fit")
        except (ValueError, FileNotFoundError) as error:
            refuse(str(error))
        config = self.config_init.get(self.subcommand) if self.subcommand else self.config_init
        loggers = self.mlflow_setup.trainer_loggers(config.trainer.get("logger"), self.model, self.datamodule)
        defaults = self.trainer_defaults["callbacks"]
        if config.trainer.get("enable_progress_bar") is False:  # Lightning refuses a progress bar then
            defaults = [callback for callback in defaults if not isinstance(callback, RoundProgressBar)]
        self.trainer_defaults["callbacks"] = [  # RoundCheckpoint, unless the user configured a ModelCheckpoint
            *defaults,
            *default_checkpoint(config.trainer.get("callbacks") or [], config.trainer.get("enable_checkpointing"),
                                self.checkpoint_folder(config, loggers))]
        trainer = super().instantiate_trainer(**{"logger": loggers, **kwargs})
        try:
            hold_run_lock(trainer, self.experiment_id())
        except PreflightError as error:
            refuse(str(error))
        return trainer

    def experiment_id(self) -> str | None:
        """The id of the experiment the first MLflow logger logs a new run to (its store is open by
        now), read without creating the run; None where it cannot be told."""
        configs = self.mlflow_setup.mlflow_configs()
        if not configs or configs[0].init_args.get("run_id"):
            return None
        init_args = configs[0].init_args
        try:
            experiment = MlflowClient(configured_tracking_uri(init_args)).get_experiment_by_name(
                init_args.get("experiment_name") or DEFAULT_EXPERIMENT)
        except Exception:  # noqa: BLE001 - only the check of that one folder is left out
            return None
        return None if experiment is None else str(experiment.experiment_id)

    def checkpoint_folder(self, config: Namespace, loggers: Any) -> Path | None:
        """Where this fit's ``last.ckpt`` goes when it is not Lightning's run folder
        (``checkpoints/<experiment id>/<run id>/checkpoints``): a resume that continues its run
        keeps writing into the folder it resumed from (a run's checkpoints never split between
        two folders, wherever the resume is started); a fit without a logger gets a folder of
        its own (``checkpoints/unlogged/<start time>-<process id>/checkpoints``), so that a
        second such fit neither versions the file (``last-v1.ckpt``) nor overwrites the first."""
        ckpt_path = config.get("ckpt_path") if self.subcommand == "fit" else None
        logged = bool([logger for logger in (loggers if isinstance(loggers, list) else [loggers]) if logger])
        if ckpt_path and Path(ckpt_path).is_file() and (not logged or self.mlflow_setup.continued):
            return Path(ckpt_path).resolve().parent
        if not logged:
            unlogged = (Path(config.trainer.get("default_root_dir") or "checkpoints") / "unlogged").absolute()
            started = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            for attempt in range(1, 1000):  # a folder no other fit has: made here, exclusively
                folder = unlogged / (started if attempt == 1 else f"{started}-{attempt}")
                try:
                    folder.mkdir(parents=True)
                except FileExistsError:
                    continue
                return folder / "checkpoints"
        return None


def hold_run_lock(trainer: Trainer, experiment_id: str | None = None) -> None:
    """The fit's run's ``fit.lock``, taken as the run is created (fresh) or continued (resumed),
    held until the fit ends (``fit_lock.release_all``): the fit's own printed resume command,
    run while it runs, is refused. The checkpoint folder is checked before the run is created:
    a fit that could not write its checkpoints creates no run. The folder is the one the
    checkpoint callback writes to: its ``dirpath``, else Lightning's
    ``<save_dir or default_root_dir>/<experiment id>/<run id>/checkpoints``; a fit with no
    checkpoint callback, or whose first logger is not MLflow's, holds none."""
    callback = trainer.checkpoint_callback
    if callback is None or not trainer.loggers:
        return
    dirpath = getattr(callback, "dirpath", None)
    if dirpath:
        if any(isinstance(logger, MLFlowLogger) for logger in trainer.loggers):
            RunLock.acquire(Path(dirpath), make=True)
        return
    first = trainer.loggers[0]
    if not isinstance(first, MLFlowLogger):
        return
    root = Path(first.save_dir or trainer.default_root_dir)
    check_writable_folder(root / experiment_id if experiment_id else root)  # before the run exists
    RunLock.acquire(root / str(first.name) / str(first.version) / "checkpoints", make=True)


def trainer_defaults(command_args: list[str] | None = None) -> dict[str, Any]:
    """The CLI's Trainer defaults: an MLflow logger on the default store, the round progress bar and the
    run-info, hyperparameter and fit-report callbacks (``command_args``: the command line the report's resume
    line repeats), checkpoints under ``checkpoints/``, and no length of its own (the module sets it)."""
    return {
        "logger": {
            "class_path": "lightning.pytorch.loggers.MLFlowLogger",
            "init_args": {"experiment_name": DEFAULT_EXPERIMENT, "tracking_uri": DEFAULT_TRACKING_URI},
        },
        "callbacks": [RoundProgressBar(), MLflowRunInfo(), LogHyperparameters(), FitReport(command_args or [])],
        "default_root_dir": "checkpoints",  # checkpoints/<experiment id>/<run id>/checkpoints/
        "max_epochs": -1,  # the module sets it to num_rounds when the fit starts
        "num_sanity_val_steps": 0,
        "log_every_n_steps": 1,
        "enable_model_summary": False,
        "enable_autolog_hparams": False,  # LogHyperparameters logs them, without LightningCLI's "_" entries
    }


# what Lightning and torch print that a user of the CLI cannot act on: Lightning's INFO lines
# ("GPU available", "Seed set to", the litlogger tip, "`Trainer.fit` stopped", "Detected
# KeyboardInterrupt"), MLflow's and alembic's lines while a new store's tables are made, and
# torch's LeafSpec deprecation, which Lightning's own pytree code triggers
QUIET_LOGGERS = ("lightning.pytorch", "lightning.fabric", "mlflow.store.db.utils", "alembic")
# loggers that log an error's traceback before raising it: the error reaches the CLI, which says
# it in one line and saves its traceback (``faults``); their copy would be a second, longer report
RAISING_LOGGERS = ("mlflow.store.db.utils",)
QUIET_WARNINGS = LIGHTNING_DEPRECATIONS  # one list with the module's own filter (core.progress)


def quiet_library_output() -> None:
    """Lightning's informational lines and known library warnings left out of a fit's output
    (``logging``: raise the loggers' level back to see them)."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in RAISING_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    for message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


SEED_ENVIRONMENT = (SEED_ENV, "PL_SEED_WORKERS")  # what seed_everything sets in os.environ


def run(args: list[str] | None = None) -> None:
    """``fl-lightning`` through LightningCLI (``args`` lets tests call it in-process). A fit
    stopped by a signal (Ctrl-C, SIGTERM: a SLURM pre-emption) exits with the shell's status for
    it, 128 + the signal's number (130, 143), after one line that names the signal. The seed
    ``seed_everything`` leaves in the environment and the process's thread count are put back
    afterwards, however the fit ends: a later fit in the same process (a notebook, a test
    session, ``replay``) never inherits this fit's seed or count."""
    words = list(read_command_line(args).words)  # sys.argv read here once when not given
    quiet_library_output()
    StopOnSignal.stopped_by = None
    FitFaults.reset()
    seed_environment = {name: os.environ.get(name) for name in SEED_ENVIRONMENT}
    # the run's count is set before the data is built; a refusal after must not keep it
    threads = torch.get_num_threads()
    try:
        FederatedCLI(
            FederatedModule,
            FederatedDataModule,
            subclass_mode_model=True,
            save_config_callback=MLflowSaveConfig,
            save_config_kwargs={"save_to_log_dir": False},
            trainer_defaults=trainer_defaults(words),
            parser_kwargs={"fit": {"default_config_files": [str(DEFAULT_CONFIG)]}},
            args=words,
            parser_class=ReadableArgumentParser,
            auto_configure_optimizers=False,
        )
    except Exception as error:
        fault = fault_line(error)
        if fault is None:  # a bug, not a fault of the machine: its traceback is the report
            raise
        log = save_traceback(error, [FitFaults.folder])
        where = (
            f"the full traceback is in {log}" if log else "the traceback could not be saved: every disk tried is full"
        )
        if FitFaults.said is None:  # before the fit began: nothing to resume
            print(f"error: {fault}; once that is fixed, run the same command again", file=sys.stderr)
        print(f"({where})", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    except SystemExit as exit_:
        signum = StopOnSignal.stopped_by
        if signum is None or exit_.code in (0, None):
            raise
        name = signal.Signals(signum).name
        print(f"{'terminated' if signum == signal.SIGTERM else 'interrupted'} ({name})", file=sys.stderr, flush=True)
        raise SystemExit(128 + signum) from None
    finally:
        release_all()
        set_threads(threads)
        for name, value in seed_environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
