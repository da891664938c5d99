"""The shared queue protocol: publish, claim, lease, renew, finish (SPEC §2.1, §2.2).

The directory layout is the state machine.  For a job ``J`` (an object name ending in
``.req.json``) the durable states are::

    state     evidence on disk
    -------   ------------------------------------------
    pending   pending/J
    claimed   claimed/J/J   and  lease/J/worker
    done      done/J        and  done/J.result
    failed    failed/J      and  failed/J.result

``inbox/`` only ever holds temp files on their way to a final name.  Every transition is a
sequence of named steps; every step that changes a name is followed by a sync of the
directories it touched before the next step may depend on it (Q-7)::

    publish   write inbox/tmp, fsync it            a name never shows half a request (I-2)
              move inbox/tmp -> pending/J          no-replace: never overwrite evidence (Q-1)
              sync pending/, inbox/                then, and only then, report success
    claim     mkdir claimed/J, lock it, sync claimed/   the arbitration point; EEXIST = lost (Q-2)
              move pending/J -> claimed/J/J
              sync claimed/J, pending/             the claim is durable ...
    lease     mkdir lease/J, sync lease/
              move inbox/tmp -> lease/J/worker
              sync lease/J, inbox/                 ... before the lease exists (Q-3); execution
                                                   may start only now (I-4)
    finish    write inbox/tmp, fsync; move -> done/J.result; sync   result first (Q-4) ...
              move claimed/J/J -> done/J; sync done/  ... then the request: the terminal pair
              remove lease/J/worker, lease/J, claimed/J; sync lease/, claimed/
    (failed/ instead of done/ when the job failed)

A step the kernel refuses (EACCES, EROFS, ENOSPC…) is not a crash: the transition is undone
as far as it got, and the refusal (:meth:`Queue.refusal`) says which directory refused, what
was and was not done, and what to do.  A claim refused after its move puts the request back
(move claimed/J/J -> pending/J, first in the claim order; remove lease/J, claimed/J; sync);
``finish`` checks every directory it will change before its first step instead, because once
the result is in place there is no going back.  A batch refused midway through its moves
(``pending/`` cannot grow on a full disk) is published in part: :class:`PublishedInPart`
names the jobs published and the requests not.

Why this order survives a crash at any point is spelled out in ``docs/queue.md``; what
``recover`` does with each leftover is in :mod:`cortexfs.queue.recovery`.  Each step is marked
with ``ops.step(name)``, the crash points the fault-injection tests stop at.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cortexfs import durable, jsontext
from cortexfs.errors import CtxError, exists, explain_host_trouble, invalid, not_found
from cortexfs.interrupts import held_interrupts
from cortexfs.names import job_name
from cortexfs.queue import evidence as ev
from cortexfs.queue import requests
from cortexfs.queue.claim_order import candidates, pending_changed, pending_stamp
from cortexfs.queue.holder import (
    MAX_LEASE_BYTES,
    MAX_LEASE_TTL,
    Holder,
    Lease,
    check_ttl,
    check_worker_id,
    judge,
    once_gone,
)
from cortexfs.queue.layout import (
    LEASE_FILE,
    RESULT_SUFFIX,
    NotADirectoryOfTheJob,
    Queue,
    kind_of,
    lock_dir,
    lstat_at,
    read_regular_file,
)
from cortexfs.timefmt import rfc3339


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


def new_job_name() -> str:
    """A fresh job name that sorts by publish time: ``job-<UTC time>-<random>.req.json``."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return f"job-{stamp}-{os.urandom(5).hex()}.req.json"


# ------------------------------------------------------------------------------- publish


def publish(
    queue: Queue,
    request: Mapping[str, Any],
    name: str | None = None,
    publisher: str | None = None,
    given: bytes | None = None,
) -> str:
    """Publish one request as ``pending/J`` (Q-1); returns J once it is durable.

    EEXIST when J already has evidence anywhere; EINVAL/EFBIG for an invalid request.
    ``given``: the bytes ``request`` was parsed from, when there were any: the size limit
    applies to them and they are what is stored (see :func:`requests.encode_request`).
    Nothing is left behind on refusal.
    """
    job = job_name(name) if name is not None else new_job_name()
    limit = queue.config.max_request_bytes
    data = requests.encode_request(request, limit, publisher, given)
    if name is not None:  # a name just made up has no evidence to find yet
        refuse_known_job(queue, job)  # early and cheap; the check that counts comes below
    ops = queue.ops
    temp = queue.publish_temp_name(job)
    ops.step("publish.write")
    try:
        durable.write_file_synced(ops, queue.inbox, temp, data, group=queue.file_group)
    except FileExistsError:
        raise _publish_in_progress(queue, job, temp) from None
    except OSError as exc:
        raise queue.refusal("publish", "inbox", exc, *NOTHING_PUBLISHED) from None
    # Holding the staging name, look again: a publisher of J that got past the early check
    # before J's first lifecycle moved J out of pending/ is refused here, not acknowledged.
    try:
        refuse_known_job(queue, job)
    except CtxError:
        _discard_temp(queue, temp)
        raise
    ops.step("publish.move")
    before = pending_stamp(queue.pending)
    try:
        durable.move_noreplace(ops, queue.inbox, temp, queue.pending, job)
    except FileExistsError:
        _discard_temp(queue, temp)
        raise exists(f"job {job} is already pending; publish under another name") from None
    except OSError as exc:
        moved = _moved_in(queue.inbox, temp, queue.pending, job)
        if isinstance(moved, OSError):
            raise _not_known_where(
                "publishing",
                job,
                exc,
                moved,
                "it may be in pending/ and will then be claimed, so do not publish it again "
                f"under another name; once the queue can be read, 'ctx queue show {job}' shows "
                "whether it is",
            ) from None
        if moved:
            pending_changed(queue, before, [job])
            raise _published_unsynced([job], exc) from None
        _discard_temp(queue, temp)
        raise queue.refusal("publish", "pending", exc, *NOTHING_PUBLISHED) from None
    pending_changed(queue, before, [job])
    ops.step("publish.done")
    return job


