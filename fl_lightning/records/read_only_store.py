"""Read an MLflow store without creating or altering it.

MLflow's client, on first use of a tracking URI, creates a missing SQLite file, creates the
tables of an empty one, migrates an older schema and adds the Default experiment where it is
missing. The commands that only read (``python -m leaderboard build``, ``python -m benchmarks run
--dry-run``) therefore look at the store first, with the standard library (``check_readable``:
a missing file, an empty one, a file that is not SQLite, a schema of another MLflow version are
refused or reported, never "fixed"), then read it through a read-only SQLite connection
(``read_only_uri``): anything MLflow might still try to write fails instead of changing the file.

Only the standard library is imported here (and no torch): the leaderboard reads stores through it,
and the runner uses it before it needs MLflow; SQLAlchemy (MLflow's own) only once a read URI is made.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote, urlsplit

from fl_lightning.records.store_probe import MLFLOW_TABLES, schema_revision, server_port, unreachable
from fl_lightning.records.store_uri import file_store_folder, sqlite_file, sqlite_uri

SQLITE_HEADER = b"SQLite format 3\x00"
EXAMPLE_URIS = "e.g. --tracking-uri sqlite:////abs/path/mlruns.db or http://host:5000"
LOCK_WAIT_S = 5.0  # how long a read waits for a store another process holds locked (SQLite's default)

# What ``sqlite_state`` finds in a SQLite file.
MISSING, EMPTY, NOT_SQLITE, FOREIGN, OTHER_SCHEMA, NO_EXPERIMENTS, READY, LOCKED = (
    "missing", "empty", "not-sqlite", "foreign", "other-schema", "no-experiments", "ready", "locked")


def held_by_another_process(error: BaseException) -> bool:
    """Whether SQLite's ``error`` says another process holds the file locked (a store in use, not
    another kind of file)."""
    return "locked" in str(error) or "busy" in str(error)


class StoreError(Exception):
    """The store cannot be used as it is; the message says what is wrong and what to pass or do."""


def latest_schema_revision() -> str | None:
    """The schema revision this MLflow writes (its newest migration); None when it cannot tell."""
    try:
        from mlflow.store.db.utils import _get_latest_schema_revision

        return str(_get_latest_schema_revision())
    except Exception:  # noqa: BLE001 - a private helper: without it the read-only connection still protects
        return None


def journal_of(path: Path) -> Path:
    return path.with_name(path.name + "-journal")


def unfinished_write(path: Path) -> bool:
    """A rollback journal beside the file: a write that a process did not finish (it was killed,
    or is still writing). A reader must roll it back, which a read-only connection cannot do."""
    journal = journal_of(path)
    return journal.is_file() and journal.stat().st_size > 0


@contextmanager
def committed_copy(path: Path) -> Iterator[Path]:
    """The file as last committed: the file itself; or, beside the journal of an unfinished write,
    a copy of both in a temporary folder, where SQLite rolls that write back. The store itself is
    left as it is."""
    if not unfinished_write(path):
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="mlflow-store-") as folder:
        copy = Path(folder) / path.name
        shutil.copyfile(path, copy)
        try:
            shutil.copyfile(journal_of(path), journal_of(copy))
        except FileNotFoundError:  # the write finished meanwhile: its result
            shutil.copyfile(path, copy)
        connection = sqlite3.connect(copy)  # a connection that may write (to the copy) rolls the journal back
        try:
            connection.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        finally:
            connection.close()
        yield copy


def sqlite_state(path: Path) -> tuple[str, str]:
    """(state, detail) of an SQLite file, read without writing: MISSING, EMPTY (no bytes, or no
    table), NOT_SQLITE (detail: what it is), FOREIGN (tables, not MLflow's; detail: some of them),
    OTHER_SCHEMA (detail: its revision), NO_EXPERIMENTS (MLflow's tables, not one experiment), READY,
    LOCKED (another process held it locked for longer than ``LOCK_WAIT_S``; detail: SQLite's words).
    The file is opened read-only (``mode=ro``; a write left unfinished is rolled back in a copy):
    its bytes and modification time stay as they were."""
    if not path.exists():
        return MISSING, ""
    if path.is_dir():
        return NOT_SQLITE, "a folder"
    if not path.is_file():
        return NOT_SQLITE, "a special file"
    if path.stat().st_size == 0:
        return EMPTY, ""
    with open(path, "rb") as handle:
        if handle.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
            return NOT_SQLITE, "a file of another format (not SQLite)"
    try:
        with committed_copy(path.resolve()) as readable:
            connection = sqlite3.connect(f"{readable.as_uri()}?mode=ro", uri=True, timeout=LOCK_WAIT_S)
            try:
                tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                if not tables:
                    return EMPTY, ""
                if not MLFLOW_TABLES <= tables:
                    return FOREIGN, ", ".join(sorted(tables)[:6])
                revision = schema_revision(connection)
                experiments = connection.execute("SELECT COUNT(*) FROM experiments").fetchone()[0]
            finally:
                connection.close()
    except sqlite3.Error as error:
        if held_by_another_process(error):
            return LOCKED, str(error)
        return NOT_SQLITE, f"an SQLite file that cannot be read ({error})"
    revision = "(none)" if revision is None else revision
    head = latest_schema_revision()
    if head is not None and revision != head:
        return OTHER_SCHEMA, revision
    return (READY if experiments else NO_EXPERIMENTS), ""


def check_reachable(uri: str, flag: str = "--tracking-uri") -> None:
    """A tracking server (http/https URI) accepts a connection within
    ``store_probe.REACH_TIMEOUT_S``."""
    reason = unreachable(uri)
    if reason is None:
        return
    parts = urlsplit(uri)
    host = parts.netloc.rsplit("@", 1)[-1]
    raise StoreError(f"cannot reach the MLflow tracking server {parts.scheme}://{host} ({reason}): start it "
                     f"(mlflow server --port {server_port(uri)}) or pass a local store with {flag} "
                     "sqlite:///mlruns.db")


def _schema_message(uri: str, revision: str) -> str:
    import mlflow

    return (f"the store {uri} has the schema of another MLflow version (revision {revision}; this MLflow "
            f"{mlflow.__version__} reads {latest_schema_revision()}) and is not migrated by a command that only "
            f"reads: back it up, then run `mlflow db upgrade {uri}`, or read it with the MLflow version that wrote it")


def _check_not_a_sqlite_file(uri: str, folder: Path, flag: str) -> None:
    """A file store URI naming a file: most likely a SQLite store given without its scheme."""
    if folder.is_file():
        raise StoreError(f"{uri} names a file, not a folder of an MLflow file store; an SQLite store is passed "
                         f"with its scheme: {flag} sqlite:///{folder}")


def check_readable(uri: str, flag: str = "--tracking-uri") -> str:
    """What reading ``uri`` would find, checked without creating or altering anything: the
    ``sqlite_state`` of a SQLite file (MISSING and EMPTY are returned: the caller decides
    whether that is an error), READY for other stores. Raises ``StoreError`` for a file that is
    not an MLflow SQLite store, a schema of another MLflow version, a missing or foreign file
    store folder, a tracking server that does not answer."""
    check_reachable(uri, flag)
    folder = file_store_folder(uri)
    if folder is not None:
        _check_not_a_sqlite_file(uri, folder, flag)
        if not folder.is_dir():
            raise StoreError(f"no MLflow store at {uri}: the folder {folder.resolve()} does not exist. Pass the "
                             f"store the runs were logged to with {flag} ({EXAMPLE_URIS}).")
        if not (folder / ".trash").is_dir():
            raise StoreError(f"{folder.resolve()} is not an MLflow file store (it has no .trash folder) and is "
                             f"not made into one by a command that only reads; pass the store the runs were "
                             f"logged to with {flag} ({EXAMPLE_URIS}).")
        return READY
    path = sqlite_file(uri)
    if path is None:
        return READY
    state, detail = sqlite_state(path)
    if state == NOT_SQLITE:
        raise StoreError(f"{path.resolve()} (the store {uri}) is {detail}, not an MLflow SQLite store; pass the "
                         f"store the runs were logged to with {flag} ({EXAMPLE_URIS}).")
    if state == FOREIGN:
        raise StoreError(f"{path.resolve()} is an SQLite database of something else (tables {detail}), not an "
                         f"MLflow store; pass the store the runs were logged to with {flag} ({EXAMPLE_URIS}).")
    if state == OTHER_SCHEMA:
        raise StoreError(_schema_message(uri, detail))
    if state == LOCKED:
        raise StoreError(f"the MLflow store {uri} is locked by another process ({detail}); run again once it is "
                         "free (another fit or an `mlflow ui` writing to it)")
    return state


def check_writable(uri: str, flag: str = "--tracking-uri") -> None:
    """Before runs are logged to ``uri``: its folder exists, an existing file is an MLflow store
    (or empty: MLflow creates its tables), a tracking server answers. A schema of another MLflow
    version is left to MLflow (which migrates or refuses it)."""
    check_reachable(uri, flag)
    path = sqlite_file(uri)
    if path is not None:
        if not path.parent.is_dir():
            raise StoreError(f"the folder of the MLflow store {uri} does not exist ({path.parent.resolve()}): "
                             f"create it, or pass another store with {flag} ({EXAMPLE_URIS}).")
        state, detail = sqlite_state(path)
        if state == NOT_SQLITE:
            raise StoreError(f"{path.resolve()} (the store {uri}) is {detail}, not an MLflow SQLite store; pass "
                             f"another store with {flag} ({EXAMPLE_URIS}).")
        if state == FOREIGN:
            raise StoreError(f"{path.resolve()} is an SQLite database of something else (tables {detail}); "
                             f"MLflow would add its tables to it: pass another store with {flag} ({EXAMPLE_URIS}).")
        return  # LOCKED included: the writer's own check waits for the lock, saying so
    folder = file_store_folder(uri)
    if folder is not None:
        _check_not_a_sqlite_file(uri, folder, flag)
    if folder is not None and not folder.parent.is_dir():
        raise StoreError(f"the folder of the MLflow file store {uri} does not exist ({folder.parent.resolve()}): "
                         f"create it, or pass another store with {flag} ({EXAMPLE_URIS}).")


@contextmanager
def reading(uri: str) -> Iterator[str]:
    """The URI to read the store ``uri`` with, without altering it: a SQLite file through a
    read-only connection (``read_only_uri``), or, where a write was left unfinished, a read-only
    connection to a copy with that write rolled back (``committed_copy``); other URIs unchanged."""
    path = sqlite_file(uri)
    if path is None:
        yield uri
        return
    with committed_copy(path.resolve()) as readable:
        yield read_only_uri(readable)


def read_only_uri(path: Path) -> str:
    """The URI to read the SQLite store file ``path`` with through a read-only connection (SQLite
    refuses every write: no table, migration or experiment can be created through it).

    The database SQLite opens is ``file:%2Fabs%2Fpath?mode=ro``: every character of the path
    escaped, "/" too, so SQLite decodes any path back as it was, and MLflow, which creates the
    parent folders of a sqlite path, finds none to create. SQLAlchemy 2.1 unquotes the database of
    a URL once and 2.0 does not, so the URL is quoted once more only where this SQLAlchemy unquotes
    (``database_url``): either way the database reaches SQLite unaltered, with no "/" in it."""
    return database_url(f"file:{quote(str(path.resolve()), safe='')}") + "?mode=ro&uri=true"


def database_url(database: str) -> str:
    """The ``sqlite:///`` URL whose database, as this SQLAlchemy reads it, is ``database``
    (SQLAlchemy 2.1 percent-decodes a URL's database once; 2.0 takes it as written)."""
    from sqlalchemy.engine import make_url

    quoted = sqlite_uri(quote(database, safe=":"))
    return quoted if make_url(quoted).database == database else sqlite_uri(database)
