"""Start-up: the top-level help imports no torch/Lightning, and its names are the registries'."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fl_lightning.cli import console as cli
from tests.paths import REPO

ROOT = REPO
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


@pytest.mark.parametrize("args", [["fit", "--model", "FedAvgg"], ["fit", "--model=fedlf", "--trainer.max_epochs", "3"]])
def test_an_unknown_algorithm_is_refused_before_torch_loads(args):
    """The refusal LightningCLI would give (same line, exit 2), without importing any heavy module."""
    done = subprocess.run([sys.executable, "-c", PROBE.format(args=args, heavy=HEAVY)], capture_output=True,
                          text=True, timeout=60)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"code": 2, "heavy": []}
    name = args[1].split("=")[1] if "=" in args[1] else args[2]
    assert done.stderr.startswith(f"error: unknown algorithm {name!r}; valid: AFL, CFFL, CGSV")
    assert "did you mean 'FedAvg'" in done.stderr or "did you mean 'FedLF'" in done.stderr


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
    ``fl_lightning.cli.lightning_cli``'s, which the console script imports only when a command runs."""
    from fl_lightning.cli.lightning_cli import FederatedCLI, trainer_defaults

    assert FederatedCLI.__name__ == "FederatedCLI" and callable(trainer_defaults)
    assert not hasattr(cli, "FederatedCLI") and not hasattr(cli, "__getattr__")


def test_a_command_goes_to_lightning_cli(capsys):
    with pytest.raises(SystemExit) as exit:
        cli.main(["validate"])
    assert exit.value.code == 2
    assert "not a command here" in capsys.readouterr().err


@pytest.mark.slow
def test_only_the_console_script_freezes_the_collector(capsys):
    """``main()`` (the console script) freezes the objects made by its imports and its fit
    (gc.freeze: no collection walks them again, nor the exit); ``main(args)`` in-process does not."""
    import gc

    frozen = gc.get_freeze_count()
    with pytest.raises(SystemExit):
        cli.main(["validate"])
    assert gc.get_freeze_count() == frozen
    script = ("import gc, sys\nsys.argv = ['fl-lightning', 'validate']\nfrom fl_lightning.cli import main\n"
              "try:\n    main()\nexcept SystemExit:\n    print(gc.get_freeze_count(), 'triton' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    frozen, triton = done.stdout.split()[-2:]
    # with triton loaded nothing stays frozen: its nanobind bindings would report every frozen
    # object as leaked at exit, 30 lines after a refusal's one
    assert (int(frozen) == 0) if triton == "True" else (int(frozen) > 100_000), done.stderr
    assert "nanobind" not in done.stderr, done.stderr


FIT_HELP_PROBE = """
import sys
from fl_lightning.cli import main
try:
    main(["fit", "--help"])
except SystemExit as exit_:
    assert exit_.code == 0
print("TORCH_IMPORTED", "torch" in sys.modules)
"""


@pytest.mark.slow
def test_fit_help_is_written_once_then_printed_without_torch(tmp_path):
    """Issue 24: ``fl-lightning fit --help`` needs torch and Lightning to write (seconds); the
    text is kept in the cache, so the next call prints the same text without importing them."""
    env = {**__import__("os").environ, "FL_LIGHTNING_CACHE": str(tmp_path), "COLUMNS": "100"}
    first, second = (subprocess.run([sys.executable, "-c", FIT_HELP_PROBE], capture_output=True, text=True, env=env)
                     for _ in range(2))
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert "TORCH_IMPORTED True" in first.stdout and "TORCH_IMPORTED False" in second.stdout
    assert first.stdout.rsplit("TORCH_IMPORTED", 1)[0] == second.stdout.rsplit("TORCH_IMPORTED", 1)[0]
    assert "--model.init_args.num_rounds" in second.stdout or "--model" in second.stdout
    kept = list((tmp_path / "help").glob("fit-*.txt"))
    assert len(kept) == 1
    script = "from fl_lightning.cli.console import fit_help_file; print(fit_help_file())"
    wider = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                           env={**env, "COLUMNS": "160"})
    assert wider.stdout.strip() != str(kept[0])  # another terminal width: another text


