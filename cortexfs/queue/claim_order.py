"""Which pending job to try next (SPEC Q-9, Q-10).

Claims take the oldest pending job first — by publish time (the request file's mtime, which
a rename keeps), name as tie-break — on a best-effort basis.  Listing and sorting ``pending/``
costs O(n), so the claim order keeps the sorted names of its last listing and hands them out
one by one.  Names handed out may since have been claimed by another worker; the claim itself
finds that out cheaply (the file is gone, or ``mkdir`` loses).

What the order knows must follow what ``pending/`` holds.  Every change the protocol makes to
``pending/`` tells the order about it (:meth:`ClaimOrder.changed`): a publish appends its names
(they are the newest), recover puts a requeued job *first* (it keeps its old publish time), a
claim only removes.  Changes made by others — another user, another host, a file put there by
hand — are noticed by the directory's *stamp* (its inode and mtime): the order records the
stamp of ``pending/`` as of the last change it accounted for; one of our own changes that
started from the recorded stamp moves the record to the stamp it left; and a stamp found to
differ from the record at a claim means someone changed ``pending/`` unseen, so the order
lists it again.

Q-10 bounds how often: a listing of n names is paid for by n / :data:`SCAN_BUDGET` claims
served from the order before the next listing an unseen change may cause (up to
:data:`SCAN_BUDGET` pending jobs, every claim may list).  A claim therefore lists, on
average, at most about :data:`SCAN_BUDGET` entries, however many jobs are pending.  An order
that is used up always lists again.

Where this is best effort: a stamp has the filesystem's timestamp granularity (a clock tick on
Linux), so a change made by someone else in the same tick as one we recorded, or between the
two ``fstat`` calls around one of our own moves, can go unnoticed; the job is then found by a
later listing (the next unseen change, or the order used up).  Nothing is ever lost: every
listing is complete, and every name handed out is checked against ``pending/``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cortexfs import jsontext
from cortexfs.forks import ProcessLock
from cortexfs.locks import flock_within
from cortexfs.names import is_job_name
from cortexfs.queue.hint_cache import (
    create_private_file,
    hint_location,
    keep_private,
    make_private_directories,
    prune_now_and_then,
)
from cortexfs.queue.hint_cache import hint_path as hint_path  # callers find it here too

if TYPE_CHECKING:
    from cortexfs.queue.layout import Queue

# Entries of pending/ one claim may list on average to notice changes made by others.
SCAN_BUDGET = 1000

# How long a claim or a publish waits for another process's hold on the hint (a listing of
# pending/ takes well under a second at 100 000 jobs).  One stopped while it held it (Ctrl-Z,
# SIGSTOP) would otherwise hold up every publish and claim of its user; past this wait, a
# claim lists pending/ itself and a publish leaves the hint untold, which the next claim's
# listing makes up for: the hint is a hint, never state.
HINT_LOCK_SECONDS = 2.0
# After such a wait ran out, this process does not wait for that hint's lock again for this
# long (it tries it once): a holder that stays stopped costs each process one wait, not one
# per claim and publish.
HINT_SKIPPED_SECONDS = 60.0

# The hints whose lock a wait of this process last found held past HINT_LOCK_SECONDS, and when.
_held_elsewhere: dict[Path, float] = {}


def pending_stamp(pending_fd: int) -> str:
    """What changes whenever an entry of ``pending/`` is added, removed or renamed: the
    directory's mtime (and inode, should it be made anew).  Not its ctime, which a chmod of
    the directory changes too (``ctx shared create`` gives the queue's directories their
    mode after ``queue init`` started the hint)."""
    st = os.fstat(pending_fd)
    return f"{st.st_ino}:{st.st_mtime_ns}"


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


def _unseen_change(stamp: str | None, now: str, served: int, listed: int) -> bool:
    """Whether ``pending/`` changed in a way the order did not account for, and the claims
    served since the last listing have paid for another one (Q-10).  No recorded stamp: a
    hint written by hand or by an older version, trusted until it is used up."""
    return stamp is not None and stamp != now and served >= listed // SCAN_BUDGET


class ClaimOrder:
    """The claim order of one process, in memory: the names not handed out yet, oldest first."""

    def __init__(self, queue_path: Path | None = None) -> None:
        # Whose hint may stand in for the first listing (see _list); None: always list.
        self._queue_path = queue_path
        self._next: deque[str] = deque()
        self._stamp: str | None = None
        self._listed = 0
        self._served = 0
        self._started = False  # until the first listing the order knows nothing to add to
        self._from_hint = False  # the last listing was read from the hint
        self._lock = ProcessLock()  # a Queue may be used on in a forked child
        self.scans = 0

    def take(self, pending_fd: int) -> Iterator[str]:
        """Candidates to try, oldest first; ``pending/`` is listed at most once per call."""
        listed = False
        while True:
            with self._lock:
                if not listed and (
                    not self._next
                    or _unseen_change(
                        self._stamp, pending_stamp(pending_fd), self._served, self._listed
                    )
                ):
                    self._list(pending_fd)
                    # A hint is no listing: a name a killed claim took off it is pending yet
                    # not in it, so once its names run out, pending/ is listed after all.
                    listed = not self._from_hint
                    if not self._next and not listed:
                        self._list(pending_fd)
                        listed = True
                if not self._next:
                    return
                name = self._next.popleft()
                self._served += 1
            yield name

    def _list(self, pending_fd: int) -> None:
        stamp = pending_stamp(pending_fd)  # before: a change during the listing shows later
        names = None
        if not self._started and self._queue_path is not None:
            # A process's first listing: this user's hint, when it accounts for pending/ as
            # it stands, holds what the listing would find, in claim order, for a read of one
            # file instead of an lstat per pending job (a worker starting on a long queue).
            names = HintFile.of(self._queue_path).current_names(pending_fd, stamp)
        self._from_hint = names is not None
        self._next = deque(scan_pending(pending_fd) if names is None else names)
        self._stamp, self._listed, self._served = stamp, len(self._next), 0
        self._started = True
        self.scans += 1

    def changed(
        self, queue_path: Path, before: str, after: str, added: Sequence[str], *, first: bool
    ) -> None:
        """This process changed ``pending/`` from stamp ``before`` to ``after``, adding
        ``added`` (first in line when ``first``: a requeued job keeps its publish time)."""
        with self._lock:
            if self._started:
                if first:
                    self._next.extendleft(reversed(added))
                else:
                    self._next.extend(added)
                self._listed += len(added)
                if self._stamp == before:
                    self._stamp = after
        note_changed(queue_path, before, after, added, first=first)


def candidates(queue: Queue) -> Iterator[str]:
    return queue.claim_order.take(queue.pending)


def pending_in_claim_order(queue: Queue) -> list[str]:
    """The job names in ``pending/``, each once, in the order this user's next claims take
    them, for a reader (``ctx queue list --state pending``): first as this user's hint
    orders them when it accounts for pending/ as it stands — a claim reads it too, and a
    request whose mtime changed in place since (an edit, a ``touch``) keeps its place there
    — then the rest as a listing orders them (a name a killed claim took off the hint, which
    a claim lists pending/ for once the hint is used up).  The hint is a hint: a name in it
    twice counts once, and one no longer pending is left to the caller's look at its
    evidence.  Nothing is written."""
    listed = scan_pending(queue.pending)
    hinted: list[str] = []
    with contextlib.suppress(OSError, ValueError):
        stamp = pending_stamp(queue.pending)
        hinted = HintFile.of(queue.path).current_names(queue.pending, stamp) or []
    return list(dict.fromkeys([*hinted, *listed]))


def pending_changed(
    queue: Queue, before: str, added: Sequence[str] = (), *, first: bool = False
) -> None:
    """Tell the queue's claim order (and this user's hint) what we just did to ``pending/``,
    whose stamp was ``before`` just before we did it."""
    try:
        after = pending_stamp(queue.pending)
    except OSError:
        # The filesystem failing as a whole (EIO, a FUSE mount that ended), which the step's
        # own error tells: left untold, the change is one the next claim sees and lists anew.
        return
    queue.claim_order.changed(queue.path, before, after, added, first=first)


# ----------------------------------------------------------------------------------------
# The claim order between processes.
#
# A shell script runs one ``ctx queue claim`` per job, a new process each time, so the order
# kept in memory dies with every claim.  :class:`HintedClaimOrder` keeps it in a small cache
# file instead, shared by every claim of this user on this host: a header (the cursor, the
# names served and listed since the last listing, where the names start, the stamp of
# pending/ they account for), the queue's real path (so that the hint of a queue that is gone
# can be removed: :mod:`cortexfs.queue.hint_cache`, which also keeps the file private), then
# the names in claim order.  ``queue init`` starts the file empty, every publish appends
# its names, recover puts requeued names before the cursor, so a claim reads one name instead
# of listing 100 000; the file is listed anew when it is used up or pending/ changed unseen.
#
# The file is a hint, not evidence: it lives outside the queue (the user's cache directory),
# is never fsynced, and every name it offers is checked against ``pending/`` by the claim.
# Losing it, or finding it garbled, costs one listing.  Any error with it falls back to the
# in-memory order.

_HEADER = 128  # "cursor served listed start stamp\n", fixed width: rewritten in place
_HEADER_FORMAT = re.compile(rb"(\d{20}) (\d{20}) (\d{20}) (\d{20}) (-|\d+:\d+) *\n")
_READ = 4096
_COMPACT_AFTER = 1 << 20
_MAX_QUEUE_LINE = 16 * 1024  # a JSON string of a path: PATH_MAX bytes, escaped


@dataclass
class _Header:
    cursor: int  # byte offset of the next name
    served: int  # names handed out since the last listing
    listed: int  # names the file received since the last listing (listed, published, requeued)
    start: int  # byte offset of the first name, after the line naming the queue
    stamp: str | None  # the stamp of pending/ the names account for; None: trusted as is

    def encode(self) -> bytes:
        line = (
            f"{self.cursor:020d} {self.served:020d} {self.listed:020d} {self.start:020d} "
            f"{self.stamp or '-'}"
        )
        return line.ljust(_HEADER - 1).encode() + b"\n"

    @classmethod
    def decode(cls, data: bytes) -> _Header | None:
        """None for a header that is not ours (garbled, truncated, another format)."""
        match = _HEADER_FORMAT.fullmatch(data)
        if match is None or len(data) != _HEADER:
            return None
        cursor, served, listed, start = (int(match[n]) for n in range(1, 5))
        if not _HEADER < start <= cursor or start - _HEADER > _MAX_QUEUE_LINE:
            return None
        stamp = match[5].decode()
        return cls(cursor, served, listed, start, None if stamp == "-" else stamp)


def recorded_queue(fd: int) -> str | None:
    """The real path of the queue the hint open as ``fd`` describes (None: it names none);
    ValueError for a file that is no hint."""
    header = _Header.decode(os.pread(fd, _HEADER, 0))
    if header is None:
        raise ValueError("not a claim-order hint")
    # Read strictly: a garbled hint nested deep enough (``[[[[…``) would make json.loads
    # raise RecursionError, which is no ValueError, and stop the claim that pruned it.
    queue = jsontext.loads_strict(os.pread(fd, header.start - _HEADER, _HEADER))
    if queue is not None and not isinstance(queue, str):
        raise ValueError("not a claim-order hint")
    return queue


class HintFile:
    """The cache file: a header line, the queue's real path (a JSON string), then job names
    one per line.

    A hint, not state, which is why it is written with plain ``os`` calls and not through
    :mod:`cortexfs.durable`: nothing in it is fsynced, and a crash may leave it stale, empty
    or garbled.  Each of those costs one listing of ``pending/`` (a header that does not
    decode, a stamp that does not match), never a job: every name handed out is checked
    against ``pending/`` by the claim.
    """

    def __init__(self, path: Path, queue: str | None = None) -> None:
        self.path = path
        self.queue = queue  # recorded, so that the hint goes once the queue is gone

    @classmethod
    def of(cls, queue_path: Path) -> HintFile:
        """This user's hint for the queue at ``queue_path``."""
        return cls(*hint_location(queue_path))

    def prune_now_and_then(self) -> None:
        """Clean the cache directory, if it is time to (:mod:`cortexfs.queue.hint_cache`)."""
        prune_now_and_then(self.path.parent, recorded_queue)

    def reset(self, names: Sequence[str], stamp: str | None = None) -> None:
        """Replace the file with ``names``, as a fresh listing.  ``stamp``: the stamp of
        pending/ they account for; None makes a hint trusted until it is used up."""
        self._write(names, stamp, handed_out=0, served=0, listed=len(names))

    def _write(
        self, names: Sequence[str], stamp: str | None, *, handed_out: int, served: int, listed: int
    ) -> None:
        """Replace the file (atomically: readers see the old or the new one) with ``names``,
        the first ``handed_out`` of them behind the cursor."""
        make_private_directories(self.path.parent)
        temp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}")
        queue = f"{json.dumps(self.queue)}\n".encode()
        body = [f"{name}\n".encode() for name in names]
        start = _HEADER + len(queue)
        cursor = start + sum(len(line) for line in body[:handed_out])
        header = _Header(cursor, served, listed, start, stamp).encode()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)  # left by a thread of a killed process that had our pid
        try:
            with os.fdopen(create_private_file(temp), "wb") as stream:
                stream.write(header + queue + b"".join(body))
            os.replace(temp, self.path)
        except BaseException:
            # A cache that is full (or an interrupt) would otherwise keep one temp per claim.
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise

    @contextlib.contextmanager
    def _locked(self) -> Iterator[int]:
        """The file open and flocked; FileNotFoundError when there is none, BlockingIOError
        when another process holds it past :data:`HINT_LOCK_SECONDS`.  A file replaced (by
        :meth:`reset`) while we waited for the lock is opened again."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                last_held = _held_elsewhere.get(self.path)
                recently = last_held is not None and (
                    time.monotonic() - last_held < HINT_SKIPPED_SECONDS
                )
                if not flock_within(fd, fcntl.LOCK_EX, 0 if recently else HINT_LOCK_SECONDS):
                    _held_elsewhere[self.path] = time.monotonic()
                    raise BlockingIOError(
                        errno.EWOULDBLOCK, f"held by another process: {self.path}"
                    )
                _held_elsewhere.pop(self.path, None)
                try:
                    current = os.stat(self.path, follow_symlinks=False).st_ino
                except FileNotFoundError:
                    current = None
                opened = os.fstat(fd)
                if current == opened.st_ino:
                    keep_private(fd, opened)
                    yield fd
                    return
            finally:
                os.close(fd)

    def next_name(self, pending_fd: int, may_list: bool) -> tuple[str | None, bool]:
        """Hand out the next name (None when there is none) and whether ``pending/`` was
        listed for it: when ``may_list`` and the file is used up, missing or garbled, or
        pending/ changed unseen (and listings are paid for, Q-10)."""
        try:
            with self._locked() as fd:
                header = _Header.decode(os.pread(fd, _HEADER, 0))
                if header is not None:
                    stale = _unseen_change(
                        header.stamp, pending_stamp(pending_fd), header.served, header.listed
                    )
                    if not (stale and may_list):
                        name = self._pop(fd, header)
                        if name is not None or not may_list:
                            return name, False
                elif not may_list:
                    return None, False
                # Listed under the lock: the claimers waiting for it then read the new file
                # instead of each listing pending/ again.
                return self._list(pending_fd), True
        except FileNotFoundError:
            if not may_list:
                return None, False
            return self._list(pending_fd), True

    def current_names(self, pending_fd: int, stamp: str) -> list[str] | None:
        """The names not handed out yet, when the file accounts for pending/ as it is now
        (its stamp is ``stamp``, pending/'s); None otherwise, or when there is no file."""
        try:
            with self._locked() as fd:
                header = _Header.decode(os.pread(fd, _HEADER, 0))
                if header is None or header.stamp is None or header.stamp != stamp:
                    return None
                if stamp != pending_stamp(pending_fd):
                    return None  # changed while we waited for the lock
                return [name for name in self._rest(fd, header) if is_job_name(name)]
        except (OSError, ValueError):
            return None

    def relist(self, pending_fd: int) -> None:
        """List pending/ into the file anew, if there is a file (a user who never claimed has
        none, and gets none)."""
        with self._locked():
            stamp = pending_stamp(pending_fd)  # before: a change during the listing shows later
            names = scan_pending(pending_fd)
            self._write(names, stamp, handed_out=0, served=0, listed=len(names))

    def _pop(self, fd: int, header: _Header) -> str | None:
        chunk = os.pread(fd, _READ, header.cursor)
        end = chunk.find(b"\n")
        if end < 0:
            return None
        header.cursor += end + 1
        header.served += 1
        os.pwrite(fd, header.encode(), 0)
        if header.cursor > _COMPACT_AFTER and header.cursor * 2 > os.fstat(fd).st_size:
            self._compact(fd, header)
        return chunk[:end].decode("ascii", "replace")

    def _list(self, pending_fd: int) -> str | None:
        """List pending/, write the names anew, hand out the first."""
        stamp = pending_stamp(pending_fd)  # before: a change during the listing shows later
        names = scan_pending(pending_fd)
        first = min(1, len(names))
        self._write(names, stamp, handed_out=first, served=first, listed=len(names))
        return names[0] if names else None

    def _rest(self, fd: int, header: _Header) -> list[str]:
        """The lines after the cursor.  ValueError for a file longer than the names it
        received since the last listing could make it, a line each no longer than a read
        that hands one out: grown by a stray ``truncate`` or a corrupted length, it is
        garbled, and read whole it could take all memory (a sparse terabyte)."""
        size = os.fstat(fd).st_size - header.cursor
        if size > header.listed * _READ:
            raise ValueError("a claim-order hint longer than its names")
        rest = os.pread(fd, size, header.cursor)
        return [line for line in rest.decode("ascii", "replace").splitlines() if line]

    def _compact(self, fd: int, header: _Header) -> None:
        """Drop the names already handed out, once they are most of the file."""
        self._rewrite(self._rest(fd, header), header)

    def _rewrite(self, names: Sequence[str], header: _Header) -> None:
        """The file anew with ``names`` ahead; the stamp and the counts that pay for the next
        listing (Q-10) carry over."""
        self._write(names, header.stamp, handed_out=0, served=header.served, listed=header.listed)

    def changed(self, before: str, after: str, added: Sequence[str], *, first: bool) -> None:
        """Account for a change we made to pending/ (see :meth:`ClaimOrder.changed`).  Never
        creates the file: one that did not see the jobs already pending would hide them."""
        with self._locked() as fd:
            header = _Header.decode(os.pread(fd, _HEADER, 0))
            if header is None:
                return  # garbled: the next claim lists pending/ anyway
            if header.stamp == before:
                header.stamp = after
            header.listed += len(added)
            data = "".join(f"{name}\n" for name in added).encode()
            if not data:
                pass  # a claim: only the stamp moves
            elif not first:
                os.pwrite(fd, data, os.fstat(fd).st_size)
            elif header.cursor - header.start >= len(data):
                header.cursor -= len(data)  # into the room of names already handed out
                os.pwrite(fd, data, header.cursor)
            else:
                self._rewrite([*added, *self._rest(fd, header)], header)
                return
            os.pwrite(fd, header.encode(), 0)


class HintedClaimOrder(ClaimOrder):
    """The claim order kept in this user's hint file between processes."""

    def __init__(self, queue_path: Path) -> None:
        super().__init__()
        self.hint = HintFile.of(queue_path)

    def take(self, pending_fd: int) -> Iterator[str]:
        try:
            may_list = True
            while True:
                name, listed = self.hint.next_name(pending_fd, may_list)
                if listed:
                    self.scans += 1
                    may_list = False
                    # Paid for by the listing this claim made anyway, never by each claim.
                    self.hint.prune_now_and_then()
                if name is None:
                    return
                if is_job_name(name):  # the file is only a hint: never trust a name from it
                    yield name
        except (OSError, ValueError):
            yield from super().take(pending_fd)

    def changed(
        self, queue_path: Path, before: str, after: str, added: Sequence[str], *, first: bool
    ) -> None:
        note_changed(queue_path, before, after, added, first=first)


def note_changed(
    queue_path: Path, before: str, after: str, added: Sequence[str], *, first: bool = False
) -> None:
    """Tell this user's hint (if any) about a change we made to pending/; a lost hint costs
    nothing but a listing.  Told after the change is made, so nothing wrong with the hint may
    stop the step that made it: a garbled one is the next claim's to list anew."""
    with contextlib.suppress(OSError, ValueError):
        HintFile.of(queue_path).changed(before, after, added, first=first)


def relist_after_recover(queue: Queue) -> None:
    """Put every pending job back in this user's hint, oldest first.

    A claim takes a name off the hint before it claims the job; one killed in between (before
    its ``mkdir claimed/J``, or after it, its claim then undone by ``recover --reconcile``)
    leaves the job pending but no longer in the hint, behind every job published since.
    Recover is what is run after a crash, and it lists pending/ anyway; the hint's listing
    costs one ``lstat`` per pending job more, once per recover, never per claim.
    """
    with contextlib.suppress(OSError):
        HintFile.of(queue.path).relist(queue.pending)


def start_hint(queue_path: Path) -> None:
    """A new, empty queue's hint is complete: start it so that no claim needs a listing.

    The cache directory is cleaned on the way, if it is time to: hints of queues that are
    gone (test runs, deleted queues) are removed (:mod:`cortexfs.queue.hint_cache`).
    """
    with contextlib.suppress(OSError):
        fd = os.open(queue_path / "pending", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            stamp = pending_stamp(fd)
        finally:
            os.close(fd)
        hint = HintFile.of(queue_path)
        hint.reset([], stamp)
        hint.prune_now_and_then()
