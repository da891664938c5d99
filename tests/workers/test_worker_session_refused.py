"""A worker whose session cannot be made says why, in words that fit the errno: a full disk
or a read-only one is no question of who started the worker, so it is never told to start it
as root (it already is) or to create the agent's home (it exists).  Real ``ctx queue work``
processes on a real tmpfs (needs root to mount it)."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from cortexfs.worker.executors import _session_remedy
from cortexfs.worker.outcome import host_remedy
from tests.support.storage import small_tmpfs
from tests.workers.conftest import AGENT, PROJECT, Farm, make_farm

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")


def fill_inodes(directory: Path) -> None:
    """Empty files in ``directory`` until the filesystem has no inode left."""
    directory.mkdir()
    number = 0
    while True:
        try:
            (directory / str(number)).touch()
        except OSError:
            return
        number += 1


def work_in_a_new_session(farm: Farm, session: str) -> subprocess.CompletedProcess[str]:
    return farm.ctx(
        "queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain", "--session", session
    )


def test_a_session_refused_for_want_of_inodes_or_a_writable_disk_gets_advice_that_fits(
    traversable_tmp: Path, unprivileged_user
) -> None:
    # Few inodes, so that using them up is quick (the size is the first of the mount options).
    with small_tmpfs(traversable_tmp / "disk", "24m,nr_inodes=6000") as disk:
        farm = make_farm(disk, unprivileged_user)
        home = farm.root / "home" / str(unprivileged_user.uid)
        # A first worker made the agent's home: it exists, and root started the worker.
        assert work_in_a_new_session(farm, "first").returncode == 0
        job = farm.publish("shell.exec", {"cmd": "true"})
        assert home.is_dir()
        session = home / "agent" / AGENT / "session" / "fresh"

        fill_inodes(disk / "fill")
        full = work_in_a_new_session(farm, "fresh")

        assert full.returncode == 1, full.stderr
        assert full.stderr.startswith(
            f"ctx: ENOSPC: cannot open the worker's session {session} (No space left on device"
        ), full.stderr
        claimed_none = "; no job was claimed: free space or inodes on that filesystem, then start"
        assert claimed_none in full.stderr
        assert "start it as root" not in full.stderr and "owned by uid" not in full.stderr
        assert (farm.queue / "pending" / job).is_file()

        subprocess.run(["rm", "-rf", str(disk / "fill")], check=True)
        # The homes alone read-only (a whole read-only disk refuses the queue first, before
        # any session is made).
        subprocess.run(["mount", "--bind", str(home), str(home)], check=True)
        subprocess.run(["mount", "-o", "remount,ro,bind", str(home)], check=True)
        try:
            read_only = work_in_a_new_session(farm, "fresh")
        finally:
            subprocess.run(["umount", str(home)], check=True)

        assert read_only.returncode == 1, read_only.stderr
        assert read_only.stderr.startswith(
            f"ctx: EROFS: cannot open the worker's session {session} (Read-only file system"
        ), read_only.stderr
        claimed_none = "; no job was claimed: remount that filesystem read-write, then start"
        assert claimed_none in read_only.stderr
        assert "start it as root" not in read_only.stderr
        assert (farm.queue / "pending" / job).is_file()


def test_a_session_refused_for_a_disk_quota_names_the_uid_whose_quota_it_is(
    traversable_tmp: Path,
) -> None:
    """The quota is this process's uid's (it creates the session's files); no filesystem here
    enforces quotas, so the remedy is asked for the errno a quota gives."""
    home = traversable_tmp / "home" / "1234"
    remedy = _session_remedy(errno.EDQUOT, home, 1234)
    assert remedy == f"free space within the disk quota of uid {os.geteuid()}"


def test_a_worker_stopped_by_a_disk_quota_names_the_uid_whose_quota_it_is() -> None:
    """The queue's files it writes are this process's too; the other stops keep their words."""
    assert host_remedy(errno.EDQUOT) == f"free space within the disk quota of uid {os.geteuid()}"
    assert host_remedy(errno.EROFS) == "remount that filesystem read-write"
    assert host_remedy(None) == "check that disk (the kernel's log says more)"