# What a publish refused before any job reached pending/ did, and what to do once the cause is
# gone (see Queue.refusal).
NOTHING_PUBLISHED = ("nothing was published", "publish again")


class PublishedInPart(CtxError):
    """A publish that failed after some of its jobs reached ``pending/``: they will be
    claimed, so a caller must acknowledge them (never publish them again) and publish again
    only the requests of ``not_published``.

    ``published`` and ``not_published`` are job names in input order; ``not_published_at``
    says where each request not published came from (its line in the batch's input, or its
    1-based position in the batch).  Its JSON object (:meth:`to_json`) carries all three.
    """

    def __init__(
        self,
        code: int,
        message: str,
        published: Sequence[str],
        not_published: Sequence[str] = (),
        not_published_at: Sequence[int] = (),
    ) -> None:
        super().__init__(code, message)
        self.published = list(published)
        self.not_published = list(not_published)
        self.not_published_at = list(not_published_at)

    def outcome(self) -> str:
        """What the publish did and did not do, in words that say what to do again and what
        not: ``J1, J2 published and pending (do not publish again); lines 3-8 not published
        (publish those lines again, and only those)``."""
        said = f"{', '.join(self.published)} published and pending (do not publish again)"
        if self.not_published_at:
            said += (
                f"; {_line_ranges(self.not_published_at)} not published (publish those lines "
                "again, and only those)"
            )
        return said

    def to_json(self) -> dict[str, object]:
        return {
            **super().to_json(),
            "published": self.published,
            "not_published": self.not_published,
            "not_published_lines": self.not_published_at,
        }


# Staging files a batch writes with Ctrl-C held at a time: a Ctrl-C waits a few milliseconds.
_HELD_WRITES = 64


def publish_batch(
    queue: Queue,
    batch: Sequence[Mapping[str, Any]],
    names: Sequence[str | None] | None = None,
    publisher: str | None = None,
    given: Sequence[bytes] | None = None,
    acknowledge: Callable[[list[str], PublishedInPart | None], None] | None = None,
    line_numbers: Sequence[int] | None = None,
) -> list[str]:
    """Publish many requests as one group commit: one barrier for all their data, one sync
    per directory for all their names.  Returns the job names in input order.

    Every request is validated first; one invalid request refuses the whole batch (EINVAL
    listing each bad entry by its 1-based position) and nothing is written.  A crash during
    the call may publish a prefix of the batch — the batch is durable, not atomic.  So may a
    refusal once the moves into ``pending/`` have begun (ENOSPC when ``pending/`` must grow
    and the disk is full): :class:`PublishedInPart` names what was published and what was
    not, by ``line_numbers`` (where each request came from; 1-based positions by default).

    ``acknowledge(jobs, None)`` is called once the batch is durable, with Ctrl-C held from
    the first move into ``pending/`` until it returns (:mod:`cortexfs.interrupts`): names
    that were published are then always acknowledged.  A batch published in part calls
    ``acknowledge(published, error)``, held the same way, before ``error`` is raised.  The
    writing before, however long, stays interruptible, and leaves nothing behind when
    interrupted.
    """
    names = list(names) if names is not None else [None] * len(batch)
    if len(names) != len(batch):
        raise invalid("publish_batch needs exactly one name (or None) per request")
    sources: list[bytes | None] = list(given) if given is not None else [None] * len(batch)
    if len(sources) != len(batch):
        raise invalid("publish_batch needs exactly one given source per request")
    numbers = list(line_numbers) if line_numbers is not None else list(range(1, len(batch) + 1))
    if len(numbers) != len(batch):
        raise invalid("publish_batch needs exactly one line number per request")
    jobs = [job_name(n) if n is not None else new_job_name() for n in names]
    if len(set(jobs)) != len(jobs):
        raise invalid("the batch names the same job twice")
    encoded, problems = [], []
    limit = queue.config.max_request_bytes
    for position, (request, source) in enumerate(zip(batch, sources, strict=True), start=1):
        try:
            encoded.append(requests.encode_request(request, limit, publisher, source))
        except CtxError as exc:
            problems.append(f"request {position}: {exc.message}")
    if problems:
        raise CtxError(errno.EINVAL, "batch refused, nothing published: " + "; ".join(problems))
    for job, given_name in zip(jobs, names, strict=True):
        if given_name is not None:  # as in publish
            refuse_known_job(queue, job)  # early and cheap; the check that counts comes below
    if not jobs:
        return []
    ops = queue.ops
    temps: list[str] = []
    # Data before names: one barrier for the whole batch where syncfs is one, else
    # each file synced as it is written (a FUSE mount of the root never sees a syncfs).
    group_commit = durable.syncfs_is_a_barrier(queue.inbox)
    write = durable.write_file_unsynced if group_commit else durable.write_file_synced
    ops.step("publish_batch.write")
    try:
        for start in range(0, len(jobs), _HELD_WRITES):
            # Held from each file's creation until it is listed for removal: a Ctrl-C landing
            # in between (creating a file can take a millisecond) would leave it behind.  Held
            # for a few files at a time, not for each (installing a handler costs more than
            # writing a small file) nor for the whole batch (which stays interruptible).
            with held_interrupts():
                for job, data in zip(
                    jobs[start : start + _HELD_WRITES],
                    encoded[start : start + _HELD_WRITES],
                    strict=True,
                ):
                    temp = queue.publish_temp_name(job)
                    try:
                        write(ops, queue.inbox, temp, data, group=queue.file_group)
                    except FileExistsError:
                        raise _publish_in_progress(queue, job, temp, batch=True) from None
                    except OSError as exc:
                        raise queue.refusal("publish", "inbox", exc, *NOTHING_PUBLISHED) from None
                    temps.append(temp)
        for job in jobs:  # holding every staging name (see publish)
            refuse_known_job(queue, job)
        if group_commit:
            try:
                durable.sync_filesystem(ops, queue.inbox, written=temps)
            except OSError as exc:
                raise queue.refusal("publish", "inbox", exc, *NOTHING_PUBLISHED) from None
    except BaseException:
        _discard_temps(queue, temps)
        raise
    with held_interrupts():
        ops.step("publish_batch.move")
        moves = [
            durable.Move(queue.inbox, t, queue.pending, j) for t, j in zip(temps, jobs, strict=True)
        ]
        before = pending_stamp(queue.pending)
        try:
            outcomes = durable.move_noreplace_batch(ops, moves)
        except OSError as exc:  # a barrier failed: what moved is not known to be durable
            found = [_moved_in(m.src_dir, m.src, m.dst_dir, m.dst) for m in moves]
            moved = [m.dst for m, there in zip(moves, found, strict=True) if there is True]
            pending_changed(queue, before, moved)
            with contextlib.suppress(OSError):  # the error to report is the first one
                _discard_temps(queue, [m.src for m in moves if m.dst not in moved])
            unread = [there for there in found if isinstance(there, OSError)]
            if unread:
                lines = [n for n, there in zip(numbers, found, strict=True) if there is not False]
                raise _not_known_where(
                    "publishing the jobs of batch",
                    _line_ranges(lines),
                    exc,
                    unread[0],
                    "they may be in pending/ and will then be claimed, so do not publish them "
                    "again under other names; once the queue can be read, 'ctx queue show "
                    "NAME' shows where each stands",
                ) from None
            if not moved:
                raise queue.refusal("publish", "pending", exc, *NOTHING_PUBLISHED) from None
            unsynced = _published_unsynced(moved, exc, jobs, numbers)
            if acknowledge is not None:
                acknowledge(moved, unsynced)
            raise unsynced from None
        failed = {job: o for job, o in zip(jobs, outcomes, strict=True) if o is not None}
        published = [job for job in jobs if job not in failed]
        pending_changed(queue, before, published)
        if failed:
            _discard_temps(queue, [m.src for m, o in zip(moves, outcomes, strict=True) if o])
            refusal = _batch_refusal(queue, jobs, numbers, failed)
            if not published:
                raise CtxError(refusal.errno, refusal.message)
            if acknowledge is not None:
                acknowledge(published, refusal)
            raise refusal
        ops.step("publish_batch.done")
        if acknowledge is not None:
            acknowledge(jobs, None)
    return jobs


