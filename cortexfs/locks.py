"""Waiting a bounded time for an ``flock``.

Whoever may open a file may lock it, so no lock of CortexFS's is waited for without bound: a
process that keeps one (stuck, or not ours) must not hold a worker, a tool call or a repair
forever.  ``flock`` itself cannot time out, so the wait is a poll with a growing pause: a
lock taken and let go within the first milliseconds costs almost nothing to wait for.
"""

from __future__ import annotations

import fcntl
import time


def flock_within(fd: int, kind: int, seconds: float) -> bool:
    """``flock(fd, kind)`` (``LOCK_SH`` or ``LOCK_EX``), waiting at most ``seconds`` (0: not
    at all); False when it is still held by another then.  Other errors are raised."""
    deadline = time.monotonic() + seconds
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
        time.sleep(pause)
        pause = min(2 * pause, 0.05)
