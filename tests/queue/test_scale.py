"""Q-10: a claim must not cost a listing of pending/ per job."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest

from cortexfs.queue import Holder, Queue, claim, init_queue, publish, publish_batch, recover
from cortexfs.queue.claim_order import HintedClaimOrder, hint_path
from tests.queue.helpers import dead_pid, request


def test_draining_lists_pending_once_not_once_per_claim(queue_dir: Path, me: Holder) -> None:
    with Queue.open(queue_dir) as q:
        publish_batch(q, [request(n) for n in range(800)])
        for _ in range(800):
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


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def one_shot_claim(queue_dir: Path, me: Holder) -> tuple[str | None, int]:
    """A claim as a separate ``ctx queue claim`` process makes it: fresh queue, fresh order."""
    with Queue.open(queue_dir) as q:
        q.claim_order = HintedClaimOrder(q.path)
        won = claim(q, me)
        return (won.job if won else None), q.claim_order.scans


def test_one_shot_claims_of_a_new_queue_never_list_pending(
    cache: Path, tmp_path: Path, me: Holder
) -> None:
    queue_dir = tmp_path / "q"
    init_queue(queue_dir)
    with Queue.open(queue_dir) as q:
        first = publish_batch(q, [request(n) for n in range(60)])
        second = publish_batch(q, [request(n) for n in range(60)])
    claimed, scans = [], 0
    for _ in range(120):
        job, listed = one_shot_claim(queue_dir, me)
        claimed.append(job)
        scans += listed
    assert scans == 0
    assert claimed[:60] == first and claimed[60:] == second  # publish order kept
    assert one_shot_claim(queue_dir, me) == (None, 1)  # used up: one listing finds nothing


def test_jobs_the_hint_never_saw_are_found_by_one_listing(
    cache: Path, queue_dir: Path, me: Holder
) -> None:
    hint = hint_path(queue_dir)
    hint.unlink(missing_ok=True)  # e.g. published by another user
    with Queue.open(queue_dir) as q:
        jobs = set(publish_batch(q, [request(n) for n in range(5)]))
    found = {one_shot_claim(queue_dir, me) for _ in range(5)}
    assert {job for job, _ in found} == jobs
    assert sum(scans for _, scans in found) == 1 and hint.exists()


def test_a_requeued_job_is_handed_out_without_a_listing(
    cache: Path, queue_dir: Path, me: Holder
) -> None:
    with Queue.open(queue_dir) as q:
        publish(q, request(), name="again")
    gone = dataclasses.replace(me, pid=dead_pid())
    assert one_shot_claim(queue_dir, gone)[0] == "again.req.json"
    with Queue.open(queue_dir) as q:
        assert [f.job for f in recover(q).requeued] == ["again.req.json"]
    assert one_shot_claim(queue_dir, me) == ("again.req.json", 0)


def test_a_garbled_hint_is_never_trusted(cache: Path, queue_dir: Path, me: Holder) -> None:
    with Queue.open(queue_dir) as q:
        job = publish(q, request(), name="real")
    hint = hint_path(queue_dir)
    hint.write_bytes(b"00000000000000000021\n../../etc/passwd\n\x00\xff junk\n.hidden.req.json\n")
    assert one_shot_claim(queue_dir, me) == (job, 1)
    hint.write_bytes(b"not a cursor at all")
    with Queue.open(queue_dir) as q:
        publish(q, request(), name="next")
    assert one_shot_claim(queue_dir, me)[0] == "next.req.json"


def test_starting_a_hint_removes_hints_unused_for_a_month(cache: Path, tmp_path: Path) -> None:
    old_queue, recent_queue = tmp_path / "old" / "queue", tmp_path / "recent" / "queue"
    init_queue(old_queue)
    init_queue(recent_queue)
    month_ago = time.time() - 31 * 24 * 3600
    os.utime(hint_path(old_queue), (month_ago, month_ago))

    init_queue(tmp_path / "new" / "queue")

    assert not hint_path(old_queue).exists()
    assert hint_path(recent_queue).exists() and hint_path(tmp_path / "new" / "queue").exists()
