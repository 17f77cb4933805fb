"""Start-up: the top-level help imports no torch/Lightning, and its names are the registries'."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from fl_lightning import cli

HEAVY = ("torch", "lightning", "mlflow", "numpy", "matplotlib", "timm", "torchvision", "scipy")
PROBE = """
import json, sys
from fl_lightning.cli import main
try:
    main({args!r})
except SystemExit as exit:
    code = exit.code
else:
    code = 0
heavy = sorted({{name.split(".")[0] for name in sys.modules}} & set({heavy!r}))
print("\\n" + json.dumps({{"code": code, "heavy": heavy}}))
"""


def run_main(args: list[str]) -> tuple[str, dict]:
    script = PROBE.format(args=args, heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [["--help"], ["-h"], []])
def test_top_level_help_imports_no_heavy_module(args):
    out, result = run_main(args)
    assert result["heavy"] == [], f"the top-level help imported {result['heavy']}"
    assert result["code"] == (2 if not args else 0)
    assert "fl-lightning fit --help" in out and "--model.help FedLF" in out
    assert "FedFV" in out and "fl_mlp" in out and "mnist5k" in out and "dirichlet" in out
    assert "class_path: fl_lightning.algorithms.FedAvg" in out  # the default config


def test_listed_names_are_the_registries():
    from fl_lightning.algorithms import ALGORITHMS
    from fl_lightning.data import PARTITIONERS, list_sources
    from fl_lightning.models import list_fl_models

    assert list(cli.ALGORITHM_NAMES) == list(ALGORITHMS)
    assert list(cli.MODEL_NAMES) == list_fl_models()
    assert list(cli.SOURCE_NAMES) == list_sources()
    assert list(cli.PARTITION_NAMES) == list(PARTITIONERS)


def test_every_listed_name_is_in_the_help():
    text = cli.top_level_help()
    for name in cli.ALGORITHM_NAMES + cli.MODEL_NAMES + cli.SOURCE_NAMES + cli.PARTITION_NAMES:
        assert f" {name}," in text or f" {name}\n" in text, name


def test_the_console_script_leaves_the_wiring_to_lightning_cli():
    """``fl_lightning.cli`` holds the console script only: the LightningCLI wiring's names are
    ``fl_lightning.lightning_cli``'s, which cli.py imports only when a command runs."""
    from fl_lightning.lightning_cli import FederatedCLI, trainer_defaults

    assert FederatedCLI.__name__ == "FederatedCLI" and callable(trainer_defaults)
    assert not hasattr(cli, "FederatedCLI") and not hasattr(cli, "__getattr__")


def test_a_command_goes_to_lightning_cli(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["validate"])
    assert exit.value.code == 2
    assert "not a command here" in capsys.readouterr().err


def test_only_the_console_script_freezes_the_collector(capsys):
    """``main()`` (the console script) freezes the objects made by its imports and its fit
    (gc.freeze: no collection walks them again, nor the exit); ``main(args)`` in-process does not."""
    import gc

    frozen = gc.get_freeze_count()
    with pytest.raises(SystemExit):
        cli.main(["validate"])
    assert gc.get_freeze_count() == frozen
    script = ("import gc, sys\nsys.argv = ['fl-lightning', 'validate']\nfrom fl_lightning.cli import main\n"
              "try:\n    main()\nexcept SystemExit:\n    print(gc.get_freeze_count())")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert int(done.stdout.split()[-1]) > 100_000, done.stderr
