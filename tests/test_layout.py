"""The tests mirror the packages: ``tests/fl_lightning/core/`` tests ``fl_lightning/core/``, and so on.
Only the whole-project tests sit at the top of ``tests/``; ``tests/docs`` and ``tests/browser`` test the
documentation site and the pages in a browser. A test file is named after its subject, not an issue."""

from __future__ import annotations

import re

from tests.paths import REPO, TESTS

NOT_PACKAGES = {"docs", "browser"}  # the documentation site; the pages seen in a browser
WHOLE_PROJECT = {"test_bad_input.py", "test_import_cycles.py", "test_installed_tools.py", "test_layout.py",
                 "test_properties.py"}


def test_every_test_folder_is_a_package_of_the_repository():
    folders = [path for path in TESTS.rglob("*") if path.is_dir() and path.name != "__pycache__"]
    assert folders, "no test folders found"
    for folder in folders:
        relative = folder.relative_to(TESTS)
        if relative.parts[0] in NOT_PACKAGES:
            continue
        assert (REPO / relative / "__init__.py").is_file(), f"tests/{relative.as_posix()} mirrors no package"


def test_only_whole_project_tests_sit_at_the_top():
    top = {path.name for path in TESTS.glob("test_*.py")}
    assert top == WHOLE_PROJECT, f"move {sorted(top - WHOLE_PROJECT)} into the folder of the package it tests"


def test_no_test_file_is_named_after_an_issue():
    named = [path.relative_to(TESTS).as_posix() for path in TESTS.rglob("test_*.py")
             if re.search(r"issue|defect|turn\d", path.stem)]
    assert named == []