def _batch_refusal(
    queue: Queue, jobs: Sequence[str], numbers: Sequence[int], failed: Mapping[str, OSError]
) -> PublishedInPart:
    """The error of a batch whose moves into ``pending/`` were refused for ``failed``: EEXIST
    for names that appeared there meanwhile, else what refused the others (ENOSPC…), saying
    which jobs were published, which requests were not, and how to publish only those."""
    published = [job for job in jobs if job not in failed]
    where = [number for job, number in zip(jobs, numbers, strict=True) if job in failed]
    action, (outcome, again) = "publish", NOTHING_PUBLISHED
    if published:
        action = "publish the whole batch"
        outcome = (
            f"published: {', '.join(published)} (pending, to be claimed: do not publish them "
            f"again); not published: {_line_ranges(where)}"
        )
        again = "publish those lines again, and only those"
    refused = [job for job, exc in failed.items() if not isinstance(exc, FileExistsError)]
    if refused:
        cause = queue.refusal(action, "pending", failed[refused[0]], outcome, again)
        return PublishedInPart(cause.errno, cause.message, published, list(failed), where)
    return PublishedInPart(
        errno.EEXIST,
        f"{', '.join(failed)} appeared while the batch was being published and were left "
        f"alone; {outcome}",
        published,
        list(failed),
        where,
    )


def _line_ranges(numbers: Sequence[int]) -> str:
    """``lines 3-5, 9`` for [3, 4, 5, 9]: which lines of a batch, as short as it can be said."""
    spans: list[list[int]] = []
    for number in numbers:
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    said = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in spans)
    return f"line{'s' if len(numbers) > 1 else ''} {said}"


def _moved_in(src_dir: int, src: str, dst_dir: int, dst: str) -> bool | OSError:
    """Whether a move that raised got as far as putting ``src`` at ``dst``: ``dst`` exists,
    and ``src`` is gone or is the same file (the link strategy stops between the two).

    The kernel's error when neither can be read: the filesystem failed as a whole (EIO, a
    FUSE mount that ended), and what the move did is not known, which callers say
    (:func:`_not_known_where`) rather than guess either way."""
    try:
        there = lstat_at(dst_dir, dst)
        if there is None:
            return False
        left = lstat_at(src_dir, src)
    except OSError as exc:
        return exc
    return left is None or left.st_ino == there.st_ino


