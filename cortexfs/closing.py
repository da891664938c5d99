"""Closing the descriptor of a removed file or directory on a thread of its own.

The last close of what has been removed frees its inode, and on ext4 that is a journal
transaction of its own: for a directory 90 to 250 microseconds on the disks measured
(``bench/queue_lifecycle.py``), where a finish removes three inodes (``lease/J/worker``,
``lease/J``, ``claimed/J``).  Nothing waits for that freeing: the entry is already gone from
its parent, durably so once the parent is synced, and a crash before the close leaves an
orphan inode that the filesystem frees at its next mount.  So the protocol holds a descriptor
across the removal, hands it to a closer thread, and goes on to its next step while the
kernel frees the inode; ``os.close`` releases the interpreter lock while it does.

Bounded: with :data:`MAX_WAITING` descriptors already waiting, the caller closes its own, so a
process holds at most that many descriptors more than it would.  A forked child has no closer
thread (only the thread that forked is copied): it starts one of its own on first use.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading

MAX_WAITING = 8


class _Closer:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner_pid: int | None = None
        self._waiting: queue.Queue[int] = queue.Queue(MAX_WAITING)

    def close_soon(self, fd: int) -> None:
        if self._owner_pid != os.getpid():
            self._start()
        try:
            self._waiting.put_nowait(fd)
        except queue.Full:
            os.close(fd)

    def _start(self) -> None:
        with self._lock:
            if self._owner_pid == os.getpid():
                return
            # What a parent left waiting is the child's copy of descriptors the parent closes:
            # a fresh queue, so that the child closes only its own.
            self._waiting = queue.Queue(MAX_WAITING)
            thread = threading.Thread(
                target=self._run, args=(self._waiting,), name="cortexfs-closer", daemon=True
            )
            thread.start()
            self._owner_pid = os.getpid()

    @staticmethod
    def _run(waiting: queue.Queue[int]) -> None:
        while True:
            fd = waiting.get()
            # A close reports only trouble with what was written through the descriptor, and
            # nothing is written through these.
            with contextlib.suppress(OSError):
                os.close(fd)


_CLOSER = _Closer()


def close_soon(fd: int) -> None:
    """Close ``fd``, the descriptor of a file or directory that has been removed, on the
    closer thread; at once when too many wait already.  Whatever lock was taken through it must
    have been released by the caller: a lock is released by the close, which comes later."""
    _CLOSER.close_soon(fd)
