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


# ------------------------------------------------------------ issue 50: what the checkpoint writer's mutants got past
def test_an_interval_or_a_time_budget_out_of_range_is_refused_saying_what_it_takes():
    """``every_n_rounds`` a whole number from 1, ``time_budget`` strictly between 0 and 1; the
    bounds themselves (1; just above 0, just below 1) are taken."""
    for every in (0, -2, 1.5):
        with pytest.raises(ValueError) as refused:
            RoundCheckpoint(every_n_rounds=every)
        assert str(refused.value) == (f"every_n_rounds must be an integer >= 1 (or None: chosen from the cost of a "
                                      f"write), got {every}")
    for budget in (0, 1, -0.1, 1.5):
        with pytest.raises(ValueError) as refused:
            RoundCheckpoint(time_budget=budget)
        assert str(refused.value) == (f"time_budget must be in (0, 1) (the share of the fit's time writes may take; "
                                      f"default 0.1), got {budget}")
    taken = RoundCheckpoint(every_n_rounds=1, time_budget=0.999)
    assert (taken.every_n_rounds, taken.fixed_interval, taken.time_budget) == (1, True, 0.999)
    chosen = RoundCheckpoint(time_budget=1e-6)
    assert (chosen.every_n_rounds, chosen.fixed_interval, chosen.time_budget) == (None, False, 1e-6)


def test_a_write_is_due_first_every_n_rounds_at_the_trainers_last_round_and_when_the_fit_stops():
    """``due``: the fit's first round (no write yet), every N rounds after, the last round a
    Trainer's ``max_epochs`` allows (a fit cut shorter than its ``num_rounds``), and a round the
    fit stops at; a Trainer without a bound (``max_epochs`` None or -1) writes every N rounds only."""
    from types import SimpleNamespace

    checkpoint = RoundCheckpoint(every_n_rounds=3)

    def trainer(max_epochs, should_stop=False):
        return SimpleNamespace(max_epochs=max_epochs, should_stop=should_stop)

    assert checkpoint.due(trainer(None), 1)  # the first write: its cost chooses N
    checkpoint.write_seconds = 0.5
    assert [r for r in range(1, 6) if checkpoint.due(trainer(5), r)] == [3, 5]
    assert [r for r in range(1, 8) if checkpoint.due(trainer(-1), r)] == [3, 6]
    assert [r for r in range(1, 8) if checkpoint.due(trainer(None), r)] == [3, 6]
    assert checkpoint.due(trainer(-1, should_stop=True), 4)
    chosen = RoundCheckpoint()
    chosen.write_seconds = 0.5  # written once, N not chosen yet: only the last round
    assert [r for r in range(1, 5) if chosen.due(trainer(4), r)] == [4]


def test_a_round_kept_in_memory_keeps_tensors_by_reference_and_copies_everything_else():
    """``copy_containers``: tensors at any depth of dicts, lists and tuples kept (and listed with
    their versions), the containers copied with their types (an ``OrderedDict`` state dict stays
    one), and any other object deep-copied, so a later change of the live state does not reach the
    round kept; a named tuple is an object like any other."""
    from collections import OrderedDict, namedtuple

    from fl_lightning.callbacks.checkpointing import copy_containers

    Pair = namedtuple("Pair", "left right")
    weight, bias, step = torch.zeros(2), torch.ones(1), torch.tensor(3)
    live = {"state_dict": OrderedDict(weight=weight), "optimizers": [{"params": (bias, step)}],
            "loops": {"seen": {1, 2}, "history": [[0.5]]}, "pair": Pair([1], [2])}
    tensors: list = []
    kept = copy_containers(live, tensors)
    assert [tensor for tensor, _ in tensors] == [weight, bias, step] and all(v == 0 for _, v in tensors)
    assert kept["state_dict"]["weight"] is weight and kept["optimizers"][0]["params"][1] is step
    assert type(kept["state_dict"]) is OrderedDict and kept["state_dict"] is not live["state_dict"]
    assert type(kept["optimizers"][0]["params"]) is tuple and kept["optimizers"] is not live["optimizers"]
    live["loops"]["seen"].add(3)
    live["loops"]["history"][0].append(0.25)
    live["pair"].left.append(9)
    assert kept["loops"] == {"seen": {1, 2}, "history": [[0.5]]} and kept["pair"] == Pair([1], [2])


