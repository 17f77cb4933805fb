"""The site built from a real MLflow store, written with the real MLflow client into a temporary
SQLite file: what a reader sees, recomputed from the MLflow API.

``store``: real ``fl-lightning fit`` runs through the CLI (FedAvg and FedProx(mu=1.0) on 6 clients
of the digits, logistic regression, 3 rounds of 5 full-batch local epochs, two seeds each; plus
FedAvg with 2 rounds, which must never be ranked with the 3-round runs), a FAILED and a RUNNING run
made by hand, and a sparse second benchmark. Expected numbers and verdicts are recomputed here from
the MLflow API. Then: rebuilding that site, the build's refusals around it, and plain fits (no
suite) on the index.
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from leaderboard.__main__ import main as leaderboard_main
from leaderboard.runs import using_tracking_uri
from leaderboard.stats import welch_test
from leaderboard.tables import COLUMNS, MISSING
from tests.leaderboard_builders import (
    BENCHMARK,
    SUITE,
    Page,
    build,
    leaderboard_table,
    main_number,
    markdown_rows,
    page_path,
    read_page,
    rows_by_config,
    runner_tags,
)

SPARSE_BENCHMARK = "digits/iid/full/fl_mlp"
CONFIGS = {"FedAvg": [], "FedProx(mu=1.0)": ["--model=FedProx", "--model.mu=1.0"]}
SEEDS = (0, 1)
FAILED_ERROR = "RuntimeError: client losses became NaN at round 2"
JUDGED = {c.key: c.better for c in COLUMNS if c.better}


def fit(uri: str, config: str, seed: int, rounds: int = 3) -> None:
    from fl_lightning.cli import main as fit_main

    tags = ", ".join(f"{k}: '{v}'" for k, v in runner_tags(config, seed).items())
    fit_main([
        "fit",
        f"--trainer.logger.init_args.tracking_uri={uri}",
        f"--trainer.logger.init_args.experiment_name={SUITE}",
        f"--trainer.logger.init_args.tags={{{tags}}}",
        *CONFIGS[config],
        f"--model.num_rounds={rounds}", "--model.eval_every=1", "--model.fraction=1.0",
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
    import torch

    tmp = tmp_path_factory.mktemp("leaderboard")
    uri = f"sqlite:///{tmp / 'runs.db'}"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: one thread is faster on a busy CPU
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp)  # checkpoints and artifacts land in the temporary folder
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        for config in CONFIGS:
            for seed in SEEDS:
                fit(uri, config, seed)
        fit(uri, "FedAvg", 0, rounds=2)  # another task: never ranked with the 3-round runs
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
    torch.set_num_threads(threads)
    return {"uri": uri, "tmp": tmp, "papers": papers, "failed": failed.info.run_id,
            "running": running.info.run_id, "sparse": sparse.info.run_id}


@pytest.fixture(scope="module")
def site(store):
    out = store["tmp"] / "site"
    return {"out": out, "stdout": build(store["uri"], out, store["papers"])}


# --- reading the site's pages and the store ------------------------------------------------------

def benchmark_page(site, key=BENCHMARK) -> tuple[Path, Page]:
    path = page_path(site["out"], key)
    return path, read_page(path)


def final_value(client: MlflowClient, run_id: str, name: str) -> float | None:
    history = client.get_metric_history(run_id, name)
    return max(history, key=lambda m: (m.step, m.timestamp)).value if history else None


def search(uri: str, filter_string: str = "") -> list:
    """The runs of the suite, read with mlflow.search_runs from this store (not the global URI)."""
    with using_tracking_uri(uri):
        return mlflow.search_runs(experiment_names=[SUITE], filter_string=filter_string, output_format="list")


def three_round_runs(uri: str) -> list:
    return [r for r in search(uri, f"tags.benchmark = '{BENCHMARK}'")
            if r.info.status == "FINISHED" and r.data.params.get("num_rounds") == "3"]


def per_seed_values(uri: str) -> dict[str, dict[str, list[float]]]:
    """Per configuration, each column's per-seed values, recomputed from the MLflow API."""
    client = MlflowClient(tracking_uri=uri)
    expected: dict[str, dict[str, list[float]]] = {}
    for run in three_round_runs(uri):
        per_column = expected.setdefault(run.data.tags["algorithm_config"], {})
        run_id = run.info.run_id
        for column in ("test_acc_mean", "test_acc_std", "test_acc_var", "test_acc_angle",
                       "test_acc_worst5", "test_acc_worst10", "test_acc_best5", "test_acc_jain"):
            per_column.setdefault(column, []).append(final_value(client, run_id, column))
        conflicts = [m.value for m in client.get_metric_history(run_id, "conflicts_model")]
        per_column.setdefault("conflicts_model", []).append(statistics.fmean(conflicts))
        times = {}
        for name in ("client_time_s", "server_time_s"):
            for m in client.get_metric_history(run_id, name):
                times[m.step] = times.get(m.step, 0.0) + m.value
        per_column.setdefault("time_per_round", []).append(statistics.fmean(times.values()))
    assert sorted(expected) == sorted(CONFIGS) and all(len(v["test_acc_mean"]) == len(SEEDS) for v in expected.values())
    return expected


