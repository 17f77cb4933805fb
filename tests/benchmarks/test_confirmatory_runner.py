"""The runner's confirmatory mode (issue 48): refused before anything is created unless the
registered files match the plan's hash; fresh seeds; the registered rounds and cadence reach each
cell's config; every run carries the pass and the hash."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

from benchmarks import command_line
from benchmarks.ledger import (
    CONFIRMATORY,
    ROOT_VARIABLE,
    confirmatory_cells,
    ledger_suites,
    load_confirmatory,
    rule_seeds,
    run_ledger,
    used_seeds,
)
from benchmarks.runner import _cell_config_file, run_suite
from benchmarks.suites import SUITES_DIR, load_suite
from fl_lightning.records.vocabulary import Tag
from leaderboard.registration import PLAN_FILE, registration_hash, registration_problem

EXPORTS = SUITES_DIR.parent / "evidence" / "exploratory"  # the committed exploratory exports


def registered_copy(tmp_path: Path) -> tuple[Path, str]:
    """benchmarks/'s registered files copied under tmp_path, the plan recording their hash."""
    root = tmp_path / "benchmarks"
    shutil.copytree(SUITES_DIR, root, ignore=shutil.ignore_patterns("perf", "__pycache__", "*.py"))
    digest = registration_hash(root)
    plan = root / PLAN_FILE
    plan.write_text(plan.read_text().rstrip("\n") + f"\nregistered_hash: {digest}\n")
    assert registration_problem(root) == ""
    return root, digest


def cli(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(sys, "argv", ["fl-benchmarks", *argv])
    return command_line.cli()


@pytest.mark.parametrize("argv", [["run", "cgsv/offline", "--confirmatory"], ["ledger", "--confirmatory"],
                                  ["run", "cgsv/offline", "--confirmatory", "--dry-run"]])
def test_a_changed_registration_is_refused_before_anything_is_created(tmp_path, monkeypatch, capsys, argv):
    root, digest = registered_copy(tmp_path)
    claims = root / "cgsv" / "claims.yaml"
    claims.write_text(claims.read_text() + "\n# an edit after registration\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv(ROOT_VARIABLE, str(root))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{work / 'store.db'}")
    assert cli(argv, monkeypatch) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("error: refused: ") and "changed after registration" in err and digest[:12] in err
    assert list(work.iterdir()) == []  # no store, no logs, no exports


def test_a_plan_without_a_recorded_hash_is_refused(tmp_path, monkeypatch, capsys):
    root, _ = registered_copy(tmp_path)
    plan = root / PLAN_FILE
    plan.write_text("".join(line for line in plan.read_text().splitlines(keepends=True)
                            if not line.startswith("registered_hash:")))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(ROOT_VARIABLE, str(root))
    assert cli(["run", "fedfv/offline", "--confirmatory"], monkeypatch) == 2
    assert "records no registered_hash" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="records no registered_hash"):
        run_ledger("sqlite:///never.db", tmp_path / "exports", confirmatory=True, root=root)
    assert not (tmp_path / "exports").exists() and not (tmp_path / "never.db").exists()


def test_the_fresh_seeds_follow_their_rule_and_no_committed_run_used_them():
    registered = load_confirmatory()
    used = used_seeds(EXPORTS)
    assert set(range(10)) <= used and set(range(20)) <= used  # fedfv-order-ablations-offline ran 0-19
    assert registered.seeds == rule_seeds(registered.first, registered.count, used)
    assert not set(registered.seeds) & used
    for suite in sorted(SUITES_DIR.glob("*/*.yaml")):
        raw = yaml.safe_load(suite.read_text())
        seeds = raw.get("seeds") if isinstance(raw, dict) else None
        assert not set(registered.seeds) & set(seeds if isinstance(seeds, list) else []), suite


def test_rule_seeds_skips_used_ones():
    assert rule_seeds(1000, 3, {1001, 1003}) == [1000, 1002, 1004]


def test_every_ledger_suite_has_registered_lengths_that_the_convergence_rule_can_judge():
    registered = load_confirmatory()
    for name, experiment in ledger_suites():
        lengths = registered.lengths[experiment]
        benchmarks = {cell.benchmark for cell in load_suite(name)}
        assert benchmarks == set(lengths), name
        for setting in lengths.values():  # 10 evaluations: the last 6 in the second half
            assert setting["num_rounds"] % setting["eval_every"] == 0
            assert setting["num_rounds"] // setting["eval_every"] >= 10


