"""Ctrl-C and SIGTERM during a command-line fit: stop it the way Lightning ends a fit gracefully,
never inside a call to the MLflow store, and end its MLflow runs KILLED, their metrics kept.

:class:`StopOnSignal` turns either signal into ``KeyboardInterrupt`` while the fit trains; one
that arrives inside a store call waits for the call to return (SIGALRM polling, and a check of
the interrupted frame: :func:`in_store_call`). When the fit ends on the exception,
:func:`interrupted` tells it apart from a failure, :func:`release_interrupted_calls` frees the
store locks the interrupted calls still hold, and :func:`end_killed` makes Lightning's
``finalize("failed")`` end a logger's run KILLED.
:class:`~fl_lightning.callbacks.fit_report.FitReport` installs and calls them.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import os
import signal
import sys
import threading
import traceback
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import MLFlowLogger

from fl_lightning.callbacks.mlflow_run import INTERRUPTS
from fl_lightning.faults import exception_chain


@functools.cache
def store_code() -> tuple[str, ...]:
    """The folders of the code that writes to an MLflow store (MLflow's, SQLAlchemy's)."""
    folders: list[str] = []
    for package in ("mlflow", "sqlalchemy"):
        spec = importlib.util.find_spec(package)
        folders += [str(Path(path)) + os.sep for path in (spec.submodule_search_locations or [])] if spec else []
    return tuple(folders)


def in_store_call(frame: Any) -> bool:
    """Whether ``frame`` (the frame a signal interrupted) runs inside a call to the MLflow store."""
    folders = store_code()
    while frame is not None:
        if frame.f_code.co_filename.startswith(folders):
            return True
        frame = frame.f_back
    return False


class StopOnSignal:
    """Ctrl-C (SIGINT) and SIGTERM while a fit trains: stop it with ``KeyboardInterrupt``, the
    path Lightning ends a fit gracefully by, but never inside a call to the MLflow store: an
    interrupt there can leave the store's session half done (a SQLite store locked, the run's
    end refused), so it waits for the call to return (polled every ``RETRY_S`` with SIGALRM).
    A second Ctrl-C does not wait. SIGTERM replaces Lightning's own handler, whose path waits
    for the round to end and exits with status 0 (a stopped fit would look finished)."""

    RETRY_S = 0.01
    stopped_by: int | None = None  # the signal that stopped this process's latest fit (the CLI's exit status)

    def __init__(self) -> None:
        self.pending: int | None = None

    @classmethod
    def install(cls) -> StopOnSignal | None:
        """Handle SIGINT and SIGTERM (the main thread only can); Lightning restores the
        process's handlers when the fit ends."""
        if threading.current_thread() is not threading.main_thread():
            return None
        stopper = cls()
        signal.signal(signal.SIGINT, stopper)
        signal.signal(signal.SIGTERM, stopper)
        if hasattr(signal, "setitimer"):
            signal.signal(signal.SIGALRM, stopper.retry)
        return stopper

    def __call__(self, signum: int, frame: Any) -> None:
        forced = self.pending == signal.SIGINT and signum == signal.SIGINT
        self.pending = signum
        self.stop(frame, wait=not forced)

    def retry(self, signum: int, frame: Any) -> None:
        if self.pending is not None:
            self.stop(frame)

    def stop(self, frame: Any = None, wait: bool = True) -> None:
        """Raise the pending interrupt, unless ``frame`` is inside a store call (then later)."""
        if self.pending is None:
            return
        if sys.exc_info()[0] is not None:  # the fit is already ending on an exception (e.g. Lightning's
            self.cancel()                   # SIGTERMException): let it end, do not cut its handling short
            self.pending = None
            return
        if wait and frame is not None and hasattr(signal, "setitimer") and in_store_call(frame):
            signal.setitimer(signal.ITIMER_REAL, self.RETRY_S)
            return
        self.cancel()
        name = signal.Signals(self.pending).name
        StopOnSignal.stopped_by, self.pending = self.pending, None
        raise KeyboardInterrupt(f"stopped by {name}")

    def cancel(self) -> None:
        if hasattr(signal, "setitimer"):
            signal.setitimer(signal.ITIMER_REAL, 0)


def interrupted(exception: BaseException) -> bool:
    """Whether ``exception`` is a Ctrl-C or SIGTERM, or was raised while handling one."""
    return any(isinstance(current, INTERRUPTS) for current in exception_chain(exception))


def release_interrupted_calls(exception: BaseException) -> None:
    """Free what the calls an interrupt cut short still hold through the exception's traceback:
    a SQLite query stopped mid-way keeps its statement, and with it a lock on the store, while
    its cursor lives, and the store would then refuse the run's end ("database is locked")."""
    traceback.clear_frames(exception.__traceback__)
    gc.collect()


def end_killed(logger: MLFlowLogger) -> None:
    """Make the ``finalize("failed")`` Lightning calls on ``logger`` after a Ctrl-C or SIGTERM
    (``on_exception`` first, then every logger's ``finalize``) end its run KILLED instead."""
    finalize = type(logger).finalize

    def finalize_killed(status: str = "success") -> None:
        finalize(logger, "KILLED" if status == "failed" else status)

    logger.finalize = finalize_killed  # type: ignore[method-assign]  # this logger, this fit's last call
