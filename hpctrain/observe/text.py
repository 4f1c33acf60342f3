"""Plain-text output shared by reports and the command line. No torch."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], right: Iterable[int] = ()) -> str:
    """An aligned plain-text table (two spaces between columns; columns in ``right`` right-aligned)."""
    rows = [list(headers), *(list(r) for r in rows)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(headers))]
    right = set(right)
    lines = []
    for row in rows:
        cells = [
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
