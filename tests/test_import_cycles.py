"""No import cycles among the library, the benchmarks and the leaderboard: arrows point one way.

Every import counts, at module level, inside a function or under ``if TYPE_CHECKING:`` (a lazy
or a type-only import only hides a cycle from the interpreter, not from a reader). One
import is declared, and checked to stay inside a function: the console script's hand-over,
``fl_lightning.cli.console`` importing ``fl_lightning.cli.lightning_cli`` inside ``main`` only, when a
command runs, so that the top-level help imports no torch. It is left out of the cycle search
(no cycle closes through it today; ``lightning_cli`` imports nothing from ``console``).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import REPO

ROOT = REPO
PACKAGES = ("fl_lightning", "benchmarks", "leaderboard")
# (importer, imported): imports that must stay inside a function, left out of the cycle search
LAZY_HANDOVERS = {("fl_lightning.cli.console", "fl_lightning.cli.lightning_cli")}


def module_files() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports(name: str, path: Path, modules: dict[str, Path]) -> dict[str, bool]:
    """The project modules ``name`` imports -> whether any of those imports is at module level."""
    found: dict[str, bool] = {}

    def project_module(target: str) -> str | None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the importer's package
                    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
                    for _ in range(child.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{base}".rstrip(".")
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                           for alias in child.names]
            for target in filter(None, map(project_module, targets)):
                if target != name:
                    found[target] = found.get(target, False) or not in_function
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text()), False)
    return found


def import_graph() -> dict[str, dict[str, bool]]:
    modules = module_files()
    return {name: imports(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, dict[str, bool]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def strong(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph.get(module, {}):
            if target not in index:
                strong(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            strong(module)
    return groups


def test_no_two_modules_import_each_other():
    graph = import_graph()
    assert len(graph) > 50 and "fl_lightning.core.module" in graph["fl_lightning.algorithms.fedavg"]
    for importer, imported in LAZY_HANDOVERS:
        assert graph[importer].get(imported) is False, f"{importer} must import {imported} only inside a function"
        del graph[importer][imported]
    found = cycles(graph)
    assert not found, ("modules that import each other, directly or around a cycle (move what they share "
                       "into one of them or a third module):\n" + "\n".join(map(", ".join, found)))


def test_a_cycle_is_found():
    graph = {"a": {"b": True}, "b": {"c": False}, "c": {"a": True}, "d": {"a": True}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b": True}, "b": {}}) == []


def test_the_runner_imports_no_leaderboard_module():
    """The runner reads and checks stores through the library (``fl_lightning.records.read_only_store``,
    ``fl_lightning.records.store_uri``), not through the leaderboard, which sits on top of it."""
    graph = import_graph()
    found = sorted(
        f"{importer} -> {imported}"
        for importer, targets in graph.items()
        if importer.startswith("benchmarks")
        for imported in targets
        if imported.startswith("leaderboard")
    )
    assert not found, "\n".join(found)


def test_the_leaderboard_imports_no_algorithm_and_no_torch():
    """Issue 35: the leaderboard's floor is below the algorithms'. Its facts about algorithms come
    from run tags and ``fl_lightning.records.algorithm_facts``; importing every leaderboard module (in a fresh
    interpreter) loads no ``fl_lightning.algorithms``, no torch and no Lightning."""
    import json
    import subprocess
    import sys

    probe = ("import importlib, json, pkgutil, sys, leaderboard\n"
             "for m in pkgutil.walk_packages(leaderboard.__path__, 'leaderboard.'):\n"
             "    importlib.import_module(m.name)\n"
             "print(json.dumps(sorted(sys.modules)))\n")
    root = REPO
    loaded = json.loads(subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True,
                                       check=True).stdout)
    assert [m for m in loaded if m.split(".")[0] in ("torch", "lightning") or m.startswith("fl_lightning.algorithms")
            ] == []
    graph = import_graph()
    assert not [target for name, targets in graph.items() if name.startswith("leaderboard")
                for target in targets if target.startswith("fl_lightning.algorithms")]


def reachable(graph: dict[str, dict[str, bool]], starts: list[str]) -> set[str]:
    """Every project module ``starts`` reach through imports, inside functions included."""
    seen: set[str] = set()
    todo = list(starts)
    while todo:
        for target in graph.get(todo.pop(), {}):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def imports_torch(path: Path) -> bool:
    """Whether the file imports torch, Lightning, timm, torchvision or torchmetrics anywhere in it."""
    heavy = {"torch", "lightning", "timm", "torchvision", "torchmetrics"}
    for node in ast.walk(ast.parse(path.read_text())):
        names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(name.split(".")[0] in heavy for name in names):
            return True
    return False


def test_nothing_the_leaderboard_reaches_even_lazily_loads_torch():
    """Issue 35: a lazy import hides a dependency from the interpreter, not from the graph. From the
    leaderboard, following every import (inside functions too), no path reaches the runner, an
    algorithm, the engine, a model or the data, and no module on the way imports torch or
    Lightning anywhere. (The claims read suites through ``fl_lightning.records.suite_format``, not through
    ``benchmarks``, whose runner starts fits.)"""
    graph, files = import_graph(), module_files()
    reached = reachable(graph, [name for name in graph if name.startswith("leaderboard")])
    outside = sorted(name for name in reached if not name.startswith("leaderboard"))
    assert "fl_lightning.records.suite_format" in outside and "fl_lightning.records.vocabulary" in outside
    assert [name for name in outside if name.startswith("benchmarks")] == []
    assert [name for name in outside if imports_torch(files[name])] == []
    assert imports_torch(files["fl_lightning.core.module"]) and reachable(graph, ["benchmarks.suites"]) \
        & {"fl_lightning.algorithms"}  # the check sees a lazy path to torch where there is one
