"""A suite YAML as typed dataclasses: ``SuiteSpec.parse`` checks the structure the runner relies on
and refuses what it does not know (a misspelt key would otherwise be ignored in silence), with a
message that names the entry and what to write instead.

The format (one file per suite, ``benchmarks/<paper>/<name>.yaml``)::

    suite: fedfv-offline              # the MLflow experiment
    paper: fedfv
    scale: offline                    # or paper
    description: ...                  # shown on the leaderboard
    seeds: [0, 1, 2]
    base: {trainer: ..., model: {init_args: ...}, data: ...}   # a LightningCLI config
    algorithms:                       # every benchmark's, unless it lists its own
      - class_path: fl_lightning.algorithms.FedFV
        init_args: {tau: 0}
        grid: {alpha: [0.1, 0.5]}     # one configuration per combination
        label_args: [tau]             # init_args shown in the label beside the grid's
        label: FedFV(alpha=2/3)       # or a label of its own
    benchmarks:
      - name: mnist5k/shards-200x2/p0.1/fl_mlp
        config: {...}                 # merged over base
        algorithms: [...]             # optional
        control: other/benchmark      # optional: the no-attack (or clean) counterpart

Top-level keys starting with ``x-`` hold YAML anchors and are ignored.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FORMAT_HINT = "see the format at the top of benchmarks/suite_schema.py"


class SuiteFormatError(ValueError):
    """A suite file that does not follow the format; the message says where and what to write."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"suite {where}: {problem}; {FORMAT_HINT}")


