"""A suite YAML as declared pydantic models: ``SuiteSpec.parse`` checks the structure the runner
relies on and refuses what it does not know (``extra="forbid"``: a misspelt key would otherwise be
ignored in silence), with one line that names the entry and what to write instead. Torch-free and
beside ``vocabulary``: the runner (``benchmarks``) and the leaderboard's claims both read suites
with it, and the leaderboard reaches no algorithm through it.

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

import itertools
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from fl_lightning.records.errors import did_you_mean, first_refusal

FORMAT_HINT = "see the format at the top of fl_lightning/records/suite_format.py"
NOT_SUITES = ("paper_numbers", "claims")  # the papers' numbers and claims sit beside the suites
ANCHOR_PREFIX = "x-"  # top-level keys that only hold YAML anchors


class SuiteFormatError(ValueError):
    """A suite file that does not follow the format; the message says where and what to write."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"suite {where}: {problem}; {FORMAT_HINT}")


def algorithm_label(class_path: str, params: Mapping[str, Any]) -> str:
    """``FedFV(alpha=0.1,tau=0)``: the class name and the shown parameters, sorted."""
    name = class_path.rsplit(".", 1)[-1]
    if not params:
        return name
    inner = ",".join(f"{k}={v}" for k, v in sorted(params.items()))
    return f"{name}({inner})"


def _problem(text: str) -> PydanticCustomError:
    """A check's own message, passed through as it is written."""
    return PydanticCustomError("suite_format", text)


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Setting = dict[StrictStr, Any]  # init_args, a config: names -> any YAML value


class AlgorithmEntry(_Entry):
    """One ``algorithms:`` entry: a class, its settings, a grid expanded into configurations."""

    class_path: StrictStr
    init_args: Setting = Field(default_factory=dict)
    grid: dict[StrictStr, Any] = Field(default_factory=dict)
    label: StrictStr | None = None
    label_args: tuple[StrictStr, ...] = ()

    @field_validator("init_args", "grid", "label_args", mode="before")
    @classmethod
    def _empty(cls, value: Any, info: Any) -> Any:
        """A key written without a value (``init_args:``) is an empty one."""
        if value is None:
            return () if info.field_name == "label_args" else {}
        return value

    @field_validator("grid")
    @classmethod
    def _grid_lists(cls, grid: dict[str, Any]) -> dict[str, Any]:
        for name, values in grid.items():
            if values is None or values == []:  # no value: no configuration, the algorithm would vanish
                raise _problem(f"grid {name!r} is empty, so it gives no configuration and the algorithm would "
                               f"vanish from the suite; list at least one value (e.g. {name}: [0.1]) or remove "
                               f"{name!r} from the grid")
            if not isinstance(values, list):
                raise _problem(f"grid {name!r} must be a non-empty list of values (e.g. {name}: [{values!r}]), "
                               f"got {values!r}")
        return grid

    @model_validator(mode="after")
    def _label_args_named(self) -> AlgorithmEntry:
        known = {**self.init_args, **self.grid}
        missing = [k for k in self.label_args if k not in known]
        if missing:
            raise _problem(f"label_args {missing} name no init_args or grid entry; it has {sorted(known)}")
        return self

    @classmethod
    def parse(cls, raw: Any, number: int, where: str) -> AlgorithmEntry:
        """One entry on its own (``benchmarks.suites.expand_algorithms``)."""
        try:
            return cls.model_validate(raw)
        except ValidationError as error:
            raise SuiteFormatError(where, _said(error, raw, cls, ("algorithms", number), raw_root=False)) from None

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


Algorithms = Annotated[tuple[AlgorithmEntry, ...], Field(min_length=1)]


class BenchmarkEntry(_Entry):
    """One ``benchmarks:`` entry: a name, its config over ``base``, its own algorithms, its control."""

    name: StrictStr
    config: Setting = Field(default_factory=dict)
    algorithms: Algorithms | None = None
    control: StrictStr | None = None

    @field_validator("config", mode="before")
    @classmethod
    def _empty(cls, value: Any) -> Any:
        return {} if value is None else value


class SuiteSpec(_Entry):
    """A whole suite file."""

    suite: Annotated[StrictStr, Field(min_length=1)]
    paper: Annotated[StrictStr, Field(min_length=1)]
    scale: Annotated[StrictStr, Field(min_length=1)]
    base: Setting
    benchmarks: Annotated[tuple[BenchmarkEntry, ...], Field(min_length=1)]
    algorithms: Algorithms | None = None
    seeds: Annotated[tuple[StrictInt, ...], Field(min_length=1)] = (0,)
    description: str = ""

    @model_validator(mode="before")
    @classmethod
    def _without_anchors(cls, raw: Any) -> Any:
        if isinstance(raw, dict):
            return {k: v for k, v in raw.items() if not (isinstance(k, str) and k.startswith(ANCHOR_PREFIX))}
        return raw

    @field_validator("description", mode="before")
    @classmethod
    def _one_line(cls, value: Any) -> str:
        return " ".join(str(value or "").split())

    @model_validator(mode="after")
    def _benchmarks_complete(self) -> SuiteSpec:
        names = [b.name for b in self.benchmarks]
        for benchmark in self.benchmarks:
            if benchmark.algorithms is None and self.algorithms is None:
                raise _problem(f"benchmark {benchmark.name!r} has no algorithms (suite-level or its own)")
            if benchmark.control is not None and benchmark.control not in names:
                raise _problem(f"benchmark {benchmark.name!r}: control {benchmark.control!r} is not a benchmark "
                               f"of the suite; it has {names}")
        return self

    @classmethod
    def parse(cls, raw: Any, where: str) -> SuiteSpec:
        """The suite in ``raw`` (a loaded YAML document); ``where`` names it in messages."""
        try:
            return cls.model_validate(raw)
        except ValidationError as error:
            raise SuiteFormatError(where, _said(error, raw, cls)) from None

    def algorithms_of(self, benchmark: BenchmarkEntry) -> tuple[AlgorithmEntry, ...]:
        """The benchmark's own algorithms, else the suite's."""
        chosen = benchmark.algorithms if benchmark.algorithms is not None else self.algorithms
        assert chosen is not None  # parse refuses a benchmark with neither
        return chosen


