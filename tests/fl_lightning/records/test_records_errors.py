"""Issue 52: one translator of pydantic's refusals into one line, and one did-you-mean, shared by
every declared format and name list (``fl_lightning.records.errors``)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from pydantic import BaseModel, ConfigDict, StrictInt, ValidationError, field_validator

from fl_lightning.records.errors import did_you_mean, first_refusal, one_line
from tests.paths import REPO

ROOT = REPO


class Window(BaseModel):
    model_config = ConfigDict(extra="forbid")
    window: StrictInt = 3
    change_pp: float = 0.5


class Side(BaseModel):
    model_config = ConfigDict(extra="forbid")
    config: str = ""


class Plan(BaseModel):
    model_config = ConfigDict(extra="forbid")
    alpha: float
    convergence: Window | None = None
    rounds: list[Window] = []
    treatment: Side | str = ""
    point: str = "final"

    @field_validator("point")
    @classmethod
    def _known_point(cls, value: str) -> str:
        if value not in ("final", "best"):
            raise ValueError(f"unknown point {value!r}; valid: final, best")
        return value


def said(raw: object) -> str:
    with pytest.raises(ValidationError) as raised:
        Plan.model_validate(raw)
    line = one_line(raised.value, Plan)
    assert "\n" not in line
    return line


@pytest.mark.parametrize("raw, line", [
    ({}, "missing alpha"),
    ({"alpha": "high"}, "`alpha` input should be a valid number, unable to parse string as a number, got 'high'"),
    ({"alpha": 0.1, "alpah": 0.1}, "unknown key 'alpah'; did you mean 'alpha'?; valid: alpha, convergence, rounds, "
                                   "treatment, point"),
    ({"alpha": 0.1, "convergence": {"windw": 2}},
     "unknown key 'convergence.windw'; did you mean 'window'?; valid: window, change_pp"),
    ({"alpha": 0.1, "rounds": [{}, {"window": "2"}]}, "`rounds[1].window` input should be a valid integer, got '2'"),
    ({"alpha": 0.1, "point": "last"}, "unknown point 'last'; valid: final, best"),  # a validator's own text
    ({"alpha": 0.1, "treatment": {"confg": "A"}}, "unknown key 'treatment.confg'; did you mean 'config'?"),  # a union
    ({"alpha": 0.1, "treatment": 5}, "`treatment` input should be a valid dictionary or instance of Side, got 5"),
    (["alpha"], "Input should be a valid dictionary or instance of Plan, got ['alpha']"),
])
def test_a_refusal_is_one_line_saying_where_what_and_the_value(raw, line):
    assert line in said(raw)


def test_a_refusal_is_read_into_its_parts():
    with pytest.raises(ValidationError) as raised:
        Plan.model_validate({"alpha": 0.1, "treatment": {"config": "A", "benchmrk": "b"}})
    refusal = first_refusal(raised.value, Plan)
    assert (refusal.kind, refusal.loc, refusal.key, refusal.known) == (
        "extra_forbidden", ("treatment", "benchmrk"), "benchmrk", ("config",))  # the union's tag left out
    assert refusal.value == "b" and not refusal.own_text
    without_model = first_refusal(raised.value)
    assert without_model.known == () and str(without_model).startswith("unknown key 'treatment.Side.benchmrk'")


@pytest.mark.parametrize("name, known, hint", [
    ("fedlf", ["FedAvg", "FedLF", "FedFV"], "; did you mean 'FedLF'?"),  # case only: first
    ("FEDAVG", ["FedAvg", "FedProx"], "; did you mean 'FedAvg'?"),
    ("windw", ["window", "change_pp"], "; did you mean 'window'?"),
    ("windw", ["window", "windows", "beta"], "; did you mean 'window' or 'windows'?"),  # two at most
    ("zzz", ["window", "change_pp"], ""),
    ("anything", [], ""),
])
def test_did_you_mean(name, known, hint):
    assert did_you_mean(name, known) == hint


def test_did_you_mean_takes_any_names_and_a_prefix():
    assert did_you_mean(5, ("5a", "x")) == "; did you mean '5a'?"
    assert did_you_mean("FedPrx", {"FedProx": 1}, prefix="pkg.") == "; did you mean 'pkg.FedProx'?"


def test_the_translator_loads_no_torch_and_nothing_of_the_library_beside_it():
    code = ("import sys, fl_lightning.records.errors; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning', 'pydantic', "
            "'fl_lightning')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['fl_lightning', 'fl_lightning.records', 'fl_lightning.records.errors']"


def test_only_the_translator_compares_names_with_difflib():
    """A second did-you-mean would drift from the first: every other module asks records.errors."""
    importing = re.compile(r"^\s*(import difflib|from difflib import)", re.MULTILINE)
    found = sorted(str(path.relative_to(ROOT)) for package in ("fl_lightning", "leaderboard")
                   for path in (ROOT / package).rglob("*.py") if importing.search(path.read_text(encoding="utf-8")))
    assert found == ["fl_lightning/records/errors.py"]
