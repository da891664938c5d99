"""Whether a child process has exited, without reaping it.

A pidfd (``pidfd_open``, Linux 5.3) turns readable when its process exits, so a caller can
sleep in ``select`` on it beside its pipes and never poll.  Where the call is refused — an
older kernel, or a seccomp filter that answers ``ENOSYS`` or ``EPERM`` (container runtimes
and service managers install such filters) — the exit is asked of ``waitid(WNOWAIT)``
instead, which leaves the child to be reaped by whoever waits for it, and a caller that would
have slept on the pidfd wakes every :data:`POLL_SECONDS` to ask.
"""

from __future__ import annotations

import errno
import os
import time

from cortexfs.readiness import readable

POLL_SECONDS = 0.01  # how often a caller without a pidfd asks whether the child has exited


class ExitWatch:
    """The exit of child ``pid``: :attr:`fd` to wait on (None without a pidfd), and
    :meth:`exited` to ask."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self.fd: int | None = os.pidfd_open(pid)
        except OSError as exc:
            if exc.errno not in (errno.ENOSYS, errno.EPERM):
                raise
            self.fd = None

    def exited(self) -> bool:
        """Whether the process has exited (or been reaped already)."""
        if self.fd is not None:
            return bool(readable([self.fd], 0))
        try:
            flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
            return os.waitid(os.P_PID, self.pid, flags) is not None
        except ChildProcessError:
            return True  # reaped: its pid is no longer this process's child

    def wait(self, timeout: float | None) -> bool:
        """Wait until the process exits; False when ``timeout`` seconds pass first."""
        if self.fd is not None:
            return bool(readable([self.fd], timeout))
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.exited():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS)
        return True

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None  # forgotten first: an interrupt cannot close it twice
            os.close(fd)