def expected_marks(values: dict[str, list[float]], better: str) -> dict[str, str]:
    """The verdict rule, recomputed: ★ when the top row is separated from every other (Welch p <
    0.05), else ≈ on the top row and the rows not separated from it."""
    sign = 1 if better == "max" else -1
    order = sorted(values, key=lambda c: -sign * statistics.fmean(values[c]))
    top, others = order[0], order[1:]
    tied = {c for c in others if (test := welch_test(values[top], values[c])) is None or test.p >= 0.05}
    return {top: "★" if not tied else "≈", **{c: "≈" if c in tied else "" for c in others}}


# --- the real store: fl-lightning fit runs -------------------------------------------------------

def test_runner_tags_land_on_the_runs(store):
    runs = search(store["uri"])
    fitted = [r for r in runs if r.data.tags.get("mlflow.source.type")]  # made by the CLI, not by hand
    assert len(fitted) == len(CONFIGS) * len(SEEDS) + 1
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
    assert "Read 8 runs from 1 experiment(s)" in out
    assert "Wrote 3 benchmark page(s) from 8 runs" in out  # 3-round, 2-round, sparse
    assert (site["out"] / "index.html").resolve().as_uri() in out


def test_fits_with_other_rounds_are_never_ranked_with_them(site, store):
    """FedAvg for 2 rounds is another task: its own table, not a row of the 3-round table."""
    _, page = benchmark_page(site)
    rows = rows_by_config(page)
    expected = per_seed_values(store["uri"])
    assert math.isclose(float(rows["FedAvg"]["test_acc_mean"]["sort"]),
                        statistics.fmean(expected["FedAvg"]["test_acc_mean"]), rel_tol=1e-9)
    others = [p for p in (site["out"] / "benchmarks").glob("*task-*.html")]
    assert len(others) == 1
    other = read_page(others[0])
    (row,) = leaderboard_table(other)[1]
    assert row["config"]["text"] == "FedAvg" and row["rounds"]["text"].startswith("2")
    assert "rounds 2" in others[0].read_text() and "rounds 3" in others[0].read_text()
    assert not any("best" in c["classes"] or "tie" in c["classes"] for c in row.values())  # alone: no verdict


def test_one_row_per_configuration_with_mean_std_and_n(site, store):
    _, page = benchmark_page(site)
    keys, rows = leaderboard_table(page)
    assert sorted(r["config"]["text"] for r in rows) == sorted(CONFIGS)
    expected = per_seed_values(store["uri"])
    columns = {c.key: c for c in COLUMNS}
    for row in rows:
        config = row["config"]["text"]
        for key, values in expected[config].items():
            cell, column = row[key], columns[key]
            mean, std = statistics.fmean(values), statistics.stdev(values)
            assert math.isclose(float(cell["sort"]), mean, rel_tol=1e-9), (config, key)
            assert main_number(cell) == f"{mean * column.scale:.{column.decimals}f}", (config, key)
            assert f"± {std * column.scale:.{column.decimals}f} · n={len(SEEDS)}" in cell["text"], (config, key)
        # FedProx: + the FAILED seed; FedAvg: + the RUNNING seed (runs with no task record join the main table)
        assert row["seeds"]["text"] == f"{len(SEEDS)} / {len(SEEDS) + 1}"
        assert row["rounds"]["text"] == "3 / 3"


