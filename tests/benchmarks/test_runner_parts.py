"""The runner's parts, each without a fit: the launcher its options choose, the config file a
cell's fit reads (the suite's store and experiment, its tags as text, the checkpoint it resumes),
the cells of a suite and of a confirmatory pass (read from the registration given), the dry run's
plan, and what ``run_suite`` hands each of them."""

import re
from pathlib import Path

import pytest
import yaml

from benchmarks import runner
from benchmarks.suites import literal_text, load_suite
from tests.benchmarks.test_runner import SUITE
from tests.benchmarks.test_runner_claims import FakeLauncher


class Made:
    """A launcher class that records how it was made."""

    def __init__(self, kind, made):
        self.kind, self.made = kind, made

    def __call__(self, *args):
        self.made.append((self.kind, args))
        return self.kind


@pytest.fixture
def launchers(monkeypatch):
    made = []
    for kind in ("SubmititJobs", "IsolatedProcesses", "WarmWorkers"):
        monkeypatch.setattr(runner, kind, Made(kind, made))
    return made


def test_the_options_choose_the_launcher_a_cluster_first(launchers):
    """A cluster: submitit jobs in ``benchmark_jobs/<suite>`` unless a job folder is given, each with
    the cores asked for (else the worker's threads), the timeout and the partition; else a fresh
    process a cell with ``--isolate``; else ``jobs`` reused workers. Each with the threads given."""
    assert runner._launcher("s", 3, 2, True, "slurm", None, "gpu", 90, None) == "SubmititJobs"
    assert runner._launcher("s", 3, 2, False, "local", "jobs_here", None, 60, 5) == "SubmititJobs"
    assert runner._launcher("s", 3, 2, True, None, "ignored", "ignored", 60, 5) == "IsolatedProcesses"
    assert runner._launcher("s", 3, 2, False, None, None, None, 60, None) == "WarmWorkers"
    assert launchers == [
        ("SubmititJobs", ("slurm", Path("benchmark_jobs") / "s", 2, 90, "gpu")),
        ("SubmititJobs", ("local", Path("jobs_here"), 5, 60, None)),
        ("IsolatedProcesses", (2,)),
        ("WarmWorkers", (3, 2)),
    ]


@pytest.fixture
def cell(tmp_path):
    suite = dict(SUITE, description="Sec. 5: four clients # of digits", algorithms=SUITE["algorithms"][:1])
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(suite))
    (cell,) = load_suite(str(path))
    return cell


def test_a_cells_config_logs_to_the_suites_experiment_in_the_store_with_its_tags_as_text(cell, tmp_path,
                                                                                          monkeypatch):
    """Without a path: a temporary file, the cell's config in its order with an MLflow logger to the
    suite's experiment in the given store, every tag as LightningCLI will read it back as text; no
    checkpoint looked for (only a cell run beside its log resumes)."""
    asked = []
    monkeypatch.setattr(runner, "resumable_checkpoint", lambda uri, c: asked.append(c) or "/x/last.ckpt")
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    written = Path(runner._cell_config_file(cell, uri))
    text = written.read_text()
    config = yaml.safe_load(text)
    logger = config["trainer"].pop("logger")
    assert config == cell.config and asked == []
    assert list(config) == list(cell.config)  # in the cell's order, not sorted
    assert [line.split(":")[0] for line in text.splitlines() if not line.startswith(" ")] == list(cell.config)
    assert logger["class_path"] == "lightning.pytorch.loggers.MLFlowLogger"
    assert logger["init_args"]["experiment_name"] == cell.suite and logger["init_args"]["tracking_uri"] == uri
    assert logger["init_args"]["tags"] == {key: literal_text(value) for key, value in cell.tags.items()}
    assert "Sec. 5:\u00a0four clients\u00a0# of digits" in logger["init_args"]["tags"].values()
    assert written.suffix == ".yaml" and written.parent != tmp_path
    written.unlink()


