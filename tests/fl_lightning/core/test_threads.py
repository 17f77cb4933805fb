"""Issue 33: a run's numbers depend only on its logged settings, not on the machine's thread count.

The intra-op thread count changes the bits of MKL's products, so it is a setting of the run
(``threads``, default 1, ``core.threads.FitThreads``): fixed from the start, logged, kept by a
resume. The bit-for-bit matrix: FedAvg, FedFV, FedLF and CGSV on both engines give the same
metrics and the same final model whatever count the process had before the fit (1, 2 or 4).
"""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch

from fl_lightning.algorithms import CGSV, FedAvg, FedFV, FedLF
from fl_lightning.core.threads import FitThreads
from fl_lightning.data.datamodule import FederatedDataModule
from tests import builders
from tests.accelerator import accelerator
from tests.call_logger import CallLogger

pytestmark = pytest.mark.filterwarnings("ignore:The number of training batches")

ROUNDS = 4
TIMES = ("client_time_s", "server_time_s")  # wall-clock times: the one thing a rerun may change


@pytest.fixture(scope="module")
def data():
    """The main job's data and model size (mnist5k, the 784-200-200-10 MLP): small MKL products
    at 2 threads round differently than at 1 on these shapes."""
    return FederatedDataModule(source="mnist5k", num_clients=20, partition="dirichlet", test_mode="local",
                               local_test_fraction=0.2, seed=0)


class ThreadsSeen(pl.Callback):
    """torch's intra-op count at every round and evaluation of the fit."""

    def __init__(self):
        self.counts = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.counts.append(torch.get_num_threads())

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        self.counts.append(torch.get_num_threads())


class ChangesThreads(pl.Callback):
    """Other code in the process that sets the count in the middle of a fit."""

    def __init__(self, at_round, count):
        self.at_round, self.count = at_round, count

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.current_epoch == self.at_round:
            torch.set_num_threads(self.count)


def fit(data, cls=FedAvg, ambient=1, callbacks=(), **kwargs):
    """A Trainer-script fit started with ``ambient`` threads in the process: (metrics per logger
    call without the times, final parameters, the count after the fit)."""
    params = dict(backbone="fl_mlp", num_classes=data.num_classes, input_shape=data.input_shape,
                  num_rounds=ROUNDS, fraction=0.5, batch_size=10, lr=0.05, seed=3, eval_every=2)
    if cls is CGSV:
        params["fraction"] = 1.0
    torch.set_num_threads(ambient)
    logger = CallLogger()
    trainer = builders.trainer(accelerator=accelerator(), logger=logger, callbacks=list(callbacks))
    module = cls(**(params | kwargs))
    trainer.fit(module, datamodule=data)
    calls = [(step, {k: v for k, v in metrics.items() if k not in TIMES}) for step, metrics in logger.calls]
    return calls, [p.detach().clone() for p in module.model.parameters()], torch.get_num_threads()


@pytest.fixture(autouse=True)
def restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def same_bits(first, second):
    calls, params = first[:2]
    other_calls, other_params = second[:2]
    return calls == other_calls and all(torch.equal(a, b) for a, b in zip(params, other_params))


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["vectorised", "sequential"])
@pytest.mark.parametrize("cls", [FedAvg, FedFV, FedLF, CGSV], ids=lambda c: c.__name__)
def test_the_process_thread_count_changes_no_bit(data, cls, engine):
    runs = {ambient: fit(data, cls, ambient, engine=engine) for ambient in (1, 2, 4)}
    assert same_bits(runs[1], runs[2]) and same_bits(runs[1], runs[4])
    assert {run[2] for run in runs.values()} == {1, 2, 4}  # each fit put the process's count back


def test_the_setting_is_the_count_every_round_even_when_other_code_changes_it(data):
    seen = ThreadsSeen()
    plain = fit(data, ambient=2)
    changed = fit(data, ambient=2, callbacks=[seen, ChangesThreads(at_round=1, count=2)])
    # FitThreads sets the run's count again at the next round: the same bits as a fit left alone
    assert set(seen.counts) == {1} and same_bits(plain, changed)


def test_another_setting_is_another_run_and_logged(data):
    seen = ThreadsSeen()
    one = fit(data)
    two = fit(data, callbacks=[seen], threads=2)
    assert set(seen.counts) == {2}
    if same_bits(one, two):
        pytest.skip("this machine's BLAS rounds alike at 1 and 2 threads: nothing here tells them apart")
    assert one[0] != two[0]  # why threads is a setting of the run, not of the machine


def test_fit_threads_refuses_a_count_that_is_not_a_positive_integer():
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ValueError, match="threads must be an integer >= 1"):
            FitThreads(bad)


def test_the_cli_names_the_new_setting_when_given_the_old_flag(capsys):
    from fl_lightning.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--threads", "2"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model.threads N (default auto: the cores the fit is given)" in err[0]


def test_a_cli_refusal_after_the_count_was_set_puts_the_process_count_back(tmp_path, monkeypatch, capsys):
    """The CLI sets the run's count before it builds the data; data it cannot build is refused
    after that, and the process keeps the count it had (replay and notebooks fit again in it)."""
    from fl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(2)
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--trainer.logger=false", "--data.num_clients=100000"])
    assert exit_.value.code == 2 and capsys.readouterr().err.startswith("error: ")
    assert torch.get_num_threads() == 2


