"""The log of ``strace -f -o LOG``, one whole system call a line.

When another traced process or thread makes a call while one is still in progress, strace
prints the first call in two pieces: ``PID write(4, "…", 213 <unfinished ...>`` and, later,
``PID <... write resumed>) = 213``.  A test that reads each line as one call would then see a
call without its result, or a result without its call, depending on how the scheduler happened
to interleave the processes.  :func:`trace_lines` puts every such call back on one line, at
the place where it started.
"""

from __future__ import annotations

import re
from pathlib import Path

_UNFINISHED = " <unfinished ...>"
_RESUMED = re.compile(r"^(?P<pid>\d+)\s+<\.\.\. (?P<call>\w+) resumed>\s?(?P<rest>.*)$")
_PID = re.compile(r"^(?P<pid>\d+)\s")


def rejoined(lines: list[str]) -> list[str]:
    """``lines`` of an strace log with each call split by another process made whole again."""
    joined: list[str] = []
    started: dict[str, int] = {}  # pid -> index in ``joined`` of its unfinished call
    for line in lines:
        resumed = _RESUMED.match(line)
        if resumed and resumed["pid"] in started:
            joined[started.pop(resumed["pid"])] += resumed["rest"]
            continue
        joined.append(line.removesuffix(_UNFINISHED))
        pid = _PID.match(line)
        if line.endswith(_UNFINISHED) and pid:
            started[pid["pid"]] = len(joined) - 1
    return joined


def trace_lines(log: Path) -> list[str]:
    """The calls that ``strace -f -o LOG`` wrote to ``log``, one whole call a line."""
    return rejoined(log.read_text().splitlines())
