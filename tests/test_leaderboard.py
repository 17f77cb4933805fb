"""The leaderboard end to end: real `fl-lightning fit` runs in a temporary MLflow store -> the site.

The store (built once for the module): FedAvg and FedProx(mu=1.0) on 6 clients of the digits
(logistic regression, 3 rounds of 5 full-batch local epochs: a second per fit), two seeds each, through the real CLI with the runner's tags passed to MLFlowLogger; a third
FedProx seed marked FAILED (with an error tag and a misleading metric that must not count);
a RUNNING run (unfinished); a second benchmark with one finished run that logged only its mean
accuracy (missing metrics -> "—"). Expected numbers are recomputed here from the MLflow API.
"""

from __future__ import annotations

import math
import re
import statistics
import sys
from contextlib import redirect_stdout
from html.parser import HTMLParser
from io import StringIO
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from fl_lightning.cli import main as fit_main

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the leaderboard package lives at the repository root

from leaderboard.__main__ import main as leaderboard_main  # noqa: E402
from leaderboard.runs import using_tracking_uri  # noqa: E402
from leaderboard.tables import METRIC_COLUMNS, MISSING, slugify  # noqa: E402

SUITE = "demo-offline"
BENCHMARK = "digits/iid/full/fl_logreg"
SPARSE_BENCHMARK = "digits/iid/full/fl_mlp"
CONFIGS = {"FedAvg": [], "FedProx(mu=1.0)": ["--model=FedProx", "--model.mu=1.0"]}
SEEDS = (0, 1)
FAILED_ERROR = "RuntimeError: client losses became NaN at round 2"
BEST = {c.key: c.better for c in METRIC_COLUMNS if c.better}


def runner_tags(config: str, seed: int, benchmark: str = BENCHMARK) -> dict[str, str]:
    return {"suite": SUITE, "scale": "offline", "paper": "fedfv", "benchmark": benchmark,
            "cell": f"{benchmark}/{config}", "algorithm_config": config, "seed": str(seed)}


def fit(uri: str, config: str, seed: int) -> None:
    tags = ", ".join(f"{k}: '{v}'" for k, v in runner_tags(config, seed).items())
    fit_main([
        "fit",
        f"--trainer.logger.init_args.tracking_uri={uri}",
        f"--trainer.logger.init_args.experiment_name={SUITE}",
        f"--trainer.logger.init_args.tags={{{tags}}}",
        *CONFIGS[config],
        "--model.num_rounds=3", "--model.eval_every=1", "--model.fraction=1.0",
        "--model.backbone=fl_logreg", "--model.batch_size=null", "--model.local_epochs=5", "--model.lr=0.5",
        f"--model.seed={seed}",
        f"--seed_everything={seed}",
        "--data.source=digits", "--data.num_clients=6", "--data.partition=iid", "--data.partition_params={}",
        f"--data.seed={seed}",
    ])


