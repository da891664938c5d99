"""Publish (SPEC Q-1): a request becomes ``pending/J``, one at a time or many in one group
commit (:func:`publish_batch`).  The step order, and why it survives a crash, is in
:mod:`cortexfs.queue.protocol`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cortexfs import durable
from cortexfs.errors import CtxError, errno_text, exists, invalid
from cortexfs.interrupts import held_interrupts
from cortexfs.names import job_name
from cortexfs.queue import evidence as ev
from cortexfs.queue import requests
from cortexfs.queue.claim_order import pending_changed, pending_stamp
from cortexfs.queue.layout import Queue, kind_of, lstat_at
from cortexfs.queue.transition import (
    discard_temp,
    discard_temps,
    moved_in,
    not_known_where,
    terminal_evidence,
)


def new_job_name() -> str:
    """A fresh job name that sorts by publish time: ``job-<UTC time>-<random>.req.json``."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return f"job-{stamp}-{os.urandom(5).hex()}.req.json"


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
    queue.require_unpinned("publish", ("inbox",), NOTHING_PUBLISHED[0])
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
        discard_temp(queue, temp)
        raise
    ops.step("publish.move")
    before = pending_stamp(queue.pending)
    try:
        durable.move_noreplace(ops, queue.inbox, temp, queue.pending, job)
    except FileExistsError:
        discard_temp(queue, temp)
        raise exists(f"job {job} is already pending; publish under another name") from None
    except OSError as exc:
        moved = moved_in(queue.inbox, temp, queue.pending, job)
        if isinstance(moved, OSError):
            raise not_known_where(
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
        if exc.errno == errno.ENOENT and lstat_at(queue.inbox, temp) is None:
            raise _staging_removed([temp], "nothing was published; publish again") from None
        discard_temp(queue, temp)
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
    listing each bad entry by its 1-based position, or its line with ``line_numbers``) and
    nothing is written.  A crash during
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
    # A bad entry is named where it came from: a line of the caller's input, as its syntax
    # errors were, else its position in the batch.
    label = "request" if line_numbers is None else "line"
    for number, request, source in zip(numbers, batch, sources, strict=True):
        try:
            encoded.append(requests.encode_request(request, limit, publisher, source))
        except CtxError as exc:
            if len(problems) == requests.MAX_BAD_LINES_SAID:  # a message of a few lines
                problems.append(f"and more from {label} {number} on")
                break
            problems.append(f"{label} {number}: {exc.message}")
    if problems:
        raise CtxError(errno.EINVAL, "batch refused, nothing published: " + "; ".join(problems))
    for job, given_name in zip(jobs, names, strict=True):
        if given_name is not None:  # as in publish
            refuse_known_job(queue, job)  # early and cheap; the check that counts comes below
    if not jobs:
        return []
    ops = queue.ops
    queue.require_unpinned("publish", ("inbox",), NOTHING_PUBLISHED[0])
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
        discard_temps(queue, temps)
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
            found = [moved_in(m.src_dir, m.src, m.dst_dir, m.dst) for m in moves]
            moved = [m.dst for m, there in zip(moves, found, strict=True) if there is True]
            pending_changed(queue, before, moved)
            with contextlib.suppress(OSError):  # the error to report is the first one
                discard_temps(queue, [m.src for m in moves if m.dst not in moved])
            unread = [there for there in found if isinstance(there, OSError)]
            if unread:
                lines = [n for n, there in zip(numbers, found, strict=True) if there is not False]
                raise not_known_where(
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
            removed = [
                m.src
                for m, o in zip(moves, outcomes, strict=True)
                if isinstance(o, FileNotFoundError) and lstat_at(m.src_dir, m.src) is None
            ]
            discard_temps(queue, [m.src for m, o in zip(moves, outcomes, strict=True) if o])
            refusal = _batch_refusal(queue, jobs, numbers, failed, removed)
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
    queue: Queue,
    jobs: Sequence[str],
    numbers: Sequence[int],
    failed: Mapping[str, OSError],
    removed: Sequence[str] = (),
) -> PublishedInPart:
    """The error of a batch whose moves into ``pending/`` were refused for ``failed``: EEXIST
    for names that appeared there meanwhile, ENOENT for staging files ``removed`` meanwhile,
    else what refused the others (ENOSPC…), saying which jobs were published, which requests
    were not, and how to publish only those."""
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
    if removed:
        cause = _staging_removed(removed, f"{outcome}; {again}")
        return PublishedInPart(cause.errno, cause.message, published, list(failed), where)
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


def _staging_removed(temps: Sequence[str], outcome: str) -> CtxError:
    """ENOENT for a publish whose staging files in ``inbox/`` were removed before they could
    move to ``pending/``: 'recover --reconcile' removes temp files older than its grace, and a
    publish stopped (or stalled) that long finds its own gone.  ``pending/`` refused nothing,
    and a message that named it would send the user to look for a fault there."""
    named = ", ".join(f"inbox/{temp}" for temp in temps[:3]) + (", …" if len(temps) > 3 else "")
    return CtxError(
        errno.ENOENT,
        f"the staging file{'s' if len(temps) > 1 else ''} {named} of this publish "
        f"{'were' if len(temps) > 1 else 'was'} removed before moving to pending/ (by 'ctx "
        "queue recover --reconcile', which removes temp files older than its grace, or by "
        f"hand, while this publish was stopped or stalled): {outcome}",
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
        f"failed ({errno_text(exc)}), so a crash may still lose {them}: do not publish {them} "
        f"again; {show}{rest}",
        published,
        unpublished,
        where,
    )


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
    states += [state for state, _ in terminal_evidence(queue, job)]
    if states and (entries := ev.no_job_but(queue, job)):
        raise exists(
            f"{ev.no_job_here(queue, job, entries)}: move {'it' if len(entries) == 1 else 'them'} "
            "aside, or publish under another name"
        )
    if states == ["claimed"] and _empty_claim(queue, job):
        raise exists(
            f"job {job} has an empty claimed/{job}: a claim in progress, or one cut short before "
            "its request moved in, whose request is nowhere; 'ctx queue recover --reconcile' "
            "removes it once no claim holds it, or publish under another name"
        )
    terminal = [state for state in states if state in ("done", "failed")]
    if terminal and terminal != states:
        # It ran: a claim or lease left beside its result is a finish cut short in its
        # clean-up (or at work), which status and show name so, never a job still claimed.
        raise exists(
            f"job {job} is already {terminal[0]}, with a leftover claimed/{job} or lease/{job} "
            "that 'ctx queue recover --reconcile' removes; publish under another name"
        )
    if states:
        raise exists(f"job {job} is already {states[0]}; publish under another name")


def _empty_claim(queue: Queue, job: str) -> bool:
    """Whether ``claimed/J`` is a directory with nothing in it (never followed)."""
    try:
        fd = os.open(job, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=queue.claimed)
    except OSError:
        return False
    try:
        return not os.listdir(fd)
    finally:
        os.close(fd)
