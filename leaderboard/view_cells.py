"""The cells every view is made of: a header, a cell (text, link, marks, title) and a table view;
the marks' symbols and titles."""

from __future__ import annotations

from dataclasses import dataclass, field

from fl_lightning.records.vocabulary import Metric
from leaderboard.tables import (
    BEST,
    BEST_MARK,
    TIE,
    TIE_MARK,
)

MARKS = {BEST: BEST_MARK, TIE: TIE_MARK}
MARK_TITLES = {BEST: "best, separated from every other row beyond seed noise (p < 0.05: paired by seed, or Welch)",
               TIE: "tied for the lead: not separable from the top row (p ≥ 0.05, or fewer than 2 seeds)"}
FAIRNESS_SHORT = {Metric.TEST_ACC_WORST10: "worst 10%", Metric.TEST_ACC_WORST5: "worst 5%", Metric.TEST_ACC_STD: "std",
                  Metric.CGSV_RHO: "CGSV ρ"}


@dataclass
class Header:
    label: str
    title: str = ""
    kind: str = "text"  # "text" or "num": how the inline script sorts the column
    first: str = "asc"  # the direction of the first click ("desc" where higher is better)
    key: str = ""
    link: str | None = None


@dataclass
class Cell:
    text: str  # the value (first line)
    sort: str = ""  # the raw value the script sorts by ("" = missing, sorted last)
    mark: str = ""  # BEST, TIE or ""
    mark_title: str = ""  # why the mark (the p: paired by seed, or Welch)
    rank: str = ""  # "#2/6": rank by mean among the rows with a value
    note: str = ""  # a footnote marker (†, ‡)
    sub: str = ""  # second line: "± 1.04 · n=2"
    extra: list[Cell] = field(default_factory=list)  # further values in the cell (the matrix's fairness)
    label: str = ""  # a prefix of an extra value ("worst 10%")
    link: str | None = None
    code: bool = False  # shown in a monospace font (ids, shas)
    detail: str = ""  # longer text, shown on demand in HTML (a failed run's log tail)
    muted: bool = False  # a value that is not ranked (another task)

    @property
    def best(self) -> bool:
        return self.mark == BEST

    @property
    def symbol(self) -> str:
        return MARKS.get(self.mark, "")


@dataclass
class TableView:
    id: str
    headers: list[Header]
    rows: list[list[Cell]] = field(default_factory=list)
    sortable: bool = True
    row_classes: list[str] = field(default_factory=list)
    css_class: str = ""  # e.g. "matrix": a compact table, not stretched to the page's width
    notes: list[str] = field(default_factory=list)  # footnotes printed under the table (HTML and Markdown)