PAPER_YAML = """\
- benchmark_setting: "digits, 6 clients, IID, full participation, logistic regression (test fixture)"
  matches_benchmark: digits/iid/full/fl_logreg
  algorithm_config: FedAvg
  metrics: {test_acc_mean: 0.9, test_acc_var_percent2: 12.57}
  source: Fixture Table 1
- benchmark_setting: "CIFAR-10, 100 clients, 200 shards x 2, FFN, 10% sampled, 2000 rounds"
  matches_benchmark: null
  algorithm_config: FedFV(alpha=0.1,tau=10)
  metrics: {test_acc_mean: 0.5042, test_acc_worst5: 0.3224}
  source: FedFV Table 2
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A real MLflow store: the fits, a FAILED run, a RUNNING run, a sparse second benchmark."""
    tmp = tmp_path_factory.mktemp("leaderboard")
    uri = f"sqlite:///{tmp / 'runs.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)  # checkpoints and artifacts land in the temporary folder
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        for config in CONFIGS:
            for seed in SEEDS:
                fit(uri, config, seed)
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(SUITE).experiment_id

        failed = client.create_run(experiment, tags={**runner_tags("FedProx(mu=1.0)", 2), "algorithm": "FedProx",
                                                     "error": FAILED_ERROR})
        client.log_metric(failed.info.run_id, "test_acc_mean", 0.0123, step=1)  # must not enter the mean
        client.log_metric(failed.info.run_id, "client_time_s", 0.5, step=1)
        client.set_terminated(failed.info.run_id, "FAILED")

        running = client.create_run(experiment, tags={**runner_tags("FedAvg", 2), "algorithm": "FedAvg"})
        client.log_metric(running.info.run_id, "test_acc_mean", 0.99, step=1)

        sparse = client.create_run(experiment, tags={**runner_tags("FedAvg", 0, SPARSE_BENCHMARK),
                                                     "algorithm": "FedAvg"})
        client.log_metric(sparse.info.run_id, "test_acc_mean", 0.75, step=3)
        client.set_terminated(sparse.info.run_id, "FINISHED")

        papers = tmp / "papers"
        (papers / "fixture").mkdir(parents=True)
        (papers / "fixture" / "paper_numbers.yaml").write_text(PAPER_YAML)
    return {"uri": uri, "tmp": tmp, "papers": papers, "failed": failed.info.run_id,
            "running": running.info.run_id, "sparse": sparse.info.run_id}


@pytest.fixture(scope="module")
def site(store):
    out = store["tmp"] / "site"
    printed = StringIO()
    with redirect_stdout(printed):
        code = leaderboard_main(["build", "--tracking-uri", store["uri"], "--out", str(out),
                                 "--paper-numbers", str(store["papers"])])
    assert code == 0
    return {"out": out, "stdout": printed.getvalue()}


# --- reading the built pages ---------------------------------------------------------------

class Page(HTMLParser):
    """Tables (by id: headers, rows of cells with text, classes, data-sort) and images of a page."""

    def __init__(self, text: str):
        super().__init__()
        self.tables: dict[str, dict] = {}
        self.images: list[str] = []
        self.links: list[str] = []
        self._table = None
        self._cell = None
        self._in_head = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self._table = self.tables.setdefault(attrs.get("id", f"table{len(self.tables)}"),
                                                 {"headers": [], "rows": []})
        elif tag == "thead":
            self._in_head = True
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._table is not None:
            self._cell = {"text": "", "classes": (attrs.get("class") or "").split(), "sort": attrs.get("data-sort"),
                          "key": attrs.get("data-key")}
        elif tag == "img":
            self.images.append(attrs["src"])
        elif tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._cell["text"] = " ".join(self._cell["text"].split())
            self._row.append(self._cell)
            self._cell = None
        elif tag == "thead":
            self._in_head = False
        elif tag == "tr" and self._table is not None and self._row:
            (self._table["headers"] if self._in_head else self._table["rows"]).append(self._row)
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell["text"] += data


def read_page(path: Path) -> Page:
    return Page(path.read_text())


def benchmark_page(site, key=BENCHMARK) -> tuple[Path, Page]:
    path = site["out"] / "benchmarks" / f"{slugify(key, set())}.html"
    return path, read_page(path)


def leaderboard_table(page: Page) -> tuple[list[str], list[dict[str, dict]]]:
    table = next(t for name, t in page.tables.items() if name.startswith("leaderboard-"))
    keys = [h["key"] for h in table["headers"][0]]
    return keys, [dict(zip(keys, row)) for row in table["rows"]]


def final_value(client: MlflowClient, run_id: str, name: str) -> float | None:
    history = client.get_metric_history(run_id, name)
    return max(history, key=lambda m: (m.step, m.timestamp)).value if history else None


def search(uri: str, filter_string: str = "") -> list:
    """The runs of the suite, read with mlflow.search_runs from this store (not the global URI)."""
    with using_tracking_uri(uri):
        return mlflow.search_runs(experiment_names=[SUITE], filter_string=filter_string, output_format="list")