@pytest.mark.parametrize("checkpoint", [None, "/kept/last.ckpt"])
def test_a_cells_config_beside_its_log_is_written_whole_and_resumes_the_checkpoint_left(cell, tmp_path, monkeypatch,
                                                                                       checkpoint):
    """At a path: its folder made, the file written then renamed into place (no temporary file left,
    an older file replaced), its absolute path returned; the checkpoint of the cell's unfinished run
    becomes ``ckpt_path``, none without one."""
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    asked = []
    monkeypatch.setattr(runner, "resumable_checkpoint", lambda store, c: asked.append((store, c)) or checkpoint)
    monkeypatch.chdir(tmp_path)
    path = Path("logs") / "suite" / "cell.yaml"  # neither folder exists yet
    renamed = []
    real_replace = runner.os.replace
    monkeypatch.setattr(runner.os, "replace",
                        lambda source, target: renamed.append(Path(source).parent) or real_replace(source, target))
    written = runner._cell_config_file(cell, uri, path)
    assert renamed == [(tmp_path / path).parent]  # written in its own folder: the rename cannot cross file systems
    assert written == str((tmp_path / path).resolve()) and asked == [(uri, cell)]
    assert sorted(p.name for p in (tmp_path / path).parent.iterdir()) == ["cell.yaml"]
    config = yaml.safe_load(Path(written).read_text())
    assert config.get("ckpt_path") == checkpoint and ("ckpt_path" in config) == (checkpoint is not None)
    Path(written).write_text("an older file")
    assert runner._cell_config_file(cell, uri, path) == written
    assert yaml.safe_load(Path(written).read_text()) == config
    assert sorted(p.name for p in (tmp_path / path).parent.iterdir()) == ["cell.yaml"]


def edited_registration(tmp_path):
    """A registration of its own under tmp_path: benchmarks/'s registered files with other seeds and
    another description of cgsv/offline, its hash recorded; and a decoy beside them that only a
    wrong reading of a suite path would take."""
    import shutil

    from benchmarks.suites import SUITES_DIR
    from fl_lightning.records.registration import PLAN_FILE, registration_hash, with_recorded_hash

    root = tmp_path / "registered"
    shutil.copytree(SUITES_DIR, root, ignore=shutil.ignore_patterns("perf", "__pycache__", "*.py", "ledger_runs"))
    confirmatory = root / "ledger_confirmatory.yaml"
    text, edits = re.subn(r"first: 1000\n(.*\n)*?  values: \[[^]]*\]",
                          f"first: 2000\n  count: 10\n  values: {list(range(2000, 2010))}", confirmatory.read_text())
    assert edits == 1
    confirmatory.write_text(text)
    suite = yaml.safe_load((root / "cgsv" / "offline.yaml").read_text())
    (root / "cgsv" / "offline.yaml").write_text(yaml.safe_dump(dict(suite, description="the registered copy")))
    (tmp_path / "given.yaml").write_text(yaml.safe_dump(dict(suite, description="the file given")))
    (tmp_path / "given.yml").write_text(yaml.safe_dump(dict(suite, description="the .yml file given")))
    for given in ("given.yaml", "given.yml"):
        (root / f"{given}.yaml").write_text(yaml.safe_dump(dict(suite, description="a decoy")))
    plan = root / PLAN_FILE
    plan.write_text(with_recorded_hash(plan.read_text(), registration_hash(root)))
    return root, registration_hash(root)