# ------------------------------------------------------------------ "auto": the cores given (issue 49)
def test_auto_is_the_affinity_capped_by_omp_num_threads(monkeypatch):
    from fl_lightning.core import threads as threads_module

    monkeypatch.setattr(threads_module, "available_cores", lambda: 8)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads_module.resolve_threads("auto") == 8
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads_module.resolve_threads("auto") == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "16")  # more than the process may use: the affinity
    assert threads_module.resolve_threads("auto") == 8
    for meaningless in ("junk", "0", ""):  # not a count OpenMP would take: the affinity
        monkeypatch.setenv("OMP_NUM_THREADS", meaningless)
        assert threads_module.resolve_threads("auto") == 8, meaningless
    assert threads_module.resolve_threads(5) == 5  # a number is the number, whatever the machine


def test_a_module_records_the_resolved_count_as_its_setting(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    module = FedAvg(backbone="fl_logreg", num_classes=10, input_shape=(60,))
    assert module.hparams.threads == 2 and module.hparams_initial.threads == 2  # what loggers and checkpoints get
    assert module.fit_threads.threads == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert FedAvg(backbone="fl_logreg", num_classes=10, input_shape=(60,), threads=2).hparams.threads == 2


@pytest.mark.integration
def test_auto_is_logged_as_a_number_and_a_resume_keeps_it(store, capsys, monkeypatch, tmp_path):
    """Started where it was given 2 cores, stopped, resumed where it is given 1: the run keeps 2
    (the checkpoint's setting), logs 2 (never "auto"), and its config.yaml, which replay reads, says 2."""
    from mlflow.tracking import MlflowClient

    from fl_lightning.cli import main
    from tests.fl_lightning.cli.test_resume_cli import interrupted_fit

    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    run, command = interrupted_fit(store, capsys, monkeypatch)
    import yaml

    client = MlflowClient(store)

    def logged_config_threads() -> object:
        with open(client.download_artifacts(run.info.run_id, "config.yaml", str(tmp_path))) as handle:
            return yaml.safe_load(handle)["model"]["init_args"]["threads"]

    assert client.get_run(run.info.run_id).data.params["threads"] == "2"
    assert logged_config_threads() == 2  # the number, not "auto": what replay reads
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    main(command[1:])
    assert f"continuing MLflow run {run.info.run_id}" in capsys.readouterr().out
    resumed = client.get_run(run.info.run_id)
    assert resumed.info.status == "FINISHED" and resumed.data.params["threads"] == "2"
    assert logged_config_threads() == 2


# ------------------------------------------------------------------ issue 50: what the count mutants got past
class SetsThreadsAtRoundStart(pl.Callback):
    """Other code that sets the count when a round starts (a Trainer's callbacks run before the
    module's)."""

    def __init__(self, count):
        self.count = count

    def on_train_epoch_start(self, trainer, pl_module):
        torch.set_num_threads(self.count)


def test_a_count_changed_in_round_0_is_set_back_before_its_training_and_its_evaluation(data):
    seen = ThreadsSeen()
    fit(data, ambient=2, callbacks=[seen, SetsThreadsAtRoundStart(3), ChangesThreads(at_round=0, count=4)],
        eval_every=1, num_rounds=2)
    assert len(seen.counts) == 4 and set(seen.counts) == {1}  # 2 rounds, 2 evaluations, all at the setting


def test_the_process_count_is_put_back_after_the_fit(data):
    assert fit(data, ambient=2, num_rounds=1)[2] == 2
    assert fit(data, ambient=3, num_rounds=1, threads=2)[2] == 3


def test_the_cli_builds_the_data_at_the_runs_count(tmp_path, monkeypatch):
    """The CLI sets the run's count before the data module's setup (what it builds is part of the run)."""
    from fl_lightning.cli import main

    seen = []
    setup = FederatedDataModule.setup

    def recording(self, stage=None):
        seen.append(torch.get_num_threads())
        return setup(self, stage)

    monkeypatch.setattr(FederatedDataModule, "setup", recording)
    monkeypatch.setattr("sys.argv", ["fl-lightning"])
    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(2)
    main(["fit", "--trainer.logger=false", "--trainer.enable_checkpointing=false", "--model.num_rounds=1",
          "--data.source=digits", "--data.num_clients=4", "--model.backbone=fl_logreg", "--model.threads=1"])
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == 2


def test_each_job_gets_its_share_of_the_cores_and_never_zero_threads():
    """Issue 50: ``--jobs`` above the core count oversubscribes (1 thread each) instead of giving a
    worker 0 threads (which torch refuses); otherwise cores // jobs."""
    from benchmarks.runner import threads_per_job

    assert [threads_per_job(jobs, cores=2) for jobs in (1, 2, 3, 8)] == [2, 1, 1, 1]
    assert [threads_per_job(jobs, cores=16) for jobs in (1, 3, 4, 5)] == [16, 5, 4, 3]
    assert threads_per_job(1) >= 1  # the machine's own count


def test_a_second_fit_with_the_same_callback_puts_back_the_count_the_process_had_before_it():
    """A module fitted twice (a notebook, a second ``trainer.fit``): each fit keeps the count the
    process has when it starts and puts that one back, not the first fit's."""
    fit_threads = FitThreads(2)
    for ambient in (3, 4):
        torch.set_num_threads(ambient)
        fit_threads.setup(None, None, "fit")
        assert torch.get_num_threads() == 2
        fit_threads.teardown(None, None, "fit")
        assert torch.get_num_threads() == ambient
