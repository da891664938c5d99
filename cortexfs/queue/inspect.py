"""The reading side of the queue: status, list, show.  Nothing here changes the disk."""

from __future__ import annotations

import os
import stat
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cortexfs import jsontext
from cortexfs.errors import CtxError, describe, invalid, not_found
from cortexfs.names import job_name
from cortexfs.printable import shell_word
from cortexfs.queue import evidence as ev
from cortexfs.queue import requests
from cortexfs.queue.claim_order import pending_in_claim_order
from cortexfs.queue.holder import MAX_LEASE_BYTES, judge
from cortexfs.queue.layout import (
    LEASE_FILE,
    RESULT_SUFFIX,
    STATE_DIRS,
    Queue,
    kind_of,
    read_lock_dir,
    read_regular_file,
)
from cortexfs.queue.leasing import lease_unreadable, read_lease
from cortexfs.timefmt import file_time


@dataclass
class QueueStatus:
    path: str
    counts: dict[str, int]
    ignored: list[ev.Ignored] = field(default_factory=list)
    incomplete: list[dict[str, Any]] = field(default_factory=list)
    conflicts: list[dict[str, Any]] = field(default_factory=list)
    temps: list[dict[str, Any]] = field(default_factory=list)
    owned_by_others: list[dict[str, Any]] = field(default_factory=list)
    group_not_inherited: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """``{"queue": …, "pending": 2, "claimed": 0, …, "counts": {…}, "ignored": […], …}``:
        each count also at the top level, where a reader of SPEC §2.4's "counts per state"
        looks first — all but those of ``incomplete`` and ``ignored``, whose top-level keys
        hold the lists (their counts are in ``counts``, with every other)."""
        listed = {"ignored", "incomplete"}
        return {
            "queue": self.path,
            **{state: n for state, n in self.counts.items() if state not in listed},
            "counts": self.counts,
            "ignored": [i.to_json() for i in self.ignored],
            "incomplete": self.incomplete,
            "conflicts": self.conflicts,
            "temps": self.temps,
            "owned_by_others": self.owned_by_others,
            "group_not_inherited": self.group_not_inherited,
        }


def status(queue: Queue) -> QueueStatus:
    """Counts per state, ignored entries, incomplete pairs and conflicts."""
    found = ev.scan(queue)
    counts: Counter[str] = Counter({state: 0 for state in ev.STATES})
    result = QueueStatus(path=str(queue.path), counts={})
    for job in sorted(found.jobs):
        evidence = found.jobs[job]
        assessment = _assess(queue, job, evidence)
        counts[assessment.state] += 1
        if assessment.state in ("incomplete", "conflict"):
            entry = {"job": job, **assessment.to_json(), "evidence": evidence.paths()}
            (result.incomplete if assessment.state == "incomplete" else result.conflicts).append(
                entry
            )
    result.counts = {state: counts[state] for state in ev.STATES}
    result.counts["ignored"] = len(found.ignored)
    result.ignored = found.ignored
    result.temps = [
        {"path": f"inbox/{t.name}", "age_seconds": round(t.age, 3), "job": t.job, "kind": t.kind}
        for t in found.temps
    ]
    result.owned_by_others = state_dirs_owned_by_others(queue)
    result.group_not_inherited = state_dirs_not_giving_the_queue_group(queue)
    return result


