"""The main job (``fl-lightning fit``: ``configs/default.yaml``) measures its clients' accuracy in
the test mode the docs recommend for its partition (Datasets and partitions, "How client accuracy is measured")."""

from __future__ import annotations

import yaml

from fl_lightning.configs import DEFAULT_CONFIG
from fl_lightning.data.datamodule import FederatedDataModule

# The docs' recommendation (not kept as data in the package): ``matched`` for label-skewed
# partitions, whose clients differ in their labels only, so each client's accuracy is its model's
# class-wise accuracy on the shared pool weighted by its own label distribution, instead of a
# local test set of about 10 samples that quantises it in 10-point steps and turns the spread
# across clients (std, worst 10%) into sampling noise; ``local`` for clients that differ in their
# inputs too (natural clients: ``matched`` is refused there).
RECOMMENDED_TEST_MODE = {
    "dirichlet": "matched", "shards": "matched", "pathological": "matched",  # label skew (the docs' list)
    "natural": "local",  # feature skew
}


def test_the_main_job_tests_its_clients_as_recommended_for_its_partition():
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())["data"]
    assert data["test_mode"] == RECOMMENDED_TEST_MODE[data["partition"]]


def test_the_main_jobs_clients_are_measured_on_the_shared_pool():
    """The default data, built: every client is measured on the whole 1,000-image pool."""
    data = yaml.safe_load(DEFAULT_CONFIG.read_text())["data"]
    module = FederatedDataModule(**data, seed=0)
    module.setup("fit")
    assert module.client_test_description().startswith("matched: 1,000-sample shared pool")
