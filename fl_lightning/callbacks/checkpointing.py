"""The command line's checkpoint: one ``last.ckpt``, written every N rounds, N chosen from its cost.

Lightning's default :class:`~lightning.pytorch.callbacks.ModelCheckpoint` keeps the best
``epoch=N-step=N.ckpt`` and, with ``save_last``, an identical ``last.ckpt``, both rewritten every
epoch (here a round). :class:`RoundCheckpoint` keeps ``last.ckpt`` only and writes it after the
first round of the fit, then every ``every_n_rounds`` rounds and after the last one; by default N
is chosen after the second round so that writing takes at most ``time_budget`` of the fit's time
(N = ⌈write seconds / (budget · round seconds)⌉), and follows the cost of later writes. The
rounds in between are not lost on a Ctrl-C, a SIGTERM or a failure: the checkpoint of the last
completed round is kept in memory (the tensors by reference, checked unchanged through their
version counters, everything else copied) and written when the fit ends on an exception, if the
round that was running has not yet changed any of it. A resumed fit re-runs the rounds after its
checkpoint, bit for bit.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import os
import statistics
import time
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning import private_api
from fl_lightning.core.state import ClientStateMixin
from fl_lightning.faults import naming
from fl_lightning.records.errors import first_line

log = logging.getLogger(__name__)


class RoundCheckpoint(ModelCheckpoint):
    """``last.ckpt`` only (``save_top_k=0, save_last=True``), every N rounds and after the last.

    Args:
        every_n_rounds: write every N rounds; None: N follows the cost of the writes.
        time_budget: the share of the fit's time the writes may take when N is chosen (0.1).
        save_last: ModelCheckpoint's, with this callback's default (``last.ckpt``).
        save_top_k: ModelCheckpoint's, with this callback's default (0: ``last.ckpt`` only).
        enable_version_counter: ModelCheckpoint's, with this callback's default (off:
            ``last.ckpt`` is replaced in place).
        **kwargs: :class:`~lightning.pytorch.callbacks.ModelCheckpoint`'s (``dirpath``, ...).
    """

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A resume that writes into the folder it resumed from, named absolutely now and
        relatively (to the first fit's working folder) in the checkpoint, is the same folder."""
        stored = Path(str(state_dict.get("dirpath") or ""))
        if self.dirpath and stored.parts and not stored.is_absolute() \
                and Path(self.dirpath).parts[-len(stored.parts):] == stored.parts:
            state_dict = {**state_dict, "dirpath": self.dirpath}
        super().load_state_dict(state_dict)

    def __init__(self, every_n_rounds: int | None = None, time_budget: float = 0.1,
                 save_last: bool | Literal["link"] | None = True, save_top_k: int = 0,
                 enable_version_counter: bool = False, **kwargs: Any) -> None:
        if every_n_rounds is not None and (int(every_n_rounds) != every_n_rounds or every_n_rounds < 1):
            raise ValueError(f"every_n_rounds must be an integer >= 1 (or None: chosen from the cost of a write), "
                             f"got {every_n_rounds}")
        if not 0 < time_budget < 1:
            raise ValueError(f"time_budget must be in (0, 1) (the share of the fit's time writes may take; "
                             f"default 0.1), got {time_budget}")
        # Named here, not set as defaults of **kwargs: LightningCLI fills **kwargs with
        # ModelCheckpoint's own defaults (save_last None, save_top_k 1), and a RoundCheckpoint
        # given through --trainer.callbacks then wrote nothing. last.ckpt is replaced, never
        # versioned (last-v1.ckpt): each fit has a folder of its own (its run's, a resume's, or an
        # unlogged fit's), and a resume holds its folder's lock.
        super().__init__(save_last=save_last, save_top_k=save_top_k, enable_version_counter=enable_version_counter,
                         **kwargs)
        self.every_n_rounds = every_n_rounds
        self.fixed_interval = every_n_rounds is not None
        self.time_budget = time_budget
        self.write_seconds: float | None = None  # the latest write
        self.round_seconds: float | None = None  # the median round after the first, without its write
        self.rounds_saved: int | None = None  # rounds completed by the last checkpoint written
        self._round_started: float | None = None
        self._rounds_in_fit = 0
        self._unsaved: tuple[dict[str, Any], list[tuple[torch.Tensor, int]]] | None = None
        self._chosen_first: int | None = None  # the interval said; a different final one is said at the end
        self._round_times: list[float] = []
        self.in_memory = False  # a round's checkpoint is being kept in memory, not written

    @property
    def state_key(self) -> str:
        """Lightning's default checkpoint's key: a fit resumed from a checkpoint it wrote restores
        ``last_model_path`` (and keeps writing ``last.ckpt``, not ``last-v1.ckpt``)."""
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self.write_seconds = self.round_seconds = None
        self._rounds_in_fit, self._unsaved, self._chosen_first, self._round_times = 0, None, None, []
        if not self.fixed_interval:
            self.every_n_rounds = None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._round_started = time.perf_counter()

    # ------------------------------------------------------------------ when to write
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._should_skip_saving_checkpoint(trainer) and self._should_save_on_train_epoch_end(trainer):
            self.round_end(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._should_skip_saving_checkpoint(trainer) and not self._should_save_on_train_epoch_end(trainer):
            self.round_end(trainer)

    def round_end(self, trainer: pl.Trainer) -> None:
        """At the end of every round (where ModelCheckpoint would save): write ``last.ckpt``, or
        keep the round's checkpoint in memory."""
        if not self.save_last:
            return
        rounds_done = trainer.current_epoch + 1
        self._rounds_in_fit += 1
        if self._rounds_in_fit >= 2 and self._round_started is not None:  # the first round warms up
            self._round_times.append(time.perf_counter() - self._round_started)
            self.round_seconds = statistics.median(self._round_times[-25:])
            if self._rounds_in_fit == 2:
                self.choose_interval(trainer)
        if not self.due(trainer, rounds_done):
            self._unsaved = self.snapshot(trainer)
            return
        started = time.perf_counter()
        self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))
        first = self.write_seconds is None
        self.write_seconds = time.perf_counter() - started  # the latest: histories make later ones larger
        self.rounds_saved, self._unsaved = rounds_done, None
        if not first:
            self.choose_interval(trainer)

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        """Lightning's write, into ``<file>.partial`` in the same folder, synced, then renamed over
        the file: ``last.ckpt`` is always the previous complete checkpoint or the new complete one,
        whatever stops the process mid-write (a kill, a full disk: its error names the partial file)."""
        partial = filepath + ".partial"
        try:
            with naming(partial):
                super()._save_checkpoint(trainer, partial)
                if trainer.is_global_zero:
                    replace_synced(Path(partial), Path(filepath))  # syncing can be what finds the disk full
        except BaseException:
            with contextlib.suppress(OSError):
                Path(partial).unlink(missing_ok=True)  # our own half-written file; the previous checkpoint stays
            raise
        trainer.strategy.barrier("RoundCheckpoint.rename")
        self.last_model_path = filepath

    def due(self, trainer: pl.Trainer, rounds_done: int) -> bool:
        """The fit's first round, every N rounds, the last round and a stopping fit's round."""
        last = trainer.max_epochs is not None and 0 < trainer.max_epochs <= rounds_done
        if self.write_seconds is None or last or trainer.should_stop:
            return True
        return self.every_n_rounds is not None and rounds_done % self.every_n_rounds == 0

    def choose_interval(self, trainer: pl.Trainer) -> None:
        """N = ⌈write seconds / (budget · round seconds)⌉ from the latest write and the median of
        the recent rounds (the first, warming up, left out); chosen after the second round, said
        then (logged at INFO by ``fl_lightning.callbacks.checkpointing``), and followed at every write (histories make
        later writes larger). A given N is kept."""
        if self.fixed_interval or self.write_seconds is None or self.round_seconds is None:
            return
        rounds = max(1, math.ceil(self.write_seconds / (self.time_budget * max(self.round_seconds, 1e-9))))
        # rank 0's timings decide for every rank: a write is collective (its barrier), so ranks
        # that chose different intervals from their own clocks would wait for each other forever
        rounds = int(trainer.strategy.broadcast(rounds, src=0))
        first, self.every_n_rounds = self.every_n_rounds is None, rounds
        if first and trainer.is_global_zero:
            log.info("checkpoint every %d round(s) and after the last: writing it took %.2f s and a round %.2f s "
                     "(at most %.0f%% of the fit's time; followed as they change)", rounds, self.write_seconds,
                     self.round_seconds, 100 * self.time_budget)
        self._chosen_first = rounds if first else self._chosen_first

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        if self.every_n_rounds != self._chosen_first and self._chosen_first is not None and trainer.is_global_zero:
            log.info("checkpoint interval at the end: %s rounds (a write took %.2f s, a round %.2f s)",
                     self.every_n_rounds, self.write_seconds, self.round_seconds)

    def snapshot(self, trainer: pl.Trainer) -> tuple[dict[str, Any], list[tuple[torch.Tensor, int]]]:
        """This round's checkpoint, as a write now would hold it, with its tensors' versions."""
        module = trainer.lightning_module
        # a module with client state keeps its history buffer by reference here, compacted when written
        deferred = module.deferring_compaction if isinstance(module, ClientStateMixin) else contextlib.nullcontext
        self.in_memory = True
        try:
            with deferred():
                checkpoint = private_api.dump_checkpoint(trainer, self.save_weights_only)  # what save_checkpoint writes
        finally:
            self.in_memory = False
        tensors: list[tuple[torch.Tensor, int]] = []
        return copy_containers(checkpoint, tensors), tensors

    def save_unsaved_round(self, trainer: pl.Trainer) -> bool:
        """Write the last completed round kept in memory to ``last.ckpt`` (through a temporary file,
        so an interrupted write leaves the previous one), if none of its tensors changed since.
        Returns whether it was written."""
        if self._unsaved is None or not self.dirpath:
            return False
        checkpoint, tensors = self._unsaved
        self._unsaved = None
        if any(private_api.tensor_version(tensor) != version for tensor, version in tensors):
            return False  # the running round had begun changing the state: not the round's end
        module = trainer.lightning_module
        if isinstance(module, ClientStateMixin):
            module.compact_history(checkpoint)  # deferred by ``snapshot``
        path = Path(self.last_model_path or Path(self.dirpath) / f"{self.CHECKPOINT_NAME_LAST}{self.FILE_EXTENSION}")
        partial = path.with_name(path.name + ".partial")
        try:
            flush_loggers(trainer)  # the store is never behind a checkpoint
            with naming(partial):
                trainer.strategy.save_checkpoint(checkpoint, partial)
                if trainer.is_global_zero:
                    replace_synced(partial, path)
        except Exception as error:  # noqa: BLE001 - the fit's own exception is the one to report
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)  # our own half-written file; the previous checkpoint stays
            reason = first_line(error, type(error).__name__)[:160]
            print(f"could not write the checkpoint of round {int(checkpoint.get('epoch', -1)) + 1} ({reason}); "
                  f"{path} is the previous one", flush=True)
            return False
        self.last_model_path = str(path)
        self.rounds_saved = int(checkpoint.get("epoch", -1)) + 1
        return True

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.save_unsaved_round(trainer)


