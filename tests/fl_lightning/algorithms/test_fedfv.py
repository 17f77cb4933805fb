"""FedFV (fedfv_ijcai21.md, Alg. 1-3): the Gram-space implementation against a line-by-line
transcription of the paper's loops, the FedLF appendix's three-client example, and a fit."""

import itertools
import math

import lightning.pytorch as pl
import pytest
import torch

from fl_lightning.algorithms.fedfv import FedFV
from fl_lightning.data.datamodule import FederatedDataModule
from tests import builders

NUM_CLIENTS = 12


@pytest.fixture(scope="module")
def data():
    return FederatedDataModule(source="digits", num_clients=NUM_CLIENTS, partition="iid", test_mode="local", seed=0)


def make_fedfv(data, **kwargs) -> FedFV:
    """A float64 FedFV whose K-sized buffers are set up, without a Trainer."""
    params = dict(backbone="fl_logreg", num_classes=data.num_classes, input_shape=data.input_shape, lr=0.1, seed=0)
    module = FedFV(**(params | kwargs)).double()
    module.attach_data(data)
    module.setup("fit")
    return module


def payload(t, clients, updates, losses):
    return builders.payload(updates, losses=losses, clients=clients, round_index=t, dtype=torch.float64)


# ------------------------------------------------------------------ the paper, with loops
class Transcription:
    """Alg. 1-3 of the paper with explicit loops over vectors (the reference code's rounds
    count from 1; ``external_rounds="reference"`` is transcribed in that convention)."""

    def __init__(self, alpha, tau, external_rounds):
        self.alpha, self.tau, self.external_rounds = alpha, tau, external_rounds
        self.GH, self.last = {}, {}

    def step(self, t, clients, grads, losses, po):
        m = len(grads)
        for k, g in zip(clients, grads):  # Alg. 1, line 4
            self.GH[k] = g.clone()
            self.last[k] = t if self.external_rounds == "paper" else t + 1
        # Alg. 2: the ceil(alpha m) largest losses keep their gradient
        kept = math.ceil(round(self.alpha * m, 9))
        keep = set(sorted(range(m), key=lambda i: -losses[i])[:kept])
        projected = []
        for k in range(m):
            g_pc = grads[k].clone()
            if k not in keep:
                for j in po:
                    if g_pc @ grads[j] < 0 and k != j:
                        g_pc = g_pc - (grads[j] @ g_pc) / (grads[j] @ grads[j]) * grads[j]
            projected.append(g_pc)
        gt = sum(projected) / m
        # Alg. 3
        self.external_projections = 0
        if self.external_rounds == "paper":
            rounds = [t - i for i in range(self.tau, 0, -1)] if t >= self.tau else []
        else:  # the code: current round counted from 1, rounds T - k for k = tau-1, ..., 0
            T = t + 1
            rounds = [T - k for k in range(self.tau - 1, -1, -1)] if T >= self.tau else []
        for r in rounds:
            g_con = torch.zeros_like(gt)
            for k in self.GH:
                if self.last[k] == r and gt @ self.GH[k] < 0:
                    g_con = g_con + self.GH[k]
            if gt @ g_con < 0:
                gt = gt - (gt @ g_con) / (g_con @ g_con) * g_con
                self.external_projections += 1
        return gt / gt.norm() * (sum(grads) / m).norm()  # line 10


def loss_order(losses, descending=False):
    return sorted(range(len(losses)), key=lambda i: -losses[i] if descending else losses[i])


@pytest.mark.parametrize("alpha", [0.0, 0.4])
@pytest.mark.parametrize("external_rounds", ["paper", "reference"])
@pytest.mark.parametrize("order", ["loss", "random", "reverse"])
def test_equals_line_by_line_transcription_over_rounds_with_history(data, order, external_rounds, alpha):
    tau, m = 3, 5
    module = make_fedfv(data, alpha=alpha, tau=tau, order=order, external_rounds=external_rounds)
    paper = Transcription(alpha, tau, external_rounds)
    generator = torch.Generator().manual_seed(7)
    d = module.num_parameters
    shared = torch.randn(d, generator=generator, dtype=torch.float64)
    external = 0
    for t in range(7):
        clients = torch.randperm(NUM_CLIENTS, generator=generator)[:m]
        magnitudes = torch.rand(m, 1, generator=generator, dtype=torch.float64) * 3 + 0.1
        sides = (clients % 2 * 2 - 1).unsqueeze(1).double()  # two groups pulling apart, as with non-IID data
        updates = (0.5 * sides * shared + torch.randn(m, d, generator=generator, dtype=torch.float64)) * magnitudes
        losses = torch.rand(m, generator=generator, dtype=torch.float64) * 2
        grads, loss_list = list(updates.unbind(0)), losses.tolist()
        if order == "random":
            po = module.projection_order(losses, t).tolist()
        else:
            po = loss_order(loss_list, descending=order == "reverse")
        expected = paper.step(t, clients.tolist(), grads, loss_list, po)
        external += paper.external_projections

        step = module.server_round(payload(t, clients, updates, losses))

        assert (step - expected).norm() <= 1e-6 * expected.norm(), f"round {t}"
    assert external > 0, "the rounds must exercise Alg. 3"


