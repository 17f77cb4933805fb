"""Build the static site: ``index.html`` + one page per benchmark, figures, and a Markdown twin."""

from __future__ import annotations

import os
import platform
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import jinja2
import markupsafe
import mlflow

from fl_lightning.records.machine import cpu_model
from fl_lightning.records.vocabulary import Tag
from leaderboard import claims as ledger
from leaderboard import evidence, export, export_reading
from leaderboard.claims.passes import ClaimPasses, evaluate_passes
from leaderboard.claims.passes import tally as passes_tally
from leaderboard.figures import write_figures
from leaderboard.markdown import markdown_table
from leaderboard.papers import DEFAULT_ROOT, load_paper_numbers
from leaderboard.registration import (
    OVER_ROUNDS_LABELS,
    LedgerPlan,
    load_amendments,
    load_fresh_seeds,
    load_plan,
    point_label,
    registration_hash,
)
from leaderboard.runs import (
    LeaderboardError,
    Progress,
    StoreContents,
    load_runs,
    store_name,
)
from leaderboard.stats import SIGNIFICANCE
from leaderboard.suite_views import (
    control_view,
    gains_view,
    index_view,
    matrix_view,
    paper_numbers_view,
    short_name,
)
from leaderboard.summary import summarize
from leaderboard.table_building import build_tables, unmatched_paper_numbers
from leaderboard.tables import (
    BEST_MARK,
    DERIVED_NOTE,
    NO_FAIRNESS_NOTE,
    TIE_MARK,
    run_time,
)
from leaderboard.tasks import SOURCE_TEXT, task_lines
from leaderboard.views import (
    comparison_view,
    leaderboard_view,
    problem_runs_view,
    replay_text,
    runs_view,
    versions_text,
)

TEMPLATES = Path(__file__).parent / "templates"
MARKER = ".leaderboard-site"  # written into every built site: only such folders are replaced
# A build goes to a git-ignored folder of the working directory unless asked for the published site.
DEFAULT_OUT = Path("leaderboard_build")
PUBLISHED_SITE = evidence.PUBLISHED_SITE  # what the repository publishes: `publish`, `build --publish`
PUBLISH_COMMAND = "fl-leaderboard publish"  # the footer of the published site, however it was run
# the libraries whose releases can change a build's bytes (figures, the Parquet download): its marker
# names them, so that a site is compared byte for byte only with a build of the same releases
BUILD_LIBRARIES = ("matplotlib", "numpy", "pandas", "pyarrow", "scipy")


@dataclass
class SuiteInfo:
    name: str
    description: str
    scale: str
    papers: list[str]
    runs: int
    status_counts: dict[str, int]


@dataclass
class Provenance:
    built_at: str
    tracking_uri: str
    experiments: list[tuple[str, int]]  # (name, runs) of the experiments read
    git_shas: list[tuple[str, int]]  # (sha, runs)
    machines: list[tuple[str, int]]  # (machine tag, runs); empty when no run has the tag
    untagged_machine_runs: int
    builder_machine: str
    suites: list[SuiteInfo]
    scales: list[str]
    mlflow_version: str
    build_command: str = "python -m leaderboard build"  # as the user ran it: :func:`build_command`


def build_command(argv0: str | None = None) -> str:
    """The command that built the site, as the user ran it (the footer names it): ``fl-leaderboard
    build`` from the console script, else ``python -m leaderboard build``."""
    import sys

    console = Path(argv0 or sys.argv[0]).name == "fl-leaderboard"
    return "fl-leaderboard build" if console else "python -m leaderboard build"


def data_time(runs: list) -> str:
    """When the newest of ``runs`` ended (else started): what a build from exports is stamped with, so
    that it depends on its exports alone."""
    newest = max((run_time(run) for run in runs), default=0.0)
    return f"as of the newest run it reads ({datetime.fromtimestamp(newest, timezone.utc):%Y-%m-%d %H:%M UTC})"