def _unknown_keys(raw: Mapping[str, Any], allowed: tuple[str, ...], where: str, what: str,
                  anchors: bool = False) -> None:
    for key in raw:
        if key in allowed or (anchors and isinstance(key, str) and key.startswith("x-")):
            continue
        close = difflib.get_close_matches(str(key), allowed, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f"; {what} takes {', '.join(allowed)}"
        raise SuiteFormatError(where, f"unknown key {key!r} in {what}{hint}")


def _mapping(value: Any, where: str, problem: str) -> dict[str, Any]:
    if not isinstance(value if value is not None else {}, dict):
        raise SuiteFormatError(where, problem)
    return dict(value or {})


def algorithm_label(class_path: str, params: Mapping[str, Any]) -> str:
    """``FedFV(alpha=0.1,tau=0)``: the class name and the shown parameters, sorted."""
    name = class_path.rsplit(".", 1)[-1]
    if not params:
        return name
    inner = ",".join(f"{k}={v}" for k, v in sorted(params.items()))
    return f"{name}({inner})"


@dataclass(frozen=True)
class AlgorithmEntry:
    class_path: str
    init_args: dict[str, Any]
    grid: dict[str, list[Any]]
    label: str | None = None
    label_args: tuple[str, ...] = ()

    KEYS = ("class_path", "init_args", "grid", "label", "label_args")

    @classmethod
    def parse(cls, raw: Any, number: int, where: str) -> AlgorithmEntry:
        if not isinstance(raw, dict) or not isinstance(raw.get("class_path"), str):
            raise SuiteFormatError(where, f"algorithm entry {number} must be a mapping with a 'class_path' "
                                          f"(e.g. class_path: fl_lightning.algorithms.FedAvg), got {raw!r}")
        path = raw["class_path"]
        _unknown_keys(raw, cls.KEYS, where, f"algorithm entry {path}")
        init_args = _mapping(raw.get("init_args"), where, f"{path}: 'init_args' must be a mapping, got {raw.get('init_args')!r}")
        grid = _mapping(raw.get("grid"), where, f"{path}: 'grid' must be a mapping, got {raw.get('grid')!r}")
        for name, values in grid.items():
            if not isinstance(values, list) or not values:
                raise SuiteFormatError(where, f"{path}: grid {name!r} must be a non-empty list of "
                                              f"values (e.g. {name}: [{values!r}]), got {values!r}")
        label_args = raw.get("label_args") or []
        if not isinstance(label_args, list) or not all(isinstance(k, str) for k in label_args):
            raise SuiteFormatError(where, f"{path}: 'label_args' must be a list of setting names, got {label_args!r}")
        known = {**init_args, **grid}
        missing = [k for k in label_args if k not in known]
        if missing:
            raise SuiteFormatError(where, f"{path}: label_args {missing} name no init_args or grid "
                                          f"entry; it has {sorted(known)}")
        label = raw.get("label")
        if label is not None and not isinstance(label, str):
            raise SuiteFormatError(where, f"{path}: 'label' must be a string, got {label!r}")
        return cls(path, init_args, grid, label, tuple(label_args))

    def configurations(self) -> list[tuple[str, dict[str, Any]]]:
        """[(label, model config)], one per combination of the grid (its cartesian product)."""
        keys = sorted(self.grid)
        configs = []
        for values in itertools.product(*(self.grid[k] for k in keys)) if keys else [()]:
            varied = dict(zip(keys, values, strict=True))
            init_args = {**self.init_args, **varied}
            shown = {**{k: init_args[k] for k in self.label_args}, **varied}
            label = self.label or algorithm_label(self.class_path, shown)
            configs.append((label, {"class_path": self.class_path, "init_args": init_args}))
        return configs


def _algorithms(raw: Any, where: str) -> tuple[AlgorithmEntry, ...]:
    if not isinstance(raw, list) or not raw:
        raise SuiteFormatError(where, f"'algorithms' must be a non-empty list of entries with a class_path, got {raw!r}")
    return tuple(AlgorithmEntry.parse(entry, number, where) for number, entry in enumerate(raw))


@dataclass(frozen=True)
class BenchmarkEntry:
    name: str
    config: dict[str, Any]
    algorithms: tuple[AlgorithmEntry, ...] | None = None
    control: str | None = None

    KEYS = ("name", "config", "algorithms", "control")

    @classmethod
    def parse(cls, raw: Any, number: int, where: str) -> BenchmarkEntry:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise SuiteFormatError(where, f"benchmark entry {number} must be a mapping with a 'name' "
                                          f"(e.g. name: mnist5k/iid/p0.1/fl_mlp), got {raw!r}")
        name = raw["name"]
        _unknown_keys(raw, cls.KEYS, where, f"benchmark {name!r}")
        config = _mapping(raw.get("config"), where, f"benchmark {name!r}: 'config' must be a mapping, got {raw.get('config')!r}")
        algorithms = None
        if raw.get("algorithms") is not None:
            algorithms = _algorithms(raw["algorithms"], f"{where}, benchmark {name!r}")
        control = raw.get("control")
        if control is not None and not isinstance(control, str):
            raise SuiteFormatError(where, f"benchmark {name!r}: 'control' must be a benchmark name, got {control!r}")
        return cls(name, config, algorithms, control)


@dataclass(frozen=True)
class SuiteSpec:
    suite: str
    paper: str
    scale: str
    base: dict[str, Any]
    benchmarks: tuple[BenchmarkEntry, ...]
    algorithms: tuple[AlgorithmEntry, ...] | None = None
    seeds: tuple[int, ...] = (0,)
    description: str = ""

    KEYS = ("suite", "paper", "scale", "description", "seeds", "base", "algorithms", "benchmarks")
    REQUIRED = ("suite", "paper", "scale", "base", "benchmarks")

    @classmethod
    def parse(cls, raw: Any, where: str) -> SuiteSpec:
        """The suite in ``raw`` (a loaded YAML document); ``where`` names it in messages."""
        if not isinstance(raw, dict):
            raise SuiteFormatError(where, f"the file must hold a mapping (suite:, paper:, scale:, base:, benchmarks:), "
                                          f"got {type(raw).__name__}")
        for key in cls.REQUIRED:
            if key not in raw:
                raise SuiteFormatError(where, f"it has no {key!r} entry")
        _unknown_keys(raw, cls.KEYS, where, "the suite", anchors=True)
        for key in ("suite", "paper", "scale"):
            if not isinstance(raw[key], str) or not raw[key]:
                raise SuiteFormatError(where, f"{key!r} must be a non-empty string, got {raw[key]!r}")
        if not isinstance(raw["base"], dict):
            raise SuiteFormatError(where, f"'base' must be a mapping (a LightningCLI config), got {raw['base']!r}")
        seeds = raw.get("seeds", [0])
        if not isinstance(seeds, list) or not seeds or not all(type(s) is int for s in seeds):
            raise SuiteFormatError(where, f"'seeds' must be a non-empty list of integers (e.g. seeds: [0, 1, 2]), got {seeds!r}")
        if not isinstance(raw["benchmarks"], list) or not raw["benchmarks"]:
            raise SuiteFormatError(where, f"'benchmarks' must be a non-empty list of entries with a name, got {raw['benchmarks']!r}")
        algorithms = _algorithms(raw["algorithms"], where) if raw.get("algorithms") is not None else None
        benchmarks = tuple(BenchmarkEntry.parse(entry, number, where) for number, entry in enumerate(raw["benchmarks"]))
        names = [b.name for b in benchmarks]
        for benchmark in benchmarks:
            if benchmark.algorithms is None and algorithms is None:
                raise SuiteFormatError(where, f"benchmark {benchmark.name!r} has no algorithms (suite-level or its own)")
            if benchmark.control is not None and benchmark.control not in names:
                raise SuiteFormatError(where, f"benchmark {benchmark.name!r}: control {benchmark.control!r} "
                                              f"is not a benchmark of the suite; it has {names}")
        description = " ".join(str(raw.get("description") or "").split())
        return cls(raw["suite"], raw["paper"], raw["scale"], dict(raw["base"]), benchmarks, algorithms,
                   tuple(seeds), description)

    def algorithms_of(self, benchmark: BenchmarkEntry) -> tuple[AlgorithmEntry, ...]:
        """The benchmark's own algorithms, else the suite's."""
        chosen = benchmark.algorithms if benchmark.algorithms is not None else self.algorithms
        assert chosen is not None  # parse refuses a benchmark with neither
        return chosen
