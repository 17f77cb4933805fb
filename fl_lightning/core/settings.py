"""The closed choices of ``FederatedModule``'s settings as ``Literal`` types (LightningCLI lists
them in ``--help`` and refuses others), and the one place its numbers and choices are checked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from fl_lightning.choices import check_choice
from fl_lightning.run_schema import DROPOUT_PROB, EVAL_EVERY, FRACTION, LR_DECAY, NUM_ROUNDS

EngineName = Literal["auto", "vectorised", "sequential"]
Autocast = Literal["bf16", "fp16"]
HistoryDtype = Literal["float32", "bfloat16", "float16"]
HistoryDevice = Literal["model", "cpu"]  # "cpu": per-client histories offloaded to host memory
LayerGrouping = Literal["tensor", "module"]
Attack = Literal["bias", "scaling"]
ChunkSize = int | Literal["auto"] | None

CHOICES: dict[str, tuple[Any, str | None]] = {  # setting -> (its type, what null means)
    "engine": (EngineName, None),
    "layer_grouping": (LayerGrouping, None),
    "local_autocast": (Autocast | None, "full precision"),
    "history_dtype": (HistoryDtype | None, "the parameters' dtype"),
    "history_device": (HistoryDevice, None),
    "attack": (Attack | None, "no attacker"),
}
RANGES: dict[str, tuple[Any, str]] = {  # setting (``run_schema``'s names) -> (its check, the rule)
    NUM_ROUNDS: (lambda v: v >= 1, ">= 1"),
    EVAL_EVERY: (lambda v: v >= 1, ">= 1"),
    FRACTION: (lambda v: 0 < v <= 1, "in (0, 1] (1.0 = full participation)"),
    DROPOUT_PROB: (lambda v: 0 <= v < 1, "in [0, 1)"),
    LR_DECAY: (lambda v: 0 < v <= 1, "in (0, 1]"),
}


def check_module_settings(settings: Mapping[str, Any]) -> None:
    """Refuses a value outside its choices or range, saying what is valid."""
    for name, (choices, null_means) in CHOICES.items():
        check_choice(name, settings[name], choices, null_means)
    for name, (valid, rule) in RANGES.items():
        if not valid(settings[name]):
            raise ValueError(f"{name} must be {rule}, got {settings[name]}")
    check_clients_per_chunk(settings["clients_per_chunk"])


def check_clients_per_chunk(clients_per_chunk: Any) -> None:
    """``clients_per_chunk``: an integer >= 1, ``"auto"`` or ``None`` (all clients at once)."""
    if clients_per_chunk is not None and clients_per_chunk != "auto" and (
        not isinstance(clients_per_chunk, int) or clients_per_chunk < 1
    ):
        raise ValueError(
            f"clients_per_chunk must be an integer >= 1, 'auto' or null (all at once), got {clients_per_chunk!r}"
        )
