"""The performance suite (benchmarks/perf) on its tiniest setting: fields, timings, errors."""

import json

import pytest

from benchmarks.perf import suite
from benchmarks.perf.aggregation import measure
from benchmarks.perf.data import RandomImageData, clients_for
from benchmarks.perf.round_throughput import run_cell

CELL_FIELDS = {
    "num_parameters", "engine_used", "seconds_per_round", "seconds_per_round_all",
    "client_samples_per_round", "client_samples_per_second", "peak_memory_mib", "peak_memory_kind",
    "rounds_timed", "chunk_size",
}


@pytest.mark.parametrize("engine", ["vectorised", "sequential"])
def test_cell_in_process_times_rounds_and_memory(engine):
    entry = run_cell({"model": "fl_logreg", "clients": 4, "engine": engine, "rounds": 1})
    assert CELL_FIELDS <= set(entry)
    assert entry["engine_used"] == engine
    assert entry["num_parameters"] == 61 * 10  # logistic regression on 60 features, 10 classes
    assert entry["rounds_timed"] == 1 and entry["seconds_per_round"] > 0
    assert entry["client_samples_per_round"] == 4 * 20  # 20 samples per client, E = 1
    assert entry["client_samples_per_second"] == pytest.approx(80 / entry["seconds_per_round"])
    assert entry["peak_memory_mib"] >= 0 and entry["peak_memory_kind"].startswith("cpu_peak_rss")


def test_cifar_shaped_models_get_random_images_of_that_shape():
    data = clients_for("fl_cnn_cifar", num_clients=3, samples_per_client=5)
    assert isinstance(data, RandomImageData)
    assert data.input_shape == (3, 32, 32) and tuple(data.train_x.shape) == (15, 3, 32, 32)
    assert data.train_sizes.tolist() == [5, 5, 5] and data.train_index[2].tolist() == list(range(10, 15))


@pytest.mark.slow
def test_entry_point_records_a_failing_cell_and_runs_the_others(tmp_path, capsys):
    out = tmp_path / "perf.json"
    code = suite.main([
        "--models", "fl_nope", "fl_logreg", "--clients", "4", "--engines", "vectorised",
        "--variants", "--rounds", "1", "--sections", "throughput", "--device", "cpu", "--out", str(out),
    ])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["machine"]["device"] == "cpu" and report["settings"]["rounds_timed"] == 1
    failed, passed = report["throughput"]
    assert (failed["model"], failed["status"]) == ("fl_nope", "error")
    assert "unknown fl-lightning model 'fl_nope'" in failed["error"]
    assert passed["model"] == "fl_logreg" and passed["status"] == "ok"
    assert CELL_FIELDS <= set(passed) and passed["seconds_per_round"] > 0
    assert {"clients", "engine", "options", "variant"} <= set(passed)
    printed = capsys.readouterr().out
    assert "[ 1/2] fl_nope" in printed and "ERROR" in printed  # one progress line per cell
    assert "| fl_logreg | 4 |" in printed  # the closing table


def test_a_cell_predicted_too_slow_is_skipped():
    done = [{"model": "m", "engine": "sequential", "variant": None, "clients": 10, "status": "ok",
             "seconds_per_round": 60.0, "peak_memory_mib": 100.0}]
    cell = {"model": "m", "engine": "sequential", "variant": None, "clients": 100, "options": {},
            "rounds": 3, "warmup": 1, "max_timed_seconds": 120.0, "device": "cpu"}
    reason = suite.predicted_skip(cell, done, cell_timeout=900)
    assert reason is not None and "600.0 s/round" in reason  # (1 warm-up + 1 timed) x 600 s
    assert suite.predicted_skip(cell, done, cell_timeout=10_000) is None
    assert suite.predicted_skip({**cell, "model": "other"}, done, cell_timeout=900) is None


def test_aggregation_times_each_algorithm_and_records_errors():
    (cell,) = measure(["0.2M"], [10], ["FedAvg", "FedFV", "NoSuchAlgorithm"], repeats=1, loops=False)
    assert set(cell["seconds"]) == {"FedAvg", "FedFV"} and min(cell["seconds"].values()) > 0
    assert "NoSuchAlgorithm" in cell["errors"] and cell["num_parameters"] == 199_210


def test_in_process_cells_record_a_failure_and_go_on(tmp_path):
    """--in-process (a short GPU lease): the same entries as a cell's own process, errors included."""
    out = tmp_path / "perf.json"
    code = suite.main(
        [
            "--models",
            "fl_nope",
            "fl_logreg",
            "--clients",
            "4",
            "--engines",
            "vectorised",
            "--variants",
            "--rounds",
            "1",
            "--sections",
            "throughput",
            "--device",
            "cpu",
            "--in-process",
            "--out",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    failed, passed = report["throughput"]
    assert code == 0 and report["settings"]["in_process"] is True
    assert failed["status"] == "error" and "unknown fl-lightning model 'fl_nope'" in failed["error"]
    assert passed["status"] == "ok" and CELL_FIELDS <= set(passed) and passed["cell_seconds"] > 0


def test_a_paper_cell_trains_the_sampled_clients_of_its_paper(tmp_path):
    """FedFV's CIFAR-10 shape: 10 of 100 clients a round, 400 samples each, full batch."""
    from benchmarks.perf import paper_cells

    out = tmp_path / "cells.json"
    assert paper_cells.main(["--cells", "fedfv_cifar10", "--device", "cpu", "--rounds", "1", "--warmup", "0",
                             "--out", str(out)]) == 0
    (cell,) = json.loads(out.read_text())["cells"]
    assert cell["status"] == "ok" and cell["algorithm"] == "FedFV" and cell["num_classes"] == 10
    assert cell["client_samples_per_round"] == 10 * 400
    assert cell["num_parameters"] == 3 * 32 * 32 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10  # FedFV's 2x200 FFN
    assert cell["server_seconds_per_round"] is not None


def test_aggregation_of_an_nf_resnet18(tmp_path):
    (cell,) = measure(["nf_resnet18_fedlf"], [4], ["FedAvg"], repeats=1, loops=False)
    assert cell["seconds"]["FedAvg"] > 0 and cell["num_parameters"] == 183_466
