"""Issue 6, faults and attacks: dropped clients, NaN/inf and zero updates, failing QPs and
one malicious client (FedMGDA+ Sec. 6.2.2). Every algorithm keeps a finite model."""

import lightning.pytorch as pl
import pytest
import torch

from fl_lightning.algorithms import ALGORITHMS
from fl_lightning.core.module import FederatedModule
from fl_lightning.data.datamodule import FederatedDataModule
from tests.fl_lightning.core.test_module import Recorder

FULL_PARTICIPATION = {"AFL", "CGSV", "Standalone", "DW", "RR", "EU", "CFFL", "ECI"}


def data_for(num_clients=6, seed=0):
    return FederatedDataModule(source="digits", num_clients=num_clients, partition="iid", test_mode="local",
                               local_test_fraction=0.2, seed=seed)


def make(name, data, **kwargs):
    params = dict(backbone="fl_logreg", num_classes=data.num_classes, input_shape=data.input_shape, num_rounds=2,
                  fraction=1.0 if name in FULL_PARTICIPATION else 0.5, batch_size=16, lr=0.05, eval_every=1, seed=0)
    return ALGORITHMS[name](**(params | kwargs))


def run(module, data):
    recorder = Recorder()
    pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, num_sanity_val_steps=0, callbacks=[recorder]).fit(module, datamodule=data)
    return recorder.rounds


def corrupt_rows(module, values):
    """Client updates of every round arrive with row i replaced by ``values[i]`` (NaN, inf, 0)."""
    train = module.train_clients

    def corrupted(round_index, shards):
        updates = train(round_index, shards)
        for row, value in enumerate(values):
            updates[row] = value
        return updates

    module.train_clients = corrupted


def finite_model(module):
    return all(torch.isfinite(p).all() for p in module.parameters())


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_non_finite_updates_are_left_out_zero_updates_kept_and_both_counted(name):
    data = data_for(num_clients=8)
    module = make(name, data)
    corrupt_rows(module, [float("nan"), float("-inf"), 0.0])
    rounds = run(module, data)
    assert [r["clients_nonfinite"] for r in rounds] == [2.0, 2.0]
    assert [r["clients_zero_update"] for r in rounds] == [1.0, 1.0]  # nothing divides by its norm
    assert all(r["clients_aggregated"] == r["clients_answered"] - 2 for r in rounds)
    assert all(torch.isfinite(torch.tensor(r["server_step_norm"])) for r in rounds)
    assert finite_model(module)


def test_every_update_zero_keeps_the_model_finite():
    for name in ("FedMGDAPlus", "FedFV", "FedLF", "QFedAvg", "FedMDFG"):
        data = data_for()
        module = make(name, data)
        train = module.train_clients
        module.train_clients = lambda t, shards, train=train: train(t, shards).zero_()
        before = [p.detach().clone() for p in module.model.parameters()]
        rounds = run(module, data)
        assert [r["clients_zero_update"] for r in rounds] == [r["clients_aggregated"] for r in rounds]
        assert all(torch.equal(a, b) for a, b in zip(before, module.model.parameters())), name


def test_dropped_clients_are_left_out_and_the_algorithm_sees_the_answered_set():
    data = data_for(num_clients=10)
    module = make("FedFV", data, fraction=1.0, dropout_prob=0.5, num_rounds=4, tau=1)
    seen = []
    aggregate = module.aggregate

    def recording(payload):
        seen.append(payload.clients.tolist())
        return aggregate(payload)

    module.aggregate = recording
    rounds = run(module, data)
    for t, (clients, logged) in enumerate(zip(seen, rounds)):
        expected = module.round_engine.drop_clients(t, torch.arange(10)).tolist()
        assert clients == expected  # FedFV's projection order is over the answered set
        assert logged["clients_answered"] == len(expected) < logged["clients_sampled"] == 10
    assert (module.last_seen >= 0).sum() == len(set().union(*map(set, seen)))


