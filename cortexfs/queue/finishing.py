"""Finish (SPEC Q-4): the result first, then the request beside it, then the claim and lease
go; and what a finish cut short after its result was in place says and completes.  The step
order is in :mod:`cortexfs.queue.protocol`.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from typing import Any

from cortexfs import durable
from cortexfs.errors import CtxError, errno_text
from cortexfs.names import job_name
from cortexfs.queue import evidence as ev
from cortexfs.queue import requests
from cortexfs.queue.holder import Holder, Lease, judge, once_gone
from cortexfs.queue.layout import (
    LEASE_FILE,
    RESULT_SUFFIX,
    NotADirectoryOfTheJob,
    Queue,
    kind_of,
    lstat_at,
    read_regular_file,
)
from cortexfs.queue.leasing import (
    NotHeld,
    claimed_without_lease,
    lease_not_readable,
    not_a_lease,
    not_claimed,
    read_lease,
    refuse_other_holder,
)
from cortexfs.queue.transition import (
    discard_temp,
    locked_claim,
    moved_in,
    not_known_where,
    remove_claim_and_lease,
    terminal_evidence,
)
from cortexfs.timefmt import rfc3339


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
    claimed_at: float | None = None,
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
    the new holder's claim; ``claimed_at``, with ``holder``, finishes only the claim made
    then, not a later claim of J by the same process.  ``enforce_limit=False`` is for the
    small failure record that replaces a result refused for its size: a job is never left
    claimed for want of room to say why it failed.
    """
    job = job_name(job)
    ops = queue.ops
    with locked_claim(queue, job, not_claimed) as claim_fd:
        lease: Lease | CtxError
        try:
            lease = read_lease(queue, job)
        except NotADirectoryOfTheJob:
            raise
        except PermissionError:
            raise lease_not_readable(queue, job, f"finish {job}") from None
        except CtxError as exc:
            lease = exc
        if holder is not None:
            if isinstance(lease, CtxError):
                raise NotHeld(
                    errno.EACCES, f"job {job} is not leased to pid {holder.pid}: {lease.message}"
                )
            refuse_other_holder(job, lease, [holder], "finishes the job", claimed_at)
        terminal = queue.terminal(ok)
        state = "done" if ok else "failed"
        finished = terminal_evidence(queue, job)
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
            raise claimed_without_lease(job)
        if isinstance(lease, CtxError):
            # A symlink, FIFO or unreadable file where the lease belongs is a conflict
            # (status reports it): removing it with the claim would resolve it behind the
            # operator's back, and the holder it should name is unknown.
            raise not_a_lease(job, lease, "finish")
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
            queue.require_changeable("finish", _moved_or_removed(job))
            _require_nothing_else(queue, job, claim_fd)
        except CtxError as exc:
            raise exc.then(_still_claimed(job)[0]) from None
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
            discard_temp(queue, temp)
            raise _finished_already(queue, job, lease) from None
        except OSError as exc:
            moved = moved_in(queue.inbox, temp, terminal, job + RESULT_SUFFIX)
            if isinstance(moved, OSError):
                raise not_known_where(
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
            discard_temp(queue, temp)
            raise queue.refusal("finish", state, exc, *_still_claimed(job)) from None
        _move_request_and_clean_up(queue, job, lease, claim_fd, terminal)
        return result


def _moved_or_removed(job: str) -> tuple[str, str]:
    """The files a finish moves (the request) and removes (the lease) once its result is in
    place: an attribute that pins either must refuse the finish before that."""
    return f"claimed/{job}/{job}", f"lease/{job}/{LEASE_FILE}"


def _require_nothing_else(queue: Queue, job: str, claim_fd: int) -> None:
    """ENOTEMPTY when ``claimed/J`` or ``lease/J`` holds more than J's own file (one written
    there by hand, or by a command run in it): a finish removes both once its result is in
    place, and an ``rmdir`` refused then would leave J finished in part, a conflict."""
    try:
        lease_fd = queue.open_job_dir("lease", job)
    except OSError:
        lease_fd = None  # no lease directory: finish refuses for that on its own
    try:
        for place, dir_fd, own in (("claimed", claim_fd, job), ("lease", lease_fd, LEASE_FILE)):
            others = [] if dir_fd is None else sorted(set(os.listdir(dir_fd)) - {own})
            if others:
                them = "it" if len(others) == 1 else "them"
                raise CtxError(
                    errno.ENOTEMPTY,
                    f"{place}/{job} holds {', '.join(others[:5])} besides {own}: finish would "
                    f"move J's request and result, then fail to remove {place}/{job}; move "
                    f"{them} out of the queue, then finish again",
                )
    finally:
        if lease_fd is not None:
            queue.ops.close(lease_fd)


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
        recorded = requests.decode_result(data)
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
    queue.require_changeable("finish", _moved_or_removed(job))
    _require_nothing_else(queue, job, claim_fd)
    _move_request_and_clean_up(queue, job, lease, claim_fd, queue.dirs[state])
    return recorded


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
        return not_known_where(
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
        f"finishing {job} failed after its result was in place ({errno_text(exc)}), so a crash "
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
    finished_in, name = terminal_evidence(queue, job)[0]
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
