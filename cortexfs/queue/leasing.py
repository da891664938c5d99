"""Who holds a claimed job (SPEC Q-3): its lease read back, the refusals of a caller that does
not hold it (:class:`NotHeld`), and renewal by its holder.  A finish asks the same questions
before it moves anything (:mod:`cortexfs.queue.finishing`).
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Sequence

from cortexfs import durable
from cortexfs.errors import CtxError, describe, not_found
from cortexfs.names import job_name
from cortexfs.queue import evidence as ev
from cortexfs.queue.holder import MAX_LEASE_BYTES, MAX_LEASE_TTL, Holder, Lease, check_ttl
from cortexfs.queue.layout import (
    LEASE_FILE,
    RESULT_SUFFIX,
    NotADirectoryOfTheJob,
    Queue,
    lstat_at,
    read_regular_file,
)
from cortexfs.queue.transition import discard_temp, locked_claim
from cortexfs.storage import not_readable
from cortexfs.timefmt import rfc3339


def _claimed_anew(queue: Queue, job: str) -> bool:
    """Whether ``claimed/J`` holds J's request after all: a transition finds J unclaimed and
    then so only when J was requeued and claimed anew while it waited for J's lock."""
    found = lstat_at(queue.claimed, job)
    if found is None or not stat.S_ISDIR(found.st_mode):
        return False
    try:
        return lstat_at(queue.claimed, f"{job}/{job}") is not None
    except OSError:  # replaced meanwhile by something else than a directory
        return False


def read_lease(queue: Queue, job: str) -> Lease:
    """The lease of J; ENOENT when J has none."""
    try:
        lease_fd = queue.open_held_job_dir("lease", job)
    except FileNotFoundError:
        raise not_found(f"job {job} has no lease; it is not claimed") from None
    try:
        data = read_regular_file(lease_fd, LEASE_FILE, MAX_LEASE_BYTES)
    except FileNotFoundError:
        raise not_found(f"job {job} has no lease file; run 'ctx queue recover'") from None
    finally:
        queue.ops.close(lease_fd)
    return Lease.decode(data, job)


def lease_not_readable(queue: Queue, job: str, action: str) -> CtxError:
    """EACCES for ``action`` (``renew a lease``) when this process may not read J's lease (a
    member meeting root's ``lease/J`` in a shared queue): which entry refused, who owns it,
    its mode and what to do, and that nothing was changed."""
    lease_dir = queue.path / "lease" / job
    # The directory is opened first: refused there (listable by nobody but its owner), the
    # file's own owner and mode would explain nothing.
    unreadable_dir = not os.access(lease_dir, os.R_OK | os.X_OK, effective_ids=True)
    refused = not_readable(
        lease_dir if unreadable_dir else lease_dir / LEASE_FILE, f"{action} in queue {queue.path}"
    )
    return refused.then("nothing was changed")


def lease_unreadable(job: str, exc: OSError | CtxError) -> str:
    """Why J's lease could not be read, in the errno words every other refusal uses."""
    return f"lease/{job}/{LEASE_FILE} cannot be read ({describe(exc)})"


class NotHeld(CtxError):
    """A renewal or finish refused because J is not the caller's (any more): another holder
    leases it (EACCES), it is not claimed or claimed without a lease (ENOENT), or it is
    finished already (EEXIST).  The kernel gives the same errnos for what a host refuses (a
    directory's mode, a file gone), which say nothing of who holds J: a worker reports a job
    refused this way as taken away and goes on, and stops for the others.

    ``fact`` is where J is, without the advice to a person at a shell that the message adds
    (``claim it before …``): a worker's report says what the worker does instead."""

    def __init__(self, code: int, fact: str, advice: str = "") -> None:
        super().__init__(code, f"{fact}; {advice}" if advice else fact)
        self.fact = fact


