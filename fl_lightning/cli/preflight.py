"""Checks a fit's configuration can pass before anything is created (no MLflow run, no
checkpoint directory): the seed, the accelerator, the checkpoint to resume from and the
tracking store. Each failure is a ``PreflightError`` whose message says what is wrong and
what to change; the CLI prints it as one line. Torch is imported only by the checks that need
it: the leaderboard (which needs no torch) reads stored runs through ``fit_lock``, which
raises ``PreflightError``."""

from __future__ import annotations

import copy
import os
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from fl_lightning.records.errors import PreflightError, first_line
from fl_lightning.records.read_only_store import held_by_another_process
from fl_lightning.records.store_probe import MLFLOW_TABLES, server_port, unreachable
from fl_lightning.records.store_uri import file_store_folder, sqlite_file, store_scheme

FL_CHECKPOINT_KEYS = ("state_dict", "epoch", "hyper_parameters")


def check_seed(seed: Any) -> None:
    """``seed_everything``: an integer in [0, 2**32) (or true: a random one; false: none)."""
    if isinstance(seed, bool) or seed is None:
        return
    if not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise PreflightError(f"seed_everything must be an integer in [0, 2**32), got {seed!r}: "
                             "pass e.g. --seed_everything 0")


def check_accelerator(accelerator: Any, devices: Any = "auto") -> None:
    """A GPU accelerator needs a GPU this process can see."""
    import torch

    name = accelerator.lower() if isinstance(accelerator, str) else ""
    if name in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise PreflightError(f"--trainer.accelerator {accelerator} asks for a GPU, but this machine has none that "
                                 "torch can use: pass --trainer.accelerator cpu (or auto)")
        wanted = devices if isinstance(devices, int) else len(devices) if isinstance(devices, list) else 0
        if wanted > torch.cuda.device_count():
            raise PreflightError(f"--trainer.devices {devices} asks for {wanted} GPUs, this machine has "
                                 f"{torch.cuda.device_count()}: pass --trainer.devices {torch.cuda.device_count()}")
    if name == "mps" and not torch.backends.mps.is_available():
        raise PreflightError("--trainer.accelerator mps needs Apple's Metal backend, which this machine lacks: "
                             "pass --trainer.accelerator cpu (or auto)")


def check_checkpoint(path: str | None) -> dict[str, Any] | None:
    """``--ckpt_path``: an existing fl-lightning checkpoint, read without unpickling anything
    but tensors and plain values (``torch.load(weights_only=True)``); returned (memory-mapped)."""
    import torch

    if path is None or path in ("last", "best", "hpc", "registry"):
        return None
    file = Path(path)
    if not file.is_file():
        raise PreflightError(f"--ckpt_path {path}: no such file. A run's checkpoints are under "
                             "checkpoints/<experiment id>/<run id>/checkpoints/ (last.ckpt is the latest); "
                             "leave --ckpt_path out to start a new run")
    if not zipfile.is_zipfile(file):
        raise PreflightError(f"--ckpt_path {path} is not a checkpoint (not a torch archive: corrupted or another "
                             "kind of file); resume from the run's last.ckpt, or leave --ckpt_path out")
    try:
        checkpoint = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # noqa: BLE001 - any failure to read it is the file's fault here
        reason = first_line(error)[:160]
        raise PreflightError(f"--ckpt_path {path} cannot be read as an fl-lightning checkpoint ({reason}); it is "
                             "corrupted or was not written by fl-lightning: resume from the run's last.ckpt, "
                             "or leave --ckpt_path out") from None
    missing = [key for key in FL_CHECKPOINT_KEYS if key not in checkpoint]
    if missing:
        raise PreflightError(f"--ckpt_path {path} is not an fl-lightning checkpoint (it has no {', '.join(missing)}): "
                             "resume from a last.ckpt that fl-lightning fit wrote")
    check_lightning_version(path, checkpoint)
    return checkpoint


def check_lightning_version(path: str, checkpoint: Mapping[str, Any]) -> None:
    """The Trainer can resume ``checkpoint``: it names the Lightning that wrote it, and this
    Lightning's migrations (what ``Trainer.fit(ckpt_path=...)`` applies) run on it, tried on a copy
    here so that a refusal comes before any run or file is touched."""
    import lightning.pytorch as pl
    from lightning.pytorch.utilities.migration import migrate_checkpoint

    version = checkpoint.get("pytorch-lightning_version")
    if not isinstance(version, str) or not version.strip():
        raise PreflightError(
            f"--ckpt_path {path} does not say which Lightning wrote it (no 'pytorch-lightning_version'): "
            "it was not written by a Lightning Trainer or was edited; resume from the run's last.ckpt "
            "as fl-lightning fit wrote it, or leave --ckpt_path out"
        )
    # the migrations rewrite the loops' and callbacks' entries, never the weights: those stay shared
    # (memory-mapped, unread) instead of a deep copy of every tensor of a large run's history
    trial = {key: value if key == "state_dict" else copy.deepcopy(value) for key, value in checkpoint.items()}
    try:
        migrate_checkpoint(trial)
    except Exception as error:  # noqa: BLE001 - whatever the migration trips on, the file cannot be resumed here
        raise PreflightError(f"--ckpt_path {path} was written by Lightning {version}, and Lightning {pl.__version__} "
                             f"cannot resume it ({type(error).__name__}: {str(error).strip()[:120]}); resume it with "
                             f"Lightning {version}, or leave --ckpt_path out to start a new run") from None


