"""The claims ledger: every claim of the four papers, tested on our runs, paired by seed.

``benchmarks/<paper>/claims.yaml`` lists a paper's claims. Each claim names a quantity (mean client
accuracy, spread, worst 5 %, angle, rho, conflicts, server time, ...), a direction (``greater``,
``less``, or ``equal`` within a ``margin``), and comparisons ``treatment`` vs ``baseline`` (or vs a
``threshold``) on an offline benchmark. Configurations of one seed share that seed's partition and
initialisation, so a comparison is a paired one: the per-seed differences treatment - baseline,
their mean with a confidence interval, Holm-corrected within the claim (``leaderboard.stats.decide``).

What is tested is fixed by the registered plan (``leaderboard.registration``): a run is read at the
plan's primary point (the final evaluation), and a verdict that differs at a sensitivity point (the
mean of the last k evaluations) is marked fragile; the verdict uses the plan's seeds per suite (more
seeds are an extension, shown apart); runs are checked for convergence (``runs.convergence_status``)
in both arms; a degenerate benchmark (a constant predictor, or worst clients at 0 everywhere) is
withdrawn. Each claim quotes its paper (``quote``, ``where``) and states the paper's bar (``bar``);
a claim the project cannot compute as the paper defines it is "not testable as stated", one that
holds by the algorithm's construction says so, and a retired claim stays on the page. Each claim may
list ablations: the same comparisons on benchmarks that move the offline setup one factor toward the
paper's. A reason is a template filled from the runs at build time (``render_reason``).
"""

from __future__ import annotations

import csv
import io
import json
import math
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import yaml

from fl_lightning.run_schema import Metric
from leaderboard.papers import DEFAULT_ROOT
from leaderboard.registration import Amendment, LedgerPlan, point_label, window_of
from leaderboard.runs import (
    UNCONVERGED,
    LeaderboardError,
    RunRecord,
    convergence_change,
    convergence_status,
    value_at,
)
from leaderboard.stats import (
    CONTRADICTED,
    INCONCLUSIVE,
    REPRODUCED,
    TOO_FEW,
    PairedResult,
    decide,
    equivalence_detectable,
    holm_adjust,
    paired_differences,
)
from leaderboard.tables import BenchmarkTable, headline_value, pick_used_runs

FILE_NAME = "claims.yaml"
SIGNIFICANCE = 0.05
DIRECTIONS = ("greater", "less", "equal")
# Claim verdicts beyond the per-comparison ones of leaderboard.stats
NOT_TESTED, NO_RUNS, WITHDRAWN = "not tested", "no runs", "withdrawn"
NOT_TESTABLE, BY_CONSTRUCTION = "not testable as stated", "holds by construction"


class ClaimsError(LeaderboardError):
    """A claims file that cannot be read: says which file, which claim and what is wrong."""


# ---------------------------------------------------------------------------------------------
# Quantities: a run -> one number, in the unit the papers print
# ---------------------------------------------------------------------------------------------


def _headline(run: RunRecord, window: int) -> float | None:
    value, derived = headline_value(run)
    if value is None:
        return None
    return value_at(run, Metric.GLOBAL_TEST_ACC if derived else Metric.TEST_ACC_MEAN, window)


def _times_1000(value: float | None) -> float | None:
    return None if value is None else 1000 * value


def _at(metric: str) -> Callable[[RunRecord, int], float | None]:
    """A quantity read at the point (the mean of the run's last ``window`` evaluations)."""
    return lambda run, window: value_at(run, metric, window)


def _over_rounds(metric: str) -> Callable[[RunRecord, int], float | None]:
    """A quantity that is a mean over the run's rounds: the same at every point."""
    return lambda run, window: run.mean_over_rounds(metric)


@dataclass(frozen=True)
class Quantity:
    label: str
    unit: str  # of the displayed value and of paper numbers and margins in claims.yaml
    scale: float  # displayed value = scale * value
    value: Callable[[RunRecord, int], float | None]  # (run, window of the point) -> value
    decimals: int = 2


