"""The claims ledger: every claim of the four papers, tested on our runs, paired by seed.

``benchmarks/<paper>/claims.yaml`` lists a paper's claims. Each claim names a quantity (mean client
accuracy, spread, worst 5 %, angle, rho, conflicts, server time, ...), a direction (``greater``,
``less``, or ``equal`` within a ``margin``), and comparisons ``treatment`` vs ``baseline`` (or vs a
``threshold``) on an offline benchmark. Configurations of one seed share that seed's partition and
initialisation, so a comparison is a paired one: the per-seed differences treatment - baseline,
their mean with a confidence interval, Holm-corrected within the claim (``leaderboard.stats.decide``).

A run's value is taken at its convergence point where the quantity has a history: the mean of its
last ``CONVERGENCE_WINDOW`` evaluations; a run whose mean accuracy still rose by more than
``STILL_IMPROVING_PP`` over its last evaluations is counted as unconverged. A benchmark where every
configuration ends at one accuracy with no spread over seeds (a constant predictor) is withdrawn.
Each claim may list ablations: the same comparisons on benchmarks that move the offline setup one
factor toward the paper's; their verdicts are the claim's reason when it does not hold offline.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from leaderboard.papers import DEFAULT_ROOT
from leaderboard.runs import (
    LeaderboardError,
    RunRecord,
    converged,
    still_improving,
)
from leaderboard.stats import (
    CONTRADICTED,
    INCONCLUSIVE,
    REPRODUCED,
    TOO_FEW,
    PairedResult,
    decide,
    holm_adjust,
    paired_differences,
)
from leaderboard.tables import BenchmarkTable, headline_value, pick_used_runs

FILE_NAME = "claims.yaml"
SIGNIFICANCE = 0.05
DIRECTIONS = ("greater", "less", "equal")
# Claim verdicts beyond the per-comparison ones of leaderboard.stats
NOT_TESTED, NO_RUNS, WITHDRAWN = "not tested", "no runs", "withdrawn"


class ClaimsError(LeaderboardError):
    """A claims file that cannot be read: says which file, which claim and what is wrong."""


# ---------------------------------------------------------------------------------------------
# Quantities: a run -> one number, in the unit the papers print
# ---------------------------------------------------------------------------------------------


def _headline(run: RunRecord) -> float | None:
    value, derived = headline_value(run)
    if value is None:
        return None
    return converged(run, "global_test_acc" if derived else "test_acc_mean")


def _times_1000(value: float | None) -> float | None:
    return None if value is None else 1000 * value


@dataclass(frozen=True)
class Quantity:
    label: str
    unit: str  # of the displayed value and of paper numbers and margins in claims.yaml
    scale: float  # displayed value = scale * value
    value: Callable[[RunRecord], float | None]
    decimals: int = 2


QUANTITIES: dict[str, Quantity] = {
    "mean": Quantity("mean client accuracy", "%", 100, _headline),
    "global": Quantity("global accuracy", "%", 100, lambda run: converged(run, "global_test_acc")),
    "std": Quantity("std of client accuracies", "pp", 100, lambda run: converged(run, "test_acc_std")),
    "worst5": Quantity("worst 5 % of clients", "%", 100, lambda run: converged(run, "test_acc_worst5")),
    "worst10": Quantity("worst 10 % of clients", "%", 100, lambda run: converged(run, "test_acc_worst10")),
    "best5": Quantity("best 5 % of clients", "%", 100, lambda run: converged(run, "test_acc_best5")),
    "worst_client": Quantity("worst client", "%", 100, lambda run: converged(run, "test_acc_min")),
    "angle": Quantity("fairness angle", "rad", 1, lambda run: converged(run, "test_acc_angle"), 3),
    "rho": Quantity("CGSV rho", "", 1, lambda run: run.final("cgsv_rho")),
    "conflicts": Quantity("conflicting clients per round (model level)", "clients", 1,
                          lambda run: run.mean_over_rounds("conflicts_model")),
    "server_time": Quantity("server time per round", "ms", 1,
                            lambda run: _times_1000(run.mean_over_rounds("server_time_s")), 1),
    "improved": Quantity("participants whose loss did not increase", "%", 100,
                         lambda run: run.mean_over_rounds("improved_fraction")),
    # per-agent series (CGSV Fig. 2 and Sec. 3.3): "agent_r:3" = agent 3's final reputation r
    "agent_r": Quantity("reputation r", "", 1, lambda run: None, 4),
    "agent_distance": Quantity("distance to the server model", "", 1, lambda run: None, 3),
    "agent_psi": Quantity("contribution psi, mean over rounds", "", 1, lambda run: None, 3),
    "agent_sparsity": Quantity("download sparsity, mean over rounds", "%", 100, lambda run: None, 1),
}


def _one_minus_mean(run: RunRecord, name: str) -> float | None:
    value = run.mean_over_rounds(name)
    return None if value is None else 1.0 - value


# per-agent quantity -> (the logged series ``<metric>/<agent>``, how a run's series becomes one number).
# CGSV Sec. 3.3 reports psi and the sparsity 1 - q_i/D averaged over the iterations.
AGENT_METRICS: dict[str, tuple[str, Callable[[RunRecord, str], float | None]]] = {
    "agent_r": ("cgsv_r", RunRecord.final),
    "agent_distance": ("cgsv_distance", RunRecord.final),
    "agent_psi": ("cgsv_psi", RunRecord.mean_over_rounds),
    "agent_sparsity": ("cgsv_density", _one_minus_mean),
}


def quantity_of(name: str) -> Quantity:
    base = name.split(":", 1)[0]
    if base not in QUANTITIES:
        raise KeyError(name)
    return QUANTITIES[base]


def quantity_value(run: RunRecord, name: str) -> float | None:
    """The run's value of a quantity, in the displayed unit."""
    base, _, agent = name.partition(":")
    quantity = QUANTITIES[base]
    if base in AGENT_METRICS:
        metric, reduce = AGENT_METRICS[base]
        value = reduce(run, f"{metric}/{agent}")
    else:
        value = quantity.value(run)
    return None if value is None or math.isnan(value) else quantity.scale * value


