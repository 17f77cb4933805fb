"""What the leaderboard needs to know about an algorithm, in one torch-free home: a fit logs it
as run tags (``callbacks.run_identity.task_tags``), and the leaderboard reads the tags, falling back
to these tables for runs logged before the tags existed. The algorithms take their facts from here,
so the class and the page cannot disagree.

- ``INTERPRETATIONS``: the algorithms whose implementation is a reading of the method from
  secondary sources, with the note shown under their rows (tag ``algorithm_interpretation``);
- ``PER_CLIENT_MODEL_ALGORITHMS``: the algorithms that evaluate every client with a model of its
  own (tag ``per_client_models``; this list only serves runs logged before that tag).
"""

from __future__ import annotations

INTERPRETATIONS: dict[str, str] = {
    "FedGini": "interpretation (paper unavailable)",
    "ECI": "interpretation (from CGSV's one-line description; r stays dominated by round 0)",
    "CFFL": "interpretation (paper unavailable: the authors' code and draft, 6 deviations documented)",
}

PER_CLIENT_MODEL_ALGORITHMS = ("Ditto", "CGSV", "DW", "RR", "EU", "Standalone")


def interpretation_of(algorithm: str) -> str:
    """The interpretation note of the algorithm named ``algorithm`` ("" when it follows its paper)."""
    return INTERPRETATIONS.get(algorithm, "")