def test_the_default_checkpoint_writes_where_it_is_told_and_a_lone_configured_callback_counts():
    """``--trainer.callbacks`` holds a list or a single callback: a single ``ModelCheckpoint``
    replaces the default as a list of them does; any other single callback does not."""
    from pathlib import Path

    default = default_checkpoint(None, None, dirpath=Path("runs/1/abc/checkpoints"))
    assert len(default) == 1 and Path(default[0].dirpath) == Path("runs/1/abc/checkpoints").absolute()
    assert default_checkpoint(ModelCheckpoint(save_top_k=-1), None) == []
    assert isinstance(default_checkpoint(pl.callbacks.LearningRateMonitor(), True)[0], RoundCheckpoint)


def test_a_fit_replaces_the_last_ckpt_it_finds_in_its_folder_and_names_its_own_as_the_last(tmp_path):
    """A fit's folder holding a ``last.ckpt`` already (a fit of it that was not resumed): the new
    fit replaces it, never writing ``last-v1.ckpt`` beside it, and its checkpoint callback names
    that file as the last one written (the path the resume line prints)."""
    (tmp_path / "last.ckpt").write_bytes(b"an older fit's")
    module, data = make_run(num_rounds=3)
    checkpoint = RoundCheckpoint(dirpath=tmp_path, every_n_rounds=2)
    trainer_with(checkpoint).fit(module, datamodule=data)
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["epoch"] == 2
    assert checkpoint.last_model_path == str(tmp_path / "last.ckpt")


# ------------------------------------------------------- issue 50: the writer's timing half, what its mutants got past
def test_a_resume_naming_its_folder_absolutely_keeps_the_relative_folder_of_the_checkpoint(tmp_path):
    """``load_state_dict``: a checkpoint written by a fit that named its folder relatively
    (``runs/1/abc/checkpoints``) and resumed by one naming it absolutely is the same folder, so the
    last checkpoint's path comes back; a relative folder that only shares its last part, or an
    absolute one elsewhere, is another folder and Lightning's warning says so."""
    import warnings

    here = tmp_path / "work" / "runs" / "1" / "abc" / "checkpoints"
    stored = {"monitor": None, "best_model_score": None, "best_model_path": "", "current_score": None,
              "best_k_models": {}, "kth_best_model_path": "", "kth_value": None,
              "last_model_path": str(here / "last.ckpt")}

    def loaded(dirpath):
        checkpoint = RoundCheckpoint(dirpath=here)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            checkpoint.load_state_dict({**stored, "dirpath": dirpath})
        return checkpoint.last_model_path, [str(w.message) for w in caught if "dirpath has changed" in str(w.message)]

    assert loaded("runs/1/abc/checkpoints") == (str(here / "last.ckpt"), [])
    assert loaded(str(here)) == (str(here / "last.ckpt"), [])
    for other in ("runs/2/abc/checkpoints", "elsewhere/checkpoints", str(tmp_path / "abc" / "checkpoints"), ""):
        last, said = loaded(other)
        assert last == "" and len(said) == 1, other
    unplaced = RoundCheckpoint()  # no folder yet: nothing to compare, Lightning's warning
    with pytest.warns(UserWarning, match="dirpath has changed"):
        unplaced.load_state_dict({**stored, "dirpath": "runs/1/abc/checkpoints"})
    assert unplaced.last_model_path == ""


def test_the_interval_is_chosen_and_said_at_the_end_of_the_second_round(tmp_path, caplog):
    """The first round warms up and is left out; after the second the interval is chosen from
    the first write and the second round's time, and said then (not first at the fit's end)."""
    said_by_round: dict[int, bool] = {}

    class Listen(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):
            said_by_round[trainer.current_epoch] = "checkpoint every" in caplog.text

    checkpoint = RoundCheckpoint(dirpath=tmp_path, time_budget=0.5)
    module, data = make_run(num_rounds=4)
    caplog.set_level("INFO", logger="fl_lightning.callbacks.checkpointing")
    trainer_with(checkpoint, Listen()).fit(module, datamodule=data)
    assert said_by_round == {0: False, 1: False, 2: True, 3: True}
    assert caplog.text.count("checkpoint every") == 1


