"""``conflicts_layer`` (core.diagnostics.ConflictCounts): FedLF Table 4's layer-level conflict
count, LC_1 + ... + LC_L of a round, with one layer per module (Pan et al., AAAI 2024, App. B.2.1).

A layer l of online client i conflicts with the applied server step s (the server moves by −s,
the paper's d = −s) when g_{i,l} · s_l < 0; a zero inner product is no conflict."""

from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from fl_lightning.algorithms import FedAvg, FedLF
from fl_lightning.core.diagnostics import ConflictCounts, paper_layer_slices
from fl_lightning.core.flat import ParameterLayout, layer_slices
from fl_lightning.core.payload import RoundOutcome
from fl_lightning.data.datamodule import FederatedDataModule
from tests import builders


# ------------------------------------------------------------------ hand-made rounds
def two_layer_module(grouping):
    """Two modules with a weight and a bias each: the paper's "two layers, two parameters in
    each layer" (App. A.1), flat order (0.weight, 0.bias, 1.weight, 1.bias)."""
    model = nn.Sequential(nn.Linear(1, 1), nn.Linear(1, 1))
    layout = ParameterLayout.of(model)
    logged = []
    slices = layer_slices(model, layout, grouping)
    context = SimpleNamespace(layout=layout, layer_slices=tuple(slices), layer_names=tuple(map(str, slices)))
    module = SimpleNamespace(model=model, context=context, log_round=logged.append)
    return module, logged


def round_metrics(updates, step, grouping="tensor"):
    module, logged = two_layer_module(grouping)
    payload = SimpleNamespace(updates=torch.tensor(updates), context=module.context)
    outcome = RoundOutcome(0, evaluates=False, payload=payload, direction=torch.tensor(step))
    ConflictCounts().on_train_batch_end(None, module, {"outcome": outcome}, None, 0)
    assert len(logged) == 1
    return logged[0]


def test_the_paper_layers_are_modules():
    module, _ = two_layer_module("tensor")
    assert paper_layer_slices(module.model, module.context.layout) == [slice(0, 2), slice(2, 4)]
    assert module.context.layer_slices == (slice(0, 1), slice(1, 2), slice(2, 3), slice(3, 4))


@pytest.mark.parametrize("grouping", ["tensor", "module"])
def test_two_layer_example_of_a1_conflicts_at_client_1_layer_2_only(grouping):
    # App. A.1: g1 = (.1,.1,.2,-.1), g2 = (-.1,.2,-.1,.4); d = −(g1+g2)/2 = (0,−.15,−.05,−.15) is a
    # common descent direction but conflicts with g_{1,2}: d_2 · g_{1,2} = .005 > 0.
    g = [[0.1, 0.1, 0.2, -0.1], [-0.1, 0.2, -0.1, 0.4]]
    step = torch.tensor(g).mean(0).tolist()  # s = −d
    metrics = round_metrics(g, step, grouping)
    assert metrics["conflicts_model"] == 0
    assert metrics["conflicts_layer"] == 1  # (client 1, layer 2), whatever the aggregation's grouping
    if grouping == "tensor":
        # per tensor: client 2 at 1.weight (−.1·.05) and client 1 at 1.bias (−.1·.15), 0.weight's s is 0
        assert metrics["conflicts_layer_mean"] * 4 == 2 and metrics["conflicts_layer_max"] == 1
    else:
        assert metrics["conflicts_layer_mean"] * 2 == 1


def test_counts_client_layer_pairs_not_clients():
    g = [[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]]
    # client 1 conflicts at both layers, client 2 at none: 2 pairs (1 client)
    metrics = round_metrics(g, [-1.0, 1.0, -1.0, 1.0])
    assert (metrics["conflicts_model"], metrics["conflicts_layer"]) == (1, 2)
    # one layer each: 2 pairs, and no model-level conflict (g1·s = g2·s = 0)
    metrics = round_metrics(g, [-1.0, 1.0, 1.0, -1.0])
    assert (metrics["conflicts_model"], metrics["conflicts_layer"]) == (0, 2)
    # every layer of both clients
    metrics = round_metrics(g, [-1.0, -1.0, -1.0, -1.0])
    assert (metrics["conflicts_model"], metrics["conflicts_layer"]) == (2, 4)


def test_a_zero_inner_product_is_no_conflict():
    g = [[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]]
    metrics = round_metrics(g, [1.0, 1.0, 0.0, 0.0])  # d_2 = 0 (a Pareto-stationary layer)
    assert (metrics["conflicts_model"], metrics["conflicts_layer"]) == (0, 0)
    metrics = round_metrics(g, [0.0, 1.0, 0.0, -2.0])  # g1 ⟂ s at both layers; g2 conflicts at layer 2
    assert (metrics["conflicts_model"], metrics["conflicts_layer"]) == (1, 1)