def replace_synced(partial: Path, path: Path) -> None:
    """Put the complete file ``partial`` in place of ``path``: its bytes on disk first, then an
    atomic rename in the same folder, then the folder's entry on disk. An error names ``partial``
    when it names no file (an fsync's: the disk full, the quota used up)."""
    with naming(partial), open(partial, "rb+") as written:
        os.fsync(written.fileno())
    os.replace(partial, path)
    try:
        folder = os.open(path.parent, os.O_RDONLY)
    except OSError:  # a platform without folder descriptors: the rename stands
        return
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def flush_loggers(trainer: pl.Trainer) -> None:
    """Write what the loggers hold back (``tracking_buffer.BufferedClient``) before a checkpoint is
    written, so that a resumed run's metrics are never behind its checkpoint."""
    for logger in trainer.loggers:
        buffer = getattr(logger, "metrics_buffer", None)
        if buffer is not None:
            buffer.flush()


def in_memory_checkpoint(trainer: pl.Trainer) -> bool:
    """Whether the checkpoint being made is one a :class:`RoundCheckpoint` keeps in memory."""
    return any(getattr(callback, "in_memory", False) for callback in trainer.callbacks)  # type: ignore[attr-defined]


def copy_containers(value: Any, tensors: list[tuple[torch.Tensor, int]]) -> Any:
    """``value`` with its dicts, lists and tuples copied and other objects deep-copied; tensors are
    kept (not copied) and listed with their version counter, which in-place changes increase."""
    if isinstance(value, torch.Tensor):
        tensors.append((value, private_api.tensor_version(value)))
        return value
    if isinstance(value, dict):
        copied = {key: copy_containers(item, tensors) for key, item in value.items()}
        try:
            return type(value)(copied)
        except TypeError:
            return copied
    if isinstance(value, list | tuple) and type(value) in (list, tuple):
        return type(value)(copy_containers(item, tensors) for item in value)
    return copy.deepcopy(value)


def default_checkpoint(configured_callbacks: Any, enable_checkpointing: bool | None,
                       dirpath: Path | None = None) -> list[RoundCheckpoint]:
    """The CLI's checkpoint: a :class:`RoundCheckpoint` (writing into ``dirpath``, or Lightning's
    run folder), unless checkpointing is off or the user configured a ``ModelCheckpoint``
    (``--trainer.callbacks``), which is then used as configured."""
    callbacks = configured_callbacks if isinstance(configured_callbacks, list) else [configured_callbacks]
    if enable_checkpointing is False or any(isinstance(callback, ModelCheckpoint) for callback in callbacks):
        return []
    return [RoundCheckpoint(dirpath=dirpath)]
