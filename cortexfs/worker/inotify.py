"""Waiting for new jobs without a watcher service and without busy polling (SPEC W-2).

A worker that finds ``pending/`` empty waits on an inotify watch of that directory — an OS
primitive held only while the worker waits, not a background service.  Two limits of inotify
shape the design:

* it only reports changes made through *this* kernel: on a queue shared over NFS or another
  network filesystem (N-1), a job published by another host is not reported.  So every wait is
  also bounded (``max_wait``): the worker looks at ``pending/`` again at least that often;
* it may be unavailable (no inotify in the kernel, the per-user watch limit reached).  Then
  :class:`PendingWatch` falls back to a bounded exponential back-off, from ``min_wait`` to
  ``max_wait``, reset whenever a job is found.

A :class:`Wakeup` lets a signal handler end a wait at once (SIGTERM, SIGINT).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from pathlib import Path

from cortexfs.readiness import readable

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_IN_CREATE = 0x00000100
_IN_MOVED_TO = 0x00000080
_IN_ONLYDIR = 0x01000000

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


class Wakeup:
    """A self-pipe: :meth:`ring` from a signal handler ends every wait, now and later.

    It stays readable once rung (nothing drains it), so every thread waiting on it wakes.
    """

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def ring(self) -> None:
        # A full pipe is already ringing; a closed one has nobody left to wake.
        with contextlib.suppress(OSError):
            os.write(self.write_fd, b"!")

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.read_fd = self.write_fd = -1


class PendingWatch:
    """Wait until something appears in ``pending/`` (or a bounded time passes)."""

    def __init__(self, pending: Path, *, min_wait: float = 0.05, max_wait: float = 2.0) -> None:
        self.min_wait = min_wait
        self.max_wait = max_wait
        self._backoff = min_wait
        self.fd = _libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        self.reason = "inotify"
        if self.fd < 0:
            self.reason = f"inotify unavailable ({os.strerror(ctypes.get_errno())}); back-off"
            return
        mask = _IN_CREATE | _IN_MOVED_TO | _IN_ONLYDIR
        if _libc.inotify_add_watch(self.fd, os.fsencode(pending), mask) < 0:
            self.reason = f"inotify watch refused ({os.strerror(ctypes.get_errno())}); back-off"
            os.close(self.fd)
            self.fd = -1

    @property
    def uses_inotify(self) -> bool:
        return self.fd >= 0

    def found_work(self) -> None:
        """Reset the back-off after a successful claim."""
        self._backoff = self.min_wait

    def wait(self, wakeup: Wakeup | None = None) -> bool:
        """Block until ``pending/`` may have changed; False when woken by ``wakeup``."""
        watched = [wakeup.read_fd] if wakeup else []
        if self.uses_inotify:
            timeout = self.max_wait
            watched.append(self.fd)
        else:
            timeout = self._backoff
            self._backoff = min(self._backoff * 2, self.max_wait)
        ready = readable(watched, timeout)
        if self.fd in ready:
            self._drain()
        return wakeup is None or wakeup.read_fd not in ready

    def _drain(self) -> None:
        try:
            while os.read(self.fd, 64 * 1024):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> PendingWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