def _not_known_where(action: str, job: str, exc: OSError, unread: OSError, then: str) -> CtxError:
    """The error of ``action`` on J failing where the queue cannot be read back to tell what
    the failed step did (:func:`_moved_in`): both of its outcomes, and ``then``, what settles
    either once the queue can be read again."""
    return CtxError(
        exc.errno or errno.EIO,
        f"{action} {job} failed ({_cause(exc)}) and the queue could not be read to tell where "
        f"{job} stands ({_cause(unread)}): {then}",
    )


def _published_unsynced(
    published: Sequence[str],
    exc: OSError,
    batch: Sequence[str] = (),
    numbers: Sequence[int] = (),
) -> PublishedInPart:
    """The error of a publish that failed after its no-replace move (a sync of pending/ or
    inbox/ reporting EIO): the job is pending and will run, so it must not be published
    again, as a bare EIO would invite (a retry under a made-up name runs it twice)."""
    names = ", ".join(published)
    one = len(published) == 1
    are, them = ("is", "it") if one else ("are", "them")
    show = f"'ctx queue show {names}' shows it" if one else "'ctx queue show NAME' shows each"
    unpublished = [job for job in batch if job not in published]
    where = [n for job, n in zip(batch, numbers, strict=True) if job not in published]
    rest = (
        f"; not published: {_line_ranges(where)}: publish those lines again, and only those"
        if unpublished
        else ""
    )
    return PublishedInPart(
        exc.errno or errno.EIO,
        f"{names} {are} in pending/ and will be claimed, but syncing the queue after the move "
        f"failed ({_cause(exc)}), so a crash may still lose {them}: do not publish {them} "
        f"again; {show}{rest}",
        published,
        unpublished,
        where,
    )


def _cause(exc: OSError) -> str:
    """``EIO: Input/output error``: what the kernel reported, for a message."""
    name = errno.errorcode.get(exc.errno or 0, "EIO")
    return f"{name}: {exc.strerror or exc}"


def _publish_in_progress(queue: Queue, job: str, temp: str, *, batch: bool = False) -> CtxError:
    """EEXIST for a publish of J whose staging name ``inbox/temp`` is taken, saying by what
    and what frees it."""
    refused = "batch refused, nothing published: " if batch else ""
    found = lstat_at(queue.inbox, temp)
    if found is not None and stat.S_ISDIR(found.st_mode):
        return exists(
            f"{refused}inbox/{temp}, the staging name of job {job}, is a directory; recover "
            "never removes one: remove it by hand to publish under this name"
        )
    if found is not None and not stat.S_ISREG(found.st_mode):
        return exists(
            f"{refused}inbox/{temp}, the staging name of job {job}, is a {kind_of(found)}, not "
            "a temp file; 'ctx queue recover --reconcile' removes it once the grace period "
            "has passed (it is never followed), or remove it by hand"
        )
    return exists(
        f"{refused}job {job} is being published by another process, or its publisher died "
        f"midway (inbox/{temp}; 'ctx queue recover --reconcile' removes it once the grace "
        "period has passed)"
    )


def refuse_known_job(queue: Queue, job: str) -> None:
    """EEXIST when J has evidence anywhere (Q-1).

    The states are checked in the direction jobs move (pending → claimed → terminal), so a
    job advancing while we look is still seen in the state it moves into.
    """
    live = ((queue.pending, "pending"), (queue.claimed, "claimed"), (queue.lease, "leased"))
    states = [state for dir_fd, state in live if lstat_at(dir_fd, job) is not None]
    states += [state for state, _ in _terminal_evidence(queue, job)]
    if states:
        raise exists(f"job {job} is already {states[0]}; publish under another name")


# --------------------------------------------------------------------------- claim, lease


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
    tried: set[str] = set()
    for job in candidates(queue):
        # A name the claim order offers again (another process put it back meanwhile, or
        # our own refusal did) was settled for this call already.
        if job in tried:
            continue
        tried.add(job)
        if accepts is not None and not _accepted(queue, job, accepts):
            continue
        won = claim_job(queue, job, holder, ttl, left_pending)
        if won is not None:
            return won
    if left_pending:
        # Passed over in a race that is settled by now (another claimer won J) is no reason
        # to give: only what is still pending is kept.
        kept = still_pending(queue, left_pending)
        left_pending.clear()
        left_pending.update(kept)
    return None


def still_pending(queue: Queue, left_pending: Mapping[str, str]) -> dict[str, str]:
    """The jobs of ``left_pending`` (see :func:`claim`) still in ``pending/``, with their reason."""
    return {
        job: why for job, why in left_pending.items() if _is_regular(lstat_at(queue.pending, job))
    }


