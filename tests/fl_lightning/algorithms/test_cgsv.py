"""CGSV's fair gradient reward mechanism (Sec. 3.4) and the paper's baselines (Sec. 4.1)."""

import math
import warnings

import lightning.pytorch as pl
import pytest
import torch

from fl_lightning.algorithms.cgsv import CGSV, DW, EU, RR, Standalone
from fl_lightning.core.evaluation import evaluate_clients_stacked
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.metrics import pearson
from tests import builders


# ------------------------------------------------------------------------------ helpers
def tiny_agents(cls=CGSV, num_agents=3, **kwargs):
    """A module whose model has D = 4 parameters (logistic regression 1 -> 2: weight 2x1,
    bias 2), with its per-agent state set up for ``num_agents`` agents."""
    module = cls(backbone="fl_logreg", num_classes=2, input_shape=(1,), **kwargs)
    module.materialise_client_states(num_agents)
    return module


def payload(delta_w, num_samples, round_index=0):
    """A round's uploads from the agents' updates Δw_i (J holds g_i = −Δw_i)."""
    return builders.payload(-torch.as_tensor(delta_w, dtype=torch.float32), num_samples, round_index=round_index)


def run_round(module, round_payload):
    """The server side of one round (``server_round``: aggregate, then the commit of its state), returning
    the server step and every agent's model change v_i."""
    before = module.agent_models.clone()
    step = module.server_round(round_payload)
    return step, module.agent_models - before  # the server step and every v_i


def digits(num_clients=4, **kwargs):
    params = dict(source="digits", num_clients=num_clients, partition="iid", test_mode="global", seed=0)
    params.update(kwargs)
    return FederatedDataModule(**params)


def fit(cls, data, callbacks=(), **kwargs):
    params = dict(backbone="fl_logreg", num_classes=data.num_classes, input_shape=data.input_shape,
                  num_rounds=3, batch_size=32, lr=0.1, eval_every=1, seed=0)
    params.update(kwargs)
    module = cls(**params)
    builders.fit(module, data, callbacks=list(callbacks))
    return module


class Recorder(pl.Callback):
    """Logged metrics, server model and agent models at the end of every round."""

    def __init__(self):
        self.rounds, self.servers, self.agents = [], [], []

    def on_train_start(self, trainer, module):
        self.start = module.agent_models.clone()  # w_{i,0} = w_0 for every agent

    def on_train_epoch_end(self, trainer, module):
        self.rounds.append({k: float(v) for k, v in trainer.callback_metrics.items()})
        self.servers.append(module.round_engine.global_vector().clone())
        self.agents.append(module.agent_models.clone())


# ------------------------------------------------------------------- hand-computed rounds
def test_three_agent_round_by_hand():
    """Γ = 0.5, equal data sizes (round 1 weighs agents by data share: 1/3 each).
    Δw_1 = Δw_2 ∝ (1,1,1,1), Δw_3 ∝ (1,-1,1,-1) -> u_1 = u_2 = (1,1,1,1)/4, u_3 = (1,-1,1,-1)/4,
    u_N = (3,1,3,1)/12, ψ = (2/√5, 2/√5, 1/√5), r ∝ 0.05 ψ -> (0.4, 0.4, 0.2),
    q = ⌊4 tanh(β r_i) / tanh(0.4)⌋ = (4, 4, 2): agent 3 gets the 2 largest entries of u_N."""
    module = tiny_agents(sparsify="model")
    w0 = module.round_engine.global_vector().clone()
    step, v = run_round(module, payload([[2, 2, 2, 2], [2, 2, 2, 2], [3, -3, 3, -3]], [10, 10, 10]))
    u_N = torch.tensor([3.0, 1.0, 3.0, 1.0]) / 12
    assert torch.allclose(step, -u_N, atol=1e-6)  # the server moves by u_N: step = -u_N
    assert torch.allclose(module.r, torch.tensor([0.4, 0.4, 0.2], dtype=torch.float64), atol=1e-6)
    assert math.floor(4 * math.tanh(0.2) / math.tanh(0.4)) == 2
    assert torch.allclose(v[0], u_N, atol=1e-6) and torch.allclose(v[1], u_N, atol=1e-6)
    assert torch.allclose(v[2], torch.tensor([3.0, 0.0, 3.0, 0.0]) / 12, atol=1e-6)
    assert torch.equal(module.round_engine.global_vector(), w0)  # applying the step is the core's job

    # round 2 aggregates with r = (0.4, 0.4, 0.2): u_N = 0.6 (1,1,1,1)/4, ψ = (1, 1, -1),
    # r = 0.95 r + 0.05 ψ = (0.43, 0.43, 0.14) (already sums to 1), q_3 = ⌊4 tanh(.14)/tanh(.43)⌋ = 1
    step, v = run_round(module, payload([[1, 1, 1, 1], [2, 2, 2, 2], [-1, -1, -1, -1]], [10, 10, 10], 1))
    assert torch.allclose(step, torch.full((4,), -0.15), atol=1e-6)
    assert torch.allclose(module.r, torch.tensor([0.43, 0.43, 0.14], dtype=torch.float64), atol=1e-6)
    assert math.floor(4 * math.tanh(0.14) / math.tanh(0.43)) == 1
    assert int((v[2] != 0).sum()) == 1 and torch.allclose(v[0], torch.full((4,), 0.15), atol=1e-6)


