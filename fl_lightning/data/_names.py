"""Error messages for a name that is not in a registry (sources, partitioners)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: object, valid: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` for the valid names close to ``name`` (difflib), else ``""``."""
    close = difflib.get_close_matches(str(name), list(valid), n=3, cutoff=0.6)
    return f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""


def unknown_name(kind: str, name: object, valid: Iterable[str]) -> ValueError:
    """``ValueError("unknown <kind> 'x'; valid names: [...]. Did you mean ...?")``."""
    names = sorted(valid)
    return ValueError(f"unknown {kind} {name!r}; valid names: {names}.{did_you_mean(name, names)}")
