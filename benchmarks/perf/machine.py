"""Describe the machine a benchmark ran on, for its results file."""

from __future__ import annotations

import os
import platform

import torch

from fl_lightning.machine import cpu_model


def describe_machine(device: torch.device) -> dict:
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
