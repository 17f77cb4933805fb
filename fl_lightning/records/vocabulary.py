"""A run's identity, in one place: the names an MLflow run is tagged and read by, the settings
that define its task, the task key, and the defaults more than one package needs.

The library (``callbacks.run_identity``, ``callbacks.mlflow_run``), the benchmark runner
(``benchmarks.suites``, ``benchmarks.plan``) and the leaderboard all import these names instead
of spelling them, so the writer and the readers of a tag cannot drift apart. Standard library
only: the leaderboard imports it where PyTorch is not installed.

The names and the task key are the store's: runs already logged are read by them, so a name
here is never renamed and the key's recipe never changes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

# --------------------------------------------------------------------------- settings
# The model's and the data's hyper-parameters that more than one package reads: their names as
# the modules take them, as MLflow params (``LogHyperparameters``) and, but for ``backbone``
# (the task's ``model``), as fields of the ``task`` tag.

SOURCE = "source"
SOURCE_PARAMS = "source_params"
PARTITION = "partition"
PARTITION_PARAMS = "partition_params"
NUM_CLIENTS = "num_clients"
FRACTION = "fraction"
BACKBONE = "backbone"
NUM_ROUNDS = "num_rounds"
EVAL_EVERY = "eval_every"
LOCAL_EPOCHS = "local_epochs"
BATCH_SIZE = "batch_size"
TEST_MODE = "test_mode"
LOCAL_TEST_FRACTION = "local_test_fraction"
GLOBAL_TEST_FRACTION = "global_test_fraction"
TEST_FRACTION = "test_fraction"  # a task field of runs older than the local and global test fractions
DROPOUT_PROB = "dropout_prob"
ATTACK = "attack"
ATTACK_CLIENT = "attack_client"
ATTACK_STRENGTH = "attack_strength"
LABEL_NOISE = "label_noise"
FEATURE_NOISE = "feature_noise"
SEED = "seed"
DATA_SEED = "data_seed"
LR = "lr"
LR_DECAY = "lr_decay"

# The task's fields (``callbacks.run_identity.task``): the settings above, ``backbone`` as ``model``.
MODEL = "model"
ATTACK_FIELDS = (ATTACK_CLIENT, ATTACK_STRENGTH)  # in a task only when there is an attack
NOISE_FIELDS = (LABEL_NOISE, FEATURE_NOISE)  # in a task only when some client is noisy

# --------------------------------------------------------------------------- defaults

DEFAULT_FRACTION = 0.1  # FederatedModule's ``fraction``
DEFAULT_BACKBONE = "fl_mlp"  # FederatedModule's ``backbone``
DEFAULT_NUM_ROUNDS = 100  # FederatedModule's ``num_rounds``
DEFAULT_EVAL_EVERY = 5  # FederatedModule's ``eval_every`` (the CLI's too: configs/default.yaml)
DEFAULT_LOCAL_EPOCHS = 1  # FederatedModule's ``local_epochs``
DEFAULT_BATCH_SIZE = 10  # FederatedModule's ``batch_size`` (core.local.LocalSGD's too)
DEFAULT_LR = 0.05  # FederatedModule's ``lr`` (core.local.LocalSGD's, the CLI's too)
DEFAULT_SOURCE = "mnist5k"  # FederatedDataModule's ``source``
DEFAULT_NUM_CLIENTS = 100  # FederatedDataModule's ``num_clients``
DEFAULT_PARTITION = "dirichlet"  # FederatedDataModule's ``partition`` (Dir(0.5) label skew; the CLI's too)
DEFAULT_DATA_DIR = "data"  # FederatedDataModule's ``data_dir``
REPLAY_IDENTICAL = "identical"  # the replay_result tag of a run replayed bit for bit
DEFAULT_TRACKING_URI = "sqlite:///mlruns.db"  # the local MLflow store of the CLI, the runner and the leaderboard
DEFAULT_EXPERIMENT = "fl-lightning"  # the MLflow experiment of a plain `fl-lightning fit` (not from a suite)
FULL_PARTICIPATION = 1.0  # a fraction of 1: every client every round (tag ``participation``: ``full``)
LOCAL_TEST_MODE: Final = "local"  # the test mode in which every client keeps a share of its samples as its test set
GLOBAL_TEST_MODE: Final = "global"  # the test mode in which one shared test set is held out
MATCHED_TEST_MODE: Final = "matched"  # the shared test set, weighted by each client's own labels
DEFAULT_TEST_MODE: Final = MATCHED_TEST_MODE  # FederatedDataModule's ``test_mode`` (the CLI's too)
DEFAULT_LOCAL_TEST_FRACTION = 0.2  # FederatedDataModule's ``local_test_fraction``


class Tag:
    """MLflow tag names."""

    # every fit's run (``callbacks.mlflow_run.run_tags``)
    ALGORITHM = "algorithm"
    DATASET = "dataset"  # the data source
    PARTITION = PARTITION
    PARTITION_PARAMS = PARTITION_PARAMS  # JSON, the partitioner's defaults filled in
    NUM_CLIENTS = NUM_CLIENTS
    PARTICIPATION = "participation"  # "full" or the fraction
    MODEL = MODEL
    GIT_SHA = "git_sha"
    MACHINE = "machine"
    # the task (``callbacks.run_identity.task_tags``)
    TASK = "task"  # canonical JSON of the task's fields (``task_json``)
    TASK_KEY = "task_key"  # ``task_key(task)``
    CLIENT_TEST = "client_test"
    CLIENT_TEST_SIZE = "client_test_size"
    PER_CLIENT_MODELS = "per_client_models"  # "true" / "false"
    INTERPRETATION = "algorithm_interpretation"  # the algorithm class's ``interpretation`` (algorithm_facts)
    SEED = SEED
    DATA_SEED = DATA_SEED
    # a resumed fit (``callbacks.mlflow_run.MLflowRunInfo``)
    RESUMED_AT_ROUND = "resumed_at_round"
    RESUMED_FROM_RUNS = "resumed_from_runs"
    EXTENDED_TO_ROUNDS = "extended_to_rounds"  # the num_rounds a continued run plans when it differs from its param
    FIT_LENGTHS = "fit_lengths"  # an extended run's route: every num_rounds it was fitted to, in order ("3,5")
    # the process a fit runs in, and a run found RUNNING after its fit died (``fit_lock``)
    FIT_HOST = "fit_host"
    FIT_PID = "fit_pid"
    KILLED_REASON = "killed_reason"
    # the benchmark runner's (``benchmarks.suites.Cell.tags``: the logger's tags in each cell's config)
    SUITE = "suite"
    PAPER = "paper"
    SCALE = "scale"
    BENCHMARK = "benchmark"
    CELL = "cell"
    ALGORITHM_CONFIG = "algorithm_config"  # also the library's label when the runner set it
    CELL_CONFIG = "cell_config"  # digest of the cell's whole config
    SUITE_DESCRIPTION = "suite_description"
    CONTROL = "control"
    ERROR = "error"  # why a cell failed (``benchmarks.suite_store.record_failure``)
    # a run of the claims ledger's confirmatory pass (``fl-benchmarks run --confirmatory``): its pass
    # ("confirmatory"; exploratory runs carry neither tag) and the registration hash it ran under
    LEDGER_PASS = "ledger_pass"
    LEDGER_PLAN_HASH = "ledger_plan_hash"
    # ``fl-lightning replay``: "identical" or "diverged: round R: metric stored x, replayed y"; its date
    REPLAY_RESULT = "replay_result"
    REPLAY_DATE = "replay_date"
    # MLflow's own; and a tag only runs older than the ``client_test`` tag carry
    RUN_NAME = "mlflow.runName"
    TEST_MODE = TEST_MODE


# model settings the data module fills in (data.X -> model X): a config links them, so they are not
# the model's own settings
DATA_LINKS: Final = ("num_classes", "input_shape")


class Metric:
    """The metrics a fit logs that the runner, the leaderboard and the progress line read, spelled
    once for writer and reader. A client-accuracy statistic is ``TEST_ACC_PREFIX`` + a key of
    ``fl_lightning.metrics.fairness.fairness_summary``."""

    TRAIN_LOSS: Final = "train_loss"
    TRAIN_ACC: Final = "train_acc"
    TEST_ACC_PREFIX: Final = "test_acc_"
    TEST_ACC_MEAN: Final = "test_acc_mean"
    TEST_ACC_STD: Final = "test_acc_std"
    TEST_ACC_VAR: Final = "test_acc_var"
    TEST_ACC_MIN: Final = "test_acc_min"
    TEST_ACC_MAX: Final = "test_acc_max"
    TEST_ACC_WORST5: Final = "test_acc_worst5"
    TEST_ACC_BEST5: Final = "test_acc_best5"
    TEST_ACC_WORST10: Final = "test_acc_worst10"
    TEST_ACC_BEST10: Final = "test_acc_best10"
    TEST_ACC_ANGLE: Final = "test_acc_angle"
    TEST_ACC_JAIN: Final = "test_acc_jain"
    GLOBAL_TEST_ACC: Final = "global_test_acc"  # the shared test set's (test_mode: global)
    GLOBAL_TEST_LOSS: Final = "global_test_loss"
    # conflicting client pairs of a round (FedFV, Wang et al., IJCAI 2021; FedLF, Pan et al., 2023)
    CONFLICTS_MODEL: Final = "conflicts_model"
    CONFLICTS_LAYER: Final = "conflicts_layer"
    CONFLICTS_LAYER_MEAN: Final = "conflicts_layer_mean"
    CONFLICTS_LAYER_MAX: Final = "conflicts_layer_max"
    IMPROVED_FRACTION: Final = "improved_fraction"  # the clients whose loss the round's update lowered
    # CGSV (Xu et al., NeurIPS 2021): rho = pearson(standalone acc, final acc) x 100, and its
    # reputation-based variant; the standalone agents' mean accuracy
    CGSV_RHO: Final = "cgsv_rho"
    CGSV_RHO_R: Final = "cgsv_rho_r"
    STANDALONE_TEST_ACC_MEAN: Final = "standalone_test_acc_mean"
    # a round's wall seconds (``FederatedModule``): its clients' local training, the server's step
    CLIENT_TIME_S: Final = "client_time_s"
    SERVER_TIME_S: Final = "server_time_s"
    # per-agent series, one metric per agent (``agent_metric``: ``cgsv_r/3``) and their
    # ``_min`` / ``_mean`` / ``_max``: CGSV's reputation r, contribution psi (eq. 3), download
    # density q/D and distance to the server model (Fig. 2); AFL's mixture lambda (and its max)
    CGSV_R: Final = "cgsv_r"
    CGSV_PSI: Final = "cgsv_psi"
    CGSV_DENSITY: Final = "cgsv_density"
    CGSV_DISTANCE: Final = "cgsv_distance"
    AFL_LAMBDA: Final = "afl_lambda"
    AFL_LAMBDA_MAX: Final = "afl_lambda_max"
    # CGSV's Fig. 1 check (``shapley_check_every``): the exact phi and the sampled phi-bar per agent
    # (series as above), their errors from phi (``shapley_error``, ``shapley_gap``) and their seconds
    CGSV_SHAPLEY: Final = "cgsv_shapley"
    CGSV_SHAPLEY_SAMPLED: Final = "cgsv_shapley_sampled"
    CGSV_SHAPLEY_L1_GAP: Final = "cgsv_shapley_l1_gap"  # shapley_gap("l1")
    CGSV_SHAPLEY_L2_GAP: Final = "cgsv_shapley_l2_gap"  # shapley_gap("l2")
    CGSV_SHAPLEY_PSI_SAMPLED_PEARSON: Final = "cgsv_shapley_psi_sampled_pearson"
    CGSV_TIME_S: Final = "cgsv_time_s"
    CGSV_SHAPLEY_TIME_S: Final = "cgsv_shapley_time_s"
    CGSV_SHAPLEY_EXACT_TIME_S: Final = "cgsv_shapley_exact_time_s"
    CGSV_SHAPLEY_TIME_RATIO: Final = "cgsv_shapley_time_ratio"


SHAPLEY_ERRORS: Final = ("l1", "l2")  # the errors of the Fig. 1 check that have a gap


def agent_metric(series: str, agent: int | str) -> str:
    """One agent's value of a per-agent series: ``agent_metric("cgsv_r", 3)`` is ``cgsv_r/3``."""
    return f"{series}/{agent}"


