"""The ledger as written: ``benchmarks/<paper>/claims.yaml`` parsed into claims (each with its
paper's quote and place, quantity, direction, bar, comparisons, ablations, retirement) and each
paper's coverage of its tables and figures, with the checks that a claim names what exists."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import jinja2
import yaml

from leaderboard.claims.quantities import AGENT_METRICS, QUANTITIES, quantity_of
from leaderboard.papers import DEFAULT_ROOT
from leaderboard.runs import (
    LeaderboardError,
)

FILE_NAME = "claims.yaml"
SIGNIFICANCE = 0.05
DIRECTIONS = ("greater", "less", "equal")
# Claim verdicts beyond the per-comparison ones of leaderboard.stats
NOT_TESTED, NO_RUNS, WITHDRAWN = "not tested", "no runs", "withdrawn"
NOT_TESTABLE, BY_CONSTRUCTION = "not testable as stated", "holds by construction"


class ClaimsError(LeaderboardError):
    """A claims file that cannot be read: says which file, which claim and what is wrong."""


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
            raise ClaimsError(
                f"{here}: no benchmark (give the claim an `offline` location or the comparison a `benchmark`)"
            )
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
        claims.append(
            Claim(
                id=claim_id,
                paper=paper,
                citation=citation,
                name=name,
                where=str(raw["where"]),
                text=str(raw["claim"]),
                quantity=quantity,
                direction=direction,
                margin=margin,
                offline=offline,
                paper_scale=_location(raw.get("paper_scale"), f"{where}, paper_scale"),
                comparisons=comparisons,
                ablations=tuple(ablations),
                not_tested=not_tested,
                reason=str(raw.get("reason") or "").strip(),
                file=file,
                quote=" ".join(str(raw.get("quote") or "").split()),
                bar=" ".join(str(raw.get("bar") or "").split()),
                quantity_note=" ".join(str(raw.get("quantity_note") or "").split()),
                not_testable=not_testable,
                by_construction=" ".join(str(raw.get("by_construction") or "").split()),
                retired=None
                if retired is None
                else Retirement(str(retired["date"]), " ".join(str(retired["reason"]).split())),
            )
        )
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


def _num(value: float | None, decimals: int = 1) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{decimals}f}"


def _signed_filter(value: float | None, decimals: int = 1) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:+.{decimals}f}"


REASONS = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
REASONS.filters.update(num=_num, signed=_signed_filter)