QUANTITIES: dict[str, Quantity] = {
    "mean": Quantity("mean client accuracy", "%", 100, _headline),
    "global": Quantity("global accuracy", "%", 100, _at(Metric.GLOBAL_TEST_ACC)),
    "std": Quantity("std of client accuracies", "pp", 100, _at(Metric.TEST_ACC_STD)),
    "worst5": Quantity("worst 5 % of clients", "%", 100, _at(Metric.TEST_ACC_WORST5)),
    "worst10": Quantity("worst 10 % of clients", "%", 100, _at(Metric.TEST_ACC_WORST10)),
    "best5": Quantity("best 5 % of clients", "%", 100, _at(Metric.TEST_ACC_BEST5)),
    "worst_client": Quantity("worst client", "%", 100, _at(Metric.TEST_ACC_MIN)),
    "angle": Quantity("fairness angle", "rad", 1, _at(Metric.TEST_ACC_ANGLE), 3),
    "rho": Quantity("CGSV rho", "", 1, lambda run, window: run.final(Metric.CGSV_RHO)),
    "conflicts": Quantity("conflicting clients per round (model level)", "clients", 1, _over_rounds(Metric.CONFLICTS_MODEL)),
    Metric.CONFLICTS_LAYER: Quantity("conflicting (client, layer) pairs per round (layer level)", "pairs", 1,
                                _over_rounds(Metric.CONFLICTS_LAYER)),
    "server_time": Quantity("server time per round", "ms", 1,
                            lambda run, window: _times_1000(run.mean_over_rounds("server_time_s")), 1),
    "improved": Quantity("participants whose loss did not increase", "%", 100, _over_rounds(Metric.IMPROVED_FRACTION)),
    # CGSV Fig. 1 on the agents' uploads (CGSV shapley_check_every): means over the run's check rounds
    "shapley_l1_gap": Quantity("l1 error from the exact CGSV: sampled minus psi", "", 1,
                               _over_rounds("cgsv_shapley_l1_gap"), 4),
    "shapley_l2_gap": Quantity("l2 error from the exact CGSV: sampled minus psi", "", 1,
                               _over_rounds("cgsv_shapley_l2_gap"), 4),
    "shapley_time_ratio": Quantity("time of the sampled approximation over psi's", "x", 1,
                                   _over_rounds("cgsv_shapley_time_ratio"), 2),
    # per-agent series (CGSV Fig. 2 and Sec. 3.3): "agent_r:3" = agent 3's final reputation r
    "agent_r": Quantity("reputation r", "", 1, lambda run, window: None, 4),
    "agent_distance": Quantity("distance to the server model", "", 1, lambda run, window: None, 3),
    "agent_psi": Quantity("contribution psi, mean over rounds", "", 1, lambda run, window: None, 3),
    "agent_sparsity": Quantity("download sparsity, mean over rounds", "%", 100, lambda run, window: None, 1),
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


def quantity_value(run: RunRecord, name: str, window: int = 1) -> float | None:
    """The run's value of a quantity at a point (``window``: the mean of the last ``window``
    evaluations; 1 = the final evaluation), in the displayed unit."""
    base, _, agent = name.partition(":")
    quantity = QUANTITIES[base]
    if base in AGENT_METRICS:
        metric, reduce = AGENT_METRICS[base]
        value = reduce(run, f"{metric}/{agent}")
    else:
        value = quantity.value(run, window)
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
class Retirement:
    date: str
    reason: str


@dataclass(frozen=True)
class Claim:
    id: str
    paper: str
    citation: str
    name: str  # short: "FedFV (Wang et al., IJCAI 2021)"
    where: str  # section, table or figure, page
    text: str
    quantity: str
    direction: str
    margin: float
    offline: Location | None
    paper_scale: Location | None
    comparisons: tuple[Comparison, ...]
    ablations: tuple[Ablation, ...] = ()
    not_tested: str = ""
    reason: str = ""  # a Jinja2 template filled from the runs (render_reason)
    file: str = ""
    quote: str = ""  # the paper's words, verbatim
    bar: str = ""  # the paper's own bar: threshold, direction, the margin's derivation
    quantity_note: str = ""
    not_testable: str = ""  # why the paper's quantity or baseline cannot be computed here
    by_construction: str = ""  # why the claim holds by the algorithm's construction
    retired: Retirement | None = None


@dataclass(frozen=True)
class CoverageEntry:
    """One table, figure or comparative sentence of a paper, and the claims that test it (or why none)."""

    paper: str
    item: str
    claims: tuple[str, ...] = ()
    not_claimed: str = ""

    @property
    def label(self) -> str:
        """The item's name ("Table 2"; a sentence item's part before its colon)."""
        return self.item.split(":", 1)[0].strip()


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
        not_testable = " ".join(str(raw.get("not_testable") or "").split())
        if not (not_tested or not_testable) and (offline is None or not comparisons):
            raise ClaimsError(f"{where}: needs an `offline` location and comparisons, or `not_tested` / "
                              "`not_testable` with the reason")
        retired = raw.get("retired")
        if retired is not None and (not isinstance(retired, Mapping) or not retired.get("date")
                                    or not retired.get("reason")):
            raise ClaimsError(f"{where}: `retired` is {{date: YYYY-MM-DD, reason: ...}}")
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
            ablations=tuple(ablations), not_tested=not_tested, reason=str(raw.get("reason") or "").strip(), file=file,
            quote=" ".join(str(raw.get("quote") or "").split()), bar=" ".join(str(raw.get("bar") or "").split()),
            quantity_note=" ".join(str(raw.get("quantity_note") or "").split()), not_testable=not_testable,
            by_construction=" ".join(str(raw.get("by_construction") or "").split()),
            retired=None if retired is None else Retirement(str(retired["date"]), " ".join(str(retired["reason"]).split())),
        ))
    return claims


def parse_coverage(spec: object, paper: str, file: str = "") -> list[CoverageEntry]:
    """A paper's ``coverage`` list: every table, figure and comparative sentence, each with claim ids
    or ``not_claimed`` and the reason."""
    raw = spec.get("coverage") if isinstance(spec, Mapping) else None
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ClaimsError(f"{file}: `coverage` is a list of {{item, claims}} or {{item, not_claimed}}")
    entries = []
    for number, entry in enumerate(raw, start=1):
        here = f"{file}: coverage entry {number}"
        if not isinstance(entry, Mapping) or not entry.get("item"):
            raise ClaimsError(f"{here}: needs an `item` (a table, figure or sentence of the paper)")
        ids = entry.get("claims") or []
        if not isinstance(ids, list) or (not ids and not entry.get("not_claimed")):
            raise ClaimsError(f"{here} ({entry['item']}): give `claims: [ids]` or `not_claimed: reason`")
        entries.append(CoverageEntry(paper, str(entry["item"]), tuple(str(i) for i in ids),
                                     " ".join(str(entry.get("not_claimed") or "").split())))
    return entries


