"""MLflow tracking URIs, read in one place (torch-free: the CLI's checks, the callbacks, the
runner and the leaderboard all parse a store's URI here).

A store is named by its tracking URI: a SQLite file (``sqlite:///runs.db``, relative to the
working directory; ``sqlite:////abs/runs.db``), a file store (``file:./mlruns``, a bare path) or a
server (``http://host:5000``)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse, urlsplit, urlunsplit

SQLITE = "sqlite:///"  # the prefix of a SQLite store's URI; what follows is the file's path


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (query string cut, %-escapes undone; relative to
    the working directory unless it starts with ``sqlite:////``); None for every other store, for
    ``:memory:`` and for SQLite's own ``file:`` URIs."""
    if not uri.startswith(SQLITE):
        return None
    path = unquote(uri[len(SQLITE):].split("?", 1)[0])
    if path in ("", ":memory:") or path.startswith("file:"):
        return None
    return Path(path)


def sqlite_uri(path: str | Path) -> str:
    """The tracking URI of the SQLite store at ``path`` (as it is written: a relative path stays
    relative to the working directory)."""
    return f"{SQLITE}{path}"


def file_store_folder(uri: str) -> Path | None:
    """The folder of a file store (``file:///...``, ``file:./mlruns`` or a plain path); None for
    other stores."""
    parts = urlparse(uri)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    if parts.scheme == "" and uri:
        return Path(uri)
    return None


def absolute_tracking_uri(uri: str) -> str:
    """``uri`` with a local store's path made absolute (against the working directory): a
    relative ``sqlite:///runs.db`` names another file in another directory, and a checkpoint's
    record of its store must not. ``file:`` stores and bare paths become ``file:///...``; servers,
    other databases and absolute SQLite paths are returned as they are."""
    if uri.startswith(SQLITE):
        path, _, query = uri[len(SQLITE):].partition("?")
        if not path or path == ":memory:" or path.startswith("/"):
            return uri
        return sqlite_uri(Path(unquote(path)).resolve()) + (f"?{query}" if query else "")
    if uri.startswith("file:"):
        rest = uri[len("file:"):]
        return uri if rest.startswith("//") else Path(unquote(rest)).resolve().as_uri()  # file:./mlruns, file:/abs
    if urlparse(uri).scheme == "":  # a bare path (MLflow reads it as a file store)
        return Path(uri).resolve().as_uri()
    return uri


def local_store_missing(uri: str) -> bool:
    """Whether ``uri`` names a local store that does not exist (opening it would create it)."""
    absolute = absolute_tracking_uri(uri)
    if absolute.startswith(SQLITE):
        database = sqlite_file(absolute)
        return database is not None and not database.is_file()
    if absolute.startswith("file:"):
        return not Path(unquote(urlparse(absolute).path)).is_dir()
    return False


def store_scheme(uri: str) -> str:
    """The scheme of a store's URI: ``sqlite``, ``file``, ``http``...; ``""`` for a bare path."""
    return urlparse(uri).scheme


def without_credentials(uri: str) -> str:
    """The tracking URI without a user or password (never print or publish credentials)."""
    parts = urlsplit(uri)
    if parts.password is None and "@" not in parts.netloc:
        return uri
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def store_display_name(uri: str) -> str:
    """What a page may say about a store: a file's name (``sqlite:////home/me/mlruns.db`` ->
    ``mlruns.db``) or a server's scheme and host; never a local absolute path, never a password."""
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https", "databricks") or (parts.netloc and parts.scheme != "file"):
        host = parts.netloc.rsplit("@", 1)[-1]
        return f"{parts.scheme}://{host}" if host else parts.scheme
    local = sqlite_file(uri) or file_store_folder(uri) or Path(unquote(parts.path))  # the last: another database
    return local.name or uri.split(":", 1)[0]