def test_verdicts_follow_welch_on_the_fitted_runs(site, store):
    _, page = benchmark_page(site)
    rows = rows_by_config(page)
    expected = per_seed_values(store["uri"])
    for key, better in JUDGED.items():
        if key not in expected["FedAvg"]:
            continue
        marks = expected_marks({config: values[key] for config, values in expected.items()}, better)
        for config, mark in marks.items():
            cell = rows[config][key]
            shown = "★" if "best" in cell["classes"] else "≈" if "tie" in cell["classes"] else ""
            assert shown == mark, (key, config, cell)
            assert (mark in cell["text"]) if mark else ("★" not in cell["text"] and "≈" not in cell["text"])


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
    keys, rows = leaderboard_table(page)
    assert len(rows) == 1
    row = rows[0]
    assert main_number(row["test_acc_mean"]) == "75.00" and "n=1" in row["test_acc_mean"]["text"]
    assert "±" not in row["test_acc_mean"]["text"]  # one seed: no std
    assert "test_acc_std" not in keys  # never logged by any run of the table
    assert row["conflicts_model"]["text"] == MISSING if "conflicts_model" in keys else True
    assert not any("best" in cell["classes"] or "tie" in cell["classes"] for cell in row.values())  # one row


def test_index_has_provenance_tables_and_offline_label(site, store):
    text = (site["out"] / "index.html").read_text()
    page = Page(text)
    assert "OFFLINE-SCALE" in text and SUITE in text and "Built" in text
    shas = {r.data.tags["git_sha"] for r in search(store["uri"]) if r.data.tags.get("git_sha")}
    assert shas and all(sha in text for sha in shas)
    assert "without a <code>machine</code> tag" in text  # falls back to the builder's CPU
    rows = page.tables["benchmarks"]["rows"]
    assert sorted(r[0]["text"] for r in rows) == sorted([BENCHMARK, BENCHMARK, SPARSE_BENCHMARK])
    main = next([c["text"] for c in r] for r in rows if r[0]["text"] == BENCHMARK and r[3]["text"].startswith("main"))
    assert "2" in main and "6" in main  # configurations, runs (with the failed and the running one)
    assert any("FAILED 1" in c and "RUNNING 1" in c for c in main)
    for link in page.links:
        if link.startswith("benchmarks/"):
            assert (site["out"] / link).exists(), link


def test_store_is_named_never_by_its_local_path(site, store):
    for path in (site["out"] / "index.html", site["out"] / "index.md", *sorted((site["out"] / "benchmarks").glob("*"))):
        if path.is_file():
            text = path.read_text()
            assert str(store["tmp"]) not in text, path
    assert "<code id=\"store\">runs.db</code>" in (site["out"] / "index.html").read_text()


def test_paper_numbers_beside_ours_and_unmatched_ones_apart(site):
    _, page = benchmark_page(site)
    comparison = next(t for name, t in page.tables.items() if name.startswith("papers-"))
    headers = [h["text"] for h in comparison["headers"][0]]
    row = {h: c["text"] for h, c in zip(headers, comparison["rows"][0])}
    assert row["Configuration"] == "FedAvg" and row["Source"] == "Fixture Table 1"
    assert row["Mean client acc. (%) paper"] == "90.00" and row["Variance (pp²) paper"] == "12.57"  # %² converted back
    assert row["Mean client acc. (%) ours"].count("±") == 1 and "n=2" in row["Mean client acc. (%) ours"]
    index = (site["out"] / "index.html").read_text()
    assert "Reported in the papers" in index and "FedFV Table 2" in index and "paper-scale" in index
    # the papers' tables no run here matches are folded below the user's own (closed: a <details> without open)
    assert '<details class="reported">' in index and index.index('<details class="reported">') < index.index(
        "FedFV Table 2"
    )
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


def test_markdown_twin_has_the_same_rows_and_marks(site):
    path, page = benchmark_page(site)
    table = next(t for name, t in page.tables.items() if name.startswith("leaderboard-"))
    md = markdown_rows(path.with_suffix(".md").read_text(), "Configuration")
    assert len(md) == len(table["rows"])
    for html_row, md_row in zip(table["rows"], md):
        for cell, text in zip(html_row, md_row):
            assert ("★" in text) == ("best" in cell["classes"]) and ("**" in text) == ("best" in cell["classes"])
            assert ("≈" in text) == ("tie" in cell["classes"])
            assert text.replace("**", "").split()[0] == cell["text"].split()[0]
    index_md = (site["out"] / "index.md").read_text()
    assert "OFFLINE-SCALE" in index_md
    linked = set(re.findall(r"\]\((benchmarks/[^)]+\.md)\)", index_md))
    assert len(linked) == 3 and all((site["out"] / link).is_file() for link in linked)