def load_coverage(root: Path = DEFAULT_ROOT) -> list[CoverageEntry]:
    entries: list[CoverageEntry] = []
    for path in sorted(Path(root).glob(f"*/{FILE_NAME}")):
        entries.extend(parse_coverage(yaml.safe_load(path.read_text()), path.parent.name,
                                      f"{path.parent.name}/{FILE_NAME}"))
    return entries


def coverage_problems(claims: Iterable[Claim], coverage: Iterable[CoverageEntry]) -> list[str]:
    """What breaks the papers' coverage: a claim without a quote, a claim whose `where` names no
    covered item of its paper, a claim no coverage entry lists, an entry naming an unknown claim."""
    claims, coverage = list(claims), list(coverage)
    problems = []
    by_id = {claim.id: claim for claim in claims}
    listed = {claim_id for entry in coverage for claim_id in entry.claims}
    for claim in claims:
        labels = [entry.label for entry in coverage if entry.paper == claim.paper]
        if not claim.quote:
            problems.append(f"{claim.id}: no `quote` (the paper's words, verbatim)")
        if not any(_names(claim.where, label) for label in labels):
            problems.append(f"{claim.id}: `where` ({claim.where}) names no item of {claim.paper}'s coverage")
        if claim.id not in listed:
            problems.append(f"{claim.id}: no coverage entry lists it")
    for entry in coverage:
        for claim_id in entry.claims:
            if claim_id not in by_id:
                problems.append(f"{entry.paper} coverage {entry.item!r}: unknown claim {claim_id!r}")
    return problems


def _names(where: str, label: str) -> bool:
    """Whether a `where` text names an item ("Table 2" in "Sec. 5, Table 2, p. 6"; not "Table 21")."""
    import re

    return re.search(rf"(?<![\w.]){re.escape(label)}(?![\w])", where) is not None


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
    result: PairedResult | None  # at the plan's primary point, on the planned seeds; None: no paired seeds
    treatment_values: dict[str, float]
    baseline_values: dict[str, float]
    convergence: dict[str, int] = field(default_factory=dict)  # status -> runs, both arms, each run once
    withdrawn: str = ""  # why the benchmark cannot rank (degenerate)
    versions: tuple[str, ...] = ()  # code versions of the runs paired
    at_points: dict[str, str] = field(default_factory=dict)  # sensitivity point -> verdict
    extension: PairedResult | None = None  # on every seed present, when there are more than planned
    planned_seeds: int = 0
    detectable: float | None = None  # the test actually used: MDE (greater/less) or equivalence margin (equal)

    @property
    def unconverged(self) -> int:
        return self.convergence.get(UNCONVERGED, 0)

    @property
    def verdict(self) -> str:
        if self.withdrawn:
            return WITHDRAWN
        if self.result is None:
            return NO_RUNS
        return self.result.verdict

    @property
    def paper_position(self) -> str:
        """Where the paper's own effect lies against our interval: inside, above or below ("" unknown)."""
        paper = self.comparison.paper_difference
        result = self.result
        if paper is None or result is None or result.low is None or result.high is None or self.withdrawn:
            return ""
        return "above" if paper > result.high else "below" if paper < result.low else "inside"


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
    amendments: tuple[Amendment, ...] = ()
    reason_text: str = ""  # the reason template, filled from the runs
    plan: LedgerPlan | None = None

    @property
    def data_verdict(self) -> str:
        """What the runs say at the primary point, before the claim's own labels."""
        return combine([c.verdict for c in self.comparisons])

    @property
    def verdict(self) -> str:
        if self.claim.not_testable:
            return NOT_TESTABLE
        if self.claim.not_tested:
            return NOT_TESTED
        verdict = self.data_verdict
        if self.claim.by_construction and verdict == REPRODUCED:
            return BY_CONSTRUCTION
        return verdict

    def verdict_at(self, point: str) -> str:
        return combine([c.at_points.get(point, c.verdict) for c in self.comparisons])

    @property
    def fragile_points(self) -> list[tuple[str, str]]:
        """(sensitivity point, verdict) where the verdict differs from the primary point's."""
        if self.claim.not_testable or self.claim.not_tested or not self.comparisons or self.plan is None:
            return []
        primary = self.data_verdict
        return [(p, v) for p in self.plan.sensitivity_points if (v := self.verdict_at(p)) != primary]

    @property
    def fragile(self) -> bool:
        return bool(self.fragile_points)

    @property
    def amended(self) -> bool:
        return bool(self.amendments)

    @property
    def extension_verdict(self) -> str:
        """The verdict on every seed present, where some comparison has more seeds than planned ("" none)."""
        if not any(c.extension is not None for c in self.comparisons):
            return ""
        return combine([(c.extension.verdict if c.extension is not None else c.verdict) for c in self.comparisons])

    @property
    def seeds(self) -> int:
        counts = [c.result.n for c in self.comparisons if c.result is not None]
        return min(counts) if counts else 0

    @property
    def seeds_planned(self) -> int:
        return max((c.planned_seeds for c in self.comparisons), default=0)

    @property
    def mixed_versions(self) -> tuple[str, ...]:
        versions = sorted({v for c in self.comparisons if len(c.versions) > 1 for v in c.versions})
        return tuple(versions)

    @property
    def paper_positions(self) -> list[str]:
        return [c.paper_position for c in self.comparisons]

    @property
    def reason(self) -> str:
        """The ledger's reason (filled from the runs), then what the ablations showed for a claim that
        does not hold offline."""
        parts = [self.reason_text] if self.reason_text else []
        if self.verdict in (REPRODUCED, NOT_TESTED, BY_CONSTRUCTION):
            return " ".join(parts)
        changed = [a for a in self.ablations if a.verdict != self.data_verdict and a.verdict not in (NO_RUNS, TOO_FEW)]
        if self.ablations and not changed and all(a.verdict not in (NO_RUNS, TOO_FEW) for a in self.ablations):
            parts.append("None of the factors tried changes the verdict.")
        elif changed and not self.claim.not_testable:
            parts.append("Changes the verdict: " + "; ".join(
                f"{a.ablation.factor} ({self.data_verdict} → {a.verdict})" for a in changed) + ".")
        elif not self.ablations and not self.claim.not_testable:
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


