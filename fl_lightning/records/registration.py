"""The claims ledger's registration, torch-free: the content hash of the registered files (the plan,
the amendments, the confirmatory pass and every paper folder's claims, suites and paper numbers), the
hash the plan records, and the tags a confirmatory run carries. The runner checks it before a
confirmatory run; the leaderboard shows it (``leaderboard.registration``)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from fl_lightning.records.vocabulary import Tag

LEDGER_ROOT = Path(__file__).resolve().parent.parent / "benchmarks"
"""The registered files' folder in this repository (the papers' folders and the ledger's own files)."""
PLAN_FILE = "ledger_plan.yaml"
AMENDMENTS_FILE = "ledger_amendments.yaml"
HASH_KEY = "registered_hash"
LEDGER_PASS_TAG = Tag.LEDGER_PASS  # a run's pass of the ledger: "confirmatory" (exploratory runs carry none)
PLAN_HASH_TAG = Tag.LEDGER_PLAN_HASH  # the registration hash a confirmatory run ran under
CONFIRMATORY = "confirmatory"
_HASH_LINE = re.compile(rf"^{HASH_KEY}:.*(?:\n|$)", re.MULTILINE)


def registered_files(root: Path = LEDGER_ROOT) -> list[Path]:
    """The files a registration covers, in a fixed order: the ledger's own files at the top of
    ``root`` (``ledger_*.yaml``: the plan, the amendments, the confirmatory pass) and every YAML file
    of a paper's folder (its claims, its suites, its paper numbers)."""
    root = Path(root)
    top = sorted(root.glob("ledger_*.yaml"))
    papers = sorted(path for path in root.glob("*/*.yaml") if path.parent.name not in ("perf", "ledger_runs"))
    return top + papers


def registration_hash(root: Path = LEDGER_ROOT) -> str:
    """SHA-256 over the registered files (``registered_files``): each file's path relative to
    ``root`` and its bytes, the plan read without its own ``registered_hash:`` line (the hash is
    recorded in the plan it covers). Any change to a claim, a suite, the plan or an amendment
    changes it; moving ``root`` does not."""
    root = Path(root)
    digest = hashlib.sha256()
    for path in registered_files(root):
        content = path.read_bytes()
        if path.name == PLAN_FILE:
            content = _HASH_LINE.sub("", content.decode()).encode()
        name = path.relative_to(root).as_posix().encode()
        digest.update(len(name).to_bytes(8, "big") + name + len(content).to_bytes(8, "big") + content)
    return digest.hexdigest()


def with_recorded_hash(plan_text: str, digest: str) -> str:
    """The plan's text recording ``digest`` as its ``registered_hash:`` line (replacing the line it
    has, else appended); nothing else of the text changes, so the hash still covers it."""
    line = f"{HASH_KEY}: {digest}\n"
    if _HASH_LINE.search(plan_text):
        return _HASH_LINE.sub(line, plan_text)
    return (plan_text if plan_text.endswith("\n") or not plan_text else plan_text + "\n") + line


def recorded_hash(root: Path = LEDGER_ROOT) -> str:
    """The ``registered_hash:`` the plan records ("" when it records none)."""
    path = Path(root) / PLAN_FILE
    if not path.exists():
        return ""
    match = _HASH_LINE.search(path.read_text())
    return match.group(0).split(":", 1)[1].strip().strip("'\"") if match else ""


def registration_problem(root: Path = LEDGER_ROOT) -> str:
    """Why a confirmatory run may not start under these files ("" when it may): the plan records no
    hash, or the files differ from the hash it records (a change after registration)."""
    recorded = recorded_hash(root)
    if not recorded:
        return (f"{Path(root) / PLAN_FILE} records no {HASH_KEY}: register the plan first "
                f"(python -m leaderboard register)")
    actual = registration_hash(root)
    if actual != recorded:
        return (f"the plan, claims, suites or amendments under {root} changed after registration "
                f"(registered {recorded[:12]}, now {actual[:12]}): a confirmatory run only starts under the "
                "registered files; restore them, or record the change as an amendment and register anew")
    return ""