def agent_of(name: str) -> tuple[str, int] | None:
    """(series, agent) of a per-agent metric's name (``cgsv_r/3``); None for any other name."""
    series, separator, agent = name.rpartition("/")
    return (series, int(agent)) if separator and agent.isdecimal() else None


def shapley_error(estimate: str, error: str) -> str:
    """An estimate's ``error`` ("l1", "l2" or "pearson") from the exact CGSV phi, the estimate
    being psi (``Metric.CGSV_SHAPLEY``) or phi-bar (``Metric.CGSV_SHAPLEY_SAMPLED``)."""
    return f"{estimate}_{error}"


def shapley_gap(error: str) -> str:
    """phi-bar's ``error`` from phi minus psi's (> 0: psi is closer): ``cgsv_shapley_l1_gap``."""
    return f"{shapley_error(Metric.CGSV_SHAPLEY, error)}_gap"


class Artifact:
    """Artifact paths of a fit's run (``callbacks.mlflow_run``); the leaderboard reads ``CLIENT_METRICS``."""

    CLIENT_METRICS: Final = "clients/final_client_metrics.json"  # fields: ``ClientMetrics``
    CLIENT_ACCURACY_FIGURE: Final = "clients/client_accuracy.png"
    PARTITION_TABLE: Final = "partition/partition_table.txt"
    PARTITION_FIGURE: Final = "partition/partition.png"


