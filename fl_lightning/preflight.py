"""Checks a fit's configuration can pass before anything is created (no MLflow run, no
checkpoint directory): the seed, the accelerator, the checkpoint to resume from and the
tracking store. Each failure is a ``PreflightError`` whose message says what is wrong and
what to change; the CLI prints it as one line."""

from __future__ import annotations

import socket
import zipfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import torch

REACH_TIMEOUT_S = 5.0
FL_CHECKPOINT_KEYS = ("state_dict", "epoch", "hyper_parameters")


class PreflightError(ValueError):
    """A setting that cannot work, found before anything ran."""


def check_seed(seed: Any) -> None:
    """``seed_everything``: an integer in [0, 2**32) (or true: a random one; false: none)."""
    if isinstance(seed, bool) or seed is None:
        return
    if not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise PreflightError(f"seed_everything must be an integer in [0, 2**32), got {seed!r}: "
                             "pass e.g. --seed_everything 0")


def check_accelerator(accelerator: Any, devices: Any = "auto") -> None:
    """A GPU accelerator needs a GPU this process can see."""
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


def check_checkpoint(path: str | None) -> None:
    """``--ckpt_path``: an existing fl-lightning checkpoint, read without unpickling anything
    but tensors and plain values (``torch.load(weights_only=True)``)."""
    if path is None or path in ("last", "best", "hpc", "registry"):
        return
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
        reason = str(error).strip().splitlines()[0][:160]
        raise PreflightError(f"--ckpt_path {path} cannot be read as an fl-lightning checkpoint ({reason}); it is "
                             "corrupted or was not written by fl-lightning: resume from the run's last.ckpt, "
                             "or leave --ckpt_path out") from None
    missing = [key for key in FL_CHECKPOINT_KEYS if key not in checkpoint]
    if missing:
        raise PreflightError(f"--ckpt_path {path} is not an fl-lightning checkpoint (it has no {', '.join(missing)}): "
                             "resume from a last.ckpt that fl-lightning fit wrote")


def check_tracking_store(uri: str) -> None:
    """The MLflow store can be reached: a tracking server answers within ``REACH_TIMEOUT_S``; a
    SQLite or file store's folder exists."""
    parsed = urlparse(uri)
    if parsed.scheme in ("http", "https"):
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            with socket.create_connection((parsed.hostname or "localhost", port), timeout=REACH_TIMEOUT_S):
                pass
        except OSError as error:
            reason = "timed out" if isinstance(error, TimeoutError) else error.strerror or str(error)
            raise PreflightError(f"cannot reach the MLflow tracking server {uri} ({reason}): start it "
                                 f"(mlflow server --port {port}) or log to a local store with "
                                 "--trainer.logger.init_args.tracking_uri sqlite:///mlruns.db") from None
    elif parsed.scheme == "sqlite":
        database = unquote(uri[len("sqlite:///"):].split("?", 1)[0]) if uri.startswith("sqlite:///") else ""
        folder = Path(database).parent if database and database != ":memory:" else None
        if folder is not None and not folder.is_dir():
            raise PreflightError(f"the folder of the MLflow store {uri} does not exist ({folder}): create it, or "
                                 "pass another --trainer.logger.init_args.tracking_uri")
    elif parsed.scheme in ("", "file"):
        folder = Path(unquote(parsed.path) if parsed.scheme == "file" else uri).parent
        if not folder.is_dir():
            raise PreflightError(f"the folder of the MLflow file store {uri} does not exist ({folder}): create it, "
                                 "or pass another --trainer.logger.init_args.tracking_uri")
