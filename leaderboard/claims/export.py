"""The ledger as text: the rows of the claims table (one compact row per claim, details below),
the effect against the paper's, and the ``claims.csv`` / ``claims.json`` exports."""

from __future__ import annotations

import csv
import io
import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from leaderboard.claims.passes import ClaimPasses
from leaderboard.claims.quantities import quantity_of
from leaderboard.claims.results import ClaimResult, ComparisonResult, difference_text, judged
from leaderboard.claims.spec import (
    BY_CONSTRUCTION,
    NO_RUNS,
    NOT_IMPLEMENTED,
    NOT_TESTABLE,
    NOT_TESTED,
    WITHDRAWN,
    Claim,
    Location,
    SuiteFile,
)
from leaderboard.convergence import CONVERGED, TOO_SHORT, UNCONVERGED
from leaderboard.registration import Amendment, LedgerPlan
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


def _dataset_model(benchmark: str) -> tuple[str, str]:
    """(dataset, model) of a benchmark name ``dataset/partition/participation/model[/variant...]``."""
    parts = benchmark.split("/")
    return parts[0], parts[3] if len(parts) > 3 else ""


def scale_text(claim: Claim) -> str:
    """Where a claim's verdict was measured, against where the paper measured it: 'offline scale:
    mnist5k, fl_mlp (the paper: cifar10, fl_ffn)'; "" for a claim without an offline benchmark."""
    if claim.offline is None:
        return ""
    text = "offline scale: " + ", ".join(filter(None, _dataset_model(claim.offline.benchmark)))
    if claim.paper_scale is not None:
        text += " (the paper: " + ", ".join(filter(None, _dataset_model(claim.paper_scale.benchmark))) + ")"
    return text


def tally_scale(results: Iterable[ClaimResult]) -> str:
    """The scale the tally's verdicts were measured at: every offline dataset and model the counted
    claims read, e.g. 'offline scale (mnist5k, synthetic; fl_logreg, fl_mlp)'."""
    pairs = [_dataset_model(r.claim.offline.benchmark) for r in results
             if r.claim.offline is not None and r.comparisons]
    if not pairs:
        return ""
    datasets = sorted({d for d, _ in pairs})
    models = sorted({m for _, m in pairs if m})
    return f"offline scale ({', '.join(datasets)}; {', '.join(models)})"


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
                            scale=scale_text(claim_result.claim),
                            suite=entry.suite, benchmark=side.benchmark if side else "",
                            config=side.config if side else f"threshold {comparison.threshold:g}",
                            quantity=side.quantity if side else comparison.treatment.quantity,
                            direction=comparison.direction, margin=comparison.margin, seed=seed, value=value,
                        ))
    return rows


CSV_FIELDS = ["claim", "family", "comparison", "side", "scale", "suite", "benchmark", "config", "quantity",
              "direction", "margin", "seed", "value"]


