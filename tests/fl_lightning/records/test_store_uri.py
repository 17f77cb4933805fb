"""MLflow store URIs are parsed in one module (fl_lightning.records.store_uri): its readings, and a
check that no other module of the library, the runner or the leaderboard takes a URI apart."""

import re
from pathlib import Path

import pytest

from fl_lightning.records import store_uri
from fl_lightning.records.store_uri import (
    absolute_tracking_uri,
    file_store_folder,
    local_store_missing,
    sqlite_file,
    sqlite_uri,
)
from tests.paths import REPO

ROOT = REPO


@pytest.mark.parametrize(("uri", "expected"), [
    ("sqlite:///runs.db", Path("runs.db")),
    ("sqlite:////abs/my%20runs.db", Path("/abs/my runs.db")),
    ("sqlite:///runs.db?timeout=30", Path("runs.db")),
    ("sqlite:///:memory:", None),
    ("sqlite://", None),
    ("sqlite:///file:%2Fabs%2Fruns.db?mode=ro&uri=true", None),  # SQLite's own URI: not a plain file
    ("file:./mlruns", None),
    ("http://localhost:5000", None),
    ("postgresql://u@h/db", None),
])
def test_the_file_of_a_sqlite_store(uri, expected):
    assert sqlite_file(uri) == expected


@pytest.mark.parametrize(("uri", "expected"), [
    ("file:./mlruns", Path("./mlruns")),
    ("file:///abs/mlruns", Path("/abs/mlruns")),
    ("mlruns", Path("mlruns")),
    ("sqlite:///runs.db", None),
    ("http://localhost:5000", None),
])
def test_the_folder_of_a_file_store(uri, expected):
    assert file_store_folder(uri) == expected


def test_a_relative_store_becomes_absolute_and_round_trips(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    absolute = absolute_tracking_uri("sqlite:///sub/runs.db?timeout=5")
    assert absolute == f"sqlite:///{tmp_path}/sub/runs.db?timeout=5"
    assert sqlite_file(absolute) == tmp_path / "sub" / "runs.db"
    assert sqlite_file(sqlite_uri(tmp_path / "runs.db")) == tmp_path / "runs.db"
    assert absolute_tracking_uri("file:./mlruns") == (tmp_path / "mlruns").as_uri()
    assert absolute_tracking_uri("http://host:5000") == "http://host:5000"
    assert local_store_missing("sqlite:///runs.db") and local_store_missing("file:./mlruns")
    (tmp_path / "runs.db").write_bytes(b"")
    (tmp_path / "mlruns").mkdir()
    assert not local_store_missing("sqlite:///runs.db") and not local_store_missing("file:./mlruns")
    assert not local_store_missing("sqlite:///:memory:") and not local_store_missing("http://host:5000")


# a SQLite URI taken apart or put together by hand: a test of its prefix, a cut at its length, an f-string
BY_HAND = re.compile(r"""(startswith|len|partition|split)\(\s*["']sqlite:|f["']sqlite:///\{""")


def test_no_other_module_parses_a_store_uri_by_hand():
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for package in ("fl_lightning", "benchmarks", "leaderboard")
             for path in sorted((ROOT / package).rglob("*.py")) if path.name != "store_uri.py"
             for number, line in enumerate(path.read_text().splitlines(), 1) if BY_HAND.search(line)]
    assert not found, "parse the URI with fl_lightning.records.store_uri instead:\n" + "\n".join(found)


def test_only_records_takes_a_uri_apart():
    """``urllib.parse`` is read in ``fl_lightning/records/`` only: every other module asks it."""
    found = [f"{path.relative_to(ROOT)}" for package in ("fl_lightning", "benchmarks", "leaderboard")
             for path in sorted((ROOT / package).rglob("*.py"))
             if "urllib.parse" in path.read_text() and path.parent.name != "records"]
    assert found == []


@pytest.mark.parametrize(("uri", "shown", "name"), [
    ("sqlite:////home/me/runs.db", "sqlite:////home/me/runs.db", "runs.db"),
    ("file:///home/me/mlruns", "file:///home/me/mlruns", "mlruns"),
    ("http://me:secret@mlflow.example.org:5000", "http://mlflow.example.org:5000", "http://mlflow.example.org:5000"),
    ("https://token@host", "https://host", "https://host"),
    ("databricks", "databricks", "databricks"),
])
def test_a_store_is_shown_without_credentials_or_local_paths(uri, shown, name):
    assert store_uri.without_credentials(uri) == shown
    assert store_uri.store_display_name(uri) == name
    assert store_uri.store_scheme(uri) == ("" if uri == "databricks" else uri.split(":")[0])
