"""Issue 52: the leaderboard rests on ``fl_lightning.records`` alone, and ``records`` on nothing else
of the library: every import is read from the source (inside functions too), and importing every
``records`` module in a fresh interpreter loads no torch and no Lightning."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from tests.paths import REPO

ROOT = REPO
RECORDS = "fl_lightning.records"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(source: str, name: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, dotted name) of every import of ``source`` (module ``name``), relative ones made
    absolute; ``from a import b`` counts as ``a.b`` (``b`` may be a module)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}".rstrip(".")
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def outside(imported: str, allowed: tuple[str, ...], watched: tuple[str, ...]) -> bool:
    """Whether ``imported`` is a module of a ``watched`` package that is not under an ``allowed`` one."""
    def under(prefix: str) -> bool:
        return imported == prefix or imported.startswith(prefix + ".")
    return any(under(w) for w in watched) and not any(under(a) for a in allowed)


def offenders(package: str, allowed: tuple[str, ...], watched: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((ROOT / package.replace(".", "/")).rglob("*.py")):
        name = module_name(path)
        for line, imported in imported_names(path.read_text(), name, path.name == "__init__.py"):
            if outside(imported, allowed, watched):
                found.append(f"{path.relative_to(ROOT)}:{line}: {imported}")
    return found


def test_the_leaderboard_imports_only_records_and_itself():
    found = offenders("leaderboard", allowed=(RECORDS, "leaderboard"),
                      watched=("fl_lightning", "benchmarks", "leaderboard"))
    assert not found, f"the leaderboard reads the library through {RECORDS} only:\n" + "\n".join(found)


def test_records_imports_nothing_else_of_the_project():
    found = offenders(RECORDS, allowed=(RECORDS,), watched=("fl_lightning", "benchmarks", "leaderboard"))
    assert not found, f"{RECORDS} rests on the standard library and outside packages only:\n" + "\n".join(found)


def test_the_scan_sees_every_way_of_importing():
    source = '''
import fl_lightning
import benchmarks.runner
from fl_lightning.cli import preflight
from fl_lightning.records import vocabulary
from fl_lightning.records.vocabulary import Tag
from fl_lightning.core.module import FederatedModule
from ..claims import spec
def lazy():
    from fl_lightning.cache import cache_dir
'''
    watched = ("fl_lightning", "benchmarks", "leaderboard")
    names = [imported for _, imported in imported_names(source, "leaderboard.claims.x")
             if outside(imported, (RECORDS, "leaderboard"), watched)]
    assert names == ["fl_lightning", "benchmarks.runner", "fl_lightning.cli.preflight",
                     "fl_lightning.core.module.FederatedModule", "fl_lightning.cache.cache_dir"]
    # what the leaderboard imported before the records package (issue 52) is refused
    assert outside("fl_lightning.run_schema", (RECORDS, "leaderboard"), watched)
    assert not outside("fl_lightning.records.store_uri.sqlite_file", (RECORDS, "leaderboard"), watched)


def test_importing_every_records_module_loads_no_torch():
    probe = ("import importlib, json, pkgutil, sys, fl_lightning.records as records\n"
             "for m in pkgutil.walk_packages(records.__path__, 'fl_lightning.records.'):\n"
             "    importlib.import_module(m.name)\n"
             "print(json.dumps(sorted(sys.modules)))\n")
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                                       check=True).stdout)
    assert "fl_lightning.records.vocabulary" in loaded
    assert [m for m in loaded if m.split(".")[0] in ("torch", "lightning", "pytorch_lightning")] == []


def test_the_claims_and_plan_formats_load_no_torch_and_no_leaderboard():
    """The formats of ``claims.yaml``, the plan and the amendments sit in ``records``: importing them
    in a fresh interpreter loads no torch, no Lightning and no leaderboard module."""
    probe = ("import json, sys\n"
             "import fl_lightning.records.claims_format, fl_lightning.records.plan_format\n"
             "print(json.dumps(sorted(sys.modules)))\n")
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True,
                                       check=True).stdout)
    assert {"fl_lightning.records.claims_format", "fl_lightning.records.plan_format"} <= set(loaded)
    assert [m for m in loaded
            if m.split(".")[0] in ("torch", "lightning", "pytorch_lightning", "leaderboard")] == []


def test_store_probes_are_written_once():
    """One reachability probe, one MLflow table set and one schema-revision read, in
    ``records.store_probe``: no other module opens a socket to a server or reads alembic's table."""
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
             for package in ("fl_lightning", "benchmarks", "leaderboard")
             for path in sorted((ROOT / package).rglob("*.py")) if path.name != "store_probe.py"
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if any(spelled in line.split("#", 1)[0] for spelled in
                    ("create_connection(", "FROM alembic_version", 'frozenset({"alembic_version"'))]
    assert not found, "use fl_lightning.records.store_probe:\n" + "\n".join(found)


def test_the_probe_answers_for_servers_only(tmp_path):
    import socket
    import sqlite3

    from fl_lightning.records.store_probe import schema_revision, server_port, unreachable

    assert server_port("http://host") == 80 and server_port("https://host") == 443
    assert server_port("http://host:5000") == 5000 and server_port("sqlite:///runs.db") is None
    assert unreachable("sqlite:///runs.db") is None and unreachable("file:./mlruns") is None
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert unreachable(f"http://127.0.0.1:{port}") is None
    assert unreachable(f"http://127.0.0.1:{port}")  # closed now: the system's reason
    with sqlite3.connect(tmp_path / "store.db") as connection:
        connection.execute("CREATE TABLE alembic_version (version_num TEXT)")
        assert schema_revision(connection) is None
        connection.execute("INSERT INTO alembic_version VALUES ('abc123')")
        assert schema_revision(connection) == "abc123"
