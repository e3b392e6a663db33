"""Markdown tables, for results tables and the offline report."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], cell: Callable[[Any], str] = str) -> list[str]:
    """The lines of a markdown table: the header, its ``|---|`` rule, one line per row (``cell`` formats each value)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines
