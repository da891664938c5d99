"""Waiting for something another process does, for tests that race it."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], seconds: float = 10.0) -> bool:
    """Whether ``condition`` came true within ``seconds``, asked every 10 ms."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
