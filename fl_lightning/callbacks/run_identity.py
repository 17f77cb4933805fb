"""What a run is, in words a person and a leaderboard can compare.

* :func:`run_name`: ``FedFV seed 0 (tau=1) | mnist5k/dirichlet(alpha=0.5) | 1605-3fa2``: the
  algorithm and the seed first (and the data seed where it differs), because MLflow's runs list
  and chart legends show only the first ~22 characters of a name: there, what tells runs apart
  must come before the cut. Then the algorithm's settings, the data, and a short unique id (the
  time and 4 random hex digits).
* :func:`task_tags`: the tags that define the task a run solves (``task``, ``task_key``,
  ``client_test``, ...): runs with the same ``task_key`` are comparable, whatever the
  algorithm and the seed.
* :func:`dataset_input`: the federated split as an MLflow dataset input (the UI's Dataset
  column): its name says source, partition and clients, its digest which samples went where.
* :func:`loggable_hparams`: the model's and the data's hyper-parameters without LightningCLI's
  internal entries (``_instantiator``, ``_class_path``).
"""

from __future__ import annotations

import hashlib
import inspect
import os
import secrets
import time
from collections.abc import Mapping
from typing import Any, cast

import lightning.pytorch as pl
from mlflow.data.dataset_source import DatasetSource

from fl_lightning.core.simulation import participation_that_runs
from fl_lightning.data.source_registry import reads_files
from fl_lightning.records import vocabulary as schema
from fl_lightning.records.vocabulary import Tag, canonical, task_json, task_key
from fl_lightning.seeding import SEED_ENV, run_seed

TRAIN_CONTEXT = "train"  # the dataset input's context tag (mlflow.data.context)
NAME_SEPARATOR = " | "
# partitioner parameters that bound a search, not the split it finds: left out of dataset names
SEARCH_ONLY_PARAMS = frozenset({"max_tries"})
_MAX_RUN_NAME = 250  # MLflow stores run names of up to 250 characters


# --------------------------------------------------------------------------- values as text


def short_value(value: Any) -> str:
    """A hyper-parameter value as it reads in a name: ``0.1``, ``1e-05``, ``loss``, ``null``."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(short_value(v) for v in value) + "]"
    return str(value)


def call_text(name: str, params: Mapping[str, Any]) -> str:
    """``name(k=v,...)`` for the parameters that have a value, or ``name`` alone."""
    given = {k: v for k, v in params.items() if v is not None}
    if not given:
        return name
    return f"{name}(" + ",".join(f"{k}={short_value(v)}" for k, v in given.items()) + ")"


# --------------------------------------------------------------------------- hyper-parameters


def loggable_hparams(pl_module: pl.LightningModule, datamodule: Any = None) -> dict[str, Any]:
    """The hyper-parameters a run logs: the module's and the data module's (which wins on a
    shared name, as in Lightning), the partition's with its defaults filled in, and none whose
    name starts with ``_`` (LightningCLI's ``_instantiator`` and ``_class_path``, which stay in
    the checkpoint for ``load_from_checkpoint``)."""
    hparams = dict(pl_module.hparams_initial)
    if datamodule is not None:
        hparams.update(getattr(datamodule, "hparams_initial", {}))
        if schema.PARTITION_PARAMS in hparams:
            hparams[schema.PARTITION_PARAMS] = partition_params(datamodule)
    return {k: v for k, v in hparams.items() if not str(k).startswith("_")}


def resolved_seed(hparams: Mapping[str, Any], *names: str) -> int | None:
    """The first of ``names`` that ``hparams`` holds a value for (the modules record the seed
    they used); else the run's ``seed_everything`` seed; else None."""
    for name in names:
        if hparams.get(name) is not None:
            return int(hparams[name])
    return run_seed(None) if SEED_ENV in os.environ else None


def model_seed(pl_module: pl.LightningModule) -> int | None:
    return resolved_seed(pl_module.hparams, schema.SEED)


def data_seed(datamodule: Any) -> int | None:
    if datamodule is None:
        return None
    return resolved_seed(getattr(datamodule, "hparams", {}), schema.DATA_SEED, schema.SEED)


# --------------------------------------------------------------------------- the algorithm


