"""Faults a fit meets on a shared machine, said in one line, with the full story in a log file.

A full disk, a tracking server that stopped answering, a folder that cannot be written or a
corrupt file is not a bug in the code: the user needs to know which fault it was, where, and
what to do, not three chained tracebacks. :func:`fault_line` names the fault of an exception
(searching its chain: the error a handler met while handling another counts too), or returns
None for anything else, which is a bug and keeps its traceback. :func:`save_traceback` writes
the traceback to ``fit-error.log`` beside the run's checkpoints (write, then rename), or
elsewhere when that disk is the full one. :func:`naming` gives a write's error the file it was
writing (a full disk met by ``write`` or ``fsync`` names none). Imports no torch (the CLI's last
handler uses it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import sqlite3
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

FAULT_LOG = "fit-error.log"
DISK_FULL = (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC))
NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)
# what a fault looks like once a library has turned it into text (SQLAlchemy, MLflow's REST client)
DISK_FULL_TEXT = re.compile(r"No space left on device|database or disk is full|Disk quota exceeded")
CORRUPT_TEXT = re.compile(r"database disk image is malformed|file is not a database")
SERVER_LOST_TEXT = re.compile(r"Max retries exceeded|Connection refused|Failed to establish a new connection|"
                              r"Connection aborted|RemoteDisconnected|Read timed out|ConnectTimeout")
URL = re.compile(r"https?://[^\s'\"/]+")


class TrackingServerLost(ConnectionError):
    """The tracking server stopped answering for longer than a fit waits for it."""


class FitFaults:
    """What the CLI's last handler needs from the fit: the run's checkpoint folder (where the
    traceback goes) and whether the fit already said the fault (its resume line included)."""

    folder: Path | None = None
    said: str | None = None

    @classmethod
    def reset(cls) -> None:
        cls.folder, cls.said = None, None


def exception_chain(error: BaseException) -> Iterator[BaseException]:
    """``error``, then what caused it or was being handled when it was raised, and so on."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _where(error: OSError) -> str:
    """The file being written: a copy's or a move's destination, else the one file named."""
    written = getattr(error, "filename2", None) or getattr(error, "filename", None)
    return f" (writing {written})" if written else ""


@contextlib.contextmanager
def naming(path: str | os.PathLike[str]) -> Iterator[None]:
    """Give ``path`` to a disk-full or not-writable ``OSError`` raised inside that names no file:
    a write's or an fsync's error names none (``[Errno 122] Disk quota exceeded``), and
    :func:`fault_line` could not say which file the full disk or the used-up quota refused."""
    try:
        yield
    except OSError as error:
        if error.errno in (*DISK_FULL, *NOT_WRITABLE) and error.filename is None and error.filename2 is None:
            error.filename = os.fspath(path)
        raise


def fault_line(error: BaseException) -> str | None:
    """The fault behind ``error`` in words ("the disk is full (writing …)"), or None when it is
    not one of the faults a user fixes outside the code (disk, tracking server, permissions,
    corrupt store)."""
    chain = list(exception_chain(error))
    for current in chain:  # the precise ones first: an errno and a file name
        if isinstance(current, TrackingServerLost):
            return str(current)
        if isinstance(current, OSError) and current.errno in DISK_FULL:
            return f"the disk is full{_where(current)}"
        if isinstance(current, OSError) and current.errno in NOT_WRITABLE:
            return f"a file cannot be written here: {current.strerror}{_where(current)}"
    for current in chain:
        text = f"{type(current).__name__}: {current}"
        if DISK_FULL_TEXT.search(text):
            return "the disk is full (the MLflow store or a file beside it could not be written)"
        if CORRUPT_TEXT.search(text) or (isinstance(current, sqlite3.DatabaseError) and "malformed" in text):
            return "the MLflow store is corrupted (a SQLite file that cannot be read); move it aside and resume"
        if SERVER_LOST_TEXT.search(text):
            server = URL.search(text)
            return f"the tracking server {server.group(0) if server else ''} stopped answering".replace("  ", " ")
    return None


def server_unreachable(error: BaseException) -> bool:
    """Whether ``error`` says a tracking server could not be reached (refused, reset, timed
    out): worth retrying, unlike an answer that refuses the request."""
    return not isinstance(error, TrackingServerLost) and any(
        isinstance(current, ConnectionError) or SERVER_LOST_TEXT.search(f"{type(current).__name__}: {current}")
        for current in exception_chain(error))


def save_traceback(error: BaseException, folders: list[Path | None]) -> Path | None:
    """Write ``error``'s traceback to ``FAULT_LOG`` in the first of ``folders`` that takes it
    (then the working directory, then the temporary folder), written to a temporary name and
    renamed; None when no folder could (every disk full)."""
    text = (f"fl-lightning fit failed at {time.strftime('%Y-%m-%d %H:%M:%S')} (pid {os.getpid()})\n\n"
            + "".join(traceback.format_exception(error)))
    candidates = [*folders, Path.cwd(), Path(tempfile.gettempdir())]
    for folder in dict.fromkeys(folder for folder in candidates if folder is not None):
        target = folder / FAULT_LOG
        partial = folder / f".{FAULT_LOG}.{os.getpid()}.partial"
        try:
            with open(partial, "w") as file:
                file.write(text)
            os.replace(partial, target)
        except OSError:
            with contextlib.suppress(OSError):
                partial.unlink(missing_ok=True)
            continue
        return target.resolve()
    return None
