"""What a round no longer pays for (issue 49): the clients' losses before training only where
they are read, a shuffle over the real samples only, and the small-class kernels."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import Logger

from fl_lightning.algorithms import ALGORITHMS
from fl_lightning.core.kernels import cross_entropy_and_correct, softmax_last
from fl_lightning.core.local import batch_order
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.records.vocabulary import Metric


# ----------------------------------------------------------------------------- the kernels
def test_softmax_last_matches_torch_to_rounding() -> None:
    logits = torch.randn(7, 10, 10, generator=torch.Generator().manual_seed(0)) * 30
    assert torch.allclose(softmax_last(logits), torch.softmax(logits, dim=-1), rtol=1e-6, atol=1e-7)
    assert torch.allclose(softmax_last(logits).sum(-1), torch.ones(7, 10))


def test_cross_entropy_and_correct_match_torch_ties_included() -> None:
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(500, 10, generator=generator) * 5
    targets = torch.randint(0, 10, (500,), generator=generator)
    losses, correct = cross_entropy_and_correct(logits, targets)
    expected = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    assert torch.allclose(losses, expected, rtol=1e-5, atol=1e-6)
    assert torch.equal(correct, (logits.argmax(1) == targets).float())
    # ties: argmax takes the first maximal class (a zero model's logits are all equal)
    tied = torch.randint(0, 3, (400, 10), generator=generator).float()
    tied[:50] = 0.0
    tied_targets = torch.randint(0, 10, (400,), generator=generator)
    assert torch.equal(cross_entropy_and_correct(tied, tied_targets)[1], (tied.argmax(1) == tied_targets).float())
    assert cross_entropy_and_correct(tied[:50], tied_targets[:50])[1].sum() == (tied_targets[:50] == 0).sum()


# ----------------------------------------------------------------------------- the shuffle
def test_batch_order_shuffles_each_client_and_keeps_padding_in_place() -> None:
    sizes = torch.tensor([5, 0, 3, 7, 1])
    order = batch_order(sizes, 7, 3, torch.Generator().manual_seed(0))
    assert order.shape == (3, 5, 7)
    for epoch in range(3):
        for k, n in enumerate(sizes.tolist()):
            row = order[epoch, k]
            assert sorted(row[:n].tolist()) == list(range(n))
            assert row[n:].tolist() == list(range(n, 7))
    assert not torch.equal(order[0, 3], order[1, 3]) or not torch.equal(order[1, 3], order[2, 3])
    again = batch_order(sizes, 7, 3, torch.Generator().manual_seed(0))
    assert torch.equal(order, again)
    assert not torch.equal(order, batch_order(sizes, 7, 3, torch.Generator().manual_seed(1)))


def test_batch_order_is_uniform_over_permutations() -> None:
    generator = torch.Generator().manual_seed(2)
    firsts = torch.stack([batch_order(torch.tensor([4]), 4, 1, generator)[0, 0, 0] for _ in range(4000)])
    counts = torch.bincount(firsts, minlength=4).float()
    assert (counts / 4000 - 0.25).abs().max() < 0.03  # each position first a quarter of the time


# ------------------------------------------------------------- the losses before training
class Recorded(Logger):
    """Every (step, metrics) a fit logs, in memory."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict]] = []

    @property
    def name(self) -> str:
        return "recorded"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.rows.append((step, dict(metrics)))


def fit(name: str, eval_every: int, rounds: int = 4) -> tuple[pl.LightningModule, Recorded]:
    data = FederatedDataModule(source="synthetic", num_clients=10, partition="iid", test_mode="local", seed=0)
    module = ALGORITHMS[name](backbone="fl_logreg", num_classes=10, input_shape=(60,), num_rounds=rounds,
                              fraction=0.5, batch_size=10, lr=0.05, eval_every=eval_every, seed=3)
    recorded = Recorded()
    pl.Trainer(accelerator="cpu", logger=recorded, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, max_epochs=rounds).fit(module, datamodule=data)
    return module, recorded


def logged_train_loss_rounds(recorded: Recorded) -> list[int]:
    return sorted({int(step) for step, metrics in recorded.rows if Metric.TRAIN_LOSS in metrics})


def test_fedavg_computes_the_losses_only_in_the_rounds_that_evaluate() -> None:
    _, recorded = fit("FedAvg", eval_every=2, rounds=5)
    assert logged_train_loss_rounds(recorded) == [2, 4, 5]


def test_an_algorithm_that_reads_the_losses_gets_them_every_round() -> None:
    _, recorded = fit("QFedAvg", eval_every=10, rounds=3)
    assert logged_train_loss_rounds(recorded) == [1, 2, 3]


def test_skipping_the_losses_changes_no_bit_of_the_model() -> None:
    class FedAvgReading(ALGORITHMS["FedAvg"]):
        reads_training_losses = True

    ALGORITHMS["FedAvgReadingLosses"] = FedAvgReading
    try:
        skipped, _ = fit("FedAvg", eval_every=10)
        computed, _ = fit("FedAvgReadingLosses", eval_every=10)
    finally:
        del ALGORITHMS["FedAvgReadingLosses"]
    for (name, a), (_, b) in zip(skipped.model.state_dict().items(), computed.model.state_dict().items()):
        assert torch.equal(a, b), name


def test_reading_the_losses_without_declaring_it_says_what_to_set() -> None:
    class Undeclared(ALGORITHMS["FedAvg"]):
        def aggregate(self, payload):
            weights = payload.training_losses() / payload.training_losses().sum()
            return weights.to(payload.updates.dtype) @ payload.updates

    ALGORITHMS["UndeclaredLossReader"] = Undeclared
    try:
        with pytest.raises(RuntimeError, match="reads_training_losses = True"):
            fit("UndeclaredLossReader", eval_every=10, rounds=2)
    finally:
        del ALGORITHMS["UndeclaredLossReader"]
