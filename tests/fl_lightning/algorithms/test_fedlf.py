"""FedLF (fedlf_appendix.md A.1): the paper's examples, its no-conflict guarantee, and a fit."""

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from cvxopt import matrix, solvers

from fl_lightning.algorithms.fedlf import FedLF, fair_coefficients, merge_zero_groups
from fl_lightning.core.flat import model_vector
from fl_lightning.core.gram import conflict_counts
from fl_lightning.data.datamodule import FederatedDataModule
from tests import builders


def fedlf(slices, num_clients=8, **kwargs):
    """A FedLF whose aggregation sees hand-made vectors cut into ``slices``."""
    params = dict(backbone="fl_logreg", num_classes=2, input_shape=(1,), fraction=1.0, lr=1.0)
    module = FedLF(**(params | kwargs))
    module.round_engine.layer_slices = slices
    module.register_client_history(slices[-1].stop)  # the hand-made vectors' d
    module.materialise_client_states(num_clients)
    return module


def payload(updates, losses, clients=None, t=0):
    return builders.payload(updates, losses=losses, clients=clients, round_index=t)


def slices_of(sizes):
    bounds = np.cumsum([0, *sizes])
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def conflict_free_groups(module, result, vectors):
    """At every final layer group of the round's ``result`` (its ``ServerStep``): the direction
    is exactly 0 (Pareto-stationary there) or conflicts with none of ``vectors``. Returns how
    many groups had a non-zero direction."""
    nonzero, step = 0, result.direction
    for group, zero in result.details["groups"]:
        slices = module.round_engine.layer_slices
        piece = slice(slices[group[0]].start, slices[group[-1]].stop)
        if zero:
            assert not step[piece].any()
        else:
            assert no_conflict(vectors, step, piece), group
            nonzero += 1
    return nonzero


def no_conflict(vectors, step, piece):
    """Every vector's piece has a strictly positive inner product with the server step's
    (the server moves by −step, a client's own move is −g: conflict = g·step < 0)."""
    return bool((vectors[:, piece].double() @ step[piece].double() > 0).all())


# ------------------------------------------------------------------ the paper's examples
@pytest.mark.parametrize("losses", [[1.0, 1.0], [0.5, 1.0], [2.0, 0.3]])
def test_two_layer_example_of_a1(losses):
    g = torch.tensor([[0.1, 0.1, 0.2, -0.1], [-0.1, 0.2, -0.1, 0.4]])
    slices = [slice(0, 2), slice(2, 4)]
    # averaging is a common descent direction but conflicts with client 1 at layer 2
    assert conflict_counts(g, g.mean(0), slices) == (0, [0, 1])
    assert torch.allclose(-g.mean(0), torch.tensor([0.0, -0.15, -0.05, -0.15]))
    step = fedlf(slices).propose(payload(g, losses)).direction
    assert conflict_counts(g, step, slices) == (0, [0, 0])
    assert all(no_conflict(g, step, s) for s in [*slices, slice(0, 4)])


@pytest.mark.parametrize("losses", [[1.0, 1.0, 1.0], [0.2, 0.5, 0.9]])
def test_three_client_example_of_figure_1(losses):
    g = torch.tensor([[-1.0, 0.5, 0.0], [0.8, -1.0, 0.0], [1.0, 1.0, -1.0]])
    assert (g @ g.mean(0) < 0).tolist() == [True, False, False]  # −mean conflicts with client 1
    step = fedlf([slice(0, 3)]).propose(payload(g, losses)).direction
    assert (g @ step > 0).all()