# ------------------------------------------------------------------ pydantic's errors in our words

EXAMPLES = {"algorithms": "entries with a class_path", "benchmarks": "entries with a name",
            "seeds": "integers (e.g. seeds: [0, 1, 2])"}
REQUIRED_AS = {"class_path": "algorithm entry {n} must be a mapping with a 'class_path' (e.g. class_path: "
                             "fl_lightning.algorithms.FedAvg), got {raw!r}",
               "name": "benchmark entry {n} must be a mapping with a 'name' (e.g. name: mnist5k/iid/p0.1/fl_mlp), "
                       "got {raw!r}"}


def _at(raw: Any, loc: tuple[Any, ...]) -> Any:
    """The part of the document at ``loc`` (None where it is not there)."""
    for key in loc:
        try:
            raw = raw[key]
        except (KeyError, IndexError, TypeError):
            return None
    return raw


def _entry_name(loc: tuple[Any, ...], raw: Any) -> tuple[str, int]:
    """How the innermost entry on ``loc`` is named in a message ("the suite", "benchmark 'b'",
    "algorithm entry FedProx"), and how many parts of ``loc`` it spans."""
    for end in range(len(loc), 0, -1):
        if isinstance(loc[end - 1], int) and loc[end - 2:end - 1] in (("algorithms",), ("benchmarks",)):
            entry = _at(raw, loc[:end])
            if loc[end - 2] == "algorithms":
                path = entry.get("class_path") if isinstance(entry, dict) else None
                return (f"algorithm entry {path}" if isinstance(path, str) else f"algorithm entry {loc[end - 1]}"), end
            name = entry.get("name") if isinstance(entry, dict) else None
            return (f"benchmark {name!r}" if isinstance(name, str) else f"benchmark entry {loc[end - 1]}"), end
    return "the suite", 0


def _said(error: ValidationError, raw: Any, model: type[BaseModel], prefix: tuple[Any, ...] = (),
          raw_root: bool = True) -> str:
    """The first of pydantic's errors (``model`` refused ``raw``) as one line in the suite format's
    words. ``prefix``: where ``raw`` sits in a suite (an entry checked on its own)."""
    first = first_refusal(error, model)
    loc = prefix + first.loc
    document = raw if raw_root else _place(raw, prefix)
    kind = first.kind
    entry, end = _entry_name(loc, document)
    field, rest = (loc[end] if end < len(loc) else None), loc[end + 1:]
    if kind == "model_type" and end == 0 and not loc:
        return (f"the file must hold a mapping (suite:, paper:, scale:, base:, benchmarks:), "
                f"got {type(raw).__name__}")
    if kind in ("model_type", "missing") and field in (None, *REQUIRED_AS) and end and not rest:
        required = "class_path" if entry.startswith("algorithm") else "name"
        return REQUIRED_AS[required].format(n=loc[end - 1], raw=_at(document, loc[:end]))
    if kind == "missing":
        return f"it has no {field!r} entry" if end == 0 else f"{entry}: it has no {field!r} entry"
    if kind == "extra_forbidden":
        hint = did_you_mean(field, first.known) or f"; {entry} takes {', '.join(first.known)}"
        return f"unknown key {field!r} in {entry}{hint}"
    if first.own_text:
        return first.message if end == 0 else f"{_class_path(entry)}: {first.message}"
    if field in EXAMPLES and end == 0:  # a list of the suite, or one of its items, is wrong: the list is shown
        return f"{field!r} must be a non-empty list of {EXAMPLES[field]}, got {_at(document, (field,))!r}"
    what = field if not rest else f"{field} {'.'.join(map(str, rest))}"
    expected = {"too_short": "a non-empty list of values", "tuple_type": "a list",
                "dict_type": "a mapping" + (" (a LightningCLI config)" if field == "base" else ""),
                "string_type": "a string", "int_type": "an integer"}
    need = expected.get(kind) or first.message.lower()
    if kind == "string_too_short":
        need = "a non-empty string"
    place = "" if end == 0 else f"{_class_path(entry)}: "
    return f"{place}{what!r} must be {need}, got {_at(document, loc)!r}"


def _class_path(entry: str) -> str:
    """An algorithm entry by its class path alone, as its messages begin; other entries as named."""
    name = entry.removeprefix("algorithm entry ")
    return entry if name.isdigit() else name  # an entry without a class path keeps its number


def _place(entry: Any, prefix: tuple[Any, ...]) -> Any:
    """A document holding ``entry`` at ``prefix`` (to name an entry checked on its own)."""
    document: Any = entry
    for key in reversed(prefix):
        document = [None] * key + [document] if isinstance(key, int) else {key: document}
    return document
