"""Issue 23, the contract is a test: every registered algorithm keeps the docs' "Writing an
algorithm" contract.

- ``aggregate(payload)`` changes no state and logs nothing: run inside a real fit, every
  round's ``aggregate`` is called twice on the round's payload; the two steps are the same
  (direction, new state, metrics, QP fallbacks, details), and nothing changed: no parameter or
  buffer (bit for bit), no attribute of the module (by value, tensors bit for bit), not the
  payload, not the global random generators, and no log call was made.
- An algorithm overrides only the documented hooks of ``FederatedModule``; an engine method
  overridden anyway must be listed, with why, in ``KNOWN_EXCEPTIONS`` (none today), so a new
  one fails here.
- One door (issue 35): an algorithm reads the engine only through its ``RoundContext``; no
  algorithm file reads an attribute of the engine through ``self`` (a scan of their source).
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import random
import types
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch

from fl_lightning.algorithms import ALGORITHMS
from fl_lightning.core.module import FederatedModule
from fl_lightning.core.payload import RoundPayload, as_server_step
from fl_lightning.data.datamodule import FederatedDataModule
from tests.fl_lightning.algorithms.test_all_algorithms import FULL_PARTICIPATION

pytestmark = pytest.mark.usefixtures("one_thread")

# The docs' "Writing an algorithm" contract: what a subclass may define.
DOCUMENTED_HOOKS = {
    "__init__",  # validate and save the hyper-parameters, declare per-client state
    "aggregate",  # the server step, as a ServerStep (or a tensor)
    "on_round_end",  # bookkeeping after an applied step
    "client_objective",  # the clients' local loss
    "train_clients",  # what clients upload
    "evaluation_params",  # what is evaluated
    "sample_clients",  # who is asked
    "training_samples",  # which samples clients train on (CFFL, ECI: all but the server's V)
    "evaluation_metrics",  # what every evaluation adds (CGSV: its ρ_r and ρ)
    "history_rows_to_keep",  # the history rows a checkpoint holds (FedFV: its window)
}

# Declared requirements: class attributes an algorithm sets to tell the engine what it needs.
DECLARED_REQUIREMENTS = {
    "needs_every_client",  # AFL: fraction < 1 is refused when the module is built
    "reads_training_losses",  # every round computes the losses before training (payload.training_losses())
}

# Engine methods some algorithms override today, each with why; each is to become a declared
# hook or requirement (another step of issue 23), and then leaves this list.
# Keyed "<defining class>.<method>". Empty: CFFL's and ECI's training shards, CGSV's evaluation
# metrics and FedFV's checkpoint compaction are hooks now.
KNOWN_EXCEPTIONS: dict[str, str] = {}

# Names a class body defines for itself (not overrides of an engine method).
CLASS_BOOKKEEPING = {
    "__module__", "__qualname__", "__doc__", "__annotations__", "__dict__", "__weakref__",
    "__firstlineno__", "__static_attributes__", "__orig_bases__", "__parameters__",
    "__abstractmethods__", "_abc_impl",
}

# Attributes of the module that are not the algorithm's state and are left out of the
# by-value comparison (each with why):
NOT_COMPARED = {
    # Lightning's reference to the Trainer: the Trainer's own loop state (progress counters,
    # logged-metric views, the data module's tensors) is the loop's, not the algorithm's; what
    # aggregate could log there is caught by the patched log methods and by ``round_log``,
    # which is compared.
    "_trainer",
    # the sample positions of the last clients evaluated: a cache, rebuilt whenever the clients
    # differ (``KeptPositions.of`` compares them), so it changes no answer
    "_kept_positions",
}

LOG_METHODS = ("log", "log_dict", "log_round")

# Settings whose state only they use (as tests/fl_lightning/core/test_resume.py's variants).
VARIANTS = {
    "FedFV-external": ("FedFV", {"tau": 1, "order": "random"}),
    "CGSV-standalone": ("CGSV", {"track_standalone": True}),
    "FedLF-full_batch-cvxopt": ("FedLF", {"gradient": "full_batch", "qp_solver": "cvxopt"}),
    "FedMDFG-full_batch-larger": ("FedMDFG", {"gradient": "full_batch", "larger_steps": True}),
}
CASES = {name: (name, {}) for name in ALGORITHMS} | VARIANTS
NUM_ROUNDS = 3


# ----------------------------------------------------------------- values, compared exactly
def frozen(value: Any, path: tuple[int, ...] = ()) -> Any:
    """A comparable copy of ``value``: tensors as (dtype, shape, device, their bytes), floats by
    their bits, containers and objects (their ``vars``) recursively; functions, classes and
    other opaque objects by identity."""
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous().reshape(-1)
        raw = data.view(torch.uint8) if data.dtype != torch.bool else data.to(torch.uint8)
        return ("tensor", str(value.dtype), tuple(value.shape), str(value.device), raw.numpy().tobytes())
    if isinstance(value, float):
        return ("float", value.hex())
    if value is None or isinstance(value, (bool, int, str, bytes, enum.Enum, torch.dtype, torch.device)):
        return value
    if isinstance(value, np.ndarray):
        return ("ndarray", str(value.dtype), value.shape, value.tobytes())
    if isinstance(value, (types.FunctionType, types.MethodType, types.BuiltinFunctionType, type,
                          types.ModuleType)) or id(value) in path:
        return ("ref", id(value))
    inner = (*path, id(value))
    if isinstance(value, dict):
        return (type(value).__name__, tuple((frozen(k, inner), frozen(v, inner)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(frozen(v, inner) for v in value))
    if isinstance(value, (set, frozenset)):
        return (type(value).__name__, tuple(sorted(repr(frozen(v, inner)) for v in value)))
    if hasattr(value, "__dict__"):
        return (type(value).__qualname__, frozen(vars(value), inner))
    return ("ref", id(value))


def module_attributes(module: FederatedModule) -> dict[str, Any]:
    return {name: frozen(value) for name, value in vars(module).items() if name not in NOT_COMPARED}


def registered_state(module: FederatedModule) -> dict[str, Any]:
    """Every parameter and buffer (persistent or not) and the checkpointed state dict."""
    tensors = dict(module.named_parameters()) | dict(module.named_buffers())
    return {"tensors": frozen(tensors), "state_dict": frozen(module.state_dict())}


def global_generators() -> Any:
    return frozen({"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "random": random.getstate()})


def step_fields(step: Any) -> dict[str, Any]:
    server_step = as_server_step(step)
    return {field.name: frozen(getattr(server_step, field.name)) for field in dataclasses.fields(server_step)}


def changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


# ------------------------------------------------------------------ aggregate, checked in a fit
def check_every_aggregate(module: FederatedModule) -> list[int]:
    """From now on each call of ``module.aggregate`` runs the algorithm's twice and checks both;
    returns the list of rounds checked so far."""
    aggregate, rounds = module.aggregate, []

    def checked(payload: RoundPayload) -> Any:
        attributes, state = module_attributes(module), registered_state(module)
        generators, uploads = global_generators(), frozen(vars(payload))
        logged: list[tuple[str, Any]] = []
        for name in LOG_METHODS:
            setattr(module, name, lambda *args, name=name, **kwargs: logged.append((name, args)))
        try:
            first = aggregate(payload)
            second = aggregate(payload)
        finally:
            for name in LOG_METHODS:
                delattr(module, name)
        where = f"{type(module).__name__}.aggregate, round {payload.round}"
        assert not logged, f"{where} logged {logged}: return metrics in ServerStep.metrics"
        assert step_fields(first) == step_fields(second), (
            f"{where}: two calls gave different steps in {changed(step_fields(first), step_fields(second))}")
        assert registered_state(module) == state, f"{where} changed parameters or buffers"
        assert not changed(attributes, module_attributes(module)), (
            f"{where} changed attributes {changed(attributes, module_attributes(module))}: "
            "new state goes in ServerStep.new_state, bookkeeping in on_round_end")
        assert frozen(vars(payload)) == uploads, f"{where} changed the payload"
        assert global_generators() == generators, f"{where} drew from a global random generator"
        rounds.append(payload.round)
        return first

    module.aggregate = checked  # an instance attribute from here on, the same before and after each call
    return rounds


def make_run(case: str) -> tuple[FederatedModule, FederatedDataModule]:
    name, extra = CASES[case]
    data = FederatedDataModule(source="digits", num_clients=8, partition="dirichlet",
                               partition_params={"alpha": 0.5, "min_size": 10}, test_mode="local",
                               local_test_fraction=0.2, seed=3)
    module = ALGORITHMS[name](
        backbone="fl_logreg", num_classes=data.num_classes, input_shape=data.input_shape, num_rounds=NUM_ROUNDS,
        eval_every=NUM_ROUNDS, fraction=1.0 if name in FULL_PARTICIPATION else 0.5, dropout_prob=0.2,
        batch_size=16, lr=0.05, momentum=0.5, seed=3, **extra,
    )
    return module, data


@pytest.mark.parametrize("case", sorted(CASES))
def test_aggregate_changes_nothing_logs_nothing_and_gives_the_same_step_twice(case):
    module, data = make_run(case)
    checked = check_every_aggregate(module)
    pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
               enable_model_summary=False, num_sanity_val_steps=0).fit(module, datamodule=data)
    assert len(checked) >= NUM_ROUNDS - 1, checked  # dropout may leave a round without clients


# ------------------------------------------------------------------------- documented hooks
def engine_overrides(algorithm: type) -> set[str]:
    """``<class>.<name>`` for every name a class between ``algorithm`` and ``FederatedModule``
    defines that ``FederatedModule`` (or what it inherits) also has."""
    overrides = set()
    for cls in algorithm.__mro__:
        if cls is FederatedModule:
            break
        overrides |= {f"{cls.__name__}.{name}" for name in vars(cls)
                      if name not in CLASS_BOOKKEEPING and hasattr(FederatedModule, name)}
    return overrides


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_only_documented_hooks_are_overridden(name):
    allowed = DOCUMENTED_HOOKS | DECLARED_REQUIREMENTS
    undocumented = {o for o in engine_overrides(ALGORITHMS[name]) if o.split(".", 1)[1] not in allowed}
    new = undocumented - KNOWN_EXCEPTIONS.keys()
    assert not new, (f"{name} overrides engine methods {sorted(new)}: use the documented hooks "
                     f"({sorted(DOCUMENTED_HOOKS)}), or declare a new hook in FederatedModule")


def test_every_known_exception_still_exists():
    """A known exception that no algorithm has any more leaves the list (it only shrinks)."""
    found = set().union(*(engine_overrides(cls) for cls in ALGORITHMS.values()))
    assert KNOWN_EXCEPTIONS.keys() <= found, sorted(KNOWN_EXCEPTIONS.keys() - found)


def test_the_engine_asks_the_training_samples_and_evaluation_metrics_hooks():
    """``training_samples`` cuts every round's training shards (asked once per data tensors),
    ``evaluation_metrics`` joins every evaluation, and a name the evaluation logs is refused."""
    from fl_lightning.algorithms import FedAvg

    asked = []

    class Probe(FedAvg):
        added = {"probe_metric": 1.0}

        def training_samples(self, data):
            asked.append(data.train_index)
            return data.train_index[:, :1], data.train_sizes.clamp(max=1)  # every client's first sample

        def evaluation_metrics(self, context, client_metrics):
            return dict(self.added, probe_clients=float(len(client_metrics["test_accuracy"])))

    _, data = make_run("FedAvg")
    data.setup("fit")
    probe = Probe(backbone="fl_logreg", num_classes=data.num_classes, input_shape=data.input_shape, seed=3)
    probe.attach_data(data)
    for _ in range(2):
        shards = probe.client_shards(torch.tensor([1, 4]))
        assert shards.sizes_cpu == [1, 1] and torch.equal(shards.index, data.train_index[[1, 4], :1])
    assert len(asked) == 1
    metrics = probe.evaluate_all_clients()
    assert metrics["probe_metric"] == 1.0 and metrics["probe_clients"] == 8.0 and "test_acc_mean" in metrics
    probe.added = {"test_acc_mean": 0.0}
    with pytest.raises(ValueError, match="evaluation_metrics adds"):
        probe.evaluate_all_clients()


# ------------------------------------------------------------------------- defaults on the CLI
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_the_command_line_builds_an_algorithm_with_its_own_defaults(name):
    """LightningCLI passes every base setting it parsed, defaults included, so an algorithm whose
    default for a base setting differs (AFL's fraction 1.0, FedFa's client momentum γ, FedMGDA+'s
    improvement tracking) must declare it in its signature: ``kwargs.setdefault`` never fires
    there. Built from the parser's defaults, the module has the hyper-parameters of ``cls()``."""
    from jsonargparse import ArgumentParser

    cls = ALGORITHMS[name]
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, "model")
    parsed = parser.parse_args([])
    from_parser = cls(**dict(parsed.model))
    direct = cls()
    assert dict(from_parser.hparams) == dict(direct.hparams)


