"""Parameter types shared by the command lines: what click's own types let through.

* :class:`NonEmptyPath` — an empty string is no path: ``Path("")`` is the current directory, so
  ``--storage ''`` would bootstrap, and ``--queue ''`` make a queue in, wherever the shell is;
  and whether a path may be read is the command's to find, with the kernel's errno.
* :class:`Seconds` — a duration: a number within its range and finite; ``nan`` compares false
  with every bound and ``inf`` passes a lower one, and neither is a length of time.  At most
  :data:`MAX_SECONDS` unless said otherwise.
* :class:`Integer` — a count or an id within its range.
* :data:`UID` — a uid on the command line (``--uid``): 0 to :data:`MAX_ID`; beyond that no
  process or file can have it, and ``(uid_t) -1`` means "no id" to the kernel.

Both numbers are read as people write them: ASCII digits (with a decimal point and an exponent
for seconds), a minus sign for the range to refuse.  Python's ``int`` and ``float``, which
click's types call, also read ``1_000``, ``+5``, `` 5 `` and digits of other scripts (``٣``),
which the queue's control files refuse: a value means the same wherever it is written.
"""

from __future__ import annotations

import math
import re
from typing import Any

import click

from cortexfs.names import MAX_ID, shown_number
from cortexfs.timefmt import MAX_SECONDS, SECONDS_TEXT

_INTEGER_TEXT = re.compile(r"-?[0-9]+", re.ASCII)
_MAX_DIGITS = 40  # read no further: int() of thousands of digits costs, and no id is that long


class NonEmptyPath(click.Path):
    """click's path, but for the empty string, and with readability left to the command:
    click's ``access(R_OK)`` would refuse as a usage error (EINVAL, exit 2) a storage root
    other uids may search but not list, which the commands use as they are meant to, and a
    file that cannot be read, which the command names with the kernel's EACCES."""

    def __init__(self, *, readable: bool = False, **options: Any) -> None:
        super().__init__(readable=readable, **options)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str | bytes) and not value:
            self.fail("an empty string names no path", param, ctx)
        return super().convert(value, param, ctx)


class Seconds(click.FloatRange):
    name = "seconds"

    def __init__(
        self, min: float | None = None, max: float | None = MAX_SECONDS, **options: Any
    ) -> None:
        super().__init__(min, max, **options)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            if not SECONDS_TEXT.fullmatch(value):
                self.fail(f"{shown_number(value)} is not a number of seconds", param, ctx)
            # Judged as typed: click would name the range's failure by the float it made of it
            # ('inf' for 1e309, '0.0' for 1e-400), which the user did not write.
            number = float(value)
            if not math.isfinite(number):
                self.fail(f"{shown_number(value)} is not a finite number of seconds", param, ctx)
            try:
                return super().convert(value, param, ctx)
            except click.BadParameter:
                typed = value if len(value) <= 64 else shown_number(value)  # digits, as click
                self.fail(f"{typed} is not in the range {self._describe_range()}", param, ctx)
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{shown_number(str(value))} is not a finite number of seconds", param, ctx)
        return seconds


class Integer(click.IntRange):
    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not _INTEGER_TEXT.fullmatch(value):
            self.fail(f"{shown_number(value)} is not an integer in decimal digits", param, ctx)
        if isinstance(value, str) and len(value) > _MAX_DIGITS:
            self.fail(
                f"{shown_number(value)} has more than {_MAX_DIGITS} digits, more than any count "
                "or id",
                param,
                ctx,
            )
        return super().convert(value, param, ctx)


UID = Integer(0, MAX_ID)
