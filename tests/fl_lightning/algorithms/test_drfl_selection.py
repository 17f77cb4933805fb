"""DRFL's loss-aware (power-of-choice) client selection through the ``sample_clients`` hook."""

import lightning.pytorch as pl
import pytest
import torch

from fl_lightning.algorithms import DRFL
from fl_lightning.core import simulation
from fl_lightning.data.datamodule import FederatedDataModule


def attached(num_clients=10, **kwargs):
    data = FederatedDataModule(source="digits", num_clients=num_clients, partition="power_law", test_mode="local",
                               seed=0)
    data.setup()
    module = DRFL(backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8), seed=0, **kwargs)
    module.attach_data(data)
    return module


def test_highest_losses_picks_the_largest_losses_sorted_by_id():
    candidates = torch.tensor([1, 4, 6, 8, 9])
    losses = torch.tensor([0.5, 2.0, 0.1, 2.0, 1.0])
    assert DRFL.highest_losses(candidates, losses, 2).tolist() == [4, 8]
    assert DRFL.highest_losses(candidates, losses, 3).tolist() == [4, 8, 9]


def test_loss_aware_selection_takes_the_highest_loss_candidates(monkeypatch):
    module = attached(fraction=0.3, selection="loss_aware", num_candidates=6)
    seen = {}

    def losses(context, candidates):
        seen["candidates"] = candidates
        return candidates.double() * torch.tensor([1.0, -1.0]).repeat(3)  # alternating signs: not just the ids

    monkeypatch.setattr(module, "candidate_losses", losses)
    chosen = module.sample_clients(module.round_context(0))
    candidates = seen["candidates"]
    assert len(candidates) == 6 and len(set(candidates.tolist())) == 6
    expected = sorted(candidates[torch.argsort(-losses(None, candidates))[:3]].tolist())
    assert chosen.tolist() == expected
    # the same round draws the same candidates
    assert torch.equal(module.sample_clients(module.round_context(0)), chosen)


def test_candidate_losses_are_the_clients_training_losses_at_the_global_model():
    module = attached(fraction=0.3, selection="loss_aware")
    candidates = torch.tensor([0, 3, 7])
    shards = module.client_shards(candidates)
    expected, _ = module.round_engine.evaluator.shared(module.model, (shards.x, shards.y, shards.index, shards.sizes))
    assert torch.allclose(module.candidate_losses(module.round_context(0), candidates), expected)


def test_uniform_selection_is_the_core_sampling():
    module = attached(fraction=0.3)
    for t in range(3):
        assert torch.equal(module.sample_clients(module.round_context(t)), simulation.sample_uniformly(0, t, 10, 0.3))


def test_too_few_candidates_are_refused():
    module = attached(fraction=0.5, selection="loss_aware", num_candidates=2)
    with pytest.raises(ValueError, match="num_candidates=2"):
        module.sample_clients(module.round_context(0))
    with pytest.raises(ValueError, match="selection"):
        attached(selection="biggest")


class Chosen(pl.Callback):
    def __init__(self):
        self.rounds = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.rounds.append(outputs["outcome"].payload.clients.cpu())


def test_fit_with_loss_aware_selection_trains_the_highest_loss_clients(monkeypatch):
    data = FederatedDataModule(source="digits", num_clients=10, partition="power_law", test_mode="local", seed=0)
    module = DRFL(backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8), num_rounds=3, fraction=0.2, seed=0,
                  batch_size=16, lr=0.1, eval_every=1, selection="loss_aware", num_candidates=5)
    expected = []
    original = DRFL.candidate_losses

    def recording(self, context, candidates):
        losses = original(self, context, candidates)
        expected.append(DRFL.highest_losses(candidates, losses, 2))
        return losses

    monkeypatch.setattr(DRFL, "candidate_losses", recording)
    chosen = Chosen()
    pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, num_sanity_val_steps=0, callbacks=[chosen]).fit(module, datamodule=data)
    assert len(chosen.rounds) == 3 and all(len(c) == 2 for c in chosen.rounds)
    assert [c.tolist() for c in chosen.rounds] == [e.tolist() for e in expected]
