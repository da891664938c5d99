"""A transition the kernel refuses midway (ENOSPC, EACCES…) is undone, not left half-done:
no claim without its lease, no temp file in inbox/, nothing a user must reconcile by hand."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from cortexfs.durable import FsOps
from cortexfs.errors import CtxError, remedy_for_host_trouble
from cortexfs.queue import Holder, Queue, claim, claiming, finish, publish, renew
from tests.queue.helpers import NoDescriptorForTheLease, request


class RefusesIn(FsOps):
    """Real operations, except that the first mkdir, rename or link into the directory
    ``refused`` (an open descriptor, set once the queue is open) fails with ``code``."""

    def __init__(self, code: int) -> None:
        super().__init__()
        self.code = code
        self.refused: int | None = None

    def _check(self, dir_fd: int) -> None:
        if self.refused is not None and os.path.samestat(os.fstat(dir_fd), os.fstat(self.refused)):
            raise OSError(self.code, os.strerror(self.code))

    def mkdir(self, name: str, dir_fd: int, mode: int = 0o777) -> None:
        self._check(dir_fd)
        super().mkdir(name, dir_fd, mode)

    def rename_noreplace(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
        self._check(dst_dir_fd)
        super().rename_noreplace(src, src_dir_fd, dst, dst_dir_fd)

    def link(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
        self._check(dst_dir_fd)
        super().link(src, src_dir_fd, dst, dst_dir_fd)

    def rename(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
        self._check(dst_dir_fd)
        super().rename(src, src_dir_fd, dst, dst_dir_fd)


def tree(queue_dir: Path) -> dict[str, list[str]]:
    return {
        state: sorted(os.listdir(queue_dir / state))
        for state in ("inbox", "pending", "claimed", "lease", "done", "failed")
    }


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES])
def test_a_claim_whose_lease_cannot_be_made_puts_the_job_back(
    queue: Queue, queue_dir: Path, me: Holder, code: int
) -> None:
    job = publish(queue, request(), "a")
    ops = RefusesIn(code)
    with Queue.open(queue_dir, ops) as q:
        ops.refused = q.lease
        with pytest.raises((OSError, CtxError)) as refused:
            claim(q, me)
    assert refused.value.errno == code
    assert tree(queue_dir) == {
        "inbox": [], "pending": [job], "claimed": [], "lease": [], "done": [], "failed": []
    }  # fmt: skip
    assert claim(queue, me).job == job  # nobody has to run recover first


def test_a_claim_whose_lease_file_cannot_be_moved_in_leaves_no_lease_directory(
    queue: Queue, queue_dir: Path, me: Holder
) -> None:
    job = publish(queue, request(), "a")

    class RefusesTheLeaseFile(FsOps):
        def rename_noreplace(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
            if dst == "worker":
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            super().rename_noreplace(src, src_dir_fd, dst, dst_dir_fd)

    with Queue.open(queue_dir, RefusesTheLeaseFile()) as q, pytest.raises(CtxError) as refused:
        claim(q, me)
    assert refused.value.errno == errno.EIO
    assert f"{queue_dir}/lease refused: Input/output error; nothing was claimed (job {job} " in (
        refused.value.message
    )
    assert tree(queue_dir)["pending"] == [job]
    assert tree(queue_dir)["claimed"] == tree(queue_dir)["lease"] == tree(queue_dir)["inbox"] == []


def test_a_publish_refused_by_pending_leaves_no_temp_file(queue_dir: Path) -> None:
    ops = RefusesIn(errno.ENOSPC)
    with Queue.open(queue_dir, ops) as q:
        ops.refused = q.pending
        with pytest.raises(CtxError) as refused:
            publish(q, request(), "a")
    assert refused.value.errno == errno.ENOSPC
    assert refused.value.message.startswith(
        f"cannot publish in queue {queue_dir}: {queue_dir}/pending refused: No space left on "
        "device (its filesystem has "
    )
    assert refused.value.message.endswith(
        "; nothing was published: free space on that filesystem, then publish again"
    )
    assert tree(queue_dir)["inbox"] == tree(queue_dir)["pending"] == []


@pytest.mark.parametrize(
    ("code", "ran_short", "remedy"),
    [
        (
            errno.ENFILE,
            " (the system has no file descriptor left)",
            "end processes that hold many files open, or raise the system's limit "
            "('sysctl fs.file-max')",
        ),
        (
            errno.EMFILE,
            " (this process has no file descriptor left)",
            "raise the limit of open files ('ulimit -n')",
        ),
        (errno.EDQUOT, "", f"free space within the disk quota of uid {os.geteuid()}"),
        (errno.ENOMEM, "", "free memory"),
    ],
)
def test_a_publish_refused_for_a_host_trouble_says_what_ran_short_and_the_whole_remedy(
    queue_dir: Path, code: int, ran_short: str, remedy: str
) -> None:
    """The queue words a host's trouble as every other command does (errors.py): in full."""
    ops = RefusesIn(code)
    with Queue.open(queue_dir, ops) as q:
        ops.refused = q.pending
        with pytest.raises(CtxError) as refused:
            publish(q, request(), "a")
    assert refused.value.errno == code
    assert refused.value.message == (
        f"cannot publish in queue {queue_dir}: {queue_dir}/pending refused: "
        f"{os.strerror(code)}{ran_short}; nothing was published: {remedy}, then publish again"
    )
    assert remedy == remedy_for_host_trouble(code, uid=os.geteuid())
    assert tree(queue_dir)["inbox"] == tree(queue_dir)["pending"] == []


