"""Metric names are spelled once (fl_lightning.records.vocabulary.Metric): the writers log what the readers
look up, and no module of the library, the runner or the leaderboard spells a name itself."""

import io
import re
import tokenize
from pathlib import Path

import torch

from fl_lightning.metrics.fairness import SUMMARY_KEYS, fairness_summary
from fl_lightning.records.vocabulary import Metric
from tests.paths import REPO

ROOT = REPO
NAMES = {value for key, value in vars(Metric).items() if key.isupper() and key != "TEST_ACC_PREFIX"}
STRING_PARTS = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}  # f-strings from 3.12


def test_the_client_accuracy_statistics_are_the_names_the_readers_use():
    logged = set(fairness_summary(torch.tensor([0.2, 0.5, 0.9, 0.4]), prefix=Metric.TEST_ACC_PREFIX))
    declared = {name for name in NAMES if name.startswith(Metric.TEST_ACC_PREFIX)}
    assert logged == declared == {Metric.TEST_ACC_PREFIX + key for key in SUMMARY_KEYS}


def spelled_names(path: Path) -> list[str]:
    """``line: text`` of each string in ``path`` (docstrings and other triple-quoted text aside)
    that holds a metric's name as a word of its own."""
    found = []
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type not in STRING_PARTS or token.string.lstrip("rbfuRBFU").startswith(('"""', "'''")):
            continue
        if any(re.search(rf"(?<!\w){name}(?!\w)", token.string) for name in NAMES):
            found.append(f"{path.relative_to(ROOT)}:{token.start[0]}: {token.line.strip()}")
    return found


def test_no_module_spells_a_metric_name_itself():
    found = [hit for package in ("fl_lightning", "benchmarks", "leaderboard")
             for path in sorted((ROOT / package).rglob("*.py")) if path.name != "vocabulary.py"
             for hit in spelled_names(path)]
    assert not found, "use fl_lightning.records.vocabulary.Metric instead:\n" + "\n".join(found)
