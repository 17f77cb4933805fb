"""The ledger as text: the rows of the claims table (one compact row per claim, details below),
the effect against the paper's, and the ``claims.csv`` / ``claims.json`` exports."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from leaderboard.claims.results import ClaimResult, ComparisonResult, difference_text
from leaderboard.claims.spec import (
    BY_CONSTRUCTION,
    NO_RUNS,
    NOT_TESTABLE,
    NOT_TESTED,
    WITHDRAWN,
    Claim,
    Location,
    SuiteFile,
)
from leaderboard.registration import Amendment, LedgerPlan, point_label
from leaderboard.stats import (
    CONTRADICTED,
    INCONCLUSIVE,
    REPRODUCED,
    TOO_FEW,
)
from leaderboard.tables import BenchmarkTable


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
        unpaired=dict(entry.unpaired),
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
        data.append(
            dict(
                id=claim.id,
                paper=claim.paper,
                where=claim.where,
                quote=claim.quote,
                claim=claim.text,
                bar=claim.bar,
                quantity=claim.quantity,
                verdict=claim_result.verdict,
                data_verdict=claim_result.data_verdict if claim_result.comparisons else None,
                fragile=claim_result.fragile,
                fragile_at=dict(claim_result.fragile_points),
                amended=claim_result.amended,
                amendments=[a.id for a in claim_result.amendments],
                by_construction=claim.by_construction or None,
                not_testable=claim.not_testable or None,
                retired=None if claim.retired is None else dict(date=claim.retired.date, reason=claim.retired.reason),
                seeds_planned=claim_result.seeds_planned,
                seeds=claim_result.seeds,
                extension_verdict=claim_result.extension_verdict or None,
                paper_positions=claim_result.paper_positions,
                reason=claim_result.reason,
                not_tested=claim.not_tested or None,
                offline=None
                if claim.offline is None
                else dict(suite=claim.offline.suite, benchmark=claim.offline.benchmark),
                paper_scale=None
                if claim.paper_scale is None
                else dict(suite=claim.paper_scale.suite, benchmark=claim.paper_scale.benchmark),
                comparisons=[_result_json(e) for e in claim_result.comparisons],
                ablations=[
                    dict(
                        suite=a.ablation.location.suite,
                        benchmark=a.ablation.location.benchmark,
                        factor=a.ablation.factor,
                        verdict=a.verdict,
                        comparisons=[_result_json(e) for e in a.comparisons],
                    )
                    for a in claim_result.ablations
                ],
            )
        )
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
            notes.append(
                f"Retired {claim.retired.date}: {claim.retired.reason.rstrip('.')}. Its verdict on today's runs is "
                f"still shown, and not counted in the tally."
            )
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
            notes.append(
                f"Not testable as stated: {claim.not_testable} The project's stand-ins are the ablations below."
            )
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
            commands.append(
                command_for(claim.paper_scale, suites).replace(" --jobs 2", "")
                + "   # paper scale: needs the data and a GPU"
            )
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