# ---------------------------------------------------------------------------------------------
# The ledger as written in claims.yaml
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    config: str
    benchmark: str
    quantity: str


@dataclass(frozen=True)
class Comparison:
    treatment: Side
    baseline: Side | None  # None: against a fixed threshold
    threshold: float | None
    direction: str
    margin: float
    paper: tuple[float, ...] = ()  # the paper's treatment (and baseline) values, displayed unit

    @property
    def label(self) -> str:
        against = (f"{self.threshold:g}" if self.baseline is None else self.baseline.config)
        text = f"{self.treatment.config} − {against}"
        if self.baseline is not None and self.baseline.quantity != self.treatment.quantity:
            text = f"{self.treatment.config} {_agent(self.treatment.quantity)} − {_agent(self.baseline.quantity)}"
        if self.baseline is not None and self.baseline.benchmark != self.treatment.benchmark:
            text += f" ({self.treatment.benchmark.rsplit('/', 1)[-1]} vs {self.baseline.benchmark.rsplit('/', 1)[-1]})"
        return text

    @property
    def paper_difference(self) -> float | None:
        if len(self.paper) == 2:
            return self.paper[0] - self.paper[1]
        if len(self.paper) == 1 and self.threshold is not None:
            return self.paper[0] - self.threshold
        return None


def _agent(quantity: str) -> str:
    base, _, agent = quantity.partition(":")
    return f"agent {agent}" if agent else base


@dataclass(frozen=True)
class Location:
    suite: str
    benchmark: str


@dataclass(frozen=True)
class Ablation:
    location: Location
    factor: str
    comparisons: tuple[Comparison, ...]


@dataclass(frozen=True)
class Claim:
    id: str
    paper: str
    citation: str
    name: str  # short: "FedFV (Wang et al., IJCAI 2021)"
    where: str
    text: str
    quantity: str
    direction: str
    margin: float
    offline: Location | None
    paper_scale: Location | None
    comparisons: tuple[Comparison, ...]
    ablations: tuple[Ablation, ...] = ()
    not_tested: str = ""
    reason: str = ""
    file: str = ""


def _location(raw: object, where: str) -> Location | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not raw.get("suite") or not raw.get("benchmark"):
        raise ClaimsError(f"{where}: expected {{suite: ..., benchmark: ...}}, got {raw!r}")
    return Location(str(raw["suite"]), str(raw["benchmark"]))