# ------------------------------------------------------------- a direct transcription
def transcribed_step(g, losses, slices, eta, history=None, fair_gradient="paper"):
    """A.1 step by step with explicit vectors and one cvxopt QP per layer; returns the
    server step −η d (w ← w + η d)."""
    g = g.double()
    F = losses.double()
    one = torch.ones_like(F)
    q = ((F @ one) / (one.norm() * F.norm() ** 2) * F - one / one.norm()) / F.norm()
    use_fair = not torch.allclose(F, F[0].expand_as(F))
    history = torch.zeros(0, g.shape[1], dtype=g.dtype) if history is None else history.double()
    d = []
    for s in slices:
        mu = g[:, s].norm(dim=1).mean()
        online = [v * mu / v.norm() for v in g[:, s]]
        fair = q @ (g[:, s] if fair_gradient == "paper" else torch.stack(online))
        vectors = torch.stack(online + ([fair * mu / fair.norm()] if use_fair else [])
                              + [h * mu / h.norm() for h in history[:, s]])
        n = vectors.shape[0]
        solvers.options["show_progress"] = False
        solution = solvers.qp(matrix((2 * vectors @ vectors.T).numpy()), matrix(np.zeros(n)),
                              matrix(-np.eye(n)), matrix(np.zeros(n)),
                              matrix(np.ones((1, n))), matrix(np.ones(1)))
        weights = torch.tensor(np.array(solution["x"]).ravel())
        d.append(-(weights @ vectors))
    d = torch.cat(d)
    d = d / d.norm() * g.mean(0).norm()
    return -eta * d


def random_round(seed, m, sizes, equal_losses=False):
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(m, sum(sizes), generator=gen)
    losses = torch.full((m,), 0.7) if equal_losses else 0.1 + torch.rand(m, generator=gen)
    return g, losses


@pytest.mark.parametrize("fair_gradient", ["paper", "reference"])
@pytest.mark.parametrize("solver", ["batched", "cvxopt"])
def test_matches_a_transcription_of_the_paper(fair_gradient, solver):
    sizes = [6, 3, 8]
    slices = slices_of(sizes)
    for seed in range(4):
        g, losses = random_round(seed, 3, sizes, equal_losses=seed == 3)
        module = fedlf(slices, lr=0.5, server_lr=2.0, server_lr_decay=0.9, qp_solver=solver,
                       fair_gradient=fair_gradient)
        t = 3
        eta = 2.0 * 0.5 * 0.9**t  # η_t = server_lr · lr · decay^t
        ours = module.propose(payload(g * module.round_engine.round_lr(t), losses, t=t)).direction  # updates = η_t g
        theirs = transcribed_step(g, losses, slices, eta, fair_gradient=fair_gradient)
        assert torch.allclose(ours.double(), theirs, atol=1e-5 * theirs.norm()), seed


def test_batched_and_cvxopt_solvers_give_the_same_direction():
    for seed in range(6):
        sizes = [2 + seed, 5, 1 + seed % 3, 4]
        g, losses = random_round(100 + seed, 2 + seed % 4, sizes)
        history_g, _ = random_round(200 + seed, 3, sizes)
        steps = []
        for solver in ("batched", "cvxopt"):
            module = fedlf(slices_of(sizes), num_clients=10, qp_solver=solver)
            old = payload(history_g, [1.0, 1.0, 1.0], clients=[7, 8, 9])
            # 7-9 become absent, recent clients
            module.on_round_end(module.with_round_context(old), module.propose(old).direction)
            steps.append(module.propose(payload(g, losses, t=1)).direction)
        assert torch.allclose(steps[0], steps[1], atol=1e-5 * steps[1].norm()), seed


def test_step_has_the_norm_of_the_mean_gradient_times_the_decayed_lr():
    g, losses = random_round(5, 4, [3, 4])
    module = fedlf(slices_of([3, 4]), lr=0.2, server_lr=1.5, server_lr_decay=0.99)
    t = 7
    step = module.propose(payload(g * module.round_engine.round_lr(t), losses, t=t)).direction
    expected = 1.5 * 0.2 * 0.99**t * g.mean(0).norm()
    assert torch.isclose(step.norm(), expected, rtol=1e-5)