def test_a_confirmatory_pass_reads_its_hash_seeds_and_suite_from_the_registration_given(tmp_path, monkeypatch):
    """Under ``root``: its hash on every cell, its seeds (a subset picked keeps their registered
    order; all of them may be picked), its copy of a suite named by name, while a suite given as a
    path is read there; the cells are the ones selected, the exploratory ones beside them."""
    root, digest = edited_registration(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FL_BENCHMARKS_LEDGER_ROOT", raising=False)
    chosen = (["mnist5k/cla/full/fl_mlp"], ["FedAvg"])
    exploratory, cells = runner._confirmatory_cells("cgsv/offline", None, *chosen, root)
    assert [c.seed for c in cells] == list(range(2000, 2010)) and {c.plan_hash for c in cells} == {digest}
    assert {(c.benchmark, c.algorithm_config, c.description) for c in exploratory + cells} == {
        ("mnist5k/cla/full/fl_mlp", "FedAvg", "the registered copy")}
    assert [c.seed for c in exploratory] == [c.seed for c in cells] and exploratory[0].plan_hash == ""
    assert runner._suite_cells("cgsv/offline", None, *chosen, True, root) == (cells, (exploratory, cells))
    _, picked = runner._confirmatory_cells("cgsv/offline", [2007, 2002], *chosen, root)
    assert [c.seed for c in picked] == [2002, 2007]
    _, every = runner._confirmatory_cells("cgsv/offline", list(range(2009, 1999, -1)), *chosen, root)
    assert [c.seed for c in every] == list(range(2000, 2010))
    _, given = runner._confirmatory_cells("given.yaml", [2000], *chosen, root)
    assert [(c.description, c.seed) for c in given] == [("the file given", 2000)]
    _, given = runner._confirmatory_cells("given.yml", [2001], *chosen, root)
    assert [(c.description, c.seed) for c in given] == [("the .yml file given", 2001)]
    with pytest.raises(SystemExit, match=r"suite 'cgsv/offline' has no benchmark 'nope'"):
        runner._confirmatory_cells("cgsv/offline", None, ["nope"], None, root)


def test_an_exploratory_suite_is_its_selected_cells_with_nothing_to_rescale(suite_file, tmp_path):
    path = suite_file
    cells, rescale = runner._suite_cells(str(path), [4, 5], None, ["FedAvg"], False, None)
    assert rescale is None and [(c.algorithm_config, c.seed) for c in cells] == [("FedAvg", 4), ("FedAvg", 5)]
    assert runner._suite_cells(str(path), None, None, None, False, tmp_path / "unused")[0] == load_suite(str(path))


@pytest.fixture
def plan_calls(monkeypatch):
    """benchmarks.plan's estimate, recorded: what the dry run hands it and prints of it."""
    from benchmarks import plan

    calls = {}
    monkeypatch.setattr(plan, "published_durations",
                        lambda suite: calls.setdefault("published", suite) and {"p": [1.0]})
    monkeypatch.setattr(plan, "rescaled_durations", lambda published, before, after: calls.setdefault(
        "rescaled", (published, before, after)) and {"r": [2.0]})
    monkeypatch.setattr(plan, "plan_lines", lambda todo, durations, jobs, published: calls.setdefault(
        "plan", (todo, durations, jobs, published)) and ["estimate one", "estimate two"])
    return calls


def test_a_dry_run_plan_lists_the_runs_to_run_then_the_estimate_from_the_store_and_published_times(
        suite_file, plan_calls, capsys):
    cells = load_suite(str(suite_file), [0, 1])
    runner._print_plan("tiny-offline", cells, cells[1:3], {"measured": [3.0]}, 2, None)
    assert capsys.readouterr().out == (f"  would run {cells[1].cell} seed 1\n  would run {cells[2].cell} seed 0\n"
                                       "estimate one\nestimate two\n")
    assert plan_calls == {"published": "tiny-offline", "plan": (cells[1:3], {"measured": [3.0]}, 2, {"p": [1.0]})}


def test_a_confirmatory_dry_run_says_its_seeds_hash_and_each_runs_registered_length(suite_file, plan_calls, capsys):
    """The times measured at the exploratory lengths are rescaled to the registered ones (the store's
    times are not used); a cell without a length of its own says so by an empty one."""
    from dataclasses import replace

    exploratory = load_suite(str(suite_file), [7, 9])[:2]
    cells = [replace(exploratory[0], plan_hash="0123456789abcdef"),
             replace(exploratory[1], plan_hash="0123456789abcdef", config={"model": {"class_path": "FedAvg"}})]
    runner._print_plan("tiny-offline", cells, cells, {"measured": [3.0]}, 1, (exploratory, cells))
    assert capsys.readouterr().out == (
        "  (confirmatory pass: seeds 7..9, plan hash 0123456789ab, the rounds and cadence of "
        "ledger_confirmatory.yaml)\n"
        f"  would run {cells[0].cell} seed 7 (2 rounds, eval every 1)\n"
        f"  would run {cells[1].cell} seed 9 ( rounds, eval every )\n"
        "estimate one\nestimate two\n")
    assert plan_calls["rescaled"] == ({"p": [1.0]}, exploratory, cells)
    assert plan_calls["plan"] == (cells, {}, 1, {"r": [2.0]})
    runner._print_plan("tiny-offline", [], [], {}, 1, ([], []))  # nothing left to run
    assert capsys.readouterr().out.startswith("  (confirmatory pass: seeds .., plan hash , the rounds")


def test_a_suite_runs_what_the_store_lacks_on_the_launcher_its_options_choose(suite_file, tmp_path, monkeypatch,
                                                                              capsys):
    """The header counts the runs, cells, finished runs, runs to run and jobs; the launcher gets the
    options and each job's share of the cores; each cell claims beside the store and writes its config
    and log under ``benchmark_logs/<suite>``; every run to run runs once, the finished one not again."""
    from mlflow.tracking import MlflowClient

    path = suite_file
    uri = f"sqlite:///{tmp_path / 'runs.db'}"
    cells = load_suite(str(path), [0, 1])
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment(cells[0].suite), tags=cells[0].tags)
    client.set_terminated(run.info.run_id, "FINISHED")
    launcher, options = FakeLauncher(), []
    claimed = []
    monkeypatch.setattr(runner, "_launcher", lambda *args: options.append(args) or launcher)
    folders, real_folder = [], runner.claims_folder
    monkeypatch.setattr(runner, "claims_folder", lambda *args: folders.append(args) or real_folder(*args))
    real = runner.run_cell
    monkeypatch.setattr(runner, "run_cell", lambda cell, store, logs, used, claims: claimed.append(
        (store, logs, used, claims)) or real(cell, store, logs, used, claims))
    code = runner.run_suite(str(path), seeds=[0, 1], jobs=2, tracking_uri=uri, isolate=True, cluster="local",
                            job_folder="jobs", slurm_partition="part", timeout_min=7, cpus_per_job=3)
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith("suite tiny-offline: 6 runs (3 cells x seeds), 1 already finished, 5 to run with 2 job(s)\n")
    assert options == [("tiny-offline", 2, runner.threads_per_job(2), True, "local", "jobs", "part", 7, 3)]
    logs = Path("benchmark_logs") / "tiny-offline"
    assert claimed == [(uri, logs, launcher, tmp_path / "runs.db.claims" / "tiny-offline")] * 5
    assert sorted(launcher.calls) == sorted(f"{runner.cell_file_name(c)}.yaml" for c in cells[1:])
    assert sorted(p.name for p in logs.iterdir()) == sorted(launcher.calls)
    assert [line.split()[0] for line in out.splitlines() if line.startswith("[")] == [f"[{n}/5]" for n in range(1, 6)]
    assert f"logs in {logs}\n" in out and folders == [(uri, "tiny-offline", logs)]
    assert runner.run_suite(str(path), seeds=[0, 1], tracking_uri=uri) == 0  # again, in the same folder