def state_dirs_owned_by_others(queue: Queue) -> list[dict[str, Any]]:
    """The state directories that belong neither to the queue directory's owner nor to root,
    each with what that lets their owner do and what gives them back.

    In a queue shared by a group, ``queue/`` is sticky so that its six directories stay its
    owner's: no member may rename or remove them.  The sticky bit stops no one from renaming
    what they own, though, so a state directory a member made (an older layout, or a queue
    that was not sticky when it was made) is that member's to rename away with the jobs in
    it, or to close to every other user with a chmod: the queue then loses those jobs
    without a trace, or refuses everyone else.  Nothing is wrong while that member does
    neither, so it is reported, not refused.  Root may do all that to any directory, so a
    state directory of root's gives no one anything."""
    queue_owner = os.fstat(queue.root_fd).st_uid
    found = []
    for state in STATE_DIRS:
        st = os.fstat(queue.dirs[state])
        if st.st_uid in (queue_owner, 0):
            continue
        path = shell_word(str(queue.path / state))
        found.append(
            {
                "path": state,
                "uid": st.st_uid,
                "queue_owner": queue_owner,
                "reason": (
                    f"owned by uid {st.st_uid}, not by uid {queue_owner} who owns the queue: "
                    f"uid {st.st_uid} may change its mode, locking every other user of the "
                    f"queue out of {state}/, and, if it may write in the queue directory, "
                    f"rename {state}/ away with the jobs in it (the sticky bit of the queue "
                    "directory does not stop a directory's own owner)"
                ),
                "remedy": f"have root give it to the queue's owner: chown {queue_owner} {path}",
            }
        )
    return found


def state_dirs_not_giving_the_queue_group(queue: Queue) -> list[dict[str, Any]]:
    """In a queue shared by a group, the state directories that would not give what is made
    in them the queue's group, each with why that matters and what repairs it.

    A member's request, claim or lease belongs to the queue's group only because the state
    directory it is made in is setgid with that group; the group bits :func:`~cortexfs.
    durable.grant_group_access` sets are then the queue group's.  A directory that lost its
    setgid bit (a ``chmod``, a copy that did not keep it) gives each entry its maker's own
    group instead, and members of the queue's group are refused it: a claimer finds the
    requests other members publish unreadable, a recover another member's lease.  Nothing
    is refused yet, so it is reported, not refused."""
    if not queue.group_access & stat.S_IWGRP:
        return []  # no member may make anything in it: whose group an entry gets is moot
    group = os.fstat(queue.root_fd).st_gid
    found = []
    for state in STATE_DIRS:
        st = os.fstat(queue.dirs[state])
        if st.st_mode & stat.S_ISGID and st.st_gid == group:
            continue
        path = shell_word(str(queue.path / state))
        if st.st_gid == group:
            why, repair = "is not setgid", f"chmod g+s {path}"
        else:
            why, repair = f"belongs to gid {st.st_gid}", f"chgrp {group} {path} && chmod g+s {path}"
        found.append(
            {
                "path": state,
                "gid": st.st_gid,
                "setgid": bool(st.st_mode & stat.S_ISGID),
                "queue_gid": group,
                "reason": (
                    f"{why}, so what members make in it gets the maker's own group, not the "
                    f"queue's gid {group}: other members of the queue's group are refused it "
                    "(a claimer cannot read the requests, a recover the leases)"
                ),
                "remedy": f"have its owner or root run: {repair}",
            }
        )
    return found


def list_jobs(queue: Queue, state: str | None = None) -> list[dict[str, str]]:
    """Jobs with their state; pending ones in claim order, the rest by name."""
    if state is not None and state not in ev.STATES:
        raise invalid(f"unknown state {state!r}; choose one of {', '.join(ev.STATES)}")
    if state == "pending":
        # The claim order is exactly what this user's next claims take.
        jobs = []
        for name in pending_in_claim_order(queue):
            assessment = ev.assess(ev.evidence_of(queue, name))
            if assessment.state == "pending":
                jobs.append({"name": name, "state": "pending"})
        return jobs
    found = ev.scan(queue)
    listed = []
    for name in sorted(found.jobs):
        assessment = _assess(queue, name, found.jobs[name])
        if assessment.state == ev.IGNORED:
            continue  # not a job; status lists it among the ignored entries
        if state is None or assessment.state == state:
            listed.append({"name": name, "state": assessment.state})
    return listed


# How many times show looks at a job that moved while it read its evidence.
SHOW_ATTEMPTS = 5