def export_csv(results: Iterable[ClaimResult]) -> str:
    rows = export_rows(results)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def summary_rows(results: Iterable[ClaimResult], passes: Iterable[ClaimPasses] = ()) -> list[dict[str, object]]:
    """One row per claim (``claims_summary.csv``): verdict, interval level, the primary-point value,
    fragile, amended, by construction, the paper's effect against ours, seeds planned and used; with
    ``passes``, the confirmatory verdict, whether the tally counts it (or why not) and whether it agrees."""
    by_claim = {entry.claim.id: entry for entry in passes}
    rows = []
    for r in results:
        first = r.comparisons[0] if r.comparisons else None
        result = first.result if first else None
        rows.append(dict(
            claim=r.claim.id, paper=r.claim.paper, where=r.claim.where, verdict=r.verdict,
            scale=scale_text(r.claim),
            retired=r.claim.retired is not None, fragile=r.fragile,
            fragile_at="; ".join(f"{p}: {v}" for p, v in r.fragile_points), amended=r.amended,
            amendments=" ".join(a.id for a in r.amendments), by_construction=bool(r.claim.by_construction),
            not_testable=bool(r.claim.not_testable),
            not_implemented=bool(r.claim.not_implemented), untested_parts=len(r.claim.untested),
            by_construction_comparisons=sum(bool(c.by_construction) for c in r.claim.comparisons),
            primary_point=r.plan.primary_point if r.plan else "", value=None if result is None else result.mean,
            low=None if result is None else result.low, high=None if result is None else result.high,
            interval_level=None if result is None else result.level,
            knife_edge=any(c.knife_edge for c in r.comparisons),
            holm_not_reached=sum(c.holm_not_reached for c in r.comparisons),
            paper_effect="; ".join(filter(None, (f"{c.comparison.paper_difference:+g} {c.paper_side}"
                                                 if c.comparison.paper_difference is not None else ""
                                                 for c in r.comparisons))),
            seeds_planned=r.seeds_planned, seeds_used=r.seeds,
            extension=r.extension_verdict, code_versions_mixed=len(r.mixed_versions) > 1,
        ))
        if r.claim.id in by_claim:
            entry = by_claim[r.claim.id]
            rows[-1].update(confirmatory_verdict=entry.confirmatory.verdict if entry.confirmatory else "",
                            confirmatory_counted=entry.counted, confirmatory_not_counted_because=entry.status,
                            passes_agree="" if entry.agree is None else entry.agree)
    return rows


def _result_json(entry: ComparisonResult) -> dict[str, object]:
    result = entry.result
    return dict(
        comparison=entry.comparison.label, benchmark=entry.comparison.treatment.benchmark,
        direction=entry.comparison.direction, margin=entry.comparison.margin,
        verdict=entry.verdict, paper=list(entry.comparison.paper), paper_difference=entry.comparison.paper_difference,
        paper_position=entry.paper_position or None, paper_side=entry.paper_side or None,
        holm_not_reached=entry.holm_not_reached, knife_edge=list(entry.knife_edge), convergence=entry.convergence,
        unconverged_runs=entry.unconverged, withdrawn=entry.withdrawn or None, at_points=entry.at_points,
        code_versions=list(entry.versions), planned_seeds=entry.planned_seeds, detectable=entry.detectable,
        unpaired=dict(entry.unpaired),
        by_construction=entry.comparison.by_construction or None,
        **({} if result is None else dict(n=result.n, mean=result.mean, sd=result.sd, low=result.low,
                                          high=result.high, level=result.level, p=result.p,
                                          p_holm=result.p_holm, mde=result.mde)),
        extension=None if entry.extension is None else dict(
            n=entry.extension.n, mean=entry.extension.mean, low=entry.extension.low, high=entry.extension.high,
            level=entry.extension.level, verdict=entry.extension.verdict),
    )


def pass_json(entry: ClaimPasses) -> dict[str, object]:
    """A claim's confirmatory pass in ``claims.json``: its verdict (null without one), whether the
    tally counts it and why not, whether it agrees with the exploratory verdict, what differs, and
    each comparison as the exploratory ones are written."""
    fresh = entry.confirmatory
    return dict(verdict=None if fresh is None else fresh.verdict, counted=entry.counted,
                not_counted_because=entry.status or None, agrees=entry.agree, difference=entry.difference or None,
                seeds=None if fresh is None else fresh.seeds,
                comparisons=[] if fresh is None else [_result_json(e) for e in fresh.comparisons])


