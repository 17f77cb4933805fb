"""The leaderboard's per-agent view (CGSV Fig. 2) and its marks from the algorithm classes.

A hand-made store: CGSV runs on 5 agents, 3 of them with noisy labels (the task says which), that
log r, ψ, download density and distance per agent and round; FedAvg and FedGini beside them.
"""

from __future__ import annotations

import mlflow
import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from fl_lightning.algorithms import ALGORITHMS, FedAvg, FedGini
from fl_lightning.records.algorithm_facts import INTERPRETATIONS, interpretation_of
from fl_lightning.records.vocabulary import Tag
from leaderboard.algorithms import interpretations
from leaderboard.runs import is_agent_series
from tests.leaderboard_builders import build, log_run, page_path, read_page, rows_by_config, task_tags

SUITE = "cgsv-noise-fixture-offline"
NOISY = "mnist5k/uni-5/full/fl_mlp/noisy"
NOISE = {"0": 0.2, "1": 0.4, "2": 0.6}
ROUNDS = 6


def log_agent_series(client, run_id: str, psi: list[float]) -> None:
    metrics = []
    for step in range(1, ROUNDS + 1):
        for agent, value in enumerate(psi):
            metrics += [
                Metric(f"cgsv_psi/{agent}", value, 0, step),
                Metric(f"cgsv_r/{agent}", value / sum(psi), 0, step),
                Metric(f"cgsv_density/{agent}", value / max(psi), 0, step),
                Metric(f"cgsv_distance/{agent}", (1 - value) * step, 0, step),
            ]
    client.log_batch(run_id, metrics=metrics)


@pytest.fixture(scope="module")
def agents_site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agents")
    uri = f"sqlite:///{tmp / 'mlruns.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment(SUITE)
    tags = {**task_tags(num_clients=5, label_noise=NOISE, fraction=1.0), "per_client_models": "true"}
    for seed in (0, 1):
        for config, acc in (("FedAvg", 0.8), ("CGSV(beta=1.0)", 0.82), ("FedGini", 0.79)):
            run_id = log_run(client, experiment, SUITE, NOISY, config, seed, {"test_acc_mean": acc + seed / 100},
                             tags=tags, rounds=ROUNDS)
            if config.startswith("CGSV"):
                log_agent_series(client, run_id, [0.19 + seed / 100, 0.09, 0.04, 0.33, 0.34])
    papers = tmp / "papers"
    papers.mkdir()
    out = tmp / "site"
    build(uri, out, papers)
    mlflow.set_tracking_uri(None)
    return out


def test_fedgini_carries_its_interpretation_mark_and_fedavg_none():
    assert FedGini.interpretation == "interpretation (paper unavailable)"
    assert not hasattr(FedAvg, "interpretation")
    assert interpretation_of("FedGini") == FedGini.interpretation
    assert interpretation_of("FedAvg") == interpretation_of("NoSuchAlgorithm") == interpretation_of("") == ""


def test_every_algorithm_class_takes_its_interpretation_from_the_facts():
    """One home: the class attribute and the leaderboard's table of facts cannot disagree."""
    for name, cls in ALGORITHMS.items():
        assert getattr(cls, "interpretation", "") == INTERPRETATIONS.get(name, ""), name


class Tagged:
    def __init__(self, algorithm: str, note: str | None = None) -> None:
        self.tags = {Tag.ALGORITHM: algorithm} | ({Tag.INTERPRETATION: note} if note else {})


def test_a_row_reads_its_note_from_the_runs_tag_else_from_the_facts():
    assert interpretations([Tagged("FedAvg"), Tagged("FedGini")]) == "FedGini: interpretation (paper unavailable)"
    assert interpretations([Tagged("FedGini")]) == "interpretation (paper unavailable)"  # a run before the tag
    assert interpretations([Tagged("mine.MyAlgorithm", "interpretation (my reading)")]) == "interpretation (my reading)"
    assert interpretations([Tagged("FedAvg")]) == interpretations([]) == ""


def test_fedgini_rows_are_marked_on_the_table_and_the_index(agents_site):
    rows = rows_by_config(read_page(page_path(agents_site, NOISY)))
    assert "interpretation (paper unavailable)" in rows["FedGini"]["algorithm"]["text"]
    assert "interpretation" not in rows["FedAvg"]["algorithm"]["text"]
    assert "interpretation" not in rows["CGSV(beta=1.0)"]["algorithm"]["text"]
    index = (agents_site / "index.html").read_text()
    assert index.count("interpretation (paper unavailable)") >= 1
    assert "(interpretation (paper unavailable))" in (agents_site / "index.md").read_text()


def test_cgsv_tables_get_the_per_agent_figure_and_others_do_not_need_it(agents_site):
    html = page_path(agents_site, NOISY).read_text()
    assert "agents.png" in html and "download density" in html
    pngs = list(agents_site.rglob("agents.png"))
    assert len(pngs) == 1 and pngs[0].stat().st_size > 10_000


def test_agent_series_names():
    assert is_agent_series("cgsv_r/3") and is_agent_series("cgsv_distance/0")
    assert not is_agent_series("cgsv_r_mean") and not is_agent_series("cgsv_rho") and not is_agent_series("x/1")


def test_agent_labels_name_the_noise_of_each_agent():
    from types import SimpleNamespace

    from leaderboard.figures import agent_ids, noise_labels

    table = SimpleNamespace(task=SimpleNamespace(fields={"label_noise": NOISE, "feature_noise": {"4": 0.5}}))
    assert noise_labels(table) == {0: "20% noisy labels", 1: "40% noisy labels", 2: "60% noisy labels",
                                   4: "input noise std 0.5"}
    run = SimpleNamespace(histories={"cgsv_r/0": [(1, 0.1)], "cgsv_psi/3": [(1, 0.2)], "test_acc_mean": [(1, 0.5)]})
    assert agent_ids(SimpleNamespace(finished_runs=[run])) == [0, 3]


def test_a_fit_logs_the_interpretation_as_a_run_tag():
    from fl_lightning.callbacks.run_identity import task_tags

    gini = FedGini(backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8))
    assert task_tags(gini, None)[Tag.INTERPRETATION] == "interpretation (paper unavailable)"
    assert Tag.INTERPRETATION not in task_tags(
        FedAvg(backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8)), None
    )
