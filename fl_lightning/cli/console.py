"""``fl-lightning``: the console script (``fl-lightning fit --config X.yaml``).

The one command, ``fit``, is LightningCLI's (:mod:`fl_lightning.cli.lightning_cli`: the algorithm
by class name, ``--model FedProx``; the data by source/partition names; the backbone by
registered model name; anything overridable on the command line). Without ``--config`` the
embedded default runs (``configs/default.yaml``: FedAvg on the offline mnist5k digits) and logs
to the local MLflow store ``sqlite:///mlruns.db``.

``fl-lightning``, ``fl-lightning --help`` and ``-h`` are answered here, without importing
torch or Lightning (which take seconds to import): the commands, how to see each part's
settings, and the registered algorithms, models, sources and partitions by name (the
algorithms from their registry, the others from the lists below, which
``tests/fl_lightning/cli/test_startup.py`` keeps equal to their registries).
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import sys
import threading
import warnings
from pathlib import Path
from typing import Any

from fl_lightning.algorithms.registry import algorithm_names
from fl_lightning.choices import unknown_algorithm, unknown_algorithm_message
from fl_lightning.cli.command_line import read_command_line
from fl_lightning.configs import DEFAULT_CONFIG
from fl_lightning.records.errors import did_you_mean
from fl_lightning.records.vocabulary import DEFAULT_TRACKING_URI

HELP_FLAGS = ("-h", "--help")

ALGORITHM_NAMES = algorithm_names()  # the registry's own list, read without importing torch
# the other registries' names, in their registration order (tests/fl_lightning/cli/test_startup.py compares them)
MODEL_NAMES = (
    "fl_cct_7_3x1", "fl_cnn_cifar", "fl_cnn_femnist", "fl_cnn_mnist", "fl_ffn", "fl_logreg", "fl_lstm_chars",
    "fl_mlp", "fl_nf_resnet18", "fl_nf_resnet18_fedlf", "fl_nf_resnet18_standard", "fl_text_cnn",
)
SOURCE_NAMES = (
    "adult", "cifar10", "cifar100", "digits", "emnist", "fashion_mnist", "femnist", "mnist", "mnist5k", "mr",
    "pydoc_chars", "pydoc_sentences", "shakespeare", "sst", "synthetic",
)
PARTITION_NAMES = (
    "iid", "dirichlet", "pathological", "shards", "power_law", "linspace_classes", "class_assignment", "natural",
)


def _wrapped(names: tuple[str, ...], indent: str = "    ", width: int = 96) -> str:
    lines, line = [], indent
    for name in names:
        if len(line) + len(name) + 2 > width and line.strip():
            lines.append(line.rstrip())
            line = indent
        line += name + ", "
    lines.append(line.rstrip(", "))
    return "\n".join(lines)


def top_level_help() -> str:
    """What ``fl-lightning --help`` prints: the commands, where each part's settings are listed,
    the registered names, and the default config."""
    default = DEFAULT_CONFIG.read_text().rstrip()
    return f"""usage: fl-lightning fit [--config RUN.yaml] [--model ALGORITHM] [--model.SETTING VALUE]
                       [--data.SETTING VALUE] [--trainer.SETTING VALUE] [--seed_everything N]
                       [--ckpt_path CHECKPOINT]

Fair federated learning on PyTorch Lightning: trains an algorithm on simulated clients,
evaluates every client every --model.eval_every rounds and after the last, and logs to
MLflow ({DEFAULT_TRACKING_URI} unless --trainer.logger.init_args.tracking_uri says otherwise).

commands:
  fit                 run a federated training (LightningCLI: every setting can come from
                      --config files and the command line)
  replay RUN          fit a stored run again from its logged settings and compare every
                      metric of every round (fl-lightning replay --help)

settings, and where to see them:
  fl-lightning fit --help                   every setting of fit: --data.*, --trainer.*,
                                            --seed_everything, --ckpt_path
  fl-lightning fit --model.help FedLF       one algorithm's settings (--model.*), each with
                                            the default a fit of it gets
  fl-lightning fit --print_config           the resolved config: the default below plus
                                            your --config files and settings
  fl-lightning fit --ckpt_path .../last.ckpt  resume a stopped fit (in its MLflow run)

algorithms (--model NAME):
{_wrapped(ALGORITHM_NAMES)}
models (--model.backbone NAME):
{_wrapped(MODEL_NAMES)}
data sources (--data.source NAME):
{_wrapped(SOURCE_NAMES)}
partitions (--data.partition NAME):
{_wrapped(PARTITION_NAMES)}