def degenerate(index: RunIndex, suite: str, benchmark: str, plan: LedgerPlan) -> str:
    """Why a benchmark cannot rank anything under the plan's degeneracy rule, "" otherwise: every
    run of every configuration at one accuracy (a constant predictor), or the worst 5 % of clients
    at 0 in every run of every configuration."""
    window = window_of(plan.primary_point)
    runs = [run for (s, b, _), seeds in index.items() if (s, b) == (suite, benchmark) for run in seeds.values()]
    if plan.degeneracy.constant_predictor:
        present = [v for run in runs if (v := quantity_value(run, "mean", window)) is not None]
        if len(present) >= 4 and max(present) - min(present) < 1e-6:
            return f"every run of every configuration ends at {present[0]:.2f} %: a constant predictor"
    if plan.degeneracy.worst5_at_zero:
        worst = [quantity_value(run, "worst5", window) for run in runs]
        if len(worst) >= 4 and all(v is not None and v == 0.0 for v in worst):
            configs = len({key for key in index if key[:2] == (suite, benchmark)})
            mean = [v for run in runs if (v := quantity_value(run, "mean", window)) is not None]
            span = f"; mean client accuracy {min(mean):.1f}-{max(mean):.1f} %" if mean else ""
            return (f"the worst 5 % of clients are at 0 % in all {len(worst)} runs of its {configs} "
                    f"configurations{span}: a degenerate benchmark")
    return ""


def planned(seeds: Iterable[str], count: int) -> set[str]:
    """The plan's seeds among ``seeds``: 0, 1, ..., count - 1."""
    wanted = {str(k) for k in range(count)}
    return {seed for seed in seeds if seed in wanted}


def _values(index: RunIndex, suite: str, side: Side, window: int,
            seeds: set[str] | None) -> tuple[dict[str, float], dict[str, RunRecord]]:
    runs = {seed: run for seed, run in index.get((suite, side.benchmark, side.config), {}).items()
            if seeds is None or seed in seeds}
    values = {seed: v for seed, run in runs.items() if (v := quantity_value(run, side.quantity, window)) is not None}
    return values, runs


def _pairs(comparison: Comparison, suite: str, index: RunIndex, window: int, seeds: set[str] | None,
           ) -> tuple[dict[str, float], dict[str, float], list[RunRecord]]:
    """Treatment and baseline values by seed, and every run they come from (both arms, each once)."""
    treatment, treatment_runs = _values(index, suite, comparison.treatment, window, seeds)
    if comparison.baseline is not None:
        baseline, baseline_runs = _values(index, suite, comparison.baseline, window, seeds)
    else:
        baseline = {seed: float(comparison.threshold) for seed in treatment}  # type: ignore[arg-type]
        baseline_runs = {}
    common = set(treatment) & set(baseline)
    used = {run.run_id: run for seed, run in treatment_runs.items() if seed in common}
    used.update({run.run_id: run for seed, run in baseline_runs.items() if seed in common})
    return treatment, baseline, list(used.values())


def _decide_family(comparisons: list[Comparison], differences: list[list[float]],
                   alpha: float) -> list[PairedResult | None]:
    """Each comparison decided alone, then Holm's step-down over those with a p (Holm 1979): the
    comparison with the k-th smallest p (0-based) is judged at alpha / (m - k), none after the first
    that is not rejected. Done here rather than by one ``decide`` because a claim's comparisons may
    differ in direction and margin (FedMGDA+ unchanged by an attack while q-FedAvg falls)."""
    results: list[PairedResult | None] = [
        decide([d], c.direction, c.margin, alpha)[0] if d else None for c, d in zip(comparisons, differences)]
    tested = [k for k, r in enumerate(results) if r is not None and r.verdict != TOO_FEW and r.p is not None]
    if len(tested) > 1:
        adjusted = holm_adjust([results[k].p for k in tested])  # type: ignore[union-attr, misc]
        order = sorted(range(len(tested)), key=lambda j: results[tested[j]].p)  # type: ignore[union-attr, return-value, arg-type]
        stopped = False
        for rank, j in enumerate(order):
            k = tested[j]
            step = decide([differences[k]], comparisons[k].direction, comparisons[k].margin,
                          alpha / (len(tested) - rank))[0]
            verdict = INCONCLUSIVE if stopped else step.verdict
            stopped = stopped or step.verdict == INCONCLUSIVE
            results[k] = PairedResult(step.n, step.mean, step.sd, step.low, step.high, step.level, step.p,
                                      adjusted[j], verdict, step.mde)
    return results


