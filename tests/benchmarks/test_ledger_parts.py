"""``fl-benchmarks ledger``: the claims ledger's suites run one after the other, each finished suite
exported completely and skipped from then on; a suite with a failed run is not exported."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from benchmarks.command_line import main
from benchmarks.ledger import claimed_suites, ledger_suites, run_ledger
from benchmarks.runner import run_suite
from benchmarks.suites import load_suite
from tests.paths import REPO

ROOT = REPO
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from leaderboard.export_reading import read_export  # noqa: E402
from leaderboard.runs import load_runs  # noqa: E402

pytestmark = pytest.mark.integration


def tiny_suite(tmp_path: Path, name: str, backbone: str = "fl_logreg") -> tuple[str, str]:
    suite = {
        "suite": name, "paper": "fedfv", "scale": "offline", "description": "Tiny: four clients of digits",
        "seeds": [0, 1],
        "base": {"trainer": {"enable_checkpointing": False},
                 "model": {"init_args": {"backbone": backbone, "num_rounds": 2, "eval_every": 1, "fraction": 1.0,
                                         "batch_size": 16}},
                 "data": {"source": "digits", "num_clients": 4, "partition": "iid"}},
        "benchmarks": [{"name": "digits/iid/full/fl_logreg"}],
        "algorithms": [{"class_path": "fl_lightning.algorithms.FedAvg"}],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(suite))
    return str(path), name


def test_the_ledger_is_every_offline_suite_a_claim_reads():
    suites = ledger_suites()
    claimed = claimed_suites()
    assert suites and all(experiment in claimed for _, experiment in suites)
    for name, _ in suites:
        assert load_suite(name)[0].scale == "offline"
    names = {name for name, _ in suites}
    assert "quickstart/offline" not in names and not any(name.endswith("/paper") for name in names)
    assert "cgsv-label-noise-paper" in claimed and "cgsv/label_noise_paper" not in names  # paper scale: out


def test_finished_suites_are_exported_and_skipped_and_a_failed_one_waits(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    exports = tmp_path / "exports"
    good = tiny_suite(tmp_path, "tiny-a-offline")
    bad = tiny_suite(tmp_path, "tiny-b-offline", backbone="fl_nope")  # passes the checks, fails when it runs
    last = tiny_suite(tmp_path, "tiny-c-offline")
    ran: list[str] = []

    def counting_run(name: str, **options) -> int:
        ran.append(name)
        return run_suite(name, **options)

    assert run_ledger(uri, exports, suites=[good, bad, last], run=counting_run) == 1
    assert ran == [good[0], bad[0]]  # the suite after the failed one waits
    assert sorted(p.name for p in exports.iterdir()) == ["tiny-a-offline"]  # no partial folder left
    assert {p.name for p in (exports / "tiny-a-offline").iterdir()} == {
        "runs.parquet", "rounds.parquet", "records.parquet"}
    assert "tiny-b-offline.yaml did not finish every run" in capsys.readouterr().out
    # the export holds the suite's runs as the store does
    exported = read_export([exports / "tiny-a-offline"], progress=lambda m: None).runs
    stored = load_runs(uri, ["tiny-a-offline"], progress=lambda m: None).runs
    assert sorted(r.run_id for r in exported) == sorted(r.run_id for r in stored) and len(stored) == 2
    assert {r.run_id: r.metrics for r in exported} == {r.run_id: r.metrics for r in stored}
    assert all(r.client_metrics for r in exported)  # the client-level artifact came along

    # the next part (the failed suite dropped): the exported suite is not run again
    ran.clear()
    capsys.readouterr()
    assert run_ledger(uri, exports, suites=[good, (last[0], last[1])], run=counting_run) == 0
    assert ran == [last[0]]
    build = capsys.readouterr().out.splitlines()[-1]  # the build command, each exported folder named
    folders = f"{exports / 'tiny-a-offline'} {exports / 'tiny-c-offline'}"
    assert "build --from-export" in build and build.endswith(folders)
    assert sorted(p.name for p in exports.iterdir()) == ["tiny-a-offline", "tiny-c-offline"]
    runs = pd.read_parquet(exports / "tiny-c-offline" / "runs.parquet")
    assert list(runs["status"]) == ["FINISHED", "FINISHED"]


def test_a_file_given_as_the_exports_folder_is_refused(tmp_path, capsys):
    target = tmp_path / "exports"
    target.write_text("not a folder")
    with pytest.raises(SystemExit):
        main(["ledger", "--exports", str(target), "--tracking-uri", f"sqlite:///{tmp_path / 'runs.db'}"])
    assert "is a file: give a folder" in capsys.readouterr().err
    assert not (tmp_path / "runs.db").exists()


def test_a_failed_export_is_said_in_one_line_and_the_suite_stays_unexported(tmp_path, capsys):
    import subprocess

    def failing_export(tracking_uri: str, experiment: str, exports: Path) -> Path:
        raise subprocess.CalledProcessError(2, ["python", "-m", "leaderboard", "export"])

    status = run_ledger("sqlite:///unused.db", tmp_path / "exports", suites=[("a/offline", "a-offline")],
                        run=lambda name, **options: 0, export=failing_export)
    assert status == 1 and list((tmp_path / "exports").iterdir()) == []
    assert "a/offline finished but its export failed" in capsys.readouterr().out


def test_a_dry_run_says_what_is_left_and_creates_nothing(tmp_path, capsys):
    exports = tmp_path / "exports"
    assert main(["ledger", "--dry-run", "--jobs", "2", "--exports", str(exports),
                 "--tracking-uri", f"sqlite:///{tmp_path / 'runs.db'}"]) == 0
    out = capsys.readouterr().out
    assert "17 suites, 0 already exported" in out and "cgsv/ablations_offline" in out and "110 runs" in out
    assert "left: about" in out and "at --jobs 2" in out
    assert list(tmp_path.iterdir()) == []  # no store, no exports folder
    (exports / "cgsv-ablations-offline").mkdir(parents=True)
    assert main(["ledger", "--dry-run", "--exports", str(exports)]) == 0
    out = capsys.readouterr().out
    assert "1 already exported" in out and re.search(r"cgsv/ablations_offline +exported", out)


def test_the_ledger_runs_a_timing_suite_through_the_timing_driver(monkeypatch, tmp_path):
    """Timing claims read dedicated timing runs: the ledger never runs a timing suite at --jobs."""
    import benchmarks.runner as runner
    import benchmarks.timing as timing
    from benchmarks.ledger import is_timing_suite

    called: list[tuple[str, str, int]] = []
    monkeypatch.setattr(runner, "run_suite", lambda name, **o: called.append(("runner", name, o["jobs"])) or 1)
    monkeypatch.setattr(timing, "run_timing_suite", lambda name, **o: called.append(("timing", name, o["jobs"])) or 1)
    assert is_timing_suite("fedlf/timing_offline") and not is_timing_suite("fedlf/offline")
    run_ledger("sqlite:///unused.db", tmp_path / "a", jobs=2, suites=[("fedlf/timing_offline", "fedlf-timing-offline")])
    run_ledger("sqlite:///unused.db", tmp_path / "b", jobs=2, suites=[("fedlf/offline", "fedlf-offline")])
    assert called == [("timing", "fedlf/timing_offline", 2), ("runner", "fedlf/offline", 2)]