default config ({DEFAULT_CONFIG}), used when no --config is given:
{default}
"""


FIT_HELP = (["fit", "--help"], ["fit", "-h"])
HELP_LIBRARIES = ("lightning", "jsonargparse", "torch", "timm", "torchmetrics")


def model_help_name(command_args: list[str]) -> str | None:
    """The algorithm of ``fit --model.help <Name>`` (alone on the command line), else None."""
    if len(command_args) == 3 and command_args[:2] == ["fit", "--model.help"]:
        return command_args[2]
    if len(command_args) == 2 and command_args[0] == "fit" and command_args[1].startswith("--model.help="):
        return command_args[1].split("=", 1)[1]
    return None


def kept_help(command_args: list[str]) -> str | None:
    """The name a help text of ``command_args`` is kept under: ``fit`` for ``fit --help``,
    ``model-<Name>`` for ``fit --model.help <Name>`` of a built-in algorithm (a user's own class
    is not kept: its module can change without this package changing); None for anything else."""
    if command_args in FIT_HELP:
        return "fit"
    name = (model_help_name(command_args) or "").removeprefix("fl_lightning.algorithms.")
    return f"model-{name}" if name in ALGORITHM_NAMES else None


def fit_help_file(kept: str = "fit") -> Path:
    """Where the help text ``kept`` (:func:`kept_help`) of this installation, at this terminal
    width, is kept: named by a digest of Python, the program's name, the libraries that write the
    help, and the size and modification time of every file of this package (an edit makes a new one)."""
    import hashlib
    import shutil
    from importlib import metadata

    from fl_lightning.cache import cache_dir

    program = read_command_line().program  # the help's "usage: <program>"
    digest = hashlib.sha1(f"{sys.version}|{sys.executable}|{program}|{shutil.get_terminal_size().columns}".encode())
    for name in HELP_LIBRARIES:
        try:
            digest.update(f"{name}={metadata.version(name)}".encode())
        except metadata.PackageNotFoundError:
            continue
    package = Path(__file__).parents[1]  # every file of fl_lightning, not only of this folder
    for path in sorted(package.rglob("*.py")) + sorted(package.rglob("*.yaml")):
        stat = path.stat()
        digest.update(f"{path.relative_to(package)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return cache_dir() / "help" / f"{kept}-{digest.hexdigest()[:16]}.txt"


def _help_file(kept: str = "fit") -> Path | None:
    try:
        return fit_help_file(kept)
    except (OSError, RuntimeError, ValueError):  # no home folder to hold a cache
        return None


def leave_now() -> None:
    """The end of the console script after a finished fit: what the exit would wait for is waited
    for (threads still running, then the exit handlers: MLflow's, logging's flush), and the process
    ends without the interpreter's teardown, which on a CUDA build of torch (where the objects
    cannot be frozen, see ``freeze_unless_nanobind``) collects every object the imports made live:
    1.8 s of silence after ``Done:`` on an idle 2-core EPYC, 5-12 s on a loaded one."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def freeze_unless_nanobind() -> None:
    """:func:`gc.freeze`, unless triton is loaded (the CUDA builds of torch import it with
    Lightning): its nanobind bindings report every object still alive at exit as "leaked", 30
    lines on stderr after the one line of a refusal, and a frozen object is never collected. Such
    an install pays the interpreter's final collections instead (a few seconds at exit)."""
    if "triton" in sys.modules:
        gc.unfreeze()  # what an earlier call froze
        return
    gc.freeze()


def quietly_imported_run() -> Any:
    """``lightning_cli.run``, imported with the warnings of the third parties it imports silenced
    (pynvml's deprecation under ``torch.cuda``, common on GPU machines): not the user's business,
    and a refusal stays one line."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import_holding_ctrl_c("torch")  # lightning_cli imports torch first
        from fl_lightning.cli.lightning_cli import run
    return run


def import_holding_ctrl_c(module: str) -> None:
    """Import ``module`` with Ctrl-C held back, and deliver a held one right after. torch 2.4's C
    extension swallows a KeyboardInterrupt raised while it initialises, so a Ctrl-C in that second
    went unnoticed and the fit ran on. Held (POSIX ``pthread_sigmask``), the signal waits for the
    import to end and then interrupts as usual. Without ``pthread_sigmask``, off the main thread,
    or when ``module`` is already imported, this is a plain import."""
    import importlib

    if module in sys.modules or not hasattr(signal, "pthread_sigmask") \
            or threading.current_thread() is not threading.main_thread():
        importlib.import_module(module)
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        importlib.import_module(module)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # a held Ctrl-C is raised here


def _written_fit_help(words: list[str]) -> tuple[str, int | str | None]:
    """LightningCLI's help text for the command line ``words`` and its exit code."""
    import contextlib
    import io

    run = quietly_imported_run()
    buffer, code = io.StringIO(), None
    try:
        with contextlib.redirect_stdout(buffer):
            run(words)
    except SystemExit as exit_:
        code = exit_.code
    return buffer.getvalue(), code