def export_json(results: Iterable[ClaimResult], plan: LedgerPlan | None = None,
                amendments: Iterable[Amendment] = (), passes: Iterable[ClaimPasses] = ()) -> str:
    """``claims.json``: the plan, the amendments and every claim (its exploratory verdict, and with
    ``passes`` its confirmatory pass under ``confirmatory``)."""
    by_claim = {entry.claim.id: entry for entry in passes}
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
                scale=scale_text(claim),
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
                not_implemented=claim.not_implemented or None,
                untested=[dict(quote=part.quote, why=part.why) for part in claim.untested],
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
                **({"confirmatory": pass_json(by_claim[claim.id])} if claim.id in by_claim else {}),
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
                 NOT_TESTABLE: "not-testable", BY_CONSTRUCTION: "by-construction",
                 NOT_IMPLEMENTED: "not-implemented"}


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
    untested: tuple[tuple[str, str], ...] = ()  # (the paper's words no comparison tests, why)
    scale: str = ""  # where the verdict was measured (``scale_text``)
    passes: tuple[PassView, ...] = ()  # the exploratory pass, then the confirmatory one (``with_passes``)
    agreement: str = ""  # "agree" / "disagree" where both passes have a verdict
    difference: str = ""  # where they disagree: what differs (``passes.difference_text``)


@dataclass(frozen=True)
class PassView:
    """One pass of a claim on the ledger page: its seeds, its verdict (or why it does not count),
    its comparisons and its runs' convergence per arm."""

    name: str  # "exploratory" / "confirmatory"
    seeds: str  # "seeds 0-9"
    verdict: str
    verdict_class: str
    status: str = ""  # why a confirmatory verdict is not counted ("" counted; the exploratory pass: "")
    lines: tuple[tuple[str, str, str], ...] = ()
    convergence: tuple[tuple[str, str], ...] = ()

    @property
    def counted(self) -> bool:
        return self.name == "confirmatory" and not self.status


def seeds_text(seeds: Iterable[int]) -> str:
    """'seeds 0-9', 'seeds 1000-1009', 'seeds 3, 7': the seeds a pass plans."""
    values = sorted(set(seeds))
    if not values:
        return "no seeds"
    if len(values) > 2 and values == list(range(values[0], values[-1] + 1)):
        return f"seeds {values[0]}-{values[-1]}"
    return "seed" + ("s " if len(values) > 1 else " ") + ", ".join(map(str, values))


def with_passes(row: ClaimRow, entry: ClaimPasses, exploratory_seeds: str, fresh_seeds: str) -> ClaimRow:
    """A claim's row with both passes: the exploratory verdict (the row's own) and the confirmatory
    one, or why there is none that counts; whether they agree and, if not, what differs."""
    claim = entry.claim
    seen = PassView("exploratory", exploratory_seeds, row.verdict, row.verdict_class, lines=row.lines,
                    convergence=tuple(convergence_by_arm(entry.exploratory.comparisons)))
    fresh = entry.confirmatory
    if fresh is None:
        confirmed = PassView("confirmatory", fresh_seeds, "", "no-runs", status=entry.status)
    else:
        confirmed = PassView("confirmatory", fresh_seeds, fresh.verdict, VERDICT_CLASS[fresh.verdict],
                             status=entry.status, lines=comparison_lines(fresh.comparisons, claim),
                             convergence=tuple(convergence_by_arm(fresh.comparisons)))
    agreement = {True: "agree", False: "disagree", None: ""}[entry.agree]
    return replace(row, passes=(seen, confirmed), agreement=agreement, difference=entry.difference)


def convergence_by_arm(entries: Iterable[ComparisonResult]) -> list[tuple[str, str]]:
    """('treatment', '9 converged, 1 unconverged, 0 too short to judge') per arm of a claim's
    comparisons, each run counted once; [] when no run was read."""
    arms: dict[str, Counter[str]] = {"treatment": Counter(), "baseline": Counter()}
    seen: set[str] = set()
    for entry in entries:
        for arm, statuses in entry.convergence_arms.items():
            for run_id, status in statuses.items():
                if run_id not in seen:
                    seen.add(run_id)
                    arms[arm][status] += 1
    return [(arm, ", ".join(f"{counts.get(status, 0)} {status}" for status in (CONVERGED, UNCONVERGED, TOO_SHORT)))
            for arm, counts in arms.items() if counts]


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
                  + entry.comparison.label, difference_text(entry, claim) + _by_construction(entry),
                  VERDICT_CLASS[BY_CONSTRUCTION if entry.comparison.by_construction else entry.verdict])
                 for entry in entries)


