"""A round's metrics reach the loggers in one call (core.round_log), monitors still read them,
and MLflow metric writes are batched without losing any (callbacks.tracking_buffer.BufferedClient)."""

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping

from fl_lightning.callbacks.tracking_buffer import BufferedClient
from fl_lightning.core.round_log import RoundLog, as_logged
from tests.call_logger import CallLogger
from tests.fl_lightning.core.test_module import digits_data, module_for


def fit_with(logger, callbacks=(), **module_kwargs):
    data = digits_data()
    module = module_for(data, **{"num_rounds": 4, "eval_every": 2, **module_kwargs})
    trainer = pl.Trainer(accelerator="cpu", logger=logger, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, max_epochs=1000,
                         callbacks=list(callbacks))
    trainer.fit(module, datamodule=data)
    return trainer


def test_each_round_reaches_the_logger_in_one_call_with_its_step():
    logger = CallLogger()
    fit_with(logger)
    rounds = [(step, metrics) for step, metrics in logger.calls if "clients_aggregated" in metrics]
    assert [step for step, _ in rounds] == [1, 2, 3, 4]  # one call a round, step = rounds completed
    assert all(metrics["round"] == step for step, metrics in rounds)
    assert all({"clients_sampled", "server_step_norm", "client_time_s"} <= set(m) for _, m in rounds)
    evaluations = [(step, metrics) for step, metrics in logger.calls if "test_acc_mean" in metrics]
    assert [step for step, _ in evaluations] == [2, 4]  # eval_every 2, and after the last round
    assert all("test_acc_mean_now" not in m for _, m in logger.calls)  # progress-bar values stay off the loggers
    assert all(isinstance(v, float) for _, m in logger.calls for v in m.values())


def test_monitors_read_the_round_metrics_at_the_round_end():
    """EarlyStopping on a training metric stops the fit where the metric stops improving."""
    stop = EarlyStopping(monitor="train_loss", mode="max", patience=0, check_on_train_epoch_end=True)
    trainer = fit_with(CallLogger(), callbacks=[stop], num_rounds=10)
    assert trainer.current_epoch < 10  # the training loss falls: 'max' mode stops after a round or two
    assert "train_loss" in trainer.callback_metrics and "test_acc_mean" in trainer.callback_metrics


def test_as_logged_converts_tensors_and_numbers_as_self_log_does():
    values, rounded = as_logged({"a": torch.tensor([1.0, 3.0]), "b": 2, "c": torch.tensor(5), "d": 0.1})
    assert values == {"a": 2.0, "b": 2.0, "c": 5.0, "d": float(torch.tensor(0.1))}  # float32 like self.log
    assert rounded.dtype == torch.get_default_dtype()


def test_round_log_holds_a_round_until_it_is_sent():
    class Trainer:
        def __init__(self):
            self.loggers = [CallLogger()]
            self.callback_metrics, self.logged_metrics, self.progress_bar_metrics = {}, {}, {}

    trainer, log = Trainer(), RoundLog()
    log.add_round({"train_loss": torch.tensor(0.5)}, step=1)
    log.end_round(trainer)
    assert trainer.callback_metrics["train_loss"] == 0.5 and trainer.loggers[0].calls == []
    assert log.pending == {"step": 1, "metrics": {"train_loss": 0.5, "round": 1.0}}
    log.add_round({"late": 1.0}, step=1)  # logged after the step in the same round: joins it
    log.end_round(trainer)
    log.send_round(trainer)
    assert trainer.loggers[0].calls == [(1, {"train_loss": 0.5, "round": 1.0, "late": 1.0})]
    assert log.pending is None


class FakeClient:
    def __init__(self, fail=False):
        self.calls, self.fail = [], fail

    def log_batch(self, run_id, metrics=(), params=(), tags=(), **kwargs):
        if self.fail:
            raise RuntimeError("the store refused the batch")
        self.calls.append(("log_batch", run_id, list(metrics), list(params), list(tags)))

    def set_tag(self, run_id, key, value):
        self.calls.append(("set_tag", run_id, key, value))


def test_buffered_client_holds_metrics_and_writes_them_before_any_other_call():
    client = FakeClient()
    buffered = BufferedClient(client, every_s=3600)
    buffered.log_batch("r1", metrics=["m1"])
    buffered.log_batch("r1", metrics=["m2"])
    buffered.log_batch("r2", metrics=["n1"])
    assert client.calls == []  # held
    buffered.set_tag("r1", "k", "v")
    assert client.calls == [("log_batch", "r1", ["m1", "m2"], [], []), ("log_batch", "r2", ["n1"], [], []),
                            ("set_tag", "r1", "k", "v")]
    buffered.log_batch("r1", metrics=["m3"], params=["p"])  # params are written at once, after what is held
    assert client.calls[-1] == ("log_batch", "r1", ["m3"], ["p"], [])


def test_buffered_client_writes_when_the_interval_passed():
    client = FakeClient()
    buffered = BufferedClient(client, every_s=0.0)
    buffered.log_batch("r", metrics=["m"])
    assert client.calls == [("log_batch", "r", ["m"], [], [])]


def test_buffered_client_keeps_what_the_store_refused():
    client = FakeClient(fail=True)
    buffered = BufferedClient(client, every_s=3600)
    buffered.log_batch("r", metrics=["m1"])
    with pytest.raises(RuntimeError):
        buffered.flush()
    client.fail = False
    buffered.flush()
    assert client.calls == [("log_batch", "r", ["m1"], [], [])]