# Why a pending job was passed over by a claim (``left_pending``): each is also a race that a
# concurrent claimer or recover may be settling at that moment.
UNREADABLE = "unreadable"  # this uid may not read its request
CLAIM_LEFT = "claimed"  # claimed/J is there already: a claim in progress, or a crash's leftover
LEASE_LEFT = "leased"  # lease/J is there without a claim: an earlier crash's leftover
FINISHED = "finished"  # J is in done/ or failed/ too: a conflict
LEFT_PENDING = (UNREADABLE, CLAIM_LEFT, LEASE_LEFT, FINISHED)


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
    if not _is_regular(lstat_at(queue.pending, job)):
        return None
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
        return None  # recover took our empty claim directory for a crash's leftover: lost
    except OSError as exc:  # EMFILE…: J stays pending, claimable, with no claim evidence
        refusal = queue.refusal("claim", "claimed", exc, *_nothing_claimed(job))
        _abandon_claim_dir(queue, job, refusal)
        raise refusal from None
    try:
        # Held until the lease is durable: recover must not mistake our half-done claim
        # (a request in claimed/J and no lease yet) for the leftovers of a crash.
        try:
            _lock_job(claim_fd, job)
        except CtxError as refusal:
            if _still_linked(queue.claimed, job, claim_fd):  # not another claimer's by now
                _abandon_claim_dir(queue, job, refusal)
            raise
        if not _still_linked(queue.claimed, job, claim_fd):
            # recover removed our empty claim directory before we locked it: we lost.
            return None
        try:
            # Before the request moves in: whoever recovers or finishes the job may be another
            # member of the queue's group, and must be able to move it out again.
            durable.grant_group_access(ops, claim_fd, queue.group_access)
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
        if _terminal_evidence(queue, job):
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
            moved = _moved_in(queue.pending, job, claim_fd, job)
            if isinstance(moved, OSError):
                raise _not_known_where(
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
                    f"failed ({_cause(exc)}): it has no lease and never ran; 'ctx queue "
                    "recover --reconcile' returns it to pending",
                ) from None
            refusal = queue.refusal("claim", "pending", exc, *_nothing_claimed(job))
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
            f"could not be read to tell: {_cause(unread)})"
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
        f"{first}undoing the claim of {job} was refused{too} ({_cause(exc)}): {where}; "
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
        if not durable.make_dir_synced(ops, queue.lease, job, 0o775):
            raise CtxError(
                errno.EEXIST, f"lease/{job} appeared during the claim; run 'ctx queue recover'"
            )
        lease_fd = queue.open_job_dir("lease", job)
        try:
            durable.grant_group_access(ops, lease_fd, queue.group_access)  # as for claimed/J
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


def _discard_temp_if_it_may_be(queue: Queue, temp: str) -> None:
    """Remove a temp file of a step that failed, unless the kernel refuses that too: the
    step's own error is the one to tell, and 'recover --reconcile' removes a stale temp."""
    with contextlib.suppress(OSError):
        _discard_temp(queue, temp)


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


# --------------------------------------------------------------------------------- renew


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


class NotHeld(CtxError):
    """A renewal or finish refused because J is not the caller's (any more): another holder
    leases it (EACCES), it is not claimed or claimed without a lease (ENOENT), or it is
    finished already (EEXIST).  The kernel gives the same errnos for what a host refuses (a
    directory's mode, a file gone), which say nothing of who holds J: a worker reports a job
    refused this way as taken away and goes on, and stops for the others."""


def renew(queue: Queue, job: str, callers: Sequence[Holder], ttl: float | None = None) -> Lease:
    """Extend the caller's own lease on J (Q-3) to ``ttl`` seconds from now; EACCES when
    someone else holds it.  ``callers`` are the processes the caller may be, the first named
    in a refusal: a command run from a shell leases for the shell, and may be the shell's own
    process, which ``bash -c 'a && b'`` execs ``b`` in.

    Without ``ttl``, for as long again as the lease was taken or last renewed for (a claim
    with ``--ttl 1000`` renews for 1000 s, not for the queue's default), so that a renewal
    never shortens it; the queue's ``lease_ttl`` when that period is not a usable lifetime
    (a lease written by hand).  Done under ``claimed/J``'s lock, which recover takes before
    it requeues J: a renewal either lands before recover looks at the lease, or finds J no
    longer claimed (ENOENT) and never writes a lease for a job that went back to pending.
    """
    job = job_name(job)
    if ttl is not None:
        ttl = check_ttl(ttl)
    with _locked_claim(queue, job, _no_lease_to_renew):
        try:
            current = read_lease(queue, job)
        except NotADirectoryOfTheJob:
            raise
        except CtxError as exc:
            if exc.errno == errno.ENOENT:
                raise _claimed_without_lease(job) from None
            raise _not_a_lease(job, exc, "renew") from None
        _refuse_other_holder(job, current, callers, "renews its lease")
        if ttl is None:
            usable = 0 < current.period <= MAX_LEASE_TTL
            ttl = check_ttl(current.period if usable else queue.config.lease_ttl)
        renewed = current.renewed(ttl)
        ops = queue.ops
        temp = queue.temp_name(job, "renew")
        expires = current.to_json()["expires_at"]
        outcome = (f"the lease on {job} is unchanged (it expires at {expires})", "renew it again")
        try:
            lease_fd = queue.open_held_job_dir("lease", job)
        except OSError as exc:
            raise queue.refusal("renew a lease", f"lease/{job}", exc, *outcome) from None
        try:
            ops.step("renew.write")
            try:
                durable.write_file_synced(
                    ops, queue.inbox, temp, renewed.encode(), group=queue.file_group
                )
            except OSError as exc:
                raise queue.refusal("renew a lease", "inbox", exc, *outcome) from None
            ops.step("renew.replace")
            try:
                durable.replace_synced(ops, queue.inbox, temp, lease_fd, LEASE_FILE)
            except OSError as exc:
                if lstat_at(queue.inbox, temp) is None:  # replaced; a sync after it failed
                    outcome = (
                        f"the lease on {job} was renewed until {renewed.to_json()['expires_at']}"
                        f", but a crash may still bring back the old one (expiring at {expires})",
                        "renew it again",
                    )
                else:
                    _discard_temp(queue, temp)
                raise queue.refusal("renew a lease", f"lease/{job}", exc, *outcome) from None
        finally:
            ops.close(lease_fd)
        return renewed


def _claimed_without_lease(job: str) -> CtxError:
    """ENOENT for J claimed (under its lock) with no lease: the claim never completed, so the
    job never ran (Q-3), and recover --reconcile sends it back to pending (Q-6)."""
    return NotHeld(
        errno.ENOENT,
        f"job {job} has no lease/{job}/{LEASE_FILE}: its claim never completed, so it "
        "never ran; 'ctx queue recover --reconcile' returns it to pending",
    )


