"""Parameter types shared by the command lines: what click's own types let through.

* :class:`NonEmptyPath` — an empty string is no path: ``Path("")`` is the current directory, so
  ``--storage ''`` would bootstrap, and ``--queue ''`` make a queue in, wherever the shell is.
* :class:`Seconds` — a duration: a number within its range and finite; ``nan`` compares false
  with every bound and ``inf`` passes a lower one, and neither is a length of time.  At most
  :data:`MAX_SECONDS` unless said otherwise.
* :data:`UID` — a uid on the command line (``--uid``): 0 to :data:`MAX_ID`; beyond that no
  process or file can have it, and ``(uid_t) -1`` means "no id" to the kernel.
"""

from __future__ import annotations

import math
from typing import Any

import click

from cortexfs.timefmt import MAX_SECONDS

MAX_ID = 2**32 - 2  # the largest uid or gid: (uid_t) -1 is "no id" to the kernel


class NonEmptyPath(click.Path):
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
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return seconds


UID = click.IntRange(0, MAX_ID)
