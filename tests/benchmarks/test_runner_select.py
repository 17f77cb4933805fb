"""`python -m benchmarks run SUITE --benchmarks ... --configs ...`: only those cells, unknown names refused."""

import pytest

from benchmarks.command_line import main
from benchmarks.suites import load_suite, select_cells


def test_only_the_named_benchmarks_and_configurations_run():
    cells = load_suite("robustness/offline", [0, 1])
    chosen = select_cells(cells, "robustness/offline", ["synthetic/natural/p0.2/fl_logreg/bias-attack-10"],
                          ["FedAvg", "FedMGDAPlus(epsilon=0.1)"])
    assert {(c.benchmark, c.algorithm_config, c.seed) for c in chosen} == {
        ("synthetic/natural/p0.2/fl_logreg/bias-attack-10", config, seed)
        for config in ("FedAvg", "FedMGDAPlus(epsilon=0.1)") for seed in (0, 1)}
    assert select_cells(cells, "robustness/offline", None, None) == cells


def test_an_unknown_name_is_refused_before_the_store_is_touched(tmp_path):
    store = tmp_path / "m.db"
    with pytest.raises(SystemExit, match="has no configuration 'FedAvgg'; its configurations: AFL, FedAvg"):
        main(["run", "robustness/offline", "--configs", "FedAvgg", "--tracking-uri", f"sqlite:///{store}"])
    assert not store.exists()