def _keep(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(text)
        partial.replace(path)  # whole or not at all, whatever else writes it
    except OSError:
        pass


def print_fit_help(words: list[str], kept: str = "fit") -> None:
    """``fl-lightning fit --help`` (or ``fit --model.help <Name>``: ``kept``): LightningCLI's text,
    kept in the cache the first time (it takes seconds: torch and Lightning are imported to write
    it) and printed from there afterwards."""
    path = _help_file(kept)
    if path is not None and path.is_file():
        try:
            print(path.read_text(), end="")
            return
        except OSError:
            pass
    text, code = _written_fit_help(words)
    print(text, end="")
    if code not in (0, None):
        raise SystemExit(code)
    if path is not None and text:
        _keep(path, text)


def keep_fit_help_after_fit() -> None:
    """After a fit of the console script, with torch and Lightning imported already: write the
    ``fit --help`` text if it is not kept yet (0.1-0.2 s), so that the first ``fit --help`` after
    an install or an edit is as quick as the later ones. Never fails the fit."""
    path = _help_file()
    if path is None or path.is_file():
        return
    try:
        text, code = _written_fit_help(["fit", "--help"])
    except Exception:  # a help text not kept must not turn a finished fit into a failure
        return
    if code in (0, None) and text:
        _keep(path, text)


def refusal(command_args: list[str]) -> str | None:
    """Why a command line is refused before torch and Lightning load (LightningCLI would say the
    same, seconds later), None when it is not: ``--model.help`` of an unknown algorithm, ``fit``
    with an unknown ``--model``, or the retired ``--threads``."""
    asked = model_help_name(command_args)
    # a class path is LightningCLI's to check
    if asked is not None and "." not in asked and asked not in ALGORITHM_NAMES:
        return (f"--model.help {asked}: no such algorithm{did_you_mean(asked, list(ALGORITHM_NAMES))} "
                f"(the algorithms: {', '.join(ALGORITHM_NAMES)})")
    if command_args[0] != "fit":
        return None
    unknown = unknown_algorithm(command_args, ALGORITHM_NAMES)
    if unknown is not None:
        return unknown_algorithm_message(unknown, ALGORITHM_NAMES)
    if any(arg == "--threads" or arg.startswith("--threads=") for arg in command_args):
        return ("--threads is now the run's own setting --model.threads N (default auto: the cores the fit "
                "is given): the thread count changes a run's numbers, so it is fixed when the fit starts, logged "
                "and kept on resume")
    return None


def run_command(command_args: list[str], exits_after: bool) -> None:
    """Hand the command to LightningCLI (:func:`fl_lightning.cli.lightning_cli.run`). ``exits_after``
    (the console script, whose process ends with the fit): a Ctrl-C while starting is one line and
    exit 130, the garbage collector is frozen after the imports and after the fit, the ``fit --help``
    text is kept, and the process leaves without the interpreter's teardown."""
    try:
        run = quietly_imported_run()
    except KeyboardInterrupt:  # Ctrl-C while torch and Lightning load: nothing began, nothing to report
        if not exits_after:
            raise
        print("interrupted (SIGINT) while starting: nothing was created", file=sys.stderr)
        raise SystemExit(130) from None
    if exits_after:
        freeze_unless_nanobind()  # the ~600k objects the imports made live to the end: no collection walks them again
    try:
        run(command_args)
    except KeyboardInterrupt:  # Ctrl-C before the fit's own handling began (the data being built)
        if not exits_after:
            raise
        print("interrupted (SIGINT) before the fit began", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        if exits_after:  # skip the interpreter's final collections of everything (2-3 s at exit)
            freeze_unless_nanobind()
    if exits_after and command_args[0] == "fit":
        keep_fit_help_after_fit()
    if exits_after:
        leave_now()


def main(args: list[str] | None = None) -> None:
    """The ``fl-lightning`` console script (``args`` lets tests call it in-process).

    The top-level help (no arguments, ``-h``, ``--help``), the kept ``fit --help`` texts and the
    refusals that need no torch (:func:`refusal`) are answered here; ``replay`` goes to
    :mod:`fl_lightning.cli.replay`, everything else to LightningCLI (:func:`run_command`). As the
    console script (``args=None``) it freezes the garbage collector's view of the objects made so
    far (:func:`gc.freeze`, the CPython API for long-lived processes; not with triton loaded) after
    the imports and after the fit: Python's exit would otherwise spend seconds collecting the
    objects torch and Lightning made. Called in-process (``args`` given), nothing is frozen."""
    line = read_command_line(args)  # the one read of sys.argv: the rest takes these words
    command_args = list(line.words)
    if not command_args or command_args[0] in HELP_FLAGS:
        print(top_level_help(), end="")
        if not command_args:  # a command is required: say which, exit 2 as argparse does
            print("error: no command given; the commands are `fit` and `replay` (fl-lightning --help)", file=sys.stderr)
            raise SystemExit(2)
        return
    refused = refusal(command_args)
    if refused is not None:  # refused in a blink, before torch and Lightning load
        print(f"error: {refused}", file=sys.stderr)
        raise SystemExit(2)
    kept = kept_help(command_args)
    if kept is not None:  # after the first time, without importing torch or Lightning
        print_fit_help(command_args, kept)
        raise SystemExit(0)  # as argparse's help does
    if command_args[0] == "replay":  # a stored run fitted again from its logged settings, and checked
        from fl_lightning.cli.replay import main as replay

        raise SystemExit(replay(command_args[1:]))
    run_command(command_args, exits_after=line.from_process)


if __name__ == "__main__":
    main()