def test_an_interval_that_changed_during_the_fit_is_said_at_its_end_by_rank_zero_only(caplog):
    """``on_train_end``: the interval chosen first and the one at the end differ: one INFO line
    with the final interval and the figures it came from; the same interval, a given one, or a
    rank other than 0: nothing."""
    from types import SimpleNamespace

    from fl_lightning.callbacks import checkpointing

    caplog.set_level("INFO", logger=checkpointing.__name__)

    def said(first, final, rank_zero=True):
        caplog.clear()
        checkpoint = RoundCheckpoint()
        checkpoint._last_checkpoint_saved = "last.ckpt"  # written at its last round, as every fit is
        checkpoint._chosen_first, checkpoint.every_n_rounds = first, final
        checkpoint.write_seconds, checkpoint.round_seconds = 1.25, 0.5
        checkpoint.on_train_end(SimpleNamespace(is_global_zero=rank_zero), None)
        return [record.getMessage() for record in caplog.records if record.name == checkpointing.__name__]

    assert said(2, 5) == ["checkpoint interval at the end: 5 rounds (a write took 1.25 s, a round 0.50 s)"]
    assert said(2, 2) == [] and said(None, 5) == [] and said(2, 5, rank_zero=False) == []


class PlainModule(pl.LightningModule):
    """A LightningModule with no clients: the writer keeps and writes its rounds too."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 3, generator=generator)),
                                           batch_size=4)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


@pytest.mark.parametrize("weights_only", [False, True])
def test_a_module_without_clients_has_its_kept_round_written_and_weights_only_is_followed(weights_only, tmp_path):
    """Round 2 of a plain module is kept in memory (N = 3) and written when round 3 fails before
    its first step; with ``save_weights_only`` that file holds no optimizer state, as a write
    at the round's end would."""
    checkpoint = RoundCheckpoint(dirpath=tmp_path, every_n_rounds=3, save_weights_only=weights_only)
    trainer = pl.Trainer(accelerator="cpu", logger=False, max_epochs=6, callbacks=[FailAt(3, False), checkpoint],
                         enable_progress_bar=False, enable_model_summary=False)
    with pytest.raises(RuntimeError, match="simulated failure"):
        trainer.fit(PlainModule())
    saved = torch.load(tmp_path / "last.ckpt", weights_only=False)
    assert saved["epoch"] + 1 == 2 == checkpoint.rounds_saved
    assert ("optimizer_states" in saved) is not weights_only


