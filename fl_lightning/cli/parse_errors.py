"""One line that says what is wrong with a command line, found from the settings it gives.

When jsonargparse refuses a ``fit`` command line, its message is a dump of every Union subtype
it tried. Instead of reading that text, :func:`diagnose` reads what the user gave (the command
line's ``--model.*``/``--data.*`` values and its ``--config`` files) and checks each setting
against the signature of the class that takes it: a name it does not take ("did you mean"), or
a value its type refuses (``core.settings.check_setting``, from pydantic's structured errors).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from fl_lightning.algorithms import ALGORITHMS
from fl_lightning.configs import DEFAULT_CONFIG
from fl_lightning.core.settings import check_setting, signature_types
from fl_lightning.records.errors import did_you_mean

TOP_LEVEL_SETTINGS = ("model", "data", "trainer", "seed_everything", "ckpt_path", "config", "threads")
DATA_CLASS = "fl_lightning.data.datamodule.FederatedDataModule"
TRAINER_CLASS = "lightning.pytorch.Trainer"
NON_FINITE = ("nan", "+nan", "-nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity")


def resolve_class(name_or_path: str) -> type | None:
    """An algorithm's registered name, or a class path, as the class (None if neither)."""
    if name_or_path in ALGORITHMS:
        return ALGORITHMS[name_or_path]
    module, _, name = name_or_path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None
    return found if isinstance(found, type) else None


def accepted_settings(cls: type) -> dict[str, Any]:
    """Every keyword ``cls`` takes, through its ``**kwargs`` chain, with its type (``{}`` when its
    annotations cannot be read: the class's own error is then the one shown)."""
    try:
        return signature_types(cls)
    except TypeError:
        return {}


def unknown_setting_message(key: str) -> str:
    """"did you mean" for a setting no class takes (``modle.class_path``, ``data.num_client``)."""
    first, _, rest = key.partition(".")
    if first not in TOP_LEVEL_SETTINGS:
        return f"unknown setting {key!r}{did_you_mean(first, list(TOP_LEVEL_SETTINGS))}"
    owner = resolve_class({"data": DATA_CLASS, "trainer": TRAINER_CLASS}.get(first, ""))
    known = sorted(accepted_settings(owner)) if owner is not None else []
    hint = did_you_mean(rest.split(".")[-1], known, f"{first}.") or (f"; valid: {', '.join(known)}" if known else "")
    return f"unknown setting {key!r}{hint}"


def command_line_value(raw: str) -> Any:
    """A command-line value as jsonargparse reads it: YAML (``0`` an int, ``null`` None), and
    ``nan``/``inf`` as floats."""
    if raw.strip().lower() in NON_FINITE:
        return float(raw)
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def _config_entries(path: str) -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of a ``--config`` file's model class, model and data settings."""
    try:
        content = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return
    if not isinstance(content, dict):
        return
    for group, value in content.items():
        if group not in TOP_LEVEL_SETTINGS:
            first = next(iter(value), None) if isinstance(value, dict) else None
            yield (f"{group}.{first}" if first is not None else str(group)), value
        elif group == "model" and isinstance(value, str):
            yield "model", value
        elif group in ("model", "data") and isinstance(value, dict):
            if "class_path" in value:
                yield "model", value["class_path"]
            settings = value.get("init_args", value) if group == "model" else value
            for key, setting in (settings or {}).items():
                if key not in ("class_path", "init_args"):
                    yield f"{group}.{key}", setting


def _command_line_entries(words: list[str]) -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` of the ``--model``, ``--model.*`` and ``--data.*`` options."""
    for i, word in enumerate(words):
        if not word.startswith("--"):
            continue
        key, eq, raw = word[2:].partition("=")
        if not eq:
            if i + 1 >= len(words):
                continue
            raw = words[i + 1]
        if key == "config":
            yield from _config_entries(raw)
        elif key == "model":
            yield "model", raw
        elif key.startswith(("model.", "data.")) and not key.endswith(".help"):
            group, _, name = key.partition(".")
            name = name.removeprefix("init_args.")
            if "." not in name:
                yield f"{group}.{name}", command_line_value(raw)


def diagnose(words: list[str]) -> str | None:
    """The first problem with the settings a ``fit`` command line gives, in one line, or None
    when none of its model and data settings is at fault (jsonargparse's own message is used)."""
    entries = list(_command_line_entries(words))
    model_path = next((value for key, value in reversed(entries) if key == "model"), None)
    if model_path is None:
        default = yaml.safe_load(DEFAULT_CONFIG.read_text()) or {}
        model_path = (default.get("model") or {}).get("class_path", "FedAvg")
    model = resolve_class(str(model_path))
    data = resolve_class(DATA_CLASS)
    for key, value in entries:
        group, _, name = key.partition(".")
        if group not in TOP_LEVEL_SETTINGS:
            return unknown_setting_message(key)
        owner = model if group == "model" else data
        if not name or owner is None:
            continue
        settings = accepted_settings(owner)
        if name not in settings:
            if group == "data":
                return unknown_setting_message(key)
            hint = did_you_mean(name, sorted(settings))
            return (f"{owner.__name__} has no setting {name!r}{hint} "
                    f"(fl-lightning fit --model.help {owner.__name__} lists them)")
        try:
            check_setting(key if group == "data" else name, value, settings[name])
        except ValueError as error:
            return str(error)
    return None


def union_reasons(text: str) -> str:
    """The subtypes' own errors out of jsonargparse's "Does not validate against any of the Union
    subtypes" text (one line per subtype, e.g. FederatedModule | None), the NoneType one left out."""
    if "Does not validate against any of the Union subtypes" not in text:
        return text
    reasons = [line.strip()[2:] for line in text.splitlines() if line.strip().startswith("- ")]
    reasons = [r for r in reasons if not r.startswith("Expected a <class 'NoneType'>")]
    return "; ".join(reasons) or text
