"""Issue 35: the leaderboard's progress is typed. Counts of runs read reach a progress that takes
counts as numbers (``ProgressLines.counted``: a bar on a terminal), never parsed back out of a
message; a plain callable (``print``, a test's lambda) gets them as a line."""

from __future__ import annotations

import io

from leaderboard.export import ProgressLines
from leaderboard.runs import CountingProgress, report_count


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_counts_reach_a_counting_progress_as_numbers():
    lines = ProgressLines(Terminal())
    assert isinstance(lines, CountingProgress)
    report_count(lines, "metric histories", 3, 10)
    assert lines.bar is not None and (lines.bar.n, lines.bar.total) == (3, 10)
    report_count(lines, "metric histories", 10, 10)
    assert lines.bar is None  # closed when done


def test_a_message_that_looks_like_a_count_is_printed_as_it_is():
    stream = Terminal()
    lines = ProgressLines(stream)
    lines("  my experiment: 3/10 runs")  # a line, whatever it says: no bar parsed out of text
    assert lines.bar is None and "my experiment: 3/10 runs" in stream.getvalue()


def test_a_plain_callable_gets_the_count_as_a_line():
    said: list[str] = []
    report_count(said.append, "metric histories", 3, 10)
    assert said == ["  metric histories: 3/10 runs"]
    stream = io.StringIO()  # not a terminal: lines
    report_count(ProgressLines(stream), "metric histories", 3, 10)
    assert stream.getvalue() == "  metric histories: 3/10 runs\n"
