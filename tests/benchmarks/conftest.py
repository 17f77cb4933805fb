"""Fixtures of the runner's tests."""

import pytest
import yaml


@pytest.fixture
def suite_file(tmp_path, monkeypatch):
    """The tiny suite (three cells: FedAvg, FedProx(mu=0.0), FedProx(mu=0.1); seed 0) written to
    ``tmp_path/tiny.yaml``, the working folder moved there."""
    from tests.benchmarks.test_runner import SUITE

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(SUITE))
    return path
