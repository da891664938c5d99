"""Data files of ``key=value`` lines: ``queue/config``, ``tool/tsh.d/config``, ``.tshrc``.

Blank lines and ``#`` comments are allowed; every other line is ``key=value``, with spaces
around the key and the value ignored.  These files are data, never code: they are parsed
here, never sourced or executed.  What the keys mean, and which are known, is each file's
own business; this module only splits the lines and says which ones are not ``key=value``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple


class Line(NamedTuple):
    """One line that is neither blank nor a comment."""

    number: int  # from 1, as an editor counts
    raw: str
    key: str | None  # None when the line is not key=value (no '=', or nothing before it)
    value: str


def lines(text: str) -> Iterator[Line]:
    """The lines of ``text`` that say something, in order."""
    # Lines end at "\n" alone, as grep and editors count them: splitlines() would also end
    # one at a form feed or a vertical tab, and apply what follows one inside a comment.
    for number, raw in enumerate(text.split("\n"), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, equals, value = (part.strip() for part in stripped.partition("="))
        yield Line(number, raw, key if equals and key else None, value)
