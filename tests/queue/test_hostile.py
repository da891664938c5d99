"""What is not a job (Q-8): never followed, opened through a link, executed or moved."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cortexfs.durable import FsOps
from cortexfs.errors import CtxError
from cortexfs.queue import (
    Holder,
    Queue,
    claim,
    finish,
    init_queue,
    publish,
    recover,
    renew,
    transition,
)
from cortexfs.queue.inspect import status
from tests.queue.helpers import request


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A valid-looking request outside the queue that nothing may read or move."""
    target = tmp_path / "outside.json"
    target.write_text(json.dumps(request(99)))
    old = time.time() - 10_000
    os.utime(target, (old, old))
    return target


def untouched(path: Path) -> bool:
    st = path.stat()
    return st.st_atime < time.time() - 9_000 and json.loads(path.read_text())["input"] == {"n": 99}


def ignored_reasons(queue: Queue) -> dict[str, str]:
    return {entry.path: entry.reason for entry in status(queue).ignored}


def test_a_symlink_in_pending_is_ignored_and_never_followed(
    queue: Queue, me: Holder, queue_dir: Path, outside: Path
) -> None:
    link = queue_dir / "pending" / "evil.req.json"
    link.symlink_to(outside)
    assert claim(queue, me) is None
    assert ignored_reasons(queue) == {"pending/evil.req.json": "a symlink, not a request file"}
    assert recover(queue, reconcile=True, grace=0).consistent
    assert link.is_symlink() and untouched(outside)


def test_a_fifo_in_pending_never_blocks_a_claim(queue: Queue, me: Holder, queue_dir: Path) -> None:
    os.mkfifo(queue_dir / "pending" / "pipe.req.json")
    real = publish(queue, request(), name="real")
    won = claim(queue, me)
    assert won is not None and won.job == real
    assert claim(queue, me) is None
    assert ignored_reasons(queue)["pending/pipe.req.json"] == "a FIFO, not a request file"


@pytest.mark.parametrize("where", ["claimed", "lease"])
def test_a_fifo_inside_a_job_directory_is_ignored_and_the_rest_recovered(
    queue: Queue, me: Holder, queue_dir: Path, where: str
) -> None:
    """One special file in ``claimed/J/`` or ``lease/J/`` is J's conflict, not the queue's:
    status lists it, and recover still handles every other job."""
    job = "odd.req.json"
    (queue_dir / "claimed" / job).mkdir()
    (queue_dir / "lease" / job).mkdir()
    inner = "worker" if where == "lease" else job
    other = "worker" if where == "claimed" else job
    os.mkfifo(queue_dir / where / job / inner)
    (queue_dir / ("lease" if where == "claimed" else "claimed") / job / other).write_text(
        json.dumps(request())
    )
    abandoned = publish(queue, request(), name="abandoned")
    assert claim(queue, me, ttl=0.001) is not None  # a lease that expires at once
    time.sleep(0.01)

    assert ignored_reasons(queue)[f"{where}/{job}/{inner}"] == "a FIFO, not a regular file"
    report = recover(queue)
    assert [finding.job for finding in report.requeued] == [abandoned]
    assert (queue_dir / "pending" / abandoned).is_file()
    assert stat.S_ISFIFO(os.lstat(queue_dir / where / job / inner).st_mode)


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        (".hidden.req.json", "dot-file"),
        ("no suffix", "illegal job name"),
        ("notes.txt", "illegal job name"),
    ],
)
def test_dot_files_and_illegal_names_are_ignored(
    queue: Queue, me: Holder, queue_dir: Path, name: str, reason: str
) -> None:
    (queue_dir / "pending" / name).write_text(json.dumps(request()))
    assert claim(queue, me) is None
    assert ignored_reasons(queue)[f"pending/{name}"].startswith(reason)
    assert (queue_dir / "pending" / name).exists()


def test_a_directory_where_a_request_belongs_is_ignored(
    queue: Queue, me: Holder, queue_dir: Path
) -> None:
    (queue_dir / "pending" / "dir.req.json").mkdir()
    assert claim(queue, me) is None
    assert ignored_reasons(queue)["pending/dir.req.json"] == "a directory, not a request file"


def test_a_symlinked_lease_is_a_conflict_and_never_read(
    queue: Queue, queue_dir: Path, outside: Path
) -> None:
    job = publish(queue, request(), name="sl")
    os.mkdir(queue_dir / "claimed" / job)
    os.rename(queue_dir / "pending" / job, queue_dir / "claimed" / job / job)
    os.mkdir(queue_dir / "lease" / job)
    (queue_dir / "lease" / job / "worker").symlink_to(outside)
    for reconcile in (False, True):
        report = recover(queue, reconcile=reconcile)
        assert [f.job for f in report.conflicts] == [job]
    assert (queue_dir / "claimed" / job / job).exists() and untouched(outside)
    assert f"lease/{job}/worker" in ignored_reasons(queue)


def test_a_symlinked_claim_is_never_moved(queue: Queue, queue_dir: Path, outside: Path) -> None:
    job = "sc.req.json"
    os.mkdir(queue_dir / "claimed" / job)
    (queue_dir / "claimed" / job / job).symlink_to(outside)
    report = recover(queue, reconcile=True)
    assert [f.job for f in report.conflicts] == [job]
    assert (queue_dir / "claimed" / job / job).is_symlink() and untouched(outside)
    assert not (queue_dir / "pending" / job).exists()


