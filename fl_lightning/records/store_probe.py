"""What an MLflow store is, found without changing it, in one place (standard library only): whether
a tracking server accepts a connection, the tables a whole MLflow SQLite store has, and the schema
revision an SQLite store is at. The fit's checks (``preflight``), the store's creation
(``callbacks.mlflow_store``) and the commands that only read (``records.read_only_store``) all ask here."""

from __future__ import annotations

import socket
import sqlite3
from urllib.parse import urlsplit

REACH_TIMEOUT_S = 5.0  # a tracking server that does not accept a connection by then is not there
MLFLOW_TABLES = frozenset({"alembic_version", "experiments", "runs"})  # a whole MLflow SQLite store has these


def server_port(uri: str) -> int | None:
    """The port of a tracking server's ``http``/``https`` URI (the scheme's own when none is
    written); None for every other store."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return None
    return parts.port or (443 if parts.scheme == "https" else 80)


def unreachable(uri: str) -> str | None:
    """Why the tracking server of an ``http``/``https`` URI does not accept a connection within
    ``REACH_TIMEOUT_S`` ("timed out", or the system's reason); None when it does, and for every
    other store."""
    port = server_port(uri)
    if port is None:
        return None
    try:
        with socket.create_connection((urlsplit(uri).hostname or "localhost", port), timeout=REACH_TIMEOUT_S):
            pass
    except OSError as error:
        return "timed out" if isinstance(error, TimeoutError) else error.strerror or str(error)
    return None


def schema_revision(connection: sqlite3.Connection) -> str | None:
    """The MLflow schema revision (alembic's ``version_num``) of the store open on ``connection``;
    None when its table holds no row. Raises ``sqlite3.Error`` where there is no such table."""
    row = connection.execute("SELECT version_num FROM alembic_version").fetchone()
    return None if row is None else str(row[0])