def test_the_overrides_reach_the_cells_config_and_the_tags_carry_the_hash(tmp_path):
    root, digest = registered_copy(tmp_path)
    registered = load_confirmatory(root)
    exploratory = load_suite(str(root / "cgsv" / "offline.yaml"), registered.seeds)
    cells = confirmatory_cells(exploratory, registered, digest)
    assert {cell.seed for cell in cells} == set(registered.seeds)
    setting = registered.lengths["cgsv-offline"]["mnist5k/uni/full/fl_mlp"]
    cell = next(c for c in cells if c.benchmark == "mnist5k/uni/full/fl_mlp")
    config = yaml.safe_load(Path(_cell_config_file(cell, f"sqlite:///{tmp_path / 'x.db'}")).read_text())
    init_args = config["model"]["init_args"]
    assert (init_args["num_rounds"], init_args["eval_every"]) == (setting["num_rounds"], setting["eval_every"])
    assert config["seed_everything"] == cell.seed
    tags = config["trainer"]["logger"]["init_args"]["tags"]
    assert tags[Tag.LEDGER_PASS] == CONFIRMATORY and tags[Tag.LEDGER_PLAN_HASH] == digest
    assert tags[Tag.CELL_CONFIG] == cell.config_tag
    assert Tag.LEDGER_PASS not in exploratory[0].tags  # exploratory runs carry no pass tag


def test_a_run_under_another_hash_never_counts_as_done():
    cell = load_suite("cgsv/offline", [1000])[0]
    registered = load_confirmatory()
    ours = confirmatory_cells([cell], registered, "a" * 64)[0]
    theirs = confirmatory_cells([cell], registered, "b" * 64)[0]
    assert ours.config == theirs.config
    assert ours.config_tag != theirs.config_tag  # the resume key (cell, seed, cell_config) differs
    plain = load_suite("cgsv/offline", [1000])[0]
    assert plain.config_tag == cell.config_tag  # exploratory digests are unchanged


def test_a_benchmark_without_registered_lengths_is_refused():
    cells = load_suite("cgsv/offline", [1000])
    registered = load_confirmatory()
    registered.lengths["cgsv-offline"].pop("mnist5k/uni/full/fl_mlp")
    with pytest.raises(SystemExit, match="sets no num_rounds and eval_every"):
        confirmatory_cells(cells, registered, "a" * 64)


def test_a_registered_dry_run_lists_the_confirmatory_runs_and_creates_nothing(tmp_path, monkeypatch, capsys):
    root, digest = registered_copy(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    status = run_suite("cgsv/offline", tracking_uri=f"sqlite:///{work / 'store.db'}", dry_run=True,
                       confirmatory=True, root=root, benchmarks=["mnist5k/cla/full/fl_mlp"], configs=["FedAvg"])
    out = capsys.readouterr().out
    assert status == 0
    setting = load_confirmatory(root).lengths["cgsv-offline"]["mnist5k/cla/full/fl_mlp"]
    assert (f"would run mnist5k/cla/full/fl_mlp|FedAvg seed 1000 ({setting['num_rounds']} rounds, "
            f"eval every {setting['eval_every']})") in out
    assert digest[:12] in out and "estimated time" in out
    assert list(work.iterdir()) == []


def test_seeds_and_confirmatory_are_refused_together(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        command_line.main(["run", "cgsv/offline", "--confirmatory", "--seeds", "3"])
    assert "--seeds and --confirmatory" in capsys.readouterr().err


def test_a_confirmatory_call_may_pick_registered_seeds_only(tmp_path, monkeypatch, capsys):
    """The timing driver runs the pass one registered seed per call; an unregistered seed is refused."""
    root, digest = registered_copy(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    options = dict(tracking_uri=f"sqlite:///{work / 'store.db'}", dry_run=True, confirmatory=True, root=root,
                   benchmarks=["mnist5k/cla/full/fl_mlp"], configs=["FedAvg"])
    registered = load_confirmatory(root).seeds
    assert run_suite("cgsv/offline", seeds=[registered[1]], **options) == 0
    out = capsys.readouterr().out
    assert f"seed {registered[1]} (" in out and f"seed {registered[0]} (" not in out
    with pytest.raises(SystemExit, match="only the pass's registered seeds"):
        run_suite("cgsv/offline", seeds=[3], **options)
    assert list(work.iterdir()) == []