def test_clamp_and_normalisation_of_r():
    """Δw_3 = (-1,-1,-1,1) is orthogonal to u_N = (1,1,1,3)/12: ψ_3 = 0, so 0.05 ψ_3 is clamped
    to 1e-3 before normalising, and agent 3's quota ⌊4 tanh(r_3)/tanh(r_1)⌋ is 0."""
    module = tiny_agents(sparsify="model")
    _, v = run_round(module, payload([[1, 1, 1, 1], [1, 1, 1, 1], [-1, -1, -1, 1]], [10, 10, 10]))
    raw = torch.tensor([0.05 * math.sqrt(3) / 2, 0.05 * math.sqrt(3) / 2, 1e-3], dtype=torch.float64)
    assert torch.allclose(module.r, raw / raw.sum(), atol=1e-6)
    assert torch.equal(v[2], torch.zeros(4))
    assert torch.allclose(v[0], torch.tensor([1.0, 1.0, 1.0, 3.0]) / 12, atol=1e-6)


@pytest.mark.parametrize("sparsify", ["model", "per_tensor"])
def test_round_matches_a_direct_transcription(sparsify):
    """Eq. (1)-(5) written out with vectors, on an MLP (D = 1210), random uploads and a
    random earlier r; in "model" mode agent i downloads exactly q_i = ⌊D ratio_i⌋ entries of
    u_N, in "per_tensor" mode ⌈n_l ratio_i⌉ of every tensor l, always the largest ones."""
    torch.manual_seed(0)
    module = CGSV(backbone="fl_mlp", backbone_kwargs={"hidden_sizes": [16]}, num_classes=10,
                  input_shape=(1, 8, 8), sparsify=sparsify, beta=1.5, gamma=0.3)
    module.materialise_client_states(5)
    r_before = torch.tensor([0.1, 0.3, 0.2, 0.25, 0.15], dtype=torch.float64)
    module.r.copy_(r_before)
    delta_w = torch.randn(5, module.num_parameters) * torch.tensor([1.0, 2.0, 0.5, 1.0, 3.0])[:, None]
    delta_w[4] = -delta_w[:4].sum(dim=0)  # one agent against the rest
    step, v = run_round(module, payload(delta_w, [30, 10, 20, 40, 50]))

    u = 0.3 * delta_w.double() / (delta_w.double().norm(dim=1, keepdim=True) + 1e-7)  # (1)
    u_N = r_before @ u
    psi = torch.nn.functional.cosine_similarity(u, u_N.expand_as(u), dim=1)  # (3)
    r = (0.95 * r_before + 0.05 * psi).clamp(min=1e-3)  # (4)
    r = r / r.sum()
    ratio = torch.tanh(1.5 * r) / torch.tanh(1.5 * r).max()  # (5)
    assert torch.allclose(step.double(), -u_N, atol=1e-6)
    assert torch.allclose(module.r, r, atol=1e-6)
    assert psi[4] < 0 and module.r[4] == module.r.min()
    magnitude = u_N.abs()
    for i in range(5):
        kept = v[i] != 0
        assert torch.allclose(v[i][kept].double(), u_N[kept], atol=1e-6)
        if sparsify == "model":
            assert int(kept.sum()) == math.floor(module.num_parameters * float(ratio[i]))
            pieces = [slice(0, module.num_parameters)]
        else:
            pieces = list(module.round_engine.layout.slices().values())
            for s in pieces:
                assert int(kept[s].sum()) == math.ceil((s.stop - s.start) * float(ratio[i]))
        for s in pieces:
            if 0 < int(kept[s].sum()) < s.stop - s.start:  # the kept ones are the largest
                assert magnitude[s][kept[s]].min() >= magnitude[s][~kept[s]].max()
    assert int((v[int(r.argmax())] != 0).sum()) == module.num_parameters  # top agent: all of u_N


