"""The writes a fault must not spoil (issue 50's mutation check of faults.py, tracking_buffer.py and
the checkpoint writer): a file is synced before it is renamed into place and its folder after; the
metrics held for the store are written before a checkpoint file, never after; a second spill of
unsent metrics keeps the first; a full disk or a used-up quota names the file it refused, also
when the error of a write or an fsync names none; and the one-line faults of :func:`fault_line`."""

from __future__ import annotations

import errno
import itertools
import json
import os
import re
import sqlite3
import sys
import traceback
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from mlflow.entities import Metric

from fl_lightning.callbacks import tracking_buffer
from fl_lightning.callbacks.checkpointing import RoundCheckpoint, replace_synced
from fl_lightning.callbacks.tracking_buffer import (
    UNSENT_FILE,
    BufferedClient,
    buffer_metrics,
    read_unsent,
    replay_unsent,
)
from fl_lightning.faults import (
    TrackingServerLost,
    exception_chain,
    fault_line,
    naming,
    save_traceback,
    server_unreachable,
)
from tests.fl_lightning.callbacks.test_tracking_outage import REFUSED, FlakyServer, metric

EDQUOT = getattr(errno, "EDQUOT", 122)


def raised_while_handling(outer: BaseException, inner: BaseException) -> BaseException:
    """``outer`` raised in an ``except`` block of ``inner`` (its ``__context__``, not its cause)."""
    try:
        try:
            raise inner
        except BaseException:  # noqa: BLE001
            raise outer  # noqa: B904 - the context, not the cause, is the point
    except BaseException as error:  # noqa: BLE001
        return error


# ------------------------------------------------------------------ write, sync, rename
def record_file_calls(monkeypatch) -> list[tuple]:
    """``os.fsync`` (with the inode it syncs), ``os.replace`` and ``os.close`` as they are called."""
    calls: list[tuple] = []
    fsync, replace, close = os.fsync, os.replace, os.close

    def recording_fsync(fd):
        calls.append(("fsync", os.fstat(fd).st_ino))
        return fsync(fd)

    def recording_replace(source, target, *args, **kwargs):
        calls.append(("replace", Path(source).name, Path(target).name))
        return replace(source, target, *args, **kwargs)

    def recording_close(fd):
        calls.append(("close", os.fstat(fd).st_ino))
        return close(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "replace", recording_replace)
    monkeypatch.setattr(os, "close", recording_close)
    return calls


def test_a_checkpoint_file_is_synced_before_it_is_renamed_and_its_folder_after(tmp_path, monkeypatch):
    partial, path = tmp_path / "last.ckpt.partial", tmp_path / "last.ckpt"
    partial.write_bytes(b"a whole checkpoint")
    calls = record_file_calls(monkeypatch)
    replace_synced(partial, path)
    monkeypatch.undo()
    # the file's bytes on disk, then the rename, then the folder's entry on disk (its descriptor closed)
    assert calls == [("fsync", path.stat().st_ino), ("replace", "last.ckpt.partial", "last.ckpt"),
                     ("fsync", tmp_path.stat().st_ino), ("close", tmp_path.stat().st_ino)]
    assert path.read_bytes() == b"a whole checkpoint" and not partial.exists()


def test_unsent_metrics_are_synced_before_they_are_renamed(tmp_path, monkeypatch):
    server = FlakyServer()
    server.down = True
    buffered = BufferedClient(server, every_s=3600, server_wait_s=600)
    buffered.held.append(("r", metric(1)))
    calls = record_file_calls(monkeypatch)
    spilled = buffered.spill(tmp_path)
    monkeypatch.undo()
    assert calls[:2] == [("fsync", spilled.stat().st_ino), ("replace", f".{UNSENT_FILE}.partial", UNSENT_FILE)]
    assert ("fsync", tmp_path.stat().st_ino) in calls[2:]


# ------------------------------------------------------------------ the store before the checkpoint
class RecordingStore:
    """A tracking store that records the steps of every batch of metrics it is given."""

    tracking_uri = "sqlite:///recording.db"

    def __init__(self, events: list[tuple]) -> None:
        self.events = events

    def log_batch(self, run_id, metrics=(), params=(), tags=()):
        self.events.append(("store", sorted({m.step for m in metrics})))


