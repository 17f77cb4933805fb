"""FederatedModule, FedAvg and FedProx through Lightning's Trainer, on the CPU."""

import lightning.pytorch as pl
import pytest
import torch

from fl_lightning.algorithms import FedAvg, FedProx
from fl_lightning.core.flat import model_vector
from fl_lightning.core.module import FederatedModule, RoundPayload
from fl_lightning.data.datamodule import FederatedDataModule
from tests.builders import fit


def digits_data(num_clients=10, **kwargs) -> FederatedDataModule:
    params = dict(source="digits", num_clients=num_clients, partition="iid", test_mode="local", local_test_fraction=0.2,
                  seed=0)
    params.update(kwargs)
    return FederatedDataModule(**params)


def module_for(data, cls=FedAvg, **kwargs):
    params = dict(backbone="fl_mlp", backbone_kwargs={"hidden_sizes": [16]}, num_classes=data.num_classes,
                  input_shape=data.input_shape, num_rounds=3, fraction=1.0, batch_size=16, lr=0.1, eval_every=1, seed=0)
    params.update(kwargs)
    return cls(**params)


class Recorder(pl.Callback):
    """Keeps what was logged at the end of every round."""

    def __init__(self):
        self.rounds = []

    def on_train_epoch_end(self, trainer, pl_module):
        self.rounds.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def test_fedavg_one_client_full_batch_is_centralised_gradient_descent():
    data = digits_data(num_clients=1, local_test_fraction=0.1)
    module = module_for(data, num_rounds=4, batch_size=None, lr=0.5)
    start = {n: p.detach().clone() for n, p in module.model.named_parameters()}
    fit(module, data)

    reference = module_for(data, num_rounds=4, batch_size=None, lr=0.5).model
    with torch.no_grad():
        for n, p in reference.named_parameters():
            p.copy_(start[n])
    n = int(data.train_sizes[0])
    rows = data.train_index[0, :n]
    x, y = data.train_x[rows], data.train_y[rows]
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    for _ in range(4):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(reference(x), y).backward()
        optimizer.step()
    for (name, ours), theirs in zip(module.model.named_parameters(), reference.parameters()):
        assert torch.allclose(ours, theirs, atol=1e-5), name


def test_fedprox_with_mu_zero_is_fedavg():
    data = digits_data()
    avg = module_for(data, fraction=0.5)
    prox = module_for(data, cls=FedProx, fraction=0.5, mu=0.0)
    fit(avg, data)
    fit(prox, data)
    # FedAvg's plain cross-entropy trains with hand-derived gradients (core.fused), FedProx's
    # objective through autograd: the same arithmetic, rounded differently
    torch.testing.assert_close(avg.round_engine.global_vector(), prox.round_engine.global_vector(), rtol=0, atol=1e-5)


def test_fedprox_term_keeps_clients_closer_to_the_global_model():
    data = digits_data()
    drift = {}
    for mu in (0.0, 10.0):
        module = module_for(data, cls=FedProx, mu=mu, num_rounds=1, local_epochs=3)
        fit(module, data)
        drift[mu] = module.trainer.callback_metrics["server_step_norm"].item()
    assert drift[10.0] < 0.7 * drift[0.0]


def test_vectorised_and_sequential_fits_agree():
    data = digits_data()
    vec = module_for(data, engine="vectorised", fraction=0.5, momentum=0.9, local_epochs=2)
    seq = module_for(data, engine="sequential", fraction=0.5, momentum=0.9, local_epochs=2)
    fit(vec, data)
    fit(seq, data)
    assert vec.round_engine.runner.engine_used == "vectorised" and seq.round_engine.runner.engine_used == "sequential"
    assert torch.allclose(vec.round_engine.global_vector(), seq.round_engine.global_vector(), atol=1e-5)


def test_rounds_are_exact_and_logged_per_round():
    data = digits_data()
    module = module_for(data, num_rounds=5, fraction=0.3, eval_every=2)
    recorder = Recorder()
    trainer = fit(module, data, callbacks=[recorder], max_epochs=1000)
    assert trainer.current_epoch == 5
    assert [r["round"] for r in recorder.rounds] == [1, 2, 3, 4, 5]
    assert all(r["clients_sampled"] == 3 for r in recorder.rounds)
    assert trainer.global_step == 5  # one server optimizer step per applied round