def two_benchmarks(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(dict(SUITE, benchmarks=[
        {"name": "digits/iid/full/fl_logreg"},
        {"name": "longer", "config": {"model": {"init_args": {"num_rounds": 3}}}}])))
    return path


def test_a_dry_run_counts_the_selected_runs_with_one_job_by_default_and_reads_the_suites_published_times(
        tmp_path, monkeypatch, capsys):
    from benchmarks import plan

    monkeypatch.chdir(tmp_path)
    path = two_benchmarks(tmp_path)
    asked = []
    monkeypatch.setattr(plan, "published_durations", lambda suite: asked.append(suite) or {})
    code = runner.run_suite(str(path), seeds=[0, 1], benchmarks=["longer"], configs=["FedAvg"], dry_run=True,
                            tracking_uri=f"sqlite:///{tmp_path / 'runs.db'}")
    out = capsys.readouterr().out
    assert code == 0 and asked == ["tiny-offline"]
    assert out.startswith("suite tiny-offline: 2 runs (1 cells x seeds), 0 already finished, 2 to run with 1 job(s)\n")
    assert out.count("would run longer|FedAvg seed") == 2 and "would run digits" not in out


def test_a_suites_algorithms_are_checked_naming_the_suite_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(dict(SUITE, algorithms=[{"class_path": "fl_lightning.algorithms.FedAvgg"}])))
    with pytest.raises(SystemExit, match=rf"^suite '{re.escape(str(path))}', FedAvgg: no algorithm class"):
        runner.run_suite(str(path), tracking_uri=f"sqlite:///{tmp_path / 'runs.db'}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["typo.yaml"]


def test_a_confirmatory_dry_run_runs_the_registration_it_is_given(tmp_path, monkeypatch, capsys):
    root, digest = edited_registration(tmp_path)
    monkeypatch.chdir(tmp_path)
    code = runner.run_suite("cgsv/offline", tracking_uri=f"sqlite:///{tmp_path / 'store.db'}", dry_run=True,
                            confirmatory=True, root=root, benchmarks=["mnist5k/cla/full/fl_mlp"], configs=["FedAvg"])
    out = capsys.readouterr().out
    assert code == 0 and f"seeds 2000..2009, plan hash {digest[:12]}" in out
    assert out.count("would run mnist5k/cla/full/fl_mlp|FedAvg seed 20") == 10


def test_the_suites_first_line_is_out_before_any_cell_starts_even_into_a_pipe(suite_file, tmp_path, monkeypatch):
    """Block-buffered output (a pipe, a log file) shows what the suite will run before its cells start."""
    import io
    import sys

    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-8", line_buffering=False))
    shown = []
    monkeypatch.setattr(runner, "_launcher", lambda *args: shown.append(raw.getvalue().decode()) or FakeLauncher())
    assert runner.run_suite(str(suite_file), tracking_uri=f"sqlite:///{tmp_path / 'runs.db'}") == 0
    assert shown == ["suite tiny-offline: 3 runs (3 cells x seeds), 0 already finished, 3 to run with 1 job(s)\n"]


def test_a_confirmatory_suite_runs_its_cells_as_the_confirmatory_pass(tmp_path, monkeypatch):
    """The pass's cells go to the scheduler marked as the pass (a stop then names ``--confirmatory``)."""
    root, digest = edited_registration(tmp_path)
    monkeypatch.chdir(tmp_path)
    scheduled = []
    monkeypatch.setattr(runner, "_run_cells", lambda todo, launcher, progress, **options: scheduled.append(
        (todo, options["name"], options["confirmatory"])) or 2)
    monkeypatch.setattr(runner, "_launcher", lambda *args: None)
    code = runner.run_suite("cgsv/offline", tracking_uri=f"sqlite:///{tmp_path / 'store.db'}", confirmatory=True,
                            root=root, benchmarks=["mnist5k/cla/full/fl_mlp"], configs=["FedAvg"])
    ((todo, name, confirmatory),) = scheduled
    assert (name, confirmatory) == ("cgsv/offline", True) and {c.plan_hash for c in todo} == {digest}
    assert code == 1  # none of them ran


def test_an_exploratory_suites_selection_reaches_its_cells_and_a_wrong_name_is_refused_naming_the_suite(tmp_path):
    path = two_benchmarks(tmp_path)
    cells, _ = runner._suite_cells(str(path), None, ["longer"], None, False, None)
    assert {c.benchmark for c in cells} == {"longer"} and len(cells) == 3
    with pytest.raises(SystemExit, match=rf"^suite '{re.escape(str(path))}' has no benchmark 'nope'"):
        runner._suite_cells(str(path), None, ["nope"], None, False, None)