def provenance(store: StoreContents, command: str | None = None, from_export: bool = False) -> Provenance:
    """The page's provenance box. A build from exports is stamped with its newest run's time and names
    no mlflow release (it reads no store) and no builder machine, so that the same exports build the
    same bytes on any machine."""
    runs = store.runs
    suites = []
    for name in sorted({r.suite for r in runs}):
        suite_runs = [r for r in runs if r.suite == name]
        described = [r for r in suite_runs if r.suite_description]
        suites.append(SuiteInfo(
            name=name,
            description=max(described, key=run_time).suite_description if described else "",
            scale=", ".join(sorted({r.scale for r in suite_runs} - {""})),  # a plain fit has none
            papers=sorted({r.tags.get(Tag.PAPER, "") for r in suite_runs} - {""}),
            runs=len(suite_runs),
            status_counts=dict(sorted(Counter(r.status for r in suite_runs).items())),
        ))
    machines = Counter(r.tags[Tag.MACHINE] for r in runs if r.tags.get(Tag.MACHINE))
    return Provenance(
        built_at=data_time(runs) if from_export else datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        tracking_uri=store_name(store.tracking_uri),
        experiments=[(name, sum(1 for r in runs if r.experiment == name)) for name in store.read_experiments],
        git_shas=Counter(r.git_sha or "(no git_sha tag)" for r in runs).most_common(),
        machines=machines.most_common(),
        untagged_machine_runs=sum(1 for r in runs if not r.tags.get(Tag.MACHINE)),
        # a build from exports names no builder: the page must not depend on the machine that built it
        builder_machine="" if from_export else
        f"{cpu_model()}, {os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}",
        suites=suites,
        scales=sorted({r.scale for r in runs} - {""}),
        mlflow_version="" if from_export else mlflow.__version__,
        build_command=command or build_command(),
    )


def anchor(name: str) -> str:
    """``name`` as an HTML id: runs of characters other than letters, digits, ``_ . -`` become one
    ``-`` (a suite's name stays as it is; "Your fits (not from a suite)" -> "Your-fits-not-from-a-suite")."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-")


def environment() -> tuple[jinja2.Environment, jinja2.Environment]:
    """The Jinja environments of the HTML pages (autoescaped) and of the Markdown ones, both
    strict about undefined names, with the site's shared constants, helpers and filters."""
    loader = jinja2.FileSystemLoader(str(TEMPLATES))
    html = jinja2.Environment(loader=loader, autoescape=True, undefined=jinja2.StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True)
    markdown = jinja2.Environment(loader=loader, autoescape=False, undefined=jinja2.StrictUndefined,
                                  trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    for env in (html, markdown):
        env.globals.update(BEST_MARK=BEST_MARK, TIE_MARK=TIE_MARK, DERIVED_NOTE=DERIVED_NOTE,
                           NO_FAIRNESS_NOTE=NO_FAIRNESS_NOTE, SIGNIFICANCE=SIGNIFICANCE, SOURCE_TEXT=SOURCE_TEXT,
                           task_lines=task_lines, versions_text=versions_text, short_name=short_name,
                           replay_text=replay_text)
    html.filters["anchor"] = anchor
    html.filters["subscripts"] = subscripts
    markdown.filters["md_table"] = markdown_table
    return html, markdown


def check_output(out: Path) -> None:
    """Refuses to replace a folder this tool did not build, or one holding a file its last build
    did not write (the manifest in its marker file): checked before the store is read."""
    out = out.resolve()
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / MARKER).exists())):
        raise LeaderboardError(
            f"{out} exists and is not a leaderboard site built by this tool (no {MARKER} file); "
            "choose an empty or new folder with --out."
        )
    written = built_files(out / MARKER)
    if written is not None:
        theirs = sorted(str(p.relative_to(out)) for p in out.rglob("*")
                        if p.is_file() and str(p.relative_to(out)) not in written | {MARKER})
        if theirs:
            shown = ", ".join(theirs[:3]) + (f" and {len(theirs) - 3} more" if len(theirs) > 3 else "")
            raise LeaderboardError(f"{out} holds files its last build did not write ({shown}); a rebuild replaces "
                                   "the folder, so move them out first or choose another --out.")


def built_files(marker: Path) -> set[str] | None:
    """The files a build wrote (its marker's manifest, paths relative to the site); None for a
    site built before manifests, or none."""
    try:
        lines = marker.read_text().splitlines()
    except OSError:
        return None
    return {line[2:] for line in lines if line.startswith("- ")} or None


