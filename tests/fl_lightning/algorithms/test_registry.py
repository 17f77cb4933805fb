"""The algorithm registry: one list of names (``registry.BUILT_IN``), read without torch, that is
exactly what the algorithm files register, and the classes imported when first asked for."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from fl_lightning.algorithms import registry
from tests.paths import REPO

ALGORITHMS_DIR = REPO / "fl_lightning" / "algorithms"


def registered_in_files() -> dict[str, str]:
    """Every class decorated ``@register_algorithm`` in the algorithm files, with its module (read from source)."""
    found = {}
    for path in sorted(ALGORITHMS_DIR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and any(
                    isinstance(d, ast.Name) and d.id == "register_algorithm" for d in node.decorator_list):
                found[node.name] = path.stem
    return found


def test_the_list_is_what_the_files_register():
    assert registered_in_files() == registry.BUILT_IN


def test_every_listed_class_is_registered_under_its_name_from_its_module(monkeypatch):
    imported_last_first = dict(reversed(list(registry.load_algorithms().items())))
    monkeypatch.setattr(registry, "ALGORITHMS", imported_last_first)  # as if qfedavg had been imported first
    classes = registry.load_algorithms()
    assert list(classes) == list(registry.BUILT_IN)  # the listed order, whichever module came first
    for name, module in registry.BUILT_IN.items():
        assert classes[name].__name__ == name and classes[name].__module__ == f"fl_lightning.algorithms.{module}"


def test_names_and_one_class_load_without_the_others():
    """The names come without torch; asking for one class imports its own module (and what it needs)."""
    script = ("import json, sys\nfrom fl_lightning.algorithms import algorithm_names\nnames = algorithm_names()\n"
              "light = 'torch' not in sys.modules\nfrom fl_lightning.algorithms import QFedAvg\n"
              "print(json.dumps([names, light, QFedAvg.__name__, 'fl_lightning.algorithms.fedlf' in sys.modules]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    names, light, loaded, fedlf_loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert names == list(registry.BUILT_IN) and light, done.stderr
    assert loaded == "QFedAvg" and not fedlf_loaded


def test_an_algorithm_file_must_list_its_class(monkeypatch):
    from fl_lightning.core.module import FederatedModule

    monkeypatch.setattr(registry, "ALGORITHMS", dict(registry.load_algorithms()))
    unlisted = type("Unlisted", (FederatedModule,), {"__module__": "fl_lightning.algorithms.fedavg"})
    with pytest.raises(ValueError, match=r"list it in fl_lightning\.algorithms\.registry\.BUILT_IN as 'Unlisted'"):
        registry.register_algorithm(unlisted)
    moved = type("FedAvg", (FederatedModule,), {"__module__": "fl_lightning.algorithms.fedprox"})
    with pytest.raises(ValueError, match="already registered"):
        registry.register_algorithm(moved)


def test_an_algorithm_of_ones_own_registers_beside_the_built_in_ones(monkeypatch):
    from fl_lightning.core.module import FederatedModule

    monkeypatch.setattr(registry, "ALGORITHMS", dict(registry.load_algorithms()))
    mine = type("MyAlgorithm", (FederatedModule,), {"__module__": "mypackage.algorithms"})
    assert registry.register_algorithm(mine) is mine
    assert registry.algorithm_names()[-1] == "MyAlgorithm" and registry.algorithm_class("MyAlgorithm") is mine
    with pytest.raises(TypeError, match="expects a FederatedModule subclass"):
        registry.register_algorithm(int)


def test_an_unknown_attribute_is_an_attribute_error():
    import fl_lightning.algorithms as algorithms

    with pytest.raises(AttributeError, match="has no attribute 'FedAvgg'"):
        algorithms.FedAvgg  # noqa: B018
    assert {"FedLF", "ALGORITHMS", "register_algorithm"} <= set(dir(algorithms))
    assert algorithms.__all__[6:] == list(registry.BUILT_IN)  # what `import *` and type checkers see
