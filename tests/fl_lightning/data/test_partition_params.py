"""Partition parameters are checked from the partitioner's signature: each annotated keyword
parameter's type is its check, with no table of rules by name."""

import inspect
import math
from typing import Annotated

import numpy as np
import pytest
from pydantic import Field, PydanticSchemaGenerationError

from fl_lightning.data import partition_registry
from fl_lightning.data.partition import (
    PARTITIONERS,
    Concentration,
    Count,
    check_partition_params,
    partition,
    register_partitioner,
)

LABELS = np.arange(100) % 10
Fraction = Annotated[float, Field(ge=0, le=1)]


@pytest.fixture
def registry(monkeypatch):
    """A copy of the registry, so partitioners registered by a test do not outlive it."""
    monkeypatch.setattr(partition_registry, "PARTITIONERS", dict(PARTITIONERS))
    return partition_registry.PARTITIONERS


def test_every_keyword_parameter_of_every_partitioner_is_annotated():
    for name, fn in PARTITIONERS.items():
        keywords = list(inspect.signature(fn).parameters.values())[3:]
        assert keywords, name
        for p in keywords:
            assert p.annotation is not inspect.Parameter.empty, f"{name}.{p.name} is unchecked"


def test_a_new_partitioner_is_checked_from_its_annotations_alone(registry):
    @register_partitioner("annotated")
    def annotated(
        labels,
        num_clients,
        seed=0,
        *,
        depth: Count = 3,
        rate: Concentration = 1.0,
        share: Fraction = 0.5,
        cap: Count | None = None,
        flag: bool = False,
    ):
        return np.array_split(np.arange(len(labels)), num_clients)

    assert "annotated" in registry
    assert len(partition("annotated", LABELS, 2, depth=np.int64(4), rate=2, cap=None)) == 2
    refusals = {
        "depth": ({"depth": 0}, r"an integer >= 1, got 0; .*e\.g\. \{'depth': 3\}\."),
        "rate": ({"rate": math.inf}, r"> 0 \(a finite number\), got inf; .*\{'rate': 1\.0\}\."),
        "share": ({"share": 1.5}, r">= 0 and <= 1 \(a number\), got 1\.5; .*\{'share': 0\.5\}\."),
        "cap": ({"cap": 2.0}, r"an integer >= 1 \(or null\), got 2\.0; .*\{'cap': 10\}\."),
        "flag": ({"flag": 1}, r"true or false, got 1; .*\{'flag': false\}\."),
    }
    for param, (params, message) in refusals.items():
        with pytest.raises(ValueError, match=rf"^annotated: {param} must be {message}$") as refused:
            check_partition_params("annotated", params)
        assert "\n" not in str(refused.value)


def test_an_annotation_pydantic_cannot_check_is_refused_when_registered(registry):
    class Opaque:
        pass

    with pytest.raises(PydanticSchemaGenerationError):

        @register_partitioner("opaque")
        def opaque(labels, num_clients, seed=0, *, thing: Opaque):
            return []


# (partitioner, parameter, wrong value, what the message says it must be)
WRONG = [
    ("dirichlet", "alpha", 0, r"> 0 \(a finite number\)"),
    ("dirichlet", "alpha", -1.0, r"> 0 \(a finite number\)"),
    ("dirichlet", "alpha", math.nan, r"> 0 \(a finite number\)"),
    ("dirichlet", "alpha", "0.5", r"> 0 \(a finite number\)"),
    ("dirichlet", "alpha", True, r"> 0 \(a finite number\)"),
    ("power_law", "alpha", math.inf, r"> 0 \(a finite number\)"),
    ("dirichlet", "min_size", 0, "an integer >= 1"),
    ("dirichlet", "max_tries", 2.5, "an integer >= 1"),
    ("pathological", "classes_per_client", True, "an integer >= 1"),
    ("shards", "shards_per_client", "2", "an integer >= 1"),
    ("shards", "num_shards", 0, r"an integer >= 1 \(or null\)"),
    ("iid", "total_size", 6000.0, r"an integer >= 1 \(or null\)"),
    ("power_law", "total_size", -5, r"an integer >= 1 \(or null\)"),
    ("linspace_classes", "samples_per_client", np.float64(600.5), r"an integer >= 1 \(or null\)"),
    ("linspace_classes", "random_classes", 1, "true or false"),
    ("linspace_classes", "random_classes", "yes", "true or false"),
    ("linspace_classes", "random_classes", None, "true or false"),
]


@pytest.mark.parametrize("name,param,value,requirement", WRONG)
def test_a_wrong_value_is_refused_in_one_line_naming_the_parameter(name, param, value, requirement):
    pattern = (
        rf"^{name}: {param} must be {requirement}, got .*; fix it in partition_params, e\.g\. \{{'{param}': .+\}}\.$"
    )
    with pytest.raises(ValueError, match=pattern) as refused:
        check_partition_params(name, {param: value})
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "name,params",
    [
        ("dirichlet", {"alpha": 1, "min_size": np.int64(2), "max_tries": 5}),
        ("dirichlet", {"alpha": np.float32(0.1)}),
        ("shards", {"num_shards": None, "shards_per_client": np.int32(2)}),
        ("linspace_classes", {"samples_per_client": None, "random_classes": np.bool_(True)}),
        ("class_assignment", {"assignment": np.array([[0, 1], [2, 3]])}),
        ("natural", {"client_ids": [0, 1, 1]}),
    ],
)
def test_right_values_pass_including_ints_for_floats_and_numpy_scalars(name, params):
    check_partition_params(name, params)


def test_structured_parameters_keep_their_own_messages():
    with pytest.raises(ValueError, match=r"^class_assignment\[1\] = \[2, 2\] must be a non-empty list of distinct"):
        check_partition_params("class_assignment", {"assignment": [[1], [2, 2]]})
    with pytest.raises(ValueError, match=r"^client_ids must be integer client ids.*got dtype float64"):
        partition("natural", LABELS, 2, client_ids=np.zeros(len(LABELS)))