def _detectable(comparison: Comparison, result: PairedResult | None) -> float | None:
    """The smallest effect the test actually used could detect at 80 % power: the t-test's MDE for
    greater/less; for equal, the smallest margin two one-sided tests at the step's level would show."""
    if result is None or result.sd is None or result.n < 2:
        return None
    if comparison.direction == "equal":
        return equivalence_detectable(result.n, result.sd, (1.0 - result.level) / 2.0)
    return result.mde


def evaluate_family(comparisons: Iterable[Comparison], suite: str, index: RunIndex,
                    plan: LedgerPlan | None = None) -> list[ComparisonResult]:
    """One family (a claim's comparisons on one suite, or one ablation's) under the plan: at the
    primary point on the planned seeds, Holm-corrected; the verdicts at the sensitivity points; and,
    where more seeds than planned exist, the extension on every seed (shown, never the verdict)."""
    plan = plan or LedgerPlan()
    comparisons = list(comparisons)
    count = plan.seeds_for(suite)
    primary = window_of(plan.primary_point)
    present = {seed for c in comparisons for side in (c.treatment, c.baseline) if side is not None
               for seed in index.get((suite, side.benchmark, side.config), {})}
    seeds = planned(present, count)
    arms = [_pairs(c, suite, index, primary, seeds) for c in comparisons]
    decided = _decide_family(comparisons, [paired_differences(t, b) for t, b, _ in arms], plan.alpha)
    withdrawn: dict[str, str] = {}
    results = []
    for comparison, (treatment, baseline, used), result in zip(comparisons, arms, decided):
        benchmark = comparison.treatment.benchmark
        if benchmark not in withdrawn:
            withdrawn[benchmark] = degenerate(index, suite, benchmark, plan)
        statuses = Counter(convergence_status(run, plan.convergence.window, plan.convergence.change_pp)
                           for run in used)
        results.append(ComparisonResult(
            comparison, suite, result, treatment, baseline, dict(statuses), withdrawn[benchmark],
            tuple(sorted({run.code_version for run in used})), planned_seeds=count,
            detectable=_detectable(comparison, result)))
    for point in plan.sensitivity_points:
        window = window_of(point)
        at = [_pairs(c, suite, index, window, seeds) for c in comparisons]
        for entry, verdict in zip(results, _decide_family(comparisons, [paired_differences(t, b) for t, b, _ in at],
                                                          plan.alpha)):
            entry.at_points[point] = (WITHDRAWN if entry.withdrawn else NO_RUNS if verdict is None
                                      else verdict.verdict)
    if present - seeds:
        every = [_pairs(c, suite, index, primary, None) for c in comparisons]
        for entry, extended in zip(results, _decide_family(
                comparisons, [paired_differences(t, b) for t, b, _ in every], plan.alpha)):
            if extended is not None and entry.result is not None and extended.n > entry.result.n:
                entry.extension = extended
    return results


def evaluate(claims: Iterable[Claim], runs: Iterable[RunRecord], plan: LedgerPlan | None = None,
             amendments: Iterable[Amendment] = (), strict: bool = False) -> list[ClaimResult]:
    """Every claim's verdicts and reason. A reason that names runs the store lacks says so in its
    place (a store with some of the suites still builds), unless ``strict`` (the published site,
    built from every suite: there a missing run is a mistake in a reason, and it is refused)."""
    plan = plan or LedgerPlan()
    amendments = list(amendments)
    index = index_runs(runs)
    results = []
    for claim in claims:
        result = ClaimResult(claim, plan=plan, amendments=tuple(a for a in amendments if a.target == claim.id))
        if not claim.not_tested and claim.offline is not None and claim.comparisons:
            result.comparisons = evaluate_family(claim.comparisons, claim.offline.suite, index, plan)
        result.ablations = [AblationResult(a, evaluate_family(a.comparisons, a.location.suite, index, plan))
                            for a in claim.ablations]
        try:
            result.reason_text = render_reason(result, index, plan)
        except ReasonNeedsRuns as missing:  # a partial store: the verdicts stand, the reason waits for its runs
            if strict:
                raise ReasonError(f"{claim.file}: claim {claim.id}: reason: {missing}") from None
            result.reason_text = f"(The reason is written from runs this store lacks: {missing}.)"
        results.append(result)
    return results


# ---------------------------------------------------------------------------------------------
# Reasons: templates filled from the runs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arm:
    """One configuration's values of a quantity over the planned seeds, at the primary point."""

    values: tuple[float, ...]
    statuses: tuple[str, ...] = ()
    changes: tuple[float, ...] = ()  # convergence changes (pp) of the runs that could be judged

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float | None:
        return statistics.fmean(self.values) if self.values else None

    @property
    def sd(self) -> float | None:
        return statistics.stdev(self.values) if len(self.values) >= 2 else None

    @property
    def min(self) -> float | None:
        return min(self.values) if self.values else None

    @property
    def max(self) -> float | None:
        return max(self.values) if self.values else None

    @property
    def median(self) -> float | None:
        return statistics.median(self.values) if self.values else None

    def count(self, value: float, tolerance: float = 1e-9) -> int:
        return sum(1 for v in self.values if abs(v - value) <= tolerance)

    @property
    def unconverged(self) -> int:
        return sum(1 for s in self.statuses if s == UNCONVERGED)

    @property
    def improving(self) -> int:
        """Runs whose accuracy still rose by more than the plan's change at their end."""
        return sum(1 for s, c in zip(self.statuses, self.changes) if s == UNCONVERGED and c > 0)

    @property
    def falling(self) -> int:
        return sum(1 for s, c in zip(self.statuses, self.changes) if s == UNCONVERGED and c < 0)