def not_claimed(queue: Queue, job: str, doing: str = "finishing it") -> CtxError:
    """EEXIST or ENOENT for J found unclaimed by a transition of a claim (``doing``, what
    the caller was about to do), saying where J is instead."""
    if entries := ev.no_job_but(queue, job):
        said = ev.no_job_here(queue, job, entries)
        return NotHeld(errno.ENOENT, f"job {job} is not claimed: {said}")
    for dir_fd, state in ((queue.done, "done"), (queue.failed, "failed")):
        request = lstat_at(dir_fd, job) is not None
        result = lstat_at(dir_fd, job + RESULT_SUFFIX) is not None
        if request and result:
            return NotHeld(
                errno.EEXIST,
                f"job {job} is already {state}; 'ctx queue show {job}' shows its result",
            )
        if request or result:
            # Half a terminal pair (the other half removed by hand, or lost): a conflict
            # recover reports and never settles, and no finish may write over it.
            half, missing = (job, job + RESULT_SUFFIX) if request else (job + RESULT_SUFFIX, job)
            return NotHeld(
                errno.EEXIST,
                f"job {job} is already {state}, as {state}/{half} says, but {state}/{missing} "
                f"is missing: a conflict 'ctx queue status' reports, which no finish settles; "
                f"'ctx queue show {job}' shows what is left of it",
            )
    if lstat_at(queue.pending, job) is not None:
        return NotHeld(
            errno.ENOENT,
            f"job {job} is pending, not claimed: it was never claimed, or 'ctx queue recover' "
            "returned it to pending once its lease had expired or its holder was gone, to run "
            "again",
            f"claim it before {doing}, never beside a run of it still going on",
        )
    if _claimed_anew(queue, job):
        return NotHeld(
            errno.EACCES,
            f"job {job} was claimed again, by another claim, while this command waited for it "
            "(recover returned it to pending, its lease expired or its holder gone): "
            f"{doing} is that claim's to do; 'ctx queue show {job}' names its holder",
        )
    if lstat_at(queue.lease, job) is not None:
        # Its request gone from claimed/ (a crash between the steps of a requeue, or removed
        # by hand): no claim left to act on, and no job to run, but not "no such job".
        return NotHeld(
            errno.ENOENT,
            f"job {job} is not claimed: only its lease, lease/{job}, is left, with no request "
            "in claimed/, pending/, done/ or failed/ (an incomplete job)",
            f"'ctx queue show {job}' shows what is left of it, and 'ctx queue recover "
            "--reconcile' removes that lease once its holder is gone",
        )
    return NotHeld(
        errno.ENOENT,
        f"job {job} is not claimed, nor pending, done or failed: queue {queue.path} has no such "
        "job (is it the queue the job was claimed from?); 'ctx queue list' lists the jobs it has",
    )


def renew(
    queue: Queue,
    job: str,
    callers: Sequence[Holder],
    ttl: float | None = None,
    *,
    claimed_at: float | None = None,
    lock_wait: float | None = None,
) -> Lease:
    """Extend the caller's own lease on J (Q-3) to ``ttl`` seconds from now; EACCES when
    someone else holds it.  ``callers`` are the processes the caller may be, the first named
    in a refusal: a command run from a shell leases for the shell, and may be the shell's own
    process, which ``bash -c 'a && b'`` execs ``b`` in.  ``claimed_at``: renew only the lease
    of the claim made then (see :func:`refuse_other_holder`).

    Without ``ttl``, for as long again as the lease was taken or last renewed for (a claim
    with ``--ttl 1000`` renews for 1000 s, not for the queue's default), so that a renewal
    never shortens it; the queue's ``lease_ttl`` when that period is not a usable lifetime
    (a lease written by hand), unless the lease lasts longer already: then it is left as it
    is, and returned.  Done under ``claimed/J``'s lock, which recover takes before
    it requeues J: a renewal either lands before recover looks at the lease, or finds J no
    longer claimed (ENOENT) and never writes a lease for a job that went back to pending.
    The lock is waited for at most ``lock_wait`` seconds (EAGAIN then; None: as long as any
    transition waits, :data:`~cortexfs.queue.transition.LOCK_WAIT_SECONDS`).
    """
    job = job_name(job)
    if ttl is not None:
        ttl = check_ttl(ttl)
    with locked_claim(queue, job, _no_lease_to_renew, lock_wait=lock_wait):
        try:
            current = read_lease(queue, job)
        except NotADirectoryOfTheJob:
            raise
        except PermissionError:
            raise lease_not_readable(queue, job, "renew a lease") from None
        except CtxError as exc:
            if exc.errno == errno.ENOENT:
                raise claimed_without_lease(job) from None
            raise not_a_lease(job, exc, "renew") from None
        refuse_other_holder(job, current, callers, "renews its lease", claimed_at)
        if ttl is None:
            usable = 0 < current.period <= MAX_LEASE_TTL
            ttl = check_ttl(current.period if usable else queue.config.lease_ttl)
            if not usable and current.expires_at > time.time() + ttl:
                return current  # lasts longer already: a renewal never shortens a lease
        renewed = current.renewed(ttl)
        expires = current.to_json()["expires_at"]
        outcome = (f"the lease on {job} is unchanged (it expires at {expires})", "renew it again")
        replace_lease(queue, job, current, renewed, "renew a lease", outcome)
        return renewed