def _by_construction(entry: ComparisonResult) -> str:
    """A by-construction comparison's mark on its row: its verdict, kept out of the claim's, and why."""
    why = entry.comparison.by_construction
    return (f"; holds by construction, not counted in the claim's verdict ({entry.verdict} on the runs): {why}"
            if why else "")


def effect_summary(result: ClaimResult) -> str:
    """The paper's effect against our intervals, in a few words ('inside 2 of 3; above 1')."""
    sides = [side for c in result.comparisons if (side := c.paper_side)]
    if not sides:
        return ""
    counts = Counter(sides)
    if len(counts) == 1:
        return EFFECT_WORDS[sides[0]] + (f" ({len(sides)} of {len(sides)})" if len(sides) > 1 else "")
    return "paper's effect: " + ", ".join(f"{EFFECT_SHORT[p]} {n} of {len(sides)}" for p, n in counts.most_common())


EFFECT_WORDS = {"inside": "paper's effect inside our interval",
                "weaker": "weaker than the paper's effect", "stronger": "stronger than the paper's effect",
                "above": "paper's difference above our interval", "below": "paper's difference below our interval"}
"""A claim's effect against the paper's (``ComparisonResult.paper_side``), in the claimed direction."""
EFFECT_SHORT = {"inside": "inside", "weaker": "ours weaker", "stronger": "ours stronger",
                "above": "above", "below": "below"}


def verdict_detail(result: ClaimResult) -> str:
    """What stands under a claim's verdict: how many of its comparisons reproduced, how many more
    hold by construction, or why it is not tested."""
    if result.claim.not_tested:
        return result.claim.not_tested
    verdicts = [entry.verdict for entry in judged(result.comparisons)]
    detail = ""
    if len(verdicts) > 1 and result.verdict not in (NOT_TESTED, NOT_TESTABLE, NOT_IMPLEMENTED):
        detail = f"{verdicts.count(REPRODUCED)}/{len(verdicts)} comparisons reproduced"
    constructed = len(result.comparisons) - len(judged(result.comparisons))
    if constructed:
        detail += (("; " if detail else "") + f"{constructed} more by construction, not counted")
    return detail


def reading_notes(result: ClaimResult) -> tuple[list[str], list[str]]:
    """The badges and notes on how a claim's runs were read: retired, fragile at other reading
    points, knife-edge seeds, comparisons Holm did not reach, and the runs read per arm."""
    claim, badges, notes = result.claim, [], []
    if claim.retired is not None:
        badges.append("retired")
        notes.append(
            f"Retired {claim.retired.date}: {claim.retired.reason.rstrip('.')}. Its verdict on today's runs is "
            f"still shown, and not counted in the tally."
        )
    quantities = [quantity_of(c.treatment.quantity) for c in claim.comparisons]
    over_rounds = bool(quantities) and all(q.over_rounds for q in quantities)
    timing = bool(quantities) and all(q.timing for q in quantities)
    reading = result.plan or LedgerPlan()
    if result.fragile:
        badges.append("fragile")
        notes.append("Fragile: at the " + reading.reading_label(reading.primary_point, over_rounds)
                     + f" it is {result.data_verdict}; "
                     + "; ".join(f"at the {reading.reading_label(p, over_rounds)} {v}"
                                 for p, v in result.fragile_points) + ".")
    knife = [(entry.comparison.label, entry.knife_edge) for entry in result.comparisons if entry.knife_edge]
    if knife and not claim.not_testable:
        badges.append("knife-edge")
        notes.append("Knife-edge: " + "; ".join(
            f"{name}: leaving out seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)} alone changes its verdict"
            for name, seeds in knife) + ".")
    not_reached = [entry.comparison.label for entry in result.comparisons if entry.holm_not_reached]
    if not_reached:
        notes.append("Not reached by Holm: " + ", ".join(not_reached) + " (Holm's step-down stopped at an "
                     "earlier comparison, so these are inconclusive and their own intervals are not shown).")
    arms = convergence_by_arm(result.comparisons)
    if arms and timing:
        runs_read = sum(len(s) for entry in result.comparisons for s in entry.convergence_arms.values())
        notes.append(f"Runs read: {runs_read} timing runs (a timing run measures steady-state rounds: "
                     "the convergence rule does not judge it).")
    elif arms:
        notes.append("Runs read: " + "; ".join(f"{arm}: {counts}" for arm, counts in arms) + ".")
    return badges, notes


