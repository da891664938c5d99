"""Q-10: a claim must not cost a listing of pending/ per job."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cortexfs.queue import (
    Holder,
    Queue,
    claim,
    claim_order,
    init_queue,
    publish,
    publish_batch,
    recover,
)
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


def test_a_process_starts_from_the_hint_when_it_accounts_for_pending(
    cache: Path, tmp_path: Path, me: Holder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Q-10: a worker starting on a long queue reads its order from the hint instead of an
    lstat per pending job, when the hint's stamp is pending/'s; otherwise it lists."""
    queue_dir = tmp_path / "q"
    init_queue(queue_dir)  # starts the hint
    with Queue.open(queue_dir) as q:
        jobs = publish_batch(q, [request(n) for n in range(30)])
    listings: list[int] = []
    listing = claim_order.scan_pending
    monkeypatch.setattr(claim_order, "scan_pending", lambda fd: listings.append(fd) or listing(fd))

    with Queue.open(queue_dir) as q:
        claimed = [claim(q, me).job for _ in range(10)]  # type: ignore[union-attr]
    assert claimed == jobs[:10] and listings == [], "the hint stood in for the listing"

    (queue_dir / "pending" / "by-hand.req.json").write_text(json.dumps(request()))
    os.utime(queue_dir / "pending" / "by-hand.req.json", (1, 1))
    with Queue.open(queue_dir) as q:
        assert claim(q, me).job == "by-hand.req.json"  # type: ignore[union-attr]
    assert len(listings) == 1, "a hint that no longer accounts for pending/ is not used"


def test_a_job_a_killed_claim_took_off_the_hint_is_still_found_by_a_new_process(
    cache: Path, tmp_path: Path, me: Holder
) -> None:
    """The hint is no listing: when its names run out, the claim lists pending/ after all."""
    queue_dir = tmp_path / "q"
    init_queue(queue_dir)
    with Queue.open(queue_dir) as q:
        publish(q, request(), name="lost")
        claim_order.HintFile.of(q.path).next_name(q.pending, False)  # the killed claim
    with Queue.open(queue_dir) as q:
        won = claim(q, me)
    assert won is not None and won.job == "lost.req.json"


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


def test_a_requeued_job_is_handed_out_first_without_a_listing(
    cache: Path, queue_dir: Path, me: Holder
) -> None:
    """Q-9: recover puts J back with its old publish time, so J goes before the jobs
    published after it, and the hint says so without a listing (Q-10)."""
    with Queue.open(queue_dir) as q:
        publish(q, request(), name="again")
        publish_batch(q, [request(1), request(2)], names=["later-1", "later-2"])
    gone = dataclasses.replace(me, pid=dead_pid())
    assert one_shot_claim(queue_dir, gone) == ("again.req.json", 0)
    with Queue.open(queue_dir) as q:
        assert [f.job for f in recover(q).requeued] == ["again.req.json"]
    claims = [one_shot_claim(queue_dir, me) for _ in range(3)]
    assert claims == [("again.req.json", 0), ("later-1.req.json", 0), ("later-2.req.json", 0)]


def test_recover_gives_back_the_turn_of_a_job_whose_claim_was_killed(
    cache: Path, queue_dir: Path, me: Holder
) -> None:
    """Q-9: a claim killed after taking the oldest name off the hint, before it claimed the
    job, leaves the job pending but out of the hint, behind every newer job.  Recover, run
    after a crash, lists pending/ into the hint again: the oldest job is claimed first."""
    with Queue.open(queue_dir) as q:
        publish(q, request(), name="oldest")
        publish(q, request(), name="older")
    with Queue.open(queue_dir) as q:  # the killed claim: the name taken, nothing claimed
        assert claim_order.HintFile.of(q.path).next_name(q.pending, False) == (
            "oldest.req.json",
            False,
        )
    with Queue.open(queue_dir) as q:
        publish(q, request(), name="newer")
        report = recover(q)
    assert report.consistent and not report.requeued  # nothing on disk was wrong
    claims = [one_shot_claim(queue_dir, me) for _ in range(3)]
    assert claims == [("oldest.req.json", 0), ("older.req.json", 0), ("newer.req.json", 0)]