def test_no_applied_step_logs_nothing():
    module, logged = two_layer_module("tensor")
    ConflictCounts().on_train_batch_end(None, module, {"payload": None, "server_step": None}, None, 0)
    ConflictCounts().on_train_batch_end(None, module, {}, None, 0)
    assert logged == []


# ------------------------------------------------------------------ federated fits
from tests.call_logger import CallLogger  # noqa: E402  (records every log_metrics call)

ROUNDS = 4
CLIENTS = 10


@pytest.fixture(scope="module")
def data():
    # the paper's Pat-1 (Table 4's first half): one class per client, digits' 10 classes over 10 clients
    return FederatedDataModule(source="digits", num_clients=CLIENTS, partition="pathological",
                               partition_params={"classes_per_client": 1}, test_mode="local",
                               local_test_fraction=0.2, seed=0)


class Groups(pl.Callback):
    """FedLF's final layer groups of every round (its step's ``details["groups"]``)."""

    def __init__(self):
        self.rounds = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rounds.append(outputs["outcome"].details["groups"])


def fit_rounds(cls, data, callbacks=(), **kwargs):
    """The per-round logger calls of a short full-participation fit: (module, [metrics])."""
    params = dict(backbone="fl_mlp", backbone_kwargs={"hidden_sizes": [16]}, num_classes=data.num_classes,
                  input_shape=data.input_shape, num_rounds=ROUNDS, fraction=1.0, batch_size=16, lr=0.1,
                  seed=0, eval_every=ROUNDS)
    logger = CallLogger()
    trainer = builders.trainer(logger=logger, callbacks=list(callbacks))
    module = cls(**(params | kwargs))
    trainer.fit(module, datamodule=data)
    rounds = [(step, metrics) for step, metrics in logger.calls if "conflicts_model" in metrics]
    # the same call, and so the same step, as conflicts_model: step = rounds completed
    assert [step for step, _ in rounds] == list(range(1, ROUNDS + 1))
    assert all(metrics["round"] == step for step, metrics in rounds)
    for _, metrics in rounds:
        # a model-level conflict (Σ_l g_l·s_l < 0) has at least one conflicting layer;
        # fl_mlp's two layers: features.1 (64→16) and fc (16→10)
        assert metrics["conflicts_model"] <= metrics["conflicts_layer"] <= CLIENTS * 2
    return module, [metrics for _, metrics in rounds]


@pytest.mark.parametrize("grouping", ["module", "tensor"])
def test_fedlf_conflicts_with_no_layer_of_any_online_client(data, grouping):
    groups = Groups()
    module, rounds = fit_rounds(FedLF, data, callbacks=[groups], layer_grouping=grouping)
    paper = paper_layer_slices(module.model, module.round_engine.layout)
    # The per-layer QP gives g_{i,l}·d_l < 0 at every group it solved with d_l ≠ 0 (App. A.1,
    # eq. (5)); Combine Layers merges a group whose d_l is 0 with its neighbour. Every final group
    # here is non-zero and inside one module (per tensor: fc.bias, 10 one-class clients, is
    # stationary and joins fc.weight), so no (client, layer) pair can conflict: Table 4's FedLF row.
    for round_groups in groups.rounds:
        for group, zero in round_groups:
            first, last = module.round_engine.layer_slices[group[0]], module.round_engine.layer_slices[group[-1]]
            assert not zero and any(p.start <= first.start and last.stop <= p.stop for p in paper), group
    assert [r["conflicts_model"] for r in rounds] == [0.0] * ROUNDS
    assert [r["conflicts_layer"] for r in rounds] == [0.0] * ROUNDS
    if grouping == "module":
        assert [r["fedlf_layers_merged"] for r in rounds] == [0.0] * ROUNDS
        assert [r["conflicts_layer_mean"] for r in rounds] == [0.0] * ROUNDS
    else:  # the merged tensors may conflict one by one, never their module as a whole
        assert all(r["fedlf_layers_merged"] == 2 for r in rounds)


def test_fedavg_conflicts_at_layer_level_on_pat1_whatever_the_grouping(data):
    _, by_tensor = fit_rounds(FedAvg, data, layer_grouping="tensor")
    _, by_module = fit_rounds(FedAvg, data, layer_grouping="module")
    # Table 4, CIFAR-10 Pat-1: averaging conflicts with clients' layers (FedAvg LC_l 2.3 .. 3.4)
    assert sum(r["conflicts_layer"] for r in by_tensor) > 0
    # Table 4's layers are modules whatever the aggregation's layer_grouping: comparable across runs
    assert [r["conflicts_layer"] for r in by_tensor] == [r["conflicts_layer"] for r in by_module]
