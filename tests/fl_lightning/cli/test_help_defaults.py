"""Every default the help prints is the one a fit uses: each ``default: V`` of ``fl-lightning fit
--model.help X`` and of ``fl-lightning fit --help`` against the config ``fit --model X
--print_config`` resolves, and that config against the one the fit is built from, for every
registered algorithm (in-process, through the console script).

The model settings the data fills in (``num_classes``, ``input_shape``: linked from ``data.*`` when
the classes are built) are not in the printed config; the help names the data setting and its value
for the configured source (``data.num_classes = 10 for mnist5k``), checked against the source's info."""

from __future__ import annotations

import ast
import contextlib
import io
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from fl_lightning.algorithms import ALGORITHMS
from fl_lightning.cli import console as cli
from fl_lightning.configs import DEFAULT_CONFIG
from fl_lightning.data.datamodule import FederatedDataModule
from fl_lightning.data.partition_registry import resolved_partition_params
from fl_lightning.data.sources import source_info

LINKED = ("num_classes", "input_shape")  # model settings filled in from the data (cli_settings.DATA_LINKS)
OPTION = re.compile(r"\n(?=  --)")  # an option's entry in the help starts on a line of its own


@pytest.fixture(scope="module")
def printed(tmp_path_factory):
    """``printed(args)``: what ``fl-lightning <args>`` prints, in-process, with a fresh help cache
    (a kept text is never what is tested) and the console script's argv."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FL_LIGHTNING_CACHE", str(tmp_path_factory.mktemp("cache")))
        patch.setenv("COLUMNS", "100")
        patch.setattr(sys, "argv", ["fl-lightning"])

        def run(args: list[str]) -> str:
            buffer = io.StringIO()
            with contextlib.redirect_stdout(buffer), pytest.raises(SystemExit) as exit_:
                cli.main(args)
            assert exit_.value.code in (0, None), buffer.getvalue()[-2000:]
            return buffer.getvalue()

        yield run


def help_defaults(text: str, prefix: str = "") -> dict[str, str]:
    """``{option: the text after "default: "}`` of every ``--<prefix>...`` option of a help text
    whose entry ends with jsonargparse's ``(type: ..., default: V)`` (the entry unwrapped, up to
    the blank line before the next group; the ``known subclasses`` after a class's default left out)."""
    defaults = {}
    for entry in OPTION.split(text):
        name = re.match(r"\s*--([^\s,]+)", entry)  # Python 3.13 writes "--a, --a+ A" for "--a A, --a+ A"
        words = " ".join(entry.split("\n\n")[0].split())  # a group's title follows its last option
        if not name or not name.group(1).startswith(prefix) or not words.endswith(")") or "default: " not in words:
            continue
        default = words[words.rfind("default: ") + len("default: "):-1]
        defaults[name.group(1)] = default.split(", known subclasses:")[0]
    return defaults


def value(text: str):
    """A printed default as a value: a Python literal (``True``, ``(1, 28, 28)``, a dict), else YAML
    (``null``, ``auto``); tuples as lists, as the printed config has them."""
    try:
        parsed = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        parsed = yaml.safe_load(text)
    return as_lists(parsed)


def as_lists(item):
    if isinstance(item, (list, tuple)):
        return [as_lists(entry) for entry in item]
    if isinstance(item, dict):
        return {key: as_lists(entry) for key, entry in item.items()}
    return item


def linked_default(name: str, source: str) -> str:
    """What the help gives as the default of a model setting the data fills in."""
    return f"data.{name} = {getattr(source_info(source), name)} for {source}"


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_model_help_defaults_are_the_fits(algorithm, printed):
    """``--model.help X`` showed X's signature (lr 0.1, eval_every 1, AFL's fraction as the class
    says) while a fit of X gets the default config's values (lr 0.05, eval_every 5)."""
    config = yaml.safe_load(printed(["fit", "--model", algorithm, "--print_config"]))
    settings, source = config["model"]["init_args"], config["data"]["source"]
    shown = help_defaults(printed(["fit", "--model.help", algorithm]), "model.")
    assert {name.removeprefix("model.") for name in shown} == set(settings) | set(LINKED)
    wrong = {}
    for option, default in shown.items():
        name = option.removeprefix("model.")
        expected = linked_default(name, source) if name in LINKED else settings[name]
        if (default if name in LINKED else value(default)) != as_lists(expected):
            wrong[name] = f"help says {default}, --print_config {expected}"
    assert not wrong, f"{algorithm}: {wrong}"


