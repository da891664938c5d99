"""Claim and lease (SPEC Q-2, Q-3, Q-9): the oldest pending job a claimer can win moves to
``claimed/J/J`` under the ``mkdir claimed/J`` arbitration, and its lease is written only once
that move is durable.  A step the kernel refuses puts J back in ``pending/`` as it was.  The
step order is in :mod:`cortexfs.queue.protocol`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cortexfs import durable
from cortexfs.errors import CtxError, errno_text, explain_host_trouble
from cortexfs.queue import requests
from cortexfs.queue.claim_order import candidates, pending_changed, pending_stamp
from cortexfs.queue.holder import Holder, Lease, check_ttl, check_worker_id
from cortexfs.queue.layout import LEASE_FILE, DirLock, Queue, lstat_at, read_regular_file
from cortexfs.queue.leasing import replace_lease
from cortexfs.queue.transition import (
    discard_temp,
    is_regular,
    lock_job,
    moved_in,
    not_known_where,
    remove_claim_and_lease,
    still_linked,
    terminal_evidence,
)


@dataclass(frozen=True)
class Claim:
    """A job this process now holds: its name, its request and its lease.

    ``invalid_reason`` is set only when the stored request could not be read as a valid
    request (one put in ``pending/`` by hand, past publish's checks), and says so in a phrase
    that names it ("stored request is …"); ``request`` is then the
    stand-in :func:`invalid_request` that ``claim --json`` prints.  A valid request is given
    as stored, whatever extra fields it carries (an ``"invalid"`` one among them, §2.1), so
    this field, not the request's keys, tells the two apart.
    """

    job: str
    request: dict[str, Any]
    lease: Lease
    invalid_reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.job, "request": self.request, "lease": self.lease.to_json()}


def invalid_request(reason: str) -> dict[str, Any]:
    """What a claim gives as the request of a job whose stored request is not valid: no tool
    to run, and the reason (docs/queue.md, ``claim --json``)."""
    return {"tool": None, "input": {}, "invalid": reason}


def claim(
    queue: Queue,
    holder: Holder,
    ttl: float | None = None,
    accepts: Callable[[Mapping[str, Any]], bool] | None = None,
    left_pending: dict[str, str] | None = None,
) -> Claim | None:
    """Claim the oldest pending job we can win (Q-2, Q-9) and lease it to ``holder`` (Q-3).

    Returns None when there is nothing to claim.  Losing a race is not an error: the next
    candidate is tried.  ``accepts``: a claimer that runs only some kinds of job (a shell
    worker) looks at each pending request first and leaves those it declines pending, for
    the claimers they are meant for; an unreadable request is not declined.
    ``left_pending`` receives the jobs passed over while still pending, each with the
    reason (one of :data:`LEFT_PENDING`), so that a claimer finding nothing can say why.
    EINVAL, before anything is read or changed, for a holder whose worker id no lease may
    record (:func:`check_worker_id`).
    """
    check_worker_id(holder.worker)
    passed_over: dict[str, str] = {}
    tried: set[str] = set()
    for job in candidates(queue):
        # A name the claim order offers again (another process put it back meanwhile, or
        # our own refusal did) was settled for this call already.
        if job in tried:
            continue
        tried.add(job)
        if accepts is not None and not _accepted(queue, job, accepts):
            continue
        won = claim_job(queue, job, holder, ttl, passed_over)
        for _ in range(_RETRIES_AFTER_RECOVER):
            # Nobody won J when a recover took our fresh claimed/J away: it is as pending and
            # claimable as before, and claimed again rather than passed over.
            if won is not None or passed_over.get(job) != RECOVERED:
                break
            del passed_over[job]
            won = claim_job(queue, job, holder, ttl, passed_over)
        if won is not None:
            return won
    if left_pending is not None:
        # Passed over in a race that is settled by now (another claimer won J) is no reason
        # to give: only what is still pending is kept.
        left_pending.update(still_pending(queue, passed_over))
    return None


def still_pending(queue: Queue, left_pending: Mapping[str, str]) -> dict[str, str]:
    """The jobs of ``left_pending`` (see :func:`claim`) still in ``pending/``, with their reason."""
    return {
        job: why for job, why in left_pending.items() if is_regular(lstat_at(queue.pending, job))
    }


# Why a pending job was passed over by a claim (``left_pending``): each is also a race that a
# concurrent claimer or recover may be settling at that moment.
UNREADABLE = "unreadable"  # this uid may not read its request
UNLINKABLE = "unlinkable"  # moved by link, and this uid may not link it (protected_hardlinks)
CLAIM_LEFT = "claimed"  # claimed/J is there already: a claim in progress, or a crash's leftover
LEASE_LEFT = "leased"  # lease/J is there without a claim: an earlier crash's leftover
FINISHED = "finished"  # J is in done/ or failed/ too: a conflict
# recover --reconcile removed our fresh, empty claimed/J, taking it for a crash's leftover
RECOVERED = "recovered"
LEFT_PENDING = (UNREADABLE, UNLINKABLE, CLAIM_LEFT, LEASE_LEFT, FINISHED, RECOVERED)
# How many times claim() tries again a job whose fresh claimed/J a recover took away.
_RETRIES_AFTER_RECOVER = 2


def _accepted(queue: Queue, job: str, accepts: Callable[[Mapping[str, Any]], bool]) -> bool:
    try:
        request = requests.decode_stored_request(_read_stored_request(queue, queue.pending, job))
    except (OSError, CtxError):
        return True  # gone (claim_job sees it) or unusable (whoever claims it fails it)
    return accepts(request)


def _read_stored_request(queue: Queue, dir_fd: int, job: str) -> bytes:
    """The bytes of request ``job`` in ``dir_fd``, at most what this queue may have stored."""
    limit = requests.stored_request_limit(queue.config.max_request_bytes)
    return read_regular_file(dir_fd, job, limit)


def claim_job(
    queue: Queue,
    job: str,
    holder: Holder,
    ttl: float | None = None,
    left_pending: dict[str, str] | None = None,
) -> Claim | None:
    """Try to claim and lease one named job; None when it is gone, someone else won, or its
    request is not a job (Q-8) or not ours to read (it goes back to pending).  Why a job
    still pending was passed over goes to ``left_pending`` (see :func:`claim`).

    A step the kernel refuses (EACCES, EROFS, ENOSPC…) raises, with J back in ``pending/``
    as it was: refused in the middle, the claim is undone rather than left without a lease.
    """
    ops = queue.ops
    ttl = check_ttl(queue.config.lease_ttl if ttl is None else ttl)
    check_worker_id(holder.worker)  # a lease its own readers would refuse never runs a job
    if not is_regular(lstat_at(queue.pending, job)):
        return None
    # Before claimed/J is made: the lease is staged in inbox/ (_write_lease).
    queue.require_unpinned("claim", ("inbox",), _nothing_claimed(job)[0])
    passed_over = left_pending if left_pending is not None else {}
    ops.step("claim.mkdir")
    try:
        ops.mkdir(job, queue.claimed, 0o775)
    except FileExistsError:
        passed_over[job] = CLAIM_LEFT
        return None
    except OSError as exc:
        raise queue.refusal("claim", "claimed", exc, *_nothing_claimed(job)) from None
    try:
        claim_fd = queue.open_job_dir("claimed", job)
    except FileNotFoundError:
        # recover took our empty claim directory for a crash's leftover: J is still pending.
        passed_over[job] = RECOVERED
        return None
    except OSError as exc:  # EMFILE…: J stays pending, claimable, with no claim evidence
        refusal = queue.refusal("claim", "claimed", exc, *_nothing_claimed(job))
        _abandon_claim_dir(queue, job, refusal)
        raise refusal from None
    try:
        try:
            # First of all: whoever looks at, recovers or finishes the job may be another
            # member of the queue's group, and must be able to read and change claimed/J
            # whatever this process's umask, even where the claim stops right here.
            durable.grant_group_access(ops, claim_fd, queue.group_access)
            # Held until the lease is durable: recover must not mistake our half-done claim
            # (a request in claimed/J and no lease yet) for the leftovers of a crash.
            lock = lock_job(claim_fd, job)
        except (OSError, CtxError) as exc:
            refusal = (
                exc
                if isinstance(exc, CtxError)
                else queue.refusal("claim", "claimed", exc, *_nothing_claimed(job))
            )
            if still_linked(queue.claimed, job, claim_fd):  # not another claimer's by now
                _abandon_claim_dir(queue, job, refusal)
            raise refusal from None
        if not still_linked(queue.claimed, job, claim_fd):
            # recover removed our empty claim directory before we locked it (another claimer
            # may have made one since, or none: J may still be pending).
            passed_over[job] = RECOVERED
            return None
        try:
            # Durable before anything moves into it: a rename may reach the disk ahead of the
            # mkdir of its destination directory, and the request would then be unreachable
            # (I-1).
            durable.sync_dir(ops, queue.claimed)
        except OSError as exc:
            refusal = queue.refusal("claim", "claimed", exc, *_nothing_claimed(job))
            _abandon_claim_dir(queue, job, refusal)
            raise refusal from None
        if lstat_at(queue.lease, job) is not None:
            # Lease evidence from an earlier crash: leave the whole job to recover.
            _abandon_claim_dir(queue, job)
            passed_over[job] = LEASE_LEFT
            return None
        if terminal_evidence(queue, job):
            # J is both pending and finished: a conflict, reported and never run again.
            _abandon_claim_dir(queue, job)
            passed_over[job] = FINISHED
            return None
        ops.step("claim.move")
        before = pending_stamp(queue.pending)
        try:
            durable.move_noreplace(ops, queue.pending, job, claim_fd, job)
        except FileNotFoundError:
            _abandon_claim_dir(queue, job)
            return None
        except OSError as exc:
            moved = moved_in(queue.pending, job, claim_fd, job)
            if isinstance(moved, OSError):
                raise not_known_where(
                    "claiming",
                    job,
                    exc,
                    moved,
                    "it is pending, or in claimed/ with no lease; it never ran, and once the "
                    "queue can be read 'ctx queue recover --reconcile' returns it to pending",
                ) from None
            if moved:
                # A barrier after the move failed: what a crash there leaves, for recover.
                raise CtxError(
                    exc.errno or errno.EIO,
                    f"job {job} was moved to claimed/, but syncing the queue after the move "
                    f"failed ({errno_text(exc)}): it has no lease and never ran; 'ctx queue "
                    "recover --reconcile' returns it to pending",
                ) from None
            if _not_ours_to_link(queue, job, exc):
                _abandon_claim_dir(queue, job)
                passed_over[job] = UNLINKABLE
                return None
            refusal = queue.refusal(
                "claim", "pending", exc, *_nothing_claimed(job), entries=(f"pending/{job}",)
            )
            _abandon_claim_dir(queue, job, refusal)
            raise refusal from None
        pending_changed(queue, before)  # ours: the order need not list pending/ for it
        refusal: CtxError | None = None
        invalid_reason: str | None = None
        try:
            request, invalid_reason = _read_claimed_request(queue, claim_fd, job)
        except PermissionError:
            request = None  # a member's request left mode 0600: for a claimer who may read it
            passed_over[job] = UNREADABLE
        except OSError as exc:  # EMFILE, EIO…: J goes back, as the kernel's refusal says
            request = None
            refusal = queue.refusal("claim", f"claimed/{job}", exc, *_nothing_claimed(job))
        if request is not None:
            lease = Lease.new(job, holder, ttl)
            try:
                _write_lease(queue, job, lease)
            except OSError as exc:
                refusal = queue.refusal("claim", "lease", exc, *_nothing_claimed(job))
            except CtxError as exc:
                if exc.errno == errno.EEXIST:
                    raise  # a lease/J not ours: nothing here may remove it; recover decides
                refusal = exc  # refused in inbox/, and named so by _write_lease
            else:
                ops.step("lease.done")
                if lock is DirLock.UNSUPPORTED and _taken_back_meanwhile(queue, job, claim_fd):
                    passed_over[job] = RECOVERED
                    return None
                lease = _renewed_after_a_stall(queue, job, lease, ttl)
                return Claim(job, request, lease, invalid_reason)
        # Not a job or not ours to read, or a step the kernel refused (not a crash): J
        # goes back as it was rather than stay claimed without a lease until someone
        # reconciles it.  A refusal keeps J first in the claim order, as recover
        # requeues; what this claimer cannot take is not offered to it again.
        before = pending_stamp(queue.pending)
        try:
            durable.move_noreplace(ops, claim_fd, job, queue.pending, job)
            offered = [job] if refusal is not None else []
            pending_changed(queue, before, offered, first=bool(offered))
            if refusal is not None:
                remove_claim_and_lease(queue, job)  # with the empty lease/J the refusal left
        except OSError as exc:
            raise _undo_refused(queue, job, claim_fd, refusal, exc) from None
        if refusal is not None:
            raise refusal
        _abandon_claim_dir(queue, job)
        return None
    finally:
        ops.close(claim_fd)


def _taken_back_meanwhile(queue: Queue, job: str, claim_fd: int) -> bool:
    """Whether a recover took J's claimed request back to ``pending/`` before its lease was
    in place, which only a filesystem refusing ``flock`` allows (J's lock was no lock, and
    the claim was older than a lease lifetime: a claimer stalled that long): the lease just
    written, ours since ``lease/J`` was made by us, is withdrawn, and J is claimed anew or
    left pending (Q-3: nothing runs on a claim that is not there)."""
    if lstat_at(claim_fd, job) is not None:
        return False
    ops = queue.ops
    lease_fd = queue.open_job_dir("lease", job)
    try:
        durable.remove_entries(ops, [(lease_fd, LEASE_FILE, False)])
        durable.sync_dir(ops, lease_fd)
    finally:
        ops.close(lease_fd)
    durable.remove_entries(ops, [(queue.lease, job, True)])
    durable.sync_dir(ops, queue.lease)
    return True


def _not_ours_to_link(queue: Queue, job: str, refused: OSError) -> bool:
    """Whether the move of ``pending/J`` was refused because it moves by link and J's request
    is another uid's that this one may not write: ``fs.protected_hardlinks`` lets no one else
    link it.  Not the queue's refusal, as a request this uid may not read is not: J stays
    pending for its owner, or for a member who may write it (``publish`` makes requests
    group-writable), and the claim goes on to the next job."""
    if refused.errno != errno.EPERM:
        return False
    if durable.move_strategy_for(queue.ops, queue.pending) != durable.MOVE_LINK:
        return False
    try:
        request = os.stat(job, dir_fd=queue.pending, follow_symlinks=False)
        writable = os.access(job, os.W_OK, dir_fd=queue.pending, effective_ids=True)
    except OSError:
        return False
    return request.st_uid != os.geteuid() and not writable


def _undo_refused(
    queue: Queue, job: str, claim_fd: int | None, refusal: CtxError | None, exc: OSError
) -> CtxError:
    """The error of a claim whose undo the kernel refused too (the disk that refused the
    lease refuses the way back): where J stands now, which recover settles, instead of the
    refusal's "nothing was claimed" or a bare errno."""
    try:
        claimed = claim_fd is not None and lstat_at(claim_fd, job) is not None
    except OSError as unread:  # the filesystem failed as a whole: both are possible
        where = (
            f"it is pending, or its request is in claimed/{job} with no lease (the queue "
            f"could not be read to tell: {errno_text(unread)})"
        )
    else:
        if claimed:
            where = f"its request is in claimed/{job}, with no lease"
        else:
            where = f"it is pending, with an empty claimed/{job} left beside it"
    done, _ = _nothing_claimed(job)
    first, too = "", ""
    if refusal is not None:
        first, too = f"{refusal.message.split(f'; {done}')[0]}; ", " as well"
    trouble = explain_host_trouble(exc.errno, filesystem=queue.root_fd, uid=os.geteuid())
    mend = "" if trouble is None else f"{trouble.remedy}, then "
    return CtxError(
        (refusal.errno if refusal is not None else exc.errno) or errno.EIO,
        f"{first}undoing the claim of {job} was refused{too} ({errno_text(exc)}): {where}; "
        f"it never ran: {mend}'ctx queue recover --reconcile' returns it to pending",
    )


def _write_lease(queue: Queue, job: str, lease: Lease) -> None:
    """Create ``lease/J/worker`` temp+fsync+move, parents synced (Q-3).

    Refused (EEXIST, the temp file refused in ``inbox/`` as a :class:`CtxError` naming it, or
    an OSError from the kernel in ``lease/``), it removes its temp file and raises; an empty
    ``lease/J`` it made is the caller's to remove, with the claim."""
    ops = queue.ops
    temp = queue.temp_name(job, "lease")
    ops.step("lease.write")
    try:
        durable.write_file_synced(ops, queue.inbox, temp, lease.encode(), group=queue.file_group)
    except OSError as exc:
        raise queue.refusal("claim", "inbox", exc, *_nothing_claimed(job)) from None
    try:
        ops.step("lease.mkdir")
        try:
            ops.mkdir(job, queue.lease, 0o775)
        except FileExistsError:
            raise CtxError(
                errno.EEXIST, f"lease/{job} appeared during the claim; run 'ctx queue recover'"
            ) from None
        lease_fd = queue.open_job_dir("lease", job)
        try:
            # As for claimed/J, before anything can stop the claim; then lease/J is made
            # durable, as make_dir_synced would, before the lease moves into it.
            durable.grant_group_access(ops, lease_fd, queue.group_access)
            durable.sync_dir(ops, queue.lease)
            ops.step("lease.move")
            durable.move_noreplace(ops, queue.inbox, temp, lease_fd, LEASE_FILE)
        finally:
            ops.close(lease_fd)
    except OSError as exc:
        # Said before the temp file goes: what ran short is measured as it was when the
        # kernel refused (the last inode, which removing the temp would give back).
        refusal = queue.refusal("claim", "lease", exc, *_nothing_claimed(job))
        _discard_temp_if_it_may_be(queue, temp)
        raise refusal from None
    except CtxError:
        _discard_temp_if_it_may_be(queue, temp)
        raise


def _renewed_after_a_stall(queue: Queue, job: str, lease: Lease, ttl: float) -> Lease:
    """``lease``, or a renewal of it when making it durable took half of its lifetime or more.

    A claim stopped between its move and its lease (SIGSTOP, Ctrl-Z, a disk that stalls) for
    longer than the lease lives would hand its caller a lease that is already the proof of
    its death (Q-5): the next recover would requeue the job just given, to run twice.  Still
    under ``claimed/J``'s lock, which recover takes before it judges a lease, so no recover
    has seen the stale one.  Refused, the job stays claimed under the stale lease, never run,
    for recover to return once it expires; the caller is told not to run it."""
    if time.time() < lease.claimed_at + ttl / 2:
        return lease
    renewed = lease.renewed(ttl)
    expires = lease.to_json()["expires_at"]
    stale = (
        f"job {job} was claimed, but its claim took so long that its lease expires at "
        f"{expires} and could not be renewed: do not run it; 'ctx queue recover' returns it "
        "to pending once that lease has expired",
        "claim again",
    )
    replace_lease(queue, job, lease, renewed, "claim", stale)
    return renewed


def _discard_temp_if_it_may_be(queue: Queue, temp: str) -> None:
    """Remove a temp file of a step that failed, unless the kernel refuses that too: the
    step's own error is the one to tell, and 'recover --reconcile' removes a stale temp."""
    with contextlib.suppress(OSError):
        discard_temp(queue, temp)


def _read_claimed_request(
    queue: Queue, claim_fd: int, job: str
) -> tuple[dict[str, Any] | None, str | None]:
    """The request we just moved into claimed/J/J and why it is not valid (None when it is);
    the request is None when it is not a regular file.

    A malformed but regular request is still claimed, as :func:`invalid_request` with the
    reason: the worker finishes it as failed with the reason, which is more useful than
    leaving it pending forever.  One this process may
    not open (a member's request left mode 0600) is no reason to fail it: PermissionError
    tells the caller to put it back for a claimer who may read it.  Any other error reading
    it (EIO) is raised too.
    """
    try:
        data = _read_stored_request(queue, claim_fd, job)
    except CtxError as exc:
        if exc.errno in (errno.ELOOP, errno.EINVAL):
            return None, None
        reason = (  # EFBIG
            f"stored request is over the size limit: {exc.message} (max_request_bytes="
            f"{queue.config.max_request_bytes} of the queue's config, and "
            f"{requests.STORED_OVERHEAD} more for the 'from' and 'created' that publish adds)"
        )
        return invalid_request(reason), reason
    try:
        return requests.decode_stored_request(data), None
    except CtxError as exc:
        return invalid_request(exc.message), exc.message


def _abandon_claim_dir(queue: Queue, job: str, refusal: CtxError | None = None) -> None:
    """Undo our ``mkdir claimed/J`` after losing the job, or after ``refusal``, which the
    caller raises next; when the kernel refuses the undo too, an error saying where J stands.

    ENOTEMPTY: the directory is another claimer's.  recover took ours for a crash's empty
    leftover before we opened it (Q-6), the winner made a new one, and that is the one we
    opened: it holds the winner's request now, and stays.
    """
    try:
        durable.remove_entries(queue.ops, [(queue.claimed, job, True)])
    except OSError as exc:
        if exc.errno != errno.ENOTEMPTY:
            raise _undo_refused(queue, job, None, refusal, exc) from None
        return
    try:
        durable.sync_dir(queue.ops, queue.claimed)
    except OSError as exc:
        raise _undo_refused(queue, job, None, refusal, exc) from None


def _nothing_claimed(job: str) -> tuple[str, str]:
    """What a claim of J refused midway did (:meth:`Queue.refusal`): it was undone."""
    return f"nothing was claimed (job {job} stays pending)", "claim again"
