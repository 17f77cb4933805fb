"""The built leaderboard in a real headless Chromium (tox env ``browser``).

Needs Debian's ``chromium`` (``apt-get install chromium``) and the Python ``playwright`` package,
which drives that binary (``executable_path``; Playwright's own browser downloads are never used).
Skipped, with the reason, when either is missing.

The MLflow store is written through the MLflow client (runs with the tags of the benchmark runner and
``fl-lightning fit``, ``task`` and ``client_test`` included; no torch needed): two benchmarks, three
configurations x three seeds, a FAILED run, a configuration that logged no fairness metrics. On the
first benchmark FedAvg is clearly ahead (★); on the second FedAvg and FedFV are within seed noise
(a tie, ≈). The site is built with ``python -m leaderboard build`` in-process, then opened from
``file://``: the index matrix renders with ranks, the tie shows as a tie, every benchmark page is
reached by following links, every table has rows, sorting by clicking a header reorders the rows,
every image loads, no script error; screenshots of the index and a benchmark page are saved in
``$BROWSER_SCREENSHOT_DIR`` (or the test's temporary folder) and their folder printed.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from chromium import MISSING, chromium_path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the leaderboard package lives at the repository root

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the Python package 'playwright' is not installed (pip install playwright)"
)


CHROMIUM = chromium_path()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason=MISSING,
)

SUITE = "browser-offline"
ROUNDS = 6
SEEDS = (0, 1, 2)
BENCHMARKS = ("mnist5k/shards-200x2/p0.1/fl_mlp", "synthetic-1-1/power_law/full/fl_logreg")
# benchmark -> config -> (final mean accuracy, spread of the client accuracies): the most accurate is
# the least fair, so sorting by std really reorders the rows. FedAvg leads clearly on the first
# benchmark; on the second FedAvg and FedFV are within seed noise (a tie).
CONFIGS = {
    BENCHMARKS[0]: {"FedAvg": (0.80, 0.12), "FedFV(alpha=0.1,tau=1)": (0.72, 0.06), "qFedAvg(q=1)": (0.64, 0.04)},
    BENCHMARKS[1]: {"FedAvg": (0.80, 0.12), "FedFV(alpha=0.1,tau=1)": (0.795, 0.06), "qFedAvg(q=1)": (0.70, 0.04)},
}
SEED_SHIFT = {0: -0.01, 1: 0.0, 2: 0.01}  # each seed's mean accuracy moves by this: the seed noise


def client_accuracies(mean: float, spread: float, seed: int, num_clients: int = 20) -> np.ndarray:
    """Client accuracies whose mean is ``mean`` (to the clipping) and whose spread is ``spread``."""
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal(num_clients)
    return np.clip(mean + spread * (noise - noise.mean()), 0.0, 1.0)


def fairness_summary(acc: np.ndarray) -> dict[str, float]:
    ordered = np.sort(acc)
    k5, k10 = max(1, math.ceil(0.05 * len(acc))), max(1, math.ceil(0.1 * len(acc)))
    cosine = acc.sum() / (np.linalg.norm(acc) * math.sqrt(len(acc)))
    return {
        "test_acc_mean": acc.mean(), "test_acc_std": acc.std(), "test_acc_var": acc.var(),
        "test_acc_min": acc.min(), "test_acc_max": acc.max(),
        "test_acc_worst5": ordered[:k5].mean(), "test_acc_best5": ordered[-k5:].mean(),
        "test_acc_worst10": ordered[:k10].mean(), "test_acc_best10": ordered[-k10:].mean(),
        "test_acc_angle": math.acos(min(1.0, cosine)), "test_acc_jain": acc.sum() ** 2 / (len(acc) * (acc**2).sum()),
    }


def log_run(client, experiment_id: str, benchmark: str, config: str, seed: int, *, status: str = "FINISHED",
            rounds: int = ROUNDS, fairness: bool = True, error: str | None = None,
            extra_tags: dict[str, str] | None = None, shift: float = 0.0) -> str:
    from mlflow.entities import Metric, Param

    dataset, partition, participation, model = benchmark.split("/")
    task = json.dumps({"source": dataset, "partition": partition, "partition_params": {}, "num_clients": 20,
                       "fraction": 1.0 if participation == "full" else 0.1, "model": model, "num_rounds": ROUNDS,
                       "local_epochs": 1, "batch_size": 10, "test_mode": "local", "local_test_fraction": 0.2,
                       "dropout_prob": 0.0}, sort_keys=True)
    tags = {"suite": SUITE, "scale": "offline", "paper": "fedfv", "benchmark": benchmark,
            "cell": f"{benchmark}/{config}", "algorithm_config": config, "algorithm": config.split("(")[0],
            "dataset": dataset, "partition": partition, "partition_params": "{}",
            "num_clients": "20", "participation": participation, "model": model,
            "seed": str(seed), "git_sha": "0123456789abcdef0123456789abcdef01234567",
            "task": task, "task_key": hashlib.sha256(task.encode()).hexdigest()[:12], "client_test": "local",
            "client_test_size": "local: 3-9 samples per client (median 5)", "per_client_models": "false",
            "suite_description": "Browser fixture: two benchmarks, three configurations, three seeds."}
    if error:
        tags["error"] = error
    tags |= extra_tags or {}
    run = client.create_run(experiment_id, tags=tags)
    run_id = run.info.run_id
    final_mean, spread = CONFIGS[benchmark][config]
    final_mean += SEED_SHIFT.get(seed % 1000, 0.0) + shift
    metrics, timestamp = [], 1_700_000_000_000
    for step in range(1, rounds + 1):
        progress = step / ROUNDS
        for name, value in (("train_loss", 2.0 * (1.2 - progress)), ("client_time_s", 0.2 + 0.01 * seed),
                            ("server_time_s", 0.01 * (1 + len(config) % 3)),
                            ("conflicts_model", float((len(config) + step) % 3)), ("conflicts_layer_mean", 0.5)):
            metrics.append(Metric(name, value, timestamp + step, step))
        acc = client_accuracies(final_mean * (0.6 + 0.4 * progress), spread * (1.4 - 0.4 * progress), 100 * seed + step)
        summary = fairness_summary(acc)
        if not fairness:
            summary = {"test_acc_mean": summary["test_acc_mean"]}
        metrics += [Metric(name, float(value), timestamp + step, step) for name, value in summary.items()]
    client.log_batch(run_id, metrics=metrics, params=[Param("lr", "0.1"), Param("num_rounds", str(ROUNDS))])
    client.log_dict(run_id, {"status": "finished" if status == "FINISHED" else f"failed: {error}",
                             "rounds_completed": rounds,
                             "clients": {"client": list(range(20)), "test_accuracy": acc.tolist()}},
                    "clients/final_client_metrics.json")
    client.set_terminated(run_id, status)
    return run_id


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from mlflow.tracking import MlflowClient

    from leaderboard.__main__ import main as leaderboard_main

    tmp = tmp_path_factory.mktemp("browser")
    uri = f"sqlite:///{tmp / 'runs.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment(SUITE, artifact_location=(tmp / "artifacts").as_uri())
    for benchmark in BENCHMARKS:
        for config in CONFIGS[benchmark]:
            for seed in SEEDS:
                log_run(client, experiment_id, benchmark, config, seed,
                        fairness=not (benchmark == BENCHMARKS[1] and config == "qFedAvg(q=1)"))
    log_run(client, experiment_id, BENCHMARKS[0], "FedAvg", 3, status="FAILED", rounds=2,
            error="RuntimeError: client losses became NaN at round 2")
    papers = tmp / "papers" / "fixture"
    papers.mkdir(parents=True)
    (papers / "paper_numbers.yaml").write_text(
        f"- {{benchmark_setting: 'the same setting (fixture)', matches_benchmark: '{BENCHMARKS[0]}', "
        "algorithm_config: FedAvg, metrics: {test_acc_mean: 0.81, test_acc_var_percent2: 150.0}, source: Fixture T1}\n"
        "- {benchmark_setting: 'CIFAR-10, 100 clients (fixture)', matches_benchmark: null, "
        "algorithm_config: FedAvg, metrics: {test_acc_mean: 0.4685}, source: FedFV Table 2}\n")
    # the claims ledger: FedAvg ahead of FedFV on the first benchmark (paired, 3 seeds), and a suite file
    # that defines the benchmark, so the claim is judged and links to its evidence
    (papers / "offline.yaml").write_text(  # a suite file as the runner reads it
        f"suite: {SUITE}\npaper: fixture\nscale: offline\nbase: {{}}\n"
        f"benchmarks:\n  - name: {BENCHMARKS[0]}\n  - name: {BENCHMARKS[1]}\n"
        "algorithms:\n  - class_path: fl_lightning.algorithms.FedAvg\n")
    (papers / "claims.yaml").write_text(
        "paper: fixture\nclaims:\n"
        "  - {id: fixture-mean, where: Table 1, claim: FedAvg is more accurate than FedFV, quantity: mean,\n"
        f"     direction: greater, offline: {{suite: {SUITE}, benchmark: {BENCHMARKS[0]}}},\n"
        "     quote: 'FedAvg beats FedFV (Table 1).', bar: 'direction only',\n"
        "     comparisons: [{treatment: FedAvg, baseline: 'FedFV(alpha=0.1,tau=1)', paper: [80.0, 72.0]}],\n"
        "     reason: 'A deliberately long reason that must wrap inside its cell at 800 px. '}\n"
        "  - {id: fixture-old, where: Table 1, claim: FedFV is more accurate than FedAvg, quantity: mean,\n"
        f"     direction: greater, offline: {{suite: {SUITE}, benchmark: {BENCHMARKS[0]}}},\n"
        "     quote: 'x', bar: 'direction only', retired: {date: 2026-11-20, reason: 'our own reading'},\n"
        "     comparisons: [{treatment: 'FedFV(alpha=0.1,tau=1)', baseline: FedAvg}]}\n"
        "coverage:\n  - {item: Table 1, claims: [fixture-mean, fixture-old]}\n"
        "  - {item: Fig. 1, not_claimed: a drawing}\n")
    (tmp / "papers" / "ledger_amendments.yaml").write_text(
        "amendments:\n  - {id: A1, date: 2026-11-20, target: fixture-old, before: in the ledger, after: retired,\n"
        "     reason: our own reading, results_seen: true}\n"
        "  - {id: A2, date: 2026-11-21, target: 'plan: seeds', before: 3, after: 10, reason: too few, "
        "results_seen: true}\n")
    out = tmp / "site"
    assert leaderboard_main(["build", "--tracking-uri", uri, "--out", str(out),
                             "--paper-numbers", str(tmp / "papers")]) == 0
    return out


def open_page(context, url: str):
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(url, wait_until="load")
    return page, errors


def check_tables_have_rows(page) -> int:
    counts = page.eval_on_selector_all("table", "tables => tables.map(t => [t.id, t.tBodies[0].rows.length])")
    assert counts, "no table on the page"
    for table_id, rows in counts:
        assert rows > 0, f"table {table_id} has no rows"
    return len(counts)


def check_images_loaded(page) -> int:
    images = page.eval_on_selector_all("img",
                                       "imgs => imgs.map(i => [i.getAttribute('src'), i.complete, i.naturalWidth])")
    for src, complete, width in images:
        assert complete and width > 0, f"image {src} did not load"
    return len(images)


def column_values(page, table_id: str, key: str) -> list[str]:
    index = page.eval_on_selector(
        f"[id='{table_id}']", f"t => Array.from(t.tHead.rows[0].cells).findIndex(c => c.dataset.key === '{key}')")
    assert index >= 0, f"no column {key} in {table_id}"
    return page.eval_on_selector(
        f"[id='{table_id}']", f"t => Array.from(t.tBodies[0].rows).map(r => r.cells[{index}].dataset.sort)")


def click_header(page, table_id: str, key: str) -> str:
    header = page.locator(f"[id='{table_id}'] thead th[data-key='{key}']")
    header.click()
    return header.get_attribute("aria-sort")


def assert_sorted(values: list[str], direction: str, numeric: bool) -> None:
    present = [v for v in values if v != ""]
    assert values[: len(present)] == present, f"missing values are not last: {values}"
    keys = [float(v) for v in present] if numeric else [v.lower() for v in present]
    assert keys == sorted(keys, reverse=direction == "descending"), f"{direction}: {values}"


def matrix_cells(page) -> dict[str, dict[str, dict]]:
    """The index matrix as {configuration: {benchmark slug: {text, classes, title}}}, read in the browser."""
    return page.eval_on_selector("table[id^='matrix-']", """t => {
        const keys = Array.from(t.tHead.rows[0].cells).map(c => c.dataset.key);
        const out = {};
        for (const row of t.tBodies[0].rows) {
            const cells = {};
            Array.from(row.cells).forEach((c, i) => { cells[keys[i]] = {text: c.innerText,
                classes: Array.from(c.classList), title: c.title}; });
            out[row.cells[0].innerText.trim()] = cells;
        }
        return out;
    }""")


def benchmark_slug(page, benchmark: str) -> str:
    return page.eval_on_selector_all(
        "table[id^='matrix-'] thead th", f"ths => ths.filter(th => th.title.startsWith('{benchmark}:'))"
        ".map(th => th.dataset.key)")[0]


def test_index_matrix_shows_ranks_and_a_tie_as_a_tie(site, browser_context, capsys):
    page, errors = open_page(browser_context, (site / "index.html").as_uri())
    assert page.locator("table[id^='matrix-']").count() == 1  # one suite
    assert page.locator("table[id^='matrix-']").is_visible()
    cells = matrix_cells(page)
    assert set(cells) == set(CONFIGS[BENCHMARKS[0]])
    clear, tied = benchmark_slug(page, BENCHMARKS[0]), benchmark_slug(page, BENCHMARKS[1])

    # a clear lead with 3 seeds: no ★ below the ledger plan's 10 seeds; every cell shows its rank and n
    fedavg = cells["FedAvg"][clear]
    assert "best" not in fedavg["classes"] and "★" not in fedavg["text"] and "#1/3" in fedavg["text"]
    assert "n=3" in fedavg["text"] and "p < " in fedavg["title"]
    for config, expected_rank in (("FedFV(alpha=0.1,tau=1)", "#2/3"), ("qFedAvg(q=1)", "#3/3")):
        cell = cells[config][clear]
        assert expected_rank in cell["text"] and "★" not in cell["text"] and "≈" not in cell["text"].split("\n")[0]

    # within seed noise: FedAvg and FedFV are tied leaders (≈), no star in that column's headline
    for config in ("FedAvg", "FedFV(alpha=0.1,tau=1)"):
        cell = cells[config][tied]
        assert "tie" in cell["classes"] and "≈" in cell["text"] and "best" not in cell["classes"], cell
        assert "tied" in cell["title"]
    assert "#1/3" in cells["FedAvg"][tied]["text"] and "#2/3" in cells["FedFV(alpha=0.1,tau=1)"][tied]["text"]
    assert not any(c[tied]["text"].split("worst")[0].count("★") for c in cells.values())
    assert "qFedAvg" not in "".join(k for k, c in cells.items() if "tie" in c[tied]["classes"])

    # the rules are stated on the page, in words
    rules = page.inner_text("#rules-list")
    assert "Welch" in rules and "p < 0.05" in rules and "Mean client accuracy" in rules and "global" in rules
    assert "Browser fixture: two benchmarks" in page.inner_text("body")  # the suite's description
    assert not errors, f"script errors: {errors}"


def test_pages_links_tables_images_and_sorting(site, browser_context, capsys):
    index_url = (site / "index.html").as_uri()
    page, errors = open_page(browser_context, index_url)
    assert "fl-lightning leaderboard" in page.title()
    assert "OFFLINE-SCALE" in page.inner_text("body")
    check_tables_have_rows(page)
    check_images_loaded(page)
    links = page.eval_on_selector_all("table#benchmarks a[href^='benchmarks/']",
                                      "links => links.map(a => a.getAttribute('href'))")
    assert len(links) == len(BENCHMARKS)
    all_links = set(page.eval_on_selector_all("a[href^='benchmarks/']",
                                              "links => links.map(a => a.getAttribute('href'))"))
    assert all_links == set(links)  # the matrix headers link to the same pages

    for link in links:
        page.goto(index_url)
        page.click(f"table#benchmarks a[href='{link}']")  # follow the link as a reader would
        page.wait_for_load_state("load")
        assert page.url.endswith(link)
        tables = check_tables_have_rows(page)
        assert tables >= 2  # the leaderboard and all runs (+ papers, failed runs where there are some)
        assert check_images_loaded(page) == 3  # curves, client distribution, Pareto
        assert "n = 3" in page.inner_text("#seeds") and "local" in page.inner_text("#client-test")
        table_id = page.eval_on_selector("table[id^='leaderboard-']", "t => t.id")
        configs_before = column_values(page, table_id, "config")
        assert sorted(configs_before) == sorted(CONFIGS[BENCHMARKS[0]])

        reordered = False
        for key in ("test_acc_std", "test_acc_mean", "time_per_round", "config"):
            before = column_values(page, table_id, "config")
            direction = click_header(page, table_id, key)
            assert direction in ("ascending", "descending")
            assert_sorted(column_values(page, table_id, key), direction, numeric=key != "config")
            reordered |= column_values(page, table_id, "config") != before
            second = click_header(page, table_id, key)  # a second click reverses the order
            assert second != direction
            assert_sorted(column_values(page, table_id, key), second, numeric=key != "config")
        assert reordered, "no click changed the order of the rows"
    assert not errors, f"script errors: {errors}"

    folder = Path(os.environ.get("BROWSER_SCREENSHOT_DIR") or site.parent / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    page.goto(index_url)
    page.click(f"table#benchmarks a[href='{links[0]}']")
    page.wait_for_load_state("load")
    shot = folder / "leaderboard_benchmark_page.png"
    page.screenshot(path=str(shot), full_page=True)
    page.goto(index_url)
    page.screenshot(path=str(folder / "leaderboard_index.png"), full_page=True)
    assert shot.stat().st_size > 10_000
    with capsys.disabled():
        print(f"\nscreenshots of the leaderboard: {folder}")


def test_missing_values_sort_last_and_failed_run_is_shown(site, browser_context):
    page, errors = open_page(browser_context, (site / "benchmarks").as_uri() + "/"
                             + next(p.name for p in (site / "benchmarks").glob("synthetic*.html")))
    table_id = page.eval_on_selector("table[id^='leaderboard-']", "t => t.id")
    for _ in range(2):  # both directions: "—" stays at the bottom
        direction = click_header(page, table_id, "test_acc_angle")
        values = column_values(page, table_id, "test_acc_angle")
        assert values[-1] == "" and values.count("") == 1
        assert_sorted(values, direction, numeric=True)
    assert page.locator(f"[id='{table_id}'] td.tie .marker").count() >= 2  # the tied leaders
    page.goto((site / "benchmarks").as_uri() + "/"
              + next(p.name for p in (site / "benchmarks").glob("mnist5k*.html")))
    problems = page.inner_text("table[id^='problems-']")
    assert "FAILED" in problems and "NaN at round 2" in problems
    assert page.locator("td.best .marker").count() == 0  # 3 seeds: no ★ (the plan's star_min_seeds is 10)
    assert not errors, f"script errors: {errors}"


def test_claims_table_renders_with_a_verdict_and_links_to_its_evidence(site, browser_context):
    page, errors = open_page(browser_context, (site / "index.html").as_uri())
    group = page.locator("#claims-table tbody#claim-fixture-mean")
    assert group.count() == 1
    row = group.locator("tr.claim")
    assert row.locator(".verdict").inner_text().startswith("reproduced")
    details = group.locator("details")
    assert not details.locator("dl").is_visible()  # compact: the details are folded
    details.locator("summary").click()
    assert details.locator("dl").is_visible()
    text = group.inner_text()
    # FedAvg − FedFV at the plan's primary point (the final evaluation), paired over 3 seeds, at its real level
    assert "FedAvg − FedFV(alpha=0.1,tau=1): +" in text and "(95 % CI)" in text and "3 seeds" in text
    assert "paper +8.00" in text and "FedAvg beats FedFV (Table 1)." in text
    # the index lists the claims before the rules
    assert page.evaluate("document.getElementById('claims').compareDocumentPosition(document.getElementById('rules'))"
                         " & Node.DOCUMENT_POSITION_FOLLOWING")
    link = group.locator("a.evidence").first
    assert link.inner_text() == BENCHMARKS[0]
    link.click()
    page.wait_for_load_state("load")
    assert page.url.endswith(".html") and "/benchmarks/" in page.url
    check_tables_have_rows(page)
    assert BENCHMARKS[0] in page.locator("h1").inner_text()
    assert not errors, errors
    exported = (site / "claims.csv").read_text().splitlines()
    assert len(exported) == 1 + 4 * len(SEEDS)  # both claims (one retired, still computed), both sides


@pytest.mark.parametrize("width", [800, 1400])
def test_the_claims_table_fits_the_window_and_lists_amendments_and_retired_claims(site, browser_context, width):
    page, errors = open_page(browser_context, (site / "index.html").as_uri())
    page.set_viewport_size({"width": width, "height": 900})
    for summary in page.locator("#claims-table details summary").all():
        summary.click()  # every claim's details open: the widest the table gets
    wrap = page.eval_on_selector("#claims-table", "t => [t.scrollWidth, t.parentElement.clientWidth]")
    assert wrap[0] <= wrap[1] + 1, f"the claims table scrolls sideways at {width} px: {wrap}"
    # a command never breaks inside a word: each word of a command sits on one line
    broken = page.eval_on_selector_all("#claims-table code.command", """codes => codes.filter(c => {
        const range = document.createRange(); const text = c.firstChild; if (!text) return false;
        let previous = null;
        for (let i = 0; i < text.length; i++) {
            range.setStart(text, i); range.setEnd(text, i + 1);
            const top = range.getBoundingClientRect().top;
            if (previous !== null && top > previous + 2
                && text.data[i - 1] !== ' ' && text.data[i] !== ' ') return true;
            previous = top;
        }
        return false;
    }).length""")
    assert broken == 0
    amendments = page.inner_text("#amendments-table")
    assert "A1" in amendments and "fixture-old" in amendments and "A2" in amendments
    retired = page.locator("#claims-table tbody#claim-fixture-old")
    assert "retired" in retired.inner_text() and "our own reading" in retired.inner_text()
    assert "amended" in retired.locator("tr.claim").inner_text()
    assert "1 retired not counted" in page.inner_text("#claims")
    shots = os.environ.get("BROWSER_SCREENSHOT_DIR")
    if shots:
        page.locator("#claims").screenshot(path=str(Path(shots) / f"claims-{width}.png"))
    assert not errors, errors
