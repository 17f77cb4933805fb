"""Issue 35: a ``paper_numbers.yaml`` entry is a declared format (a pydantic model with
``extra="forbid"``): a misspelt key, a non-number, a missing field are refused in one line each
that names the entry, and the entry is skipped with that warning."""

from __future__ import annotations

from leaderboard.papers import PaperNumberEntry, load_paper_numbers

GOOD = "{benchmark_setting: s, algorithm_config: A, source: T1, metrics: {test_acc_mean: 0.5}}"


def warnings_for(tmp_path, *entries: str) -> list[str]:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "paper_numbers.yaml").write_text("".join(f"- {entry}\n" for entry in entries))
    numbers, warnings = load_paper_numbers(tmp_path)
    assert len(numbers) == sum(entry == GOOD for entry in entries)
    return warnings


def test_a_misspelt_key_is_refused_with_a_did_you_mean(tmp_path):
    (warning,) = warnings_for(tmp_path, GOOD, GOOD.replace("algorithm_config", "algorithm_confg"))
    assert "entry 1: unknown key 'algorithm_confg'; did you mean 'algorithm_config'?" in warning
    assert warning.endswith("; skipped") and "\n" not in warning


def test_wrong_values_are_refused_one_line_each(tmp_path):
    warnings = warnings_for(tmp_path, "{algorithm_config: A, metrics: {test_acc_mean: yes}}",
                            "{algorithm_config: A, metrics: {}}", "3", "{metrics: {test_acc_mean: 0.5}}")
    assert [w.split(": ", 1)[1] for w in warnings] == [
        "metric 'test_acc_mean' = True is not a number; skipped",
        "'metrics' must be a non-empty mapping of metric name -> number; skipped",
        "expected a mapping with benchmark_setting, algorithm_config, metrics, source; skipped",
        "'algorithm_config' is missing; skipped",
    ]


def test_every_shipped_entry_uses_only_declared_keys():
    numbers, warnings = load_paper_numbers()
    assert numbers and warnings == []
    assert set(PaperNumberEntry.model_fields) >= {"benchmark_setting", "algorithm_config", "metrics", "source"}