def show(queue: Queue, job: str) -> dict[str, Any]:
    """Every piece of evidence for J, with the documents it holds.

    A claim, finish or recover may move J while its evidence is read (a finish removes the
    lease and the claim directory being read): the evidence is listed again once read, and
    J is looked at anew until the two listings agree, so that what is shown is one state J
    was in, never a mix of two or a piece reported missing (at most :data:`SHOW_ATTEMPTS`
    times; a J that never holds still is shown as last read)."""
    job = job_name(job)
    for _ in range(SHOW_ATTEMPTS):
        evidence = ev.evidence_of(queue, job)
        detail = _shown(queue, job, evidence)
        if ev.evidence_of(queue, job).paths() == evidence.paths():
            break
    return detail


def _shown(queue: Queue, job: str, evidence: ev.JobEvidence) -> dict[str, Any]:
    """:func:`show` of J as ``evidence`` found it."""
    temps = [t for t in ev.scan_inbox(queue) if t.job == job]
    paths = evidence.paths()
    if not paths and not temps:
        raise not_found(f"job {job} has no evidence in {queue.path}")
    if paths:
        assessment = _assess(queue, job, evidence)
    else:
        assessment = ev.Assessment("none", "only temp files")
    detail: dict[str, Any] = {
        "name": job,
        **assessment.to_json(),
        "evidence": [_describe(queue, path) for path in paths],
        "temps": [
            {"path": f"inbox/{t.name}", "age_seconds": round(t.age, 3), "kind": t.kind}
            for t in temps
        ],
    }
    limits = {
        "request": requests.stored_request_limit(queue.config.max_request_bytes),
        "lease": MAX_LEASE_BYTES,
        "result": requests.stored_result_limit(queue.config.max_result_bytes),
    }
    for key, path in _documents(queue, evidence):
        detail[key] = _read_document(queue, path, limits[key], _READERS[key])
    if evidence.lease_file:
        detail["holder"] = _holder(queue, job)
    return detail


def _holder(queue: Queue, job: str) -> dict[str, str]:
    """What recover would judge of J's lease holder now (Q-5): ``alive``, ``gone`` (an
    expired lease among the proofs) or ``unknown`` (beyond this host's sight, treated alive),
    and why; ``unreadable`` when the lease names no holder."""
    try:
        lease = read_lease(queue, job)
    except (OSError, CtxError) as exc:
        return {"state": "unreadable", "reason": lease_unreadable(job, exc)}
    verdict = judge(lease)
    return {"state": verdict.state, "reason": verdict.reason}


def _assess(queue: Queue, job: str, evidence: ev.JobEvidence) -> ev.Assessment:
    """The evidence's assessment, as recover would judge it: a claim whose lease cannot be
    read is a conflict, since nobody can tell whether its holder runs (Q-6).

    What looks incomplete or a conflict may be a claim, finish or recover at work, or one
    that ended since the scan (a finish removes the lease the scan saw): J is looked at again
    while no transition holds ``claimed/J``'s lock, as recover does before it acts, and a J
    whose lock is held is reported as where the transition takes it (:func:`_on_its_way`).
    Taking the lock (a shared one) changes nothing, and a transition or recover that meets
    it waits the instant it is held."""
    assessment = _judged(queue, job, evidence)
    if assessment.state not in ("incomplete", "conflict"):
        return assessment
    try:
        claim_fd = queue.open_job_dir("claimed", job)
    except FileNotFoundError:
        claim_fd = None
    except OSError:
        return assessment  # not this user's to open: reported as it looks
    try:
        if claim_fd is not None and not read_lock_dir(claim_fd):
            return _on_its_way(job, evidence, assessment)
        return _judged(queue, job, ev.evidence_of(queue, job))
    finally:
        if claim_fd is not None:
            queue.ops.close(claim_fd)


def _on_its_way(job: str, evidence: ev.JobEvidence, assessment: ev.Assessment) -> ev.Assessment:
    """J, found incomplete while a transition holds ``claimed/J``'s lock, as that transition
    leaves it.  Once J's result is in place the finish has passed the point a crash would
    roll forward from, so J is done (or failed) while the request moves and the claim and
    lease go, never a claim without its lease; before that, a claim is at work or the
    requeue of one is: claimed, on its way."""
    if assessment.state == "incomplete":
        for state in ("done", "failed"):
            if getattr(evidence, f"{state}_result"):
                return ev.Assessment(
                    state,
                    f"finished; the rest of its finish is under way (claimed/{job} is locked)",
                )
    return ev.Assessment(
        "claimed", f"a claim, finish or recover is moving it (claimed/{job} is locked)"
    )


