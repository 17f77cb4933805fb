"""Every shipped suite's cells are configurations the code accepts: each distinct algorithm
configuration constructs, and each distinct data configuration passes the data module's checks
(source, its parameters, partition, test split), without reading any data file."""

import importlib
import json

import pytest

from benchmarks.suites import list_suites, load_suite
from fl_lightning.data.datamodule import FederatedDataModule


def distinct(items):
    return {json.dumps(item, sort_keys=True): item for item in items}.values()


def configs():
    return [cell.config for name in list_suites() for cell in load_suite(name, seeds=[0])]


def test_every_data_configuration_is_accepted():
    for data in distinct(config.get("data", {}) for config in configs()):
        FederatedDataModule(**data, seed=0)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_every_algorithm_configuration_constructs():
    checked = 0
    for config in distinct(configs()):
        model, data = config["model"], config.get("data", {})
        module_name, class_name = model["class_path"].rsplit(".", 1)
        algorithm = getattr(importlib.import_module(module_name), class_name)
        datamodule = FederatedDataModule(**data, seed=0)
        args = dict(model.get("init_args") or {})
        args.setdefault("num_classes", datamodule.num_classes)
        args.setdefault("input_shape", datamodule.input_shape)
        try:
            algorithm(**args)
        except Exception as error:  # the suite and the cell that the code refuses
            raise AssertionError(f"{model['class_path']} {args}: {error}") from error
        checked += 1
    assert checked > 100
