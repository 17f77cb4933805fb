"""Suites: a suite file (``benchmarks/<paper>/<name>.yaml``, read by :mod:`fl_lightning.records.suite_format`)
expanded into cells, one (benchmark, algorithm configuration) at one seed, each with its
LightningCLI config and the tags its run carries; and the checks a suite passes before any
cell runs or the store is touched (unknown algorithms, settings out of range, names that select
nothing)."""

from __future__ import annotations

import copy
import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from fl_lightning.records.suite_format import NOT_SUITES, AlgorithmEntry, SuiteFormatError, SuiteSpec
from fl_lightning.records.vocabulary import Tag

SUITES_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Cell:
    """One (benchmark, algorithm configuration) of a suite, at one seed."""

    suite: str
    paper: str
    scale: str
    benchmark: str
    algorithm_config: str
    seed: int
    config: dict
    description: str = ""
    control: str = ""
    plan_hash: str = ""  # a confirmatory run's registration hash (``benchmarks.confirmatory.confirmatory_cells``)
    ledger_pass: str = ""  # "confirmatory" for such a run; exploratory runs have none

    @property
    def cell(self) -> str:
        return f"{self.benchmark}|{self.algorithm_config}"

    @property
    def config_digest(self) -> str:
        """12 hex digits of the cell's config at this seed: a finished run with another digest
        ran an older version of the cell and does not count as done."""
        text = yaml.safe_dump(self.config, sort_keys=True)
        if self.plan_hash:  # a run under another registration never counts as done, nor is resumed
            text += f"{Tag.LEDGER_PASS}: {self.ledger_pass}\n{Tag.LEDGER_PLAN_HASH}: {self.plan_hash}\n"
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    @property
    def config_tag(self) -> str:
        """The digest as the run's ``cell_config`` tag: :func:`digest_tag`."""
        return digest_tag(self.config_digest)

    @property
    def tags(self) -> dict[str, str]:
        """The run's tags, set through the logger of the cell's config (so a fit in any launcher,
        a plain ``fl-lightning fit --config`` included, carries them)."""
        tags = {
            Tag.SUITE: self.suite, Tag.PAPER: self.paper, Tag.SCALE: self.scale, Tag.BENCHMARK: self.benchmark,
            Tag.CELL: self.cell, Tag.ALGORITHM_CONFIG: self.algorithm_config, Tag.SEED: str(self.seed),
            Tag.CELL_CONFIG: self.config_tag,
        }
        if self.description:
            tags[Tag.SUITE_DESCRIPTION] = self.description
        if self.control:
            tags[Tag.CONTROL] = self.control
        if self.plan_hash:
            tags[Tag.LEDGER_PASS] = self.ledger_pass
            tags[Tag.LEDGER_PLAN_HASH] = self.plan_hash
        return tags


def digest_tag(digest: str) -> str:
    """A config digest as a tag that reaches the store unchanged. The tags travel in the logger's
    config, which LightningCLI reads as YAML even when quoted: a digest that reads as a number
    (``5e8736190253``: a float that overflows to inf; ``123456789012``: an int) was stored as that
    number ("Inf"), so its run never counted as done and ran again on every resume. Such a digest
    gets the prefix ``cfg-``; every other one is the digest itself (the tags of stored runs)."""
    return f"cfg-{digest}" if re.fullmatch(r"[0-9]+|[0-9]+e[0-9]+", digest) else digest