def _side(raw: object, benchmark: str, quantity: str, where: str) -> Side:
    if isinstance(raw, str):
        _check_quantity(quantity, where)
        return Side(raw, benchmark, quantity)
    if isinstance(raw, Mapping) and raw.get("config"):
        side = Side(str(raw["config"]), str(raw.get("benchmark") or benchmark), str(raw.get("quantity") or quantity))
        _check_quantity(side.quantity, where)
        return side
    raise ClaimsError(f"{where}: a side is a configuration label or {{config, benchmark, quantity}}, got {raw!r}")


def _check_quantity(name: str, where: str) -> None:
    try:
        quantity_of(name)
    except KeyError:
        raise ClaimsError(f"{where}: unknown quantity {name!r}; known: {', '.join(QUANTITIES)} "
                          "(the agent_* quantities take ':<agent>')") from None
    if name.split(":")[0] in AGENT_METRICS and ":" not in name:
        raise ClaimsError(f"{where}: quantity {name!r} needs an agent, e.g. {name}:0")


def _comparisons(raw: object, benchmark: str | None, quantity: str, direction: str, margin: float,
                 where: str) -> tuple[Comparison, ...]:
    if not isinstance(raw, list):
        raise ClaimsError(f"{where}: `comparisons` must be a list")
    result = []
    for index, entry in enumerate(raw, start=1):
        here = f"{where}, comparison {index}"
        if not isinstance(entry, Mapping) or "treatment" not in entry:
            raise ClaimsError(f"{here}: needs a `treatment` (and a `baseline` or a `threshold`)")
        bench = str(entry.get("benchmark") or benchmark or "")
        if not bench:
            raise ClaimsError(f"{here}: no benchmark (give the claim an `offline` location or the comparison a `benchmark`)")
        if ("baseline" in entry) == ("threshold" in entry):
            raise ClaimsError(f"{here}: give exactly one of `baseline` and `threshold`")
        entry_direction = str(entry.get("direction") or direction)
        entry_margin = float(entry.get("margin", margin) or 0.0)
        _check_direction(entry_direction, entry_margin, here)
        paper = entry.get("paper") or ()
        if not isinstance(paper, list | tuple) or not all(isinstance(v, int | float) for v in paper):
            raise ClaimsError(f"{here}: `paper` is a list of the paper's numbers, got {paper!r}")
        result.append(Comparison(
            treatment=_side(entry["treatment"], bench, quantity, here),
            baseline=_side(entry["baseline"], bench, quantity, here) if "baseline" in entry else None,
            threshold=float(entry["threshold"]) if "threshold" in entry else None,
            direction=entry_direction, margin=entry_margin, paper=tuple(float(v) for v in paper),
        ))
    return tuple(result)


def _check_direction(direction: str, margin: float, where: str) -> None:
    if direction not in DIRECTIONS:
        raise ClaimsError(f"{where}: direction {direction!r} is not one of {', '.join(DIRECTIONS)}")
    if direction == "equal" and not margin > 0:
        raise ClaimsError(f"{where}: an `equal` claim needs a positive `margin` (in the quantity's unit)")


def _on_benchmark(comparison: Comparison, benchmark: str) -> Comparison:
    def move(side: Side | None) -> Side | None:
        return None if side is None else Side(side.config, benchmark, side.quantity)
    return Comparison(move(comparison.treatment), move(comparison.baseline), comparison.threshold,  # type: ignore[arg-type]
                      comparison.direction, comparison.margin, comparison.paper)


