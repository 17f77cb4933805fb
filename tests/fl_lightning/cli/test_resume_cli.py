"""`fl-lightning fit --ckpt_path last.ckpt` continues the interrupted fit's MLflow run: the same
run id, no step logged twice, FINISHED at the end, the same numbers as an uninterrupted fit."""

from pathlib import Path

import pytest
from lightning.pytorch.loggers import MLFlowLogger
from mlflow.tracking import MlflowClient

from fl_lightning.callbacks.fit_report import resume_command
from fl_lightning.cli import main
from tests.printed import printed_line, words

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("one_thread")]



ROUNDS = 4


def fit_args(uri, *extra):
    return [
        "fit", f"--trainer.logger.init_args.tracking_uri={uri}", f"--model.num_rounds={ROUNDS}",
        "--model.eval_every=1", "--model.fraction=0.5", "--model.dropout_prob=0.2", "--model.momentum=0.5",
        "--model.backbone=fl_logreg", "--model.batch_size=16", "--data.source=digits",
        "--data.num_clients=6", "--data.partition=iid", "--data.partition_params={}", *extra,
    ]


def dying_logger(round_number):
    """MLFlowLogger.log_metrics that kills the fit when it is asked for the training metrics of
    ``round_number``: the process dies after that round's checkpoint was written and before its
    metrics reached the store (Lightning logs a round's metrics after its checkpoint)."""
    log_metrics = MLFlowLogger.log_metrics

    def log_or_die(self, metrics, step=None):
        if step == round_number and "train_loss" in metrics:
            raise RuntimeError("simulated crash")
        return log_metrics(self, metrics, step)

    return log_or_die


def interrupted_fit(uri, capsys, monkeypatch, *extra):
    """A fit that dies at the end of round 2; returns its run and the printed resume command."""
    with monkeypatch.context() as patch:
        patch.setattr(MLFlowLogger, "log_metrics", dying_logger(2))
        with pytest.raises(RuntimeError, match="simulated crash"):
            main(fit_args(uri, *extra))
    out = capsys.readouterr().out
    command = words(printed_line(out, "resume it with:"))[1]
    runs = MlflowClient(uri).search_runs([MlflowClient(uri).get_experiment_by_name("fl-lightning").experiment_id])
    assert len(runs) == 1
    return runs[0], command


def history(client, run_id):
    return {key: [(m.step, m.value) for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]
            for key in client.get_run(run_id).data.metrics}


def test_resumed_fit_continues_the_same_mlflow_run(store, capsys, monkeypatch):
    client = MlflowClient(store)
    run, command = interrupted_fit(store, capsys, monkeypatch)
    assert run.info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")] == [1]  # round 2's: lost
    assert [m.step for m in client.get_metric_history(run.info.run_id, "test_acc_mean")] == [1, 2]
    assert Path(command[0]).name == "fl-lightning" and command[1] == "fit" and command[-2] == "--ckpt_path"
    checkpoint = Path(command[-1])
    assert checkpoint.name == "last.ckpt" and checkpoint.is_file() and run.info.run_id in str(checkpoint)
    # as if the killed process had also evaluated round 3 before dying (after the checkpoint of round 2)
    client.log_metric(run.info.run_id, "test_acc_mean", 0.125, step=3)

    main(command[1:])  # the printed command, as a user would paste it
    out = capsys.readouterr().out
    assert f"continuing MLflow run {run.info.run_id}" in out

    runs = client.search_runs([run.info.experiment_id])
    assert [r.info.run_id for r in runs] == [run.info.run_id]
    resumed = runs[0]
    assert resumed.info.status == "FINISHED"
    assert resumed.info.run_name == run.info.run_name  # a continued run keeps its name
    assert resumed.data.tags["resumed_at_round"] == "2"
    logged = history(client, run.info.run_id)
    for key, entries in logged.items():
        steps = [step for step, _ in entries]
        assert len(steps) == len(set(steps)), f"{key} logged twice at a step: {steps}"
    assert [step for step, _ in logged["train_loss"]] == list(range(1, ROUNDS + 1))  # round 2's restored
    assert logged["test_acc_mean"][2] == (3, 0.125)  # the step already in the store is not logged again

    # the same numbers as a fit that was never interrupted
    main(fit_args(store, "--trainer.logger.init_args.experiment_name=uninterrupted"))
    reference = client.search_runs([client.get_experiment_by_name("uninterrupted").experiment_id])[0]
    expected = history(client, reference.info.run_id)
    assert logged.keys() == expected.keys()
    for key in expected.keys() - {"client_time_s", "server_time_s", "test_acc_mean"}:
        assert logged[key] == expected[key], key
    for key in ("client_time_s", "server_time_s"):
        assert [step for step, _ in logged[key]] == [step for step, _ in expected[key]]
    assert logged["test_acc_mean"][3] == expected["test_acc_mean"][3]


