"""Q-10: a claim must not cost a listing of pending/ per job."""

from __future__ import annotations

from pathlib import Path

from cortexfs.queue import Holder, Queue, claim, publish, publish_batch
from tests.queue.helpers import request


def test_draining_lists_pending_once_not_once_per_claim(queue_dir: Path, me: Holder) -> None:
    with Queue.open(queue_dir) as q:
        publish_batch(q, [request(n) for n in range(3000)])
        for _ in range(3000):
            assert claim(q, me) is not None
        assert claim(q, me) is None
        # One scan to fill the claim order, one more to find the queue empty.
        assert q.claim_order.scans == 2


def test_jobs_published_after_the_scan_are_claimed_after_older_ones(
    queue_dir: Path, me: Holder
) -> None:
    with Queue.open(queue_dir) as q:
        first = publish_batch(q, [request(n) for n in range(3)])
        took = claim(q, me)
        assert took is not None and took.job in first
        late = publish(q, request(9), name="late")
        order = [claim(q, me).job for _ in range(3)]  # type: ignore[union-attr]
        assert order[-1] == late and set(order[:2]) == set(first) - {took.job}