class Parsed(Exception):
    """Raised where a fit would start building its classes, with the config it parsed."""

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_the_printed_config_is_the_fits(algorithm, printed, monkeypatch, tmp_path):
    """``--print_config`` is printed inside the parse, before the algorithm's own defaults are
    restored: it showed AFL's fraction 0.1 (FedAvg's, carried over) where the fit runs at 1.0, FedFa's
    momentum 0.0 where the fit takes γ. It now shows the settings the fit is built from."""
    from fl_lightning.cli.lightning_cli import FederatedCLI

    def stop(cli):
        raise Parsed(cli.config[cli.subcommand])

    monkeypatch.chdir(tmp_path)
    config = yaml.safe_load(printed(["fit", "--model", algorithm, "--print_config"]))
    monkeypatch.setattr(FederatedCLI, "before_instantiate_classes", stop)
    with pytest.raises(Parsed) as parsed:
        cli.main(["fit", "--model", algorithm])
    fit = parsed.value.config
    settings = {key: entry for key, entry in fit.model.init_args.as_dict().items() if key not in LINKED}
    assert as_lists(settings) == config["model"]["init_args"]
    data = fit.data.as_dict()
    # the fit's null partition_params stands for the partitioner's defaults: printed as the data module
    # built from it resolves (and logs) them
    data["partition_params"] = FederatedDataModule(**data).partition_params
    assert as_lists(data) == config["data"] and fit.seed_everything == config["seed_everything"]


def flattened(config: dict, prefix: str = "") -> dict:
    """``{"data.test_mode": "matched", "data": {...}, ...}``: every key of a nested config."""
    keys = {}
    for key, entry in config.items():
        keys[f"{prefix}{key}"] = entry
        if isinstance(entry, dict):
            keys |= flattened(entry, f"{prefix}{key}.")
    return keys


def test_fit_help_defaults_are_the_default_fits(printed):
    """``fit --help``: every default it shows (data, trainer, seed, the algorithm with its
    settings) is the one ``fit --print_config`` resolves."""
    config = yaml.safe_load(printed(["fit", "--print_config"]))
    keys, source = flattened(config), config["data"]["source"]
    shown = help_defaults(printed(["fit", "--help"]))
    assert {"model", "data.test_mode", "data.source", "seed_everything", "trainer.max_epochs"} <= set(shown)
    assert set(shown) <= set(keys), f"defaults shown of settings the config lacks: {set(shown) - set(keys)}"
    model = value(shown.pop("model"))
    for name in LINKED:  # in the algorithm's default: the values the default data gives
        assert model["init_args"].pop(name) == as_lists(getattr(source_info(source), name))
    assert model == config["model"]
    shown_values = {option: value(default) for option, default in shown.items()}
    # the help's null partition_params stands for the partitioner's defaults, which --print_config spells out
    shown_values["data.partition_params"] = resolved_partition_params(
        keys["data.partition"], shown_values["data.partition_params"] or {})
    wrong = {option: f"help says {shown[option]}, --print_config {keys[option]}"
             for option, default in shown_values.items() if default != as_lists(keys[option])}
    assert not wrong


def test_a_kept_help_is_not_read_after_the_default_config_changes(monkeypatch):
    """The help's defaults come from ``configs/default.yaml``: the name the help is kept under
    changes with the file (its size and modification time, as for every file of the package), so
    a text kept before an edit is never printed after it."""
    before = cli.fit_help_file("model-FedLF")
    stat = Path.stat

    def edited(path, *args, **kwargs):
        real = stat(path, *args, **kwargs)
        if path != DEFAULT_CONFIG:
            return real
        return SimpleNamespace(st_size=real.st_size, st_mtime_ns=real.st_mtime_ns + 1, st_mode=real.st_mode)

    monkeypatch.setattr(Path, "stat", edited)
    assert cli.fit_help_file("model-FedLF") != before