def standing_notes(result: ClaimResult, plan: LedgerPlan | None) -> tuple[list[str], list[str]]:
    """The badges and notes on what a claim's verdict stands on: amendments, construction, what
    cannot be tested or is not implemented, seeds beyond or short of the plan, mixed code versions."""
    claim, badges, notes = result.claim, [], []
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
    if claim.not_implemented:
        notes.append(f"Not implemented: {claim.not_implemented} The project's stand-ins are the ablations below, "
                     "never the verdict.")
    if result.extension_verdict:
        notes.append(f"Seeds beyond the plan's {result.seeds_planned} give {result.extension_verdict}; "
                     "an extension, not the verdict.")
    if result.mixed_versions:
        notes.append(f"⚠ Paired runs come from {len(result.mixed_versions)} code versions.")
    if plan is not None and 0 < result.seeds < plan.star_min_seeds and result.comparisons:
        notes.append(f"Only {result.seeds} paired seeds of the plan's {result.seeds_planned}.")
    return badges, notes


def evidence_and_commands(claim: Claim, tables: list[BenchmarkTable],
                          suites: Mapping[str, SuiteFile]) -> tuple[list[str], list[str]]:
    """A claim's links to its benchmark pages, and the commands that run its suites (its offline
    suite, its ablations', and its paper-scale one, which needs the data and a GPU)."""
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
    return evidence, commands


def claim_rows(results: Iterable[ClaimResult], tables: list[BenchmarkTable],
               suites: Mapping[str, SuiteFile], plan: LedgerPlan | None = None) -> list[ClaimRow]:
    """One :class:`ClaimRow` of the claims table per result: its verdict and how many comparisons
    reproduced, its badges and notes (retired, fragile, knife-edge, amended, by construction,
    ...), the links to its benchmark pages and the commands that run its suites."""
    rows = []
    for result in results:
        claim = result.claim
        read_badges, read_notes = reading_notes(result)
        stand_badges, stand_notes = standing_notes(result, plan)
        evidence, commands = evidence_and_commands(claim, tables, suites)
        rows.append(ClaimRow(
            paper=claim.name, citation=claim.citation, where=claim.where, claim=claim.text, quote=claim.quote,
            bar=claim.bar, claim_id=claim.id, lines=comparison_lines(result.comparisons, claim),
            scale=scale_text(claim), verdict=result.verdict, verdict_class=VERDICT_CLASS[result.verdict],
            verdict_detail=verdict_detail(result), effect=effect_summary(result),
            badges=tuple(read_badges + stand_badges), notes=tuple(read_notes + stand_notes),
            reason=result.reason,
            ablations=tuple((a.ablation.factor, a.verdict, VERDICT_CLASS[a.verdict],
                             _page(tables, a.ablation.location.suite, a.ablation.location.benchmark),
                             comparison_lines(a.comparisons, claim))
                            for a in result.ablations),
            evidence=tuple(evidence), commands=tuple(commands), retired=claim.retired is not None,
            untested=tuple((part.quote, part.why) for part in claim.untested),
        ))
    return rows
