"""Tags, params, inputs and artifacts that make an MLflow run comparable with its neighbours.

Tags: algorithm, dataset, partition, partition_params (defaults filled in), num_clients,
participation, model, seed, data_seed, the task's (task, task_key, client_test,
client_test_size, per_client_models: ``run_identity.task_tags``), git sha, machine: names
from ``records.vocabulary.Tag``. A suite's tags (suite, cell, ...) are the logger's own: the benchmark
runner writes them into each cell's config. (Params: ``LogHyperparameters``.) Input: the
federated split as a dataset (the UI's Dataset column). Artifacts: the partition statistics
(table and figure) at the start, every client's final metrics (JSON) and a figure of the
sorted client accuracies at the end (the JSON also when the fit fails).

A Trainer script's run is a run like the CLI's: a new run its logger was not given a name for is
named by :func:`~fl_lightning.callbacks.run_identity.run_name` (not MLflow's ``chill-owl-867``),
and, where no LightningCLI logs its config, the settings the modules were built with are logged
as the run's ``config.yaml`` (:func:`~fl_lightning.callbacks.run_identity.script_config`), so that
``fl-lightning replay`` fits it again.

Resuming: every checkpoint records the MLflow runs its fit logs to (``CHECKPOINT_KEY``), so
``fl-lightning fit ... --ckpt_path last.ckpt`` continues the same run (``fit_runs`` builds the
logger with that ``run_id``, and leaves out what the interrupted process logged past its
checkpoint). The continued run is marked RUNNING again and its history is made whole: the
checkpoint's own round is logged if the process died before logging it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, cast

import lightning.pytorch as pl
import numpy as np
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import MLFlowLogger
from lightning.pytorch.utilities.exceptions import SIGTERMException
from matplotlib.figure import Figure
from mlflow.entities import RunTag

from fl_lightning import private_api
from fl_lightning.callbacks.checkpointing import flush_loggers, in_memory_checkpoint
from fl_lightning.callbacks.run_identity import (
    algorithm_config,
    dataset_input,
    effective_fraction,
    partition_params,
    run_name,
    script_config,
    task_tags,
)
from fl_lightning.callbacks.tracking_buffer import (
    HTTP_SETTINGS,
    BufferedClient,
    buffer_metrics,
    replay_unsent,
)
from fl_lightning.core.progress import RoundProgressBar
from fl_lightning.core.round_log import RoundLog
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.data.reports import BAR_CLIENTS_MAX, partition_figure, partition_table
from fl_lightning.faults import fault_line
from fl_lightning.records import vocabulary as schema
from fl_lightning.records.fit_lock import fit_tags, mark_dead_runs
from fl_lightning.records.machine import cpu_description
from fl_lightning.records.store_uri import absolute_tracking_uri
from fl_lightning.records.vocabulary import Artifact, ClientMetrics, Tag

# in every checkpoint: {"rounds_completed": k, "round_metrics": {"step": k, "metrics": {...}} | None,
#                       "runs": [{"tracking_uri", "experiment_id", "run_id"}, ...]}
# (tracking_uri: absolute since the store is resolved when the checkpoint is written)
CHECKPOINT_KEY = "mlflow_runs"
INTERRUPTS = (KeyboardInterrupt, SIGTERMException)  # a fit stopped by Ctrl-C or SIGTERM: its run ends KILLED


def git_sha() -> str:
    """The commit of the fl-lightning checkout, or 'unknown' outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def client_accuracy_figure(accuracies: list[float], title: str) -> Figure:
    """Every client's test accuracy, sorted, with the mean and the worst/best 10% marked."""
    values = np.sort(np.asarray(accuracies, dtype=float))
    figure = Figure(figsize=(8, 3.2), layout="constrained")  # no pyplot: no global state
    axes = figure.subplots()
    if len(values) > BAR_CLIENTS_MAX:  # one step outline: many bars draw slowly and would touch anyway
        axes.stairs(values, np.arange(len(values) + 1) - 0.5, fill=True, color="tab:blue")
    else:
        axes.bar(np.arange(len(values)), values, width=1.0, color="tab:blue", edgecolor="white", linewidth=0.5)
    axes.axhline(values.mean(), color="black", linestyle="--", label=f"mean {values.mean():.3f}")
    tenth = max(1, int(np.ceil(0.1 * len(values))))
    axes.axhline(values[:tenth].mean(), color="tab:red", linestyle=":", label=f"worst 10% {values[:tenth].mean():.3f}")
    axes.axhline(
        values[-tenth:].mean(), color="tab:green", linestyle=":", label=f"best 10% {values[-tenth:].mean():.3f}"
    )
    axes.set(xlabel="clients, sorted by accuracy", ylabel="test accuracy", ylim=(0, 1), title=title)
    axes.legend(loc="lower right", fontsize=8)
    return figure


