"""Parameter types shared by the command lines: what click's own types let through.

* :class:`NonEmptyPath` — an empty string is no path: ``Path("")`` is the current directory, so
  ``--storage ''`` would bootstrap, and ``--queue ''`` make a queue in, wherever the shell is.
* :class:`Seconds` — a duration: a number within its range and finite; ``nan`` compares false
  with every bound and ``inf`` passes a lower one, and neither is a length of time.  At most
  :data:`MAX_SECONDS` unless said otherwise.
"""

from __future__ import annotations

import math
from typing import Any

import click


class NonEmptyPath(click.Path):
    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str | bytes) and not value:
            self.fail("an empty string names no path", param, ctx)
        return super().convert(value, param, ctx)


# A year and a day: longer than any job, lease or wait is meant to last, and far within what
# the interpreter's clocks and timed waits hold (about 292 years of nanoseconds), beyond which
# a timeout given on the command line would fail only once a job used it.
MAX_SECONDS = 366 * 24 * 3600.0


class Seconds(click.FloatRange):
    name = "seconds"

    def __init__(
        self, min: float | None = None, max: float | None = MAX_SECONDS, **options: Any
    ) -> None:
        super().__init__(min, max, **options)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return seconds
