"""The ledger as written: ``benchmarks/<paper>/claims.yaml`` parsed into claims (each with its
paper's quote and place, quantity, direction, bar, comparisons, ablations, retirement) and each
paper's coverage of its tables and figures, with the checks that a claim names what exists."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml
from pydantic import ValidationError

from fl_lightning.records.claims_format import (
    ClaimsFileSpec,
    ClaimSpec,
    ComparisonSpec,
    LocationSpec,
    SideSpec,
    refusal,
)
from fl_lightning.records.suite_format import NOT_SUITES, SuiteFormatError, SuiteSpec
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
# the paper's method or baseline is not implemented here: its stand-in is not the paper's method
NOT_IMPLEMENTED = "not implemented"


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
    by_construction: str = ""  # why this comparison holds by construction: shown, kept out of the verdict

    @property
    def label(self) -> str:
        against = (f"{self.threshold:g}" if self.baseline is None else self.baseline.config)
        text = f"{self.treatment.config} − {against}"
        if self.baseline is not None and self.baseline.quantity != self.treatment.quantity:
            text = f"{self.treatment.config} {_agent(self.treatment.quantity)} − {_agent(self.baseline.quantity)}"
        if self.baseline is not None and self.baseline.benchmark != self.treatment.benchmark:
            text += " ({} vs {})".format(*_differing(self.treatment.benchmark, self.baseline.benchmark))
        return text

    @property
    def paper_difference(self) -> float | None:
        if len(self.paper) == 2:
            return self.paper[0] - self.paper[1]
        if len(self.paper) == 1 and self.threshold is not None:
            return self.paper[0] - self.threshold
        return None


def _differing(first: str, second: str) -> tuple[str, str]:
    """The parts of two benchmark names that differ ("pow" and "pow-5" of mnist5k/pow/full/fl_mlp and
    mnist5k/pow-5/full/fl_mlp; the whole tail from the first difference when their lengths differ)."""
    a, b = first.split("/"), second.split("/")
    if len(a) != len(b):
        start = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return "/".join(a[start:]) or a[-1], "/".join(b[start:]) or b[-1]
    keep = [k for k in range(len(a)) if a[k] != b[k]]
    return "/".join(a[k] for k in keep), "/".join(b[k] for k in keep)


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
class Untested:
    """Words of the claim's quote that no comparison tests, and why."""

    quote: str
    why: str


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
    not_implemented: str = ""  # the paper's method or baseline this project lacks (its stand-ins are ablations)
    untested: tuple[Untested, ...] = ()  # parts of the quote no comparison tests, each with why

    @property
    def stand_ins_only(self) -> str:
        """Why the claim's verdict cannot come from its runs ("" when it can): not testable as stated,
        or the paper's method not implemented here."""
        return self.not_testable or self.not_implemented


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


def _location(spec: LocationSpec | None) -> Location | None:
    return None if spec is None else Location(spec.suite, spec.benchmark)


def _side(spec: str | SideSpec, benchmark: str, quantity: str, where: str) -> Side:
    if isinstance(spec, str):
        _check_quantity(quantity, where)
        return Side(spec, benchmark, quantity)
    side = Side(spec.config, spec.benchmark or benchmark, spec.quantity or quantity)
    _check_quantity(side.quantity, where)
    return side


def _check_quantity(name: str, where: str) -> None:
    try:
        quantity_of(name)
    except KeyError:
        raise ClaimsError(f"{where}: unknown quantity {name!r}; known: {', '.join(QUANTITIES)} "
                          "(the agent_* quantities take ':<agent>')") from None
    if name.split(":")[0] in AGENT_METRICS and ":" not in name:
        raise ClaimsError(f"{where}: quantity {name!r} needs an agent, e.g. {name}:0")