def test_a_round_where_nobody_answers_keeps_the_model_and_is_logged():
    data = data_for(num_clients=2)
    module = make("FedAvg", data, fraction=1.0, dropout_prob=0.9, num_rounds=6)
    nobody = [t for t in range(6) if len(module.round_engine.drop_clients(t, torch.arange(2))) == 0]
    assert nobody, "the seed must give at least one empty round"
    rounds = run(module, data)
    for t in nobody:
        assert rounds[t]["clients_aggregated"] == 0.0 and rounds[t]["clients_answered"] == 0.0
    assert module.global_step == 6 - len(nobody)  # server steps applied only when someone answered


def test_a_failing_qp_solver_falls_back_is_counted_and_the_run_goes_on(monkeypatch):
    import cvxopt.solvers

    def broken(*args, **kwargs):
        raise ArithmeticError("singular KKT matrix")

    monkeypatch.setattr(cvxopt.solvers, "qp", broken)
    for name, solver in (("FedMGDAPlus", {}), ("FedLF", {"qp_solver": "cvxopt"}), ("FedMDFG", {})):
        data = data_for()
        module = make(name, data, **solver)
        with pytest.warns(RuntimeWarning, match="falling back"):
            rounds = run(module, data)
        assert rounds[-1]["qp_fallbacks_total"] >= 2, name
        assert finite_model(module)


# ------------------------------------------------------------------------------- attacks
def test_the_attacker_takes_part_in_every_round():
    data = data_for(num_clients=10)
    module = make("FedAvg", data, fraction=0.2, num_rounds=5, attack="bias", attack_client=7)
    seen = []
    aggregate = module.aggregate
    module.aggregate = lambda payload: seen.append(payload.clients.tolist()) or aggregate(payload)
    run(module, data)
    assert all(7 in clients for clients in seen) and len(seen) == 5


def final_parameters(name, attack=None, strength=10.0, **kwargs):
    data = data_for(num_clients=6)
    module = make(name, data, num_rounds=3, attack=attack, attack_client=2, attack_strength=strength, **kwargs)
    run(module, data)
    return torch.cat([p.detach().flatten() for p in module.model.parameters()])


def test_fedmgda_plus_ignores_a_bias_attack_and_fedavg_too():
    """Eq. (19) and Sec. 6.2.2: MGDA's weights do not depend on the reported losses."""
    for name in ("FedMGDAPlus", "FedAvg"):
        assert torch.equal(final_parameters(name, "bias", 1e4), final_parameters(name, "bias", 0.0)), name


def test_loss_driven_algorithms_follow_a_bias_attack():
    # (FedFV reads losses only to order its projections: with no conflicts there is no
    # projection to reorder, so a bias attack may leave it unchanged on IID clients)
    for name, kwargs in (("QFedAvg", {"q": 1.0}), ("AFL", {})):
        calm = final_parameters(name, "bias", 0.0, **kwargs)
        attacked = final_parameters(name, "bias", 100.0, **kwargs)
        assert not torch.allclose(calm, attacked, atol=1e-6), name


def test_normalisation_makes_fedmgda_plus_robust_to_a_scaling_attack_but_not_fedavg():
    calm = final_parameters("FedMGDAPlus", "scaling", 1.0)
    scaled = final_parameters("FedMGDAPlus", "scaling", 50.0)
    assert torch.allclose(calm, scaled, atol=1e-5)
    fedavg_calm = final_parameters("FedAvg", "scaling", 1.0)
    fedavg_scaled = final_parameters("FedAvg", "scaling", 50.0)
    assert (fedavg_scaled - fedavg_calm).norm() > 10 * (scaled - calm).norm() + 1e-3


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"attack": "sybil"}, "unknown attack 'sybil'; valid: null"),
    ({"attack": "scaling", "attack_strength": float("nan")}, "attack_strength must be finite"),
])
def test_attack_settings_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        FederatedModule(**kwargs)


def test_an_attacker_id_beyond_the_federation_is_refused_before_any_round():
    data = data_for(num_clients=4)
    module = make("FedAvg", data, attack="bias", attack_client=9)
    with pytest.raises(ValueError, match="attack_client 9 is not a client: there are 4"):
        run(module, data)