def kept_round(tmp_path, events: list[tuple], write) -> tuple[RoundCheckpoint, SimpleNamespace]:
    """A RoundCheckpoint holding round 3's checkpoint in memory, and a trainer whose logger holds
    round 2's metrics for the store; ``write(checkpoint, path)`` is the strategy's write."""
    buffer = BufferedClient(RecordingStore(events), every_s=3600)
    buffer.log_batch("r", metrics=[Metric("round", 2.0, 1000, 2)])
    trainer = SimpleNamespace(loggers=[SimpleNamespace(metrics_buffer=buffer)], is_global_zero=True,
                              strategy=SimpleNamespace(save_checkpoint=write), lightning_module=object())
    callback = RoundCheckpoint(dirpath=tmp_path)
    callback._unsaved = ({"epoch": 2, "state": torch.zeros(2)}, [])
    return callback, trainer


def recording_writes(events: list[tuple]):
    """A checkpoint write that notes the round it writes in ``events``, then writes it."""
    def write(checkpoint, path):
        events.append(("checkpoint", checkpoint["epoch"] + 1))
        torch.save(checkpoint, path)

    return write


def test_the_metrics_held_are_written_before_the_round_kept_in_memory(tmp_path):
    """A failing fit writes the round it kept in memory: the store gets the metrics first, so a
    checkpoint never claims rounds whose metrics were lost."""
    events: list[tuple] = []
    callback, trainer = kept_round(tmp_path, events, recording_writes(events))
    assert callback.save_unsaved_round(trainer)
    assert events == [("store", [2]), ("checkpoint", 3)]
    assert callback.rounds_saved == 3 and callback.last_model_path == str(tmp_path / "last.ckpt")
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["epoch"] == 2


def test_a_round_kept_in_memory_that_the_quota_refuses_names_its_file_and_leaves_none(tmp_path, capsys):
    (tmp_path / "last.ckpt").write_bytes(b"round 2's")

    def quota_used_up(checkpoint, path):
        Path(path).write_bytes(b"half")
        raise OSError(EDQUOT, "Disk quota exceeded")  # as a write says it: no file name

    callback, trainer = kept_round(tmp_path, [], quota_used_up)
    assert not callback.save_unsaved_round(trainer)
    said = capsys.readouterr().out
    assert said.startswith("could not write the checkpoint of round 3 ([Errno") and "Disk quota exceeded" in said
    assert "last.ckpt.partial" in said
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    assert (tmp_path / "last.ckpt").read_bytes() == b"round 2's"


def test_a_round_kept_in_memory_is_written_once_and_a_callback_keeping_none_writes_nothing(tmp_path):
    """Issue 50: ``save_unsaved_round`` says whether it wrote; the round it kept is written at most
    once (a second call, e.g. the fit report's after ``on_exception``, finds nothing kept)."""
    events: list[tuple] = []
    callback, trainer = kept_round(tmp_path, events, recording_writes(events))
    assert callback.save_unsaved_round(trainer)
    assert not callback.save_unsaved_round(trainer)
    assert [event for event in events if event[0] == "checkpoint"] == [("checkpoint", 3)]
    assert not RoundCheckpoint(dirpath=tmp_path / "other").save_unsaved_round(trainer)
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize(("error", "said"), [
    (OSError(), "(OSError)"),  # no text: its kind
    (OSError("x" * 300), "(" + "x" * 160 + ")"),  # a long text: its first 160 characters
])
def test_a_round_kept_in_memory_whose_write_fails_says_why_in_one_line(tmp_path, capsys, error, said):
    def failing(checkpoint, path):
        raise error

    callback, trainer = kept_round(tmp_path, [], failing)
    assert not callback.save_unsaved_round(trainer)
    out = capsys.readouterr().out
    assert out == f"could not write the checkpoint of round 3 {said}; {tmp_path / 'last.ckpt'} is the previous one\n"