def test_a_finish_refused_by_done_leaves_the_job_claimed_and_no_temp_file(
    queue: Queue, queue_dir: Path, me: Holder
) -> None:
    publish(queue, request(), "a")
    job = claim(queue, me)
    assert job is not None
    ops = RefusesIn(errno.ENOSPC)
    with Queue.open(queue_dir, ops) as q:
        ops.refused = q.done
        with pytest.raises(CtxError) as refused:
            finish(q, job.job, True, {"x": 1})
    assert f"{queue_dir}/done refused: No space left on device" in refused.value.message
    assert f"; job {job.job} stays claimed and no result of it was written: free space" in (
        refused.value.message
    )
    assert tree(queue_dir)["inbox"] == tree(queue_dir)["done"] == []
    assert tree(queue_dir)["claimed"] == tree(queue_dir)["lease"] == [job.job]
    finish(queue, job.job, True, {"x": 1})
    assert tree(queue_dir)["done"] == [job.job, f"{job.job}.result"]


def test_a_renewal_refused_leaves_the_old_lease_and_no_temp_file(
    queue: Queue, queue_dir: Path, me: Holder
) -> None:
    publish(queue, request(), "a")
    won = claim(queue, me)
    assert won is not None
    before = (queue_dir / "lease" / won.job / "worker").read_bytes()
    ops = RefusesIn(errno.ENOSPC)
    with Queue.open(queue_dir, ops) as q:
        ops.refused = q.open_job_dir("lease", won.job)
        try:
            with pytest.raises(CtxError) as refused:
                renew(q, won.job, [me], 600)
        finally:
            os.close(ops.refused)
    assert (queue_dir / "lease" / won.job / "worker").read_bytes() == before
    assert tree(queue_dir)["inbox"] == []
    expires = won.lease.to_json()["expires_at"]
    assert f"{queue_dir}/lease/{won.job} refused: No space left on device" in refused.value.message
    assert f"the lease on {won.job} is unchanged (it expires at {expires})" in refused.value.message


def test_a_claim_whose_lease_temp_file_is_refused_names_inbox_and_puts_the_job_back(
    queue: Queue, queue_dir: Path, me: Holder
) -> None:
    job = publish(queue, request(), "a")

    class RefusesTheLeaseTemp(FsOps):
        def create_file(self, name: str, dir_fd: int, mode: int = 0o666) -> int:
            if ".lease." in name:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), name)
            return super().create_file(name, dir_fd, mode)

    with Queue.open(queue_dir, RefusesTheLeaseTemp()) as q, pytest.raises(CtxError) as refused:
        claim(q, me)
    assert refused.value.errno == errno.EACCES
    assert f"{queue_dir}/inbox refused" in refused.value.message, refused.value.message
    assert tree(queue_dir)["pending"] == [job]
    assert tree(queue_dir)["claimed"] == tree(queue_dir)["lease"] == tree(queue_dir)["inbox"] == []