FIT_THEN_EXIT = """
import sys
sys.argv = ["fl-lightning", "fit", "--model.num_rounds=1", "--model.backbone=fl_logreg", "--data.source=digits",
            "--data.num_clients=4", "--trainer.logger=false", "--trainer.enable_checkpointing=false",
            "--trainer.enable_progress_bar=false"]
from fl_lightning.cli import main
main()
"""


@pytest.mark.slow
def test_a_fit_of_the_console_script_keeps_the_fit_help(tmp_path):
    """The first ``fit --help`` after an install needs torch and Lightning (seconds); a fit has
    them imported already, so it writes the text at its end and that first call is quick too."""
    env = {**__import__("os").environ, "FL_LIGHTNING_CACHE": str(tmp_path), "COLUMNS": "100"}
    fit = subprocess.run([sys.executable, "-c", FIT_THEN_EXIT], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert fit.returncode == 0, fit.stderr[-2000:]
    assert "LightningCLI's args parameter" not in fit.stderr  # the help is written as the console script writes it
    kept = list((tmp_path / "help").glob("fit-*.txt"))
    assert len(kept) == 1 and "--model" in kept[0].read_text()
    probe = FIT_HELP_PROBE.replace('main(["fit", "--help"])', 'sys.argv = ["fl-lightning", "fit", "--help"]; main()')
    help_ = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120,
                           cwd=tmp_path)  # as the fit: the installed package, not a checkout in the working directory
    assert "TORCH_IMPORTED False" in help_.stdout, help_.stderr
    assert help_.stdout.rsplit("TORCH_IMPORTED", 1)[0] == kept[0].read_text()
    fresh = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                           env={**env, "FL_LIGHTNING_CACHE": str(tmp_path / "fresh")})
    assert "TORCH_IMPORTED True" in fresh.stdout, fresh.stderr  # written from scratch: the same text
    assert fresh.stdout.rsplit("TORCH_IMPORTED", 1)[0] == kept[0].read_text()


def test_the_help_states_each_settings_rule(capsys):
    """jsonargparse reads signatures without ``Annotated``'s metadata (its help says ``float``):
    each constrained setting's help ends with the rule its type states, in the errors' words."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["fit", "--model.help", "FedLF"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # the help is wrapped: one line of words
    assert "the paper's 0.999 per round. Must be in (0, 1] (the paper: 0.999). (type: float" in text
    assert "Must be in (0, 1] (1.0 = full participation)" in text  # fraction, from FederatedModule's signature
    assert "--model.qp_solver {batched,cvxopt}" in text and "Must be batched" not in text  # choices: listed already


BLOCK_TORCH = """
import importlib, pkgutil, sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)")
sys.meta_path.insert(0, Blocked())
import leaderboard
for module in pkgutil.walk_packages(leaderboard.__path__, "leaderboard."):
    importlib.import_module(module.name)
print("ok")
"""


def test_the_leaderboard_imports_without_torch():
    """The leaderboard is built where no PyTorch is installed (tox env ``browser``, a docs
    machine): none of its modules, nor the library modules they read, may import torch,
    Lightning, timm or torchvision at import time."""
    script = BLOCK_TORCH.format(blocked=("torch", "lightning", "timm", "torchvision", "torchmetrics"))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=str(ROOT))
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


PAUSED_FIT = """
import importlib.machinery, sys, time

def pause(*args, **kwargs):  # the test's Ctrl-C lands here, at a known point of the start
    print("PAUSED", file=sys.stderr, flush=True)
    time.sleep(120)

class PauseAt:
    def find_spec(self, name, path=None, target=None):
        if {phase!r} == "loading" and name == "lightning":  # after torch, while Lightning loads
            pause()
        if {phase!r} == "data" and name == "fl_lightning.data.datamodule":  # when the data is built
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            execute = spec.loader.exec_module
            def exec_module(module):
                execute(module)
                module.FederatedDataModule.setup = pause
            spec.loader.exec_module = exec_module
            return spec
        return None

