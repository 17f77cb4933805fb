"""The ledger's confirmatory pass (``ledger_confirmatory.yaml``): its fresh seeds and registered run
lengths, the registration check a confirmatory run makes before anything is created, and the cells it
runs (tagged with the pass and the registration hash). Shared by the runner and the ledger."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from benchmarks.suites import SUITES_DIR, Cell, deep_merge
from fl_lightning.records.registration import CONFIRMATORY, registration_hash, registration_problem

CONFIRMATORY_FILE = "ledger_confirmatory.yaml"
ROOT_VARIABLE = "FL_BENCHMARKS_LEDGER_ROOT"
"""The folder of the registered files a confirmatory run checks and reads (the plan, the amendments,
``ledger_confirmatory.yaml``, the claims and the suites); default: this package's folder."""


@dataclass(frozen=True)
class Confirmatory:
    """``ledger_confirmatory.yaml``: the pass's fresh seeds (``rule``, ``first``, ``count`` and the
    resulting ``values``) and, per suite (experiment name) and benchmark, its ``num_rounds`` and
    ``eval_every``."""

    seeds: list[int]
    first: int
    count: int
    rule: str
    lengths: dict[str, dict[str, dict[str, int]]]


def ledger_root(root: Path | str | None = None) -> Path:
    """The registered files' folder: ``root``, else $FL_BENCHMARKS_LEDGER_ROOT, else ``benchmarks/``."""
    return Path(root or os.environ.get(ROOT_VARIABLE) or SUITES_DIR)


def registered_hash_or_exit(root: Path | str | None = None) -> str:
    """The registration hash a confirmatory run carries; the registration's problem (no hash recorded,
    or files that differ from it: ``fl_lightning.records.registration.registration_problem``) as a one-line
    refusal (``SystemExit``), said before anything is created."""
    folder = ledger_root(root)
    problem = registration_problem(folder)
    if problem:
        raise SystemExit(f"refused: {problem}")
    return registration_hash(folder)


def load_confirmatory(root: Path | str | None = None) -> Confirmatory:
    """``<root>/ledger_confirmatory.yaml``, checked (one line, ``SystemExit``, for the first problem)."""
    path = ledger_root(root) / CONFIRMATORY_FILE
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as error:
        raise SystemExit(f"cannot read {path}: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise SystemExit(f"{path} is not valid YAML: {error}") from None
    if not isinstance(raw, dict) or raw.get("pass") != CONFIRMATORY:
        raise SystemExit(f"{path}: expected `pass: {CONFIRMATORY}` with `seeds:` and `lengths:`")
    seeds = raw.get("seeds")
    if not isinstance(seeds, dict) or not {"rule", "first", "count", "values"} <= set(seeds):
        raise SystemExit(f"{path}: `seeds:` needs rule, first, count and values")
    values, first, count = seeds["values"], seeds["first"], seeds["count"]
    if not (isinstance(values, list) and all(type(v) is int for v in values) and type(first) is int
            and type(count) is int and len(values) == count == len(set(values))
            and min(values, default=first) >= first):
        raise SystemExit(f"{path}: `seeds.values` must be `count` distinct integers from `first` up")
    lengths = raw.get("lengths")
    if not isinstance(lengths, dict):
        raise SystemExit(f"{path}: `lengths:` must map each suite to its benchmarks' num_rounds and eval_every")
    for suite, benchmarks in lengths.items():
        for benchmark, setting in (benchmarks or {}).items():
            if not (isinstance(setting, dict) and set(setting) == {"num_rounds", "eval_every"}
                    and all(type(v) is int and v > 0 for v in setting.values())):
                raise SystemExit(f"{path}: lengths.{suite}.{benchmark} must be {{num_rounds: N, eval_every: K}} "
                                 "with positive integers")
    return Confirmatory(list(values), first, count, str(seeds["rule"]), lengths)


def confirmatory_cells(cells: list[Cell], confirmatory: Confirmatory, plan_hash: str) -> list[Cell]:
    """The cells of the confirmatory pass: each cell's rounds and evaluation cadence set to its
    suite's and benchmark's in ``ledger_confirmatory.yaml`` (a benchmark it does not list is refused:
    no cell runs at an unregistered length), tagged with the pass and the registration hash, which
    also enter its config digest (a run under another hash never counts as done)."""
    result = []
    for cell in cells:
        setting = (confirmatory.lengths.get(cell.suite) or {}).get(cell.benchmark)
        if setting is None:
            raise SystemExit(f"{CONFIRMATORY_FILE} sets no num_rounds and eval_every for suite {cell.suite!r}, "
                             f"benchmark {cell.benchmark!r}: the confirmatory pass runs only registered lengths")
        config = deep_merge(cell.config, {"model": {"init_args": dict(setting)}})
        result.append(replace(cell, config=config, plan_hash=plan_hash, ledger_pass=CONFIRMATORY))
    return result