def test_a_claimed_request_that_cannot_be_read_is_put_back_and_the_error_raised(
    queue: Queue, queue_dir: Path, me: Holder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An I/O error is not "nothing to claim": the claimer hears of it, with its errno, where
    and that nothing was claimed, and J waits."""
    job = publish(queue, request(), "a")
    claimed = os.fstat(queue.claimed)

    def failing_read(q: Queue, dir_fd: int, name: str) -> bytes:
        if os.path.samestat(os.stat("..", dir_fd=dir_fd), claimed):
            raise OSError(errno.EIO, os.strerror(errno.EIO), name)
        return read_stored_request(q, dir_fd, name)

    read_stored_request = claiming._read_stored_request
    monkeypatch.setattr(claiming, "_read_stored_request", failing_read)
    with pytest.raises(CtxError) as refused:
        claim(queue, me)
    assert refused.value.errno == errno.EIO
    assert f"claimed/{job} refused: Input/output error" in refused.value.message
    assert f"nothing was claimed (job {job} stays pending)" in refused.value.message
    assert tree(queue_dir)["pending"] == [job]
    assert tree(queue_dir)["claimed"] == tree(queue_dir)["lease"] == []


class FailsOnClaimedJob(FsOps):
    """Real operations, except opening a ``claimed/J`` directory (``failing="open"``) or
    syncing ``claimed/`` (``failing="sync"``) once the queue is open."""

    def __init__(self, failing: str, code: int) -> None:
        super().__init__()
        self.failing, self.code = failing, code
        self.claimed: int | None = None

    def open_dir(self, name: str, dir_fd: int | None = None) -> int:
        if self.failing == "open" and self.claimed is not None and dir_fd == self.claimed:
            raise OSError(self.code, os.strerror(self.code), name)
        return super().open_dir(name, dir_fd)

    def fsync(self, fd: int) -> None:
        if self.failing == "sync" and self.claimed is not None and fd == self.claimed:
            raise OSError(self.code, os.strerror(self.code))
        super().fsync(fd)


@pytest.mark.parametrize(("failing", "code"), [("open", errno.EMFILE), ("sync", errno.EIO)])
def test_a_claim_refused_before_the_move_leaves_no_empty_claim_directory(
    queue: Queue, queue_dir: Path, me: Holder, failing: str, code: int
) -> None:
    """Out of descriptors when it opens its claimed/J, or refused the sync that makes it
    durable: the claim is undone, so J is still claimable (an empty claimed/J would hide it
    from every claimer until a reconcile)."""
    job = publish(queue, request(), "a")
    ops = FailsOnClaimedJob(failing, code)
    with Queue.open(queue_dir, ops) as q:
        ops.claimed = q.claimed
        # The claim's own clean-up syncs claimed/ too, and may meet the same EIO.
        with pytest.raises((OSError, CtxError)) as refused:
            claim(q, me)
    assert refused.value.errno == code
    assert tree(queue_dir)["pending"] == [job]
    assert tree(queue_dir)["claimed"] == tree(queue_dir)["lease"] == []
    assert claim(queue, me).job == job


def finish_cut_short(
    queue_dir: Path, job: str, me: Holder, code: int
) -> pytest.ExceptionInfo[CtxError]:
    """Finish ``job`` ok with ``{"n": 1}``, the move of its request refused with ``code``
    once the result is in place; the error that finish raised."""

    class RefusesTheRequestsMove(FsOps):
        def rename_noreplace(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
            if dst == job:
                raise OSError(code, os.strerror(code))
            super().rename_noreplace(src, src_dir_fd, dst, dst_dir_fd)

    with Queue.open(queue_dir, RefusesTheRequestsMove()) as q, pytest.raises(CtxError) as cut:
        finish(q, job, True, {"n": 1}, holder=me)
    return cut


def test_a_finish_cut_short_after_its_result_moved_in_is_completed_by_finishing_again(
    queue: Queue, queue_dir: Path, me: Holder
) -> None:
    """The disk fills between the result's move and the request's: the holder's second
    finish completes the first (its result stands) instead of EEXIST until the holder is
    gone, while recover must leave a live holder's job alone."""
    publish(queue, request(), "a")
    job = claim(queue, me).job

    cut = finish_cut_short(queue_dir, job, me, errno.ENOSPC)

    assert cut.value.errno == errno.ENOSPC
    assert "finishing it again with the same outcome completes it" in cut.value.message
    assert tree(queue_dir)["done"] == [job + ".result"] and tree(queue_dir)["claimed"] == [job]

    completed = finish(queue, job, True, {"n": 1}, holder=me)

    assert completed["output"] == {"n": 1} and completed["status"] == "ok"
    assert tree(queue_dir) == {
        "inbox": [], "pending": [], "claimed": [], "lease": [], "done": [job, job + ".result"],
        "failed": [],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("ok", "output", "planted"),
    [(False, {"n": 1}, False), (True, {"n": 2}, False), (True, {"n": 1}, True)],
    ids=["another status", "another output", "pending too (a conflict)"],
)
def test_a_finish_cut_short_is_not_completed_with_another_outcome_or_over_a_conflict(
    queue: Queue, queue_dir: Path, me: Holder, ok: bool, output: Any, planted: bool
) -> None:
    publish(queue, request(), "a")
    job = claim(queue, me).job
    finish_cut_short(queue_dir, job, me, errno.EIO)
    if planted:  # the same name published again meanwhile: recover never touches it
        shutil.copy(queue_dir / "claimed" / job / job, queue_dir / "pending" / job)
    before = tree(queue_dir)

    with pytest.raises(CtxError) as refused:
        finish(queue, job, ok, output, holder=me)

    assert refused.value.errno == errno.EEXIST
    assert tree(queue_dir) == before
    assert tree(queue_dir)["claimed"] == [job]


def test_a_claim_refused_for_want_of_descriptors_at_its_lease_leaves_no_trace(
    queue: Queue, queue_dir: Path, me: Holder
) -> None:
    """Out of descriptors when it opens lease/J, the claim puts J back; its clean-up, which
    would open lease/J again, must not fail the same way and leave an empty claimed/J."""
    job = publish(queue, request(), "a")

    ops = NoDescriptorForTheLease()
    with Queue.open(queue_dir, ops) as q:
        ops.lease = q.lease
        with pytest.raises(CtxError) as refused:
            claim(q, me)

    assert refused.value.errno == errno.EMFILE
    assert "(this process has no file descriptor left); nothing was claimed" in (
        refused.value.message
    )
    assert tree(queue_dir) == {
        "inbox": [], "pending": [job], "claimed": [], "lease": [], "done": [], "failed": []
    }  # fmt: skip
    assert claim(queue, me).job == job


class NoDescriptorFor(FsOps):
    """Real operations, except that opening the queue's own ``name`` (a state directory or
    its config, looked up below the queue's directory) fails with EMFILE."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def open_dir(self, name: str, dir_fd: int | None = None) -> int:
        if name == self.name:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE), name)
        return super().open_dir(name, dir_fd)


@pytest.mark.parametrize("state", ["pending", "failed"])
def test_a_queue_that_cannot_be_opened_for_want_of_descriptors_says_so_whole(
    queue_dir: Path, state: str
) -> None:
    """Out of descriptors while it opens its state directories, a command says which queue and
    directory refused, what ran short, that the queue was not changed and what mends it (never
    a bare 'pending: Too many open files'), and leaves no descriptor of its own open."""
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(CtxError) as refused:
        Queue.open(queue_dir, NoDescriptorFor(state))
    assert refused.value.errno == errno.EMFILE
    assert refused.value.message == (
        f"cannot open queue {queue_dir}: {queue_dir}/{state} refused: Too many open files "
        "(this process has no file descriptor left); nothing in it was changed: raise the "
        "limit of open files ('ulimit -n'), then run the command again"
    )
    assert sorted(os.listdir("/proc/self/fd")) == before


class MeetsALinkAtTheClaim(FsOps):
    """Real operations, but the open of ``claimed/J`` meets something that is no directory
    (ELOOP, as O_NOFOLLOW meets a link), as when another member has just swapped a link in
    and back again."""

    claimed: int | None = None

    def open_dir(self, name: str, dir_fd: int | None = None) -> int:
        if self.claimed is not None and dir_fd == self.claimed:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name)
        return super().open_dir(name, dir_fd)


def test_a_finish_that_met_a_swapped_claim_says_what_it_met_not_what_is_back(
    queue: Queue, queue_dir: Path, me: Holder
) -> None:
    """Q-8: the refusal names what the open met, never "a directory, not a directory" when
    the directory is back by the time it looks again; nothing is changed."""
    job = publish(queue, request(), "swapped")
    assert claim(queue, me).job == job

    ops = MeetsALinkAtTheClaim()
    with Queue.open(queue_dir, ops) as q:
        ops.claimed = q.claimed
        with pytest.raises(CtxError) as refused:
            finish(q, job, True, {"answer": 1})

    assert refused.value.errno == errno.ELOOP
    assert "was no directory when this command opened it" in refused.value.message
    assert "is a directory, not a directory" not in refused.value.message
    assert tree(queue_dir)["claimed"] == [job] and tree(queue_dir)["done"] == []
