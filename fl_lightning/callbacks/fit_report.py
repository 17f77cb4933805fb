"""What a command-line fit says, and the config it leaves in its run.

:class:`FitReport` prints, at the start, the checkpoint a stopped or killed fit resumes from and
the command that resumes it; when the fit stops (Ctrl-C or SIGTERM, through
:mod:`~fl_lightning.callbacks.signals`) or fails, the command again; at the end, one summary line
per run and how to open it in the MLflow UI (the links are
:func:`~fl_lightning.callbacks.mlflow_ui.ui_links`'). A printed command runs as printed, from the
folder the fit ran in (:func:`console_command`, :func:`shell_command`).
:class:`MLflowSaveConfig` logs the resolved config as the run's ``config.yaml``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import MLFlowLogger

from fl_lightning.callbacks.checkpointing import RoundCheckpoint
from fl_lightning.callbacks.mlflow_run import mlflow_loggers
from fl_lightning.callbacks.mlflow_ui import ui_links
from fl_lightning.callbacks.signals import (
    StopOnSignal,
    end_killed,
    interrupted,
    release_interrupted_calls,
)
from fl_lightning.core.progress import FitSummary, summary_line
from fl_lightning.faults import FitFaults, fault_line


def console_command(script: str, module: str) -> list[str]:
    """How the shell the fit runs in starts this installation's console ``script``
    (``fl-lightning``, ``mlflow``): its bare name when ``PATH`` finds this very script, else its
    path beside the running Python (a virtual environment that was never activated), else
    ``python -m module``."""
    beside = Path(sys.executable).parent / script
    found = shutil.which(script)
    if beside.is_file():
        same = found is not None and Path(found).resolve() == beside.resolve()
        return [script] if same else [str(beside.absolute())]
    return [script] if found else [sys.executable, "-m", module]


def shell_command(words: list[str]) -> str:
    """``words`` as a shell line that runs as printed from the folder it was printed in: prefixed
    with the ``PYTHONPATH`` this process was given (what made a custom algorithm importable)."""
    line = shlex.join(words)
    path = os.environ.get("PYTHONPATH")
    return f"PYTHONPATH={shlex.quote(path)} {line}" if path else line


def results_text(trainer: pl.Trainer, logger: MLFlowLogger) -> str:
    """What a finished fit says: one summary line (rounds, the mean and worst-10 % client
    accuracy, the run's name: :func:`~fl_lightning.core.progress.summary_line`), then how to look
    at the run in the MLflow UI."""
    client, run_id = logger.experiment, str(logger.run_id)
    uri = client.tracking_uri
    run = client.get_run(run_id)
    runs_view, run_page = ui_links(uri, run.info.experiment_id, run_id)
    summary = summary_line(trainer, run.data.metrics, run.info.run_name)
    if uri.startswith(("http://", "https://")):
        return f"\n{summary}\nOpen it: {run_page}\n(the experiment's runs: {runs_view})"
    ui = shell_command([*console_command("mlflow", "mlflow"), "ui", "--backend-store-uri", uri])
    return f"\n{summary}\nSee it:  {ui}\nthen open {run_page}"


def resume_command(args: list[str], checkpoint: str) -> str:
    """The command line that resumes the fit ``fl-lightning <args>`` from ``checkpoint``, as it
    runs from the folder the fit ran in (:func:`console_command`, :func:`shell_command`)."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--ckpt_path":
            skip = True
        elif not arg.startswith("--ckpt_path="):
            kept.append(arg)
    return shell_command([*console_command("fl-lightning", "fl_lightning.cli"), *kept, "--ckpt_path", checkpoint])


def last_checkpoint(trainer: pl.Trainer) -> Path | None:
    """The checkpoint a stopped fit resumes from (absolute; None without one): ``last.ckpt`` of a
    checkpoint callback that keeps one, else the latest (or best) file a configured one wrote."""
    checkpoint = trainer.checkpoint_callback
    if not isinstance(checkpoint, ModelCheckpoint) or not checkpoint.dirpath:
        return None
    if not checkpoint.save_last:
        written = checkpoint.last_model_path or checkpoint.best_model_path
        return Path(written).absolute() if written else None
    return (Path(checkpoint.dirpath) / f"{checkpoint.CHECKPOINT_NAME_LAST}{checkpoint.FILE_EXTENSION}").absolute()


class FitReport(FitSummary):
    """What a command-line fit says (rank 0): at the start, the checkpoint a stopped or killed
    fit resumes from and the command that resumes it; when it stops, the command again; at the
    end, one summary line per run (rounds, mean and worst-10 % client accuracy, the run's name)
    and how to open it in the MLflow UI. A ``FitSummary``, so that the module adds no second
    closing line. The checkpoint is the CLI's
    :class:`~fl_lightning.callbacks.checkpointing.RoundCheckpoint` (``last.ckpt`` every N rounds;
    a stopping fit first writes the last round it completed), or the ``ModelCheckpoint`` the user
    configured, as configured.

    Ctrl-C and SIGTERM stop the fit the same way (SIGTERM raises ``KeyboardInterrupt`` while the
    fit trains): Lightning ends it, its MLflow runs end KILLED, their metrics kept
    (:func:`~fl_lightning.callbacks.signals.end_killed`), and the CLI exits with 130 or 143
    (``lightning_cli.run``)."""

    def __init__(self, command_args: list[str]) -> None:
        self.command_args = [str(arg) for arg in command_args]
        self.stopper: StopOnSignal | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        last = last_checkpoint(trainer)
        if not trainer.is_global_zero or last is None or not trainer.checkpoint_callback.save_last:  # type: ignore[union-attr]
            return
        print(f"Checkpoint: {last}\nIf the fit stops, resume it with:  "
              f"{resume_command(self.command_args, str(last))}", flush=True)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Ctrl-C and SIGTERM stop the fit (:class:`StopOnSignal`). Installed now, after
        Lightning's own SIGTERM handler, which it runs first."""
        self.stopper = StopOnSignal.install()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.stopper is not None:
            self.stopper.stop()  # a signal still waiting for a store call stops the fit here

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """A fit that was stopped (Ctrl-C, SIGTERM) or failed: its MLflow runs end KILLED when
        stopped, the last completed round is written to ``last.ckpt``, and rank 0 says how the
        fit ended and the command that resumes it (or that there is nothing to resume)."""
        if self.stopper is not None:
            self.stopper.pending = None
            self.stopper.cancel()
        stopped = interrupted(exception)
        if stopped:
            release_interrupted_calls(exception)
            for logger in mlflow_loggers(trainer):
                end_killed(logger)  # Lightning finalizes the loggers next, as "failed"
        rounds = None
        for callback in trainer.callbacks:  # type: ignore[attr-defined]
            if isinstance(callback, RoundCheckpoint):  # the last completed round, before it is reported
                callback.save_unsaved_round(trainer)
                rounds = callback.rounds_saved
        last = last_checkpoint(trainer)
        if not trainer.is_global_zero or last is None:
            return
        FitFaults.folder = last.parent
        fault = None if stopped else fault_line(exception)
        how = ("was stopped" if stopped else f"failed: {fault}" if fault
               else f"failed ({type(exception).__name__})")
        if fault:
            finished = trainer.max_epochs is not None and trainer.current_epoch >= trainer.max_epochs
            how += ", after its last round" if finished else f", in round {trainer.current_epoch + 1}"
        if last.is_file():
            after = f" (after round {rounds})" if rounds else ""
            said = (f"\nThe fit {how}; its last checkpoint{after} is {last}\nresume it with:  "
                    f"{resume_command(self.command_args, str(last))}")
        else:
            said = f"\nThe fit {how}, before its first checkpoint: nothing to resume; run it again"
        print(said, flush=True)
        FitFaults.said = said if fault else None

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:  # under DDP, rank 0 reports
            return
        for logger in mlflow_loggers(trainer):
            print(results_text(trainer, logger), flush=True)


class MLflowSaveConfig(SaveConfigCallback):
    """Logs the resolved config as the run artifact ``config.yaml`` (not into a shared folder),
    with the thread count the run resolved (``threads: auto`` becomes the number it used)."""

    def save_config(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        config = self.config.clone()
        init_args = config.get("model.init_args")
        if init_args is not None and "threads" in init_args and "threads" in pl_module.hparams:
            init_args["threads"] = pl_module.hparams["threads"]  # "auto" resolved: the count the run used
        text = self.parser.dump(config, skip_none=False)
        for logger in mlflow_loggers(trainer):
            logger.experiment.log_text(logger.run_id, text, "config.yaml")