class Clock:
    """``time.perf_counter`` for the writer: rounds and writes take the seconds a test gives."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def test_the_interval_follows_the_median_of_the_last_25_rounds_after_the_first(tmp_path, monkeypatch, caplog):
    """N = ⌈write / (budget · round)⌉ with a clock the test sets: round 1 (100 s, warming up) is
    left out; rounds 2-14 take 10 s, rounds 15-27 1 s; a write 3 s; budget 0.1. After round 2,
    N = ⌈3 / (0.1 · 10)⌉ = 3; at the end the median of the last 25 rounds (12 of 10 s, 13 of 1 s)
    is 1 s, so N = 30, and the end of the fit says the change."""
    from fl_lightning.callbacks import checkpointing

    clock = Clock()
    monkeypatch.setattr(checkpointing, "time", clock)

    class Rounds(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            round_number = trainer.current_epoch + 1
            clock.now += 100.0 if round_number == 1 else 10.0 if round_number <= 14 else 1.0

    checkpoint = RoundCheckpoint(dirpath=tmp_path, time_budget=0.1)
    save = checkpoint._save_checkpoint

    def three_seconds(trainer, filepath):
        save(trainer, filepath)
        clock.now += 3.0

    checkpoint._save_checkpoint = three_seconds
    module, data = make_run(num_rounds=27, eval_every=100)
    caplog.set_level("INFO", logger="fl_lightning.callbacks.checkpointing")
    trainer_with(checkpoint, Rounds()).fit(module, datamodule=data)
    said = [record.getMessage() for record in caplog.records if record.name == checkpointing.__name__]
    assert said[0] == ("checkpoint every 3 round(s) and after the last: writing it took 3.00 s and a round 10.00 s "
                       "(at most 10% of the fit's time; followed as they change)")
    assert (checkpoint.round_seconds, checkpoint.write_seconds, checkpoint.every_n_rounds) == (1.0, 3.0, 30)
    assert said[1:] == ["checkpoint interval at the end: 30 rounds (a write took 3.00 s, a round 1.00 s)"]


@pytest.mark.parametrize("on_train_epoch_end", [True, False])
def test_a_writer_told_to_save_after_validation_writes_the_same_rounds(on_train_epoch_end, tmp_path):
    """``save_on_train_epoch_end`` (ModelCheckpoint's): a round ends at the train epoch's end or at
    its validation's end, once either way: the writes fall on the same rounds, and every other
    round is kept in memory once."""
    module, data = make_run()
    checkpoint = RoundCheckpoint(dirpath=tmp_path, every_n_rounds=3, save_on_train_epoch_end=on_train_epoch_end)
    writes, kept = record_writes(checkpoint), []
    snapshot = checkpoint.snapshot

    def recording_snapshot(trainer):
        kept.append(trainer.current_epoch + 1)
        return snapshot(trainer)

    checkpoint.snapshot = recording_snapshot
    trainer_with(checkpoint).fit(module, datamodule=data)
    assert writes == [1, 3, 6, 7] and kept == [2, 4, 5]


def test_the_interval_is_chosen_only_once_both_costs_are_known_is_at_least_one_and_rank_zeros():
    """``choose_interval``: nothing before a write and a round are both timed; a write far cheaper
    than the budget gives N = 1 (every round); a given N is kept; with several ranks, rank 0's
    N is the one followed (broadcast from rank 0)."""
    from types import SimpleNamespace

    class Ranks:
        """Two ranks that timed differently: rank 0 needs N = 4, rank 1 asks for 9."""

        def broadcast(self, value, src=0):
            return {0: value, 1: 9}[src]

    trainer = SimpleNamespace(strategy=Ranks(), is_global_zero=True)
    checkpoint = RoundCheckpoint(time_budget=0.1)
    for write, round_time in ((None, 1.0), (0.5, None), (None, None)):
        checkpoint.write_seconds, checkpoint.round_seconds = write, round_time
        checkpoint.choose_interval(trainer)
        assert checkpoint.every_n_rounds is None
    checkpoint.write_seconds, checkpoint.round_seconds = 0.001, 1.0
    checkpoint.choose_interval(trainer)
    assert checkpoint.every_n_rounds == 1
    checkpoint.write_seconds = 0.4  # ⌈0.4 / (0.1 · 1.0)⌉ = 4 on rank 0
    checkpoint.choose_interval(trainer)
    assert checkpoint.every_n_rounds == 4
    given = RoundCheckpoint(every_n_rounds=2)
    given.write_seconds, given.round_seconds = 5.0, 1.0
    given.choose_interval(trainer)
    assert given.every_n_rounds == 2


def test_the_chosen_interval_is_said_with_the_budget_as_a_percentage(caplog):
    from types import SimpleNamespace

    from fl_lightning.callbacks import checkpointing

    caplog.set_level("INFO", logger=checkpointing.__name__)
    trainer = SimpleNamespace(strategy=SimpleNamespace(broadcast=lambda value, src=0: value), is_global_zero=True)
    checkpoint = RoundCheckpoint(time_budget=0.6)
    checkpoint.write_seconds, checkpoint.round_seconds = 1.5, 0.5  # ⌈1.5 / (0.6 · 0.5)⌉ = 5
    checkpoint.choose_interval(trainer)
    assert [record.getMessage() for record in caplog.records if record.name == checkpointing.__name__] == [
        "checkpoint every 5 round(s) and after the last: writing it took 1.50 s and a round 0.50 s (at most 60% of "
        "the fit's time; followed as they change)"]