def deep_merge(base: dict, override: dict) -> dict:
    """``override`` merged into a copy of ``base`` (nested dicts merged, the rest replaced)."""
    merged = copy.deepcopy(base)
    for key, value in (override or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def list_suites() -> list[str]:
    return sorted(f"{p.parent.name}/{p.stem}" for p in SUITES_DIR.glob("*/*.yaml")
                  if p.parent.name != "perf" and p.stem not in NOT_SUITES)


def suite_path(name: str) -> Path:
    """``fedfv/offline`` or a path to a suite file."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    candidate = SUITES_DIR / f"{name}.yaml"
    if not candidate.exists():
        raise SystemExit(f"unknown suite {name!r}; valid: {', '.join(list_suites())} (or a path to a suite YAML)")
    return candidate


def expand_algorithms(entries: list[dict]) -> list[tuple[str, dict]]:
    """[(label, model config)] with every grid expanded (cartesian product)."""
    return [config for number, entry in enumerate(entries)
            for config in AlgorithmEntry.parse(entry, number, "(algorithms)").configurations()]


def yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error in one line: where (line, column) and what."""
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return " ".join(f"{where}{problem}".split())


def load_suite(name: str, seeds: list[int] | None = None) -> list[Cell]:
    """The cells of suite ``name`` (``fedfv/offline`` or a path): one per benchmark,
    algorithm configuration and seed (``seeds`` replaces the suite's), each with its
    merged config; an unreadable or malformed suite exits with one line."""
    path = suite_path(name)
    try:
        spec = yaml.safe_load(path.read_text())
    except OSError as error:
        raise SystemExit(f"cannot read suite {name!r} ({path}): {error.strerror or error}; pass a readable "
                         f"suite YAML or one of the names `{program_name()} list` prints") from None
    except yaml.YAMLError as error:
        raise SystemExit(f"suite {name!r} ({path}) is not valid YAML: {yaml_problem(error)}") from None
    try:
        suite = SuiteSpec.parse(spec, repr(name))
    except SuiteFormatError as error:
        raise SystemExit(str(error)) from None
    if seeds is not None and (not seeds or not all(type(s) is int for s in seeds)):
        raise SystemExit(f"seeds must be a non-empty list of integers, got {seeds!r}")
    cells = []
    for benchmark in suite.benchmarks:
        bench_config = deep_merge(suite.base, benchmark.config)
        for entry in suite.algorithms_of(benchmark):
            for label, model in entry.configurations():
                for seed in seeds if seeds is not None else suite.seeds:
                    config = deep_merge(bench_config, {"model": model})
                    config = deep_merge(config, {"seed_everything": seed})  # model and data take it
                    cells.append(Cell(suite.suite, suite.paper, suite.scale, benchmark.name, label, seed,
                                      config, suite.description, benchmark.control or ""))
    return cells


def literal_text(text: str) -> str:
    """``text`` as LightningCLI keeps it: it reads a string given where any value may go as YAML,
    so "Sec. 5: 100 clients" would become a mapping and "a # b" lose its end. A no-break space
    after a colon or before a hash reads the same and is plain text to YAML."""
    return text.replace(": ", ":\u00a0").replace(" #", "\u00a0#")


def select_cells(cells: list[Cell], name: str, benchmarks: list[str] | None,
                 configs: list[str] | None) -> list[Cell]:
    """Only the cells of the named benchmarks and configurations (all where a list is None); an
    unknown name is refused with the names the suite has."""
    for wanted, known, what in ((benchmarks, {c.benchmark for c in cells}, "benchmark"),
                                (configs, {c.algorithm_config for c in cells}, "configuration")):
        unknown = sorted(set(wanted or ()) - known)
        if unknown:
            raise SystemExit(f"suite '{name}' has no {what} {', '.join(map(repr, unknown))}; "
                             f"its {what}s: {', '.join(sorted(known))}")
    return [c for c in cells if (benchmarks is None or c.benchmark in benchmarks)
            and (configs is None or c.algorithm_config in configs)]


def check_algorithms(cells: list[Cell], name: str) -> None:
    """Every algorithm configuration of the suite, before its first cell runs: its class path
    names a class (with a did-you-mean), every setting is one the class takes, and every value
    keeps its setting's rule (``core.settings``). One line (``SystemExit``) for the first problem."""
    import importlib

    from fl_lightning.algorithms import ALGORITHMS
    from fl_lightning.core.module import FederatedModule
    from fl_lightning.core.settings import check_setting, signature_types
    from fl_lightning.records.errors import did_you_mean

    seen: set[str] = set()
    for cell in cells:
        model = cell.config.get("model") or {}
        class_path, init_args = model.get("class_path", ""), model.get("init_args") or {}
        key = f"{class_path}|{sorted(init_args.items(), key=str)!r}"
        if key in seen:
            continue
        seen.add(key)
        where = f"suite '{name}', {cell.algorithm_config}"
        module_name, _, class_name = class_path.rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError, ValueError):
            hint = did_you_mean(class_name, list(ALGORITHMS), prefix="fl_lightning.algorithms.")
            raise SystemExit(f"{where}: no algorithm class {class_path!r}{hint}") from None
        if not (isinstance(cls, type) and issubclass(cls, FederatedModule)):
            raise SystemExit(f"{where}: {class_path!r} is not a federated algorithm (a FederatedModule subclass)")
        types = signature_types(cls)
        for setting, value in init_args.items():
            if setting not in types:
                raise SystemExit(
                    f"{where}: {class_name} takes no setting {setting!r}{did_you_mean(setting, list(types))}"
                )
            try:
                check_setting(setting, value, types[setting], strict=True)
            except ValueError as error:
                raise SystemExit(f"{where}: {error}") from None


def program_name() -> str:
    """How the runner was started, for its usage and error lines: the console script
    ``fl-benchmarks`` (``pip install`` puts it beside ``fl-lightning``), else ``python -m benchmarks``."""
    return "fl-benchmarks" if Path(sys.argv[0]).name == "fl-benchmarks" else "python -m benchmarks"