def machine_tag(device: Any) -> str:
    """What ran the fit: the GPU's name, or the CPU's with its core count."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    return cpu_description()


def mlflow_loggers(trainer: pl.Trainer) -> list[MLFlowLogger]:
    return [lg for lg in trainer.loggers if isinstance(lg, MLFlowLogger)]


def run_tags(trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, str]:
    """The tags a run is found and grouped by (see ``run_identity.task_tags`` for the task's)."""
    model_hp = pl_module.hparams
    data = getattr(trainer, "datamodule", None)  # set by fit; not in Trainer's type
    data_hp = data.hparams if data is not None else {}
    fraction = effective_fraction(pl_module)  # the participation that ran (rounded to whole clients)
    fraction = float(schema.FULL_PARTICIPATION if fraction is None else fraction)  # a module that samples no clients
    return {
        Tag.ALGORITHM: type(pl_module).__name__,
        Tag.DATASET: str(data_hp.get(schema.SOURCE, "")),
        Tag.PARTITION: str(data_hp.get(schema.PARTITION, "")),
        Tag.PARTITION_PARAMS: json.dumps(partition_params(data) if data is not None else {}, sort_keys=True),
        Tag.NUM_CLIENTS: str(data_hp.get(schema.NUM_CLIENTS, "")),
        Tag.PARTICIPATION: "full" if fraction >= schema.FULL_PARTICIPATION else f"{fraction:g}",
        Tag.MODEL: str(model_hp.get(schema.BACKBONE, "")),
        **task_tags(pl_module, data),
        Tag.GIT_SHA: git_sha(),
        Tag.MACHINE: machine_tag(pl_module.device),
    }


def saved_runs(checkpoint: dict[str, Any]) -> list[dict[str, str]]:
    """The MLflow runs a checkpoint's fit logged to (``[]`` for checkpoints from elsewhere)."""
    return list((checkpoint.get(CHECKPOINT_KEY) or {}).get("runs", []))


def unlogged_epoch_metrics(trainer: pl.Trainer) -> dict[str, float]:
    """The metrics of the running training epoch that Lightning will send to the loggers.

    Reads Lightning's running result collection (``private_api.running_epoch_results``):
    Lightning sends a round's metrics to the loggers only after that round's checkpoint is
    written, and no public view holds exactly them. ``trainer.logged_metrics``
    and ``trainer.callback_metrics`` are cumulative (they still hold, e.g., the evaluation
    metrics of an earlier round, or a metric this round did not log), so a round restored
    from them would get values that are not its own.
    """
    results = private_api.running_epoch_results(trainer)
    if results is None:
        return {}
    return {key: float(value) for key, value in results.metrics(on_step=False)["log"].items()}


def round_end_metrics(trainer: pl.Trainer) -> dict[str, Any] | None:
    """At the end of a round, the round's metrics that Lightning sends to the loggers only
    after the checkpoint of that round is written ({"step", "metrics"}); None elsewhere. A
    ``FederatedModule`` holds them itself (``core.round_log``)."""
    if not trainer.training:
        return None
    round_log = getattr(trainer.lightning_module, "round_log", None)
    if isinstance(round_log, RoundLog):
        return round_log.pending
    try:
        logged = unlogged_epoch_metrics(trainer)
    except (KeyError, RuntimeError, TypeError, ValueError):
        return None
    step = logged.pop("step", None)
    return None if step is None else {"step": int(step), "metrics": logged}


def restore_checkpoint_round(logger: MLFlowLogger, rounds_completed: int,
                             round_metrics: dict[str, Any] | None) -> None:
    """Log the metrics of the checkpoint's own round (``round_metrics``) that the continued run
    lacks: a process killed just after writing the checkpoint had not logged them yet."""
    if not round_metrics or round_metrics["step"] != rounds_completed:  # not a checkpoint at a round's end
        return
    client, run_id, step = logger.experiment, logger.run_id, rounds_completed
    held = {
        metric.key
        for key in client.get_run(run_id).data.metrics
        for metric in client.get_metric_history(run_id, key)
        if metric.step == step
    }
    missing = {key: value for key, value in round_metrics["metrics"].items() if key not in held}
    if missing:
        logger.log_metrics(missing, step)


def checkpoint_folder(trainer: pl.Trainer) -> Path | None:
    """The folder the fit's checkpoint callback writes to (None without one)."""
    dirpath = getattr(trainer.checkpoint_callback, "dirpath", None)
    return Path(dirpath).absolute() if dirpath else None


def outage_reporter(trainer: pl.Trainer, buffer: BufferedClient) -> Any:
    """What an outage of ``buffer``'s tracking server shows: a line when it starts and when it
    ends, and the progress bar's note meanwhile ("tracking server unreachable, retrying (N
    rounds held)")."""
    down = False

    def report(text: str | None) -> None:
        nonlocal down
        bar = trainer.progress_bar_callback
        if isinstance(bar, RoundProgressBar):
            bar.note = text
        say = bar.print if isinstance(bar, RoundProgressBar) else print
        if text is not None and not down:
            say(f"the tracking server {buffer.tracking_uri} is not answering: the fit goes on and keeps its metrics, "
                f"retrying for up to {buffer.server_wait_s:g} s")
        elif text is None and down:
            say(f"the tracking server {buffer.tracking_uri} answers again: the held metrics are written")
        down = text is not None

    return report


CONFIG_ARTIFACT = "config.yaml"  # the settings a replay fits again (``fl_lightning.cli.replay``)


def is_cli_config_saver(callback: Any) -> bool:
    """Whether ``callback`` is LightningCLI's config saver (the CLI's run logs its own config)."""
    return any(cls.__name__ == "SaveConfigCallback" and cls.__module__.startswith("lightning.pytorch.cli")
               for cls in type(callback).__mro__)


def config_text(pl_module: pl.LightningModule, datamodule: Any) -> str:
    """:func:`~fl_lightning.callbacks.run_identity.script_config` as the YAML of a LightningCLI config."""
    import yaml

    return str(yaml.safe_dump(script_config(pl_module, datamodule), sort_keys=False))


def name_new_runs(trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
    """A new run (no params, no metrics yet) whose logger was given no ``run_name``, named as the
    CLI names its runs. Lightning creates the run before the callbacks' ``setup``, so MLflow has
    given it a random name, which the ``mlflow.runName`` tag replaces; a run the user named, or a
    run a resume continues, keeps its name."""
    data = getattr(trainer, "datamodule", None)
    for logger in mlflow_loggers(trainer):
        if "mlflow.runName" in (logger.tags or {}) or logger.run_id is None:
            continue  # the user's own name (MLFlowLogger keeps a run_name it is given as this tag)
        client, run_id = logger.experiment, logger.run_id
        run = client.get_run(run_id)
        if run.data.params or run.data.metrics or run.info.status != "RUNNING":  # not a new run
            continue
        client.set_tag(run_id, "mlflow.runName", run_name(pl_module, data, logger.tags))


class MLflowRunInfo(Callback):
    """Sets the run's tags and logs the partition and per-client artifacts; records the run in
    every checkpoint so that a resumed fit continues it. Metrics are written to the store in
    batches, at most every ``flush_every_s`` seconds (0: every call), and always before a
    checkpoint is written and when the run ends (:class:`BufferedClient`)."""

    def __init__(self, flush_every_s: float = 5.0) -> None:
        super().__init__()
        self.resumed_from: dict[str, Any] | None = None  # the checkpoint's CHECKPOINT_KEY entry
        self.flush_every_s = flush_every_s
        self.http_settings: set[str] = set()  # request settings this fit set (teardown removes them)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Names the new runs (rank 0), buffers every MLflow logger's metrics, and gives an HTTP tracking server
        short requests (``HTTP_SETTINGS`` not already set in the environment; ``teardown`` removes them)."""
        if trainer.is_global_zero:
            name_new_runs(trainer, pl_module)
        for logger in mlflow_loggers(trainer):
            buffer = buffer_metrics(logger, self.flush_every_s)
            if buffer is None:
                continue
            buffer.on_outage = outage_reporter(trainer, buffer)
            if str(buffer.tracking_uri).startswith(("http://", "https://")):  # short requests: the buffer retries
                self.http_settings |= {name for name in HTTP_SETTINGS if name not in os.environ}
        os.environ.update({name: HTTP_SETTINGS[name] for name in self.http_settings})

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for name in self.http_settings:
            os.environ.pop(name, None)
        self.http_settings = set()

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        """Writes the buffered metrics to the store before a checkpoint file, and records in the checkpoint
        the rounds completed, the round's metrics and the runs it logs to, which a resumed fit continues."""
        if not in_memory_checkpoint(trainer):  # a checkpoint file: the store first
            flush_loggers(trainer)
        loggers = mlflow_loggers(trainer) if trainer.is_global_zero else []  # rank 0 writes the file
        checkpoint[CHECKPOINT_KEY] = {
            # rounds done: `processed` already counts the round whose end saves the checkpoint
            "rounds_completed": int(cast(Any, trainer.fit_loop.epoch_progress.current).processed),
            "round_metrics": round_end_metrics(trainer),
            "runs": [
                {"tracking_uri": absolute_tracking_uri(lg.experiment.tracking_uri),
                 "experiment_id": lg.experiment_id, "run_id": lg.run_id}
                for lg in loggers
                if lg.run_id is not None
            ],
        }

    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        self.resumed_from = checkpoint.get(CHECKPOINT_KEY)

    def _continue_runs(self, trainer: pl.Trainer, loggers: list[MLFlowLogger]) -> None:
        """A resumed fit: mark a continued run RUNNING again (it may have been marked FAILED)
        and restore its checkpoint's round; a new run notes where it was resumed from."""
        resumed_from, self.resumed_from = self.resumed_from, None
        if resumed_from is None:
            return
        rounds = int(resumed_from.get("rounds_completed", 0))
        previous = {run["run_id"] for run in resumed_from.get("runs", [])}
        for logger in loggers:
            client, run_id = logger.experiment, logger.run_id
            client.set_tag(run_id, Tag.RESUMED_AT_ROUND, str(rounds))
            if run_id not in previous:
                client.set_tag(run_id, Tag.RESUMED_FROM_RUNS, ",".join(sorted(previous)) or "unknown")
                continue
            run = client.get_run(run_id)
            if run.info.status != "RUNNING":
                client.update_run(run_id, status="RUNNING")
            # a benchmark runner's ``error`` tag stays: it is why this run stopped before the
            # resume (``resumed_at_round``); a reader takes it for the run's error only while
            # the run has not finished (``leaderboard.runs.RunRecord.error``)
            planned = str(trainer.lightning_module.hparams.get(schema.NUM_ROUNDS))
            if Tag.EXTENDED_TO_ROUNDS in run.data.tags or run.data.params.get(schema.NUM_ROUNDS, planned) != planned:
                client.set_tag(run_id, Tag.EXTENDED_TO_ROUNDS, planned)  # the param keeps the first value
                first = int(run.data.params.get(schema.NUM_ROUNDS, planned))
                lengths = schema.fit_lengths(run.data.tags, run.data.params) or [first]
                if str(lengths[-1]) != planned:  # the route replay follows (a resume to the same length adds nothing)
                    client.set_tag(run_id, Tag.FIT_LENGTHS, ",".join(map(str, [*lengths, planned])))
            restore_checkpoint_round(logger, rounds, resumed_from.get("round_metrics"))
            if trainer.ckpt_path:  # what a fit that lost its tracking server could not write
                replayed = replay_unsent(client, str(run_id), Path(trainer.ckpt_path).parent, rounds)
                if replayed:
                    print(f"wrote the {replayed} metric values the tracking server had not taken into run {run_id}",
                          flush=True)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Rank 0: continues the runs of a resumed fit, ends KILLED the experiment's runs whose fit died
        RUNNING, and logs every run's tags (with the configuration's label unless the runner gave it),
        the config where no LightningCLI logs it, the dataset, and the partition table and figure."""
        loggers = mlflow_loggers(trainer)
        if not loggers or not trainer.is_global_zero:
            return
        self._continue_runs(trainer, loggers)
        for logger in loggers:  # runs of this experiment whose fit died RUNNING (never this fit's own)
            if logger.experiment_id is not None and logger.run_id is not None:
                mark_dead_runs(logger.experiment, [logger.experiment_id], keep={logger.run_id})
        tags = run_tags(trainer, pl_module) | fit_tags()
        data = getattr(trainer, "datamodule", None)
        if not any(type(callback).__name__ == "MLflowSaveConfig" or is_cli_config_saver(callback)
                   for callback in trainer.callbacks):  # type: ignore[attr-defined]
            config = config_text(pl_module, data)  # a Trainer script: no LightningCLI logs the config
            for logger in loggers:
                logger.experiment.log_text(logger.run_id, config, CONFIG_ARTIFACT)
        dataset = dataset_input(data) if data is not None else None
        for logger in loggers:
            client, run_id = logger.experiment, logger.run_id
            # the configuration's label (every setting that changes how it computes), unless the
            # benchmark runner gave the suite's own through the logger's tags
            label = (
                {}
                if Tag.ALGORITHM_CONFIG in (logger.tags or {})
                else {Tag.ALGORITHM_CONFIG: algorithm_config(pl_module)}
            )
            client.log_batch(run_id, tags=[RunTag(key, value) for key, value in (tags | label).items()])
            if dataset is not None:
                client.log_inputs(run_id, datasets=[dataset])
            if isinstance(data, FederatedDataModule):
                client.log_text(run_id, partition_table(data), Artifact.PARTITION_TABLE)
                try:
                    client.log_figure(run_id, partition_figure(data), Artifact.PARTITION_FIGURE)
                except Exception as error:  # noqa: BLE001 - a figure is not worth the run
                    warnings.warn(f"a partition figure was not logged to MLflow: {type(error).__name__}: {error}",
                                  stacklevel=1)

    def _log_client_metrics(self, trainer: pl.Trainer, pl_module: Any, status: str) -> None:
        if not trainer.is_global_zero:
            return
        payload: dict[str, Any] = {
            ClientMetrics.STATUS: status,
            ClientMetrics.ROUNDS_COMPLETED: int(trainer.current_epoch),
            ClientMetrics.CLIENTS: getattr(pl_module, "last_client_metrics", {}),
        }
        accuracies = payload[ClientMetrics.CLIENTS].get(ClientMetrics.TEST_ACCURACY)
        for logger in mlflow_loggers(trainer):
            logger.experiment.log_dict(logger.run_id, payload, Artifact.CLIENT_METRICS)
            if accuracies:
                figure = client_accuracy_figure(
                    accuracies, f"{type(pl_module).__name__}, round {trainer.current_epoch}"
                )
                logger.experiment.log_figure(logger.run_id, figure, Artifact.CLIENT_ACCURACY_FIGURE)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log_client_metrics(trainer, pl_module, "finished")

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """The clients' metrics as far as the fit got, if the store and the disk take them: the
        handler of a fault (a full disk, a lost server) must not fail on that fault itself.
        Metrics held for a tracking server that stopped answering go to ``unsent_metrics.json``
        beside the checkpoints, which the resume writes into the run."""
        how = "killed" if isinstance(exception, INTERRUPTS) else "failed"
        folder = checkpoint_folder(trainer)
        for logger in mlflow_loggers(trainer):
            buffer = getattr(logger, "metrics_buffer", None)
            if isinstance(buffer, BufferedClient) and (buffer.lost or buffer.unreachable_since is not None):
                try:
                    spilled = buffer.spill(folder)
                except OSError as error:
                    print(f"(the metrics held for the tracking server could not be saved: {error})", file=sys.stderr)
                    continue
                if spilled is not None:
                    print(f"the metrics the tracking server did not take are kept in {spilled}; "
                          "resuming the fit writes them into its run", file=sys.stderr, flush=True)
        try:
            self._log_client_metrics(trainer, pl_module, f"{how}: {type(exception).__name__}: {exception}")
        except Exception as error:  # noqa: BLE001 - the fit's own exception is the one to report
            print(
                f"(the clients' final metrics were not logged to MLflow: {fault_line(error) or type(error).__name__})",
                file=sys.stderr,
                flush=True,
            )