def test_the_line_of_a_round_that_could_not_be_written_is_flushed_at_once(tmp_path, monkeypatch):
    """The fit is failing: its output may be a log file or a pipe (block-buffered), and the process
    may be killed next; the line is in the file when it is said."""
    import io

    def failing(checkpoint, path):
        raise OSError(errno.ENOSPC, "No space left on device")

    callback, trainer = kept_round(tmp_path, [], failing)
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-8", line_buffering=False))
    assert not callback.save_unsaved_round(trainer)
    assert raw.getvalue().decode().startswith("could not write the checkpoint of round 3 ([Errno 28] No space left")


def test_a_round_kept_in_memory_whose_partial_cannot_be_removed_still_says_its_line(tmp_path, capsys, monkeypatch):
    """The write fails and its partial file cannot be removed either (the folder went read-only):
    the fit's own exception stays the one reported, and the line is still said."""
    unlink = Path.unlink

    def refusing(self, missing_ok=False):
        if self.name.endswith(".partial"):
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return unlink(self, missing_ok=missing_ok)

    def half_written(checkpoint, path):
        Path(path).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    callback, trainer = kept_round(tmp_path, [], half_written)
    monkeypatch.setattr(Path, "unlink", refusing)
    assert not callback.save_unsaved_round(trainer)
    assert capsys.readouterr().out.startswith("could not write the checkpoint of round 3 (")


def test_a_checkpoint_write_whose_partial_cannot_be_removed_raises_the_writes_own_error(tmp_path, monkeypatch):
    """A write that fails (the disk full) and leaves a partial file that cannot be removed either:
    the fit fails with the write's error, naming the partial, not with the removal's."""
    unlink = Path.unlink

    def refusing(self, missing_ok=False):
        if self.name.endswith(".partial"):
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return unlink(self, missing_ok=missing_ok)

    def half_written(path, weights_only=False):
        Path(path).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    trainer = SimpleNamespace(save_checkpoint=half_written, is_global_zero=True, global_step=3, loggers=[])
    monkeypatch.setattr(Path, "unlink", refusing)
    with pytest.raises(OSError) as refused:
        RoundCheckpoint(dirpath=tmp_path)._save_checkpoint(trainer, str(tmp_path / "last.ckpt"))
    assert refused.value.errno == errno.ENOSPC
    assert fault_line(refused.value) == f"the disk is full (writing {tmp_path / 'last.ckpt.partial'})"


def test_the_metrics_held_are_written_first_whichever_loggers_hold_none():
    """Before a checkpoint, every logger holding metrics back writes them; loggers that hold none
    (a CSV logger beside the MLflow one) are passed over."""
    from fl_lightning.callbacks.checkpointing import flush_loggers

    events: list[tuple] = []
    buffer = BufferedClient(RecordingStore(events), every_s=3600)
    buffer.log_batch("r", metrics=[Metric("round", 2.0, 1000, 2)])
    flush_loggers(SimpleNamespace(loggers=[SimpleNamespace(), SimpleNamespace(metrics_buffer=buffer)]))
    assert events == [("store", [2])]


def test_a_round_kept_in_memory_is_not_written_once_any_of_its_tensors_changed(tmp_path):
    """The running round had begun changing the state (one tensor of two): not the round's end."""
    from fl_lightning import private_api

    events: list[tuple] = []
    callback, trainer = kept_round(tmp_path, events, lambda checkpoint, path: events.append(("checkpoint",)))
    changed, kept = torch.zeros(2), torch.zeros(2)
    callback._unsaved = ({"epoch": 2, "a": changed, "b": kept},
                         [(changed, private_api.tensor_version(changed)), (kept, private_api.tensor_version(kept))])
    changed.add_(1)
    assert not callback.save_unsaved_round(trainer)
    assert events == [] and list(tmp_path.iterdir()) == [] and callback.rounds_saved is None


