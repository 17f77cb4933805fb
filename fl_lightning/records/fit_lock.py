"""One fit per run at a time, and no run left RUNNING without a live fit.

* :class:`RunLock`: every logged fit, fresh or resumed, holds ``fit.lock`` in its run's checkpoint
  folder (made with ``O_EXCL``, holding the host, the process id and the start time) from the
  moment its run exists for as long as it runs; a second fit of the same run (its own printed
  resume command, run while it still runs) is refused in one line while the first is alive. A
  lock whose process is gone (killed, power lost) is stale and taken over.
* :func:`check_writable_folder`: a checkpoint folder that cannot be made or written is refused
  before the fit's run is created.
* :func:`try_claim`: the same kind of file as a claim that another process may find taken
  (the benchmark runner's per-cell claims) without it being an error.
* :func:`mark_dead_runs`: runs of an experiment still RUNNING whose fit (host and process logged
  in the ``fit_host``/``fit_pid`` tags) no longer runs on this host are ended KILLED, with a tag
  that says so, by the next fit, resume or benchmark run that opens the experiment.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from fl_lightning.records.errors import PreflightError
from fl_lightning.records.vocabulary import Tag

LOCK_NAME = "fit.lock"
_HELD: list[RunLock] = []


def this_host() -> str:
    return socket.gethostname()


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists (signal 0: nothing is sent)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


def fit_is_alive(host: str | None, pid: str | int | None) -> bool | None:
    """True/False for a fit of this host; None where it cannot be told (another host, no record)."""
    if not host or pid in (None, "") or host != this_host():
        return None
    try:
        return process_alive(int(pid))
    except (TypeError, ValueError):
        return None


class RunLock:
    """``fit.lock`` in a run's checkpoint folder, held by this process until :meth:`release`."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def acquire(cls, folder: Path, make: bool = False) -> RunLock:
        """Take the folder's lock, or raise ``PreflightError`` naming the live fit that holds it
        (``make``: the folder is made first, as a fresh run's checkpoint folder is)."""
        path = folder / LOCK_NAME
        if make:
            check_writable_folder(folder)
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise PreflightError(f"cannot make the run's checkpoint folder {folder} ({error.strerror}): "
                                     "make its parent writable or pass --trainer.default_root_dir") from None
        try:
            holder = try_claim(path)
        except ClaimNotWritten as error:  # a full disk: no empty lock left to refuse every later resume
            raise PreflightError(f"cannot write the lock {path} ({error.strerror}): free some space, "
                                 "then resume again") from None
        except OSError as error:  # a folder we cannot write to: the fit would fail at its first checkpoint
            raise PreflightError(f"cannot lock the run's checkpoint folder {folder} ({error.strerror}): "
                                 "make it writable or resume from a copy of the checkpoint elsewhere") from None
        if holder is not None:
            alive = fit_is_alive(holder.get("host"), holder.get("pid"))
            who = (f"process {holder.get('pid')} on {holder.get('host')}, since {holder.get('started')}"
                   if holder else "an unknown process")
            raise PreflightError(
                f"another fit is running this run ({who}; lock {path}): wait for it to end or stop it"
                + ("" if alive else "; if no fit runs there any more, delete the lock file and resume again"))
        lock = cls(path)
        if all(held.path != path for held in _HELD):  # held already: released once, at exit
            _HELD.append(lock)
        return lock

    def release(self) -> None:
        """Remove the lock if it is still this process's own."""
        if self in _HELD:
            _HELD.remove(self)
        holder = read_lock(self.path)
        if holder.get("pid") == os.getpid() and holder.get("host") == this_host():
            self.path.unlink(missing_ok=True)


def check_writable_folder(folder: Path) -> None:
    """Refuse (``PreflightError``, one line) a folder that cannot be written: it, or the nearest
    folder above it that exists, is not a folder or is not writable. Creates nothing."""
    folder = Path(folder).absolute()
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise PreflightError(f"cannot write checkpoints into {folder}: {existing} is not a folder; "
                             "pass another --trainer.default_root_dir")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PreflightError(f"cannot write checkpoints into {folder}: {existing} is not writable; make it "
                             "writable or pass another --trainer.default_root_dir")


class ClaimNotWritten(OSError):
    """A claim (or lock) file was created but its record could not be written (a full disk); it
    was removed again."""


def try_claim(path: Path) -> dict[str, Any] | None:
    """Take the claim file ``path`` for this process (``O_EXCL``; a claim of a process of this
    host that is gone is taken over); None when taken (or held already), else the record of the
    process holding it (``{}``: unreadable, e.g. being written). A folder that cannot be written
    raises ``OSError``; a record that cannot be written, ``ClaimNotWritten``."""
    record = {"host": this_host(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    for _ in range(2):
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = read_lock(path)
            if holder.get("pid") == os.getpid() and holder.get("host") == this_host():
                return None
            if fit_is_alive(holder.get("host"), holder.get("pid")) is False:
                path.unlink(missing_ok=True)  # its process is gone
                continue
            return holder
        try:
            with os.fdopen(descriptor, "w") as file:
                json.dump(record, file)
        except OSError as error:
            path.unlink(missing_ok=True)
            raise ClaimNotWritten(error.errno, error.strerror, str(path)) from error
        return None
    return read_lock(path)


def release_claim(path: Path) -> None:
    """Remove the claim file ``path`` if this process holds it."""
    holder = read_lock(path)
    if holder.get("pid") == os.getpid() and holder.get("host") == this_host():
        path.unlink(missing_ok=True)


def read_lock(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def release_all() -> None:
    """Release every lock this process holds (however its fit ended)."""
    for lock in list(_HELD):
        lock.release()


atexit.register(release_all)


def fit_tags() -> dict[str, str]:
    """The tags that say which process runs a fit (read by :func:`mark_dead_runs`)."""
    return {Tag.FIT_HOST: this_host(), Tag.FIT_PID: str(os.getpid())}


def mark_dead_runs(client: Any, experiment_ids: list[str], keep: frozenset[str] | set[str] = frozenset()) -> list[str]:
    """End KILLED every RUNNING run of the experiments whose fit no longer runs on this host
    (``keep``: runs this process is about to continue). Returns their ids."""
    if not experiment_ids:
        return []
    dead = []
    for run in client.search_runs(experiment_ids, filter_string="attributes.status = 'RUNNING'", max_results=1000):
        tags = run.data.tags
        if run.info.run_id in keep or fit_is_alive(tags.get(Tag.FIT_HOST), tags.get(Tag.FIT_PID)) is not False:
            continue
        client.set_tag(run.info.run_id, Tag.KILLED_REASON,
                       f"its fit (process {tags.get(Tag.FIT_PID)} on {tags.get(Tag.FIT_HOST)}) stopped without "
                       "ending the run (killed, or the machine went down); found by a later fit")
        client.set_terminated(run.info.run_id, status="KILLED")
        dead.append(run.info.run_id)
    return dead