def expected_rows(uri: str) -> dict[str, dict[str, tuple[float, float]]]:
    """Per configuration, (mean, std over seeds) of each column, recomputed from the MLflow API."""
    client = MlflowClient(tracking_uri=uri)
    runs = search(uri, f"tags.benchmark = '{BENCHMARK}'")
    expected = {}
    for config in CONFIGS:
        finished = [r for r in runs if r.data.tags["algorithm_config"] == config and r.info.status == "FINISHED"]
        assert len(finished) == len(SEEDS)
        per_column: dict[str, list[float]] = {}
        for run in finished:
            run_id = run.info.run_id
            for column in ("test_acc_mean", "test_acc_std", "test_acc_var", "test_acc_angle",
                           "test_acc_worst5", "test_acc_best5", "test_acc_jain"):
                per_column.setdefault(column, []).append(final_value(client, run_id, column))
            conflicts = [m.value for m in client.get_metric_history(run_id, "conflicts_model")]
            per_column.setdefault("conflicts_model", []).append(statistics.fmean(conflicts))
            times = {}
            for name in ("client_time_s", "server_time_s"):
                for m in client.get_metric_history(run_id, name):
                    times[m.step] = times.get(m.step, 0.0) + m.value
            per_column.setdefault("time_per_round", []).append(statistics.fmean(times.values()))
        expected[config] = {k: (statistics.fmean(v), statistics.stdev(v)) for k, v in per_column.items()}
    return expected


# --- the tests ---------------------------------------------------------------------------------

def test_runner_tags_land_on_the_runs(store):
    runs = search(store["uri"])
    fitted = [r for r in runs if r.data.tags.get("mlflow.source.type")]  # made by the CLI, not by hand
    assert len(fitted) == len(CONFIGS) * len(SEEDS)
    for run in fitted:
        tags = run.data.tags
        assert tags["suite"] == SUITE and tags["scale"] == "offline" and tags["paper"] == "fedfv"
        assert tags["benchmark"] == BENCHMARK and tags["cell"] == f"{BENCHMARK}/{tags['algorithm_config']}"
        assert tags["algorithm_config"] in CONFIGS
        assert tags["algorithm"] == ("FedAvg" if tags["algorithm_config"] == "FedAvg" else "FedProx")
        assert tags["seed"] in {str(s) for s in SEEDS} and tags["dataset"] == "digits"
        assert tags["participation"] == "full" and tags["model"] == "fl_logreg"


def test_build_prints_progress_and_where_to_open(site):
    out = site["stdout"]
    assert "Read 7 runs from 1 experiment(s)" in out
    assert "Wrote 2 benchmark page(s) from 7 runs" in out
    assert (site["out"] / "index.html").resolve().as_uri() in out


def test_one_row_per_configuration_with_mean_and_std_over_finished_seeds(site, store):
    _, page = benchmark_page(site)
    keys, rows = leaderboard_table(page)
    assert sorted(r["config"]["text"] for r in rows) == sorted(CONFIGS)
    expected = expected_rows(store["uri"])
    columns = {c.key: c for c in METRIC_COLUMNS}
    for row in rows:
        config = row["config"]["text"]
        for key, (mean, std) in expected[config].items():
            cell, column = row[key], columns[key]
            assert math.isclose(float(cell["sort"]), mean, rel_tol=1e-9), (config, key)
            shown = f"{mean * column.scale:.{column.decimals}f} ± {std * column.scale:.{column.decimals}f}"
            assert cell["text"].replace("★", "").strip() == shown, (config, key)
        # FedProx: + the FAILED seed; FedAvg: + the RUNNING seed
        assert row["seeds"]["text"] == f"{len(SEEDS)} / {len(SEEDS) + 1}"
        assert row["rounds"]["text"] == "3 / 3"


def test_best_markers_sit_on_the_best_rows(site, store):
    _, page = benchmark_page(site)
    _, rows = leaderboard_table(page)
    expected = expected_rows(store["uri"])
    unique = 0
    for key, better in BEST.items():
        means = {config: values[key][0] for config, values in expected.items()}
        best = (max if better == "max" else min)(means.values())
        should = {c for c, m in means.items() if math.isclose(m, best, rel_tol=1e-9, abs_tol=1e-12)}
        marked = {r["config"]["text"] for r in rows if "best" in r[key]["classes"]}
        assert marked == should, key
        unique += len(should) == 1
        for row in rows:
            assert ("★" in row[key]["text"]) == (row["config"]["text"] in should), key
    assert unique >= 3  # FedAvg and FedProx(mu=1.0) really differ: the check is not only ties


