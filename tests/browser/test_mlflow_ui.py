"""Runs of ``fl-lightning fit`` in the real MLflow UI, in headless Chromium (tox env ``integration``).

Two tiny fits with the same settings and seed are written through our CLI into a temporary
SQLite store (this needs torch, so the ``browser`` env, which has none, skips it); ``mlflow
server`` serves that store on a free local port, and the experiment's runs view is opened in
Debian's ``chromium`` driven by ``playwright`` (``executable_path``). The two run names must
differ and be visible, and so must the split's name in the Dataset column. A screenshot is saved
in ``$BROWSER_SCREENSHOT_DIR`` (or the test's temporary folder) and its path printed. Skipped,
with the reason, without chromium, playwright or torch. The server is stopped in any case.
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

pytest.importorskip("torch", reason="creating runs with fl-lightning needs torch: tox -e integration runs this")
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


@pytest.fixture()
def two_runs(tmp_path, monkeypatch):
    """A store with two fits of the same settings and seed: (uri, experiment id, runs)."""
    from mlflow.tracking import MlflowClient

    from fl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for _ in range(2):
        main(["fit", f"--trainer.logger.init_args.tracking_uri={uri}", "--model.num_rounds=1",
              "--model.eval_every=1", "--data.num_clients=10"])
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("fl-lightning")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 2
    return uri, experiment.experiment_id, runs


def test_runs_view_shows_distinct_names_and_the_dataset(two_runs, tmp_path):
    uri, experiment_id, runs = two_runs
    names = sorted(run.info.run_name for run in runs)
    assert names[0][:10] != names[1][:10]  # the list and the chart legends show a name's first ~24 characters
    (dataset,) = {run.inputs.dataset_inputs[0].dataset.name for run in runs}  # one split, logged by both

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "mlflow-server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", uri, "--host", "127.0.0.1",
             "--port", str(port), "--workers", "1"],
            stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
        )
    try:
        wait_until_serving(url, server, log)
        shot = Path(os.environ.get("BROWSER_SCREENSHOT_DIR") or tmp_path) / "mlflow_runs_view.png"
        shot.parent.mkdir(parents=True, exist_ok=True)
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
            try:
                page = browser.new_page(viewport={"width": 1600, "height": 800})
                errors: list[str] = []
                page.on("pageerror", lambda error: errors.append(str(error)))
                page.goto(f"{url}/#/experiments/{experiment_id}/runs", timeout=PAGE_S * 1000)
                for name in names:
                    sync_api.expect(page.get_by_text(name, exact=True).first).to_be_visible(timeout=PAGE_S * 1000)
                sync_api.expect(page.get_by_text(dataset).first).to_be_visible(timeout=PAGE_S * 1000)
                page.screenshot(path=str(shot))
            finally:
                browser.close()
        print(f"screenshot of the MLflow runs view: {shot}")
        assert not errors, errors
    finally:
        stop(server)
