"""Runs of ``fl-lightning fit`` in the real MLflow UI, in headless Chromium (tox env ``integration``).

Two tiny fits that differ in their seed are written through our CLI into a temporary SQLite
store (this needs torch, so the ``browser`` env, which has none, skips it); ``mlflow server``
serves that store on a free local port, and the links a fit prints
(``fl_lightning.callbacks.mlflow_ui.ui_links``) are opened in Debian's ``chromium`` driven by
``playwright`` (``executable_path``), in a fresh browser context (a profile with nothing
remembered). The experiment's runs view must be MLflow's classic training view (MLflow 3.17
opens its GenAI view unless told otherwise), show the first ~22 characters of each run's name
(where the names differ: algorithm and seed) and the split's name in the Dataset column. The
run's page must be the classic view too, and its first metric chart the mean accuracy.
Screenshots are saved in ``$BROWSER_SCREENSHOT_DIR`` (or the test's temporary folder) and their
paths printed. Skipped, with the reason, without chromium, playwright or torch. The server is
stopped in any case.

Not checked, because no link or setting changes it: MLflow 3.17's Assistant panel, which opens
once in every fresh profile when the UI is served on localhost (``mlflow_ui``'s docstring).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from chromium import CHROMIUM_FLAGS, MISSING, chromium_path

pytest.importorskip("torch", reason="creating runs with fl-lightning needs torch: tox -e tests runs this")
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the Python package 'playwright' is not installed (pip install playwright)"
)


CHROMIUM = chromium_path()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason=MISSING,
    ),
]
SERVER_START_S = 90  # mlflow server on a busy 2-core machine
PAGE_S = 60
SHOWN_CHARACTERS = 22  # of a run's name, in the runs view's Run Name column (146 px at 12 px)
GENAI_ONLY = ("Evaluations", "Evaluation runs", "Judges", "Training runs")  # texts of MLflow 3.17's GenAI view
FITS_PREFIX = """(element, count) => {
    // Whether the first `count` characters of the element's text are drawn (with the ellipsis
    // that ends a cut text): [fits, their width, the ellipsis' width, the element's width].
    const range = document.createRange();
    range.setStart(element.firstChild, 0);
    range.setEnd(element.firstChild, Math.min(count, element.firstChild.length));
    const prefix = range.getBoundingClientRect().width;
    const style = getComputedStyle(element);
    const context = document.createElement("canvas").getContext("2d");
    context.font = `${style.fontStyle} ${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
    const cut = element.scrollWidth > element.clientWidth;
    const ellipsis = cut ? context.measureText("\u2026").width : 0;
    return [prefix + ellipsis <= element.clientWidth, prefix, ellipsis, element.clientWidth];
}"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_serving(url: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"mlflow server exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"mlflow server did not answer within {SERVER_START_S} s:\n{log.read_text()[-3000:]}")


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(timeout=15)


def with_ui_settings(client, experiment, runs) -> None:
    """What fl-lightning's tracking gives every experiment and run for the UI
    (``mlflow_ui.EXPERIMENT_TAGS``, ``mlflow_ui.chart_aliases``), where the fits did not already."""
    from mlflow.entities import Metric

    from fl_lightning.callbacks import mlflow_ui

    for key, value in mlflow_ui.EXPERIMENT_TAGS.items():
        if experiment.tags.get(key) != value:
            client.set_experiment_tag(experiment.experiment_id, key, value)
    for run in runs:
        if any(key.startswith(f"{mlflow_ui.CHART_SECTION}/") for key in run.data.metrics):
            continue
        aliases = [
            Metric(alias, value, metric.timestamp, metric.step)
            for name in mlflow_ui.CHART_METRICS if name in run.data.metrics
            for metric in client.get_metric_history(run.info.run_id, name)
            for alias, value in mlflow_ui.chart_aliases({name: metric.value}).items()
        ]
        client.log_batch(run.info.run_id, metrics=aliases)


@pytest.fixture()
def two_runs(tmp_path, monkeypatch):
    """A store with two fits of the same settings but the seed (0, 1): (uri, experiment id, runs)."""
    from mlflow.tracking import MlflowClient

    from fl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for seed in (0, 1):
        main(["fit", f"--trainer.logger.init_args.tracking_uri={uri}", "--model.num_rounds=1",
              "--model.eval_every=1", "--data.num_clients=10", f"--seed_everything={seed}"])
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("fl-lightning")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2
    with_ui_settings(client, experiment, runs)
    return uri, experiment.experiment_id, runs


def assert_classic_view(page) -> None:
    """MLflow 3.17's "Model training" view: its sidebar's Model registry, none of the GenAI view's texts."""
    sync_api.expect(page.get_by_role("link", name="Model registry")).to_be_visible(timeout=PAGE_S * 1000)
    for text in GENAI_ONLY:
        sync_api.expect(page.get_by_text(text, exact=True)).to_have_count(0)


def test_printed_links_open_the_classic_view_names_and_accuracy_first(two_runs, tmp_path):
    from fl_lightning.callbacks.mlflow_ui import CHART_METRICS, CHART_SECTION, ui_links

    uri, experiment_id, runs = two_runs
    names = sorted(run.info.run_name for run in runs)
    assert names[0][:SHOWN_CHARACTERS] != names[1][:SHOWN_CHARACTERS]  # the runs differ before the cut
    (dataset,) = {run.inputs.dataset_inputs[0].dataset.name for run in runs}  # one split, logged by both

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    runs_view, run_page = ui_links(url, experiment_id, runs[0].info.run_id)  # as a fit on this server prints them
    log = tmp_path / "mlflow-server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", "127.0.0.1",
             "--port", str(port), "--workers", "1"],
            stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
        )
    try:
        wait_until_serving(url, server, log)
        shots = Path(os.environ.get("BROWSER_SCREENSHOT_DIR") or tmp_path)
        shots.mkdir(parents=True, exist_ok=True)
        errors: list[str] = []
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
            try:
                page = browser.new_context(viewport={"width": 1600, "height": 800}).new_page()  # a fresh profile
                page.on("pageerror", lambda error: errors.append(str(error)))

                page.goto(runs_view, timeout=PAGE_S * 1000)
                for name in names:
                    cell = page.get_by_role("gridcell").get_by_text(name, exact=True)
                    sync_api.expect(cell).to_be_visible(timeout=PAGE_S * 1000)
                    fits, prefix, ellipsis, width = cell.evaluate(FITS_PREFIX, SHOWN_CHARACTERS)
                    assert fits, (f"the runs view cuts {name[:SHOWN_CHARACTERS]!r}: {prefix:.0f} px "
                                  f"+ {ellipsis:.0f} px ellipsis > {width} px")
                sync_api.expect(page.get_by_text(dataset).first).to_be_visible(timeout=PAGE_S * 1000)
                sync_api.expect(page.get_by_role("heading", name="Runs", exact=True)).to_be_visible()
                assert_classic_view(page)
                page.screenshot(path=str(shots / "mlflow_runs_view.png"))

                page.goto(run_page, timeout=PAGE_S * 1000)
                titles = page.get_by_test_id("experiment-view-compare-runs-card").locator("h4")
                sync_api.expect(titles.first).to_have_text(CHART_METRICS[0], timeout=PAGE_S * 1000)
                sync_api.expect(titles.first).to_have_attribute("title", f"{CHART_SECTION}/{CHART_METRICS[0]}")
                sync_api.expect(page.get_by_test_id("experiment-observatory-link-runs")).to_have_text("Runs")
                assert_classic_view(page)
                page.screenshot(path=str(shots / "mlflow_run_metrics.png"))
            finally:
                browser.close()
        print(f"screenshots of the MLflow runs view and run page: {shots / 'mlflow_runs_view.png'}, "
              f"{shots / 'mlflow_run_metrics.png'}")
        assert not errors, errors
    finally:
        stop(server)
