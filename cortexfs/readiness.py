"""Waiting until descriptors are ready to read or to write, by poll(2).

select(2) takes no descriptor numbered FD_SETSIZE (1024) or above: Python's ``select.select``
refuses one with ValueError.  A process started with many descriptors open (a supervisor that
leaks them into its children) gets such numbers for everything it opens afterwards, and every
wait on a pipe, a socket or an inotify descriptor would fail.  poll(2) has no such bound.

Like ``select.select``, a descriptor at its end (the other side gone: POLLHUP) or in error
counts as ready, so that the read or write that follows meets the end or the error and says so;
unlike it, so does a descriptor that is not open (POLLNVAL), where select raises EBADF: the read
or write that follows raises it.  Urgent data (POLLPRI) is not asked for: select reports it
apart from what is readable, and a wait woken by it alone would read nothing, and spin.
"""

from __future__ import annotations

import math
import select
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a Protocol class costs some 1.5 ms at import, in every ctx and core tool
    from collections.abc import Sequence
    from typing import Protocol, TypeVar

    class HasFileno(Protocol):
        def fileno(self) -> int: ...

    Waited = TypeVar("Waited", bound="int | HasFileno")


def readable(waited: Sequence[Waited], timeout: float | None) -> list[Waited]:
    """Those of ``waited`` (descriptors, or objects with ``fileno()``) ready to be read, once
    one is or ``timeout`` seconds have passed (None: however long it takes); empty then."""
    return _ready(waited, select.POLLIN, timeout)


def writable(waited: Sequence[Waited], timeout: float | None) -> list[Waited]:
    """Those of ``waited`` ready to be written, as :func:`readable`."""
    return _ready(waited, select.POLLOUT, timeout)


def readable_or_writable(reading: int, writing: int, timeout: float | None) -> tuple[bool, bool]:
    """Whether descriptor ``reading`` is ready to be read and ``writing`` to be written, once
    either is or ``timeout`` seconds have passed: a wait for room to write that takes what
    the other side writes meanwhile (two full pipes would otherwise wait on each other)."""
    if reading == writing:
        raise ValueError("one descriptor waited for twice")
    ready = _ready([reading, writing], select.POLLIN, timeout, {writing: select.POLLOUT})
    return reading in ready, writing in ready


def _ready(
    waited: Sequence[Waited],
    events: int,
    timeout: float | None,
    other_events: dict[int, int] | None = None,
) -> list[Waited]:
    poller = select.poll()
    by_descriptor: dict[int, Waited] = {}
    for item in waited:
        descriptor = item if isinstance(item, int) else item.fileno()
        by_descriptor[descriptor] = item
        poller.register(descriptor, (other_events or {}).get(descriptor, events))
    milliseconds = None if timeout is None else max(0, math.ceil(timeout * 1000))
    return [by_descriptor[descriptor] for descriptor, _ in poller.poll(milliseconds)]
