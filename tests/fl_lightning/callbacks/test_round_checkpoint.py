"""The CLI's checkpoint (``RoundCheckpoint``) and compact histories: ``last.ckpt`` only, every N
rounds and after the last; a failing fit writes the last round it completed when the running
round had not changed the state yet; a fit resumed from any of them ends bit for bit like the
uninterrupted one; a FedFV checkpoint holds only the history rows still to be read."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from fl_lightning.algorithms import FedFV, FedLF
from fl_lightning.callbacks.checkpointing import RoundCheckpoint, default_checkpoint
from fl_lightning.core.state import COMPACT_HISTORY_KEY
from fl_lightning.data.datamodule import FederatedDataModule

pytestmark = [
    pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty"),
    pytest.mark.usefixtures("one_thread"),
]
NUM_ROUNDS, NUM_CLIENTS = 7, 8


def make_run(algorithm=FedFV, **extra):
    data = FederatedDataModule(source="digits", num_clients=NUM_CLIENTS, partition="dirichlet",
                               partition_params={"alpha": 0.5, "min_size": 10}, test_mode="local", seed=3)
    settings = {"num_rounds": NUM_ROUNDS, "eval_every": 3, "fraction": 0.5, "dropout_prob": 0.2, "batch_size": 16,
                "lr": 0.05, "seed": 3, **extra}
    module = algorithm(backbone="fl_logreg", num_classes=data.num_classes, input_shape=data.input_shape, **settings)
    return module, data


class FailAt(pl.Callback):
    """Fails the fit in round ``round_number`` (1-based): before its step changes anything
    (``on_train_batch_start``) or after (``on_train_batch_end``)."""

    def __init__(self, round_number: int, after_step: bool) -> None:
        self.round_number, self.after_step = round_number, after_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if not self.after_step and trainer.current_epoch + 1 == self.round_number:
            raise RuntimeError("simulated failure")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.after_step and trainer.current_epoch + 1 == self.round_number:
            raise RuntimeError("simulated failure")


def record_writes(checkpoint: RoundCheckpoint) -> list[int]:
    """The rounds completed by every file ``checkpoint`` writes at a round's end."""
    rounds: list[int] = []
    save = checkpoint._save_checkpoint

    def recording_save(trainer, filepath):
        rounds.append(trainer.current_epoch + 1)
        save(trainer, filepath)

    checkpoint._save_checkpoint = recording_save
    return rounds


def trainer_with(checkpoint, *callbacks) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", logger=False, callbacks=[*callbacks, checkpoint], max_epochs=-1,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      deterministic=True)


def assert_same_state(have: dict, want: dict) -> None:
    assert have.keys() == want.keys()
    for key, value in want.items():
        assert torch.equal(have[key], value), key


def test_writes_last_only_every_n_rounds_and_after_the_last(tmp_path):
    module, data = make_run()
    checkpoint = RoundCheckpoint(dirpath=tmp_path, every_n_rounds=3)
    writes = record_writes(checkpoint)
    trainer_with(checkpoint).fit(module, datamodule=data)
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    assert writes == [1, 3, 6, 7]  # the first (its cost), every 3rd, the last
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["epoch"] == NUM_ROUNDS - 1


def test_interval_is_chosen_from_the_cost_of_a_write(tmp_path, caplog):
    checkpoint = RoundCheckpoint(dirpath=tmp_path, time_budget=0.1)
    module, data = make_run()
    caplog.set_level("INFO", logger="fl_lightning.callbacks.checkpointing")
    trainer_with(checkpoint).fit(module, datamodule=data)
    assert checkpoint.write_seconds is not None and checkpoint.round_seconds is not None
    needed = checkpoint.write_seconds / (0.1 * checkpoint.round_seconds)
    assert checkpoint.every_n_rounds >= max(1, needed)  # never below what the latest write needs
    assert "checkpoint every" in caplog.text  # logged, not printed: a user cannot act on it


