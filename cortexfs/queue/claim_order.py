"""Which pending job to try next (SPEC Q-9, Q-10).

Claims take the oldest pending job first — by publish time (the request file's mtime, which
a rename keeps), name as tie-break — on a best-effort basis.  Listing and sorting ``pending/``
costs O(n), so a :class:`Queue` keeps the sorted names of its last scan and hands them out one
by one; it scans again only when they are used up.  A claim therefore costs O(1) amortised,
however many jobs are pending.  Names handed out may since have been claimed by another
worker; the claim itself finds that out cheaply (the file is gone, or ``mkdir`` loses).
Jobs published after the scan are newer than everything in it, so they lose nothing by
waiting for the next one.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from cortexfs.names import is_job_name

if TYPE_CHECKING:
    from cortexfs.queue.layout import Queue


class ClaimOrder:
    """The pending jobs of one scan, oldest first, not yet handed out."""

    def __init__(self) -> None:
        self._next: deque[str] = deque()
        self.scans = 0

    def take(self, pending_fd: int) -> Iterator[str]:
        """Candidates to try: what is left of the last scan, then (once) a fresh scan."""
        while self._next:
            yield self._next.popleft()
        self._next.extend(scan_pending(pending_fd))
        self.scans += 1
        while self._next:
            yield self._next.popleft()


def scan_pending(pending_fd: int) -> list[str]:
    """Job names in ``pending/``, oldest first.  Non-jobs (Q-8) are left out."""
    stamped = []
    with os.scandir(pending_fd) as entries:
        for entry in entries:
            if not is_job_name(entry.name) or not entry.is_file(follow_symlinks=False):
                continue
            try:
                mtime = entry.stat(follow_symlinks=False).st_mtime_ns
            except FileNotFoundError:
                continue
            stamped.append((mtime, entry.name))
    stamped.sort()
    return [name for _, name in stamped]


def candidates(queue: Queue) -> Iterator[str]:
    return queue.claim_order.take(queue.pending)