def _not_a_lease(job: str, lease: CtxError, verb: str) -> CtxError:
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
    where = _not_claimed(queue, job, "renewing its lease").message
    return NotHeld(errno.ENOENT, f"there is no lease to renew: {where}")


def _refuse_other_holder(job: str, lease: Lease, callers: Sequence[Holder], verb: str) -> None:
    """EACCES unless one of ``callers`` is the process ``lease`` names."""
    if not any(lease.holder.is_same_process(caller) for caller in callers):
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


# -------------------------------------------------------------------------------- finish


def finish(
    queue: Queue,
    job: str,
    ok: bool,
    output: Any = None,
    *,
    worker: Mapping[str, Any] | None = None,
    started: float | None = None,
    extra: Mapping[str, Any] | None = None,
    holder: Holder | None = None,
    enforce_limit: bool = True,
) -> dict[str, Any]:
    """Finish a claimed job in ``done/`` (ok) or ``failed/`` (Q-4); returns the result.

    Success is reported only once the terminal pair is durable and the claim is cleaned up.
    EEXIST when J is already finished, ENOENT when it is not claimed, EFBIG when the result
    is larger than ``max_result_bytes``, EACCES or EROFS when a directory it would change
    cannot be written (checked before the first step).  Nothing is written on refusal.

    ENOENT too when J is claimed without a lease: its claim never completed, so it never ran
    (Q-3); the lease's own error (ELOOP, EINVAL…) when what is there is not a lease (a
    conflict).  ``worker`` is who did the work, as the result records it; by default the
    lease's holder.

    ``holder``: finish only if this process still holds J's lease, EACCES otherwise.  A
    worker passes itself: once its lease expired and recover requeued J (Q-5), J may be
    claimed again by another worker, and the stale holder must not finish (or clean up)
    the new holder's claim.  ``enforce_limit=False`` is for the small failure record that
    replaces a result refused for its size: a job is never left claimed for want of room
    to say why it failed.
    """
    job = job_name(job)
    ops = queue.ops
    with _locked_claim(queue, job, _not_claimed) as claim_fd:
        lease: Lease | CtxError
        try:
            lease = read_lease(queue, job)
        except NotADirectoryOfTheJob:
            raise
        except CtxError as exc:
            lease = exc
        if holder is not None:
            if isinstance(lease, CtxError):
                raise NotHeld(
                    errno.EACCES, f"job {job} is not leased to pid {holder.pid}: {lease.message}"
                )
            _refuse_other_holder(job, lease, [holder], "finishes the job")
        terminal = queue.terminal(ok)
        state = "done" if ok else "failed"
        finished = _terminal_evidence(queue, job)
        own = None
        if finished and isinstance(lease, Lease):
            # This claim's own finish, cut short after its result moved in
            # (_finish_cut_short)?  Finishing it again with the same outcome completes it, as
            # recover --reconcile would once its holder is gone; the result in place stands.
            by = lease.holder.summary() if worker is None else worker
            own = _own_result(queue, job, lease, by)
            if own is not None and own[0] == state and own[1].get("output") == output:
                return _complete_finish(queue, job, lease, claim_fd, state, own[1])
        if finished:
            # A second outcome beside the first would make J a conflict.
            raise _finished_already(queue, job, lease, own)
        if isinstance(lease, CtxError) and lease.errno == errno.ENOENT:
            raise _claimed_without_lease(job)
        if isinstance(lease, CtxError):
            # A symlink, FIFO or unreadable file where the lease belongs is a conflict
            # (status reports it): removing it with the claim would resolve it behind the
            # operator's back, and the holder it should name is unknown.
            raise _not_a_lease(job, lease, "finish")
        started = lease.claimed_at if started is None else started
        worker = lease.holder.summary() if worker is None else worker
        result: dict[str, Any] = {
            **(extra or {}),
            "status": "ok" if ok else "error",
            "output": output,
            "worker": dict(worker) if worker is not None else None,
            "started": rfc3339(started) if started is not None else None,
            "finished": rfc3339(),
        }
        limit = queue.config.max_result_bytes if enforce_limit else None
        data = requests.encode_result(result, limit)
        # Every directory the finish changes, before the result is written: refused after
        # the result moved in, the request would stay claimed beside it.
        try:
            queue.require_writable(
                "finish", ("inbox", state, "claimed", f"claimed/{job}", "lease", f"lease/{job}")
            )
        except CtxError as exc:
            raise CtxError(exc.errno, f"{exc.message}; {_still_claimed(job)[0]}") from None
        temp = queue.temp_name(job, "result")
        ops.step("finish.write")
        try:
            durable.write_file_synced(ops, queue.inbox, temp, data, group=queue.file_group)
        except OSError as exc:
            raise queue.refusal("finish", "inbox", exc, *_still_claimed(job)) from None
        ops.step("finish.result")
        try:
            durable.move_noreplace(ops, queue.inbox, temp, terminal, job + RESULT_SUFFIX)
        except FileExistsError:
            _discard_temp(queue, temp)
            raise _finished_already(queue, job, lease) from None
        except OSError as exc:
            moved = _moved_in(queue.inbox, temp, terminal, job + RESULT_SUFFIX)
            if isinstance(moved, OSError):
                raise _not_known_where(
                    "finishing",
                    job,
                    exc,
                    moved,
                    f"it stays claimed, and its result may be in {state}/ already; do not run "
                    "it again: once the queue can be read, finishing it again with the same "
                    "outcome completes it, or 'ctx queue recover --reconcile' does once its "
                    "holder is gone",
                ) from None
            if moved:
                raise _finish_cut_short(queue, job, lease, exc) from None
            _discard_temp(queue, temp)
            raise queue.refusal("finish", state, exc, *_still_claimed(job)) from None
        _move_request_and_clean_up(queue, job, lease, claim_fd, terminal)
        return result