class ClientMetrics:
    """The fields of the ``Artifact.CLIENT_METRICS`` JSON."""

    STATUS: Final = "status"  # "finished", or how the fit stopped ("failed: ...")
    ROUNDS_COMPLETED: Final = "rounds_completed"
    CLIENTS: Final = "clients"  # per-client lists by client id (the module's ``last_client_metrics``)
    TEST_ACCURACY: Final = "test_accuracy"  # a list in ``CLIENTS``: every client's final test accuracy


# --------------------------------------------------------------------------- the task key


def canonical(value: Any) -> Any:
    """``value`` with integral floats as ints, recursively (``alpha: 1`` and ``alpha: 1.0``,
    ``fraction: 1`` and ``fraction: 1.0`` define the same task)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [canonical(v) for v in value]
    return value


def task_json(fields: Mapping[str, Any]) -> str:
    """The ``task`` tag: the task's fields (already ``canonical``) as JSON, keys sorted."""
    return json.dumps(fields, sort_keys=True)


def task_key(task_text: str) -> str:
    """The ``task_key`` tag: the first 12 hex digits of the ``task`` tag's sha1."""
    return hashlib.sha1(task_text.encode()).hexdigest()[:12]


def fit_lengths(tags: Mapping[str, str], params: Mapping[str, str]) -> list[int]:
    """The route of an extended run: every ``num_rounds`` it was fitted to, in order (``[3, 5]``: a
    3-round fit, then extended to 5). From the ``fit_lengths`` tag; a run extended before that tag
    existed has only ``extended_to_rounds``, read as one extension. ``[]`` for a run never extended
    (a resume to the same length is no extension)."""
    if tags.get(Tag.FIT_LENGTHS):
        return [int(length) for length in tags[Tag.FIT_LENGTHS].split(",")]
    extended, first = tags.get(Tag.EXTENDED_TO_ROUNDS), params.get(NUM_ROUNDS)
    if extended is None or first is None or extended == first:
        return []
    return [int(first), int(extended)]
