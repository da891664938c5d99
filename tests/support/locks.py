"""Waiting for another process's flock, for tests that race a lock holder."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path


def lock_is_free(path: Path) -> bool:
    """Whether no process holds a flock on the directory ``path``: the lock is taken and let
    go at once to find out."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # lets the lock go, when it was had
    return True


def wait_for_lock(path: Path, *, held: bool) -> None:
    """Wait until another process holds (or no longer holds) the flock on ``path``."""
    for _ in range(1000):
        if lock_is_free(path) != held:
            return
        time.sleep(0.01)
    raise AssertionError(f"the lock on {path} never became {'held' if held else 'free'}")
