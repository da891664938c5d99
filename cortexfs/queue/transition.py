"""What every transition of a job shares (SPEC §2.2): J's lock, its terminal evidence, its temp
files, and the words for a step whose outcome is in doubt.

* ``claimed/J``'s flock (:func:`locked_claim`, :func:`lock_job`): held by a claimer until its
  lease is durable, and by a renewal, a finish and recover for their whole transition, so that
  no two transitions of J interleave;
* :func:`remove_claim_and_lease`: the last step of a finish, of a claim undone, of a requeue;
* :func:`terminal_evidence`: what of J is in ``done/`` or ``failed/``;
* :func:`moved_in` and :func:`not_known_where`: what a move that raised did, and the error
  that says so when the queue cannot be read to tell;
* :func:`discard_temp`: a failed step's temp file removed from ``inbox/``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator, Sequence

from cortexfs import durable
from cortexfs.errors import CtxError, errno_text
from cortexfs.queue import evidence as ev
from cortexfs.queue.layout import (
    LEASE_FILE,
    RESULT_SUFFIX,
    DirLock,
    NotADirectoryOfTheJob,
    Queue,
    kind_of,
    lstat_at,
    take_dir_lock,
)
from cortexfs.storage import not_readable


def moved_in(src_dir: int, src: str, dst_dir: int, dst: str) -> bool | OSError:
    """Whether a move that raised got as far as putting ``src`` at ``dst``: ``dst`` exists,
    and ``src`` is gone or is the same file (the link strategy stops between the two).

    The kernel's error when neither can be read: the filesystem failed as a whole (EIO, a
    FUSE mount that ended), and what the move did is not known, which callers say
    (:func:`not_known_where`) rather than guess either way."""
    try:
        there = lstat_at(dst_dir, dst)
        if there is None:
            return False
        left = lstat_at(src_dir, src)
    except OSError as exc:
        return exc
    return left is None or left.st_ino == there.st_ino


def not_known_where(action: str, job: str, exc: OSError, unread: OSError, then: str) -> CtxError:
    """The error of ``action`` on J failing where the queue cannot be read back to tell what
    the failed step did (:func:`moved_in`): both of its outcomes, and ``then``, what settles
    either once the queue can be read again."""
    return CtxError(
        exc.errno or errno.EIO,
        f"{action} {job} failed ({errno_text(exc)}) and the queue could not be read to tell where "
        f"{job} stands ({errno_text(unread)}): {then}",
    )


def terminal_evidence(queue: Queue, job: str) -> list[tuple[str, str]]:
    """What of J is in ``done/`` or ``failed/`` (its result, then its request): (state, name)."""
    return [
        (state, name)
        for state, dir_fd in (("done", queue.done), ("failed", queue.failed))
        for name in (job + RESULT_SUFFIX, job)
        if lstat_at(dir_fd, name) is not None
    ]


def is_regular(st: os.stat_result | None) -> bool:
    return st is not None and stat.S_ISREG(st.st_mode)


def still_linked(parent_fd: int, name: str, fd: int) -> bool:
    """Whether ``parent/name`` is still the directory we hold open as ``fd``."""
    st = lstat_at(parent_fd, name)
    return st is not None and st.st_ino == os.fstat(fd).st_ino


def discard_temp(queue: Queue, temp: str) -> None:
    discard_temps(queue, [temp])


def discard_temps(queue: Queue, temps: Sequence[str]) -> None:
    durable.remove_entries(queue.ops, [(queue.inbox, t, False) for t in temps])
    durable.sync_dir(queue.ops, queue.inbox)


# How long a transition waits for J's lock.  Its holders keep it for one transition of J (a
# claimer until its lease is durable, a finisher, recover), a few fsyncs; but whoever may open
# claimed/J may lock it, any member of the queue's group, so a hold far longer is a process
# stuck or hostile: named in the error rather than waited for forever.
LOCK_WAIT_SECONDS = 30.0


@contextlib.contextmanager
def locked_claim(
    queue: Queue,
    job: str,
    not_claimed: Callable[[Queue, str], CtxError],
    *,
    lock_wait: float | None = None,
) -> Iterator[int]:
    """``claimed/J`` opened and locked (recover takes the same lock before it requeues J), J's
    request checked to be in it; ``not_claimed(queue, job)`` is the error when it is not, or
    when the directory locked is no longer ``claimed/J`` (J requeued meanwhile).  The lock is
    waited for at most ``lock_wait`` seconds (:func:`lock_job`; None: its default)."""
    try:
        claim_fd = queue.open_held_job_dir("claimed", job)
    except FileNotFoundError:
        raise not_claimed(queue, job) from None
    except PermissionError:
        # Root's claimed/J in a member's queue, say: who may open it, never the bare errno.
        action = f"change job {job} in queue {queue.path}"
        refused = not_readable(queue.path / "claimed" / job, action)
        raise refused.then("nothing was changed") from None
    except NotADirectoryOfTheJob:
        # A file or a link at claimed/J beside nothing of J's is no conflict but no job at
        # all (status lists it as ignored), which not_claimed says.
        if ev.no_job_but(queue, job):
            raise not_claimed(queue, job) from None
        raise
    try:
        lock_job(claim_fd, job, lock_wait)
        if not still_linked(queue.claimed, job, claim_fd):
            # Requeued while we waited for the lock (recover removes claimed/J under it), and
            # perhaps claimed anew: what we hold is no longer J's claim, whatever J is now.
            raise not_claimed(queue, job)
        request = lstat_at(claim_fd, job)
        if request is None:
            raise not_claimed(queue, job)
        if not is_regular(request):
            raise _not_a_request(job, kind_of(request))
        yield claim_fd
    finally:
        queue.ops.close(claim_fd)


def lock_job(claim_fd: int, job: str, within: float | None = None) -> DirLock:
    """J's lock (``claimed/J``), waited for at most ``within`` seconds (None:
    :data:`LOCK_WAIT_SECONDS`); EAGAIN, naming the processes that hold it, after that.
    ``UNSUPPORTED`` where the filesystem has none."""
    within = LOCK_WAIT_SECONDS if within is None else within
    taken = take_dir_lock(claim_fd, within=within)
    if taken is DirLock.BUSY:
        holders = ", ".join(str(pid) for pid in _flock_holders(claim_fd)) or "unknown"
        if within < LOCK_WAIT_SECONDS:  # a caller with a deadline of its own: no verdict
            raise CtxError(
                errno.EAGAIN,
                f"claimed/{job} is locked by another process (pid {holders}), still after "
                f"{within:g} s: a claim, finish or recover at work on {job}, or a process "
                "stuck holding it",
            )
        raise CtxError(
            errno.EAGAIN,
            f"claimed/{job} has been locked by another process (pid {holders}) for "
            f"{LOCK_WAIT_SECONDS:g} s, where a claim, finish or recover holds it for a "
            "moment: that process is stuck, or not a queue command; end it, then try again",
        )
    return taken


def _flock_holders(fd: int) -> list[int]:
    """The pids ``/proc/locks`` gives for the flocks on the file open at ``fd`` (none where
    it cannot be read; a pid of another pid namespace reads as 0 or another's)."""
    found = os.fstat(fd)
    inode = f"{os.major(found.st_dev):02x}:{os.minor(found.st_dev):02x}:{found.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            entries = [line.split() for line in locks]
    except OSError:
        return []
    return sorted({int(e[4]) for e in entries if len(e) > 5 and e[1] == "FLOCK" and e[5] == inode})


def _not_a_request(job: str, kind: str) -> CtxError:
    """EINVAL for ``claimed/J/J`` found to be a ``kind`` (a FIFO, a symlink, a directory), not
    the request a claim moves there: a conflict for a person (Q-6, Q-8), never followed,
    opened or moved, as status, list and show report it."""
    request = f"claimed/{job}/{job}"
    return CtxError(
        errno.EINVAL,
        f"job {job}'s {request} is a {kind}, not a request file: a conflict that no command "
        f"resolves, and nothing was changed (a queue command never follows, opens or moves "
        f"it); 'ctx queue show {job}' lists its evidence: put the request back as a regular "
        "file, or move the job's entries aside by hand",
    )


def remove_claim_and_lease(queue: Queue, job: str) -> None:
    """Remove ``lease/J/worker`` and sync ``lease/J``, then remove ``lease/J`` and
    ``claimed/J`` and sync their parents.

    The lease goes before the claim directory: while ``claimed/J`` exists nobody can claim J
    again (mkdir fails), so no new lease can meet a stale one.  ``lease/J`` is synced after
    its file goes though the directory goes next (Q-7: every affected parent, after every
    unlink); the sync of ``lease/`` alone would make both departures durable.
    """
    ops = queue.ops
    removals: list[tuple[int, str, bool]] = []
    lease_fd = None
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        try:
            lease_fd = queue.open_job_dir("lease", job)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            # No descriptor to spare (a claim refused for that very reason): an empty lease/J
            # goes all the same, and one that holds a lease fails at its rmdir (ENOTEMPTY).
    try:
        if lease_fd is not None:
            durable.remove_entries(ops, [(lease_fd, LEASE_FILE, False)])
            durable.sync_dir(ops, lease_fd)
        removals += [(queue.lease, job, True), (queue.claimed, job, True)]
        durable.remove_entries(ops, removals)
        durable.sync_dirs(ops, [queue.lease, queue.claimed])
    finally:
        if lease_fd is not None:
            ops.close(lease_fd)
