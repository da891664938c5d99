"""Helpers shared by the queue tests."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections import Counter
from pathlib import Path

from cortexfs.durable import FsOps

PROJECT = "proj"


def request(n: int = 0, **extra: object) -> dict[str, object]:
    return {"tool": "fs.stat", "input": {"n": n}, **extra}


def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped) in this pid namespace."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def write_json(path: Path, obj: object) -> Path:
    path.write_text(json.dumps(obj))
    return path


class CountingOps(FsOps):
    """Real operations that count how often each system call is made."""

    def __init__(self, move_strategy: str | None = None) -> None:
        super().__init__(move_strategy)
        self.counts: Counter[str] = Counter()

    def fsync(self, fd: int) -> None:
        self.counts["fsync"] += 1
        super().fsync(fd)

    def syncfs(self, fd: int) -> None:
        self.counts["syncfs"] += 1
        super().syncfs(fd)


class NoDescriptorForTheLease(FsOps):
    """Real operations, but opening a job's directory in ``lease/`` fails with EMFILE (out of
    descriptors), once ``lease`` is set to the queue's ``lease/`` descriptor."""

    lease: int | None = None

    def open_dir(self, name: str, dir_fd: int | None = None) -> int:
        if self.lease is not None and dir_fd == self.lease:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), name)
        return super().open_dir(name, dir_fd)
