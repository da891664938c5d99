"""A job whose finish the disk refuses: what the worker says of it, through a real ``ctx queue
work`` on a real tmpfs (needs root to mount it) whose job fills that disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.storage import small_tmpfs
from tests.workers.conftest import AGENT, PROJECT, make_farm

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to mount a tmpfs")


def test_a_job_whose_finish_a_full_disk_refuses_is_left_to_recover_with_one_advice(
    traversable_tmp: Path, unprivileged_user
) -> None:
    """The refusal's cause is quoted, not its command-line next step ("then finish it again"):
    a finish by hand would record, in the lost worker's name, an outcome it never gave."""
    with small_tmpfs(traversable_tmp / "disk", "24m") as disk:
        os.chmod(disk, 0o1777)  # the job runs as the agent's user, and fills this disk
        farm = make_farm(disk, unprivileged_user)
        fill = disk / "fill-by-job"
        job = farm.publish("shell.exec", {"cmd": f"head -c 100000000 /dev/zero > {fill}; true"})

        worked = farm.ctx("queue", "work", "--project", PROJECT, "--agent", AGENT, "--drain")

        assert worked.returncode == 1, worked
        lost = [line for line in worked.stderr.splitlines() if line.startswith("lost")]
        assert len(lost) == 1 and job in lost[0], worked.stderr
        assert (
            f"ran, but could not be finished: ENOSPC: cannot finish in queue {farm.queue}: "
            f"{farm.queue}/inbox refused: No space left on device (its filesystem has 0 bytes"
        ) in lost[0]
        assert lost[0].endswith(
            f"; job {job} stays claimed and no result of it was written: free space on that "
            "filesystem; it is left as it is, and 'ctx queue recover --reconcile' completes it "
            "(when its result is in place) or requeues it to run again, once this worker has "
            "exited"
        ), lost[0]
        assert "finish it again" not in worked.stderr + worked.stdout
        assert os.listdir(farm.queue / "claimed") == [job]

        # As told: space freed, then recover; the worker has exited, so the job runs again.
        fill.unlink()
        recovered = farm.ctx("queue", "recover", "--project", PROJECT, "--reconcile")
        assert recovered.returncode == 0, recovered
        assert os.listdir(farm.queue / "pending") == [job]
        assert os.listdir(farm.queue / "done") == os.listdir(farm.queue / "failed") == []
