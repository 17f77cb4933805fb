"""Issue 52, every run name in one vocabulary: the metric and artifact names a fit writes and the
leaderboard reads are spelled in ``fl_lightning.records.vocabulary`` alone; a writer or reader that spells
one itself (a string, or the fixed part of an f-string) fails here."""

import ast
import sys
from pathlib import Path

from fl_lightning.records import vocabulary
from fl_lightning.records.vocabulary import (
    SHAPLEY_ERRORS,
    Artifact,
    ClientMetrics,
    Metric,
    agent_metric,
    agent_of,
    shapley_gap,
)
from tests.paths import REPO

ROOT = REPO


def names_of(holder: type) -> set[str]:
    return {value for key, value in vars(holder).items() if key.isupper() and isinstance(value, str)}


# ClientMetrics' other fields (status, clients, rounds_completed) are also ordinary words of the
# export's columns and the figures: only its per-client accuracy is a name of its own
NAMES = names_of(Metric) - {Metric.TEST_ACC_PREFIX} | names_of(Artifact) | {ClientMetrics.TEST_ACCURACY}
PREFIXES = (Metric.TEST_ACC_PREFIX,)


def spells_a_name(text: str) -> bool:
    """A vocabulary name, the start of one agent's series (``cgsv_r/``), a name with a suffix to
    come (``cgsv_shapley_``) or a client-accuracy statistic (``test_acc_...``)."""
    return (text in NAMES or text.startswith(PREFIXES)
            or any(text.startswith(f"{name}/") or text == f"{name}_" for name in NAMES))


def spelled(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string constant of ``source`` (f-strings' fixed parts included) that
    spells a vocabulary name."""
    return sorted((node.lineno, node.value) for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and spells_a_name(node.value))


VOCABULARY = {Path(str(module.__file__)).resolve() for module in (vocabulary, sys.modules[Metric.__module__])}


def modules(*packages: str) -> list[Path]:
    return [path for package in packages for path in sorted((ROOT / package).rglob("*.py"))
            if path.resolve() not in VOCABULARY]


def test_no_reader_or_writer_spells_a_name_of_the_vocabulary():
    found = [f"{path.relative_to(ROOT)}:{line}: {text!r}"
             for path in modules("leaderboard", "fl_lightning", "benchmarks")
             for line, text in spelled(path.read_text())]
    assert not found, "use fl_lightning.records.vocabulary's Metric / Artifact / ClientMetrics:\n" + "\n".join(found)


def test_the_scan_sees_a_name_spelled_by_hand():
    source = '''
CLIENT_METRICS_ARTIFACT = "clients/final_client_metrics.json"
TIMES = ("client_time_s", "server_time_s")
gaps = {f"cgsv_shapley_{e}_gap" for e in ("l1", "l2")}
distance = f"cgsv_distance/{agent}"
worst = run.final("test_acc_worst10")
'''
    assert [line for line, _ in spelled(source)] == [2, 3, 3, 4, 5, 6]
    assert spelled('label = "client time"\nsuffix = f"{name}_l1"\nkey = "status"') == []


def test_the_names_the_leaderboard_reads_are_the_vocabulary():
    from benchmarks.timing import DEFAULT_READING, READINGS
    from leaderboard.claims.quantities import AGENT_METRICS
    from leaderboard.figures import AGENT_PANELS
    from leaderboard.runs import AGENT_SERIES, CLIENT_METRICS_ARTIFACT, HISTORY_METRICS, PER_ROUND_METRICS

    metrics = names_of(Metric)
    assert set(HISTORY_METRICS) | set(AGENT_SERIES) | set(PER_ROUND_METRICS) <= metrics
    assert {series for series, _ in AGENT_METRICS.values()} | {series for series, _ in AGENT_PANELS} <= metrics
    assert {reading.metric for reading in (DEFAULT_READING, *READINGS.values())} <= metrics
    assert CLIENT_METRICS_ARTIFACT == Artifact.CLIENT_METRICS


def test_built_names_are_the_stored_spellings():
    assert [shapley_gap(error) for error in SHAPLEY_ERRORS] == [Metric.CGSV_SHAPLEY_L1_GAP, Metric.CGSV_SHAPLEY_L2_GAP]
    assert shapley_gap("l1") == "cgsv_shapley_l1_gap"
    assert agent_metric(Metric.CGSV_R, 3) == "cgsv_r/3" and agent_of("cgsv_r/3") == (Metric.CGSV_R, 3)
    assert agent_of(Metric.CGSV_R) is None and agent_of("cgsv_r/x") is None and agent_of("x/") is None
    # the names runs already logged are read by (the store's): never renamed
    assert (Metric.CLIENT_TIME_S, Metric.SERVER_TIME_S, Metric.AFL_LAMBDA, Artifact.CLIENT_METRICS) == (
        "client_time_s", "server_time_s", "afl_lambda", "clients/final_client_metrics.json")


def test_an_extended_runs_route_is_read_from_its_tags():
    fit_lengths, tag = vocabulary.fit_lengths, vocabulary.Tag
    assert fit_lengths({tag.FIT_LENGTHS: "3,5,8", tag.EXTENDED_TO_ROUNDS: "8"}, {"num_rounds": "3"}) == [3, 5, 8]
    assert fit_lengths({tag.EXTENDED_TO_ROUNDS: "5"}, {"num_rounds": "3"}) == [3, 5]  # before the tag: one extension
    assert fit_lengths({}, {"num_rounds": "3"}) == []  # never extended
    assert fit_lengths({tag.EXTENDED_TO_ROUNDS: "3"}, {"num_rounds": "3"}) == []
    assert fit_lengths({tag.EXTENDED_TO_ROUNDS: "5"}, {}) == []  # no param to start from
