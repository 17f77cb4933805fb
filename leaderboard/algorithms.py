"""The notes the leaderboard shows under an algorithm's rows, from the runs themselves.

An algorithm class may carry ``interpretation = "..."``: its implementation is a reading of the
method from secondary sources (FedGini: its paper is unavailable here). A fit logs it as the run
tag ``algorithm_interpretation``; runs logged before that tag get the note from
``fl_lightning.records.algorithm_facts`` by the algorithm's name. Every row of such an algorithm shows the
text under the algorithm's name, on the index matrix and on its table. The leaderboard imports no
algorithm (and no torch) to learn it.
"""

from __future__ import annotations

from collections.abc import Iterable

from fl_lightning.records.algorithm_facts import interpretation_of
from fl_lightning.records.vocabulary import Tag
from leaderboard.runs import RunRecord


def interpretations(runs: Iterable[RunRecord]) -> str:
    """The interpretation notes of a row's algorithm(s): each algorithm's tag, else its known note;
    "" for an algorithm that follows its paper."""
    runs = list(runs)
    names = sorted({run.tags.get(Tag.ALGORITHM, "") for run in runs} - {""})
    tagged = {run.tags[Tag.ALGORITHM]: run.tags[Tag.INTERPRETATION] for run in runs
              if run.tags.get(Tag.ALGORITHM) and run.tags.get(Tag.INTERPRETATION)}
    notes = {name: tagged.get(name) or interpretation_of(name) for name in names}
    return "; ".join(f"{name}: {note}" if len(names) > 1 else note for name, note in notes.items() if note)