class ReasonError(ClaimsError):
    pass


class ReasonNeedsRuns(ReasonError):
    """A reason names runs the store does not hold (a store with only some of the suites)."""


def _num(value: float | None, decimals: int = 1) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{decimals}f}"


def _signed_filter(value: float | None, decimals: int = 1) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:+.{decimals}f}"


REASONS = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
REASONS.filters.update(num=_num, signed=_signed_filter)


@dataclass(frozen=True)
class ComparisonNumbers:
    """A comparison's numbers as a reason template reads them."""

    entry: ComparisonResult
    claim: Claim

    def __getattr__(self, name: str) -> object:
        result = self.entry.result
        if name in ("mean", "sd", "n", "low", "high", "level"):
            return None if result is None else getattr(result, name)
        if name == "verdict":
            return self.entry.verdict
        if name == "text":
            return difference_text(self.entry, self.claim)
        raise AttributeError(name)


def render_reason(result: ClaimResult, index: RunIndex, plan: LedgerPlan) -> str:
    """The claim's reason with every number filled from the runs (``arm``, ``comparison``, ``ablation``)."""
    claim = result.claim
    if not claim.reason:
        return ""
    window = window_of(plan.primary_point)

    def arm(suite: str, benchmark: str, config: str, quantity: str) -> Arm:
        try:
            quantity_of(quantity)
        except KeyError:
            raise ReasonError(f"{claim.file}: claim {claim.id}: reason: unknown quantity {quantity!r}") from None
        runs = index.get((suite, benchmark, config))
        if runs is None:
            raise ReasonNeedsRuns(f"no runs of {config!r} on {suite} / {benchmark}")
        seeds = planned(runs, plan.seeds_for(suite))
        chosen = [runs[s] for s in sorted(seeds, key=int)]
        values = tuple(v for run in chosen if (v := quantity_value(run, quantity, window)) is not None)
        statuses = tuple(convergence_status(run, plan.convergence.window, plan.convergence.change_pp) for run in chosen)
        changes = tuple(convergence_change(run, plan.convergence.window) or 0.0 for run in chosen)
        return Arm(values, statuses, changes)

    def comparison(k: int) -> ComparisonNumbers:
        if not 1 <= k <= len(result.comparisons):
            raise ReasonError(f"{claim.file}: claim {claim.id}: reason: comparison({k}) of {len(result.comparisons)}")
        return ComparisonNumbers(result.comparisons[k - 1], claim)

    def ablation(i: int, k: int) -> ComparisonNumbers:
        if not 1 <= i <= len(result.ablations) or not 1 <= k <= len(result.ablations[i - 1].comparisons):
            raise ReasonError(f"{claim.file}: claim {claim.id}: reason: ablation({i}, {k}) does not exist")
        return ComparisonNumbers(result.ablations[i - 1].comparisons[k - 1], claim)

    try:
        text = REASONS.from_string(claim.reason).render(arm=arm, comparison=comparison, ablation=ablation)
    except ReasonError:
        raise
    except jinja2.TemplateError as error:
        raise ReasonError(f"{claim.file}: claim {claim.id}: reason template: {error}") from None
    return " ".join(text.split())


# ---------------------------------------------------------------------------------------------
# Text for the page and the exports
# ---------------------------------------------------------------------------------------------


def _signed(value: float, decimals: int) -> str:
    return f"{value:+.{decimals}f}"


def level_text(level: float) -> str:
    """'95 %', '97.5 %', '98.3 %': a confidence level as the page labels it."""
    text = f"{100 * level:.1f}".rstrip("0").rstrip(".")
    return f"{text} %"


POSITION_TEXT = {"inside": "the paper's effect lies inside our interval",
                 "above": "the paper's effect lies above our interval (ours is smaller)",
                 "below": "the paper's effect lies below our interval (ours is larger)"}


def difference_text(entry: ComparisonResult, claim: Claim) -> str:
    """'+2.17 pp [+1.41, +2.93] (97.5 % CI), 10 seeds; paper +3.57, above' for one comparison."""
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
        text += f" [{_signed(result.low, decimals)}, {_signed(result.high, decimals)}] ({level_text(result.level)} CI)"
    text += f", {result.n} seed{'s' if result.n != 1 else ''}"
    if result.verdict == INCONCLUSIVE and entry.detectable is not None:
        if entry.comparison.direction == "equal":
            text += f"; equivalence detectable within ±{entry.detectable:.{decimals}f} (margin {entry.comparison.margin:g})"
        else:
            text += f"; detectable ≥ {entry.detectable:.{decimals}f}"
    paper = entry.comparison.paper_difference
    if paper is not None:
        text += f"; paper {_signed(paper, decimals)}"
        if entry.paper_position:
            text += f" ({entry.paper_position} our interval)"
    if entry.unconverged:
        text += f"; {entry.unconverged} of {sum(entry.convergence.values())} runs unconverged"
    if entry.extension is not None:
        ext = entry.extension
        text += (f"; extension beyond the plan: {ext.n} seeds {_signed(ext.mean, decimals)}"
                 f" → {ext.verdict} (not the verdict)")
    if len(entry.versions) > 1:
        text += f"; ⚠ runs of {len(entry.versions)} code versions"
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
    """One row per (claim, comparison, side, seed): every number a verdict rests on (the planned
    seeds at the primary point)."""
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


