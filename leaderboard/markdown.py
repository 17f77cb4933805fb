"""A view as a Markdown table (the site's Markdown twin): cells escaped, links kept."""

from __future__ import annotations

from leaderboard.tables import (
    MISSING,
)
from leaderboard.view_cells import Cell, TableView


def short_error(error: str, limit: int = 240) -> str:
    """A failed run's error in one line: the first line and, for a log tail, its last line (the exception)."""
    lines = [line.strip() for line in (error or "").splitlines() if line.strip()]
    if not lines:
        return MISSING
    text = lines[0] if len(lines) == 1 else f"{lines[0]} … {lines[-1]}"
    return text if len(text) <= limit else text[: limit - 1] + "…"


def escape_markdown_cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def cell_markdown(cell: Cell, link_suffix: str = ".md") -> str:
    """One cell in Markdown: the value (bold when ★), its mark, rank and note, then ± std · n, then
    any extra values after a semicolon."""
    text = escape_markdown_cell(cell.text)
    if cell.code and text != MISSING:
        text = f"`{text}`"
    if cell.link:
        text = f"[{text}]({cell.link}{link_suffix})"
    if cell.best:
        text = f"**{text}**"
    if cell.label:
        text = f"{cell.label} {text}"
    parts = [text + cell.note] + [p for p in (cell.symbol, cell.rank) if p]
    if cell.sub:
        parts.append(f"({escape_markdown_cell(cell.sub)})")
    text = " ".join(parts)
    for extra in cell.extra:
        text += "; " + cell_markdown(extra, link_suffix)
    return text


def markdown_table(view: TableView, link_suffix: str = ".md") -> str:
    """A GitHub-flavoured Markdown table of the view, with the same marks as the HTML."""
    labels = []
    for header in view.headers:
        label = escape_markdown_cell(header.label)
        labels.append(f"[{label}]({header.link}{link_suffix})" if header.link else label)
    lines = ["| " + " | ".join(labels) + " |",
             "|" + "|".join("---:" if h.kind == "num" else "---" for h in view.headers) + "|"]
    for row in view.rows:
        lines.append("| " + " | ".join(cell_markdown(cell, link_suffix) for cell in row) + " |")
    if view.notes:
        lines.append("")
        lines += [f"- {note}" for note in view.notes]
    return "\n".join(lines)