# ------------------------------------------------------------------ the guarantee
@pytest.mark.slow
def test_property_no_online_client_conflicts_at_any_layer_unless_stationary():
    gen = np.random.default_rng(0)
    nonzero = 0
    for case in range(50):
        m = int(gen.integers(1, 7))
        sizes = [int(s) for s in gen.integers(1, 7, size=int(gen.integers(1, 5)))]
        combine = bool(case % 2)
        module = fedlf(slices_of(sizes), num_clients=m + 4, combine_layers=combine)
        absent, _ = random_round(1000 + case, 4, sizes)
        if case % 3:  # clients m..m+3 were online in round 0 and are absent in round 1
            old = payload(absent, torch.rand(4).tolist(), clients=range(m, m + 4))
            module.on_round_end(module.with_round_context(old), module.propose(old).direction)
        g, losses = random_round(case, m, sizes, equal_losses=case % 5 == 0)
        result = module.propose(payload(g, losses, t=1))
        step = result.direction
        assert torch.isfinite(step).all()
        vectors = torch.cat([g, absent]) if result.metrics["fedlf_absent_added"] else g
        conflict_free_groups(module, result, vectors)
        if not combine:
            assert [group for group, _ in result.details["groups"]] == [[k] for k in range(len(sizes))]
        if step.any():
            nonzero += 1
            assert no_conflict(g, step, slice(None))
    assert nonzero >= 30


def test_pareto_stationary_layer_gets_a_zero_direction():
    g = torch.tensor([[1.0, 2.0, 3.0, 1.0], [-1.0, -2.0, 1.0, 3.0]])  # layer 1: g2 = −g1
    slices = [slice(0, 2), slice(2, 4)]
    module = fedlf(slices, combine_layers=False)
    step = module.propose(payload(g, [1.0, 1.0])).direction
    assert torch.isfinite(step).all() and not step[:2].any()
    assert no_conflict(g, step, slices[1])
    # everywhere stationary: no step at all, with or without combining layers
    for combine in (False, True):
        module = fedlf(slices, combine_layers=combine)
        result = module.propose(payload(torch.stack([g[0], -g[0]]), [0.5, 1.0]))
        step = result.direction
        assert torch.isfinite(step).all() and not step.any()
        assert result.metrics["fedlf_zero_layers"] == 2


def test_equal_losses_leave_the_fair_gradient_out():
    assert fair_coefficients(torch.tensor([0.3, 0.3, 0.3])) is None
    assert fair_coefficients(torch.zeros(3)) is None
    q = fair_coefficients(torch.tensor([0.2, 0.3, 0.9]))
    assert abs(float(q @ torch.tensor([0.2, 0.3, 0.9]).double())) < 1e-12  # q ⊥ F (A.1)
    g, _ = random_round(3, 3, [4, 4])
    module = fedlf(slices_of([4, 4]))
    result = module.propose(payload(g, [0.3, 0.3, 0.3]))
    assert torch.isfinite(result.direction).all() and result.metrics["fedlf_fair_used"] == 0
    result = module.propose(payload(g, [0.2, 0.3, 0.9]))
    assert result.metrics["fedlf_fair_used"] == 1


@pytest.mark.parametrize("solver", ["batched", "cvxopt"])
def test_a_fair_gradient_that_cancels_is_left_out_like_equal_losses(solver):
    """q has both signs (q ⊥ F), so g_P = Σ q_i g_i can cancel to rounding noise: rescaled to μ,
    that noise used to enter the QP as a direction (and broke the Gram's symmetry)."""
    g = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.5, 1.0], [0.5, -1.0]])  # g0 + g1 = 2 (g2 + g3)
    losses = [1.0, 1.0, 0.5, 0.5]  # q = (0.1, 0.1, −0.2, −0.2) / ||F||: g_P = 0
    assert (fair_coefficients(torch.tensor(losses)) @ g.double()).norm() < 1e-12
    steps = []
    for losses_of_round in (losses, [0.7] * 4):
        module = fedlf(slices_of([2]), num_clients=4, qp_solver=solver)
        steps.append(module.propose(payload(g, losses_of_round)).direction)
    assert torch.allclose(steps[0], steps[1], atol=1e-6), steps
    assert steps[0][0] > 0 and abs(float(steps[0][1])) < 1e-6  # along the min-norm point (0.5, 0)
    # the Hypothesis case that broke the symmetry check: rows cancel to 1e-17 in one coordinate
    cancelling = torch.zeros(5, 8)
    cancelling[2, 5], cancelling[3, 5], cancelling[4, 5] = 1e-17, 1e-3, -1e-3
    module = fedlf(slices_of([5, 3]), num_clients=5, qp_solver=solver)
    step = module.propose(payload(cancelling, [1.0, 1.0, 1.0, 0.5, 0.5])).direction
    assert torch.isfinite(step).all() and (cancelling.double() @ step.double() >= -1e-12).all()