def _comparisons(specs: list[ComparisonSpec], benchmark: str | None, quantity: str, direction: str, margin: float,
                 where: str) -> tuple[Comparison, ...]:
    result = []
    for index, entry in enumerate(specs, start=1):
        here = f"{where}, comparison {index}"
        bench = entry.benchmark or benchmark or ""
        if not bench:
            raise ClaimsError(
                f"{here}: no benchmark (give the claim an `offline` location or the comparison a `benchmark`)"
            )
        entry_direction = entry.direction or direction
        entry_margin = float((entry.margin if entry.margin is not None else margin) or 0.0)
        _check_direction(entry_direction, entry_margin, here)
        result.append(Comparison(
            treatment=_side(entry.treatment, bench, quantity, here),
            baseline=None if entry.baseline is None else _side(entry.baseline, bench, quantity, here),
            threshold=None if entry.threshold is None else float(entry.threshold),
            direction=entry_direction, margin=entry_margin, paper=tuple(float(v) for v in entry.paper or ()),
            by_construction=_words(entry.by_construction),
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
                      comparison.direction, comparison.margin, comparison.paper, comparison.by_construction)


def _words(text: str | None) -> str:
    """A YAML text block as one line (its runs of white space as one space)."""
    return " ".join((text or "").split())


def _file_spec(spec: object, file: str) -> ClaimsFileSpec:
    try:
        return ClaimsFileSpec.model_validate(spec)
    except ValidationError as error:
        if not isinstance(spec, Mapping) or error.errors()[0]["loc"][:1] == ("claims",):
            raise ClaimsError(f"{file}: expected a mapping with `paper`, `citation` and a list `claims`") from None
        raise ClaimsError(f"{file}: {refusal(error, ClaimsFileSpec)}") from None


def _claim_spec(raw: Mapping[str, Any], index: int, file: str) -> ClaimSpec:
    try:
        return ClaimSpec.model_validate(raw)
    except ValidationError as error:
        named = raw.get("id") if isinstance(raw, Mapping) and isinstance(raw.get("id"), str) else index
        raise ClaimsError(f"{file}: claim {named}: {refusal(error, ClaimSpec)}") from None


def parse_claims(spec: object, paper: str, file: str = "") -> list[Claim]:
    """The claims of one ``claims.yaml`` (already parsed); ClaimsError names what is wrong."""
    document = _file_spec(spec, file)
    citation = document.citation or paper
    name = document.name or citation
    claims, seen = [], set()
    for index, raw in enumerate(document.claims, start=1):
        entry = _claim_spec(raw, index, file)
        claim_id = entry.id
        where = f"{file}: claim {claim_id}"
        if claim_id in seen:
            raise ClaimsError(f"{where}: the id is used twice")
        seen.add(claim_id)
        quantity, direction = entry.quantity, entry.direction
        margin = float(entry.margin or 0.0)
        _check_direction(direction, margin, where)
        if quantity.split(":", 1)[0] not in QUANTITIES:  # a claim-level agent quantity may leave the agent to its sides
            _check_quantity(quantity, where)
        offline = _location(entry.offline)
        comparisons = _comparisons(entry.comparisons or [], offline.benchmark if offline else None,
                                   quantity, direction, margin, where)
        not_tested = entry.not_tested or ""
        not_testable = _words(entry.not_testable)
        not_implemented = _words(entry.not_implemented)
        if not_testable and not_implemented:
            raise ClaimsError(f"{where}: give one of `not_testable` (the paper's quantity cannot be computed) and "
                              "`not_implemented` (the paper's method or baseline is not implemented here)")
        if not (not_tested or not_testable or not_implemented) and (offline is None or not comparisons):
            raise ClaimsError(f"{where}: needs an `offline` location and comparisons, or `not_tested` / "
                              "`not_testable` / `not_implemented` with the reason")
        if comparisons and all(c.by_construction for c in comparisons):
            raise ClaimsError(f"{where}: every comparison is marked `by_construction`, so none is left for the "
                              "verdict: mark the claim `by_construction` instead")
        ablations = []
        for number, ablation in enumerate(entry.ablations or [], start=1):
            here = f"{where}, ablation {number}"
            location = Location(ablation.suite, ablation.benchmark)
            ablation_comparisons = (
                _comparisons(ablation.comparisons, location.benchmark, quantity, direction, margin, here)
                if ablation.comparisons is not None
                else tuple(_on_benchmark(c, location.benchmark) for c in comparisons))
            ablations.append(Ablation(location, str(ablation.factor), ablation_comparisons))
        retired = entry.retired
        claims.append(
            Claim(
                id=claim_id,
                paper=paper,
                citation=citation,
                name=name,
                where=entry.where,
                text=entry.claim,
                quantity=quantity,
                direction=direction,
                margin=margin,
                offline=offline,
                paper_scale=_location(entry.paper_scale),
                comparisons=comparisons,
                ablations=tuple(ablations),
                not_tested=not_tested,
                reason=(entry.reason or "").strip(),
                file=file,
                quote=_words(entry.quote),
                bar=_words(entry.bar),
                quantity_note=_words(entry.quantity_note),
                not_testable=not_testable,
                by_construction=_words(entry.by_construction),
                retired=None if retired is None else Retirement(retired.date, _words(retired.reason)),
                not_implemented=not_implemented,
                untested=tuple(Untested(_words(part.quote), _words(part.why)) for part in entry.untested or ()),
            )
        )
    return claims


def parse_coverage(spec: object, paper: str, file: str = "") -> list[CoverageEntry]:
    """A paper's ``coverage`` list: every table, figure and comparative sentence, each with claim ids
    or ``not_claimed`` and the reason."""
    if not isinstance(spec, Mapping) or spec.get("coverage") is None:
        return []
    entries = []
    for entry in _file_spec(spec, file).coverage or []:
        if not entry.claims and not entry.not_claimed:
            raise ClaimsError(f"{file}: coverage {entry.item!r}: give `claims: [ids]` or `not_claimed: reason`")
        entries.append(CoverageEntry(paper, entry.item, tuple(entry.claims or ()), _words(entry.not_claimed)))
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
    """The suites defined under ``root`` (``<paper>/<name>.yaml`` with a ``suite`` key), by suite
    name, each read by the runner's own suite format (``fl_lightning.records.suite_format``): a malformed
    suite file is a ClaimsError naming it, never a suite the claims silently miss."""
    suites = {}
    for path in sorted(Path(root).glob("*/*.yaml")):
        if path.stem in NOT_SUITES:
            continue
        try:
            raw = yaml.safe_load(path.read_text())
        except yaml.YAMLError as error:
            raise ClaimsError(f"{path}: not valid YAML ({error})") from None
        if not (isinstance(raw, Mapping) and "suite" in raw):
            continue  # not a suite file
        try:
            spec = SuiteSpec.parse(raw, str(path))
        except SuiteFormatError as error:
            raise ClaimsError(str(error)) from None
        names = tuple(benchmark.name for benchmark in spec.benchmarks)
        suites[spec.suite] = SuiteFile(spec.suite, f"{path.parent.name}/{path.stem}", names)
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
