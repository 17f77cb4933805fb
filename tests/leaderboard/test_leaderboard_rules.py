"""The rules behind the leaderboard's tables, one function at a time: the Welch test, a seed run
again, the task rebuilt from params, the Pareto front, the papers' YAML and its units, how a store
and a code version are named, and an attacked configuration's unattacked counterpart.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from scipy.stats import t as scipy_t

from leaderboard.stats import welch_test
from tests.leaderboard_builders import record, task_tags

# --- the Welch test ------------------------------------------------------------------------------

def test_welch_p_matches_known_values():
    result = welch_test([1, 2, 3], [4, 5, 6])
    assert result.t == pytest.approx(-3.674235, abs=1e-6) and result.df == pytest.approx(4.0)
    assert result.p == pytest.approx(0.021312, abs=1e-6)
    unequal = welch_test([0.80, 0.81, 0.79, 0.80], [0.70, 0.75, 0.65])  # unequal variances: fractional df
    se2 = (0.0001 / 1.5 / 4, 0.0025 / 3)  # the samples' variance / n, by hand
    t = 0.1 / math.sqrt(sum(se2))
    df = sum(se2) ** 2 / (se2[0] ** 2 / 3 + se2[1] ** 2 / 2)  # 2.08
    assert unequal.t == pytest.approx(t) and unequal.df == pytest.approx(df)
    assert unequal.p == pytest.approx(2 * scipy_t.sf(t, df), rel=1e-9)
    assert unequal.p < 1 - t / math.sqrt(t * t + 2)  # df = 2 has a closed form; more df, smaller p
    assert welch_test([0.8], [0.7, 0.71]) is None  # one seed: no test
    assert welch_test([0.5, 0.5], [0.4, 0.4]).p == 0.0 and welch_test([0.5, 0.5], [0.5, 0.5]).p == 1.0
    assert welch_test([0.1, 0.1, 0.1], [0.1, 0.1]).p == 1.0  # no spread, same mean: never separated


# --- seeds run again, tasks, the Pareto front, the papers' YAML, store names, code versions -------

def test_a_seed_run_again_counts_once_with_its_newest_finished_run():
    from leaderboard.table_building import build_tables
    from leaderboard.views import problem_runs_view, runs_view

    runs = [record("a", "FedAvg", 0, "FAILED", 1), record("b", "FedAvg", 0, "FINISHED", 2, 0.5),
            record("c", "FedAvg", 1, "FINISHED", 3, 0.1), record("d", "FedAvg", 1, "FINISHED", 4, 0.7)]
    (table,) = build_tables(runs)
    (row,) = table.rows
    assert [r.run_id for r in row.used_runs] == ["b", "d"]
    assert (row.seeds_finished, row.seeds_total) == (2, 2)
    assert list(row.superseded) == ["c"] and table.superseded_count == 1
    assert math.isclose(row.stats["test_acc_mean"].mean, 0.6)
    (problem,) = problem_runs_view(table).rows
    assert problem[0].text == "a" and "also has a FINISHED run" in problem[3].text
    used = {cells[0].text: cells[6].text for cells in runs_view(table).rows}
    assert used == {"a": "no", "b": "yes", "c": "no: superseded by d", "d": "yes"}


def test_task_rebuilt_from_params_keeps_what_defines_the_task():
    from leaderboard.tasks import FROM_PARAMS, TAGGED, task_of

    params = {"num_rounds": "10", "partition_params/alpha": "0.5", "partition_params/min_size": "10",
              "test_mode": "local", "local_test_fraction": "0.2", "global_test_fraction": "0.3", "attack": "None",
              "attack_strength": "10.0", "backbone": "fl_mlp", "lr": "0.1"}
    task = task_of({}, params)
    assert task.source == FROM_PARAMS
    assert dict(task.fields) == {"num_rounds": 10, "partition_params": {"alpha": 0.5, "min_size": 10},
                                 "test_mode": "local", "local_test_fraction": 0.2, "model": "fl_mlp"}
    assert task_of({}, {**params, "lr": "0.5"}).key == task.key  # an algorithm setting is not the task
    assert task_of({}, {**params, "num_rounds": "20"}).key != task.key
    tagged = task_of(task_tags(), {})
    assert tagged.source == TAGGED and tagged.key == task_tags()["task_key"]


def test_pareto_front():
    from leaderboard.figures import pareto_front

    # (unfairness, accuracy): lower x and higher y are better
    points = [(1.0, 0.9), (2.0, 0.95), (1.5, 0.85), (0.5, 0.7), (2.0, 0.9)]
    assert pareto_front(points) == [True, True, False, True, False]


def test_paper_numbers_units_and_bad_entries(tmp_path):
    from leaderboard.papers import load_paper_numbers

    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "paper_numbers.yaml").write_text(
        "- {benchmark_setting: s, matches_benchmark: null, algorithm_config: A, source: T1,\n"
        "   offline_counterpart: x/y, counterpart_config: 'A(k=1)',\n"
        "   metrics: {test_acc_mean: 0.5, test_acc_var_percent2: 12.57, test_acc_std_percent: 13.74}}\n"
        "- {benchmark_setting: s, algorithm_config: B, source: T1, metrics: {test_acc_mean: 50.4}}\n"
        "- {benchmark_setting: s, source: T1, metrics: {test_acc_mean: 0.5}}\n")
    numbers, warnings = load_paper_numbers(tmp_path)
    assert len(numbers) == 1 and numbers[0].paper == "p"
    assert numbers[0].metrics == pytest.approx({"test_acc_mean": 0.5, "test_acc_var": 0.001257, "test_acc_std": 0.1374})
    assert numbers[0].offline_counterpart == "x/y" and numbers[0].our_config == "A(k=1)"
    assert len(warnings) == 2 and "0.5042" in warnings[0] and "algorithm_config" in warnings[1]


def test_store_names():
    from leaderboard.runs import store_name

    assert store_name("sqlite:///mlruns.db") == "mlruns.db"
    assert store_name("export:/home/me/a-offline,/home/me/b-offline/") == "2 exports: a-offline, b-offline"
    assert store_name("export:results") == "1 export: results"
    assert store_name("sqlite:////home/someone/work/mlruns.db") == "mlruns.db"
    assert store_name("file:///home/someone/mlruns") == "mlruns"
    assert store_name("http://user:secret@mlflow.example.org:5000") == "http://mlflow.example.org:5000"


def test_code_version_is_the_library_source_tree_at_the_commit():
    """Commits that changed only docs, tests or the leaderboard ran the same library code."""
    import subprocess

    from leaderboard.runs import library_tree

    def git(*args):
        done = subprocess.run(["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True)
        return done.stdout.split() if done.returncode == 0 else None

    commits = git("log", "--format=%H", "-n", "200")
    if not commits or len(commits) < 2:
        pytest.skip("no git history in this checkout")
    trees = {sha: git("rev-parse", f"{sha}:fl_lightning") for sha in commits}
    assert library_tree(commits[0]) == f"fl_lightning@{trees[commits[0]][0][:10]}"
    assert library_tree("f" * 40) == "" and library_tree("unknown") == ""
    same = [(a, b) for a, b in zip(commits, commits[1:]) if trees[a] == trees[b]]
    other = [(a, b) for a, b in zip(commits, commits[1:]) if trees[a] != trees[b]]
    if same:
        assert library_tree(same[0][0]) == library_tree(same[0][1])
    if other:
        assert library_tree(other[0][0]) != library_tree(other[0][1])


def test_an_attacked_configuration_is_compared_with_the_same_algorithm_unattacked():
    from leaderboard.suite_views import without_attack

    assert without_attack("QFedAvg(attack_strength=30.0,q=5.0)") == "QFedAvg(q=5.0)"
    assert without_attack("FedMGDAPlus(attack=bias,attack_client=0,attack_strength=30.0)") == "FedMGDAPlus"
    assert without_attack("FedFV(alpha=0.1,tau=1)") == "FedFV(alpha=0.1,tau=1)"
    assert without_attack("FedAvg") == "FedAvg"