# ------------------------------------------------------------------ combining layers
def test_merge_zero_groups_joins_the_next_group_or_the_previous_for_the_last():
    assert merge_zero_groups([[0], [1], [2]], [True, False, False]) == [[0, 1], [2]]
    assert merge_zero_groups([[0], [1], [2]], [False, False, True]) == [[0], [1, 2]]
    assert merge_zero_groups([[0], [1], [2], [3]], [True, True, False, True]) == [[0, 1], [2, 3]]


def test_combine_layers_merges_a_layer_whose_direction_is_zero():
    g = torch.tensor([[1.0, 1.0, 0.5], [-1.0, 0.5, 2.0]])  # layer 0 (one parameter) is stationary
    slices = [slice(0, 1), slice(1, 3)]
    apart = fedlf(slices, combine_layers=False).propose(payload(g, [1.0, 1.0])).direction
    assert apart[0] == 0 and apart[1:].any()
    module = fedlf(slices)
    result = module.propose(payload(g, [1.0, 1.0]))
    step = result.direction
    assert result.details["groups"] == [([0, 1], False)]
    assert result.metrics["fedlf_layers_merged"] == 2
    assert step[0] != 0 and no_conflict(g, step, slice(0, 3))
    # the last layer joins the previous one
    module = fedlf([slice(0, 2), slice(2, 3)])
    result = module.propose(payload(torch.tensor([[1.0, 0.5, 1.0], [0.5, 1.0, -1.0]]), [1.0, 1.0]))
    assert result.details["groups"] == [([0, 1], False)]


def test_combining_repeats_until_the_merged_direction_is_nonzero():
    g = torch.tensor([[1.0, 2.0, 1.0, 0.2], [-1.0, -2.0, 0.3, 1.0]])  # layers 0, 1 and 0+1 stationary
    module = fedlf([slice(0, 1), slice(1, 2), slice(2, 4)])
    result = module.propose(payload(g, [1.0, 1.0]))
    step = result.direction
    assert result.details["groups"] == [([0, 1, 2], False)]
    assert no_conflict(g, step, slice(0, 4)) and step[:2].any()


# ------------------------------------------------------------------ absent clients
def test_tau_and_the_absent_clients_over_a_sequence_of_rounds():
    sizes = [8, 6]
    module = fedlf(slices_of(sizes), num_clients=6)
    rounds = [([0, 1], None, 0), ([2, 3], None, 0), ([4, 5], [0, 1, 2, 3], 2),
              ([0, 2], [1, 3, 4, 5], 3), ([1, 3, 4], [0, 2, 5], 2)]
    for t, (online, absent, tau) in enumerate(rounds):
        g, losses = random_round(t, len(online), sizes)
        p = payload(g, losses, clients=online, t=t)
        ids, found_tau = module.absent_clients(p)
        assert ids.tolist() == (absent or []) and found_tau == tau, t
        result = module.propose(p)
        assert result.metrics["fedlf_absent_added"] == len(absent or [])
        if absent:  # their last gradients are in the QP: no conflict with them either
            assert conflict_free_groups(module, result, module.history[absent]) > 0
        module.on_round_end(module.with_round_context(p), result.direction)
        assert torch.allclose(module.history[online], g) and (module.last_seen[online] == t).all()


