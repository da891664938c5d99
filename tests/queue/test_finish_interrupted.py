"""A finish interrupted after its result moved in, while the lease holder lives (Q-4, Q-6).

recover --reconcile leaves a live holder's job alone, so finish and recover must both say
when it will complete it (once the holder has exited or its lease has expired), or a user
goes from one to the other in a circle.  Finishing again completes it now only with the same
outcome and output, and only a result that names the lease's holder: one naming another
finisher (an older release's shell finish named the shell) could be another finish still
moving J where flock does not work, and is left to recover.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from cortexfs.durable import FsOps
from cortexfs.errors import CtxError
from cortexfs.queue import Holder, Queue, claim, finish, publish, recover
from cortexfs.queue.leasing import read_lease
from tests.queue.helpers import dead_pid, request


def tree(queue_dir: Path) -> dict[str, list[str]]:
    return {d.name: sorted(os.listdir(d)) for d in sorted(queue_dir.iterdir()) if d.is_dir()}


def cut_short(
    queue_dir: Path, job: str, ok: bool, output: Any, worker: Mapping[str, Any] | None = None
) -> None:
    """Finish ``job`` (recording ``worker``, by default the lease's holder), the move of its
    request refused once the result is in place, as a crash there leaves it."""

    class RefusesTheRequestsMove(FsOps):
        def rename_noreplace(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
            if dst == job:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            super().rename_noreplace(src, src_dir_fd, dst, dst_dir_fd)

    with Queue.open(queue_dir, RefusesTheRequestsMove()) as q, pytest.raises(CtxError):
        finish(q, job, ok, output, worker=worker)
    assert tree(queue_dir)["claimed"] == [job]


@pytest.fixture
def living() -> Iterator[Holder]:
    """A lease holder that lives for the test (not the test's own process)."""
    process = subprocess.Popen(["sleep", "300"])
    try:
        yield Holder.for_process(process.pid, worker="w")
    finally:
        process.kill()
        process.wait()


def claimed(queue: Queue, holder: Holder) -> str:
    publish(queue, request(), name="j")
    won = claim(queue, holder, ttl=3600)
    assert won is not None
    return won.job


def test_finish_and_recover_say_when_recover_completes_a_live_holders_interrupted_finish(
    queue: Queue, queue_dir: Path, living: Holder
) -> None:
    job = claimed(queue, living)
    cut_short(queue_dir, job, True, {"n": 1})
    expires = read_lease(queue, job).to_json()["expires_at"]
    once = (
        f"'ctx queue recover --reconcile' completes it once its lease holder (pid {living.pid} "
        f"on {living.host}) has exited or its lease has expired (at {expires})"
    )
    before = tree(queue_dir)

    with pytest.raises(CtxError) as refused:
        finish(queue, job, False, {"n": 2})  # another outcome: the result in place stands
    report = recover(queue, reconcile=True)

    said = refused.value.message
    assert refused.value.errno == errno.EEXIST
    assert f"an earlier finish of {job} was interrupted after its result was in place" in said
    assert (
        "finishing it again in done/ with the output recorded there completes it now, or " + once
    ) in said
    assert said.endswith("; until then it leaves the job alone; nothing was changed")
    [incomplete] = report.incomplete
    assert incomplete.detail.endswith(f"is running; {once}")
    assert not report.consistent
    assert tree(queue_dir) == before


def test_finish_says_recover_completes_it_now_once_the_holder_is_gone(
    queue: Queue, queue_dir: Path, me: Holder
) -> None:
    gone = dataclasses.replace(me, pid=dead_pid())
    job = claimed(queue, gone)
    cut_short(queue_dir, job, True, {"n": 1})

    with pytest.raises(CtxError) as refused:
        finish(queue, job, True, {"n": 2})

    assert f"completes it now (pid {gone.pid} on {gone.host} has exited)" in (refused.value.message)
    assert recover(queue, reconcile=True).consistent


def test_a_result_naming_another_finisher_is_left_to_recover(
    queue: Queue, queue_dir: Path, living: Holder, me: Holder
) -> None:
    """An older release's shell finish recorded itself (the shell), not the lease's holder:
    finishing again, even with the same outcome and output, does not complete it (without
    flock, that finisher could still be moving J), and the refusal says when recover will."""
    job = claimed(queue, living)
    cut_short(queue_dir, job, True, {"n": 1}, worker=me.summary())
    before = tree(queue_dir)

    with pytest.raises(CtxError) as refused:
        finish(queue, job, True, {"n": 1})

    said = refused.value.message
    assert refused.value.errno == errno.EEXIST and "finishing it again" not in said
    assert (
        f"'ctx queue recover --reconcile' completes it once its lease holder (pid {living.pid} "
        f"on {living.host}) has exited"
    ) in said
    assert tree(queue_dir) == before


@pytest.mark.parametrize(
    ("ok", "output"),
    [(True, {"n": 2}), (False, {"n": 1})],
    ids=["another output", "another outcome"],
)
def test_this_claims_result_is_not_completed_with_another_outcome(
    queue: Queue, queue_dir: Path, living: Holder, ok: bool, output: Any
) -> None:
    job = claimed(queue, living)
    cut_short(queue_dir, job, True, {"n": 1})
    before = tree(queue_dir)

    with pytest.raises(CtxError) as refused:
        finish(queue, job, ok, output)

    assert refused.value.errno == errno.EEXIST
    assert "finishing it again in done/ with the output recorded there" in refused.value.message
    assert tree(queue_dir) == before