def parse_claims(spec: object, paper: str, file: str = "") -> list[Claim]:
    """The claims of one ``claims.yaml`` (already parsed); ClaimsError names what is wrong."""
    if not isinstance(spec, Mapping) or not isinstance(spec.get("claims"), list):
        raise ClaimsError(f"{file}: expected a mapping with `paper`, `citation` and a list `claims`")
    citation = str(spec.get("citation") or paper)
    name = str(spec.get("name") or citation)
    claims, seen = [], set()
    for index, raw in enumerate(spec["claims"], start=1):
        where = f"{file}: claim {index}"
        if not isinstance(raw, Mapping):
            raise ClaimsError(f"{where}: expected a mapping")
        missing = [key for key in ("id", "where", "claim", "quantity", "direction") if not raw.get(key)]
        if missing:
            raise ClaimsError(f"{where}: missing {', '.join(missing)}")
        claim_id = str(raw["id"])
        where = f"{file}: claim {claim_id}"
        if claim_id in seen:
            raise ClaimsError(f"{where}: the id is used twice")
        seen.add(claim_id)
        quantity, direction = str(raw["quantity"]), str(raw["direction"])
        margin = float(raw.get("margin") or 0.0)
        _check_direction(direction, margin, where)
        if quantity.split(":", 1)[0] not in QUANTITIES:  # a claim-level agent quantity may leave the agent to its sides
            _check_quantity(quantity, where)
        offline = _location(raw.get("offline"), f"{where}, offline")
        comparisons = _comparisons(raw.get("comparisons") or [], offline.benchmark if offline else None,
                                   quantity, direction, margin, where)
        not_tested = str(raw.get("not_tested") or "")
        if not not_tested and (offline is None or not comparisons):
            raise ClaimsError(f"{where}: needs an `offline` location and comparisons, or `not_tested` with the reason")
        ablations = []
        for number, entry in enumerate(raw.get("ablations") or [], start=1):
            here = f"{where}, ablation {number}"
            location = _location(entry, here)
            assert location is not None
            if not entry.get("factor"):
                raise ClaimsError(f"{here}: say which factor it changes (`factor`)")
            own = entry.get("comparisons")
            ablation_comparisons = (
                _comparisons(own, location.benchmark, quantity, direction, margin, here) if own is not None
                else tuple(_on_benchmark(c, location.benchmark) for c in comparisons))
            ablations.append(Ablation(location, str(entry["factor"]), ablation_comparisons))
        claims.append(Claim(
            id=claim_id, paper=paper, citation=citation, name=name, where=str(raw["where"]), text=str(raw["claim"]),
            quantity=quantity, direction=direction, margin=margin, offline=offline,
            paper_scale=_location(raw.get("paper_scale"), f"{where}, paper_scale"), comparisons=comparisons,
            ablations=tuple(ablations), not_tested=not_tested, reason=str(raw.get("reason") or ""), file=file,
        ))
    return claims


def load_claims(root: Path = DEFAULT_ROOT) -> list[Claim]:
    """Every ``<root>/<paper>/claims.yaml``, in paper order; ClaimsError on a malformed file."""
    claims: list[Claim] = []
    for path in sorted(Path(root).glob(f"*/{FILE_NAME}")):
        try:
            spec = yaml.safe_load(path.read_text())
        except yaml.YAMLError as error:
            raise ClaimsError(f"{path}: not valid YAML ({error})") from None
        claims.extend(parse_claims(spec, path.parent.name, f"{path.parent.name}/{FILE_NAME}"))
    return claims


@dataclass(frozen=True)
class SuiteFile:
    name: str  # the suite's name (its MLflow experiment)
    path: str  # the argument of `fl-benchmarks run`, e.g. fedlf/offline
    benchmarks: tuple[str, ...]


def suite_files(root: Path = DEFAULT_ROOT) -> dict[str, SuiteFile]:
    """The suites defined under ``root`` (``<paper>/<name>.yaml`` with a ``suite`` key), by suite name."""
    suites = {}
    for path in sorted(Path(root).glob("*/*.yaml")):
        try:
            spec = yaml.safe_load(path.read_text())
        except yaml.YAMLError:
            continue
        if isinstance(spec, Mapping) and spec.get("suite") and isinstance(spec.get("benchmarks"), list):
            names = tuple(str(b.get("name")) for b in spec["benchmarks"] if isinstance(b, Mapping))
            suites[str(spec["suite"])] = SuiteFile(str(spec["suite"]), f"{path.parent.name}/{path.stem}", names)
    return suites


def claim_problems(claims: Iterable[Claim], suites: Mapping[str, SuiteFile]) -> list[str]:
    """Every suite and benchmark a claim names that no suite file defines (empty when all exist)."""
    problems = []

    def check(suite_name: str, benchmark: str, what: str, claim: Claim) -> None:
        suite = suites.get(suite_name)
        if suite is None:
            problems.append(f"{claim.id}: {what} suite {suite_name!r} is not defined under benchmarks/")
        elif benchmark not in suite.benchmarks:
            problems.append(f"{claim.id}: {what} benchmark {benchmark!r} is not in suite {suite_name}")

    for claim in claims:
        for location, what in ((claim.offline, "offline"), (claim.paper_scale, "paper-scale")):
            if location is not None:
                check(location.suite, location.benchmark, what, claim)
        families = [(claim.offline.suite if claim.offline else "", claim.comparisons, "comparison")]
        families += [(a.location.suite, a.comparisons, f"ablation '{a.factor}'") for a in claim.ablations]
        for suite_name, comparisons, what in families:
            for comparison in comparisons:
                for side in (comparison.treatment, comparison.baseline):
                    if side is not None:
                        check(suite_name, side.benchmark, what, claim)
    return sorted(set(problems))