# ------------------------------------------------------------------------- the round context
# What an algorithm may read of its own module besides the hooks: Lightning's (hparams, device,
# print, the model it trains) and the state API of ``register_client_state``.
ALGORITHM_API = DOCUMENTED_HOOKS | DECLARED_REQUIREMENTS | {
    "hparams", "save_hyperparameters", "model", "num_parameters",
    "register_client_state", "register_client_history", "history_rows", "store_history",
}
ALGORITHMS_DIR = Path(inspect.getfile(FederatedModule)).parents[1] / "algorithms"


def engine_names() -> set[str]:
    """Every attribute the engine gives a module that is not the algorithm API: what
    ``FederatedModule`` and its mixins define, what its ``__init__`` sets, and Lightning's logging."""
    engine_classes = FederatedModule.__mro__[:FederatedModule.__mro__.index(pl.LightningModule)]
    defined = {n for cls in engine_classes for n in vars(cls) if not n.startswith("__")}
    bare = set(vars(pl.LightningModule()))
    built = set(vars(ALGORITHMS["FedAvg"](backbone="fl_logreg", num_classes=10, input_shape=(1, 8, 8))))
    return (defined | (built - bare) | set(LOG_METHODS)) - ALGORITHM_API


def engine_reads(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every ``self.<name>`` in ``source`` that names an engine attribute."""
    return [(node.lineno, node.attr) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
            and node.attr in names]


def test_the_engine_scan_finds_a_planted_read():
    names = engine_names()
    assert {"round_engine", "federated_data", "client_shards", "attacker", "log_round", "round_context"} <= names
    planted = ("class A:\n    def aggregate(self, payload):\n"
               "        return self.round_engine.global_vector() + self.log_round({})\n")
    assert sorted(engine_reads(planted, names)) == [(3, "log_round"), (3, "round_engine")]


@pytest.mark.parametrize("path", sorted(ALGORITHMS_DIR.rglob("*.py")), ids=lambda p: p.name)
def test_an_algorithm_reads_the_engine_only_through_its_context(path):
    """One door: an algorithm file reads the round (layout, w, local training, K, lr, the
    evaluator, the data) from its ``RoundContext``, never from ``self``."""
    assert engine_reads(path.read_text(), engine_names()) == [], (
        f"{path.name} reads engine attributes through self: read them from the round's context")


def test_hooks_receive_a_read_only_round_context_also_on_a_payload_built_by_hand():
    """Issue 23: ``aggregate`` and ``on_round_end`` read the engine through ``payload.context``:
    the round's lr (lr · lr_decay^t), w, the layout, K; every field read-only; a payload built by
    hand gets its round's context from ``module.propose`` (issue 35: no wrapper around the hook,
    so calling ``aggregate`` itself on it says what to do)."""
    from fl_lightning.algorithms import FedAvg
    from fl_lightning.core.payload import RoundContext

    seen = {}

    class Probe(FedAvg):
        def aggregate(self, payload):
            seen["context"] = payload.context
            return super().aggregate(payload)

    _, data = make_run("FedAvg")
    probe = Probe(backbone="fl_logreg", num_classes=data.num_classes, input_shape=data.input_shape,
                  lr=0.2, lr_decay=0.5, seed=3)
    data.setup("fit")
    probe.attach_data(data)
    d, m = probe.num_parameters, 3
    hand_built = RoundPayload(round=2, clients=torch.arange(m), updates=torch.randn(m, d), losses=torch.ones(m),
                              accuracies=torch.zeros(m), num_samples=torch.full((m,), 10))
    probe.propose(hand_built)
    context = seen["context"]
    assert isinstance(context, RoundContext) and context.round == 2
    assert context.lr == pytest.approx(0.2 * 0.5**2)
    assert torch.equal(context.global_vector, probe.round_engine.global_vector())
    assert context.layout is probe.round_engine.layout and context.num_clients_total == 8
    with pytest.raises(AttributeError):
        context.lr = 1.0  # read-only
    # issue 50: the layer lists are handed out as tuples, so a hook cannot edit the engine's own
    slices, names = context.layer_slices, context.layer_names
    assert type(slices) is tuple and type(names) is tuple and len(slices) == len(names) > 0
    with pytest.raises(AttributeError):
        slices.append(slice(0, 1))  # type: ignore[attr-defined]
    assert context.layer_slices == slices
    with pytest.raises(RuntimeError, match="no context: call the hook through its module"):
        hand_built.context  # noqa: B018
    with pytest.raises(RuntimeError, match=r"module.propose\(payload\)"):
        probe.aggregate(hand_built)  # the hook itself, unwrapped: no context added in silence
    assert Probe.aggregate is vars(Probe)["aggregate"]  # a breakpoint in aggregate lands in aggregate
    trained = context.local_train(context.client_shards(torch.arange(2)))
    assert trained[probe.round_engine.layout.names[0]].shape[0] == 2  # one model per client, this round's lr


BARE_TYPES = {"float", "int", "bool", "float | None", "int | None", "Optional[float]", "Optional[int]"}  # no rule


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_setting_declared_again_keeps_a_rule(name):
    """A subclass that declares a base setting again with its own default (FedMGDA's ε = 1,
    MGDA-Prox's μ = 0.1, AFL's fraction 1.0) keeps a typed rule: a plain ``float`` there would let
    ``MGDAProx(mu=-1)`` build and train with a negative proximal weight."""
    import inspect

    cls = ALGORITHMS[name]
    own = inspect.signature(cls.__init__).parameters
    for base in cls.__mro__[1:]:
        if "__init__" not in vars(base) or not issubclass(base, FederatedModule):
            continue
        for setting, parameter in inspect.signature(vars(base)["__init__"]).parameters.items():
            if setting in own and parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD):
                ruled = parameter.annotation not in BARE_TYPES
                assert not ruled or own[setting].annotation not in BARE_TYPES, (
                    f"{name}.{setting}: {own[setting].annotation!r} has no rule, while {base.__name__} declares "
                    f"{parameter.annotation!r}")