def test_failed_and_unfinished_runs_are_listed(site, store):
    _, page = benchmark_page(site)
    problems = next(t for name, t in page.tables.items() if name.startswith("problems-"))
    listed = {row[0]["text"]: row for row in problems["rows"]}
    assert set(listed) == {store["failed"], store["running"]}
    failed = [c["text"] for c in listed[store["failed"]]]
    assert "FAILED" in failed and FAILED_ERROR in failed and "2" in failed
    assert any("RUNNING" in c["text"] for c in listed[store["running"]])


def test_missing_metrics_are_shown_as_a_dash(site):
    _, page = benchmark_page(site, SPARSE_BENCHMARK)
    _, rows = leaderboard_table(page)
    assert len(rows) == 1
    row = rows[0]
    assert row["test_acc_mean"]["text"] == "75.00"  # one seed: no ± std
    for key in ("test_acc_std", "test_acc_angle", "test_acc_jain", "conflicts_model", "time_per_round"):
        assert row[key]["text"] == "—" and row[key]["sort"] == ""
    assert not any("best" in cell["classes"] for cell in row.values())  # one row: nothing to rank


def test_index_has_provenance_benchmarks_and_offline_label(site, store):
    text = (site["out"] / "index.html").read_text()
    page = Page(text)
    assert "OFFLINE-SCALE" in text and SUITE in text and "Built" in text
    shas = {r.data.tags["git_sha"] for r in search(store["uri"]) if r.data.tags.get("git_sha")}
    assert shas and all(sha in text for sha in shas)
    assert "without a <code>machine</code> tag" in text  # falls back to the builder's CPU
    rows = page.tables["benchmarks"]["rows"]
    assert sorted(r[0]["text"] for r in rows) == sorted([BENCHMARK, SPARSE_BENCHMARK])
    by_key = {r[0]["text"]: [c["text"] for c in r] for r in rows}
    assert "2" in by_key[BENCHMARK] and "6" in by_key[BENCHMARK]  # configurations, runs
    assert any("FAILED 1" in c and "RUNNING 1" in c for c in by_key[BENCHMARK])
    for link in page.links:
        if link.startswith("benchmarks/"):
            assert (site["out"] / link).exists(), link


def test_paper_numbers_beside_ours_and_unmatched_ones_apart(site):
    _, page = benchmark_page(site)
    comparison = next(t for name, t in page.tables.items() if name.startswith("papers-"))
    headers = [h["text"] for h in comparison["headers"][0]]
    row = {h: c["text"] for h, c in zip(headers, comparison["rows"][0])}
    assert row["Configuration"] == "FedAvg" and row["Source"] == "Fixture Table 1"
    assert row["Mean acc. (%) paper"] == "90.00" and row["Var (%²) paper"] == "12.57"  # %² converted back
    assert row["Mean acc. (%) ours"].count("±") == 1
    index = (site["out"] / "index.html").read_text()
    assert "Reported in the papers" in index and "FedFV Table 2" in index and "paper-scale" in index
    assert "offline-scale" in index
    assert "Fixture Table 1" not in index  # matched entries live on their benchmark's page


def test_every_referenced_figure_exists(site):
    pages = [site["out"] / "index.html", *sorted((site["out"] / "benchmarks").glob("*.html"))]
    images = 0
    for path in pages:
        for src in read_page(path).images:
            assert not src.startswith(("/", "http")), src  # relative: works from file://
            assert (path.parent / src).is_file(), src
            images += 1
    assert images >= 3
    _, page = benchmark_page(site)
    assert {Path(s).name for s in page.images} == {"curves.png", "clients.png", "pareto.png"}
    for md in [site["out"] / "index.md", *sorted((site["out"] / "benchmarks").glob("*.md"))]:
        for src in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md.read_text()):
            assert (md.parent / src).is_file(), src