def check_tracking_store(uri: str) -> None:
    """The MLflow store can be reached: a tracking server answers within
    ``store_probe.REACH_TIMEOUT_S``; a SQLite or file store can be created or written where it is
    (:func:`check_store_folder`)."""
    scheme = store_scheme(uri)
    if scheme in ("http", "https"):
        reason = unreachable(uri)
        if reason is not None:
            raise PreflightError(f"cannot reach the MLflow tracking server {uri} ({reason}): start it "
                                 f"(mlflow server --port {server_port(uri)}) or log to a local store with "
                                 "--trainer.logger.init_args.tracking_uri sqlite:///mlruns.db")
    elif scheme == "sqlite":
        database = sqlite_file(uri)
        if database is not None:
            check_store_folder(uri, database.parent, database)
    elif scheme in ("", "file"):
        folder = file_store_folder(uri)
        if folder is not None:
            check_store_folder(uri, folder.parent)


def first_existing_ancestor(path: Path) -> Path:
    """The nearest of ``path``'s parents (or itself) that exists."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def check_store_folder(uri: str, folder: Path, database: Path | None = None) -> None:
    """A local store's ``folder`` exists, is a folder, and can hold a new file (probed with a
    temporary file, removed at once: SQLite and MLflow would otherwise retry for minutes on a
    folder such as ``/proc`` that exists but takes no files); an existing ``database`` is writable."""
    option = "--trainer.logger.init_args.tracking_uri"
    if not folder.is_dir():
        found = first_existing_ancestor(folder)
        if found.exists() and not found.is_dir():
            raise PreflightError(f"the MLflow store {uri} cannot be created: {found} is a file, not a folder; "
                                 f"pass another {option}")
        raise PreflightError(f"the folder of the MLflow store {uri} does not exist ({folder}): create it, or "
                             f"pass another {option}")
    if database is not None and database.exists():
        if database.is_dir():
            raise PreflightError(f"the MLflow store {uri} names a folder ({database}), not a database file: "
                                 f"pass a file name, e.g. {option} sqlite:///{database / 'mlruns.db'}")
        if not os.access(database, os.R_OK | os.W_OK):
            raise PreflightError(f"the MLflow store {uri} cannot be written ({database} is read-only): "
                                 f"make it writable, or pass another {option}")
        check_sqlite_store(uri, database)
        return
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".fl-lightning-probe-"):
            pass
    except OSError as error:
        raise PreflightError(f"the MLflow store {uri} cannot be created: the folder {folder} takes no new files "
                             f"({error.strerror or error}); pass another {option}") from None


STORE_LOCK_WAIT_S = 60.0  # how long a fit waits for a SQLite store another process holds locked


def check_sqlite_store(uri: str, database: Path, option: str = "--trainer.logger.init_args.tracking_uri") -> None:
    """An existing SQLite store is a whole MLflow store (one line for a corrupt or half-made
    file: it is left as it is) and no other process holds it locked: waited for up to
    ``STORE_LOCK_WAIT_S``, with one line when the wait starts and one if it gives up. ``option``:
    the command-line option that names the store, for the messages."""
    import sqlite3
    import sys
    import time

    connection = sqlite3.connect(f"file:{database}?mode=rw", uri=True, timeout=0, isolation_level=None)
    try:
        try:
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as error:
            if held_by_another_process(error):
                tables = set(MLFLOW_TABLES)  # readable once the lock goes: the wait below
            else:
                raise PreflightError(f"the MLflow store {uri} is not a readable SQLite database ({error}): it is "
                                     "corrupted or another kind of file; move it aside (nothing was changed) and "
                                     f"start a new store there, or pass another {option}") from None
        if tables and not MLFLOW_TABLES <= tables:
            raise PreflightError(f"the MLflow store {uri} is half-made (it lacks the tables "
                                 f"{', '.join(sorted(MLFLOW_TABLES - tables))}): its creation was interrupted; move "
                                 f"it aside and start a new store there, or pass another {option}")
        deadline, said = time.monotonic() + STORE_LOCK_WAIT_S, False
        while True:
            try:
                connection.execute("BEGIN IMMEDIATE")
                connection.execute("ROLLBACK")
                return
            except sqlite3.OperationalError as error:
                if not held_by_another_process(error):
                    raise PreflightError(f"the MLflow store {uri} cannot be written ({error}); pass another "
                                         f"{option}") from None
            if time.monotonic() >= deadline:
                raise PreflightError(f"the MLflow store {uri} stayed locked by another process for "
                                     f"{STORE_LOCK_WAIT_S:.0f} s; run again once it is free (another fit or an "
                                     "`mlflow ui` writing to it), or pass another store")
            if not said:
                print(f"the MLflow store {uri} is locked by another process; waiting up to {STORE_LOCK_WAIT_S:.0f} s",
                      file=sys.stderr, flush=True)
                said = True
            time.sleep(0.25)
    finally:
        connection.close()


# settings that fix a fit's length in Lightning; here one epoch is one round and the model's
# num_rounds decides how many (the module sets the fit loop's max_epochs when the fit starts)
LENGTH_SETTINGS = ("max_epochs", "min_epochs", "max_steps", "min_steps")
# model settings a resumed fit may give: the rounds (to extend the run); the others are linked from the data
RESUMABLE_MODEL_SETTINGS = frozenset({"num_rounds", "num_classes", "input_shape"})


def check_fit_length(trainer_given: Mapping[str, Any]) -> None:
    """``--trainer.max_epochs`` and its kin are refused: the CLI would otherwise ignore them."""
    for key in LENGTH_SETTINGS:
        value = trainer_given.get(key)
        if value is not None:
            rounds = f" {value}" if key.startswith("max") and isinstance(value, int) and value > 0 else " N"
            raise PreflightError(f"--trainer.{key} does not set a fit's length: one epoch is one round, and "
                                 f"--model.num_rounds sets how many (pass --model.num_rounds{rounds} instead)")


def check_config_files(paths: list[str]) -> None:
    """Every ``--config`` file exists and parses as YAML; a syntax error names the file and the line."""
    for path in paths:
        file = Path(path)
        if not file.is_file():
            if file.suffix in (".yaml", ".yml", ".json"):  # else jsonargparse reads it as YAML text
                raise PreflightError(f"--config {path}: no such file")
            continue
        try:
            yaml.safe_load(file.read_text())
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(error, "problem", None) or first_line(error)
            raise PreflightError(f"--config {path}{where}: not valid YAML ({problem}); fix the file") from None
        except UnicodeDecodeError:
            raise PreflightError(f"--config {path} is not a text file: pass a YAML config") from None


def _same(given: Any, saved: Any) -> bool:
    """Whether a setting given now equals the checkpoint's (tuples and lists alike; a mapping
    given may leave out entries the checkpoint resolved, e.g. a partition's defaults)."""
    if isinstance(given, Mapping) and isinstance(saved, Mapping):
        return all(key in saved and _same(value, saved[key]) for key, value in given.items())
    if isinstance(given, (list, tuple)) and isinstance(saved, (list, tuple)):
        return len(given) == len(saved) and all(_same(a, b) for a, b in zip(given, saved))
    if isinstance(given, float) or isinstance(saved, float):
        try:
            return float(given) == float(saved)
        except (TypeError, ValueError):
            return False
    return bool(given == saved)


