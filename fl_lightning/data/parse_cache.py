"""Parse a data file once: its arrays memoised in the process and kept as an ``.npz`` file in the
cache folder (:func:`parsed_once`)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from fl_lightning.cache import CACHE_ENV, cache_dir

Table = dict[str, np.ndarray]
_PARSED: dict[tuple, Table] = {}  # in-process memo: a worker running many fits parses each file once


def _file_key(path: str, parser: str) -> tuple[str, str, int, int]:
    """What a parsed file's cache entry is valid for: the parser, the file's path, size and
    modification time (a file changed in place gets a new key, so it is parsed again)."""
    stat = os.stat(path)
    return parser, os.path.realpath(path), stat.st_size, stat.st_mtime_ns


def _read_cached(cache_file: Path, key: tuple) -> Table | None:
    """The arrays of a cache file written for ``key``; None when there is none, and (with a
    warning) when the file is unreadable or was written for another key."""
    if not cache_file.is_file():
        return None
    try:
        with np.load(cache_file, allow_pickle=False) as stored:
            if stored["key"].tolist() != list(map(str, key)):
                return None  # written for another file whose key has the same digest prefix
            return {name: stored[name] for name in stored.files if name != "key"}
    except Exception as error:  # a truncated or corrupt file: parse again, never a wrong dataset
        warnings.warn(f"ignoring the unreadable cache file {cache_file} ({type(error).__name__}: {error}); "
                      "parsing the source again", RuntimeWarning, stacklevel=3)
        return None


def _write_cached(cache_file: Path, key: tuple, table: Table) -> None:
    """Write atomically (a temporary file, then a rename), so that a reader never sees half a file."""
    partial = None
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cache_file.parent, suffix=".npz.tmp", delete=False) as handle:
            partial = handle.name
            arrays: dict[str, Any] = {"key": np.array(list(map(str, key))), **table}
            np.savez(handle, **arrays)
        os.replace(partial, cache_file)
    except OSError as error:
        warnings.warn(
            f"could not write the parsed-data cache {cache_file} ({error}); the source will be parsed "
            f"again next time (set {CACHE_ENV} to a writable folder to keep it)",
            RuntimeWarning,
            stacklevel=3,
        )
        if partial is not None:
            with contextlib.suppress(OSError):
                os.unlink(partial)


def parsed_once(path: str, parse: Callable[[str], Table], parser: str) -> Table:
    """``parse(path)``'s arrays, parsed once per file: memoised in this process and kept as an
    ``.npz`` file in :func:`cache_dir`, keyed by ``parser`` (name it anew when ``parse`` changes)
    and the file's path, size and modification time. An unreadable or unwritable cache only
    costs a parse (and a warning). The arrays returned are read-only: they are shared."""
    key = _file_key(path, parser)  # a missing file raises FileNotFoundError here, as parse would
    table = _PARSED.get(key)
    if table is not None:
        return table
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:20]
    cache_file = cache_dir() / f"{parser}-{digest}.npz"
    table = _read_cached(cache_file, key)
    if table is None:
        table = parse(path)
        _write_cached(cache_file, key, table)
    for array in table.values():
        array.flags.writeable = False
    _PARSED[key] = table
    return table