# ---------------------------------------------------------------------------------------------
# Verdicts from the runs
# ---------------------------------------------------------------------------------------------


@dataclass
class ComparisonResult:
    comparison: Comparison
    suite: str
    result: PairedResult | None  # None: no paired seeds at all
    treatment_values: dict[str, float]
    baseline_values: dict[str, float]
    unconverged: int = 0  # runs in the comparison still improving at their end
    withdrawn: str = ""  # why the benchmark cannot rank (a constant predictor)

    @property
    def verdict(self) -> str:
        if self.withdrawn:
            return WITHDRAWN
        if self.result is None:
            return NO_RUNS
        return self.result.verdict


@dataclass
class AblationResult:
    ablation: Ablation
    comparisons: list[ComparisonResult]

    @property
    def verdict(self) -> str:
        return combine([c.verdict for c in self.comparisons])


@dataclass
class ClaimResult:
    claim: Claim
    comparisons: list[ComparisonResult] = field(default_factory=list)
    ablations: list[AblationResult] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        if self.claim.not_tested:
            return NOT_TESTED
        return combine([c.verdict for c in self.comparisons])

    @property
    def seeds(self) -> int:
        counts = [c.result.n for c in self.comparisons if c.result is not None]
        return min(counts) if counts else 0

    @property
    def reason(self) -> str:
        """What the ablations showed (and the ledger's own note), for a claim that does not hold offline."""
        parts = [self.claim.reason] if self.claim.reason else []
        if self.verdict in (REPRODUCED, NOT_TESTED):
            return " ".join(parts)
        changed = [a for a in self.ablations if a.verdict != self.verdict and a.verdict not in (NO_RUNS, TOO_FEW)]
        if self.ablations and not changed and all(a.verdict not in (NO_RUNS, TOO_FEW) for a in self.ablations):
            parts.append("None of the factors tried changes the verdict.")
        elif changed:
            parts.append("Changes the verdict: " + "; ".join(
                f"{a.ablation.factor} ({self.verdict} → {a.verdict})" for a in changed) + ".")
        elif not self.ablations:
            parts.append("No ablation run yet.")
        return " ".join(parts)


def combine(verdicts: list[str]) -> str:
    """A claim holds when every comparison reproduces it; one contradicted comparison contradicts it."""
    if not verdicts:
        return NO_RUNS
    for special in (WITHDRAWN, NO_RUNS, TOO_FEW):
        if special in verdicts:
            return special
    if all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    if CONTRADICTED in verdicts:
        return CONTRADICTED
    return INCONCLUSIVE


RunIndex = dict[tuple[str, str, str], dict[str, RunRecord]]  # (suite, benchmark, config) -> seed -> run


def index_runs(runs: Iterable[RunRecord]) -> RunIndex:
    """The newest FINISHED run per (suite, benchmark, configuration, seed)."""
    groups: dict[tuple[str, str, str], list[RunRecord]] = {}
    for run in runs:
        groups.setdefault((run.suite, run.benchmark, run.config), []).append(run)
    return {key: {run.seed: run for run in pick_used_runs(group)[0]} for key, group in groups.items()}


def constant_predictor(index: RunIndex, suite: str, benchmark: str) -> str:
    """Why a benchmark cannot rank anything: every configuration at the same accuracy with no spread
    over seeds (e.g. every model predicts the most frequent class); "" otherwise."""
    values = [quantity_value(run, "mean") for (s, b, _), seeds in index.items() if (s, b) == (suite, benchmark)
              for run in seeds.values()]
    present = [v for v in values if v is not None]
    if len(present) >= 4 and max(present) - min(present) < 1e-6:
        return f"every run of every configuration ends at {present[0]:.2f} %: a constant predictor"
    return ""


