"""``ctx queue recover``: put abandoned work back, explicitly (SPEC Q-5, Q-6, I-5).

Plain ``recover`` does one thing: a job that is claimed *and* leased, whose lease holder is
provably gone (:func:`cortexfs.queue.holder.judge`), goes back to ``pending/``.  Everything
else it only reports.  ``recover --reconcile`` also completes the incomplete pairs a crash can
leave, each with the one transition that can neither lose nor duplicate work:

    leftover                                   transition
    ----------------------------------------   ------------------------------------------
    claimed/J/J, no lease                       back to pending (execution never started, Q-3)
    a result, request still in claimed/J/       roll forward to the terminal pair (the job ran)
    claimed/J/J a second link of pending/J      drop the claim link (a move was interrupted)
      or of done|failed/J
    an empty claimed/J, a lease with no         removed
      request in claimed/
    inbox temp files older than the grace       removed

Conflicts (two results, pending and done at once, …) are reported with every piece of
evidence and never resolved automatically.  Neither mode touches a job whose lease holder is
alive (or cannot be judged from here), nor a job another process is in the middle of moving
(its ``claimed/J`` is locked).  Every change goes through :mod:`cortexfs.durable` with the
same no-replace moves and syncs as the protocol, so a crash in the middle of ``recover`` leaves
a state the next run handles, and a second run changes nothing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cortexfs import durable
from cortexfs.errors import HOST_TROUBLES, CtxError, errno_text, explain_host_trouble, invalid
from cortexfs.interrupts import held_interrupts
from cortexfs.queue import evidence as ev
from cortexfs.queue.claim_order import pending_changed, pending_stamp, relist_after_recover
from cortexfs.queue.holder import GONE, Verdict, judge, once_gone
from cortexfs.queue.layout import (
    LEASE_FILE,
    READERS_WAIT_SECONDS,
    RESULT_SUFFIX,
    DirLock,
    Queue,
    lock_dir,
    lstat_at,
    take_dir_lock,
)
from cortexfs.queue.leasing import lease_unreadable, read_lease
from cortexfs.queue.transition import remove_claim_and_lease
from cortexfs.timefmt import MAX_SECONDS, is_seconds


@dataclass
class Finding:
    """One job (or temp file) recover looked at: what it found and what it did about it."""

    job: str
    state: str
    detail: str
    action: str | None = None
    applied: bool = False
    evidence: list[str] = field(default_factory=list)
    error: str | None = None  # the errno name, for what recover failed to do

    def to_json(self) -> dict[str, Any]:
        found = {
            "job": self.job,
            "state": self.state,
            "detail": self.detail,
            "action": self.action,
            "applied": self.applied,
            "evidence": self.evidence,
        }
        if self.error is not None:
            found["error"] = self.error
        return found


@dataclass
class RecoverReport:
    reconcile: bool
    dry_run: bool
    requeued: list[Finding] = field(default_factory=list)
    repaired: list[Finding] = field(default_factory=list)
    untouched: list[Finding] = field(default_factory=list)
    incomplete: list[Finding] = field(default_factory=list)
    conflicts: list[Finding] = field(default_factory=list)
    removed_temps: list[str] = field(default_factory=list)
    stale_temps: list[str] = field(default_factory=list)
    ignored: list[ev.Ignored] = field(default_factory=list)
    errors: list[Finding] = field(default_factory=list)

    @property
    def consistent(self) -> bool:
        """True when no incomplete pair, conflict or failure remains after the run (exit 0).

        Judged on the queue as the run leaves it: a repair a dry run only plans leaves its
        incomplete pair in place.  Stray temp files are neither incomplete pairs nor
        conflicts (Q-6): they are reported, not counted.
        """
        unrepaired = any(not f.applied for f in self.repaired)
        return not (self.incomplete or self.conflicts or self.errors or unrepaired)

    def to_json(self) -> dict[str, Any]:
        return {
            "reconcile": self.reconcile,
            "dry_run": self.dry_run,
            "consistent": self.consistent,
            "requeued": [f.to_json() for f in self.requeued],
            "repaired": [f.to_json() for f in self.repaired],
            "untouched": [f.to_json() for f in self.untouched],
            "incomplete": [f.to_json() for f in self.incomplete],
            "conflicts": [f.to_json() for f in self.conflicts],
            "removed_temps": self.removed_temps,
            "stale_temps": self.stale_temps,
            "ignored": [i.to_json() for i in self.ignored],
            "errors": [f.to_json() for f in self.errors],
        }


class Interrupted(KeyboardInterrupt):
    """Ctrl-C stopped a recover between two jobs: ``report`` holds the transitions it had
    applied (its requeued and repaired jobs), nothing after them."""

    def __init__(self, report: RecoverReport) -> None:
        super().__init__()
        self.report = report


def _check_grace(grace: float) -> float:
    if not is_seconds(grace, zero=True):
        raise invalid(
            f"a grace period is a number of seconds from 0 to {MAX_SECONDS:.0f} (366 days), "
            f"not {grace!r}: a temp file younger than it may still be being written"
        )
    return float(grace)


def recover(
    queue: Queue, *, reconcile: bool = False, dry_run: bool = False, grace: float | None = None
) -> RecoverReport:
    """Scan the queue once and apply (or, with ``dry_run``, only plan) the transitions above.
    ``grace``: the age in seconds below which an inbox temp file is left alone, 0 to
    :data:`MAX_SECONDS` (EINVAL otherwise, before anything is looked at); the queue's own
    ``grace`` when None."""
    grace = queue.config.grace if grace is None else _check_grace(grace)
    report = RecoverReport(reconcile=reconcile, dry_run=dry_run)
    found = ev.scan(queue)
    report.ignored = found.ignored
    try:
        for job in sorted(found.jobs):
            try:
                _recover_job(queue, found.jobs[job], report, reconcile=reconcile, dry_run=dry_run)
            except (OSError, CtxError) as exc:
                # One job we cannot repair (EACCES in a directory another user made, a symlink
                # swapped in since the scan) must not cost every other job its repair: say what
                # failed and carry on; the run then ends inconsistent (exit 1).
                report.errors.append(_failure(queue, exc, found.jobs[job]))
        for temp in found.temps:
            if temp.age < grace:
                continue  # a publish, lease or finish may still be writing it
            if not reconcile or dry_run:
                refused = _temp_removal_refused(queue, temp) if reconcile else None
                if refused is not None:  # a dry run makes the run's checks
                    report.errors.append(refused)
                    continue
                report.stale_temps.append(f"inbox/{temp.name}")  # still there after the run
                continue
            with _unless_being_written(queue, temp) as stray:
                if not stray:
                    continue
                try:
                    removed = durable.remove_entries(queue.ops, [(queue.inbox, temp.name, False)])
                except OSError as exc:
                    report.errors.append(_temp_failure(queue, temp, exc))
                    continue
            if removed:  # not when another recover removed it first: it lists it
                report.removed_temps.append(f"inbox/{temp.name}")
        if report.removed_temps:
            durable.sync_dir(queue.ops, queue.inbox)
        if not dry_run:
            relist_after_recover(queue)
    except KeyboardInterrupt:
        # Ctrl-C lands between two steps (each transition holds it): what was done before
        # is the caller's to say, as a claim or finish under way says what it did.
        raise Interrupted(report) from None
    return report


@contextlib.contextmanager
def _unless_being_written(queue: Queue, temp: ev.Temp) -> Iterator[bool]:
    """Whether ``temp`` is a stray, with ``claimed/J``'s lock held meanwhile when J has one:
    the claimer writing J's lease, the renewer and the finisher writing theirs hold that
    lock (as recover does before it moves J), and a temp of theirs is theirs however long
    they take, stopped or stalled (Q-6: a live holder's job is never touched); with the
    lock held, no claim, renew or finish of J starts a step meanwhile.  What a process that
    crashed left is a stray: the kernel let its lock go with it."""
    claim_fd = None
    if temp.job is not None:
        with contextlib.suppress(OSError):  # no claimed/J (or no directory): nothing to hold
            claim_fd = queue.open_job_dir("claimed", temp.job)
    try:
        yield claim_fd is None or lock_dir(claim_fd, within=0, past_readers=READERS_WAIT_SECONDS)
    finally:
        if claim_fd is not None:
            queue.ops.close(claim_fd)


class _StoppedPartWay(Exception):
    """A transition that failed once it had begun, with J's evidence before it and after it.
    Both are read under J's lock when ``claimed/J`` exists, and what changed is then this
    run's doing; without ``claimed/J`` (an orphan ``lease/J``) there is no lock to hold, and
    a claim made meanwhile would show in the difference too.  ``action`` is what the
    transition does to J (``requeue J``), ``places`` the directories it changes, as the check
    before it names them, and ``reconciling`` whether it is a repair of ``--reconcile``."""

    def __init__(
        self,
        cause: OSError | CtxError,
        before: ev.JobEvidence,
        after: ev.JobEvidence,
        action: str,
        places: tuple[str, ...],
        reconciling: bool,
    ) -> None:
        super().__init__(str(cause))
        self.cause, self.before, self.after = cause, before, after
        self.action, self.places, self.reconciling = action, places, reconciling


def _failure(
    queue: Queue, exc: OSError | CtxError, scanned: ev.JobEvidence, attempted: str | None = None
) -> Finding:
    """What recover could not do for a job it left as it was (``attempted``, the transition
    it was making, if it had got that far), with the errno that stopped it and, for a
    shortage of the host's, what ran short and what mends it (never a bare 'Too many open
    files')."""
    if isinstance(exc, CtxError):
        code, detail = exc.code_name, f"{exc}; left as it is"
        return Finding(
            scanned.job, "error", detail, attempted, evidence=scanned.paths(), error=code
        )
    code, reason = errno.errorcode.get(exc.errno or 0, "EIO"), errno_text(exc)
    trouble = explain_host_trouble(exc.errno, filesystem=queue.root_fd, uid=os.geteuid())
    if trouble is None:
        detail = f"{reason}; left as it is"
    else:
        detail = f"{reason}{trouble.aside}; left as it is: {trouble.remedy}, then recover again"
    return Finding(scanned.job, "error", detail, attempted, evidence=scanned.paths(), error=code)


def _stopped_part_way(
    queue: Queue, scanned: ev.JobEvidence, stopped: _StoppedPartWay, attempted: str | None
) -> Finding:
    """What recover could not do for a job whose transition the kernel refused, and where
    the job stands now: as it was, or, when part of it changed, the state the next run
    handles (the report must not say the job was left as it was).  A refusal says which
    directory refused and why (an immutable attribute, a read-only filesystem, a full disk)
    and what to do, as :meth:`Queue.refusal` says it for the other commands: the check before
    the transition cannot see a mode changed after it, nor an append-only attribute."""
    now, where, reconcile = stopped.after, "left as it is", stopped.reconciling
    if sorted(now.paths()) != sorted(stopped.before.paths()):
        assessment = ev.assess(now)
        where = f"stopped part-way: it is now {assessment.state} ({assessment.detail})"
        if assessment.state == "incomplete":
            where += ", for 'ctx queue recover --reconcile' to complete"
            reconcile = True
    exc = stopped.cause
    if isinstance(exc, OSError) and exc.errno in _REFUSALS_OF_THE_HOST:
        again = f"run 'ctx queue recover{' --reconcile' if reconcile else ''}' again"
        refusal = queue.refusal_among(stopped.action, stopped.places, exc, where, again)
        detail, code = str(refusal), refusal.code_name
    elif isinstance(exc, CtxError):
        detail, code = f"{exc}; {where}", exc.code_name
    else:
        # Not the host's refusal: an entry changed under the transition (a directory swapped
        # for a symbolic link, a name taken meanwhile), which is said with the errno.
        detail = f"{stopped.action}: {errno_text(exc)}; {where}"
        code = errno.errorcode.get(exc.errno or 0, "EIO")
    return Finding(scanned.job, "error", detail, attempted, evidence=now.paths(), error=code)


# What the host refuses a step for, whatever the job: a directory's mode or attribute, a
# read-only filesystem, a shortage, a failing disk.  Any other errno (EEXIST: the job showed up
# at its destination meanwhile) is about the job, and is said as it is.
_REFUSALS_OF_THE_HOST = HOST_TROUBLES | {errno.EACCES, errno.EPERM, errno.EIO, errno.EXDEV}


def _temp_removal_refused(queue: Queue, temp: ev.Temp) -> Finding | None:
    """The error a dry run of ``--reconcile`` reports for a stray temp the run would be
    refused to remove (an immutable or append-only attribute of the file or of ``inbox/``, a
    read-only filesystem, a mode), in the words the run's refusal uses, as
    :func:`_require_applicable` checks a job's transition; None when nothing refuses it."""
    path = f"inbox/{temp.name}"
    refused = queue.refusal_now(f"remove the stray temp file {path}", ("inbox",), (path,))
    if refused is None:
        return None
    return _temp_failure(queue, temp, OSError(refused.errno, os.strerror(refused.errno)))


def _temp_failure(queue: Queue, temp: ev.Temp, exc: OSError) -> Finding:
    path = f"inbox/{temp.name}"
    refusal = queue.refusal(
        f"remove the stray temp file {path}",
        "inbox",
        exc,
        "not removed",
        "run 'ctx queue recover --reconcile' again",
        entries=(path,),  # its own attribute (chattr +i) before its directory's
    )
    return Finding(path, "error", str(refusal), evidence=[path], error=refusal.code_name)


def _recover_job(
    queue: Queue, evidence: ev.JobEvidence, report: RecoverReport, *, reconcile: bool, dry_run: bool
) -> None:
    scanned_evidence = evidence
    assessment = ev.assess(evidence)
    if assessment.state in ("conflict", "incomplete"):
        scanned = assessment
        evidence, assessment = _settled(queue, evidence, assessment)
        if not evidence.paths():
            # Nothing of J is left of what the scan saw (an empty claimed/J, an orphan lease/J):
            # another recover removed it meanwhile, which is no conflict for a human to see.
            detail = f"{scanned.detail}; left alone, another process removed it since the scan"
            report.untouched.append(Finding(evidence.job, scanned.state, detail, evidence=[]))
            return
    finding = Finding(evidence.job, assessment.state, assessment.detail, evidence=evidence.paths())
    # What stops J's transition is reported with the transition it stopped (its ``action``,
    # never applied): a script reading ``errors`` knows what was tried, as the text says.
    try:
        _judge(queue, evidence, assessment, finding, report, reconcile=reconcile, dry_run=dry_run)
    except _StoppedPartWay as stopped:
        report.errors.append(_stopped_part_way(queue, scanned_evidence, stopped, finding.action))
    except (OSError, CtxError) as exc:
        report.errors.append(_failure(queue, exc, scanned_evidence, finding.action))


def _judge(
    queue: Queue,
    evidence: ev.JobEvidence,
    assessment: ev.Assessment,
    finding: Finding,
    report: RecoverReport,
    *,
    reconcile: bool,
    dry_run: bool,
) -> None:
    """Report J, as ``finding``, under what its evidence makes it, and make (or, in a dry run,
    plan) the transition that settles it when one may be made."""
    if assessment.state == "conflict":
        report.conflicts.append(finding)
        return
    if assessment.state == "claimed":
        verdict = _lease_verdict(queue, evidence.job)
        if verdict.state == UNREADABLE:
            now = ev.assess(ev.evidence_of(queue, evidence.job)).state
            if now not in ("claimed", "conflict"):
                # Finished (or requeued) since the scan: its lease was removed on the way, which
                # is the protocol at work, not damage a human must look at.
                finding.detail = f"{verdict.reason}; left alone, it is now {now}"
                report.untouched.append(finding)
                return
            unreadable = ev.unreadable_lease(verdict.reason)  # a human decides
            finding.state, finding.detail = unreadable.state, unreadable.detail
            report.conflicts.append(finding)
            return
        if not verdict.gone:
            finding.detail = f"lease holder {verdict.state}: {verdict.reason}"
            report.untouched.append(finding)
            return
        finding.action = "requeue"
        finding.detail = f"lease holder gone: {verdict.reason}"
        if dry_run:
            _require_applicable(queue, evidence.job, _requeue, finding, evidence, dry_run=True)
            report.requeued.append(finding)  # planned, not applied
            return
        if _apply(queue, evidence.job, _requeue, finding, assessment, report.requeued):
            report.untouched.append(finding)
        return
    if assessment.state != "incomplete":
        return
    finding.action = assessment.repair
    if not reconcile:
        # Reported, not repaired; but a claim or finish at work (its lock held) shows
        # the same evidence for a moment, and is no crash leftover: left alone, not counted.
        # A dry run takes no lock, and lists it as what it looks like.
        if not dry_run and _in_motion(queue, evidence.job, finding, assessment):
            report.untouched.append(finding)
        else:
            report.incomplete.append(finding)
        return
    if dry_run:
        verdict = _holder_verdict(queue, evidence, assessment)
        if verdict is not None:
            # Left as it is, and still incomplete: the run does not end "consistent".
            finding.detail += _left_to_its_holder(queue, evidence.job, verdict)
            report.incomplete.append(finding)
            return
        repair = _REPAIRS[assessment.repair or ""]
        _require_applicable(queue, evidence.job, repair, finding, evidence, dry_run=True)
        report.repaired.append(finding)  # planned, not applied: the pair stays incomplete
        return
    # A live holder's pair too is judged by _apply, which tries claimed/J's lock before the
    # holder: a finish or claim in progress holds it, and the pair it is completing is then
    # left untouched (BUSY), not reported as interrupted; a pair whose holder is alive and
    # not moving it comes back HELD, still incomplete.
    repair = _REPAIRS[assessment.repair or ""]
    outcome = _apply(queue, evidence.job, repair, finding, assessment, report.repaired)
    if outcome == HELD:
        report.incomplete.append(finding)
    elif outcome is not None:
        report.untouched.append(finding)  # another process is completing it right now


_SETTLE_LOOKS = 5


def _settled(
    queue: Queue, scanned: ev.JobEvidence, assessment: ev.Assessment
) -> tuple[ev.JobEvidence, ev.Assessment]:
    """J's evidence looked at again, until two looks agree.

    The scan lists one directory after another while live workers move jobs between them, so
    a job claimed or finished during the scan can look both pending and done, or claimed while
    still pending: a conflict or an incomplete pair that never existed.  Reported, it would
    send a human after nothing (and make the run exit 1).  Evidence a crash left behind does
    not move, so the first two looks agree and it is judged as before; a job in motion is
    judged on where it has settled, or on the last look if it is still moving."""
    previous = scanned
    for _ in range(_SETTLE_LOOKS):
        current = ev.evidence_of(queue, scanned.job)
        if current == previous:
            break
        previous = current
    else:
        return previous, ev.assess(previous)
    return current, (assessment if current == scanned else ev.assess(current))


def _holder_verdict(
    queue: Queue, evidence: ev.JobEvidence, assessment: ev.Assessment
) -> Verdict | None:
    """The verdict on J's lease holder that forbids repairing J, or None when J may be repaired.

    A holder that is provably gone, or no lease at all, forbids nothing.  Nor does an orphan
    lease that cannot be read: with no request anywhere in ``claimed/`` it names no running
    job (Q-3 puts the claim before the lease, Q-4 the request's departure before the lease's
    removal, and a claim or finish in progress holds ``claimed/J`` locked), and being
    unreadable it names no holder either, so Q-6's "an orphan lease/J ... removed" applies.
    A readable lease whose holder is alive is left alone, orphan or not (Q-6).
    """
    if not evidence.lease_file:
        return None
    verdict = _lease_verdict(queue, evidence.job)
    if verdict.state == GONE:
        return None
    orphan = assessment.repair == ev.REMOVE_ORPHANS and evidence.claim_request is None
    if orphan and verdict.state == UNREADABLE:
        return None
    return verdict


def _left_to_its_holder(queue: Queue, job: str, verdict: Verdict) -> str:
    """Why an incomplete pair was left alone, and when a run will complete it: said, or the
    user goes between finish (which sends them here) and recover (which leaves it) in a
    circle until the holder has gone."""
    said = f"; left alone, lease holder {verdict.state}: {verdict.reason}"
    try:
        lease = read_lease(queue, job)
    except (OSError, CtxError):
        return said
    return f"{said}; 'ctx queue recover --reconcile' completes it {once_gone(lease)}"


UNREADABLE = "unreadable"  # a lease file that cannot be parsed: no verdict on its holder
HELD = "held"  # _apply left the job alone because its lease holder is not provably gone
BUSY = "busy"  # _apply left the job alone because it is being moved or has moved


def _lease_verdict(queue: Queue, job: str) -> Verdict:
    try:
        lease = read_lease(queue, job)
    except (OSError, CtxError) as exc:
        # An unreadable lease proves nothing about its holder: never act on it.
        return Verdict(UNREADABLE, lease_unreadable(job, exc))
    return judge(lease)


@contextlib.contextmanager
def _locked_as_scanned(
    queue: Queue, job: str, finding: Finding, scanned: ev.Assessment
) -> Iterator[tuple[int | None, ev.JobEvidence, ev.Assessment] | None]:
    """``claimed/J``'s lock (when there is a ``claimed/J``) and J looked at again under it:
    yields the claim's descriptor, the evidence and its assessment, or None — with
    ``finding.detail`` saying why — when another process holds the lock or J is no longer
    what the scan saw.  Taking the lock changes nothing on disk."""
    try:
        claim_fd = queue.open_job_dir("claimed", job)
    except FileNotFoundError:
        claim_fd = None
    try:
        lock = (
            None
            if claim_fd is None
            else take_dir_lock(claim_fd, within=0, past_readers=READERS_WAIT_SECONDS)
        )
        if lock is DirLock.BUSY:
            busy = "left alone, another process is moving this job"
            if scanned.state == "incomplete":
                # What the scan saw is a step of that move, not the crash leftover the
                # evidence alone suggests ("finish was interrupted…"): say only what is.
                finding.detail = f"{busy} (claimed/{job} is locked: a claim, finish or recover)"
            else:
                finding.detail += f"; {busy}"
            yield None
            return
        # Re-check under the lock: the job may have moved since the scan.  The scan reads
        # claimed/ before lease/, so a claim that completed in between looked unleased; and
        # a requeued job may have a new, live holder by now.
        evidence = ev.evidence_of(queue, job)
        current = ev.assess(evidence)
        if claim_fd is None and evidence.claim_dir:
            # claimed/J was not there to lock a moment ago and is there now: it is being
            # moved (or swapped by hand), and is not acted on unlocked.
            finding.detail += f"; left alone, claimed/{job} changed while it was looked at"
            yield None
            return
        if (current.state, current.repair) != (scanned.state, scanned.repair):
            now = current.state if evidence.paths() else "gone (another process removed it)"
            finding.detail += f"; left alone, it is now {now}"
            yield None
            return
        if lock is DirLock.UNSUPPORTED and _may_be_a_claim_at_work(queue, claim_fd, current):
            finding.detail += (
                f"; left alone: this filesystem refuses flock, so a claim in progress looks "
                f"the same until claimed/{job} is older than the lease lifetime "
                f"({queue.config.lease_ttl:g} s, queue/config lease_ttl)"
            )
            yield None
            return
        yield claim_fd, evidence, current
    finally:
        if claim_fd is not None:
            queue.ops.close(claim_fd)


def _may_be_a_claim_at_work(queue: Queue, claim_fd: int, current: ev.Assessment) -> bool:
    """Whether ``claimed/J``, its lock no lock (a filesystem refusing flock), may be a claim at
    work rather than a crash's leftover: an empty claim directory, or a claimed request with
    no lease yet, made less than a lease lifetime ago.  A claimer stalled longer than that is
    taken for gone, as a lease holder is once its lease has expired (Q-5); it then finds its
    request taken back and withdraws its lease (:mod:`cortexfs.queue.claiming`)."""
    if current.repair not in (ev.REQUEUE_UNLEASED, ev.REMOVE_ORPHANS):
        return False
    made = os.fstat(claim_fd)
    age = time.time() - made.st_mtime
    return age < queue.config.lease_ttl


def _in_motion(queue: Queue, job: str, finding: Finding, scanned: ev.Assessment) -> bool:
    """Whether the incomplete pair the scan saw is a claim, finish or recover at work (J's lock
    is held) or has moved on since, rather than evidence a crash left (``finding.detail``
    then says which).  False when that cannot be told (``claimed/J`` cannot be opened by this
    user): the pair is then reported as it looks, as it always was."""
    try:
        with _locked_as_scanned(queue, job, finding, scanned) as looked:
            return looked is None
    except OSError:
        return False


def _apply(
    queue: Queue,
    job: str,
    transition: Any,
    finding: Finding,
    scanned: ev.Assessment,
    applied: list[Finding],
) -> str | None:
    """Run a transition while holding ``claimed/J``'s lock: None once applied, with
    ``finding`` in ``applied`` (the report's list), else why not (BUSY: someone else holds
    the lock, or the job is no longer what the scan saw; HELD: its lease holder is not
    provably gone).  The finding is listed before a Ctrl-C held during the transition goes
    on: a recover it stops says every job it moved."""
    with _locked_as_scanned(queue, job, finding, scanned) as looked:
        if looked is None:
            return BUSY
        claim_fd, evidence, current = looked
        if (verdict := _holder_verdict(queue, evidence, current)) is not None:
            if current.state == "incomplete":
                finding.detail += _left_to_its_holder(queue, job, verdict)
            else:  # claimed again since the scan, by a live holder: its job runs
                finding.detail += f"; left alone, lease holder {verdict.state}: {verdict.reason}"
            return HELD
        action, places = _require_applicable(queue, job, transition, finding, evidence)
        with held_interrupts():  # Ctrl-C lands between two jobs, never inside one's move
            try:
                transition(queue, job, claim_fd)
            except (OSError, CtxError) as exc:
                try:
                    after = ev.evidence_of(queue, job)
                except OSError:
                    after = evidence  # nothing more can be said of it from here
                reconciling = finding.action != "requeue"
                raise _StoppedPartWay(exc, evidence, after, action, places, reconciling) from exc
            finding.applied = True
            applied.append(finding)
        return None


def _require_applicable(
    queue: Queue,
    job: str,
    transition: Any,
    finding: Finding,
    evidence: ev.JobEvidence,
    *,
    dry_run: bool = False,
) -> tuple[str, tuple[str, ...]]:
    """What the transition does to J (``requeue J``) and the directories it changes, once
    every one of them is known to let it, as finish checks before its first step (and in its
    words): a directory an older release made without the group's write bit (claimed/J 2755)
    or a file made immutable would refuse a move midway with a bare EACCES or EPERM, naming
    nothing.  A dry run checks the same and, since it tries nothing, the attributes of those
    directories too (an append-only ``claimed/J``, which the run meets at its move), so that
    what it plans is what the run would do."""
    action = f"{_VERBS[finding.action or '']} {job}"
    places = _places_changed(job, transition, evidence)
    files = _files_moved_or_removed(job, evidence)
    if dry_run:
        refused = queue.refusal_now(action, places, files)
        if refused is not None:
            raise refused
        return action, places
    queue.require_writable(action, places)
    queue.require_changeable(action, files)
    return action, places


def _places_changed(job: str, transition: Any, evidence: ev.JobEvidence) -> tuple[str, ...]:
    """The directories ``transition`` changes for J, as :meth:`Queue.require_writable` takes
    them: where the request goes (``pending``, ``done``, ``failed``), ``claimed/J`` it leaves,
    ``lease/J`` its lease file leaves, and ``claimed``, ``lease`` those two directories leave.
    An empty ``claimed/J`` or ``lease/J`` is removed from its parent without being written."""
    places = []
    if transition is _requeue:
        places.append("pending")
    elif transition is _roll_forward:
        places.append("done" if evidence.done_result else "failed")
    places.append("claimed")
    if evidence.claim_request is not None:
        places.append(f"claimed/{job}")
    places.append("lease")
    if evidence.lease_file:
        places.append(f"lease/{job}")
    return tuple(places)


def _files_moved_or_removed(job: str, evidence: ev.JobEvidence) -> tuple[str, ...]:
    """The files of J a transition of recover moves or removes (its claimed request, its
    lease file): an immutable or append-only one refuses it midway, which is said first."""
    files = []
    if evidence.claim_request is not None:
        files.append(f"claimed/{job}/{job}")
    if evidence.lease_file:
        files.append(f"lease/{job}/{LEASE_FILE}")
    return tuple(files)


def _move_claim_to(queue: Queue, job: str, claim_fd: int, dst_dir: int) -> None:
    """Move ``claimed/J/J`` to ``dst_dir/J``; if J is already there as the same file, drop
    the claim's link instead (an interrupted link-strategy move).  Either way ``claimed/J``
    is synced (Q-7), though the cleanup that always follows removes it."""
    try:
        durable.move_noreplace(queue.ops, claim_fd, job, dst_dir, job)
    except FileExistsError:
        claim_st = lstat_at(claim_fd, job)
        dst_st = lstat_at(dst_dir, job)
        if claim_st is None or dst_st is None or claim_st.st_ino != dst_st.st_ino:
            raise
        _drop_from_claim(queue, job, claim_fd)


def _drop_from_claim(queue: Queue, job: str, claim_fd: int) -> None:
    """Unlink ``claimed/J/J``, a second name of a request that is in place elsewhere, and
    sync ``claimed/J`` (Q-7)."""
    durable.remove_entries(queue.ops, [(claim_fd, job, False)])
    durable.sync_dir(queue.ops, claim_fd)


def _requeue(queue: Queue, job: str, claim_fd: int | None) -> None:
    """Q-5 and the unleased case of Q-6: the request goes back to pending, then the claim
    and lease are cleaned up (lease first, so no new claim can meet the stale lease)."""
    assert claim_fd is not None
    queue.ops.step("recover.requeue")
    before = pending_stamp(queue.pending)
    _move_claim_to(queue, job, claim_fd, queue.pending)
    # First in line: J keeps the publish time it had, older than anything still pending that
    # was published after it.
    pending_changed(queue, before, [job], first=True)
    queue.ops.step("recover.cleanup")
    remove_claim_and_lease(queue, job)


def _roll_forward(queue: Queue, job: str, claim_fd: int | None) -> None:
    """The result is durable proof the job ran: finish the move of the request."""
    assert claim_fd is not None
    terminal = queue.done if lstat_at(queue.done, job + RESULT_SUFFIX) else queue.failed
    queue.ops.step("recover.roll_forward")
    _move_claim_to(queue, job, claim_fd, terminal)
    queue.ops.step("recover.cleanup")
    remove_claim_and_lease(queue, job)


def _drop_claim_copy(queue: Queue, job: str, claim_fd: int | None) -> None:
    assert claim_fd is not None
    queue.ops.step("recover.drop_copy")
    _drop_from_claim(queue, job, claim_fd)
    queue.ops.step("recover.cleanup")
    remove_claim_and_lease(queue, job)


def _remove_orphans(queue: Queue, job: str, claim_fd: int | None) -> None:
    queue.ops.step("recover.orphans")
    remove_claim_and_lease(queue, job)


# What each transition does to J, as a refusal says it: "cannot requeue J in queue Q: ...".
_VERBS = {
    "requeue": "requeue",
    ev.REQUEUE_UNLEASED: "requeue",
    ev.ROLL_FORWARD: "complete the interrupted finish of",
    ev.DROP_CLAIM_COPY: "drop the claim's second link of",
    ev.REMOVE_ORPHANS: "remove the orphan claim and lease directories of",
}

_REPAIRS = {
    ev.REQUEUE_UNLEASED: _requeue,
    ev.ROLL_FORWARD: _roll_forward,
    ev.DROP_CLAIM_COPY: _drop_claim_copy,
    ev.REMOVE_ORPHANS: _remove_orphans,
}
