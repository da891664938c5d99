"""Waiting for another process's flock, for tests that race a lock holder."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path


def wait_for_lock(path: Path, *, held: bool) -> None:
    """Wait until another process holds (or no longer holds) the flock on ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(1000):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if held:
                    return
            else:
                fcntl.flock(fd, fcntl.LOCK_UN)
                if not held:
                    return
            time.sleep(0.01)
    finally:
        os.close(fd)
    raise AssertionError(f"the lock on {path} never became {'held' if held else 'free'}")
