"""What a command line gives, read apart from LightningCLI's parse: its words (``--config``,
``--model.help``, ``--print_config``), its settings without the defaults, and an algorithm's own
defaults restored over the base class's."""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
from collections.abc import Sequence
from typing import Any

from jsonargparse import Namespace

from fl_lightning.callbacks.fit_runs import is_mlflow_logger_config
from fl_lightning.configs import DEFAULT_CONFIG
from fl_lightning.core.module import FederatedModule
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.data.partition_registry import resolved_partition_params
from fl_lightning.records.vocabulary import DATA_LINKS

# the class path a command line with --model.SETTING but no --model gives (the parser's base class)
BASE_MODULE_PATHS = ("fl_lightning.core.FederatedModule", f"{FederatedModule.__module__}.FederatedModule")
EVALUATION_SUBCOMMANDS = ("validate", "test", "predict")


def config_paths(args: list[str]) -> list[str]:
    """The ``--config`` files of a command line."""
    paths = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "--config"]
    return paths + [arg.split("=", 1)[1] for arg in args if arg.startswith("--config=")]


def given_settings(parser: Any, args: Sequence[str]) -> Namespace:
    """The settings the command line and its ``--config`` files give (the fit's, without the
    defaults): what the user asked for, read again because LightningCLI replaces the model's
    settings with a resumed checkpoint's. Without a ``--model`` anywhere (the algorithm comes
    from the defaults), the parser's base class stands in for it (``BASE_MODULE_PATHS``: no
    algorithm given). Empty when the parse needs other defaults."""
    words = [str(arg) for arg in args]
    command = next((i for i, word in enumerate(words) if word == "fit"), None)
    attempts = [words]
    if command is not None:
        attempts.append([*words[:command + 1], "--model", BASE_MODULE_PATHS[0], *words[command + 1:]])
    quiet = io.StringIO()
    for attempt in attempts:
        try:  # the real parse has reported any error
            with contextlib.redirect_stderr(quiet), contextlib.redirect_stdout(quiet):
                given = parser.parse_args(attempt, defaults=False)
        except (Exception, SystemExit):  # noqa: BLE001
            continue
        subcommand = given.get("subcommand")
        config = given.get(subcommand) if subcommand else given
        return config if isinstance(config, Namespace) else Namespace()
    return Namespace()


def signature_defaults(cls: type) -> dict[str, Any]:
    """Every keyword default of ``cls.__init__`` and of the ``__init__``s it passes ``**kwargs``
    to, the subclass's own winning (AFL's ``fraction`` 1.0 over the base class's 0.1)."""
    defaults: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if "__init__" in vars(klass) and klass is not object:
            try:
                parameters = inspect.signature(vars(klass)["__init__"]).parameters.values()
            except (TypeError, ValueError):
                continue
            defaults |= {p.name: p.default for p in parameters if p.default is not p.empty}
    return defaults


def default_config_settings() -> set[str]:
    """The model settings the embedded default config gives explicitly (``configs/default.yaml``)."""
    import yaml

    init_args = ((yaml.safe_load(DEFAULT_CONFIG.read_text()) or {}).get("model") or {}).get("init_args") or {}
    return set(init_args)


def algorithm_class(class_path: Any) -> type | None:
    """The class a ``model.class_path`` names, or None when it does not import."""
    module, _, name = str(class_path).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return cls if inspect.isclass(cls) else None


def restore_own_defaults(model: Any, given: dict[str, Any]) -> list[str]:
    """Give the chosen algorithm its own defaults where the parse carried the base class's.

    ``--model X`` over the default config's FedAvg keeps FedAvg's parsed settings, the base
    defaults included (jsonargparse carries a class's init_args over to the next), so an
    algorithm whose default differs (AFL's fraction 1.0, FedFa's client momentum, FedMGDA+'s
    ``track_improvement``) would silently get the base one. A setting the user gave (command
    line or ``--config``) or that the default config names is left alone. Returns the names reset."""
    class_path = model.get("class_path") if isinstance(model, Namespace) else None
    init_args = model.get("init_args") if isinstance(model, Namespace) else None
    if not class_path or class_path in BASE_MODULE_PATHS or not isinstance(init_args, Namespace):
        return []
    cls = algorithm_class(class_path)
    if cls is None:
        return []
    base, own = signature_defaults(FederatedModule), signature_defaults(cls)
    fixed = set(given) | default_config_settings()
    reset = []
    for key in list(init_args.keys()):
        if key in fixed or key not in base or key not in own or own[key] == base[key]:
            continue
        if init_args.get(key) == base[key]:
            setattr(init_args, key, own[key])
            reset.append(key)
    return reset