def test_unknown_experiment_lists_the_experiments_in_the_store(store, tmp_path, capsys):
    code = leaderboard_main(["build", "--tracking-uri", store["uri"], "--out", str(tmp_path / "site"),
                             "--experiments", "no-such-suite"])
    assert code == 2
    err = capsys.readouterr().err
    assert "no-such-suite" in err and SUITE in err
    assert not (tmp_path / "site").exists()


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


def test_rebuild_replaces_the_previous_site(site, store):
    """A page an earlier build wrote (in its marker's manifest) and no longer writes goes away."""
    from leaderboard.site import MARKER

    stale = site["out"] / "benchmarks" / "stale.html"
    stale.write_text("old")
    marker = site["out"] / MARKER
    marker.write_text(marker.read_text() + "- benchmarks/stale.html\n")
    code = leaderboard_main(["build", "--tracking-uri", store["uri"], "--out", str(site["out"]),
                             "--experiments", SUITE, "--paper-numbers", str(store["papers"])])
    assert code == 0 and not stale.exists() and (site["out"] / "index.html").exists()
    assert (site["out"].stat().st_mode & 0o777) == 0o777 & ~current_umask()  # not mkdtemp's 0700


def current_umask() -> int:
    import os

    umask = os.umask(0)
    os.umask(umask)
    return umask


def test_a_rebuild_refuses_to_lose_a_file_it_did_not_write(site, store, capsys):
    mine = site["out"] / "my-notes.md"
    mine.write_text("a reader's notes")
    code = leaderboard_main(["build", "--tracking-uri", store["uri"], "--out", str(site["out"]),
                             "--experiments", SUITE, "--paper-numbers", str(store["papers"])])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "my-notes.md" in err and "did not write" in err
    assert mine.read_text() == "a reader's notes" and (site["out"] / "index.html").exists()
    mine.unlink()  # the shared site fixture stays as built


# --- fits that no suite made ---------------------------------------------------------------------

@pytest.mark.usefixtures("one_thread")
def test_plain_fits_are_grouped_as_your_fits_without_a_scale_badge(tmp_path, monkeypatch):
    """A run no suite made (``fl-lightning fit`` alone: experiment fl-lightning, no suite or scale
    tag) is listed under "Your fits (not from a suite)" with no scale badge, never as a suite
    called fl-lightning of unknown scale; a plain run in another experiment says that experiment."""
    from fl_lightning.cli import main as fit_main

    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    monkeypatch.chdir(tmp_path)
    fit_main(["fit", f"--trainer.logger.init_args.tracking_uri={uri}", "--model.num_rounds=1",
              "--model.backbone=fl_logreg", "--model.fraction=1.0", "--data.source=digits", "--data.num_clients=6",
              "--data.partition=iid", "--data.partition_params={}"])
    client = MlflowClient(tracking_uri=uri)
    other = client.create_run(client.create_experiment("my-study"), tags={"algorithm": "FedAvg"})
    client.log_metric(other.info.run_id, "test_acc_mean", 0.5, step=1)
    client.set_terminated(other.info.run_id, "FINISHED")

    out = tmp_path / "site"
    build(uri, out, tmp_path / "no-paper-numbers")
    index, html = (out / "index.md").read_text(), (out / "index.html").read_text()
    assert index.splitlines()[0] == "# fl-lightning leaderboard"  # no scale badge
    assert "## Your fits (not from a suite)\n" in index and "## Your fits in my-study (not from a suite)\n" in index
    assert "| Your fits (not from a suite) | — |" in index and "| fl-lightning |" not in index
    pages = "".join(page.read_text() for page in (out / "benchmarks").glob("*.*"))
    for text in (index, html, pages):
        assert not re.search(r"unknown[- ]scale|scale unknown", text, flags=re.I)
    assert 'id="suite-Your-fits-not-from-a-suite"' in html and 'href="#suite-Your-fits-not-from-a-suite"' in html
    assert "Suite **Your fits (not from a suite)**" in pages