def algorithm_defaults(module_class: type) -> dict[str, Any]:
    """The algorithm's own hyper-parameters and their defaults: what the class and its
    parents below ``FederatedModule`` add to the shared settings (lr, fraction, ...)."""
    from fl_lightning.core.module import FederatedModule

    shared = set(inspect.signature(FederatedModule.__init__).parameters)
    defaults: dict[str, Any] = {}
    for cls in module_class.__mro__:
        if cls is FederatedModule or not issubclass(cls, FederatedModule):
            break
        for name, param in inspect.signature(cls.__init__).parameters.items():
            has_default = param.default is not inspect.Parameter.empty
            if has_default and name not in shared and name not in defaults:
                defaults[name] = param.default
    return defaults


# Settings every algorithm shares that change how a run computes without changing its task (the
# task holds the rounds, participation, batch size, local epochs, model and attack): two runs that
# differ in one of them are two configurations, never one (issue 33: FedAvg at lr 0.01 and 0.2).
# Left out: the seed (its own tag), when metrics are computed (eval_every), measurement switches
# (track_*), memory knobs that give the same bits (engine_memory_budget_gb, clients_per_chunk,
# history_device) and the thread count (it changes only the rounding of the products, like the
# seed changes only the draws: a logged param, resolved from "auto" to the cores a fit is given).
CONFIGURATION_SETTINGS = ("backbone_kwargs", "lr", "momentum", "weight_decay", "lr_decay", "engine",
                          "layer_grouping", "local_autocast", "history_dtype")


def shared_defaults(module_class: type) -> dict[str, Any]:
    """The defaults of ``CONFIGURATION_SETTINGS`` for ``module_class``: the nearest class's that
    declares one, else ``FederatedModule``'s. A class that turns a shared default into None derives
    the value from its own settings (FedFa's momentum = its gamma), which its label already shows:
    such a setting is left out."""
    from fl_lightning.core.module import FederatedModule

    base = inspect.signature(FederatedModule.__init__).parameters
    defaults: dict[str, Any] = {}
    for cls in module_class.__mro__:
        if "__init__" not in vars(cls):
            continue
        for name, param in inspect.signature(vars(cls)["__init__"]).parameters.items():
            if name in CONFIGURATION_SETTINGS and name not in defaults and param.default is not inspect.Parameter.empty:
                defaults[name] = param.default
    return {name: default for name, default in defaults.items() if default is not None or base[name].default is None}


def algorithm_config(pl_module: pl.LightningModule, logger_tags: Mapping[str, Any] | None = None) -> str:
    """``FedFV(alpha=0.2,lr=0.05,tau=1)``: the class with every setting that differs from its
    default and changes how the run computes: its own hyper-parameters (``track_*`` switches only
    add measurements) and the shared ``CONFIGURATION_SETTINGS`` (lr, momentum, ...); the
    benchmark runner's ``algorithm_config`` tag when it set one (a suite's label, whose shared
    settings are the suite's own)."""
    given = (logger_tags or {}).get(Tag.ALGORITHM_CONFIG)
    if given:
        return str(given)
    hparams = pl_module.hparams
    defaults = {name: default for name, default in algorithm_defaults(type(pl_module)).items()
                if not name.startswith("track_")} | shared_defaults(type(pl_module))
    changed = {name: hparams[name] for name, default in sorted(defaults.items())
               if name in hparams and hparams[name] != default and not (default is None and not hparams[name])}
    for name, source in getattr(type(pl_module), "derived_settings", {}).items():  # FedFa's momentum = gamma
        if name in hparams and source in hparams and hparams[name] != hparams[source]:
            changed[name] = hparams[name]
    return call_text(type(pl_module).__name__, dict(sorted(changed.items())))


# --------------------------------------------------------------------------- the data


def partition_params(datamodule: Any) -> dict[str, Any]:
    """The partition's parameters as the run used them: the partitioner's defaults filled in
    (``dirichlet``: alpha 0.5, min_size 10, ...)."""
    from fl_lightning.data.partition_registry import PARTITIONERS, resolved_partition_params

    params = getattr(datamodule, "partition_params", None)
    if params is None:
        params = datamodule.hparams.get(schema.PARTITION_PARAMS)
    partition = str(datamodule.hparams.get(schema.PARTITION, ""))
    if partition not in PARTITIONERS:
        return dict(params or {})
    return resolved_partition_params(partition, params or {})


def source_params(datamodule: Any) -> dict[str, Any]:
    params = getattr(datamodule, "source_params", None)
    if params is None:
        params = datamodule.hparams.get(schema.SOURCE_PARAMS)
    return dict(params or {})