@pytest.mark.parametrize("change", ["another store", "changed setting"])
def test_resume_that_cannot_continue_the_run_starts_a_new_one(change, store, tmp_path, capsys, monkeypatch):
    run, command = interrupted_fit(store, capsys, monkeypatch)
    # a data setting that changes no number (digits are not read from data_dir), but MLflow keeps
    # one value per parameter (the model's settings come from the checkpoint: LightningCLI)
    uri, extra, message = store, ["--data.data_dir=moved"], "data_dir data -> moved"
    if change == "another store":
        uri, extra, message = f"sqlite:///{tmp_path / 'other.db'}", [], "logs to a new run"
    main(fit_args(uri, *extra, "--ckpt_path", command[-1]))
    assert message in capsys.readouterr().out
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("fl-lightning").experiment_id])
    (new,) = [r for r in runs if r.info.run_id != run.info.run_id]
    assert new.info.status == "FINISHED" and new.data.tags["resumed_from_runs"] == run.info.run_id
    assert [m.step for m in client.get_metric_history(new.info.run_id, "train_loss")] == list(range(3, ROUNDS + 1))
    if change == "changed setting":  # the interrupted run is left as it was
        old = client.get_run(run.info.run_id)
        assert old.info.status == "FAILED" and old.data.params["data_dir"] == "data"


def test_resume_command_replaces_an_earlier_checkpoint(monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    command = resume_command(["fit", "--ckpt_path", "old.ckpt", "--ckpt_path=older.ckpt", "--model=FedAvg"], "a b.ckpt")
    assert command.endswith("fl-lightning fit --model=FedAvg --ckpt_path 'a b.ckpt'"), command
    monkeypatch.setenv("PYTHONPATH", "my code")
    assert resume_command(["fit"], "last.ckpt").startswith("PYTHONPATH='my code' ")  # what made the modules importable


@pytest.mark.parametrize("version", ["1.0.0", None], ids=["an-old-lightning", "no-version"])
def test_a_checkpoint_lightning_cannot_resume_is_refused_before_the_store_changes(version, store, tmp_path, capsys):
    """A checkpoint from another installation (its Lightning version edited, or removed): one line
    naming the file given, and the store and the finished run untouched, byte for byte."""
    import hashlib

    import torch

    main(fit_args(store))
    client = MlflowClient(store)
    (run,) = client.search_runs([client.get_experiment_by_name("fl-lightning").experiment_id])
    (last,) = Path().glob(f"checkpoints/*/{run.info.run_id}/checkpoints/last.ckpt")
    checkpoint = torch.load(last, weights_only=True)
    if version is None:
        del checkpoint["pytorch-lightning_version"]
    else:
        checkpoint["pytorch-lightning_version"] = version
    given = tmp_path / "from-elsewhere.ckpt"
    torch.save(checkpoint, given)
    database = tmp_path / "runs.db"
    before = hashlib.sha256(database.read_bytes()).hexdigest()
    capsys.readouterr()

    with pytest.raises(SystemExit) as stopped:
        main(fit_args(store, f"--model.num_rounds={ROUNDS + 2}", "--ckpt_path", str(given)))
    assert stopped.value.code != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(given) in err and "last.ckpt" not in err.split(str(given))[0]
    assert ("Lightning 1.0.0" in err) if version else ("does not say which Lightning wrote it" in err)
    assert hashlib.sha256(database.read_bytes()).hexdigest() == before
    assert client.get_run(run.info.run_id).info.status == "FINISHED"