def _values(index: RunIndex, suite: str, side: Side) -> tuple[dict[str, float], dict[str, RunRecord]]:
    runs = index.get((suite, side.benchmark, side.config), {})
    values = {seed: v for seed, run in runs.items() if (v := quantity_value(run, side.quantity)) is not None}
    return values, runs


def evaluate_family(comparisons: Iterable[Comparison], suite: str, index: RunIndex,
                    alpha: float = SIGNIFICANCE) -> list[ComparisonResult]:
    """One claim's comparisons on one suite, Holm-corrected as a family (Holm 1979): the comparison
    with the k-th smallest p (0-based) is judged at alpha / (m - k), and none after the first that
    is not rejected. The step-down is done here rather than by ``decide`` over the whole family
    because a claim's comparisons may differ in direction and margin (e.g. FedMGDA+ unchanged by an
    attack while q-FedAvg falls), and ``decide`` takes one direction per family."""
    results: list[ComparisonResult] = []
    withdrawn_by_benchmark: dict[str, str] = {}
    for comparison in comparisons:
        treatment, treatment_runs = _values(index, suite, comparison.treatment)
        if comparison.baseline is not None:
            baseline, baseline_runs = _values(index, suite, comparison.baseline)
        else:
            baseline = {seed: float(comparison.threshold) for seed in treatment}  # type: ignore[arg-type]
            baseline_runs = {}
        differences = paired_differences(treatment, baseline)
        single = decide([differences], comparison.direction, comparison.margin, alpha)[0] if differences else None
        used = [run for seed, run in {**treatment_runs, **baseline_runs}.items() if seed in treatment]
        benchmark = comparison.treatment.benchmark
        if benchmark not in withdrawn_by_benchmark:  # one scan of the benchmark's runs per family
            withdrawn_by_benchmark[benchmark] = constant_predictor(index, suite, benchmark)
        withdrawn = withdrawn_by_benchmark[benchmark]
        results.append(ComparisonResult(comparison, suite, single, treatment, baseline,
                                        sum(1 for run in used if still_improving(run)), withdrawn))
    tested = [r for r in results if r.result is not None and r.result.verdict != TOO_FEW and r.result.p is not None]
    if len(tested) > 1:
        adjusted = holm_adjust([r.result.p for r in tested])  # type: ignore[union-attr, misc]
        order = sorted(range(len(tested)), key=lambda k: tested[k].result.p)  # type: ignore[union-attr, return-value, arg-type]
        stopped = False
        for rank, k in enumerate(order):
            entry = tested[k]
            comparison = entry.comparison
            differences = paired_differences(entry.treatment_values, entry.baseline_values)
            step = decide([differences], comparison.direction, comparison.margin, alpha / (len(tested) - rank))[0]
            verdict = INCONCLUSIVE if stopped else step.verdict
            stopped = stopped or step.verdict == INCONCLUSIVE
            entry.result = PairedResult(step.n, step.mean, step.sd, step.low, step.high, step.level, step.p,
                                        adjusted[k], verdict, step.mde)
    return results


def evaluate(claims: Iterable[Claim], runs: Iterable[RunRecord]) -> list[ClaimResult]:
    index = index_runs(runs)
    results = []
    for claim in claims:
        result = ClaimResult(claim)
        if not claim.not_tested and claim.offline is not None:
            result.comparisons = evaluate_family(claim.comparisons, claim.offline.suite, index)
            result.ablations = [AblationResult(a, evaluate_family(a.comparisons, a.location.suite, index))
                                for a in claim.ablations]
        results.append(result)
    return results


# ---------------------------------------------------------------------------------------------
# Text for the page and the exports
# ---------------------------------------------------------------------------------------------


def _signed(value: float, decimals: int) -> str:
    return f"{value:+.{decimals}f}"