def model_help_request(words: list[str]) -> tuple[list[str], str] | None:
    """``(the words before it, the class asked)`` of a command line's ``--model.help CLASS``, else None."""
    for i, word in enumerate(words):
        if word == "--model.help" and i + 1 < len(words) and not words[i + 1].startswith("-"):
            return words[:i], words[i + 1]
        if word.startswith("--model.help="):
            return words[:i], word.split("=", 1)[1]
    return None


def fill_partition_params(data: Any) -> None:
    """``data.partition_params`` with the partitioner's defaults filled in, as the data module
    resolves and logs them (``{alpha: 0.5, min_size: 10, max_tries: 100}`` for the default
    Dirichlet partition given none): what ``--print_config`` shows, the values the run uses. Left
    as given where the partition or its parameters are not valid (the fit refuses them)."""
    if not isinstance(data, Namespace):
        return
    params = data.get("partition_params")
    if params is not None and not isinstance(params, dict):
        return
    try:
        data.partition_params = resolved_partition_params(str(data.get("partition")), params or {})
    except (ValueError, KeyError, TypeError):
        return


def print_config_words(words: list[str]) -> list[str]:
    """The ``--print_config`` words of a command line (``--print_config`` or ``--print_config=FLAGS``)."""
    return [word for word in words if word == "--print_config" or word.startswith("--print_config=")]


def given_model_settings(parser: Any, words: list[str]) -> dict[str, Any]:
    """The model settings (``init_args``) a command line and its ``--config`` files give."""
    model = given_settings(parser, words).get("model")
    init_args = model.get("init_args") if isinstance(model, Namespace) else None
    return init_args.as_dict() if isinstance(init_args, Namespace) else {}


def linked_help_defaults(data: Any) -> dict[str, str]:
    """What the help gives as the default of each model setting the data fills in (``DATA_LINKS``):
    the data setting it comes from and its value for the configured data, ``data.num_classes = 10
    for mnist5k`` (the data module built as a fit builds it, without loading its samples)."""
    data = data.as_dict() if isinstance(data, Namespace) else {}
    try:
        module = FederatedDataModule(**data)
    except (TypeError, ValueError):  # data a fit would refuse: the link alone
        return {key: f"data.{key}" for key in DATA_LINKS}
    return {key: f"data.{key} = {getattr(module, key)} for {data.get('source')}" for key in DATA_LINKS}


def fit_model_defaults(parser: Any, words: list[str]) -> tuple[type, dict[str, Any]] | None:
    """The algorithm and the settings a fit of ``words`` (a ``fit`` command line with a ``--model``)
    gives it, as :meth:`FederatedCLI.parse_arguments` resolves them: the parse (the default config,
    ``--config`` files, the command line), then the algorithm's own defaults restored
    (:func:`restore_own_defaults`); the data's settings for ``DATA_LINKS``. None when the command
    line does not parse (its own parse reports why) or resumes a checkpoint (whose settings win)."""
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stderr(quiet), contextlib.redirect_stdout(quiet):
            parsed = parser.parse_args(words)
    except (Exception, SystemExit):  # noqa: BLE001
        return None
    subcommand = parsed.get("subcommand")
    config = parsed.get(subcommand) if subcommand else parsed
    model = config.get("model") if isinstance(config, Namespace) else None
    if not isinstance(model, Namespace) or config.get("ckpt_path"):
        return None
    cls = algorithm_class(model.get("class_path"))
    if cls is None or not isinstance(model.get("init_args"), Namespace):
        return None
    restore_own_defaults(model, given_model_settings(parser, words))
    return cls, {**model.init_args.as_dict(), **linked_help_defaults(config.get("data"))}


def refused_subcommand(args: list[str]) -> str | None:
    """The one-line answer to ``fl-lightning validate|test|predict`` (None for anything else)."""
    command = next((arg for arg in args if not arg.startswith("-")), None)
    if command not in EVALUATION_SUBCOMMANDS:
        return None
    return (f"fl-lightning {command}: not a command here; every client is evaluated during `fl-lightning fit` "
            "every --model.eval_every rounds and after the last, and logged to its MLflow run")


def mlflow_logger_configs(logger: Any) -> list[Any]:
    """The MLFlowLogger entries of a parsed ``trainer.logger`` (one entry, a list, or false)."""
    return [entry for entry in (logger if isinstance(logger, list) else [logger]) if is_mlflow_logger_config(entry)]
