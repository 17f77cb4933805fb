"""The fits running on this machine: a folder with one file per running fit, named by its
process id (standard library only: the console script joins it before importing torch).
``fl_lightning.threads`` shares the cores among them."""

from __future__ import annotations

import os
from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class RunningFits:
    """A folder with one file per running fit (named by its process id)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.entry = folder / str(os.getpid())

    def join(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.entry.touch()

    def leave(self) -> None:
        self.entry.unlink(missing_ok=True)

    def count(self) -> int:
        """Fits running now, this one included; entries of processes that died are removed."""
        running = 0
        try:
            entries = list(self.folder.iterdir())
        except OSError:
            return 1
        for entry in entries:
            if not entry.name.isdigit():
                continue
            if _alive(int(entry.name)):
                running += 1
            else:
                entry.unlink(missing_ok=True)
        return max(running, 1)


def default_folder() -> Path:
    from fl_lightning.cache import cache_dir

    return Path(cache_dir()) / "running-fits"


def announce_fit(folder: Path | None = None) -> RunningFits | None:
    """Count this process among the running fits from now on, before its slow start (imports,
    parsing, data), so that fits already running take their smaller share while it starts;
    None where the folder cannot be written. Idempotent; ``leave()`` when the fit is over."""
    fits = RunningFits(folder or default_folder())
    try:
        fits.join()
    except OSError:
        return None
    return fits