CSV_FIELDS = ["claim", "family", "comparison", "side", "suite", "benchmark", "config", "quantity",
              "direction", "margin", "seed", "value"]


def export_csv(results: Iterable[ClaimResult]) -> str:
    rows = export_rows(results)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def summary_rows(results: Iterable[ClaimResult]) -> list[dict[str, object]]:
    """One row per claim (``claims_summary.csv``): verdict, interval level, the primary-point value,
    fragile, amended, by construction, the paper's effect against ours, seeds planned and used."""
    rows = []
    for r in results:
        first = r.comparisons[0] if r.comparisons else None
        result = first.result if first else None
        rows.append(dict(
            claim=r.claim.id, paper=r.claim.paper, where=r.claim.where, verdict=r.verdict,
            retired=r.claim.retired is not None, fragile=r.fragile,
            fragile_at="; ".join(f"{p}: {v}" for p, v in r.fragile_points), amended=r.amended,
            amendments=" ".join(a.id for a in r.amendments), by_construction=bool(r.claim.by_construction),
            not_testable=bool(r.claim.not_testable),
            primary_point=r.plan.primary_point if r.plan else "", value=None if result is None else result.mean,
            low=None if result is None else result.low, high=None if result is None else result.high,
            interval_level=None if result is None else result.level,
            paper_effect="; ".join(filter(None, (f"{c.comparison.paper_difference:+g} {c.paper_position}"
                                                 if c.comparison.paper_difference is not None else ""
                                                 for c in r.comparisons))),
            seeds_planned=r.seeds_planned, seeds_used=r.seeds,
            extension=r.extension_verdict, code_versions_mixed=len(r.mixed_versions) > 1,
        ))
    return rows


def _result_json(entry: ComparisonResult) -> dict[str, object]:
    result = entry.result
    return dict(
        comparison=entry.comparison.label, benchmark=entry.comparison.treatment.benchmark,
        direction=entry.comparison.direction, margin=entry.comparison.margin,
        verdict=entry.verdict, paper=list(entry.comparison.paper), paper_difference=entry.comparison.paper_difference,
        paper_position=entry.paper_position or None, convergence=entry.convergence,
        unconverged_runs=entry.unconverged, withdrawn=entry.withdrawn or None, at_points=entry.at_points,
        code_versions=list(entry.versions), planned_seeds=entry.planned_seeds, detectable=entry.detectable,
        **({} if result is None else dict(n=result.n, mean=result.mean, sd=result.sd, low=result.low,
                                          high=result.high, level=result.level, p=result.p,
                                          p_holm=result.p_holm, mde=result.mde)),
        extension=None if entry.extension is None else dict(
            n=entry.extension.n, mean=entry.extension.mean, low=entry.extension.low, high=entry.extension.high,
            level=entry.extension.level, verdict=entry.extension.verdict),
    )


def export_json(results: Iterable[ClaimResult], plan: LedgerPlan | None = None,
                amendments: Iterable[Amendment] = ()) -> str:
    data = []
    for claim_result in results:
        claim = claim_result.claim
        data.append(dict(
            id=claim.id, paper=claim.paper, where=claim.where, quote=claim.quote, claim=claim.text,
            bar=claim.bar, quantity=claim.quantity, verdict=claim_result.verdict,
            data_verdict=claim_result.data_verdict if claim_result.comparisons else None,
            fragile=claim_result.fragile, fragile_at=dict(claim_result.fragile_points),
            amended=claim_result.amended, amendments=[a.id for a in claim_result.amendments],
            by_construction=claim.by_construction or None, not_testable=claim.not_testable or None,
            retired=None if claim.retired is None else dict(date=claim.retired.date, reason=claim.retired.reason),
            seeds_planned=claim_result.seeds_planned, seeds=claim_result.seeds,
            extension_verdict=claim_result.extension_verdict or None,
            paper_positions=claim_result.paper_positions, reason=claim_result.reason,
            not_tested=claim.not_tested or None,
            offline=None if claim.offline is None else dict(suite=claim.offline.suite, benchmark=claim.offline.benchmark),
            paper_scale=None if claim.paper_scale is None else dict(suite=claim.paper_scale.suite,
                                                                   benchmark=claim.paper_scale.benchmark),
            comparisons=[_result_json(e) for e in claim_result.comparisons],
            ablations=[dict(suite=a.ablation.location.suite, benchmark=a.ablation.location.benchmark,
                            factor=a.ablation.factor, verdict=a.verdict,
                            comparisons=[_result_json(e) for e in a.comparisons]) for a in claim_result.ablations],
        ))
    document = dict(
        plan=None if plan is None else dict(
            version=plan.version, registered=plan.registered, primary_point=plan.primary_point,
            sensitivity_points=list(plan.sensitivity_points), alpha=plan.alpha, multiplicity=plan.multiplicity,
            seeds_default=plan.default_seeds, seeds_suites=dict(plan.suite_seeds),
            convergence=dict(window=plan.convergence.window, change_pp=plan.convergence.change_pp),
            degeneracy=dict(constant_predictor=plan.degeneracy.constant_predictor,
                            worst5_at_zero=plan.degeneracy.worst5_at_zero)),
        amendments=[dict(id=a.id, date=a.date, target=a.target, before=a.before, after=a.after, reason=a.reason,
                         results_seen=a.results_seen) for a in amendments],
        claims=data,
    )
    return json.dumps(_finite(document), indent=1, allow_nan=False)


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
                 TOO_FEW: "too-few", NOT_TESTED: "not-tested", NO_RUNS: "no-runs", WITHDRAWN: "withdrawn",
                 NOT_TESTABLE: "not-testable", BY_CONSTRUCTION: "by-construction"}


