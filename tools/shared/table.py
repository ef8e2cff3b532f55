"""Text tables a person reads at a glance: each column as wide as its widest cell."""

from __future__ import annotations

from collections.abc import Container, Sequence


def render(
    rows: Sequence[Sequence[str]],
    *,
    right: Container[int] = (),
    widths: Sequence[int] = (),
    strip: bool = True,
) -> list[str]:
    """``rows`` (the header first) as lines, cells two spaces apart, padded to their column's widest
    cell or ``widths[i]`` if wider; left-aligned but for the columns in ``right`` (figures: digits
    under digits); ``strip``: no trailing blanks."""
    count = len(rows[0]) if rows else 0
    wide = [max([*widths[i : i + 1], *(len(row[i]) for row in rows)]) for i in range(count)]
    out = []
    for row in rows:
        cells = zip(row, wide, strict=True)
        text = "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(cells))
        out.append(text.rstrip() if strip else text)
    return out