@pytest.mark.parametrize("after_step", [False, True])
def test_failed_fit_resumes_bit_for_bit(after_step, tmp_path):
    """Writes at rounds 1 and 3; the fit fails in round 5. Before round 5 changed anything, its
    failure writes round 4 (kept in memory); after, round 4 is no longer the state, and the
    checkpoint stays at round 3. Either way the resumed fit ends like the uninterrupted one."""
    full, data = make_run()
    trainer_with(RoundCheckpoint(dirpath=tmp_path / "full", every_n_rounds=3)).fit(full, datamodule=data)

    failing, data = make_run()
    checkpoint = RoundCheckpoint(dirpath=tmp_path / "cut", every_n_rounds=3)
    with pytest.raises(RuntimeError, match="simulated failure"):
        trainer_with(checkpoint, FailAt(5, after_step)).fit(failing, datamodule=data)
    saved = torch.load(tmp_path / "cut" / "last.ckpt", weights_only=False)
    assert saved["epoch"] + 1 == (3 if after_step else 4) == checkpoint.rounds_saved
    assert not list((tmp_path / "cut").glob("*.partial"))

    resumed, data = make_run()
    trainer = trainer_with(RoundCheckpoint(dirpath=tmp_path / "cut", every_n_rounds=3))
    trainer.fit(resumed, datamodule=data, ckpt_path=tmp_path / "cut" / "last.ckpt")
    assert trainer.current_epoch == NUM_ROUNDS
    assert_same_state(resumed.state_dict(), full.state_dict())


@pytest.mark.parametrize(("extra", "rows"), [
    ({"tau": 2, "fraction": 1.0, "dropout_prob": 0.0}, 0),  # every client answers the next round
    ({"tau": 0}, 0),  # no external step: GH is never read
])
def test_fedfv_checkpoint_holds_only_rows_still_read(extra, rows, tmp_path):
    module, data = make_run(**extra)
    trainer_with(RoundCheckpoint(dirpath=tmp_path, every_n_rounds=1)).fit(module, datamodule=data)
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert saved["state_dict"]["history"].shape[0] == rows
    assert saved[COMPACT_HISTORY_KEY]["num_clients"] == NUM_CLIENTS


def test_fedfv_window_less_next_clients_and_fedlf_seen_clients(tmp_path):
    fedfv, data = make_run(tau=1)
    trainer_with(RoundCheckpoint(dirpath=tmp_path / "fv", every_n_rounds=1)).fit(fedfv, datamodule=data)
    rows = torch.load(tmp_path / "fv" / "last.ckpt", weights_only=False)[COMPACT_HISTORY_KEY]["rows"]
    expected = fedfv.last_seen == NUM_ROUNDS - 1  # τ = 1: round 8 reads rows of round 7 only
    expected[fedfv.round_engine.drop_clients(NUM_ROUNDS, fedfv.sample_clients(fedfv.round_context(NUM_ROUNDS)))] = False
    assert rows.tolist() == torch.nonzero(expected).flatten().tolist()

    fedlf, data = make_run(FedLF, fraction=0.25)
    trainer_with(RoundCheckpoint(dirpath=tmp_path / "lf", every_n_rounds=1)).fit(fedlf, datamodule=data)
    saved = torch.load(tmp_path / "lf" / "last.ckpt", weights_only=False)
    seen = torch.nonzero(fedlf.last_seen >= 0).flatten()
    assert 0 < len(seen) < NUM_CLIENTS, "some client must never have been seen"
    assert saved[COMPACT_HISTORY_KEY]["rows"].tolist() == seen.tolist()
    assert torch.equal(saved["state_dict"]["history"], fedlf.history[seen])
    restored = FedLF.load_from_checkpoint(tmp_path / "lf" / "last.ckpt")
    assert torch.equal(restored.history, fedlf.history)