def replace_lease(
    queue: Queue, job: str, current: Lease, lease: Lease, action: str, outcome: tuple[str, str]
) -> None:
    """Put ``lease`` in place of ``current`` in ``lease/J/worker`` (temp + fsync, then a
    rename synced), for a caller that holds ``claimed/J``'s lock.  Refused, it raises the
    queue's refusal of ``action`` with ``outcome`` (what became of the lease, what to do),
    and leaves no temp file."""
    ops = queue.ops
    queue.require_unpinned(action, ("inbox",), outcome[0])
    temp = queue.temp_name(job, "renew")
    try:
        lease_fd = queue.open_held_job_dir("lease", job)
    except OSError as exc:
        raise queue.refusal(action, f"lease/{job}", exc, *outcome) from None
    try:
        ops.step("renew.write")
        try:
            durable.write_file_synced(
                ops, queue.inbox, temp, lease.encode(), group=queue.file_group
            )
        except OSError as exc:
            raise queue.refusal(action, "inbox", exc, *outcome) from None
        ops.step("renew.replace")
        try:
            durable.replace_synced(ops, queue.inbox, temp, lease_fd, LEASE_FILE)
        except OSError as exc:
            if lstat_at(queue.inbox, temp) is None:  # replaced; a sync after it failed
                outcome = (
                    f"the lease on {job} was renewed until {lease.to_json()['expires_at']}, but "
                    "a crash may still bring back the old one (expiring at "
                    f"{current.to_json()['expires_at']})",
                    "renew it again",
                )
            else:
                discard_temp(queue, temp)
            lease_file = (f"lease/{job}/{LEASE_FILE}",)
            raise queue.refusal(action, f"lease/{job}", exc, *outcome, entries=lease_file) from None
    finally:
        ops.close(lease_fd)


def claimed_without_lease(job: str) -> CtxError:
    """ENOENT for J claimed (under its lock) with no lease: the claim never completed, so the
    job never ran (Q-3), and recover --reconcile sends it back to pending (Q-6)."""
    return NotHeld(
        errno.ENOENT,
        f"job {job} has no lease/{job}/{LEASE_FILE}: its claim never completed, so it "
        "never ran; 'ctx queue recover --reconcile' returns it to pending",
    )


def not_a_lease(job: str, lease: CtxError, verb: str) -> CtxError:
    """The error of ``verb`` (finish, renew) finding in ``lease/J/worker`` what is not a lease
    (``lease``: why not), a conflict for a person (Q-6).  It is to be repaired, never removed:
    a claim without a lease is one that never ran (Q-3), which finish refuses as such and
    recover --reconcile sends back to pending, when J may well have run."""
    lease_file = f"lease/{job}/{LEASE_FILE}"
    return CtxError(
        lease.errno,
        f"job {job}'s {lease_file} is not a lease ({lease.message}), a conflict that {verb} "
        f"never resolves; nothing was changed.  Repair it by hand, and do not remove it "
        f"(without a lease, {job} counts as never run and is requeued to run again): check "
        f"which worker holds {job} and whether it still runs (its log, the file's own "
        f"fields), make {lease_file} a regular file whose JSON names that holder again, then "
        f"{verb} again; until then 'ctx queue recover --reconcile' reports {job} as a "
        "conflict and leaves it alone",
    )


def _no_lease_to_renew(queue: Queue, job: str) -> CtxError:
    """ENOENT, saying where J is instead (pending, done, failed, nowhere)."""
    where = not_claimed(queue, job, "renewing its lease")
    if where.errno == errno.EACCES:  # another claim's lease
        return where
    orphan = lstat_at(queue.lease, job) is not None  # a lease with no claim to renew
    return NotHeld(
        errno.ENOENT, f"there is no {'claim' if orphan else 'lease'} to renew: {where.message}"
    )


def refuse_other_holder(
    job: str,
    lease: Lease,
    callers: Sequence[Holder],
    verb: str,
    claimed_at: float | None = None,
) -> None:
    """EACCES unless one of ``callers`` is the process ``lease`` names, and, given
    ``claimed_at``, the lease is of the claim made then: a process that held J, lost it (its
    lease expired, recover requeued J) and claimed J again holds the later claim only."""
    mine = any(lease.holder.is_same_process(caller) for caller in callers)
    if mine and claimed_at is not None and rfc3339(lease.claimed_at) != rfc3339(claimed_at):
        raise NotHeld(
            errno.EACCES,
            f"job {job} was claimed again at {rfc3339(lease.claimed_at)}, after the claim "
            f"made at {rfc3339(claimed_at)} lost its lease; only the later claim {verb}",
        )
    if not mine:
        holder = callers[0]
        theirs = lease.holder
        raise NotHeld(
            errno.EACCES,
            f"job {job} is leased to pid {theirs.pid} on {theirs.host} (worker "
            f"{theirs.worker}), not to {_caller_apart(theirs, holder)}; only the holder {verb}",
        )


def _caller_apart(theirs: Holder, caller: Holder) -> str:
    """``caller`` as a refusal names it, saying what sets it apart from the lease's holder
    when the pid alone does not (a pid is never proof of the same process, Q-5)."""
    if theirs.pid != caller.pid:
        return f"pid {caller.pid}"
    if theirs.boot_id != caller.boot_id:
        return f"pid {caller.pid} of another boot (the holder's was {theirs.boot_id})"
    if theirs.pid_ns != caller.pid_ns:
        return (
            f"pid {caller.pid} of pid namespace {caller.pid_ns} (the holder's is {theirs.pid_ns})"
        )
    started = (
        "at an unknown time" if caller.start_time is None else f"at {rfc3339(caller.start_time)}"
    )
    return f"pid {caller.pid}, another process of that number (started {started})"
