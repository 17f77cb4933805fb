"""Links and names that make MLflow's UI open a fit on the classic training view, accuracy first.

Read from MLflow 3.17.2's UI bundle (``mlflow/server/js/build``) and checked in headless
Chromium with a fresh profile (``tests/browser/test_mlflow_ui.py``):

* The UI's mode is its ``workflowType``: ``genai`` unless the URL says otherwise or the browser
  remembers a switch made with the sidebar toggle (``localStorage["mlflow.workflowType_v1"]``).
  The UI routes inside the URL's fragment (``/#/experiments/1/runs``) and reads the parameter
  from the fragment's query, ``/#/experiments/1/runs?workflowType=machine_learning``; one before
  the ``#`` (``/?workflowType=...#/...``) is ignored. The parameter does not change what the
  browser remembers.
* 3.17.2 ignores the experiment tag ``mlflow.experimentKind`` when it picks the mode (its
  ``workflowType`` switch overrides the tag); builds without that switch read the tag instead.
* A run's "Model metrics" tab groups the charts by the part of a metric's name before its last
  ``/`` (``conflicts_layer/fc.bias`` goes to a section "conflicts_layer"); these sections come
  first, sorted by name, then "Model metrics" with every name without a ``/``; charts within a
  section are sorted by name. Where the charts sit is remembered per run by the browser only
  (``localStorage``); no link or tag sets it. So ``conflicts_layer`` comes before accuracy, and
  even without it ``chunk_size`` would: only a section whose name sorts first can put accuracy
  first, hence :func:`chart_aliases`.
* Not settable by a link, a tag or ``mlflow ui``: the "MLflow Assistant" panel opens once in
  every fresh browser profile when the UI is served on localhost / 127.0.0.1 / ::1 (in either
  mode); closed, it stays closed (``localStorage["mlflow.assistant.panelOpen_v1"]``).
"""

from __future__ import annotations

from collections.abc import Mapping

from fl_lightning.records.vocabulary import Metric

DEFAULT_UI_URL = "http://127.0.0.1:5000"  # where `mlflow ui` serves a local store

CLASSIC_VIEW_QUERY = "workflowType=machine_learning"
"""The query, inside the URL's fragment, that opens MLflow 3.17's UI on its "Model training"
mode (runs, models, model registry) rather than its default GenAI mode (overview, traces,
judges, evaluation runs, an "Evaluations" breadcrumb on a run's page)."""

EXPERIMENT_TAGS: dict[str, str] = {"mlflow.experimentKind": "custom_model_development"}
"""Tags for every experiment fl-lightning creates: the experiment kind "Machine learning",
which MLflow UIs without the ``workflowType`` switch (3.x before it) read to open an experiment
on its training runs. MLflow 3.17.2 shows the tag and otherwise ignores it (the link's
:data:`CLASSIC_VIEW_QUERY` decides); harmless either way."""

CHART_SECTION = "Accuracy and fairness"
"""The section of a run's metric charts that :func:`chart_aliases` fills: its name sorts before
every other section name a fit logs (``cffl_*``, ``cgsv_*``, ``conflicts_layer``, ``eci_*``),
both by code units (MLflow 3.17's first layout) and by ``localeCompare`` (its later updates)."""

CHART_METRICS = (Metric.TEST_ACC_MEAN, Metric.TEST_ACC_STD, Metric.TEST_ACC_WORST10, Metric.TEST_ACC_WORST5)
"""The metrics shown first, in this order (their names' order, as the UI sorts them): the
leaderboard's headline accuracy and its fairness columns (``leaderboard.tables.HEADLINE``,
``MATRIX_FAIRNESS``)."""


def chart_aliases(metrics: Mapping[str, float]) -> dict[str, float]:
    """``{"Accuracy and fairness/test_acc_mean": ..., ...}``: a copy, under :data:`CHART_SECTION`,
    of each of ``metrics``' :data:`CHART_METRICS`, to log with them (same step). MLflow 3.17's run
    page then opens its "Model metrics" tab on a section with the mean accuracy first, then the
    spread and the worst clients' accuracy (each chart titled with the original name). The
    original metrics are still logged under their own names (the leaderboard reads those)."""
    return {f"{CHART_SECTION}/{name}": metrics[name] for name in CHART_METRICS if name in metrics}


def ui_base(tracking_uri: str) -> str:
    """The MLflow UI of a store: the tracking server itself, or where ``mlflow ui`` serves a local store."""
    return tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else DEFAULT_UI_URL


def ui_links(tracking_uri: str, experiment_id: str, run_id: str) -> tuple[str, str]:
    """(the experiment's runs view, the run's metric charts) in the MLflow UI, both on the
    classic training view (:data:`CLASSIC_VIEW_QUERY`, in the fragment where MLflow 3.17's
    router reads it; older UIs ignore it). The run's link opens its "Model metrics" tab
    (its own route, ``/model-metrics``), where :func:`chart_aliases` come first."""
    experiment = f"{ui_base(tracking_uri)}/#/experiments/{experiment_id}"
    return (f"{experiment}/runs?{CLASSIC_VIEW_QUERY}",
            f"{experiment}/runs/{run_id}/model-metrics?{CLASSIC_VIEW_QUERY}")
