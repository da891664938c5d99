"""Claims and recover on a filesystem that refuses ``flock`` on directories (docs/multi-host.md).

There J's lock is no lock, and a claim between the move of its request and its lease looks
to recover exactly like a crash's leftover (a claimed request with no lease).  Recover leaves
such a claim alone until it is older than a lease lifetime; a claimer stalled longer than
that, whose request recover took back meanwhile, withdraws the lease it then writes, and
claims J anew: J never runs on a claim that is not there (Q-3, I-4).

The refusal is the kernel's answer NFS gives (``ENOLCK``), made for directories only.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from pathlib import Path

import pytest

from cortexfs.durable import FsOps
from cortexfs.queue import Holder, Queue, claim, publish, recover
from tests.queue.helpers import request


@pytest.fixture(autouse=True)
def flock_refused_on_directories(monkeypatch: pytest.MonkeyPatch) -> None:
    real = fcntl.flock

    def refusing(fd: int, operation: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
        real(fd, operation)

    monkeypatch.setattr(fcntl, "flock", refusing)


class RecoverBeforeTheLease(FsOps):
    """Runs ``recover --reconcile`` on the queue once, as the claim begins its lease: with
    ``stalled``, after making ``claimed/J`` an hour old (a claimer stalled that long)."""

    def __init__(self, queue_dir: Path, job: str, stalled: bool) -> None:
        super().__init__()
        self.queue_dir, self.job, self.stalled = queue_dir, job, stalled
        self.reports: list = []

    def step(self, name: str) -> None:
        if name != "lease.write" or self.reports:
            return
        if self.stalled:
            hour_ago = time.time() - 3600
            os.utime(self.queue_dir / "claimed" / self.job, (hour_ago, hour_ago))
        with Queue.open(self.queue_dir) as other:
            self.reports.append(recover(other, reconcile=True))


def test_recover_leaves_a_fresh_claim_without_its_lease_alone(
    queue: Queue, queue_dir: Path, me: Holder
) -> None:
    job = publish(queue, request())
    ops = RecoverBeforeTheLease(queue_dir, job, stalled=False)
    with Queue.open(queue_dir, ops) as q:
        won = claim(q, me)
    assert won is not None and won.job == job
    (report,) = ops.reports
    assert report.requeued == [] and report.repaired == []
    (seen,) = report.untouched
    assert "this filesystem refuses flock" in seen.detail, seen.detail
    assert sorted(os.listdir(queue_dir / "claimed" / job)) == [job]
    assert os.listdir(queue_dir / "lease" / job) == ["worker"]
    assert os.listdir(queue_dir / "pending") == []


def test_a_claim_recover_took_back_withdraws_its_lease_and_claims_anew(
    queue: Queue, queue_dir: Path, me: Holder
) -> None:
    job = publish(queue, request())
    ops = RecoverBeforeTheLease(queue_dir, job, stalled=True)
    with Queue.open(queue_dir, ops) as q:
        won = claim(q, me)
    (report,) = ops.reports
    assert [finding.job for finding in report.repaired + report.requeued] == [job]
    # Taken back while its lease was being written, the claim withdrew that lease and won
    # J again: one claim, one lease, nothing pending.
    assert won is not None and won.job == job
    assert sorted(os.listdir(queue_dir / "claimed" / job)) == [job]
    assert os.listdir(queue_dir / "lease" / job) == ["worker"]
    assert os.listdir(queue_dir / "pending") == []
