"""Error messages for a name that is not in a registry (sources, partitioners)."""

from __future__ import annotations

from collections.abc import Iterable

from fl_lightning.records.errors import did_you_mean


def unknown_name(kind: str, name: object, valid: Iterable[str]) -> ValueError:
    """``ValueError("unknown <kind> 'x'; valid names: [...]; did you mean ...?")``."""
    names = sorted(valid)
    return ValueError(f"unknown {kind} {name!r}; valid names: {names}{did_you_mean(name, names)}")
