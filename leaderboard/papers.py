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

from fl_lightning.run_schema import Metric

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


def _entry(raw: object, paper: str, file: Path, index: int) -> tuple[PaperNumber | None, str | None]:
    where = f"{file} entry {index}"
    if not isinstance(raw, dict):
        return None, f"{where}: expected a mapping with benchmark_setting, algorithm_config, metrics, source"
    metrics_raw = raw.get("metrics")
    if not isinstance(metrics_raw, dict) or not metrics_raw:
        return None, f"{where}: 'metrics' must be a non-empty mapping of metric name -> number"
    metrics: dict[str, float] = {}
    for name, value in metrics_raw.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None, f"{where}: metric {name!r} = {value!r} is not a number"
        name, value = canonical_metric(str(name), float(value))
        if name in FRACTION_METRICS and not 0.0 <= value <= 1.0:
            return None, (f"{where}: {name} = {value} is not a fraction in [0, 1] "
                          "(write 50.42% as 0.5042, or name the metric <name>_percent)")
        metrics[name] = value
    if not raw.get("algorithm_config"):
        return None, f"{where}: 'algorithm_config' is missing"
    matches = raw.get("matches_benchmark")
    return PaperNumber(
        paper=paper,
        setting=str(raw.get("benchmark_setting") or "(setting not described)"),
        matches_benchmark=str(matches) if matches else None,
        algorithm_config=str(raw["algorithm_config"]),
        metrics=metrics,
        source=str(raw.get("source") or paper),
        file=str(file),
        offline_counterpart=str(raw["offline_counterpart"]) if raw.get("offline_counterpart") else None,
        counterpart_config=str(raw["counterpart_config"]) if raw.get("counterpart_config") else None,
        caveat=" ".join(str(raw.get("caveat") or "").split()),
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