# ------------------------------------------------------------------ a federated fit
class Recorder(pl.Callback):
    def __init__(self):
        self.rounds = []

    def on_train_epoch_end(self, trainer, pl_module):
        self.rounds.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def fit(data, **kwargs):
    params = dict(backbone="fl_mlp", backbone_kwargs={"hidden_sizes": [16]}, num_classes=data.num_classes,
                  input_shape=data.input_shape, num_rounds=3, fraction=0.5, batch_size=16, lr=0.1, eval_every=1, seed=0)
    module = FedLF(**(params | kwargs))
    recorder = Recorder()
    builders.fit(module, data, callbacks=[recorder])
    return module, recorder.rounds


@pytest.fixture(scope="module")
def data():
    return FederatedDataModule(source="digits", num_clients=8, partition="dirichlet",
                               partition_params={"alpha": 0.3}, test_mode="local", local_test_fraction=0.2, seed=0)


def test_fit_with_partial_participation_never_conflicts_with_an_online_client(data):
    module, rounds = fit(data, num_rounds=4)
    assert len(rounds) == 4
    assert [r["conflicts_model"] for r in rounds] == [0.0] * 4
    for r in rounds:
        if r["fedlf_layers_merged"] == 0:
            assert r["conflicts_layer_max"] == 0
    assert rounds[0]["fedlf_absent_added"] == 0 and rounds[-1]["fedlf_absent_added"] > 0
    assert all(r["fedlf_fair_used"] == 1 for r in rounds)
    assert torch.isfinite(model_vector(module.model, module.round_engine.layout)).all()
    assert int(module.last_seen.max()) == 3 and int((module.last_seen >= 0).sum()) >= 4
    assert {"history", "last_seen"} <= set(module.state_dict())  # checkpoints hold the state
    assert "test_acc_mean" in rounds[-1]


def test_full_batch_signal_is_the_clients_gradient_at_w(data):
    module, rounds = fit(data, gradient="full_batch", num_rounds=1, layer_grouping="module")
    assert rounds[0]["conflicts_model"] == 0
    shards = module.client_shards(torch.tensor([0, 3]))
    gradients = module.train_clients(module.round_context(1), shards)
    for row, k in enumerate([0, 3]):
        samples = shards.index[row, : shards.sizes_cpu[row]]
        module.model.zero_grad()
        loss = torch.nn.functional.cross_entropy(module.model(data.train_x[samples]), data.train_y[samples])
        loss.backward()
        expected = torch.cat([p.grad.reshape(-1) for p in module.model.parameters()])
        assert torch.allclose(gradients[row], expected, atol=1e-5), k


@pytest.mark.parametrize(
    "kwargs",
    [dict(gradient="sgd"), dict(server_lr=0.0), dict(server_lr_decay=1.5), dict(qp_solver="scipy"),
     dict(zero_tol=0.0), dict(fair_gradient="rescaled")],
)
def test_bad_hyper_parameters_are_rejected(kwargs):
    with pytest.raises(ValueError):
        FedLF(backbone="fl_logreg", num_classes=2, input_shape=(1,), **kwargs)


def test_a_layer_qp_that_stops_at_max_iter_is_logged_as_a_fallback(monkeypatch):
    """The batched solver's QPs left above their tolerance at max_iter are feasible but not certified
    optimal: FedLF logs them in fedlf_qp_fallbacks (was 0 whatever happened) and the solve warns."""
    import fl_lightning.algorithms.fedlf as fedlf_module
    from fl_lightning.algorithms.qp import solve_min_norm_batch

    sizes = [6, 3, 8]
    g, losses = random_round(7, 5, sizes)
    module = fedlf(slices_of(sizes), qp_solver="batched")
    certified = module.propose(payload(g, losses))
    assert certified.metrics["fedlf_qp_fallbacks"] == 0.0
    monkeypatch.setattr(fedlf_module, "solve_min_norm_batch",
                        lambda grams: solve_min_norm_batch(grams, max_iter=1, tol=1e-14))
    with pytest.warns(RuntimeWarning, match="did not reach tol"):
        stopped = fedlf(slices_of(sizes), qp_solver="batched").propose(payload(g, losses))
    assert stopped.metrics["fedlf_qp_fallbacks"] >= 1.0
    assert stopped.qp_fallbacks == stopped.metrics["fedlf_qp_fallbacks"]
