"""A job whose finish the disk refuses: what the worker says of it, through a real ``ctx queue
work`` on a real tmpfs (needs root to mount it) whose job fills that disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.storage import small_tmpfs
from tests.workers.conftest import AGENT, PROJECT, make_farm

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")


def test_a_job_that_fills_the_disk_is_left_to_recover_with_one_advice(
    traversable_tmp: Path, unprivileged_user
) -> None:
    """The full disk refuses the record of the call first (the session is on it): the job is
    left claimed, not failed for want of disk, and the message says where, what became of the
    job and what to do, never the command line's "then finish it again": a finish by hand
    would record, in the stopped worker's name, an outcome it never gave."""
    with small_tmpfs(traversable_tmp / "disk", "24m") as disk:
        os.chmod(disk, 0o1777)  # the job runs as the agent's user, and fills this disk
        farm = make_farm(disk, unprivileged_user)
        fill = disk / "fill-by-job"
        job = farm.publish("shell.exec", {"cmd": f"head -c 100000000 /dev/zero > {fill}; true"})

        worked = farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain")

        assert worked.returncode == 1, worked
        session = farm.root / "home" / str(unprivileged_user.uid) / "agent" / AGENT / "session"
        assert worked.stderr.startswith(
            f"ctx: ENOSPC: the worker stopped: job {job} was left claimed: ENOSPC: the tool "
            "exited 0, but its result could not be recorded"
        ), worked.stderr
        assert worked.stderr.rstrip().endswith(
            f"in its session {session}/worker/events.jsonl and in the tool's log, and finishes "
            f"no job whose call is not on record; no result of {job} was written: free space "
            f"or inodes on that filesystem, then run 'ctx queue recover --project {PROJECT}' once "
            "this worker has exited (it requeues the job, which runs again)"
        ), worked.stderr
        assert "finish it again" not in worked.stderr + worked.stdout
        assert os.listdir(farm.queue / "claimed") == [job]

        # As told: space freed, then recover; the worker has exited, so the job runs again.
        fill.unlink()
        recovered = farm.ctx("queue", "recover", "--project", PROJECT, "--reconcile")
        assert recovered.returncode == 0, recovered
        assert os.listdir(farm.queue / "pending") == [job]
        assert os.listdir(farm.queue / "done") == os.listdir(farm.queue / "failed") == []