def _judged(queue: Queue, job: str, evidence: ev.JobEvidence) -> ev.Assessment:
    assessment = ev.assess(evidence)
    if assessment.state == "claimed":
        try:
            read_lease(queue, job)
        except (OSError, CtxError) as exc:
            return ev.unreadable_lease(lease_unreadable(job, exc))
    return assessment


def _documents(queue: Queue, e: ev.JobEvidence) -> list[tuple[str, str]]:
    j = e.job
    docs = []
    for present, key, path in (
        (e.pending is not None, "request", f"pending/{j}"),
        (e.claim_request is not None, "request", f"claimed/{j}/{j}"),
        (e.done_request is not None, "request", f"done/{j}"),
        (e.failed_request is not None, "request", f"failed/{j}"),
        (e.lease_file, "lease", f"lease/{j}/{LEASE_FILE}"),
        (e.done_result, "result", f"done/{j}{RESULT_SUFFIX}"),
        (e.failed_result, "result", f"failed/{j}{RESULT_SUFFIX}"),
    ):
        if present and key not in {k for k, _ in docs}:
            docs.append((key, path))
    return docs


def _open_parent(queue: Queue, path: str) -> tuple[int, str, bool]:
    """The directory descriptor holding ``path`` (relative to the queue) and its last name."""
    parts = path.rstrip("/").split("/")
    state_fd = queue.dirs[parts[0]]
    if len(parts) == 2:
        return state_fd, parts[1], False
    return queue.open_job_dir(parts[0], parts[1]), parts[2], True


# How each document is read, as the queue's own readers read it: a request as a claim
# does (a name given twice makes it malformed: readers disagree on which one counts), a
# result one level deeper than a request (it wraps an output), a lease as recover does.
_READERS: dict[str, Callable[[str], Any]] = {
    "request": jsontext.loads_strict,
    "result": lambda text: requests.decode_result(text, unique_names=False),
    "lease": lambda text: jsontext.loads_strict(text, unique_names=False),
}


def _read_document(queue: Queue, path: str, limit: int, read: Callable[[str], Any]) -> Any:
    """The JSON document at ``path``, read up to ``limit`` bytes (what its kind may reach)
    by ``read``; ``{"unreadable": why}`` otherwise."""
    try:
        dir_fd, name, owned = _open_parent(queue, path)
    except OSError as exc:  # its directory went (J moved on: show looks again) or is shut
        return {"unreadable": describe(exc)}
    try:
        data = read_regular_file(dir_fd, name, limit)
        return read(data.decode("utf-8"))
    except jsontext.DuplicateNames as exc:
        return {"unreadable": f"it {jsontext.duplicate_names_problem(exc.names)}"}
    except jsontext.NotAJsonNumber as exc:  # its message is the bare spelling: NaN
        return {"unreadable": f"it {jsontext.not_a_json_number_problem(exc)}"}
    except (CtxError, OSError) as exc:
        return {"unreadable": describe(exc)}
    except ValueError as exc:  # not JSON, or not the document its kind must be
        return {"unreadable": str(exc)}
    finally:
        if owned:
            os.close(dir_fd)


def _describe(queue: Queue, path: str) -> dict[str, Any]:
    try:
        dir_fd, name, owned = _open_parent(queue, path)
    except OSError:
        return {"path": path, "kind": "vanished"}
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return {"path": path, "kind": "vanished"}
    finally:
        if owned:
            os.close(dir_fd)
    return {
        "path": path,
        "kind": kind_of(st),
        "size": st.st_size,
        "mtime": file_time(st.st_mtime_ns),  # None beyond RFC 3339's years
        "inode": st.st_ino,
    }
