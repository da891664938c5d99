"""Locks held by another uid, as any uid that may read a directory can hold its ``flock``,
or that may write it can hold a lock file of its own put there."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.users import UnprivilegedUser

CTX = [sys.executable, "-c", "from cortexfs.cli import main; main()"]
# Far longer than any command that waits for a lock takes, far shorter than "for ever".
PATIENCE = 60


def ctx(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``ctx`` run as root; a command that waits for a lock fails the test when
    :data:`PATIENCE` runs out, rather than hang it."""
    return subprocess.run(
        [*CTX, "--storage", str(root), *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=PATIENCE,
    )


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
                start_new_session=True,  # flock's child holds the lock too: both are ended
            )
            holders.append(holder)
            assert holder.stdout is not None and holder.stdout.readline() == "held\n", directory
        yield [holder.pid for holder in holders]
    finally:
        for holder in holders:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()
            if holder.stdout is not None:
                holder.stdout.close()
