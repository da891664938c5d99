"""A transition that fails after a step it cannot undo (an fsync reporting EIO after the
no-replace move) says where the job stands and what to do, not a bare EIO that invites a retry
publishing or finishing the job twice."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from cortexfs.durable import MOVE_LINK, MOVE_RENAME, FsOps
from cortexfs.errors import CtxError
from cortexfs.queue import Holder, Queue, claim, finish, publish, publish_batch, recover
from tests.queue.helpers import dead_pid, request


class FsyncFailsAfter(FsOps):
    """Real operations, except that the first fsync after protocol step ``step`` reports EIO,
    as a disk does when its write-back fails."""

    def __init__(self, step: str, move_strategy: str | None = None) -> None:
        super().__init__(move_strategy)
        self.armed_at = step
        self.armed = False

    def step(self, name: str) -> None:
        self.armed = self.armed or name == self.armed_at

    def fsync(self, fd: int) -> None:
        if self.armed:
            self.armed, self.armed_at = False, ""
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        super().fsync(fd)


def listing(queue_dir: Path, state: str) -> list[str]:
    return sorted(os.listdir(queue_dir / state))


@pytest.mark.parametrize("strategy", [MOVE_RENAME, MOVE_LINK])
def test_a_publish_whose_move_cannot_be_synced_says_not_to_publish_again(
    queue_dir: Path, strategy: str
) -> None:
    opened = Queue.open(queue_dir, FsyncFailsAfter("publish.move", strategy))
    with opened as q, pytest.raises(CtxError) as failed:
        publish(q, request(), "b")

    assert failed.value.errno == errno.EIO
    assert failed.value.message.startswith(
        "b.req.json is in pending/ and will be claimed, but syncing the queue after the move "
        "failed (EIO: Input/output error), so a crash may still lose it: do not publish it "
        "again"
    )
    assert listing(queue_dir, "pending") == ["b.req.json"]
    assert failed.value.to_json()["published"] == ["b.req.json"]  # printed as a publish prints


def test_a_batch_whose_moves_cannot_be_synced_names_what_it_published(queue_dir: Path) -> None:
    opened = Queue.open(queue_dir, FsyncFailsAfter("publish_batch.move"))
    with opened as q, pytest.raises(CtxError) as failed:
        publish_batch(q, [request(1), request(2)], names=["c", "d"])

    assert failed.value.errno == errno.EIO
    assert failed.value.message.startswith("c.req.json, d.req.json are in pending/")
    assert "do not publish them again" in failed.value.message
    assert listing(queue_dir, "pending") == ["c.req.json", "d.req.json"]
    assert failed.value.to_json()["published"] == ["c.req.json", "d.req.json"]
    assert failed.value.to_json()["not_published"] == []


def test_a_claim_whose_move_cannot_be_synced_says_what_returns_the_job(
    queue: Queue, queue_dir: Path, me: Holder
) -> None:
    job = publish(queue, request(), "e")
    opened = Queue.open(queue_dir, FsyncFailsAfter("claim.move"))
    with opened as q, pytest.raises(CtxError) as failed:
        claim(q, me)

    assert failed.value.errno == errno.EIO
    assert "it has no lease and never ran; 'ctx queue recover --reconcile' returns it to " in (
        failed.value.message
    )
    assert [f.job for f in recover(queue, reconcile=True).repaired] == [job]
    assert listing(queue_dir, "pending") == [job]


@pytest.mark.parametrize(
    ("step", "detail"),
    [
        ("finish.result", "done/J.result exists but the request is still in claimed/"),
        ("finish.request", "done, with a leftover claim or lease"),
    ],
)
def test_a_finish_cut_short_after_its_result_names_the_incomplete_pair(
    queue: Queue, queue_dir: Path, step: str, detail: str
) -> None:
    """Q-4: once the result is in done/ the finish cannot go back; what is left is an
    incomplete pair that recover --reconcile completes when the lease holder is gone."""
    job = publish(queue, request(), "f")
    holder = Holder.for_process(dead_pid(), "w")
    assert claim(queue, holder) is not None
    opened = Queue.open(queue_dir, FsyncFailsAfter(step))
    with opened as q, pytest.raises(CtxError) as failed:
        finish(q, job, True, "out")

    message = failed.value.message
    assert failed.value.errno == errno.EIO
    assert message.startswith(
        "finishing f.req.json failed after its result was in place (EIO: Input/output error)"
    )
    assert f"job f.req.json is incomplete ({detail}" in message
    # Finishing again completes only a result beside its claimed request (roll forward).
    assert ("finishing it again with the same outcome completes it" in message) == (
        step == "finish.result"
    )
    assert "'ctx queue recover --reconcile' completes it once its lease holder (pid " in message
    assert f"lease holder (pid {holder.pid} on {holder.host}) has exited" in message
    assert recover(queue, reconcile=True).consistent
    assert listing(queue_dir, "done") == [job, f"{job}.result"]