def test_a_symlink_in_the_inbox_is_never_removed(
    queue: Queue, queue_dir: Path, outside: Path
) -> None:
    link = queue_dir / "inbox" / "x.tmp"
    link.symlink_to(outside)
    report = recover(queue, reconcile=True, grace=0)
    assert report.removed_temps == [] and link.is_symlink() and untouched(outside)
    assert ignored_reasons(queue)["inbox/x.tmp"].startswith("a symlink")


@pytest.mark.parametrize("state", ["pending", "claimed", "done"])
def test_a_state_directory_replaced_by_a_symlink_is_refused(
    queue_dir: Path, tmp_path: Path, state: str
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.rmdir(queue_dir / state)
    (queue_dir / state).symlink_to(elsewhere)
    with pytest.raises(CtxError) as caught:
        Queue.open(queue_dir)
    assert caught.value.errno == errno.ELOOP  # as a link anywhere on a queue's path
    assert caught.value.message == (
        f"{queue_dir}/{state} is a symlink, not a real directory; refusing to follow it"
    )


def test_a_state_directory_that_is_a_file_is_refused(queue_dir: Path) -> None:
    os.rmdir(queue_dir / "done")
    (queue_dir / "done").write_text("{}")
    with pytest.raises(CtxError) as caught:
        Queue.open(queue_dir)
    assert caught.value.errno == errno.ENOTDIR
    assert caught.value.message == f"{queue_dir}/done is not a real directory; refusing to use it"


def test_a_queue_path_that_is_a_symlink_is_refused(queue_dir: Path, tmp_path: Path) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(queue_dir)
    with pytest.raises(CtxError) as caught:
        Queue.open(alias)
    assert caught.value.errno == errno.ELOOP


def test_a_malformed_request_dropped_in_pending_is_claimed_with_the_reason(
    queue: Queue, me: Holder, queue_dir: Path
) -> None:
    (queue_dir / "pending" / "junk.req.json").write_text("not json at all")
    won = claim(queue, me)
    assert won is not None and won.request["tool"] is None
    assert "not JSON" in won.request["invalid"]


def test_a_result_that_is_a_directory_is_a_conflict(queue: Queue, queue_dir: Path) -> None:
    (queue_dir / "done" / "d.req.json").write_text("{}")
    (queue_dir / "done" / "d.req.json.result").mkdir()
    report = recover(queue, reconcile=True)
    assert [f.job for f in report.conflicts] == ["d.req.json"]


def test_no_component_below_the_storage_root_is_followed(
    root: Path, queue_dir: Path, tmp_path: Path
) -> None:
    """A project's queue opened from its storage root: a symlinked space is refused (ELOOP),
    however real the queue it leads to."""
    init_queue(tmp_path / "elsewhere" / "queue")
    (root / "shared" / "linked").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(CtxError) as caught:
        Queue.open(root / "shared" / "linked" / "queue", within=root)
    assert caught.value.errno == errno.ELOOP
    assert caught.value.message.startswith(f"{root}/shared/linked is a symlink")


@pytest.fixture
def held_lock(
    queue: Queue, queue_dir: Path, me: Holder, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, int]]:
    """A claimed job whose ``claimed/J`` another process keeps locked (anyone who may open
    it may), with the wait for the lock cut to half a second."""
    monkeypatch.setattr(transition, "LOCK_WAIT_SECONDS", 0.5)
    publish(queue, request(), "a")
    job = claim(queue, me).job
    locker = subprocess.Popen(["flock", str(queue_dir / "claimed" / job), "sleep", "60"])
    time.sleep(0.3)
    yield job, locker.pid
    locker.kill()
    locker.wait()


@pytest.mark.parametrize("transition", ["finish", "renew"])
def test_a_lock_held_for_long_by_another_process_is_named_not_waited_for(
    queue: Queue, queue_dir: Path, me: Holder, held_lock: tuple[str, int], transition: str
) -> None:
    job, locker = held_lock
    began = time.monotonic()

    with pytest.raises(CtxError) as refused:
        if transition == "finish":
            finish(queue, job, ok=True, output={}, holder=me)
        else:
            renew(queue, job, [me])

    assert refused.value.errno == errno.EAGAIN
    assert f"claimed/{job} has been locked by another process (pid {locker})" in str(refused.value)
    assert time.monotonic() - began < 5
    assert os.listdir(queue_dir / "claimed") == [job]  # nothing moved: the job is still ours


def test_a_claim_whose_new_directory_another_process_locks_gives_up_and_leaves_no_trace(
    queue_dir: Path, me: Holder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A member locks claimed/J between the claimer's mkdir and its lock: the claim fails
    with EAGAIN once the wait is over, and J is pending as before, claimable."""
    monkeypatch.setattr(transition, "LOCK_WAIT_SECONDS", 0.5)
    lockers: list[subprocess.Popen[bytes]] = []

    class LockedRightAfterMkdir(FsOps):
        def mkdir(self, name: str, dir_fd: int, mode: int = 0o777) -> None:
            super().mkdir(name, dir_fd, mode)
            path = f"/proc/self/fd/{dir_fd}/{name}"
            lockers.append(subprocess.Popen(["flock", os.path.realpath(path), "sleep", "60"]))
            time.sleep(0.3)

    with Queue.open(queue_dir) as plain:
        job = publish(plain, request(), "a")
    try:
        with Queue.open(queue_dir, LockedRightAfterMkdir()) as q, pytest.raises(CtxError) as held:
            claim(q, me)
    finally:
        for locker in lockers:
            locker.kill()
            locker.wait()

    assert held.value.errno == errno.EAGAIN
    assert os.listdir(queue_dir / "claimed") == [] and os.listdir(queue_dir / "pending") == [job]
    with Queue.open(queue_dir) as plain:
        assert claim(plain, me).job == job