def markdown_rows(text: str, first_header: str) -> list[list[str]]:
    """The rows of the first Markdown table whose header row starts with ``first_header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def test_markdown_twin_has_the_same_rows_and_best_marks(site):
    path, page = benchmark_page(site)
    table = next(t for name, t in page.tables.items() if name.startswith("leaderboard-"))
    md = markdown_rows(path.with_suffix(".md").read_text(), "Configuration")
    assert len(md) == len(table["rows"])
    for html_row, md_row in zip(table["rows"], md):
        for cell, text in zip(html_row, md_row):
            best = "best" in cell["classes"]
            assert text.endswith("★") == best
            assert text.replace("**", "").replace("★", "").strip() == cell["text"].replace("★", "").strip()
    index_md = (site["out"] / "index.md").read_text()
    assert "OFFLINE-SCALE" in index_md
    linked = re.findall(r"\]\((benchmarks/[^)]+\.md)\)", index_md)
    assert len(linked) == 2 and all((site["out"] / link).is_file() for link in linked)


def test_unknown_experiment_lists_the_experiments_in_the_store(store, tmp_path, capsys):
    code = leaderboard_main(["build", "--tracking-uri", store["uri"], "--out", str(tmp_path / "site"),
                             "--experiments", "no-such-suite"])
    assert code == 2
    err = capsys.readouterr().err
    assert "no-such-suite" in err and SUITE in err
    assert not (tmp_path / "site").exists()


def test_empty_store_gives_a_page_that_says_so(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path / 'empty.db'}"
    MlflowClient(tracking_uri=uri).search_experiments()  # creates the (empty) store
    code = leaderboard_main(["build", "--tracking-uri", uri, "--out", str(tmp_path / "site"),
                             "--paper-numbers", str(tmp_path / "none")])
    assert code == 0
    assert "No runs found" in (tmp_path / "site" / "index.html").read_text()
    assert "No runs found" in (tmp_path / "site" / "index.md").read_text()
    assert "file://" in capsys.readouterr().out


def test_missing_store_and_foreign_output_folder_are_refused(store, tmp_path, capsys):
    code = leaderboard_main(["build", "--tracking-uri", f"sqlite:///{tmp_path / 'typo.db'}",
                             "--out", str(tmp_path / "site")])
    assert code == 2 and "does not exist" in capsys.readouterr().err
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    code = leaderboard_main(["build", "--tracking-uri", store["uri"], "--out", str(foreign)])
    assert code == 2 and "not a leaderboard site" in capsys.readouterr().err
    assert (foreign / "notes.txt").read_text() == "keep me"


def test_rebuild_replaces_the_previous_site(site, store, tmp_path):
    stale = site["out"] / "benchmarks" / "stale.html"
    stale.write_text("old")
    code = leaderboard_main(["build", "--tracking-uri", store["uri"], "--out", str(site["out"]),
                             "--experiments", SUITE, "--paper-numbers", str(store["papers"])])
    assert code == 0 and not stale.exists() and (site["out"] / "index.html").exists()


# --- units: seeds run again, the Pareto front, the papers' YAML ------------------------------

def record(run_id: str, config: str, seed: int, status: str, minute: int, accuracy: float | None = None):
    from datetime import datetime, timezone

    from leaderboard.runs import RunRecord

    return RunRecord(run_id=run_id, experiment=SUITE, status=status,
                     start_time=datetime(2026, 1, 1, 0, minute, tzinfo=timezone.utc), end_time=None,
                     tags={"suite": SUITE, "scale": "offline", "benchmark": BENCHMARK, "algorithm_config": config,
                           "seed": str(seed)},
                     params={}, metrics={} if accuracy is None else {"test_acc_mean": accuracy})


def test_a_seed_run_again_counts_once_with_its_latest_finished_run():
    from leaderboard.tables import build_tables
    from leaderboard.views import problem_runs_view, runs_view

    runs = [record("a", "FedAvg", 0, "FAILED", 1), record("b", "FedAvg", 0, "FINISHED", 2, 0.5),
            record("c", "FedAvg", 1, "FINISHED", 3, 0.1), record("d", "FedAvg", 1, "FINISHED", 4, 0.7)]
    (table,) = build_tables(runs)
    (row,) = table.rows
    assert [r.run_id for r in row.finished_runs] == ["b", "d"]
    assert (row.seeds_finished, row.seeds_total) == (2, 2)
    assert math.isclose(row.stats["test_acc_mean"].mean, 0.6)
    (problem,) = problem_runs_view(table).rows
    assert problem[0].text == "a" and "also has a FINISHED run" in problem[4].text
    used = {cells[0].text: cells[6].text for cells in runs_view(table).rows}
    assert used == {"a": "no", "b": "yes", "c": "no", "d": "yes"}


def test_pareto_front():
    from leaderboard.figures import pareto_front

    # (unfairness, accuracy): lower x and higher y are better
    points = [(1.0, 0.9), (2.0, 0.95), (1.5, 0.85), (0.5, 0.7), (2.0, 0.9)]
    assert pareto_front(points) == [True, True, False, True, False]


def test_paper_numbers_units_and_bad_entries(tmp_path):
    from leaderboard.papers import load_paper_numbers

    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "paper_numbers.yaml").write_text(
        "- {benchmark_setting: s, matches_benchmark: null, algorithm_config: A, source: T1,\n"
        "   metrics: {test_acc_mean: 0.5, test_acc_var_percent2: 12.57, test_acc_std_percent: 13.74}}\n"
        "- {benchmark_setting: s, algorithm_config: B, source: T1, metrics: {test_acc_mean: 50.4}}\n"
        "- {benchmark_setting: s, source: T1, metrics: {test_acc_mean: 0.5}}\n")
    numbers, warnings = load_paper_numbers(tmp_path)
    assert len(numbers) == 1 and numbers[0].paper == "p"
    assert numbers[0].metrics == pytest.approx({"test_acc_mean": 0.5, "test_acc_var": 0.001257, "test_acc_std": 0.1374})
    assert len(warnings) == 2 and "0.5042" in warnings[0] and "algorithm_config" in warnings[1]


def test_variants_of_one_setting_show_the_change_from_the_reference():
    """Attack / fault benchmarks (same key up to the last part) get one table: every
    configuration's mean and worst-5% accuracy under each variant, and Δ from no-attack."""
    from leaderboard.tables import BenchmarkTable, ConfigRow, Stat
    from leaderboard.views import variant_groups, variants_view

    def table(name, values):
        rows = [ConfigRow(config, "robustness-offline", [],
                          {"test_acc_mean": Stat(mean, None, 1), "test_acc_worst5": Stat(worst, None, 1)})
                for config, (mean, worst) in values.items()]
        return BenchmarkTable(f"synthetic/natural/p0.2/fl_logreg/{name}", name, rows, [])

    tables = [
        table("bias-attack-10", {"AFL": (0.165, 0.0), "FedMGDAPlus": (0.825, 0.437)}),
        table("no-attack", {"AFL": (0.765, 0.383), "FedMGDAPlus": (0.839, 0.493)}),
        table("dropout-0.5", {"FedMGDAPlus": (0.801, 0.360)}),
        BenchmarkTable("mnist5k/iid/p0.1/fl_mlp", "other", [], []),
    ]
    ((prefix, members),) = variant_groups(tables)
    assert prefix == "synthetic/natural/p0.2/fl_logreg" and len(members) == 3
    view = variants_view(prefix, members, "variants-1")
    assert [h.label for h in view.headers][:3] == ["Configuration", "no-attack: Mean acc. (%)",
                                                     "no-attack: Worst 5% (%)"]
    afl, mgda = ({cell.text for cell in row[:1]} for row in view.rows)
    assert afl == {"AFL"} and mgda == {"FedMGDAPlus"}
    assert view.rows[0][3].text == "16.50 (Δ -60.00)"  # AFL under the bias attack
    assert view.rows[0][5].text == MISSING  # AFL did not run with dropout
    assert view.rows[1][5].text == "80.10 (Δ -3.80)"