def check_resume(path: str, checkpoint: Mapping[str, Any], model_class: str | None,
                 model_given: Mapping[str, Any], data: Mapping[str, Any], seed: Any) -> None:
    """A resumed fit continues the checkpoint's model on the checkpoint's data, so an algorithm
    (``model_class``, given explicitly), model settings (``model_given``, except the rounds) or
    data settings (``data``, resolved; the data seed from ``seed`` unless ``data['seed']``) that
    differ from the checkpoint's are refused: Lightning would load the checkpoint's model
    settings over them silently, and train it on another split."""
    hparams = checkpoint.get("hyper_parameters") or {}
    saved_class = hparams.get("_class_path")
    how = "resume with the checkpoint's settings, or leave --ckpt_path out to start a new run"
    if model_class and saved_class and model_class != saved_class:
        name, saved_name = model_class.rsplit(".", 1)[-1], str(saved_class).rsplit(".", 1)[-1]
        raise PreflightError(f"--ckpt_path {path} was written by {saved_name}, not {name}: resume it with "
                             f"--model {saved_name} (or without --model), or leave --ckpt_path out to start a "
                             f"new {name} fit")
    differences = [
        f"--model.{key} {value!r} (the checkpoint's: {hparams[key]!r})"
        for key, value in model_given.items()
        if key not in RESUMABLE_MODEL_SETTINGS and key in hparams and not _same(value, hparams[key])]
    saved_data = checkpoint.get("datamodule_hyper_parameters") or {}
    for key, value in data.items():
        if key in ("seed", "data_dir", "download") or key.startswith("_") or value is None or key not in saved_data:
            continue
        if not _same(value, saved_data[key]):
            differences.append(f"--data.{key} {value!r} (the checkpoint's: {saved_data[key]!r})")
    data_seed = data.get("seed") if data.get("seed") is not None else seed
    saved_seed = saved_data.get("data_seed")
    if isinstance(data_seed, int) and not isinstance(data_seed, bool) and saved_seed is not None \
            and data_seed != saved_seed:
        differences.append(f"data seed {data_seed} (the checkpoint's: {saved_seed}; --seed_everything or --data.seed)")
    if differences:
        raise PreflightError(f"--ckpt_path {path} was trained with other settings: {'; '.join(differences)}; {how}")
