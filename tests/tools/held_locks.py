"""Locks held by another uid, as any uid that may read a directory can hold its ``flock``,
or that may write it can hold a lock file of its own put there."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.users import UnprivilegedUser


@contextmanager
def held_by(user: UnprivilegedUser, *directories: Path) -> Iterator[list[int]]:
    """``user`` holds an exclusive ``flock`` on each of ``directories`` (which it may read;
    a file it may open, or make, will do too) until the block ends; the block is given the
    pids of the holders, in that order."""
    holders = []
    try:
        for directory in directories:
            holder = subprocess.Popen(
                ["flock", "--exclusive", str(directory), "sh", "-c", "echo held; exec sleep 600"],
                user=user.uid,
                group=user.gid,
                extra_groups=[],
                stdout=subprocess.PIPE,
                text=True,
            )
            holders.append(holder)
            assert holder.stdout is not None and holder.stdout.readline() == "held\n", directory
        yield [holder.pid for holder in holders]
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()
            if holder.stdout is not None:
                holder.stdout.close()