def partition_defaults(partition: str) -> dict[str, Any]:
    """{parameter: default} of a registered partitioner (required ones map to ``Parameter.empty``)."""
    from fl_lightning.data.partition_registry import PARTITIONERS

    if partition not in PARTITIONERS:
        return {}
    params = list(inspect.signature(PARTITIONERS[partition]).parameters.values())[3:]  # labels, K, seed
    return {p.name: p.default for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD}


def key_partition_params(partition: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters that tell partitions apart at a glance: the partitioner's first (its
    main knob: Dirichlet's alpha, the shards count), the required ones and any other that
    differs from its default."""
    defaults = partition_defaults(partition)
    first = next(iter(defaults), None)
    return {
        name: value
        for name, value in params.items()
        if value is not None and (name == first or defaults.get(name, inspect.Parameter.empty) != value)
    }


def source_text(datamodule: Any) -> str:
    """``mnist5k``, ``emnist(split=letters)``: the source and its own parameters."""
    params = {k: v for k, v in source_params(datamodule).items() if k != schema.NUM_CLIENTS}
    return call_text(str(datamodule.hparams.get(schema.SOURCE, "")), params)


def data_text(datamodule: Any) -> str:
    """``mnist5k/dirichlet(alpha=0.5)``: the source and the partition with its key parameters."""
    partition = str(datamodule.hparams.get(schema.PARTITION, ""))
    key = key_partition_params(partition, partition_params(datamodule))
    return f"{source_text(datamodule)}/{call_text(partition, key)}"


def dataset_name(datamodule: Any) -> str:
    """``mnist5k/dirichlet(alpha=0.5,min_size=10)/100 clients``: every parameter that shapes the
    split."""
    params = {k: v for k, v in partition_params(datamodule).items() if k not in SEARCH_ONLY_PARAMS}
    partition = call_text(str(datamodule.hparams.get(schema.PARTITION, "")), params)
    noisy = "".join(f"/{name}({','.join(f'{k}={v:g}' for k, v in spec.items())})"
                    for name, spec in client_noise(datamodule).items())
    return f"{source_text(datamodule)}/{partition}/{datamodule.hparams.get(schema.NUM_CLIENTS)} clients{noisy}"


# --------------------------------------------------------------------------- the run's name


def unique_id() -> str:
    """``1605-3fa2``: the local time and 4 random hex digits (not from the seeded ``random``:
    every fit with the same seed would draw the same)."""
    return f"{time.strftime('%H%M')}-{secrets.token_hex(2)}"


def run_name(pl_module: pl.LightningModule, datamodule: Any = None,
             logger_tags: Mapping[str, Any] | None = None) -> str:
    """``FedFV seed 0 (tau=1) | mnist5k/dirichlet(alpha=0.5) | 1605-3fa2``: the algorithm, the
    seed (and the data seed where it differs: ``FedAvg seed 1 data 0``), the algorithm's own
    settings, the data, and a short unique id."""
    algorithm, _, settings = algorithm_config(pl_module, logger_tags).partition("(")
    seed, split_seed = model_seed(pl_module), data_seed(datamodule)
    head = algorithm + ("" if seed is None else f" seed {seed}")
    if split_seed is not None and split_seed != seed:
        head += f" data {split_seed}"
    parts = [head + (f" ({settings}" if settings else "")]
    if datamodule is not None:
        parts.append(data_text(datamodule))
    return NAME_SEPARATOR.join([*parts, unique_id()])[:_MAX_RUN_NAME]


# --------------------------------------------------------------------------- the task


def applied_test_fraction(data_hparams: Mapping[str, Any]) -> dict[str, Any]:
    """The test fraction that shapes the clients' test data in this ``test_mode``."""
    if data_hparams.get(schema.TEST_MODE, schema.DEFAULT_TEST_MODE) == schema.LOCAL_TEST_MODE:
        return {schema.LOCAL_TEST_FRACTION: data_hparams.get(schema.LOCAL_TEST_FRACTION)}
    return {schema.GLOBAL_TEST_FRACTION: data_hparams.get(schema.GLOBAL_TEST_FRACTION)}


def effective_fraction(pl_module: pl.LightningModule) -> Any:
    """The participation that runs (``core.simulation.participation_that_runs``): the fraction
    asked unless it rounds to another number of whole clients; the fraction asked where K is not
    known yet. ``fraction: 0.1`` of 3 clients runs 1 client a round, i.e. 1/3: that is logged."""
    fraction = pl_module.hparams.get(schema.FRACTION)
    try:
        num_clients = int(cast(Any, pl_module).round_context(0).num_clients_total)
    except (RuntimeError, AttributeError):  # no data attached (a module outside a fit), or no federation at all
        return fraction
    if fraction is None or num_clients < 1:
        return fraction
    ran = participation_that_runs(num_clients, float(fraction))
    return fraction if ran == float(fraction) else round(ran, 6)


def task(pl_module: pl.LightningModule, datamodule: Any) -> dict[str, Any]:
    """The settings that define the problem a run solves (not how: no algorithm, no seed)."""
    model, data = pl_module.hparams, datamodule.hparams
    settings: dict[str, Any] = {
        schema.SOURCE: data.get(schema.SOURCE),
        schema.SOURCE_PARAMS: source_params(datamodule),
        schema.PARTITION: data.get(schema.PARTITION),
        schema.PARTITION_PARAMS: partition_params(datamodule),
        schema.NUM_CLIENTS: data.get(schema.NUM_CLIENTS),
        schema.FRACTION: effective_fraction(pl_module),  # what ran, not what was asked
        schema.MODEL: model.get(schema.BACKBONE),
        schema.NUM_ROUNDS: model.get(schema.NUM_ROUNDS),
        schema.LOCAL_EPOCHS: model.get(schema.LOCAL_EPOCHS),
        schema.BATCH_SIZE: model.get(schema.BATCH_SIZE),
        schema.TEST_MODE: data.get(schema.TEST_MODE),
        **applied_test_fraction(data),
        schema.DROPOUT_PROB: model.get(schema.DROPOUT_PROB),
    }
    if model.get(schema.ATTACK):
        settings |= {name: model.get(name) for name in (schema.ATTACK, *schema.ATTACK_FIELDS)}
    settings |= client_noise(datamodule)  # noisy clients make another problem
    return canonical(settings)


def client_noise(datamodule: Any) -> dict[str, dict[str, float]]:
    """``{"label_noise": {"0": 0.2}, ...}``: the clients whose training data is corrupted."""
    noise = {}
    for name in schema.NOISE_FIELDS:
        spec = datamodule.hparams.get(name)
        if spec:
            noise[name] = {str(k): float(v) for k, v in sorted(spec.items(), key=lambda kv: int(kv[0]))}
    return noise


def evaluates_per_client_models(pl_module: pl.LightningModule) -> bool:
    """Whether every client is evaluated with a model of its own (Ditto, CGSV), as
    ``FederatedModule.evaluate_all_clients`` decides it."""
    evaluation_params = getattr(pl_module, "evaluation_params", None)
    params = evaluation_params() if callable(evaluation_params) else None
    return params is not None and params.dim() == 2


def task_tags(pl_module: pl.LightningModule, datamodule: Any) -> dict[str, str]:
    """``task`` (canonical JSON), ``task_key`` (its sha1, 12 hex digits), ``client_test``,
    ``client_test_size``, ``per_client_models``, ``algorithm_interpretation`` (when the class has
    one), ``seed`` and ``data_seed``."""
    seed = model_seed(pl_module)
    tags = {Tag.SEED: _text(seed), Tag.PER_CLIENT_MODELS: str(evaluates_per_client_models(pl_module)).lower()}
    note = getattr(type(pl_module), "interpretation", "")
    if isinstance(note, str) and note:
        tags[Tag.INTERPRETATION] = note
    if datamodule is None:
        return tags
    text = task_json(task(pl_module, datamodule))
    describe = getattr(datamodule, "client_test_description", None)
    split_seed = data_seed(datamodule)
    return tags | {
        Tag.TASK: text,
        Tag.TASK_KEY: task_key(text),
        Tag.CLIENT_TEST: str(datamodule.hparams.get(schema.TEST_MODE, "")),
        Tag.CLIENT_TEST_SIZE: str(describe()) if callable(describe) else "",
        Tag.DATA_SEED: _text(seed if split_seed is None else split_seed),
    }


def _text(value: Any) -> str:
    return "" if value is None else str(value)


# --------------------------------------------------------------------------- the dataset input


class FederatedDataSource(DatasetSource):
    """Where a federated split's samples come from: the source's name and parameters, and the
    folder its files are read from (torchvision sources). Metadata only: nothing to load."""

    def __init__(self, source: str, source_params: Mapping[str, Any] | None = None,
                 data_dir: str | None = None) -> None:
        self.source = source
        self.source_params = dict(source_params or {})
        self.data_dir = data_dir

    @staticmethod
    def _get_source_type() -> str:
        return "fl_lightning"

    def load(self) -> Any:
        raise NotImplementedError(
            "a federated split is rebuilt by fl_lightning.data.FederatedDataModule from the run's params")

    @staticmethod
    def _can_resolve(raw_source: Any) -> bool:
        return False

    @classmethod
    def _resolve(cls, raw_source: Any) -> FederatedDataSource:
        raise NotImplementedError("FederatedDataSource is built from a data module, not resolved")

    def to_dict(self) -> dict[str, Any]:
        found = {"source": self.source, "source_params": self.source_params, "data_dir": self.data_dir}
        return {k: v for k, v in found.items() if v not in (None, {})}

    @classmethod
    def from_dict(cls, source_dict: dict[Any, Any]) -> FederatedDataSource:
        return cls(source_dict["source"], source_dict.get("source_params"), source_dict.get("data_dir"))


def split_digest(datamodule: Any) -> str:
    """The data module's digest of which samples went to which client; without one, a digest
    of every client's train and test labels (the same split gives the same digest)."""
    digest = getattr(datamodule, "split_digest", None)
    if callable(digest):
        return str(digest())
    sha = hashlib.sha1()
    for name in ("train_y", "train_sizes", "test_y", "test_sizes", "global_test_y"):
        tensor = getattr(datamodule, name, None)
        if tensor is not None:
            sha.update(name.encode() + tensor.detach().cpu().numpy().tobytes())
    return sha.hexdigest()[:16]


def dataset_input(datamodule: Any) -> Any:
    """The run's federated split as an MLflow ``DatasetInput`` (context ``train``): metadata
    only, the samples stay where the data module reads them."""
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    source_name = str(datamodule.hparams.get(schema.SOURCE, ""))
    data_dir = os.path.abspath(datamodule.hparams.get("data_dir", "data")) if reads_files(source_name) else None
    source = FederatedDataSource(source_name, source_params(datamodule), data_dir)
    dataset = Dataset(name=dataset_name(datamodule), digest=split_digest(datamodule),
                      source_type=source._get_source_type(), source=source.to_json())
    return DatasetInput(dataset=dataset, tags=[InputTag(key=MLFLOW_DATASET_CONTEXT, value=TRAIN_CONTEXT)])


# --------------------------------------------------------------------------- a script's config


def _plain(value: Any) -> Any:
    """``value`` as YAML's safe dumper takes it: tuples as lists, numpy scalars as numbers."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "shape", None) == ():
        return value.item()
    return value


def script_config(pl_module: pl.LightningModule, datamodule: Any = None) -> dict[str, Any]:
    """The LightningCLI config (``seed_everything``, ``model``: class path and init args,
    ``data``) that builds again the modules a Trainer script fitted, from their hyper-parameters:
    what ``fl-lightning replay`` fits. The model's init args are the settings it recorded (the
    thread count and seed as it resolved them), less those the CLI links from the data
    (``num_classes``, ``input_shape``); the data's are its constructor's, its seed the one it
    used (``data_seed``)."""

    model = {k: v for k, v in pl_module.hparams.items() if not str(k).startswith("_") and k not in schema.DATA_LINKS}
    config: dict[str, Any] = {"seed_everything": model_seed(pl_module)}
    if config["seed_everything"] is None:
        config["seed_everything"] = run_seed(None)
    config["model"] = {"class_path": f"{type(pl_module).__module__}.{type(pl_module).__qualname__}",
                       "init_args": model}
    if datamodule is not None:
        accepted = set(inspect.signature(type(datamodule).__init__).parameters) - {"self"}
        hparams = dict(getattr(datamodule, "hparams", {}))
        data = {k: v for k, v in hparams.items() if k in accepted}
        if "seed" in accepted:
            data["seed"] = data_seed(datamodule)
        if schema.PARTITION_PARAMS in data:
            data[schema.PARTITION_PARAMS] = partition_params(datamodule)
        config["data"] = data
    return _plain(config)