def difference_text(entry: ComparisonResult, claim: Claim) -> str:
    """'+2.17 pp [+1.41, +2.93], 10 seeds' for one comparison."""
    quantity = quantity_of(entry.comparison.treatment.quantity)
    unit = "pp" if quantity.unit == "%" else quantity.unit
    decimals = quantity.decimals
    result = entry.result
    if entry.withdrawn:
        return f"withdrawn: {entry.withdrawn}"
    if result is None:
        return "no paired runs"
    text = f"{_signed(result.mean, decimals)}{(' ' + unit) if unit else ''}"
    if result.low is not None and result.high is not None:
        text += f" [{_signed(result.low, decimals)}, {_signed(result.high, decimals)}]"
    text += f", {result.n} seed{'s' if result.n != 1 else ''}"
    if result.verdict == INCONCLUSIVE and result.mde is not None:
        text += f"; detectable ≥ {result.mde:.{decimals}f}"
    paper = entry.comparison.paper_difference
    if paper is not None:
        text += f"; paper {_signed(paper, decimals)}"
    if entry.unconverged:
        text += f"; {entry.unconverged} run{'s' if entry.unconverged != 1 else ''} unconverged"
    return text


def command_for(location: Location, suites: Mapping[str, SuiteFile]) -> str:
    suite = suites.get(location.suite)
    path = suite.path if suite else location.suite
    return f"fl-benchmarks run {path} --jobs 2"  # the installed script (README: set-up installs it)


def table_slug(tables: Iterable[BenchmarkTable], location: Location) -> str | None:
    """The page of the benchmark's main table in that suite."""
    matches = [t for t in tables if t.suite == location.suite and t.benchmark == location.benchmark]
    main = [t for t in matches if t.main] or matches
    return main[0].slug if main else None


def export_rows(results: Iterable[ClaimResult]) -> list[dict[str, object]]:
    """One row per (claim, comparison, side, seed): every number a verdict rests on."""
    rows: list[dict[str, object]] = []
    for claim_result in results:
        families = [("offline", claim_result.comparisons)]
        families += [(f"ablation: {a.ablation.factor}", a.comparisons) for a in claim_result.ablations]
        for family, entries in families:
            for number, entry in enumerate(entries, start=1):
                comparison = entry.comparison
                for side_name, side, values in (("treatment", comparison.treatment, entry.treatment_values),
                                                ("baseline", comparison.baseline, entry.baseline_values)):
                    for seed, value in sorted(values.items()):
                        rows.append(dict(
                            claim=claim_result.claim.id, family=family, comparison=number, side=side_name,
                            suite=entry.suite, benchmark=side.benchmark if side else "",
                            config=side.config if side else f"threshold {comparison.threshold:g}",
                            quantity=side.quantity if side else comparison.treatment.quantity,
                            direction=comparison.direction, margin=comparison.margin, seed=seed, value=value,
                        ))
    return rows


def export_csv(results: Iterable[ClaimResult]) -> str:
    rows = export_rows(results)
    out = io.StringIO()
    fields = ["claim", "family", "comparison", "side", "suite", "benchmark", "config", "quantity",
              "direction", "margin", "seed", "value"]
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _result_json(entry: ComparisonResult) -> dict[str, object]:
    result = entry.result
    return dict(
        comparison=entry.comparison.label, benchmark=entry.comparison.treatment.benchmark,
        direction=entry.comparison.direction, margin=entry.comparison.margin,
        verdict=entry.verdict, paper=list(entry.comparison.paper), unconverged_runs=entry.unconverged,
        withdrawn=entry.withdrawn or None,
        **({} if result is None else dict(n=result.n, mean=result.mean, sd=result.sd, low=result.low,
                                          high=result.high, level=result.level, p=result.p,
                                          p_holm=result.p_holm, mde=result.mde)),
    )


def export_json(results: Iterable[ClaimResult]) -> str:
    data = []
    for claim_result in results:
        claim = claim_result.claim
        data.append(dict(
            id=claim.id, paper=claim.paper, where=claim.where, claim=claim.text, quantity=claim.quantity,
            verdict=claim_result.verdict, seeds=claim_result.seeds, reason=claim_result.reason,
            not_tested=claim.not_tested or None,
            offline=None if claim.offline is None else dict(suite=claim.offline.suite, benchmark=claim.offline.benchmark),
            paper_scale=None if claim.paper_scale is None else dict(suite=claim.paper_scale.suite,
                                                                   benchmark=claim.paper_scale.benchmark),
            comparisons=[_result_json(e) for e in claim_result.comparisons],
            ablations=[dict(suite=a.ablation.location.suite, benchmark=a.ablation.location.benchmark,
                            factor=a.ablation.factor, verdict=a.verdict,
                            comparisons=[_result_json(e) for e in a.comparisons]) for a in claim_result.ablations],
        ))
    return json.dumps(_finite(data), indent=1, allow_nan=False)