@pytest.mark.usefixtures("one_thread")
def test_every_checkpoint_file_follows_the_metrics_before_it_and_snapshots_write_none(tmp_path, monkeypatch):
    """A fit logging to a SQLite store, its metrics held for an hour (``flush_every_s``), a
    checkpoint every 2 rounds: before round k's file is written, the store holds rounds 1..k-1
    (Lightning logs round k's after its checkpoint), and the store is written only then and at
    the run's end, not when a round's checkpoint is only kept in memory (rounds 3)."""
    import lightning.pytorch as pl
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from lightning.pytorch.loggers import MLFlowLogger
    from mlflow.tracking import MlflowClient

    from fl_lightning.callbacks.mlflow_run import MLflowRunInfo
    from tests.fl_lightning.core.test_module import digits_data, module_for

    monkeypatch.chdir(tmp_path)
    events: list[tuple] = []
    log_batch, save = MlflowClient.log_batch, TorchCheckpointIO.save_checkpoint

    def recording_log_batch(self, run_id, metrics=(), params=(), tags=(), **kwargs):
        if metrics:
            events.append(("store", {m.step for m in metrics if m.key == "round"}))
        return log_batch(self, run_id, metrics, params, tags, **kwargs)

    def recording_save(self, checkpoint, path, storage_options=None):
        events.append(("checkpoint", checkpoint["epoch"] + 1))
        return save(self, checkpoint, path, storage_options)

    monkeypatch.setattr(MlflowClient, "log_batch", recording_log_batch)
    monkeypatch.setattr(TorchCheckpointIO, "save_checkpoint", recording_save)
    data = digits_data()
    module = module_for(data, num_rounds=5, eval_every=2)
    logger = MLFlowLogger(tracking_uri=f"sqlite:///{tmp_path / 'runs.db'}", experiment_name="e")
    trainer = pl.Trainer(accelerator="cpu", logger=logger, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, max_epochs=1000,
                         callbacks=[MLflowRunInfo(flush_every_s=3600),
                                    RoundCheckpoint(dirpath=tmp_path / "checkpoints", every_n_rounds=2)])
    trainer.fit(module, datamodule=data)

    assert [rounds for kind, rounds in events if kind == "checkpoint"] == [1, 2, 4, 5]
    stored: set[int] = set()
    for index, (kind, value) in enumerate(events):
        if kind == "store":
            stored |= value
            assert index == len(events) - 1 or events[index + 1][0] == "checkpoint", events  # no write between
        else:
            assert stored == set(range(1, value)), (value, events)
    assert stored == {1, 2, 3, 4, 5}


# ------------------------------------------------------------------ spills of unsent metrics
def lost_buffer(server_wait_s: float = 600) -> tuple[FlakyServer, BufferedClient]:
    server = FlakyServer()
    server.down = True
    return server, BufferedClient(server, every_s=0.0, server_wait_s=server_wait_s)


def test_a_second_spill_into_one_folder_keeps_the_first(tmp_path):
    """A resumed fit that loses its tracking server again before its unsent metrics were written
    (or two runs' loggers spilling into one folder): every spill's rows are kept."""
    _, first = lost_buffer()
    first.log_batch("a", metrics=[metric(1), metric(2)])
    assert first.spill(tmp_path) == tmp_path / UNSENT_FILE
    _, second = lost_buffer()
    second.log_batch("b", metrics=[metric(3)])
    second.spill(tmp_path)
    rows = json.loads((tmp_path / UNSENT_FILE).read_text())["metrics"]
    assert [(row["run_id"], row["step"]) for row in rows] == [("a", 1), ("a", 2), ("b", 3)]
    assert not list(tmp_path.glob(".*partial"))


def test_replaying_one_run_keeps_the_other_runs_unsent_metrics(tmp_path):
    _, buffered = lost_buffer()
    buffered.log_batch("a", metrics=[metric(1)])
    buffered.log_batch("b", metrics=[metric(1), metric(2)])
    buffered.spill(tmp_path)
    store = Store()
    assert replay_unsent(store, "a", tmp_path, rounds_completed=5) == 1
    assert [(row["run_id"], row["step"]) for row in read_unsent(tmp_path / UNSENT_FILE)] == [("b", 1), ("b", 2)]
    assert replay_unsent(store, "b", tmp_path, rounds_completed=5) == 2
    assert not (tmp_path / UNSENT_FILE).exists()


