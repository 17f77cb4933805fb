"""Tests use the engine's public API: no test reaches a private name (``_x``) of the module, its
mixins, the round engine, the round context, the local training engines or the evaluator. A private
name may change without notice; a test that needs one asks for a public seam instead."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import REPO, TESTS

CORE = REPO / "fl_lightning" / "core"
# file of fl_lightning/core -> the engine's classes in it (None: every class of the file)
ENGINE_CLASSES: dict[str, set[str] | None] = {
    "module.py": None, "round_log.py": {"RoundLogging"}, "state.py": {"ClientStateMixin"}, "data_link.py": None,
    "round_engine.py": None, "payload.py": {"RoundContext"}, "engines.py": {"VectorisedEngine", "SequentialEngine"},
    "engine_runner.py": None, "federation_evaluation.py": {"FederationEvaluator"},
}


def private_engine_names() -> dict[str, str]:
    """Every private method or ``self._x`` attribute the engine's classes define -> where."""
    names: dict[str, str] = {}
    for file, classes in ENGINE_CLASSES.items():
        tree = ast.parse((CORE / file).read_text())
        for cls in tree.body:
            if not isinstance(cls, ast.ClassDef) or (classes is not None and cls.name not in classes):
                continue
            for node in ast.walk(cls):
                name = None
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    name = node.name
                elif (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                      and isinstance(node.value, ast.Name) and node.value.id == "self"):
                    name = node.attr
                if name and name.startswith("_") and not name.startswith("__"):
                    names.setdefault(name, f"{cls.name} ({file})")
    return names


def test_the_engine_has_private_names_to_protect():
    names = private_engine_names()
    assert "_apply_server_step" in names and "_commit_round" in names  # the scan reads the classes


def test_no_test_reaches_a_private_name_of_the_engine():
    private = private_engine_names()
    reached = []
    for path in sorted(set(TESTS.rglob("*.py")) - {Path(__file__).resolve()}):
        for node in ast.walk(ast.parse(path.read_text())):
            attribute = node.attr if isinstance(node, ast.Attribute) else None
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                attribute = node.value  # getattr / monkeypatch.setattr by name
            if attribute in private:
                reached.append(f"{path.relative_to(TESTS)}:{node.lineno} {attribute} of {private[attribute]}")
    assert reached == [], "tests reach private names of the engine:\n" + "\n".join(reached)
