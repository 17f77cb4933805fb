"""Resuming, extending and interrupting a command-line fit (issue 12).

* A finished run resumed with a larger ``--model.num_rounds`` continues to the new count in the
  same MLflow run, bit for bit like an uninterrupted fit of that length; fewer rounds than the
  checkpoint completed are refused before anything is created.
* A checkpoint records its store as an absolute URI: resumed from another working directory,
  the fit continues its run there; a store given explicitly that lacks the run is refused with
  the store to pass.
* Ctrl-C or SIGTERM ends the run KILLED with its metrics and exits 130 or 143, prints the resume
  command, and that command, run as printed in a shell with no PYTHONPATH and no activated
  virtual environment, resumes the run (the docs' own algorithm, by class path) to FINISHED;
  the ``mlflow ui`` command the finished fit prints serves the store, as printed.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
from lightning.pytorch.loggers import MLFlowLogger
from mlflow.tracking import MlflowClient

from fl_lightning.callbacks import mlflow_store
from fl_lightning.callbacks.mlflow_run import CHECKPOINT_KEY
from fl_lightning.cli import console as cli
from fl_lightning.cli import main
from fl_lightning.records.store_uri import absolute_tracking_uri
from fl_lightning.records.vocabulary import Tag
from tests.docs.test_docs_algorithm import docs_block
from tests.fl_lightning.cli.test_resume_cli import dying_logger
from tests.printed import printed_line, run_as_printed, user_shell_env, words

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]

TIMINGS = ("client_time_s", "server_time_s")  # wall-clock, never reproducible
SLOW_ROUNDS = '''
import time

from lightning.pytorch.callbacks import Callback


class SlowRounds(Callback):
    """Every round takes at least ``seconds`` more: a fit long enough to be interrupted."""

    def __init__(self, seconds: float = 0.3):
        self.seconds = seconds

    def on_train_epoch_end(self, trainer, pl_module):
        time.sleep(self.seconds)
'''


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # checkpoints land in the temporary folder
    return f"sqlite:///{tmp_path / 'runs.db'}"


def fit_args(uri, rounds, *extra):
    store = [f"--trainer.logger.init_args.tracking_uri={uri}"] if uri else []
    return [
        "fit", *store, f"--model.num_rounds={rounds}",
        "--model.eval_every=1", "--model.fraction=0.5", "--model.dropout_prob=0.2", "--model.momentum=0.5",
        "--model.backbone=fl_logreg", "--model.batch_size=16", "--data.source=digits",
        "--data.num_clients=6", "--data.partition=iid", "--data.partition_params={}", *extra,
    ]


def runs_of(uri, experiment="fl-lightning"):
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])


def last_checkpoint(root: Path, run_id: str) -> Path:
    (path,) = [p for p in root.rglob("last.ckpt") if run_id in str(p)]
    return path


def history(client, run_id):
    return {key: [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]
            for key in client.get_run(run_id).data.metrics}


def assert_same_history(have, want):
    assert have.keys() == want.keys()
    for key in want:
        if key in TIMINGS:
            assert [s for s, _ in have[key]] == [s for s, _ in want[key]], key
        else:
            assert have[key] == want[key], key


def refused(capsys, args) -> str:
    """The one line a refused fit prints (exit status 2)."""
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_a_finished_run_extended_to_more_rounds_equals_an_uninterrupted_one(store, tmp_path, capsys):
    client = MlflowClient(store)
    main(fit_args(store, 4))
    (run,) = runs_of(store)
    checkpoint = last_checkpoint(tmp_path / "checkpoints", run.info.run_id)
    capsys.readouterr()

    main(fit_args(store, 4, "--model.num_rounds=6", "--ckpt_path", str(checkpoint)))
    out = capsys.readouterr().out
    assert f"continuing MLflow run {run.info.run_id}" in out and "continues to 6" in out
    (extended,) = runs_of(store)
    assert extended.info.run_id == run.info.run_id and extended.info.status == "FINISHED"
    assert extended.data.params["num_rounds"] == "4"  # MLflow keeps a param's first value
    assert extended.data.tags[Tag.EXTENDED_TO_ROUNDS] == "6"
    assert '"num_rounds": 6' in extended.data.tags["task"]

    main(fit_args(store, 6, "--trainer.logger.init_args.experiment_name=uninterrupted"))
    (reference,) = runs_of(store, "uninterrupted")
    assert_same_history(history(client, run.info.run_id), history(client, reference.info.run_id))
    have = torch.load(last_checkpoint(tmp_path / "checkpoints", run.info.run_id), weights_only=True)
    want = torch.load(last_checkpoint(tmp_path / "checkpoints", reference.info.run_id), weights_only=True)
    assert have["epoch"] == want["epoch"] == 5 and have["hyper_parameters"]["num_rounds"] == 6
    assert have["state_dict"].keys() == want["state_dict"].keys()
    for name, value in want["state_dict"].items():
        assert torch.equal(have["state_dict"][name], value), name


@pytest.mark.parametrize("lengths", [(3, 5), (2, 3, 5)])
def test_an_extended_run_replays_identically_along_its_own_route(lengths, store, tmp_path, capsys):
    """Evaluated every 2 rounds, a 3-round fit also evaluates at its last round (round 3), which a
    5-round fit does not, and the per-layer conflict counts (a mean since the last evaluation)
    differ after it. So an extended run is not a straight fit of its final length: ``replay`` fits
    it along the route it took (3, then extended to 5; 2, 3, then 5), which the run records in
    its ``fit_lengths`` tag, and finds every number again."""
    from fl_lightning.cli.replay import replay_run

    client = MlflowClient(store)
    every_two = ("--model.eval_every=2",)
    main(fit_args(store, lengths[0], *every_two))
    (run,) = runs_of(store)
    for length in lengths[1:]:
        checkpoint = last_checkpoint(tmp_path / "checkpoints", run.info.run_id)
        main(fit_args(store, lengths[0], *every_two, f"--model.num_rounds={length}", "--ckpt_path", str(checkpoint)))
    capsys.readouterr()
    (extended,) = runs_of(store)
    assert extended.data.tags[Tag.FIT_LENGTHS] == ",".join(map(str, lengths))
    assert extended.data.tags[Tag.EXTENDED_TO_ROUNDS] == str(lengths[-1])
    layers = [key for key in extended.data.metrics if key.startswith("conflicts_layer/")]
    assert layers and 3 in {m.step for m in client.get_metric_history(run.info.run_id, "test_acc_mean")}

    outcome = replay_run(client, extended, record=False, progress=lambda line: None)
    assert outcome.identical, outcome.divergence
    assert outcome.rounds == lengths[-1] and outcome.route == lengths


def test_fewer_rounds_than_the_checkpoint_completed_are_refused_before_anything_is_created(store, tmp_path, capsys):
    main(fit_args(store, 3))
    (run,) = runs_of(store)
    checkpoint = last_checkpoint(tmp_path / "checkpoints", run.info.run_id)
    before = sorted(str(p) for p in (tmp_path / "checkpoints").rglob("*"))
    capsys.readouterr()

    error = refused(capsys, fit_args(store, 2, "--ckpt_path", str(checkpoint)))
    assert "--model.num_rounds 2 is fewer than the 3 rounds" in error and "pass more than 3 to extend it" in error
    error = refused(capsys, fit_args(store, 3, "--ckpt_path", str(checkpoint)))  # nothing left to train
    assert "nothing to resume" in error and "more than 3" in error
    assert [r.info.run_id for r in runs_of(store)] == [run.info.run_id]
    assert MlflowClient(store).get_run(run.info.run_id).info.status == "FINISHED"
    assert sorted(str(p) for p in (tmp_path / "checkpoints").rglob("*")) == before


def crashed_fit(args, capsys, monkeypatch):
    """A fit that dies at the end of round 2; returns the printed resume command."""
    with monkeypatch.context() as patch:
        patch.setattr(MLFlowLogger, "log_metrics", dying_logger(2))
        with pytest.raises(RuntimeError, match="simulated crash"):
            main(args)
    out = capsys.readouterr().out
    return words(printed_line(out, "resume it with:"))[1]


def test_a_checkpoint_finds_its_run_from_any_working_directory(tmp_path, capsys, monkeypatch):
    first, elsewhere = tmp_path / "first", tmp_path / "elsewhere"
    first.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(first)
    command = crashed_fit(fit_args(None, 4), capsys, monkeypatch)  # the default store, sqlite:///mlruns.db
    store = f"sqlite:///{first / 'mlruns.db'}"
    (run,) = runs_of(store)
    checkpoint = Path(command[-1])
    assert checkpoint.is_absolute() and checkpoint.is_file()
    recorded = torch.load(checkpoint, weights_only=True)[CHECKPOINT_KEY]["runs"]
    assert [r["tracking_uri"] for r in recorded] == [absolute_tracking_uri("sqlite:///mlruns.db")] == [store]

    monkeypatch.chdir(elsewhere)
    main(command[1:])  # the printed command, from another directory
    out = capsys.readouterr().out
    assert f"continuing MLflow run {run.info.run_id} in {store} (the store the checkpoint recorded)" in out
    assert not (elsewhere / "mlruns.db").exists()
    (resumed,) = runs_of(store)
    assert resumed.info.run_id == run.info.run_id and resumed.info.status == "FINISHED"
    steps = [m.step for m in MlflowClient(store).get_metric_history(run.info.run_id, "train_loss")]
    assert steps == [1, 2, 3, 4]


def test_a_store_given_that_lacks_the_run_gets_a_new_run_and_the_store_to_pass(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store, other = f"sqlite:///{tmp_path / 'runs.db'}", f"sqlite:///{tmp_path / 'other.db'}"
    command = crashed_fit(fit_args(store, 4), capsys, monkeypatch)
    (run,) = runs_of(store)
    main([*command[1:], f"--trainer.logger.init_args.tracking_uri={other}"])
    lines = [line for line in capsys.readouterr().out.splitlines() if "logs to a new run" in line]
    assert len(lines) == 1 and lines[0].endswith(f"pass --trainer.logger.init_args.tracking_uri {store}"), lines
    (new,) = runs_of(other)
    assert new.info.status == "FINISHED" and new.data.tags["resumed_from_runs"] == run.info.run_id


@pytest.mark.parametrize("absolute", [False, True])
def test_absolute_tracking_uri(tmp_path, monkeypatch, absolute):
    monkeypatch.chdir(tmp_path)
    here = tmp_path.resolve()
    if absolute:
        for uri in (f"sqlite:///{here}/a.db", "http://127.0.0.1:5000", "postgresql://u@h/db", f"file://{here}/m"):
            assert absolute_tracking_uri(uri) == uri
    else:
        assert absolute_tracking_uri("sqlite:///runs/a.db?timeout=5") == f"sqlite:///{here}/runs/a.db?timeout=5"
        assert absolute_tracking_uri("file:./mlruns") == (here / "mlruns").as_uri()
        assert absolute_tracking_uri("mlruns") == (here / "mlruns").as_uri()
    assert cli.DEFAULT_TRACKING_URI in mlflow_store.DEFAULT_STORES


def ui_starts_as_printed(command: str, cwd: Path, url: str = "http://127.0.0.1:5000/", timeout: float = 120) -> None:
    """``mlflow ui ...`` as the fit printed it serves the store at ``url`` (the printed link's host)."""
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2):
        pytest.skip(f"{url} is taken by another server: the printed command would not start its own")
    server = subprocess.Popen(command, shell=True, cwd=cwd, env=user_shell_env(), text=True, start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert server.poll() is None, server.communicate()[0]
            assert time.monotonic() < deadline, f"{command!r} served nothing at {url} in {timeout} s"
            try:
                with urllib.request.urlopen(
                    f"{url}api/2.0/mlflow/experiments/search?max_results=5", timeout=2
                ) as answer:
                    assert b"fl-lightning" in answer.read()  # this store's experiment
                    break
            except OSError:
                time.sleep(0.5)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.communicate(timeout=60)


def fl_lightning_command() -> list[str]:
    script = Path(sys.executable).parent / "fl-lightning"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "fl_lightning.cli"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stopped_fit_ends_killed_with_its_metrics_and_resumes(signum, store, tmp_path, capsys, monkeypatch):
    code = tmp_path / "code"
    code.mkdir()
    (code / "slow_rounds.py").write_text(SLOW_ROUNDS)
    (code / "my_algorithms.py").write_text(docs_block("# my_algorithms.py"))  # the docs' own algorithm
    rounds = 12
    args = fit_args(store, rounds, "--model=my_algorithms.LossWeightedAvg", "--model.smoothing=0.3",
                    "--trainer.callbacks+=slow_rounds.SlowRounds", "--trainer.callbacks.init_args.seconds=0.3")
    # the user's shell (no activated virtual environment), with the folder of their modules on PYTHONPATH
    env = {**user_shell_env(), "PYTHONPATH": str(code)}
    process = subprocess.Popen([*fl_lightning_command(), *args], cwd=tmp_path, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not list((tmp_path / "checkpoints").rglob("last.ckpt")):
            assert process.poll() is None, process.communicate()[0]
            assert time.monotonic() < deadline, "no checkpoint after 300 s"
            time.sleep(0.05)
        process.send_signal(signum)
        out, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 128 + signum, out  # the shell's status for the signal: 130, 143
    assert f"({signal.Signals(signum).name})" in out.splitlines()[-1], out  # "terminated (SIGTERM)"
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out

    (run,) = runs_of(store)
    assert run.info.status == "KILLED", out
    client = MlflowClient(store)
    done = torch.load(last_checkpoint(tmp_path / "checkpoints", run.info.run_id), weights_only=True)[CHECKPOINT_KEY]
    assert 1 <= done["rounds_completed"] < rounds, out
    # the metrics are kept: every round's evaluation up to the checkpoint's (the training metrics
    # of the checkpoint's round may be missing: Lightning logs them after the checkpoint)
    evaluated = [m.step for m in client.get_metric_history(run.info.run_id, "test_acc_mean")]
    trained = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
    assert evaluated == list(range(1, len(evaluated) + 1)) and len(evaluated) >= done["rounds_completed"], out
    assert trained == list(range(1, len(trained) + 1)) and len(trained) >= done["rounds_completed"] - 1, out
    hints = [line for line in out.splitlines() if "resume it with:" in line]
    assert len(hints) == 2, out  # at the start, and again when stopped
    printed = hints[-1].split("resume it with:", 1)[1].strip()
    env, command = words(printed)
    assert env == {"PYTHONPATH": str(code)}, printed
    assert Path(command[0]).name == "fl-lightning" and command[1:-2] == args and command[-2] == "--ckpt_path"

    resumed_fit = run_as_printed(printed, tmp_path)  # as a user pastes it: no PYTHONPATH, no activated venv
    assert resumed_fit.returncode == 0, resumed_fit.stdout
    assert f"continuing MLflow run {run.info.run_id}" in resumed_fit.stdout
    if signum == signal.SIGTERM:  # and the MLflow UI command the finished fit prints, as printed
        ui_starts_as_printed(printed_line(resumed_fit.stdout, "See it:"), tmp_path)
    (resumed,) = runs_of(store)
    assert resumed.info.run_id == run.info.run_id and resumed.info.status == "FINISHED"
    for key in ("train_loss", "test_acc_mean"):
        assert [m.step for m in client.get_metric_history(run.info.run_id, key)] == list(range(1, rounds + 1)), key