def library_releases() -> str:
    """The releases of BUILD_LIBRARIES this build ran with, as the marker names them."""
    from importlib.metadata import PackageNotFoundError, version

    def release(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "absent"

    return ", ".join(f"{name} {release(name)}" for name in BUILD_LIBRARIES)


def write_marker(staging: Path, command: str | None = None) -> None:
    """The marker file: the command, the releases that shape the bytes and the manifest of every
    file of the build (read by ``check_output``)."""
    files = sorted(p.relative_to(staging).as_posix() for p in staging.rglob("*") if p.is_file())
    (staging / MARKER).write_text(f"built by `{command or build_command()}`; replaced on every build.\n"
                                  f"Libraries: {library_releases()}\nIts files:\n"
                                  + "".join(f"- {name}\n" for name in files))


def prepare_output(out: Path) -> Path:
    """A fresh staging folder next to ``out``; refuses to replace a folder this tool did not build."""
    check_output(out)
    out = out.resolve()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-build-", dir=out.parent))
        umask = os.umask(0)
        os.umask(umask)
        staging.chmod(0o777 & ~umask)  # mkdtemp's 0700 would become the published folder's mode
        return staging
    except OSError as error:
        raise LeaderboardError(f"cannot write the site to {out} ({error.strerror or error}); "
                               "choose a folder you can write with --out.") from None


def publish(staging: Path, out: Path) -> None:
    out = out.resolve()
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)


EXPLORATORY = ("Every verdict on this page is exploratory: it rests on seeds that had been run and seen when the plan "
               "(version 1 of 2026-11-27, version {version} of {registered}), every claim, bar and margin were "
               "written, and re-running the same seeds re-measures the same numbers. {pending}")
PARTIAL = ("The confirmatory pass of plan version {version} (registration {hash}) decides {counted} of the "
           "{total} claims; the others are exploratory, each saying why (no confirmatory runs of its suite yet, "
           "amended after the confirmatory runs began, ...). The tally counts confirmatory verdicts only.")
PENDING = {True: ("Plan version {version} registers fresh seeds for a confirmatory pass (registration {hash}); "
                  "no confirmatory run is read here yet."),
           False: "The plan is not registered yet: no confirmatory pass can run."}


def subscripts(text: str) -> markupsafe.Markup:
    """A quote escaped for HTML, with the papers' own subscripts (``<sub>...</sub>``, as the claims files
    transcribe them) kept as subscripts: 'q-FedAvg<sub>|q=5.0</sub>' reads q-FedAvg with |q=5.0 below."""
    escaped = str(markupsafe.escape(text))
    return markupsafe.Markup(escaped.replace("&lt;sub&gt;", "<sub>").replace("&lt;/sub&gt;", "</sub>"))


def exploratory_text(plan: LedgerPlan, passes: list[ClaimPasses]) -> str:
    """Why the page's verdicts are exploratory ("" when every active claim's confirmatory verdict
    counts: read from the pass's fresh seeds, under one registration, not amended since)."""
    active = [entry for entry in passes if entry.claim.retired is None]
    if active and all(entry.counted for entry in active):
        return ""
    if any(entry.confirmatory is not None for entry in active):
        counted = sum(entry.counted for entry in active)
        return PARTIAL.format(counted=counted, total=len(active), version=plan.version,
                              hash=plan.registered_hash[:12] or "(none)")
    pending = PENDING[bool(plan.registered_hash)].format(version=plan.version, hash=plan.registered_hash[:12])
    return EXPLORATORY.format(version=plan.version, registered=plan.registered or "not yet registered",
                              pending=pending)


