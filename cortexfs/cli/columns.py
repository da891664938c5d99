"""Text laid out in columns that line up on a terminal, whatever the values hold.

A column is as wide as its widest value, measured in the cells a terminal gives it: two for a
wide character (CJK, most emoji), none for a combining mark, one for the rest.  Each value is
made :func:`~cortexfs.printable.printable` before it is measured, so the escape of a tab or a
zero-width character takes its place in the count, and is never padded by a count of the
characters it had before.  Nothing is cut (but by :func:`fitted`, for
a line rewritten in place): a long value widens its column, or, in the last column, its line.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from cortexfs.printable import printable


def cells(text: str) -> int:
    """How many terminal cells ``text`` (printable) takes."""
    if text.isascii():
        return len(text)
    return sum(_cells_of(char) for char in text)


def _cells_of(char: str) -> int:
    if unicodedata.combining(char) or unicodedata.category(char) in ("Mn", "Me"):
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def padded(value: str, width: int) -> str:
    """``value`` printable, padded to ``width`` cells (never cut): for lines laid out one at a
    time, as a followed session's, whose columns have a width set in advance."""
    shown = printable(value)
    return shown + " " * (width - cells(shown))


def fitted(value: str, width: int) -> str:
    """``value`` printable, cut to at most ``width`` cells with ``…`` where it was cut: for a
    line rewritten in place, which a terminal would wrap, and ``\r`` then not reach back to."""
    shown = printable(value)
    if cells(shown) <= width:
        return shown
    kept, used = [], 0
    for char in shown:
        used += _cells_of(char)
        if used > width - 1:
            break
        kept.append(char)
    return "".join(kept) + "…"


def table(rows: Sequence[Sequence[str]], gap: str = " ") -> list[str]:
    """``rows`` as lines whose columns line up, each value printable; rows may be shorter
    than others (their missing cells are empty), and the last cell of a row is not padded."""
    shown = [[printable(value) for value in row] for row in rows]
    widths: list[int] = []
    for row in shown:
        for column, value in enumerate(row[:-1]):
            if column == len(widths):
                widths.append(0)
            widths[column] = max(widths[column], cells(value))
    lines = []
    for row in shown:
        laid_out = [
            value + " " * (widths[column] - cells(value)) for column, value in enumerate(row[:-1])
        ]
        lines.append(gap.join([*laid_out, *row[-1:]]).rstrip())
    return lines