@dataclass(frozen=True)
class Link:
    text: str
    href: str  # relative to the ledger page ("" = no page: the text alone)


@dataclass(frozen=True)
class ClaimRow:
    """One claim on the ledger page: a compact row, details below it."""

    paper: str
    citation: str
    where: str
    claim: str
    quote: str
    bar: str
    claim_id: str
    lines: tuple[tuple[str, str, str], ...]  # (comparison, paired difference text, verdict class)
    verdict: str
    verdict_class: str
    verdict_detail: str
    effect: str  # the paper's effect against ours, in a few words
    badges: tuple[str, ...]  # "fragile", "amended", "by construction", "not testable as stated", "retired"
    notes: tuple[str, ...]  # one line per badge: why
    reason: str
    ablations: tuple[tuple[str, str, str, Link | None, tuple[tuple[str, str, str], ...]], ...]
    # (factor, verdict, verdict class, page, its comparison lines)
    evidence: tuple[Link, ...]
    commands: tuple[str, ...]
    retired: bool = False


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


def effect_summary(result: ClaimResult) -> str:
    """The paper's effect against our intervals, in a few words ('inside 2 of 3; above 1')."""
    positions = [p for p in result.paper_positions if p]
    if not positions:
        return ""
    counts = Counter(positions)
    if len(counts) == 1:
        position = positions[0]
        return {"inside": "paper's effect inside our interval",
                "above": "smaller than the paper's effect",
                "below": "larger than the paper's effect"}[position] + (f" ({len(positions)} of {len(positions)})"
                                                                        if len(positions) > 1 else "")
    return "paper's effect: " + ", ".join(f"{p} {n} of {len(positions)}" for p, n in counts.most_common())


def claim_rows(results: Iterable[ClaimResult], tables: list[BenchmarkTable],
               suites: Mapping[str, SuiteFile], plan: LedgerPlan | None = None) -> list[ClaimRow]:
    rows = []
    for result in results:
        claim = result.claim
        lines = comparison_lines(result.comparisons, claim)
        verdicts = [entry.verdict for entry in result.comparisons]
        detail = ""
        if len(verdicts) > 1 and result.verdict not in (NOT_TESTED, NOT_TESTABLE):
            detail = f"{verdicts.count(REPRODUCED)}/{len(verdicts)} comparisons reproduced"
        if claim.not_tested:
            detail = claim.not_tested
        badges, notes = [], []
        if claim.retired is not None:
            badges.append("retired")
            notes.append(f"Retired {claim.retired.date}: {claim.retired.reason.rstrip('.')}. Its verdict on today's runs is "
                         f"still shown, and not counted in the tally.")
        if result.fragile:
            badges.append("fragile")
            notes.append("Fragile: at the " + point_label(result.plan.primary_point if result.plan else "final")
                         + f" it is {result.data_verdict}; "
                         + "; ".join(f"at the {point_label(p)} {v}" for p, v in result.fragile_points) + ".")
        if result.amended:
            badges.append("amended")
            notes.append("Amended: " + "; ".join(f"{a.id} ({a.date}): {a.after}" for a in result.amendments))
        if claim.by_construction:
            badges.append("by construction")
            notes.append(f"Holds by construction: {claim.by_construction}")
        if claim.not_testable:
            notes.append(f"Not testable as stated: {claim.not_testable} The project's stand-ins are the ablations below.")
        if result.extension_verdict:
            notes.append(f"Seeds beyond the plan's {result.seeds_planned} give {result.extension_verdict}; "
                         "an extension, not the verdict.")
        if result.mixed_versions:
            notes.append(f"⚠ Paired runs come from {len(result.mixed_versions)} code versions.")
        if plan is not None and 0 < result.seeds < plan.star_min_seeds and result.comparisons:
            notes.append(f"Only {result.seeds} paired seeds of the plan's {result.seeds_planned}.")
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
            paper=claim.name, citation=claim.citation, where=claim.where, claim=claim.text, quote=claim.quote,
            bar=claim.bar, claim_id=claim.id, lines=lines,
            verdict=result.verdict, verdict_class=VERDICT_CLASS[result.verdict], verdict_detail=detail,
            effect=effect_summary(result), badges=tuple(badges), notes=tuple(notes),
            reason=result.reason,
            ablations=tuple((a.ablation.factor, a.verdict, VERDICT_CLASS[a.verdict],
                             _page(tables, a.ablation.location.suite, a.ablation.location.benchmark),
                             comparison_lines(a.comparisons, claim))
                            for a in result.ablations),
            evidence=tuple(evidence), commands=tuple(commands), retired=claim.retired is not None,
        ))
    return rows