def claims_section(claims: list[ledger.Claim], store: StoreContents, tables: list, paper_root: Path,
                   progress: Progress, strict: bool = False) -> dict | None:
    """The claims table's context (and its CSV / JSON exports); None when no suite of the store
    is named by a claim (a build of other experiments shows no empty ledger)."""
    suites_read = {run.suite for run in store.runs}
    named = {c.offline.suite for c in claims if c.offline} | {a.location.suite for c in claims for a in c.ablations}
    if not claims or not suites_read & named:
        return None
    plan = load_plan(paper_root)
    amendments = load_amendments(paper_root)
    coverage = ledger.load_coverage(paper_root)
    fresh_seeds = load_fresh_seeds(paper_root)
    changed = bool(plan.registered_hash) and registration_hash(paper_root) != plan.registered_hash
    both = evaluate_passes(claims, store.runs, plan, amendments, fresh_seeds, changed, strict=strict)
    results = [entry.exploratory for entry in both]
    suites = ledger.suite_files(paper_root)
    active = [r for r in results if r.claim.retired is None]
    counts = Counter(result.verdict for result in active)
    confirmed, waiting = passes_tally(both)
    progress(f"Claims: {len(active)} from {paper_root}/*/{ledger.FILE_NAME} under plan v{plan.version}: "
             + ", ".join(f"{count} {name}" for name, count in counts.most_common())
             + f" (exploratory); confirmatory: {sum(confirmed.values())} counted"
             + "".join(f", {count} {name}" for name, count in confirmed.most_common())
             + f"; {sum(r.fragile for r in active)} fragile, {sum(r.amended for r in active)} amended, "
             f"{len(results) - len(active)} retired; {len(amendments)} amendments")
    exploratory = exploratory_text(plan, both)
    ordered = active + [r for r in results if r.claim.retired is not None]
    by_claim = {entry.claim.id: entry for entry in both}
    seen_seeds = ledger.seeds_text(range(plan.default_seeds))
    fresh_text = ledger.seeds_text(fresh_seeds) if fresh_seeds else "no fresh seeds registered"
    # both passes where the ledger registers a confirmatory pass or the store holds its runs; a ledger
    # of one's own without either keeps one verdict per claim
    two_passes = bool(fresh_seeds) or any(e.confirmatory is not None for e in both)
    rows = [ledger.with_passes(row, by_claim[row.claim_id], seen_seeds, fresh_text) if two_passes else row
            for row in ledger.claim_rows(ordered, tables, suites, plan)]
    papers = {c.paper: c.name for c in claims}
    return dict(rows=rows, counts=counts.most_common(), active=len(active), retired_count=len(results) - len(active),
                confirmed=confirmed.most_common(), confirmed_total=sum(confirmed.values()),
                waiting=waiting.most_common(), any_confirmatory=any(e.confirmatory is not None for e in both),
                seen_seeds=seen_seeds, fresh_seeds=fresh_text, two_passes=two_passes,
                disagree=sum(row.agreement == "disagree" for row in rows if not row.retired),
                fragile=sum(r.fragile for r in active), amended=sum(r.amended for r in active),
                problems=ledger.claim_problems(claims, suites),
                coverage_problems=ledger.coverage_problems(claims, coverage) if coverage else [],
                coverage=[(papers.get(p, p), [e for e in coverage if e.paper == p])
                          for p in dict.fromkeys(e.paper for e in coverage)],
                plan=plan, amendments=amendments, primary_label=point_label(plan.primary_point),
                sensitivity_labels=", ".join(point_label(p) for p in plan.sensitivity_points) or "none",
                exploratory=exploratory, scale=ledger.tally_scale(active),
                over_rounds_labels=", ".join(OVER_ROUNDS_LABELS[r] for r in plan.over_rounds_sensitivity) or "none",
                over_rounds_primary=OVER_ROUNDS_LABELS[plan.over_rounds_primary],
                csv=ledger.export_csv(results),
                json=ledger.export_json(results, plan, amendments, both if two_passes else ()),
                summary_csv=_csv(ledger.summary_rows(results, both if two_passes else ())))


def _csv(rows: list[dict]) -> str:
    import csv
    import io

    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return out.getvalue()


def no_ledger_reason(claims: list[ledger.Claim], store: StoreContents) -> str:
    """Why a build shows no claims ledger: none of the suites read is one a claim names."""
    named = sorted({c.offline.suite for c in claims if c.offline})
    read = sorted({run.suite for run in store.runs})
    return (f"No claims ledger: the claims test the suites {', '.join(named[:6])}{' ...' if len(named) > 6 else ''}, "
            f"and this store holds {', '.join(read) or 'no runs'}. Run one of them "
            "(e.g. fl-benchmarks run fedfv/offline --jobs 2) into this store to see its claims tested.")


