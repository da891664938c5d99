"""The descriptor of a removed directory is closed on a closer thread (cortexfs.closing), its
flock released at once, in a forked child as in its parent; and a finish leaves none of its
queue's descriptors open for long."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from cortexfs import closing, durable
from cortexfs.queue import Holder, Queue, claim, finish, init_queue, publish


def closed_within(fd: int, seconds: float = 30.0) -> bool:
    """Whether ``fd`` is closed before ``seconds`` pass (the closer runs when it is
    scheduled: no bound on a busy machine but a generous one)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.fstat(fd)
        except OSError:
            return True
        time.sleep(0.001)
    return False


def removed_directory(tmp_path: Path, name: str = "gone") -> int:
    path = tmp_path / name
    path.mkdir()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    path.rmdir()
    return fd


def test_a_removed_directory_is_closed_and_its_lock_released_at_once(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    fd = os.open(tmp_path / "d", os.O_RDONLY | os.O_DIRECTORY)
    other = os.open(tmp_path / "d", os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        (tmp_path / "d").rmdir()
        assert os.fstat(fd).st_nlink == 0
        durable.close_held(durable.FsOps(), fd)
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released before the close
        assert closed_within(fd)
    finally:
        os.close(other)


def test_a_directory_still_there_is_closed_by_the_caller(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    durable.close_held(durable.FsOps(), fd)
    try:
        os.fstat(fd)
    except OSError:
        return
    raise AssertionError(f"descriptor {fd} of a directory still there was left open")


def test_more_than_wait_are_all_closed(tmp_path: Path) -> None:
    fds = [removed_directory(tmp_path, f"d{n}") for n in range(4 * closing.MAX_WAITING)]
    for fd in fds:
        closing.close_soon(fd)
    assert all(closed_within(fd) for fd in fds)


def test_a_forked_child_closes_its_own(tmp_path: Path) -> None:
    closing.close_soon(removed_directory(tmp_path, "parent"))  # the parent's closer runs
    pid = os.fork()
    if pid == 0:  # the child: no closer thread was copied
        status = 1
        try:
            fd = removed_directory(tmp_path, "child")
            closing.close_soon(fd)
            status = 0 if closed_within(fd) else 2
        finally:
            os._exit(status)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_finish_leaves_no_descriptor_of_its_queue_open(tmp_path: Path) -> None:
    init_queue(tmp_path / "queue")
    holder = Holder.for_process(worker="test")
    with Queue.open(tmp_path / "queue") as q:
        publish(q, {"tool": "fs.stat", "input": {}})
        won = claim(q, holder)
        assert won is not None
        finish(q, won.job, True, {"size": 1})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        held = [_target(fd) for fd in os.listdir("/proc/self/fd")]
        if not [path for path in held if str(tmp_path) in path]:
            return
        time.sleep(0.001)
    raise AssertionError(f"descriptors of the queue still open: {held}")


def _target(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except FileNotFoundError:
        return ""  # the listing's own descriptor, closed since
