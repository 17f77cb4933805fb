"""Describe the machine a benchmark ran on, for its results file."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch

from fl_lightning.records.machine import cpu_model


def describe_machine(device: torch.device) -> dict:
    """The device, CPU model and cores, torch threads, platform, Python and
    torch versions (and the GPU's name on CUDA), for a results file."""
    info = {
        "device": str(device),
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def proc_kib_as_mib(path: str, key: str) -> float | None:
    """A ``key: <n> kB`` line of a /proc file (Linux) in MiB; None where there is none."""
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(key):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def append_measurement(path: Path, benchmark: str, measurement: dict) -> None:
    """Adds ``measurement`` to the ``measurements`` of the results file ``path`` (created with
    ``benchmark`` as its name), written to a partial file and renamed."""
    existing = json.loads(path.read_text()) if path.exists() else {"benchmark": benchmark, "measurements": []}
    existing["measurements"].append(measurement)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(existing, indent=2))
    partial.replace(path)
