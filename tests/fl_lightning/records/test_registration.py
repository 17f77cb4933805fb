"""The ledger's registration (issue 48): one content hash over the plan, the amendments, the confirmatory
pass and every paper folder's claims, suites and paper numbers, recorded in the plan by
``python -m leaderboard register`` and checked before a confirmatory run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from leaderboard.__main__ import main
from leaderboard.registration import (
    PLAN_FILE,
    RegistrationError,
    recorded_hash,
    register,
    registered_files,
    registration_hash,
    registration_problem,
)
from tests.paths import REPO

BENCHMARKS = REPO / "benchmarks"


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """The repository's registered files, copied (without the code; the exports live in evidence/)."""
    copy = tmp_path / "benchmarks"
    shutil.copytree(BENCHMARKS, copy, ignore=shutil.ignore_patterns("perf", "__pycache__", "*.py", "*.md"))
    plan = copy / PLAN_FILE
    plan.write_text("".join(line for line in plan.read_text().splitlines(keepends=True)
                            if not line.startswith("registered_hash:")))
    return copy


def test_the_hash_covers_the_plan_claims_suites_amendments_and_the_confirmatory_pass(root):
    names = {path.relative_to(root).as_posix() for path in registered_files(root)}
    assert {"ledger_plan.yaml", "ledger_amendments.yaml", "ledger_confirmatory.yaml", "fedfv/claims.yaml",
            "fedfv/offline.yaml", "cgsv/paper_numbers.yaml"} <= names
    before = registration_hash(root)
    for name in ("fedfv/claims.yaml", "ledger_amendments.yaml", "ledger_confirmatory.yaml", "cgsv/offline.yaml"):
        path = root / name
        original = path.read_bytes()
        path.write_bytes(original + b"\n# one byte more\n")
        assert registration_hash(root) != before, name
        path.write_bytes(original)
    assert registration_hash(root) == before
    moved = root.parent / "elsewhere"
    shutil.copytree(root, moved)
    assert registration_hash(moved) == before  # the paths hashed are relative to the root


def test_register_records_the_hash_in_the_plan_and_the_runner_check_then_passes(root, capsys):
    assert "records no registered_hash" in registration_problem(root)
    assert main(["register", "--root", str(root)]) == 0
    digest = registration_hash(root)
    assert capsys.readouterr().out.startswith(f"registered: {digest} over ")
    assert recorded_hash(root) == digest and registration_problem(root) == ""
    assert not list(root.glob(".*.partial"))  # written beside, then renamed
    assert main(["register", "--root", str(root)]) == 0  # again: nothing to do
    assert capsys.readouterr().out.startswith(f"already registered: {digest}")
    assert main(["register", "--root", str(root), "--check"]) == 0


def test_a_change_after_registration_is_refused_until_it_is_registered_again(root, capsys):
    register(root)
    first = recorded_hash(root)
    claims = root / "fedlf" / "claims.yaml"
    claims.write_text(claims.read_text().replace("much lower", "much, much lower", 1))
    problem = registration_problem(root)
    assert "changed after registration" in problem and first[:12] in problem
    assert main(["register", "--root", str(root), "--check"]) == 1
    assert "changed after registration" in capsys.readouterr().err
    with pytest.raises(RegistrationError, match="record the change in ledger_amendments.yaml and register again"):
        register(root)
    assert recorded_hash(root) == first  # nothing written
    assert main(["register", "--root", str(root)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    digest, changed = register(root, again=True)
    assert changed and digest != first and recorded_hash(root) == digest and registration_problem(root) == ""


def test_an_undated_or_unreadable_plan_is_not_registered(root):
    plan = root / PLAN_FILE
    text = plan.read_text()
    plan.write_text(text.replace("registered: 2026-12-06\n", ""))
    with pytest.raises(RegistrationError, match="`registered:` \\(the date\\) is missing"):
        register(root)
    plan.write_text(text.replace("alpha: 0.05", "alpha: 0.7"))
    with pytest.raises(RegistrationError, match="alpha"):
        register(root)
    assert recorded_hash(root) == ""


def test_the_repository_plan_is_registered_over_its_current_files():
    """The committed registration: the plan's recorded hash is the hash of the committed files (a change to
    a claim, a suite, the plan or an amendment after registration fails here until registered again)."""
    assert recorded_hash(BENCHMARKS), "benchmarks/ledger_plan.yaml records no registered_hash"
    assert registration_problem(BENCHMARKS) == ""


def test_a_failed_write_leaves_the_plan_as_it_was_and_no_partial_copy(root, monkeypatch):
    before = (root / PLAN_FILE).read_bytes()

    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "replace", full_disk)
    with pytest.raises(RegistrationError, match="No space left on device.*the plan is unchanged"):
        register(root)
    assert (root / PLAN_FILE).read_bytes() == before and not list(root.glob(".*.partial"))