sys.meta_path.insert(0, PauseAt())
sys.argv = ["fl-lightning", "fit", "--model.num_rounds", "2"]
from fl_lightning.cli import main
main()
"""


@pytest.mark.parametrize(("phase", "line"), [("loading", "interrupted (SIGINT) while starting: nothing was created"),
                                             ("data", "interrupted (SIGINT) before the fit began")])
def test_ctrl_c_while_starting_is_one_line_and_exit_130(phase, line, tmp_path):
    """Ctrl-C while torch and Lightning load, or while the data is built: one line, status 130,
    no traceback, and no store or checkpoint folder. The signal is sent when the fit reaches that
    point (it pauses there), not after a fixed time: a fast machine had begun the fit by then."""
    import signal

    fit = subprocess.Popen([sys.executable, "-c", PAUSED_FIT.format(phase=phase)], cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)},
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    before, said = [], ""
    for said in fit.stderr:  # ends at the pause, or when the process ends without reaching it
        if said.strip() == "PAUSED":
            break
        before.append(said)
    fit.send_signal(signal.SIGINT)
    out, err = fit.communicate(timeout=120)
    assert said.strip() == "PAUSED", "".join(before)[-2000:]
    # 130, or death by SIGINT itself after the line (seen now and then, cause not found): a shell
    # reports both as exit status 130
    assert fit.returncode in (130, -signal.SIGINT), err[-2000:]
    assert "Traceback" not in out + err and line in err, err[-2000:]
    assert sorted(path.name for path in tmp_path.iterdir()) == []


MODEL_HELP_PROBE = """
import sys
from fl_lightning.cli import main
try:
    main(["fit", "--model.help", "{name}"])
except SystemExit as exit_:
    print("EXIT", exit_.code)
print("TORCH_IMPORTED", "torch" in sys.modules)
"""


@pytest.mark.slow
def test_model_help_of_a_builtin_algorithm_is_kept_like_the_fit_help(tmp_path):
    """``fit --model.help FedLF`` is written once (torch and Lightning imported), then printed
    from the cache without them; a user's own class, or a mistyped name, is never kept."""
    env = {**__import__("os").environ, "FL_LIGHTNING_CACHE": str(tmp_path), "COLUMNS": "100"}
    runs = [
        subprocess.run(
            [sys.executable, "-c", MODEL_HELP_PROBE.format(name=name)],
            capture_output=True,
            text=True,
            env=env,
            timeout=180,
        )
        for name in ("FedLF", "FedLF", "fl_lightning.algorithms.FedLF", "FedLFX")
    ]
    first, second, by_path, typo = (run.stdout for run in runs)
    assert "EXIT 0" in first and "TORCH_IMPORTED True" in first and "--model.server_lr_decay" in first
    assert "TORCH_IMPORTED False" in second and "TORCH_IMPORTED False" in by_path
    assert first.split("EXIT")[0] == second.split("EXIT")[0] == by_path.split("EXIT")[0]
    assert "EXIT 2" in typo and "TORCH_IMPORTED False" in typo  # refused at once, with a did-you-mean
    assert "error: --model.help FedLFX: no such algorithm; did you mean 'FedLF'" in runs[3].stderr
    assert [path.name.split("-")[0] + "-" + path.name.split("-")[1] for path in (tmp_path / "help").iterdir()] == [
        "model-FedLF"]


def test_the_command_line_is_read_in_one_place():
    """Only ``fl_lightning.cli.command_line`` reads ``sys.argv``: the console script, LightningCLI's
    subclass, the settings reader and ``replay`` take the words it read (issue 52: the command line
    was re-read by 14 functions, and ``replay`` had to swap ``sys.argv`` around its fit)."""
    import ast

    root = REPO / "fl_lightning"
    readers = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "argv" \
                    and isinstance(node.value, ast.Name) and node.value.id == "sys":
                readers.add(path.relative_to(root).as_posix())
    assert readers == {"cli/command_line.py"}


def test_words_given_in_process_win_over_the_process_command_line(monkeypatch):
    from fl_lightning.cli.command_line import read_command_line

    monkeypatch.setattr(sys, "argv", ["/venv/bin/fl-lightning", "fit", "--model", "NoSuch"])
    given = read_command_line(["fit", "--help"])
    assert (given.program, given.words, given.from_process) == ("fl-lightning", ("fit", "--help"), False)
    own = read_command_line()
    assert (own.words, own.from_process) == (("fit", "--model", "NoSuch"), True)
    monkeypatch.setattr(sys, "argv", [""])
    assert read_command_line().words == () and read_command_line().program == ""