def test_beta_infinity_downloads_all_of_u_N():
    module = tiny_agents(beta=float("inf"))
    step, v = run_round(module, payload([[1, 2, 3, 4], [4, 3, 2, 1], [-1, 0, 1, 0]], [10, 20, 30]))
    assert torch.allclose(v, -step.expand(3, -1))


def test_beta_infinity_fit_is_vanilla_fl():
    """β = ∞: every agent downloads u_N every round, so every agent holds the server model."""
    recorder = Recorder()
    module = fit(CGSV, digits(3), callbacks=[recorder], beta=float("inf"), num_rounds=2)
    assert all(r["cgsv_density_min"] == 1.0 for r in recorder.rounds)
    assert torch.allclose(module.agent_models, module.round_engine.global_vector().expand(3, -1), atol=1e-6)
    assert not torch.allclose(recorder.servers[0], recorder.servers[1])


# -------------------------------------------------------------- the label-noise illustration
def test_label_noise_lowers_importance_and_download_density():
    """Sec. 3.4 / Fig. 2 at tiny scale: 4 agents on digits, agents 1 and 3 with 60% of their
    training labels randomised. They upload worse updates, so they end with lower r_i,
    download sparser rewards and end farther from the server model. ρ and ρ_r are logged."""
    data = digits(4)
    data.setup("fit")
    g = torch.Generator().manual_seed(0)
    for k in (1, 3):
        rows = data.train_index[k, : int(data.train_sizes[k])]
        noisy = rows[torch.randperm(len(rows), generator=g)[: int(0.6 * len(rows))]]
        data.train_y[noisy] = torch.randint(0, 10, (len(noisy),), generator=g)
    recorder = Recorder()
    module = fit(CGSV, data, callbacks=[recorder], num_rounds=4, track_standalone=True)
    last = recorder.rounds[-1]
    r = [last[f"cgsv_r/{i}"] for i in range(4)]
    density = [last[f"cgsv_density/{i}"] for i in range(4)]
    assert max(r[1], r[3]) < min(r[0], r[2])
    assert max(density[1], density[3]) < min(density[0], density[2])
    assert sum(r) == pytest.approx(1.0, abs=1e-6) and last["cgsv_r_min"] == pytest.approx(min(r))
    distance = (module.agent_models - module.round_engine.global_vector()).norm(dim=1)
    assert distance[[1, 3]].min() > distance[[0, 2]].max()

    # ρ_r and ρ (Sec. 4.1, App. B.3), recomputed from the module's state
    final = torch.tensor(module.last_client_metrics["test_accuracy"], dtype=torch.float64)
    n = data.global_test_y.shape[0]
    everything = torch.arange(n).expand(4, n)
    standalone = evaluate_clients_stacked(module.model, module.round_engine.layout, module.standalone_models,
                                          data.global_test_x, data.global_test_y, everything,
                                          torch.full((4,), n))[1]
    assert standalone.mean().item() == pytest.approx(last["standalone_test_acc_mean"], abs=1e-6)
    for key, value in (("cgsv_rho_r", module.r), ("cgsv_rho", standalone.double())):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # nan (with a warning) if all final accuracies are equal
            expected = 100 * float(pearson(value, final))
        assert last[key] == pytest.approx(expected, abs=1e-4, nan_ok=True)
    assert module.rho == pytest.approx(last["cgsv_rho"], nan_ok=True)


# ------------------------------------------------------------------------------ baselines
def test_standalone_trains_alone_and_equals_cgsv_standalone_tracking():
    data = digits(3)
    recorder = Recorder()
    alone = fit(Standalone, data, callbacks=[recorder])
    tracked = fit(CGSV, data, track_standalone=True)
    assert torch.allclose(alone.agent_models, tracked.standalone_models, atol=1e-6)
    assert not torch.allclose(alone.agent_models, recorder.start)  # the agents learned
    assert torch.equal(alone.round_engine.global_vector(), recorder.start[0])  # nothing was aggregated
    assert min(alone.last_client_metrics["test_accuracy"]) > 0.5  # evaluated on the agents' models