class Store:
    """A tracking store holding nothing yet, recording the batches written into it."""

    tracking_uri = "sqlite:///store.db"

    def __init__(self) -> None:
        self.batches: list[tuple[str, list]] = []

    def get_metric_history(self, run_id, key):
        return []

    def log_batch(self, run_id, metrics=()):
        self.batches.append((run_id, list(metrics)))


def test_more_unsent_metrics_than_one_batch_are_all_replayed(tmp_path):
    _, buffered = lost_buffer()
    buffered.log_batch("r", metrics=[metric(step) for step in range(1, 2501)])
    buffered.spill(tmp_path)
    store = Store()
    assert replay_unsent(store, "r", tmp_path, rounds_completed=2500) == 2500
    assert [len(batch) for _, batch in store.batches] == [1000, 1000, 500]  # MLflow's limit on one batch
    assert [m.step for _, batch in store.batches for m in batch] == list(range(1, 2501))


def test_a_spill_without_a_folder_or_over_a_torn_file(tmp_path):
    _, buffered = lost_buffer()
    buffered.log_batch("r", metrics=[metric(1)])
    assert buffered.spill(None) is None and buffered.rounds_held() == 1  # nowhere to keep them: still held
    (tmp_path / UNSENT_FILE).write_text('{"tracking_uri": "x", "metrics": [{"run_id"')  # not ours: torn
    assert read_unsent(tmp_path / UNSENT_FILE) == []
    assert buffered.spill(tmp_path) == tmp_path / UNSENT_FILE
    assert [row["step"] for row in read_unsent(tmp_path / UNSENT_FILE)] == [1]


def test_a_spill_says_which_store_its_metrics_were_for(tmp_path):
    server, buffered = lost_buffer()
    buffered.log_batch("r", metrics=[metric(1)])
    buffered.spill(tmp_path)
    spilled = json.loads((tmp_path / UNSENT_FILE).read_text())
    assert spilled.keys() == {"tracking_uri", "metrics"} and spilled["tracking_uri"] == server.tracking_uri


def test_a_spill_whose_write_fails_names_the_partial_and_keeps_the_error_when_the_partial_cannot_go(
        tmp_path, monkeypatch):
    _, buffered = lost_buffer()
    buffered.log_batch("r", metrics=[metric(1)])
    partial = tmp_path / f".{UNSENT_FILE}.partial"
    write_text, unlink = Path.write_text, Path.unlink

    def half_written(path, text, *args, **kwargs):
        write_text(path, text[:10], *args, **kwargs)
        raise OSError(EDQUOT, "Disk quota exceeded")  # a write names no file

    def refused(path, *args, **kwargs):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))

    monkeypatch.setattr(Path, "write_text", half_written)
    monkeypatch.setattr(Path, "unlink", refused)
    with pytest.raises(OSError) as failed:
        buffered.spill(tmp_path)
    monkeypatch.setattr(Path, "unlink", unlink)
    assert fault_line(failed.value) == f"the disk is full (writing {partial})"


