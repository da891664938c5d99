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

import contextlib
import fcntl
import functools
import hashlib
import os
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
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


# ----------------------------------------------------------------------------------------
# The claim order between processes.
#
# A shell script runs one ``ctx queue claim`` per job, a new process each time, so the order
# kept in memory dies with every claim.  :class:`HintedClaimOrder` keeps it in a small cache
# file instead: the names in claim order and a cursor, advanced under an flock by every claim
# of this user on this host.  ``queue init`` starts the file empty and every publish appends
# its names (in publish order: oldest first), so a claim reads one name at the cursor instead
# of listing 100 000; when the file is used up (jobs published by other users or hosts, jobs
# put back by recover) the claim lists ``pending/`` once and writes the file anew.
#
# The file is a hint, not evidence: it lives outside the queue (the user's cache directory),
# is never fsynced, and every name it offers is checked against ``pending/`` by the claim.
# Losing it, or finding it stale, costs one listing.  Any error with it falls back to the
# in-memory order.

_CURSOR_DIGITS = 20  # the byte offset of the next name, in decimal
_HEADER = _CURSOR_DIGITS + 1  # ... and a newline
_READ = 4096
_COMPACT_AFTER = 1 << 20


def hint_path(queue_path: Path) -> Path:
    """This user's claim-order hint for the queue at ``queue_path`` (a cache file):
    under ``$XDG_CACHE_HOME/cortexfs``, else ``/var/cache/cortexfs`` for root and
    ``~/.cache/cortexfs`` for everyone else."""
    if os.environ.get("XDG_CACHE_HOME"):
        cache = Path(os.environ["XDG_CACHE_HOME"]) / "cortexfs"
    elif os.geteuid() == 0:
        cache = Path("/var/cache/cortexfs")
    else:
        cache = Path(os.environ.get("HOME", "~")).expanduser() / ".cache" / "cortexfs"
    return cache / "claim-order" / _hint_key(queue_path)


@functools.lru_cache(maxsize=64)
def _hint_key(queue_path: Path) -> str:
    """The queue's real path, hashed: once per process and queue, because every publish
    asks and ``realpath`` costs a ``lstat`` per component.  Should the path be re-pointed
    meanwhile, the hint goes to the old queue's file, which costs a listing, nothing more."""
    return hashlib.sha256(os.fsencode(os.path.realpath(queue_path))).hexdigest()[:32]


class HintFile:
    """The cache file: a cursor line, then job names one per line."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def reset(self, names: list[str]) -> None:
        """Replace the file with ``names`` (atomically; readers see the old or the new one)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        body = "".join(f"{name}\n" for name in names).encode()
        temp.write_bytes(_cursor_line(_HEADER) + body)
        os.replace(temp, self.path)

    def append(self, names: list[str]) -> None:
        """Add newly published names at the end, if the file exists (never create it here:
        a file that did not see the jobs already pending would hide them)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            os.write(fd, "".join(f"{name}\n" for name in names).encode())
        finally:
            os.close(fd)

    def next_name(self) -> str | None:
        """Hand out the name at the cursor and advance it; None when the file is used up."""
        fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            cursor = int(os.pread(fd, _CURSOR_DIGITS, 0) or b"0")
            chunk = os.pread(fd, _READ, cursor)
            end = chunk.find(b"\n")
            if end < 0:
                return None
            os.pwrite(fd, _cursor_line(cursor + end + 1), 0)
            if cursor > _COMPACT_AFTER and cursor * 2 > os.fstat(fd).st_size:
                self._compact(fd, cursor + end + 1)
            return chunk[:end].decode("ascii", "replace")
        finally:
            os.close(fd)

    def _compact(self, fd: int, cursor: int) -> None:
        """Drop the names already handed out, once they are most of the file."""
        rest = os.pread(fd, os.fstat(fd).st_size - cursor, cursor)
        self.reset([line for line in rest.decode("ascii", "replace").splitlines() if line])


def _cursor_line(offset: int) -> bytes:
    return f"{offset:0{_CURSOR_DIGITS}d}\n".encode()


class HintedClaimOrder(ClaimOrder):
    """The claim order kept in this user's hint file between processes."""

    def __init__(self, queue_path: Path) -> None:
        super().__init__()
        self.hint = HintFile(hint_path(queue_path))

    def take(self, pending_fd: int) -> Iterator[str]:
        try:
            yield from self._from_hint()
            names = scan_pending(pending_fd)
            self.scans += 1
            self.hint.reset(names)
            yield from self._from_hint()
        except (OSError, ValueError):
            yield from super().take(pending_fd)

    def _from_hint(self) -> Iterator[str]:
        while True:
            try:
                name = self.hint.next_name()
            except FileNotFoundError:
                return
            if name is None:
                return
            if is_job_name(name):  # the file is only a hint: never trust a name from it
                yield name


def note_published(queue_path: Path, names: list[str]) -> None:
    """Tell this user's hint (if any) about names now pending; a lost hint costs nothing."""
    with contextlib.suppress(OSError):
        HintFile(hint_path(queue_path)).append(names)


_UNUSED_HINT_SECONDS = 30 * 24 * 3600


def start_hint(queue_path: Path) -> None:
    """A new, empty queue's hint is complete: start it so that no claim needs a listing.

    Hints of queues nobody has published to or claimed from for a month (deleted queues,
    test runs) are removed on the way: each costs its next claim one listing at most.
    """
    with contextlib.suppress(OSError):
        hint = HintFile(hint_path(queue_path))
        hint.reset([])
        _remove_unused_hints(hint.path.parent, time.time() - _UNUSED_HINT_SECONDS)


def _remove_unused_hints(directory: Path, before: float) -> None:
    with os.scandir(directory) as entries:
        for entry in entries:
            with contextlib.suppress(OSError):
                if entry.is_file(follow_symlinks=False) and entry.stat().st_mtime < before:
                    os.unlink(entry.path)