def _finite(value: object) -> object:
    """JSON has no NaN or infinity: such numbers become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


VERDICT_CLASS = {REPRODUCED: "reproduced", CONTRADICTED: "contradicted", INCONCLUSIVE: "inconclusive",
                 TOO_FEW: "too-few", NOT_TESTED: "not-tested", NO_RUNS: "no-runs", WITHDRAWN: "withdrawn"}


@dataclass(frozen=True)
class Link:
    text: str
    href: str  # relative to the index page ("" = no page: the text alone)


@dataclass(frozen=True)
class ClaimRow:
    """One row of the index's claims table."""

    paper: str
    citation: str
    where: str
    claim: str
    claim_id: str
    lines: tuple[tuple[str, str, str], ...]  # (comparison, paired difference text, verdict class)
    verdict: str
    verdict_class: str
    verdict_detail: str
    reason: str
    ablations: tuple[tuple[str, str, str, Link | None, tuple[tuple[str, str, str], ...]], ...]
    # (factor, verdict, verdict class, page, its comparison lines)
    evidence: tuple[Link, ...]
    commands: tuple[str, ...]


def _page(tables: Iterable[BenchmarkTable], suite: str, benchmark: str) -> Link | None:
    slug = table_slug(tables, Location(suite, benchmark))
    return Link(benchmark, f"benchmarks/{slug}.html") if slug else None


def comparison_lines(entries: Iterable[ComparisonResult], claim: Claim) -> tuple[tuple[str, str, str], ...]:
    """(comparison, paired difference, verdict class) per comparison; where the comparisons span several
    benchmarks, each label starts with the part of its benchmark's name that differs (e.g. "pat-2")."""
    entries = list(entries)
    names = sorted({entry.comparison.treatment.benchmark for entry in entries})
    differing: dict[str, str] = {}
    if len(names) > 1:
        parts = [name.split("/") for name in names]
        varying = [k for k in range(max(map(len, parts)))
                   if len({p[k] if k < len(p) else "" for p in parts}) > 1]
        differing = {name: "/".join(p[k] for k in varying if k < len(p)) for name, p in zip(names, parts)}
    return tuple(((f"{differing[entry.comparison.treatment.benchmark]}: " if differing else "")
                  + entry.comparison.label, difference_text(entry, claim), VERDICT_CLASS[entry.verdict])
                 for entry in entries)


def claim_rows(results: Iterable[ClaimResult], tables: list[BenchmarkTable],
               suites: Mapping[str, SuiteFile]) -> list[ClaimRow]:
    rows = []
    for result in results:
        claim = result.claim
        lines = comparison_lines(result.comparisons, claim)
        verdicts = [entry.verdict for entry in result.comparisons]
        detail = ""
        if len(verdicts) > 1 and result.verdict not in (NOT_TESTED,):
            detail = f"{verdicts.count(REPRODUCED)}/{len(verdicts)} comparisons reproduced"
        if claim.not_tested:
            detail = claim.not_tested
        evidence, commands = [], []
        if claim.offline is not None:
            benchmarks = dict.fromkeys([claim.offline.benchmark] + [s.benchmark for c in claim.comparisons
                                                                    for s in (c.treatment, c.baseline) if s])
            evidence += [link for b in benchmarks if (link := _page(tables, claim.offline.suite, b))]
            commands.append(command_for(claim.offline, suites))
        for ablation in claim.ablations:
            command = command_for(ablation.location, suites)
            if command not in commands:
                commands.append(command)
        if claim.paper_scale is not None:
            commands.append(command_for(claim.paper_scale, suites).replace(" --jobs 2", "") + "   # paper scale: needs the data and a GPU")
        rows.append(ClaimRow(
            paper=claim.name, citation=claim.citation, where=claim.where, claim=claim.text, claim_id=claim.id, lines=lines,
            verdict=result.verdict, verdict_class=VERDICT_CLASS[result.verdict], verdict_detail=detail,
            reason=result.reason,
            ablations=tuple((a.ablation.factor, a.verdict, VERDICT_CLASS[a.verdict],
                             _page(tables, a.ablation.location.suite, a.ablation.location.benchmark),
                             comparison_lines(a.comparisons, claim))
                            for a in result.ablations),
            evidence=tuple(evidence), commands=tuple(commands),
        ))
    return rows