def test_a_hint_grown_to_a_terabyte_costs_a_listing_and_stops_no_requeue(
    cache: Path, queue_dir: Path, me: Holder
) -> None:
    """A hint a stray ``truncate`` grew far past what its names could make (sparse) is
    garbled, never read whole: the reader lists pending/ instead, and a requeue that tells
    it of the job put back first is whole all the same (recover then lists the hint anew)."""
    with Queue.open(queue_dir) as q:
        publish(q, request(), name="again")
        publish(q, request(), name="later")
    with Queue.open(queue_dir) as q:  # an order of its own: the hint has no room before its cursor
        won = claim(q, dataclasses.replace(me, pid=dead_pid()))
        assert won is not None and won.job == "again.req.json"
    os.truncate(hint_path(queue_dir), 1 << 40)
    with Queue.open(queue_dir) as q:
        assert claim_order.pending_in_claim_order(q) == ["later.req.json"]
        assert [f.job for f in recover(q).requeued] == ["again.req.json"]
    assert sorted(os.listdir(queue_dir / "pending")) == ["again.req.json", "later.req.json"]
    assert os.listdir(queue_dir / "claimed") == os.listdir(queue_dir / "lease") == []
    assert one_shot_claim(queue_dir, me) == ("again.req.json", 0)


def test_a_hint_another_process_holds_holds_up_no_publish_nor_claim(
    cache: Path, tmp_path: Path, me: Holder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process of the same user that keeps the hint's lock (stopped with Ctrl-Z in the
    middle of a claim's listing): a publish waits for it HINT_LOCK_SECONDS at most, then goes
    on without the hint, and the process does not wait for it again: the claim and the next
    publish try it once, the claim lists pending/ itself and finds the job."""
    monkeypatch.setattr(claim_order, "HINT_LOCK_SECONDS", 1.5)
    queue_dir = tmp_path / "q"
    init_queue(queue_dir)
    keeper = subprocess.Popen(
        [sys.executable, "-c", HOLD_FOR_TEN_SECONDS, str(hint_path(queue_dir))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert keeper.stdout is not None and keeper.stdout.readline() == "held\n"
        began = time.monotonic()
        with Queue.open(queue_dir) as q:
            job = publish(q, request(), name="meanwhile")
        won, scans = one_shot_claim(queue_dir, me)
        with Queue.open(queue_dir) as q:
            publish(q, request(), name="after")
        took = time.monotonic() - began
    finally:
        keeper.kill()
        keeper.wait()
    assert took < 3.5, f"waited {took:.1f}s for a lock the hint's keeper would not let go"
    assert (won, scans) == (job, 1)


HOLD_FOR_TEN_SECONDS = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(10)
"""


def test_a_dry_run_recover_and_a_user_without_a_hint_leave_the_cache_alone(
    cache: Path, queue_dir: Path
) -> None:
    hint = hint_path(queue_dir)
    with Queue.open(queue_dir) as q:
        publish(q, request(), name="waiting")
        before = hint.read_bytes()
        recover(q, dry_run=True)
        assert hint.read_bytes() == before
        hint.unlink()
        recover(q)
    assert not hint.exists()


def test_changes_nobody_told_the_hint_about_are_seen_as_often_as_q10_allows(
    cache: Path, tmp_path: Path, me: Holder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Q-9, Q-10: a job put in pending/ by hand (or by another user, another host) with an
    older publish time is claimed before newer ones once the claims since the last listing
    have paid for a listing: one per SCAN_BUDGET pending entries, never one per claim."""
    monkeypatch.setattr(claim_order, "SCAN_BUDGET", 10)
    queue_dir = tmp_path / "q"
    init_queue(queue_dir)
    with Queue.open(queue_dir) as q:
        publish_batch(q, [request(n) for n in range(100)])
    claimed: list[str | None] = []
    placed: dict[str, int] = {}
    scans = 0
    for turn in range(40):
        if turn % 10 == 0:
            job = f"by-hand-{turn}.req.json"
            (queue_dir / "pending" / job).write_text(json.dumps(request()))
            os.utime(queue_dir / "pending" / job, (1_000_000_000, 1_000_000_000))
            placed[job] = turn
        job, listed = one_shot_claim(queue_dir, me)
        claimed.append(job)
        scans += listed
    for job, turn in placed.items():
        assert claimed.index(job) - turn <= 100 // 10, (job, claimed)
    # One listing per change once 9 or 10 claims paid for it; one per claim would be 40.
    assert 3 <= scans <= 5, scans


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