def test_a_round_kept_in_memory_holds_the_history_by_reference_and_is_compacted_when_written(tmp_path):
    """The round kept in memory between writes refers to the (K, d) history buffer, no copy of it
    and no compaction yet; a failure that writes it compacts it then, to the rows still read."""
    module, data = make_run(FedLF, fraction=0.25)
    checkpoint = RoundCheckpoint(dirpath=tmp_path, every_n_rounds=3)
    kept = {}

    class KeepSnapshot(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            if trainer.current_epoch + 1 == 5:  # before the failure writes it
                in_memory = checkpoint._unsaved[0]
                kept["compacted"] = COMPACT_HISTORY_KEY in in_memory
                kept["history"] = in_memory["state_dict"]["history"].data_ptr()

    with pytest.raises(RuntimeError, match="simulated failure"):
        trainer_with(checkpoint, KeepSnapshot(), FailAt(5, after_step=False)).fit(module, datamodule=data)
    assert kept == {"compacted": False, "history": module.history.data_ptr()}
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert saved["epoch"] + 1 == 4
    seen = torch.nonzero(module.last_seen >= 0).flatten()
    assert 0 < len(seen) < NUM_CLIENTS, "some client must never have been seen"
    assert saved[COMPACT_HISTORY_KEY]["rows"].tolist() == seen.tolist()
    assert torch.equal(saved["state_dict"]["history"], module.history[seen])


def test_checkpoint_with_the_whole_history_still_loads(tmp_path):
    """A checkpoint written before compaction holds the (K, d) buffer and no row list."""
    module, data = make_run(FedLF, fraction=0.25)
    trainer_with(RoundCheckpoint(dirpath=tmp_path, every_n_rounds=1)).fit(module, datamodule=data)
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    del saved[COMPACT_HISTORY_KEY]
    saved["state_dict"]["history"] = module.history.clone()
    torch.save(saved, tmp_path / "old.ckpt")
    restored = FedLF.load_from_checkpoint(tmp_path / "old.ckpt")
    assert torch.equal(restored.history, module.history) and restored.__dict__["_history_missing"] is None


def test_a_configured_model_checkpoint_replaces_the_default():
    assert isinstance(default_checkpoint([], None)[0], RoundCheckpoint)
    assert default_checkpoint([ModelCheckpoint(save_top_k=-1)], None) == []
    assert default_checkpoint(None, False) == []
    with pytest.raises(ValueError, match="every_n_rounds"):
        RoundCheckpoint(every_n_rounds=0)


@pytest.mark.integration
@pytest.mark.parametrize("configured", [False, True])
def test_cli_keeps_last_only_unless_a_model_checkpoint_is_configured(configured, tmp_path, monkeypatch, capsys):
    from fl_lightning.cli import main

    monkeypatch.chdir(tmp_path)
    own = ["--trainer.callbacks=ModelCheckpoint", "--trainer.callbacks.save_top_k=-1"] if configured else []
    main(["fit", f"--trainer.logger.init_args.tracking_uri=sqlite:///{tmp_path / 'runs.db'}", "--model.num_rounds=3",
          "--model.backbone=fl_logreg", "--model.batch_size=16", "--data.source=digits", "--data.num_clients=6",
          "--data.partition=iid", "--data.partition_params={}", *own])
    written = sorted(p.name for p in tmp_path.glob("checkpoints/*/*/checkpoints/*"))
    assert written == (["epoch=0-step=1.ckpt", "epoch=1-step=2.ckpt", "epoch=2-step=3.ckpt"] if configured
                       else ["last.ckpt"])
    assert ("If the fit stops, resume it with" in capsys.readouterr().out) is not configured


def test_a_write_that_fails_midway_leaves_the_previous_checkpoint_whole(tmp_path):
    """A disk that fills up while round 3's checkpoint is written: ``last.ckpt`` is still round 2's,
    complete and loadable, and no half-written file is left beside it."""
    import errno

    module, data = make_run()
    checkpoint = RoundCheckpoint(dirpath=tmp_path, every_n_rounds=1)
    trainer = trainer_with(checkpoint)
    io = trainer.strategy.checkpoint_io
    write = io.save_checkpoint

    def full_disk_at_round_3(state, path, storage_options=None):
        if state["epoch"] == 2:
            with open(path, "wb") as half:
                half.write(b"PK\x03\x04 half a checkpoint")
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(state, path, storage_options)

    io.save_checkpoint = full_disk_at_round_3
    with pytest.raises(OSError, match="No space left"):
        trainer.fit(module, datamodule=data)
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["epoch"] == 1  # round 2's, whole