def _move_request_and_clean_up(
    queue: Queue, job: str, lease: Lease | CtxError, claim_fd: int, terminal: int
) -> None:
    """What a finish does once J's result is in place (Q-4): the request moves beside it and
    the claim and lease go.  A failure from here on cannot be undone, only said."""
    ops = queue.ops
    try:
        ops.step("finish.request")
        durable.move_noreplace(ops, claim_fd, job, terminal, job)
        ops.step("finish.cleanup")
        remove_claim_and_lease(queue, job)
    except OSError as exc:
        raise _finish_cut_short(queue, job, lease, exc) from None
    ops.step("finish.done")


def _own_result(
    queue: Queue, job: str, lease: Lease, worker: Mapping[str, Any]
) -> tuple[str, dict[str, Any]] | None:
    """The state (``done``, ``failed``) and content of J's result in place, when J is the
    incomplete pair recover would roll forward and the result is this claim's, recorded by
    ``worker`` (a finish records the lease's holder); None otherwise, with nothing changed —
    a result of anyone else's, one that cannot be read, or a conflict (J pending too…),
    which nothing resolves automatically (Q-6).

    A result that names another worker is never taken for this claim's, even one an older
    release's shell finish wrote (it named the finishing shell, not the holder): where flock
    does not work (some NFS setups), that other finisher may still be moving J, and only
    the worker it recorded keeps two finishers from both completing J (Q-4).  recover
    --reconcile completes such a finish once the holder is gone."""
    if ev.assess(ev.evidence_of(queue, job)).repair != ev.ROLL_FORWARD:
        return None
    state = "done" if lstat_at(queue.done, job + RESULT_SUFFIX) else "failed"
    try:
        limit = requests.stored_result_limit(queue.config.max_result_bytes)
        data = read_regular_file(queue.dirs[state], job + RESULT_SUFFIX, limit)
        recorded = jsontext.loads_strict(data)
    except (OSError, CtxError, ValueError):
        return None
    if not isinstance(recorded, dict) or recorded.get("worker") != dict(worker):
        return None
    return state, recorded


def _complete_finish(
    queue: Queue, job: str, lease: Lease, claim_fd: int, state: str, recorded: dict[str, Any]
) -> dict[str, Any]:
    """The rest of a finish cut short once ``<state>/J.result`` (``recorded``, this claim's,
    with the outcome and output asked for again) was in place: the request moves beside it
    and the claim goes, as in :func:`finish`, and the result is returned.  J's lock is held."""
    queue.require_writable("finish", (state, "claimed", f"claimed/{job}", "lease", f"lease/{job}"))
    _move_request_and_clean_up(queue, job, lease, claim_fd, queue.dirs[state])
    return recorded


@contextlib.contextmanager
def _locked_claim(
    queue: Queue, job: str, not_claimed: Callable[[Queue, str], CtxError]
) -> Iterator[int]:
    """``claimed/J`` opened and locked (recover takes the same lock before it requeues J), J's
    request checked to be in it; ``not_claimed(queue, job)`` is the error when it is not."""
    try:
        claim_fd = queue.open_held_job_dir("claimed", job)
    except FileNotFoundError:
        raise not_claimed(queue, job) from None
    try:
        _lock_job(claim_fd, job)
        request = lstat_at(claim_fd, job)
        if request is None:
            raise not_claimed(queue, job)
        if not _is_regular(request):
            raise _not_a_request(job, kind_of(request))
        yield claim_fd
    finally:
        queue.ops.close(claim_fd)


# How long a transition waits for J's lock.  Its holders keep it for one transition of J (a
# claimer until its lease is durable, a finisher, recover), a few fsyncs; but whoever may open
# claimed/J may lock it, any member of the queue's group, so a hold far longer is a process
# stuck or hostile: named in the error rather than waited for forever.
LOCK_WAIT_SECONDS = 30.0


def _lock_job(claim_fd: int, job: str) -> None:
    """J's lock (``claimed/J``), waited for at most :data:`LOCK_WAIT_SECONDS`; EAGAIN, naming
    the processes that hold it, after that."""
    if not lock_dir(claim_fd, within=LOCK_WAIT_SECONDS):
        holders = ", ".join(str(pid) for pid in _flock_holders(claim_fd)) or "unknown"
        raise CtxError(
            errno.EAGAIN,
            f"claimed/{job} has been locked by another process (pid {holders}) for "
            f"{LOCK_WAIT_SECONDS:g} s, where a claim, finish or recover holds it for a "
            "moment: that process is stuck, or not a queue command; end it, then try again",
        )


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


def _not_claimed(queue: Queue, job: str, doing: str = "finishing it") -> CtxError:
    """EEXIST or ENOENT for J found unclaimed by a transition of a claim (``doing``, what
    the caller was about to do), saying where J is instead."""
    for dir_fd, state in ((queue.done, "done"), (queue.failed, "failed")):
        if lstat_at(dir_fd, job) is not None:
            return NotHeld(
                errno.EEXIST,
                f"job {job} is already {state}; 'ctx queue show {job}' shows its result",
            )
    if lstat_at(queue.pending, job) is not None:
        return NotHeld(errno.ENOENT, f"job {job} is pending, not claimed; claim it before {doing}")
    return NotHeld(
        errno.ENOENT,
        f"job {job} is not claimed, nor pending, done or failed: queue {queue.path} has no such "
        "job (is it the queue the job was claimed from?); 'ctx queue list' lists the jobs it has",
    )