def test_a_spill_the_disk_refuses_names_its_file_and_leaves_no_partial(tmp_path, monkeypatch):
    _, buffered = lost_buffer()
    buffered.log_batch("r", metrics=[metric(1)])

    def quota_used_up(fd):
        raise OSError(EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(os, "fsync", quota_used_up)
    with pytest.raises(OSError) as refused:
        buffered.spill(tmp_path)
    monkeypatch.undo()
    assert fault_line(refused.value) == f"the disk is full (writing {tmp_path / ('.' + UNSENT_FILE + '.partial')})"
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ the buffer
def test_rounds_held_counts_rounds_not_metrics():
    _, buffered = lost_buffer()
    buffered.log_batch("r", metrics=[metric(1), metric(1, "round"), metric(2), metric(2, "round")])
    assert buffered.rounds_held() == 2


def test_a_write_restarts_the_interval(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(tracking_buffer, "time", SimpleNamespace(monotonic=lambda: now[0]))
    events: list[tuple] = []
    buffered = BufferedClient(RecordingStore(events), every_s=10.0)
    now[0] = 111.0
    buffered.log_batch("r", metrics=[metric(1)])  # 11 s after the start: written
    now[0] = 112.0
    buffered.log_batch("r", metrics=[metric(2)])  # 1 s after that write: held
    assert events == [("store", [1])] and buffered.rounds_held() == 1


def test_a_server_wait_of_zero_gives_up_at_the_first_refusal():
    _, buffered = lost_buffer(server_wait_s=0.0)
    with pytest.raises(TrackingServerLost):
        buffered.log_batch("r", metrics=[metric(1)])


def test_at_exit_a_reachable_buffer_is_written_and_one_in_an_outage_is_not_waited_for(monkeypatch):
    monkeypatch.setattr(tracking_buffer, "_BUFFERS", weakref.WeakSet())
    events: list[tuple] = []
    reachable = BufferedClient(RecordingStore(events), every_s=3600)
    reachable.log_batch("r", metrics=[metric(1)])
    server, outage = lost_buffer()
    outage.log_batch("r", metrics=[metric(2)])  # refused: an outage begins
    server.down = False
    tracking_buffer._flush_at_exit()
    assert events == [("store", [1])] and reachable.held == []
    assert server.written == [] and outage.rounds_held() == 1


def test_a_logger_is_buffered_once_however_often_the_fit_is_set_up(tmp_path):
    from lightning.pytorch.loggers import MLFlowLogger

    from fl_lightning import private_api

    logger = MLFlowLogger(tracking_uri=f"sqlite:///{tmp_path / 'runs.db'}", experiment_name="e")
    first = buffer_metrics(logger, 3600)
    assert buffer_metrics(logger, 3600) is first  # fit, then validate, on one trainer
    assert private_api.mlflow_client(logger) is first and not isinstance(first.client, BufferedClient)


# ------------------------------------------------------------------ one-line faults
def test_a_used_up_quota_names_its_file_like_a_full_disk():
    assert fault_line(OSError(EDQUOT, "Disk quota exceeded", "/runs/last.ckpt.partial")) == (
        "the disk is full (writing /runs/last.ckpt.partial)")


def test_a_checkpoint_write_refused_by_the_quota_names_the_partial_file(tmp_path):
    """The write's error names no file (``[Errno 122] Disk quota exceeded``): the fit's one line
    names the checkpoint file it was writing, and the previous checkpoint stays whole."""
    from tests.fl_lightning.callbacks.test_round_checkpoint import make_run, trainer_with

    module, data = make_run()
    checkpoint = RoundCheckpoint(dirpath=tmp_path, every_n_rounds=1)
    trainer = trainer_with(checkpoint)
    io = trainer.strategy.checkpoint_io
    write = io.save_checkpoint

    def quota_at_round_3(state, path, storage_options=None):
        if state["epoch"] == 2:
            raise OSError(EDQUOT, "Disk quota exceeded")
        return write(state, path, storage_options)

    io.save_checkpoint = quota_at_round_3
    with pytest.raises(OSError) as refused:
        trainer.fit(module, datamodule=data)
    assert fault_line(refused.value) == f"the disk is full (writing {tmp_path / 'last.ckpt.partial'})"
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


def test_an_fsync_refused_by_the_quota_names_the_file_being_synced(tmp_path, monkeypatch):
    partial = tmp_path / "last.ckpt.partial"
    partial.write_bytes(b"x")

    def quota_used_up(fd):
        raise OSError(EDQUOT, "Disk quota exceeded")

    monkeypatch.setattr(os, "fsync", quota_used_up)
    with pytest.raises(OSError) as refused:
        replace_synced(partial, tmp_path / "last.ckpt")
    monkeypatch.undo()
    assert fault_line(refused.value) == f"the disk is full (writing {partial})"
    assert not (tmp_path / "last.ckpt").exists()


def test_naming_leaves_errors_that_name_a_file_or_are_no_disk_fault_as_they_are():
    with pytest.raises(OSError) as named, naming("/b"):
        raise OSError(errno.ENOSPC, "full", "/a")
    assert named.value.filename == "/a"
    with pytest.raises(ConnectionRefusedError) as refused, naming("/b"):
        raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    assert refused.value.filename is None


def test_the_error_met_while_handling_a_full_disk_still_says_it():
    error = raised_while_handling(RuntimeError("could not clean up"), OSError(errno.ENOSPC, "full", "/d/x"))
    assert fault_line(error) == "the disk is full (writing /d/x)"


def test_a_failed_rename_names_its_destination_and_an_error_naming_no_file_says_only_the_fault():
    renamed = OSError(errno.ENOSPC, "No space left on device", "/runs/.x.partial", None, "/runs/x")
    assert fault_line(renamed) == "the disk is full (writing /runs/x)"  # the copy's destination, not its source
    assert fault_line(OSError(errno.ENOSPC, "No space left on device")) == "the disk is full"
    assert fault_line(OSError(errno.EROFS, "Read-only file system")) == (
        "a file cannot be written here: Read-only file system")


def test_a_cyclic_exception_chain_ends():
    first, second = ValueError("a"), ValueError("b")
    first.__cause__, second.__cause__ = second, first
    assert list(itertools.islice(exception_chain(first), 5)) == [first, second]
    assert fault_line(first) is None


def test_a_read_only_file_system_is_a_fault_naming_its_file():
    assert fault_line(OSError(errno.EROFS, "Read-only file system", "/ro/runs.db")) == (
        "a file cannot be written here: Read-only file system (writing /ro/runs.db)")


@pytest.mark.parametrize("text, said", [
    ("(raised by the REST store) Disk quota exceeded",
     "the disk is full (the MLflow store or a file beside it could not be written)"),
    ("file is not a database",
     "the MLflow store is corrupted (a SQLite file that cannot be read); move it aside and resume"),
    ("HTTPConnectionPool: Connection refused", "the tracking server stopped answering"),
])
def test_faults_known_only_by_their_text(text, said):
    assert fault_line(RuntimeError(text)) == said


def test_a_sqlite_database_error_saying_malformed_is_a_corrupt_store():
    said = fault_line(sqlite3.DatabaseError("malformed database schema (x)"))
    assert said.startswith("the MLflow store is corrupted")


def test_a_lost_server_is_not_retried_and_a_refused_call_is():
    assert not server_unreachable(TrackingServerLost("gone"))
    assert server_unreachable(RuntimeError(REFUSED))
    assert server_unreachable(ConnectionResetError())


def test_an_unreachable_server_is_known_by_a_connection_error_its_text_or_its_type_anywhere_in_the_chain():
    """A ``requests`` timeout with no text is known by its type's name; an error the server
    answered with is not worth retrying, nor a lost server, whatever caused it."""
    from requests.exceptions import ConnectTimeout

    assert server_unreachable(ConnectTimeout())
    assert not server_unreachable(RuntimeError("RESOURCE_DOES_NOT_EXIST: no run 1"))
    try:
        try:
            raise ConnectionRefusedError()
        except ConnectionRefusedError as error:
            raise RuntimeError("logging failed") from error
    except RuntimeError as wrapped:
        assert server_unreachable(wrapped)
        lost = TrackingServerLost("gone for 60 s")
        lost.__cause__ = wrapped
        assert not server_unreachable(lost)


def test_an_exception_chain_follows_the_cause_first_then_what_was_being_handled():
    cause, handled, raised = ValueError("cause"), KeyError("handled"), RuntimeError("raised")
    raised.__cause__, raised.__context__ = cause, handled
    assert list(exception_chain(raised)) == [raised, cause]
    raised.__cause__ = None
    assert list(exception_chain(raised)) == [raised, handled]


def test_the_fit_faults_are_forgotten_between_fits():
    from fl_lightning.faults import FitFaults

    FitFaults.folder, FitFaults.said = Path("runs/1"), "the disk is full"
    FitFaults.reset()
    assert (FitFaults.folder, FitFaults.said) == (None, None)


# ------------------------------------------------------------------ the traceback file
def test_the_traceback_goes_to_the_runs_folder_first_and_its_path_is_absolute(tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "run").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    log = save_traceback(RuntimeError("x"), [Path("run")])
    assert log == tmp_path / "work" / "run" / "fit-error.log" and log.is_absolute()


def test_a_folder_that_takes_the_traceback_but_not_its_rename_keeps_no_partial(tmp_path, monkeypatch):
    run, work = tmp_path / "run", tmp_path / "work"
    run.mkdir()
    work.mkdir()
    monkeypatch.chdir(work)
    replace = os.replace

    def full_at_the_run(source, target, *args, **kwargs):
        if Path(target).parent == run:
            raise OSError(errno.ENOSPC, "No space left on device", str(source), None, str(target))
        return replace(source, target, *args, **kwargs)

    monkeypatch.setattr(os, "replace", full_at_the_run)
    log = save_traceback(RuntimeError("x"), [run])
    assert log == work / "fit-error.log"
    assert list(run.iterdir()) == []


def test_the_traceback_file_says_when_and_which_process_then_the_whole_traceback(tmp_path):
    try:
        raise ValueError("the cause")
    except ValueError as caught:
        error = caught
    text = save_traceback(error, [tmp_path]).read_text()
    header, _, rest = text.partition("\n\n")
    assert re.fullmatch(rf"fl-lightning fit failed at \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d \(pid {os.getpid()}\)", header)
    assert rest == "".join(traceback.format_exception(error))


def test_a_partial_that_cannot_be_removed_does_not_stop_the_traceback_reaching_the_next_folder(tmp_path, monkeypatch):
    run, work = tmp_path / "run", tmp_path / "work"
    run.mkdir()
    work.mkdir()
    monkeypatch.chdir(work)
    replace, unlink = os.replace, Path.unlink

    def full_at_the_run(source, target, *args, **kwargs):
        if Path(target).parent == run:
            raise OSError(errno.ENOSPC, "No space left on device", str(source), None, str(target))
        return replace(source, target, *args, **kwargs)

    def refused_at_the_run(path, *args, **kwargs):
        if path.parent == run:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "replace", full_at_the_run)
    monkeypatch.setattr(Path, "unlink", refused_at_the_run)
    assert save_traceback(RuntimeError("x"), [run]) == work / "fit-error.log"


# ------------------------------------------------------------------ a fit failing in an outage
@pytest.mark.usefixtures("one_thread")
def test_a_fit_that_fails_while_its_server_is_unreachable_keeps_the_metrics_held(tmp_path, monkeypatch):
    """The tracking server stops taking metrics in round 2 and the fit fails in round 4, long
    before the buffer gives the server up (600 s): the rounds held go to the checkpoint folder's
    ``unsent_metrics.json``, which the resume writes into the run; none is lost."""
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import MLFlowLogger
    from mlflow.tracking import MlflowClient

    from fl_lightning.callbacks.mlflow_run import MLflowRunInfo
    from tests.fl_lightning.core.test_module import digits_data, module_for

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FL_LIGHTNING_SERVER_WAIT_S", "600")
    log_batch = MlflowClient.log_batch

    def refused_from_round_2(self, run_id, metrics=(), params=(), tags=(), **kwargs):
        if any(m.step >= 2 for m in metrics):
            raise RuntimeError(REFUSED)
        return log_batch(self, run_id, metrics, params, tags, **kwargs)

    class FailInRound4(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # round 3's metrics sent
            if trainer.current_epoch == 3:
                raise RuntimeError("a bug in round 4")

    monkeypatch.setattr(MlflowClient, "log_batch", refused_from_round_2)
    data = digits_data()
    module = module_for(data, num_rounds=6, eval_every=2)
    logger = MLFlowLogger(tracking_uri=f"sqlite:///{tmp_path / 'runs.db'}", experiment_name="e")
    folder = tmp_path / "checkpoints"
    trainer = pl.Trainer(accelerator="cpu", logger=logger, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, max_epochs=1000,
                         callbacks=[MLflowRunInfo(flush_every_s=0.0), RoundCheckpoint(dirpath=folder, every_n_rounds=1),
                                    FailInRound4()])
    with pytest.raises(RuntimeError, match="a bug in round 4"):
        trainer.fit(module, datamodule=data)
    rows = read_unsent(folder / UNSENT_FILE)
    assert {row["step"] for row in rows if row["key"] == "round"} == {2, 3}
    assert all(row["run_id"] == logger.run_id for row in rows)