def test_dw_downloads_are_proportional_to_data_size():
    data = digits(3, partition="power_law")
    recorder = Recorder()
    module = fit(DW, data, callbacks=[recorder], num_rounds=2, sparsify="model")
    sizes = data.train_sizes.double()
    D = module.num_parameters
    expected = torch.floor(D * sizes / sizes.max()) / D
    logged = torch.tensor([recorder.rounds[-1][f"cgsv_density/{i}"] for i in range(3)], dtype=torch.float64)
    assert sizes[0] < sizes[2]
    assert torch.allclose(logged, expected, atol=1e-6)
    assert module.r.sum().item() == pytest.approx(1.0)  # r from ψ is still kept (and logged)


def test_round_robin_gives_each_agent_the_server_model_in_turn():
    recorder = Recorder()
    fit(RR, digits(3), callbacks=[recorder], num_rounds=4)
    previous = recorder.start
    for t, (agents, server) in enumerate(zip(recorder.agents, recorder.servers)):
        turn = t % 3
        assert torch.allclose(agents[turn], server, atol=1e-6)  # caught up with the server
        others = [i for i in range(3) if i != turn]
        assert torch.equal(agents[others], previous[others])  # nobody else downloaded
        assert recorder.rounds[t][f"cgsv_density/{turn}"] == 1.0
        previous = agents


def test_eu_values_agents_by_euclidean_distance():
    """EU: ψ_i = 1 − d_i / Σ d_j with d_i = ||Δw_i − Σ_j a_j Δw_j|| on the unnormalised updates."""
    module = tiny_agents(EU, sparsify="model")
    delta_w = torch.tensor([[1.0, 1, 1, 1], [1.2, 0.8, 1, 1], [4, -4, 0, 1]])
    run_round(module, payload(delta_w, [10, 20, 10]))
    a = torch.tensor([0.25, 0.5, 0.25])
    d = (delta_w - a @ delta_w).norm(dim=1).double()
    psi = 1 - d / d.sum()
    r = 0.05 * psi / (0.05 * psi).sum()
    assert torch.allclose(module.r, r, atol=1e-6)
    assert module.r[2] == module.r.min()  # the far agent


def test_eu_fit_runs_and_keeps_r_normalised():
    recorder = Recorder()
    module = fit(EU, digits(3), callbacks=[recorder], num_rounds=2)
    assert torch.isfinite(module.agent_models).all()
    assert module.r.sum().item() == pytest.approx(1.0)
    assert "cgsv_rho_r" in recorder.rounds[-1]


def test_resuming_from_a_checkpoint_continues_the_same_run(tmp_path):
    """Agent models, r and standalone models are buffers: a run resumed after round 2 ends
    where the uninterrupted run does; a second setup() keeps them."""
    data = digits(3)
    straight = fit(CGSV, data, track_standalone=True)
    first = fit(CGSV, data, num_rounds=2, track_standalone=True)
    first.trainer.save_checkpoint(tmp_path / "round2.ckpt")
    resumed = CGSV(backbone="fl_logreg", num_classes=10, input_shape=data.input_shape, num_rounds=3,
                   batch_size=32, lr=0.1, eval_every=1, seed=0, track_standalone=True)
    builders.trainer().fit(resumed, datamodule=data, ckpt_path=tmp_path / "round2.ckpt")
    for name in ("agent_models", "r", "standalone_models"):
        assert torch.allclose(getattr(resumed, name), getattr(straight, name), atol=1e-6), name
    before = resumed.agent_models.clone(), resumed.r.clone()
    resumed.setup("validate")
    assert torch.equal(resumed.agent_models, before[0]) and torch.equal(resumed.r, before[1])


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(fraction=0.5), "fraction=1.0"),
        (dict(gamma=0.0), "gamma"),
        (dict(alpha=1.0), "alpha"),
        (dict(beta=-1.0), "beta"),
        (dict(sparsify="layer"), "per_tensor"),
    ],
)
def test_bad_values_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        CGSV(**bad)