def test_sampling_and_dropout_are_deterministic_and_within_bounds():
    data = digits_data(num_clients=20)
    module = module_for(data, fraction=0.25, dropout_prob=0.5)
    module.attach_data(data)  # K comes from the data
    first = [module.sample_clients(module.round_context(t)) for t in range(10)]
    again = [module.sample_clients(module.round_context(t)) for t in range(10)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert all(len(s) == 5 and len(set(s.tolist())) == 5 for s in first)
    assert len({tuple(s.tolist()) for s in first}) > 1
    answered = [module.round_engine.drop_clients(t, first[t]) for t in range(10)]
    assert all(set(a.tolist()) <= set(s.tolist()) for a, s in zip(answered, first))
    total = sum(len(a) for a in answered)
    assert 10 <= total <= 40  # about half of 50


def test_client_with_nan_data_is_left_out_and_model_stays_finite():
    data = digits_data()
    data.setup("fit")
    bad_rows = data.train_index[3, : int(data.train_sizes[3])]
    data.train_x[bad_rows] = float("nan")
    module = module_for(data, num_rounds=2)
    recorder = Recorder()
    fit(module, data, callbacks=[recorder])
    assert [r["clients_nonfinite"] for r in recorder.rounds] == [1.0, 1.0]
    assert [r["clients_aggregated"] for r in recorder.rounds] == [9.0, 9.0]
    assert torch.isfinite(model_vector(module.model, module.round_engine.layout)).all()


class BrokenServer(FedAvg):
    def aggregate(self, payload: RoundPayload) -> torch.Tensor:
        return torch.full_like(payload.updates[0], float("inf"))


def test_non_finite_server_step_is_refused():
    data = digits_data()
    module = module_for(data, cls=BrokenServer, num_rounds=2)
    before = model_vector(module.model, module.round_engine.layout).clone()
    fit(module, data)
    assert torch.equal(model_vector(module.model, module.round_engine.layout), before)


def test_round_where_nobody_answers_keeps_the_model():
    data = digits_data(num_clients=2)
    module = module_for(data, dropout_prob=0.999, num_rounds=2)
    before = model_vector(module.model, module.round_engine.layout).clone()
    recorder = Recorder()
    fit(module, data, callbacks=[recorder])
    assert all(r["clients_answered"] == 0 for r in recorder.rounds)
    assert torch.equal(model_vector(module.model, module.round_engine.layout), before)


def test_evaluation_summarises_every_client():
    data = digits_data()
    module = module_for(data, num_rounds=2)
    trainer = fit(module, data)
    metrics = trainer.callback_metrics
    accs = torch.tensor(module.last_client_metrics["test_accuracy"])
    assert len(accs) == 10
    assert metrics["test_acc_mean"].item() == pytest.approx(accs.mean().item(), abs=1e-6)
    assert metrics["test_acc_min"].item() == pytest.approx(accs.min().item(), abs=1e-6)
    assert metrics["test_acc_mean"].item() > 0.3  # 2 rounds of full participation learn the digits


def test_global_test_set_is_evaluated():
    data = digits_data(test_mode="global", global_test_fraction=0.2)
    module = module_for(data, num_rounds=2)
    trainer = fit(module, data)
    assert 0.0 < trainer.callback_metrics["global_test_acc"].item() <= 1.0


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(fraction=0.0), "fraction"),
        (dict(fraction=1.5), "fraction"),
        (dict(num_rounds=-1), "num_rounds"),
        (dict(batch_size=0), "batch_size"),
        (dict(dropout_prob=1.0), "dropout_prob"),
        (dict(engine="warp"), "engine"),
        (dict(backbone="resnet9000"), "fl_mlp"),
    ],
)
def test_bad_config_values_fail_at_construction(bad, message):
    with pytest.raises(ValueError, match=message):
        FedAvg(**bad)


def test_mismatched_data_and_model_are_refused():
    data = digits_data()
    module = FedAvg(backbone="fl_mlp", num_classes=10, input_shape=(1, 28, 28))
    with pytest.raises(ValueError, match="input_shape"):
        fit(module, data)


def test_base_module_needs_an_aggregate():
    data = digits_data()
    module = FederatedModule(backbone="fl_logreg", num_classes=10, input_shape=data.input_shape, num_rounds=1)
    with pytest.raises(NotImplementedError, match="aggregate"):
        fit(module, data)


def test_finite_rows_flags_exactly_the_rows_with_nan_or_inf():
    from fl_lightning.core.module import finite_rows

    updates = torch.randn(5, 7)
    updates[1, 3] = float("nan")
    updates[3, 0] = float("-inf")
    updates[4] = 3e38  # finite entries whose sum overflows: still a finite row
    assert finite_rows(updates).tolist() == [True, False, True, False, True]


def test_the_clients_sampled_follow_the_run_seed():
    """Different seeds pick different clients (a sampler that ignored the seed, e.g. a hard-coded
    0, would repeat one sequence for every seed), and one seed repeats itself."""
    data = digits_data(num_clients=100)
    picks = {}
    for seed in (0, 1, 2):
        module = module_for(data, seed=seed, fraction=0.1)
        module.attach_data(data)
        picks[seed] = [tuple(module.sample_clients(module.round_context(t)).tolist()) for t in range(5)]
        assert all(len(p) == 10 for p in picks[seed])
        again = module_for(data, seed=seed, fraction=0.1)
        again.attach_data(data)
        assert [tuple(again.sample_clients(again.round_context(t)).tolist()) for t in range(5)] == picks[seed]
    assert picks[0] != picks[1] != picks[2] != picks[0]
    assert all(len({picks[s][t] for s in picks}) == 3 for t in range(5))  # every round, three different sets
