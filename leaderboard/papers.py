"""The papers' reported numbers: ``benchmarks/<paper>/paper_numbers.yaml``.

Each file is a list of entries::

    - benchmark_setting: "CIFAR-10, 100 clients, 200 shards x 2, 10% sampled, FFN, 2000 rounds"
      matches_benchmark: null            # or the ``benchmark`` tag of our runs with this setting
      algorithm_config: "FedFV(alpha=0.1,tau=10)"
      metrics: {test_acc_mean: 0.5042, test_acc_std_percent: 9.70, test_acc_worst5: 0.3224}
      source: "FedFV Table 2"
      offline_counterpart: mnist5k/shards-200x2/p0.1/fl_mlp   # optional: our benchmark mirroring it
      counterpart_config: "FedFV(alpha=0.1,tau=10)"          # optional: our label, where it differs

``offline_counterpart`` names the (smaller) benchmark of ours that mirrors the paper's setting:
the index compares relative gains over FedAvg there, ours against the paper's, since absolute
numbers at another scale are not comparable. The gain of an entry is taken against the FedAvg
entry of the same paper table (``source``) and the same ``offline_counterpart`` (the setting strings
need not be identical). Accuracies are fractions in [0, 1], like the metrics we log. A metric name
ending in ``_percent`` (a std in percentage points) or ``_percent2`` (a variance in %²) is converted
to our unit and name: ``test_acc_std_percent: 13.74`` -> ``test_acc_std: 0.1374``,
``test_acc_var_percent2: 12.57`` -> ``test_acc_var: 0.001257``. FedFV's "Var." is a std in
percentage points (Table 3: 64.26 / 87.03 / 89.97 -> 11.49, printed 11.50), entered as
``test_acc_std_percent``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    StrictFloat,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from fl_lightning.records.errors import first_refusal
from fl_lightning.records.vocabulary import Metric

DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "benchmarks"
FILE_NAME = "paper_numbers.yaml"
# Metrics that are fractions of correctly classified examples (a value above 1 is a percentage).
FRACTION_METRICS = (
    Metric.TEST_ACC_MEAN,
    Metric.TEST_ACC_STD,
    Metric.TEST_ACC_MIN,
    Metric.TEST_ACC_MAX,
    Metric.TEST_ACC_WORST5,
    Metric.TEST_ACC_BEST5,
    Metric.TEST_ACC_WORST10,
    Metric.TEST_ACC_BEST10,
    Metric.GLOBAL_TEST_ACC,
)


@dataclass(frozen=True)
class PaperNumber:
    paper: str  # the folder under benchmarks/
    setting: str
    matches_benchmark: str | None
    algorithm_config: str
    metrics: dict[str, float]
    source: str
    file: str
    offline_counterpart: str | None = None  # our benchmark that mirrors this setting at another scale
    counterpart_config: str | None = None  # our configuration label for it, where it differs
    caveat: str = ""  # why the paper's number does not compare with ours (shown beside it)

    @property
    def our_config(self) -> str:
        return self.counterpart_config or self.algorithm_config


UNIT_SUFFIXES = (("_percent2", 1e-4), ("_percent", 1e-2))


def canonical_metric(name: str, value: float) -> tuple[str, float]:
    """Our metric name and unit for a reported number (``*_percent`` / ``*_percent2`` converted)."""
    for suffix, factor in UNIT_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)], value * factor
    return name, value


class PaperNumberEntry(BaseModel):
    """One entry of a ``paper_numbers.yaml``, as the file declares it (``extra="forbid"``: a
    misspelt key is refused, not ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    benchmark_setting: str | None = None
    matches_benchmark: str | None = None
    algorithm_config: str | None = None
    metrics: dict[str, StrictFloat | StrictInt | None] | None = None
    source: str | None = None
    offline_counterpart: str | None = None
    counterpart_config: str | None = None
    caveat: str | None = None

    @field_validator("metrics")
    @classmethod
    def _fractions(cls, metrics: dict[str, float | None] | None) -> dict[str, float | None] | None:
        for name, value in (metrics or {}).items():
            name, value = canonical_metric(str(name), float(value)) if value is not None else (name, None)
            if value is not None and name in FRACTION_METRICS and not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} = {value} is not a fraction in [0, 1] "
                                 "(write 50.42% as 0.5042, or name the metric <name>_percent)")
        return metrics

    @model_validator(mode="after")
    def _complete(self) -> PaperNumberEntry:
        if not self.metrics:
            raise ValueError("'metrics' must be a non-empty mapping of metric name -> number")
        if not self.algorithm_config:
            raise ValueError("'algorithm_config' is missing")
        return self


def _problem(error: ValidationError) -> str:
    """A pydantic refusal of one entry, in the file's words: the first problem, one line."""
    refusal = first_refusal(error, PaperNumberEntry)
    if refusal.kind == "model_type" or (refusal.kind == "missing" and not refusal.loc):
        return "expected a mapping with benchmark_setting, algorithm_config, metrics, source"
    if refusal.loc[:1] == ("metrics",) and len(refusal.loc) > 1 and not refusal.own_text:
        return f"metric {str(refusal.loc[1])!r} = {refusal.value!r} is not a number"
    return str(refusal)


def _entry(raw: object, paper: str, file: Path, index: int) -> tuple[PaperNumber | None, str | None]:
    where = f"{file} entry {index}"
    try:
        entry = PaperNumberEntry.model_validate(raw)
    except ValidationError as error:
        return None, f"{where}: {_problem(error)}"
    assert entry.metrics is not None and entry.algorithm_config  # checked by the model
    metrics = dict(canonical_metric(str(name), float(value)) for name, value in entry.metrics.items()
                   if value is not None)
    return PaperNumber(
        paper=paper,
        setting=entry.benchmark_setting or "(setting not described)",
        matches_benchmark=entry.matches_benchmark or None,
        algorithm_config=entry.algorithm_config,
        metrics=metrics,
        source=entry.source or paper,
        file=str(file),
        offline_counterpart=entry.offline_counterpart or None,
        counterpart_config=entry.counterpart_config or None,
        caveat=" ".join((entry.caveat or "").split()),
    ), None


def load_paper_numbers(root: Path = DEFAULT_ROOT) -> tuple[list[PaperNumber], list[str]]:
    """Every entry of every ``<root>/*/paper_numbers.yaml``, and warnings for entries skipped."""
    numbers: list[PaperNumber] = []
    warnings: list[str] = []
    for file in sorted(Path(root).glob(f"*/{FILE_NAME}")):
        try:
            loaded = yaml.safe_load(file.read_text())
        except (OSError, yaml.YAMLError) as error:
            warnings.append(f"{file}: not readable as YAML ({error}); skipped")
            continue
        if isinstance(loaded, dict) and isinstance(loaded.get("entries"), list):
            loaded = loaded["entries"]
        if loaded is None:
            continue
        if not isinstance(loaded, list):
            warnings.append(f"{file}: expected a list of entries; skipped")
            continue
        for index, raw in enumerate(loaded):
            entry, warning = _entry(raw, file.parent.name, file, index)
            if entry is not None:
                numbers.append(entry)
            if warning:
                warnings.append(warning + "; skipped")
    return numbers, warnings
