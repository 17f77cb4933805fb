"""The suite format as declared pydantic models (fl_lightning.records.suite_format): what it accepts, and
each refusal as one line that names the entry and what to write."""

import pytest

from fl_lightning.records.suite_format import AlgorithmEntry, BenchmarkEntry, SuiteFormatError, SuiteSpec

HEAD = {"suite": "s", "paper": "p", "scale": "offline", "base": {}}
ONE = {**HEAD, "benchmarks": [{"name": "b"}], "algorithms": [{"class_path": "FedAvg"}]}


def test_every_model_refuses_keys_it_does_not_declare():
    for model in (SuiteSpec, BenchmarkEntry, AlgorithmEntry):
        assert model.model_config["extra"] == "forbid", model.__name__


def test_a_suite_as_written_is_read_with_its_defaults():
    spec = SuiteSpec.parse({**ONE, "x-common": {"lr": 0.1}, "description": "two\n  lines",
                            "algorithms": [{"class_path": "FedProx", "init_args": None, "grid": {"mu": [0.1, 1]}}]},
                           "'t'")
    assert spec.seeds == (0,) and spec.description == "two lines" and spec.benchmarks[0].config == {}
    assert [label for label, _ in spec.algorithms_of(spec.benchmarks[0])[0].configurations()] == [
        "FedProx(mu=0.1)", "FedProx(mu=1)"]


@pytest.mark.parametrize(("change", "message"), [
    ({"seeds": [0, True]}, "'seeds' must be a non-empty list of integers (e.g. seeds: [0, 1, 2]), got [0, True]"),
    ({"suite": ""}, "'suite' must be a non-empty string, got ''"),
    ({"base": [1]}, "'base' must be a mapping (a LightningCLI config), got [1]"),
    ({"benchmarks": [{"name": "b", "confg": {}}]}, "unknown key 'confg' in benchmark 'b'; did you mean 'config'?"),
    ({"benchmarks": [{"name": "b", "config": 3}]}, "benchmark 'b': 'config' must be a mapping, got 3"),
    ({"benchmarks": [{"nam": "b"}]}, "benchmark entry 0 must be a mapping with a 'name'"),
    ({"benchmarks": [{"name": "b", "control": "c"}]},
     "benchmark 'b': control 'c' is not a benchmark of the suite; it has ['b']"),
    ({"algorithms": [{"class_path": "FedAvg", "label": 5}]}, "FedAvg: 'label' must be a string, got 5"),
    ({"algorithms": [{"class_path": "FedAvg", "label_args": ["tau"]}]},
     "FedAvg: label_args ['tau'] name no init_args or grid entry; it has []"),
    ({"algorithms": "FedAvg"}, "'algorithms' must be a non-empty list of entries with a class_path, got 'FedAvg'"),
    ({"algorithms": None, "benchmarks": [{"name": "b"}]}, "benchmark 'b' has no algorithms (suite-level or its own)"),
])
def test_a_wrong_suite_is_refused_in_one_line_that_says_what_to_write(change, message):
    with pytest.raises(SuiteFormatError) as refused:
        SuiteSpec.parse({**ONE, **change}, "'t'")
    text = str(refused.value)
    assert text.startswith(f"suite 't': {message}") and "\n" not in text
    assert text.endswith("; see the format at the top of fl_lightning/records/suite_format.py")