def build_site(
    tracking_uri: str,
    out: Path = DEFAULT_OUT,
    experiments: list[str] | None = None,
    paper_root: Path = DEFAULT_ROOT,
    progress: Progress = print,
    from_export: list[Path] | None = None,
    command: str | None = None,
    strict: bool | None = None,
) -> Path:
    """Read the store (or the exports ``from_export``: runs without their client-level artifacts),
    write the site into ``out``; returns the path of ``index.html``. ``command``: the command the
    footer names (default: as the user ran it); ``strict``: the claims ledger refuses what the
    published site must not show (default: when ``out`` is the published site)."""
    check_output(Path(out))
    claims = ledger.load_claims(paper_root)  # a malformed ledger is refused before the store is read
    load_plan(paper_root), load_amendments(paper_root), ledger.load_coverage(paper_root)  # and the plan
    store = (export_reading.read_export(from_export, experiments, progress) if from_export
             else load_runs(tracking_uri, experiments, progress))
    paper_numbers, warnings = load_paper_numbers(paper_root)
    for warning in warnings:
        progress(f"warning: {warning}")
    if paper_numbers:
        progress(f"Read {len(paper_numbers)} reported numbers from {paper_root}/*/paper_numbers.yaml")
    tables = build_tables(store.runs, paper_numbers)
    unmatched = unmatched_paper_numbers(paper_numbers, tables)
    info = provenance(store, command, from_export=bool(from_export))
    html, markdown = environment()

    staging = prepare_output(Path(out))
    try:
        bench_dir = staging / "benchmarks"
        bench_dir.mkdir()
        for number, table in enumerate(tables, start=1):
            figures = write_figures(table, bench_dir / table.slug)
            context = dict(
                table=table, info=info, figures=[(f"{table.slug}/{name}", caption) for name, caption in figures],
                leaderboard=leaderboard_view(table), problems=problem_runs_view(table), runs=runs_view(table),
                comparison=comparison_view(table) if table.comparisons else None,
            )
            (bench_dir / f"{table.slug}.html").write_text(html.get_template("benchmark.html").render(**context))
            (bench_dir / f"{table.slug}.md").write_text(markdown.get_template("benchmark.md.j2").render(**context))
            progress(f"  table {number}/{len(tables)}: {table.suite} {table.key} "
                     f"({len(table.rows)} configurations, {len(table.runs)} runs, {len(figures)} figures)")
        summaries = summarize(tables, paper_numbers)
        claims_context = claims_section(claims, store, tables, paper_root, progress,
                                        strict=Path(out).resolve() == PUBLISHED_SITE.resolve() if strict is None
                                        else strict)
        if claims_context is not None:
            (staging / "claims.csv").write_text(claims_context.pop("csv"))
            (staging / "claims.json").write_text(claims_context.pop("json"))
            (staging / "claims_summary.csv").write_text(claims_context.pop("summary_csv"))
        downloads = export.write_site_files(store.runs, tables, staging, progress)  # the export, to download
        context = dict(
            info=info, tables=tables, store=store, index=index_view(tables),
            suites=[(summary, matrix_view(summary, f"matrix-{number}"),
                     gains_view(summary, f"gains-{number}") if summary.gains else None,
                     [(group, control_view(group, f"controls-{number}-{k}"))
                      for k, group in enumerate(summary.control_groups, start=1)])
                    for number, summary in enumerate(summaries, start=1)],
            unmatched=[
                (paper, paper_numbers_view([n for n in unmatched if n.paper == paper], {t.benchmark for t in tables},
                                           f"paper-numbers-{paper}"))
                for paper in sorted({n.paper for n in unmatched})
            ],
            num_runs=len(store.runs),
            claims=claims_context,
            no_ledger=no_ledger_reason(claims, store) if claims_context is None and claims else "",
            from_export=[evidence.shown(p) for p in from_export or []],
            downloads=downloads,
        )
        (staging / "index.html").write_text(html.get_template("index.html").render(**context))
        (staging / "index.md").write_text(markdown.get_template("index.md.j2").render(**context))
        write_marker(staging, command)  # last: the manifest lists every file of the build
        publish(staging, Path(out))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    index = Path(out).resolve() / "index.html"
    progress(f"Wrote {len(tables)} benchmark page(s) from {len(store.runs)} runs.")
    progress(f"Leaderboard: {index.parent}\nOpen it in a browser: {index.as_uri()}")
    return index


def publish_site(out: Path | None = None, exports: list[Path] | None = None, paper_root: Path = DEFAULT_ROOT,
                 progress: Progress = print) -> Path:
    """``fl-leaderboard publish``: the published site from the committed exports (``evidence/``, every
    suite folder of both passes), written into ``out`` (default: ``leaderboard_site/``) through a
    staging folder renamed into place, so a failed build leaves the old site. Two builds from the
    same exports, code and library releases are byte-identical; ``tests/leaderboard/test_published_site.py``
    checks the committed site against one."""
    try:
        exports = exports or evidence.published_exports()
    except FileNotFoundError as error:
        raise LeaderboardError(str(error)) from None
    return build_site("", PUBLISHED_SITE if out is None else out, None, paper_root, progress,
                      from_export=[Path(p) for p in exports], command=PUBLISH_COMMAND, strict=True)