def test_history_and_last_rounds_follow_alg1_line4(data):
    module = make_fedfv(data, tau=2)
    updates = torch.randn(3, module.num_parameters, dtype=torch.float64)
    module.server_round(payload(4, [5, 0, 9], updates, torch.tensor([0.3, 0.1, 0.2], dtype=torch.float64)))
    assert torch.equal(module.history[[5, 0, 9]], updates)
    assert module.last_seen.tolist() == [4, -1, -1, -1, -1, 4, -1, -1, -1, 4, -1, -1]
    assert module.history[[1, 2, 3]].abs().sum() == 0


def three_clients(module):
    """FedLF appendix, Fig. 1: g1 = (-1, .5, 0), g2 = (.8, -1, 0), g3 = (1, 1, -1), padded with zeros."""
    g = torch.zeros(3, module.num_parameters, dtype=torch.float64)
    g[:, :3] = torch.tensor([[-1.0, 0.5, 0.0], [0.8, -1.0, 0.0], [1.0, 1.0, -1.0]])
    return g


@pytest.mark.parametrize("loss_ranks", list(itertools.permutations(range(3))))
def test_fedlf_three_client_example_conflicts_for_every_loss_order(data, loss_ranks):
    module = make_fedfv(data, alpha=0.0, tau=0)
    g = three_clients(module)
    step = module.propose(payload(0, [0, 1, 2], g, torch.tensor(loss_ranks, dtype=torch.float64)))
    # the server moves by -step; client i's own descent move is -g_i
    assert (g @ step < 0).any(), "FedLF reports FedFV conflicting with some client"


def test_alpha_one_is_uniform_averaging(data):
    module = make_fedfv(data, alpha=1.0, tau=0)
    updates = torch.randn(4, module.num_parameters, dtype=torch.float64)
    step = module.propose(payload(0, [0, 1, 2, 3], updates, torch.rand(4, dtype=torch.float64)))
    torch.testing.assert_close(step, updates.mean(0), rtol=1e-10, atol=1e-12)


def test_step_has_the_norm_of_the_mean_update(data):
    module = make_fedfv(data, alpha=0.0, tau=1)
    for t in range(3):
        updates = torch.randn(4, module.num_parameters, dtype=torch.float64)
        step = module.server_round(payload(t, [t, t + 1, t + 2, t + 3], updates, torch.rand(4, dtype=torch.float64)))
        assert math.isclose(step.norm(), updates.mean(0).norm(), rel_tol=1e-9)


def test_random_order_is_a_reproducible_permutation(data):
    module = make_fedfv(data, order="random")
    losses = torch.rand(8)
    first = module.projection_order(losses, 3)
    assert sorted(first.tolist()) == list(range(8))
    assert torch.equal(first, module.projection_order(losses, 3))
    assert any(not torch.equal(first, module.projection_order(losses, t)) for t in range(4, 8))


@pytest.mark.parametrize(
    "kwargs, message",
    [({"alpha": 1.5}, "alpha"), ({"tau": -1}, "tau"), ({"tau": 1.5}, "tau"),
     ({"order": "ascending"}, "order"), ({"external_rounds": "code"}, "external_rounds")],
)
def test_bad_hyper_parameters_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FedFV(backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8), **kwargs)


class LastRoundMetrics(pl.Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        self.metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}


def test_short_fit_keeps_history_of_the_sampled_clients(data, tmp_path):
    module = FedFV(backbone="fl_logreg", num_classes=data.num_classes, input_shape=data.input_shape,
                   num_rounds=3, fraction=0.5, batch_size=32, lr=0.1, eval_every=1, alpha=0.2, tau=1, seed=0)
    recorder = LastRoundMetrics()
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, callbacks=[recorder], default_root_dir=tmp_path)
    trainer.fit(module, datamodule=data)

    assert torch.isfinite(module.round_engine.global_vector()).all()
    last_sampled = module.sample_clients(module.round_context(2))
    assert (module.last_seen[last_sampled] == 2).all()
    assert set(module.last_seen.tolist()) <= {-1, 0, 1, 2}
    # τ = 1: round 3 reads only rows from round 2; older rows are zeroed when they leave the window
    in_window = module.last_seen == 2
    assert (module.history[in_window].norm(dim=1) > 0).all() and (module.history[~in_window] == 0).all()
    assert {"conflicts_model", "server_time_s", "test_acc_mean"} <= set(recorder.metrics)
    restored = FedFV.load_from_checkpoint(trainer.checkpoint_callback.best_model_path)
    assert torch.equal(restored.last_seen, module.last_seen)
    # the checkpoint holds the window's rows, less those of the clients that answer round 3
    answering = module.round_engine.drop_clients(3, module.sample_clients(module.round_context(3)))
    kept = in_window.clone()
    kept[answering] = False
    assert kept.any() and (in_window & ~kept).any()
    assert torch.equal(restored.history[kept], module.history[kept]) and (restored.history[~kept] == 0).all()
    with pytest.raises(RuntimeError, match="left out of the checkpoint"):
        restored.history_rows(torch.nonzero(in_window & ~kept).flatten(), module.history)
