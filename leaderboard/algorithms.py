"""What the leaderboard learns from the algorithm classes themselves (by the runs' ``algorithm`` tag).

An algorithm class may carry ``interpretation = "..."``: its implementation is a reading of the
method from secondary sources (FedGini: its paper is unavailable here). Every row of such an
algorithm shows that text under the algorithm's name, on the index matrix and on its table.
"""

from __future__ import annotations

import functools


@functools.cache
def interpretation(algorithm: str) -> str:
    """The class attribute ``interpretation`` of the algorithm named ``algorithm`` ("" if none or unknown)."""
    if not algorithm:
        return ""
    try:
        from fl_lightning import algorithms
    except ImportError:  # the leaderboard without the library: nothing to say
        return ""
    cls = getattr(algorithms, algorithm, None)
    text = getattr(cls, "interpretation", "") if isinstance(cls, type) else ""
    return text if isinstance(text, str) else ""


def interpretations(names: str) -> str:
    """The interpretation notes of a row's algorithm(s) (``ConfigRow.algorithm``: names joined by ", ")."""
    notes = [f"{name}: {note}" if ", " in names else note
             for name in names.split(", ") if (note := interpretation(name))]
    return "; ".join(notes)