def _nothing_claimed(job: str) -> tuple[str, str]:
    """What a claim of J refused midway did (:meth:`Queue.refusal`): it was undone."""
    return f"nothing was claimed (job {job} stays pending)", "claim again"


def _still_claimed(job: str) -> tuple[str, str]:
    """What a finish of J refused before its result was in place did: nothing."""
    return f"job {job} stays claimed and no result of it was written", "finish it again"


def _finish_cut_short(queue: Queue, job: str, lease: Lease | CtxError, exc: OSError) -> CtxError:
    """The error of a finish that failed after its result was in place (an I/O error, a full
    disk): it cannot be undone, so the error says where J stands and what completes it,
    instead of a bare EIO."""
    try:
        assessment = ev.assess(ev.evidence_of(queue, job))
    except OSError as unread:
        return _not_known_where(
            "finishing",
            job,
            exc,
            unread,
            "its result is in place, so do not run it again: once the queue can be read, "
            f"'ctx queue show {job}' shows what is left, and finishing it again with the same "
            "outcome or 'ctx queue recover --reconcile' completes it",
        )
    where = f"job {job} is {assessment.state} ({assessment.detail})"
    if assessment.state != "incomplete":
        then = f"'ctx queue show {job}' shows it"
    elif isinstance(lease, Lease):
        again = (
            "finishing it again with the same outcome completes it now (the result in place "
            "stands), or "
            if assessment.repair == ev.ROLL_FORWARD
            else ""
        )
        then = f"{again}'ctx queue recover --reconcile' completes it {once_gone(lease)}"
    else:
        then = "'ctx queue recover --reconcile' completes it"
    return CtxError(
        exc.errno or errno.EIO,
        f"finishing {job} failed after its result was in place ({_cause(exc)}), so a crash "
        f"may still undo part of it: {where}; {then}",
    )


def _finished_already(
    queue: Queue,
    job: str,
    lease: Lease | CtxError,
    own: tuple[str, Mapping[str, Any]] | None = None,
) -> CtxError:
    """EEXIST for a finish that finds terminal evidence of J, saying what is there and who
    completes it: ``recover --reconcile``, for what an interrupted finish leaves (a result
    beside the claimed request), and when it will (a live holder's job it leaves alone until
    the holder is gone: said, or the user goes from finish to recover and back); or a second
    finish with the outcome of ``own``, this claim's result in place (:func:`_own_result`),
    now; a person, for a conflict, which recover never resolves (a result that is a FIFO or
    a directory, a request in done/ without its result...)."""
    finished_in, name = _terminal_evidence(queue, job)[0]
    found = lstat_at(queue.dirs[finished_in], name)
    what = f"{finished_in}/{name} already exists"
    if found is not None and not stat.S_ISREG(found.st_mode):
        what += f" and is a {kind_of(found)}, not a regular file"
    evidence = ev.evidence_of(queue, job)
    assessment = ev.assess(evidence)
    if assessment.repair in (ev.ROLL_FORWARD, ev.DROP_CLAIM_COPY):
        interrupted = f"{what}: an earlier finish of {job} was interrupted"
        if assessment.repair == ev.ROLL_FORWARD:
            interrupted += (
                f" after its result was in place, and that result stands ('ctx queue show {job}' "
                "shows it)"
            )
        again = ""
        if own is not None:
            again = (
                f"finishing it again in {own[0]}/ with the output recorded there completes it "
                "now, or "
            )
        if not isinstance(lease, Lease):
            then = f"{again}'ctx queue recover --reconcile' completes it now"
        elif (verdict := judge(lease)).gone:
            then = f"{again}'ctx queue recover --reconcile' completes it now ({verdict.reason})"
        else:
            then = (
                f"{again}'ctx queue recover --reconcile' completes it {once_gone(lease)}; until "
                "then it leaves the job alone"
            )
        return NotHeld(errno.EEXIST, f"{interrupted}; {then}; nothing was changed")
    return NotHeld(
        errno.EEXIST,
        f"{what}: job {job} is a conflict ({assessment.detail}; evidence: "
        f"{', '.join(evidence.paths())}), which recover never resolves; a person must look "
        f"at it ('ctx queue show {job}') and repair it by hand; nothing was changed",
    )


# ------------------------------------------------------------------------------ helpers


def _terminal_evidence(queue: Queue, job: str) -> list[tuple[str, str]]:
    """What of J is in ``done/`` or ``failed/`` (its result, then its request): (state, name)."""
    return [
        (state, name)
        for state, dir_fd in (("done", queue.done), ("failed", queue.failed))
        for name in (job + RESULT_SUFFIX, job)
        if lstat_at(dir_fd, name) is not None
    ]


def _is_regular(st: os.stat_result | None) -> bool:
    return st is not None and stat.S_ISREG(st.st_mode)


def _still_linked(parent_fd: int, name: str, fd: int) -> bool:
    """Whether ``parent/name`` is still the directory we hold open as ``fd``."""
    st = lstat_at(parent_fd, name)
    return st is not None and st.st_ino == os.fstat(fd).st_ino


def _discard_temp(queue: Queue, temp: str) -> None:
    _discard_temps(queue, [temp])


def _discard_temps(queue: Queue, temps: Sequence[str]) -> None:
    durable.remove_entries(queue.ops, [(queue.inbox, t, False) for t in temps])
    durable.sync_dir(queue.ops, queue.inbox)
