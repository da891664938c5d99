"""What is on disk for each job, and what state that evidence means (SPEC §2.1, Q-6, Q-8).

:func:`scan` walks the six directories once (``scandir`` on the open descriptors, nothing
followed) and gathers, per job name, which pieces of evidence exist; everything that is not
evidence — illegal names, dot-files, symlinks, FIFOs, directories where files belong — is
listed as *ignored* with the reason (Q-8).  :func:`assess` turns one job's evidence into its
state: one of the four durable states, an *incomplete pair* that ``recover --reconcile`` may
complete without losing or duplicating work, or a *conflict* left to a human.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cortexfs.errors import CtxError, errno_text
from cortexfs.names import is_job_name, job_name_problem
from cortexfs.queue.layout import (
    LEASE_FILE,
    RESULT_SUFFIX,
    TEMP_SUFFIX,
    Queue,
    kind_of,
    lstat_at,
    read_regular_file,
)
from cortexfs.queue.requests import decode_result, stored_result_limit

# The states a job can be in, in the order status reports them.
STATES = ("pending", "claimed", "done", "failed", "incomplete", "conflict")
IGNORED = "ignored"  # what assess() says of a name whose only entries are not queue files

# Repairs that `recover --reconcile` may apply to an incomplete pair.
REQUEUE_UNLEASED = "requeue-unleased"  # claimed/J/J without a lease: execution never started
ROLL_FORWARD = "roll-forward"  # a result with the request still in claimed/: the job ran
DROP_CLAIM_COPY = "drop-claim-copy"  # claimed/J/J is a second link of pending/J or the terminal J
REMOVE_ORPHANS = "remove-orphans"  # an empty claimed/J, a lease/J with no claimed request

REGULAR_FILE = "regular file"

# The order status and recover list ignored entries in: the way a job moves, staging last.
_SCAN_ORDER = ("pending", "claimed", "lease", "done", "failed", "inbox")


@dataclass
class Ignored:
    path: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


@dataclass
class Temp:
    """An entry of ``inbox/``: a temp file, or what was planted at a temp file's name."""

    name: str
    age: float
    kind: str = REGULAR_FILE

    @property
    def job(self) -> str | None:
        return temp_job(self.name)


def temp_job(name: str) -> str | None:
    """The job a staging name of ``inbox/`` belongs to, or None when it is no staging name.

    Temp names are J.<step>[.<random>].tmp, and J itself may hold ".req.json.": the job's
    name ends at the last one."""
    head, dot, _ = name.rpartition(".req.json.")
    job = head + ".req.json"
    return job if dot and name.endswith(TEMP_SUFFIX) and is_job_name(job) else None


@dataclass
class JobEvidence:
    """Which pieces of evidence exist for one job (inode numbers where links may be shared)."""

    job: str
    pending: int | None = None
    claim_dir: bool = False
    claim_request: int | None = None
    lease_dir: bool = False
    lease_file: bool = False
    done_request: int | None = None
    done_result: bool = False
    failed_request: int | None = None
    failed_result: bool = False
    bad: list[str] = field(default_factory=list)
    # Why a result found (done/J.result, failed/J.result) cannot be one a finish wrote.
    unproven_result: str = ""

    def paths(self) -> list[str]:
        """Every piece of evidence, as paths relative to the queue."""
        j = self.job
        found = [
            (self.pending is not None, f"pending/{j}"),
            (self.claim_dir, f"claimed/{j}/"),
            (self.claim_request is not None, f"claimed/{j}/{j}"),
            (self.lease_dir, f"lease/{j}/"),
            (self.lease_file, f"lease/{j}/{LEASE_FILE}"),
            (self.done_request is not None, f"done/{j}"),
            (self.done_result, f"done/{j}{RESULT_SUFFIX}"),
            (self.failed_request is not None, f"failed/{j}"),
            (self.failed_result, f"failed/{j}{RESULT_SUFFIX}"),
        ]
        return [path for present, path in found if present] + self.bad


@dataclass(frozen=True)
class Assessment:
    """A job's state; for incomplete pairs, the repair that completes them."""

    state: str
    detail: str
    repair: str | None = None

    def to_json(self) -> dict[str, str | None]:
        return {"state": self.state, "detail": self.detail, "repair": self.repair}


def unreadable_lease(reason: str) -> Assessment:
    """A claimed job whose lease cannot be read (``reason`` says why): a conflict, since nobody
    can tell whether its holder runs (Q-6).  ``status`` and ``recover`` both say so."""
    return Assessment(
        "conflict",
        f"claimed, but {reason}; nobody can tell whether its holder is alive: repair the "
        "lease by hand, never remove it (a claim without a lease counts as never run, and is "
        "requeued to run again)",
    )


@dataclass
class Scan:
    jobs: dict[str, JobEvidence] = field(default_factory=dict)
    ignored: list[Ignored] = field(default_factory=list)
    temps: list[Temp] = field(default_factory=list)

    def job(self, name: str) -> JobEvidence:
        evidence = self.jobs.get(name)
        if evidence is None:
            evidence = self.jobs[name] = JobEvidence(name)
        return evidence


def _kind(entry: os.DirEntry[str]) -> str | None:
    """What kind of entry a listing gave; None for one removed since: the readers list
    without the queue's locks, beside writers that move and unlink."""
    if entry.is_symlink():
        return "symlink"
    if entry.is_dir(follow_symlinks=False):
        return "directory"
    if entry.is_file(follow_symlinks=False):
        return REGULAR_FILE
    try:
        mode = entry.stat(follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def _name_reason(name: str) -> str:
    if name.startswith("."):
        return "dot-file"
    return f"illegal job name: {job_name_problem(name)}"


def scan(queue: Queue) -> Scan:
    """Gather the evidence of every job in one pass."""
    result = Scan()
    _scan_pending(queue, result)
    _scan_job_dirs(queue, result, "claimed")
    _scan_job_dirs(queue, result, "lease")
    _scan_terminal(queue, result, "done")
    _scan_terminal(queue, result, "failed")
    _scan_inbox(queue, result)
    # Listed in a stable order, not the directory's: state by state, then by path.
    order = {state: n for n, state in enumerate(_SCAN_ORDER)}
    result.ignored.sort(key=lambda i: (order.get(i.path.split("/", 1)[0], len(order)), i.path))
    return result


def _entries(dir_fd: int) -> list[os.DirEntry[str]]:
    with os.scandir(dir_fd) as it:
        return list(it)


def _scan_pending(queue: Queue, result: Scan) -> None:
    for entry in _entries(queue.pending):
        if not is_job_name(entry.name):
            result.ignored.append(Ignored(f"pending/{entry.name}", _name_reason(entry.name)))
        elif not entry.is_file(follow_symlinks=False):
            kind = _kind(entry)
            if kind is None:
                continue  # removed since the listing: evidence of nothing
            path = f"pending/{entry.name}"
            result.ignored.append(Ignored(path, f"a {kind}, not a request file"))
            result.job(entry.name).bad.append(path)
        else:
            result.job(entry.name).pending = entry.inode()


def _scan_job_dirs(queue: Queue, result: Scan, state: str) -> None:
    """``claimed/J/J`` or ``lease/J/worker``: a directory per job holding one regular file."""
    for entry in _entries(queue.dirs[state]):
        path = f"{state}/{entry.name}"
        if not is_job_name(entry.name):
            result.ignored.append(Ignored(path, _name_reason(entry.name)))
            continue
        evidence = result.job(entry.name)
        if not entry.is_dir(follow_symlinks=False):
            kind = _kind(entry)
            if kind is None:
                continue  # removed since the listing
            # Never followed; and J's other evidence cannot be judged without this piece, so
            # J is a conflict rather than a candidate for a repair.
            result.ignored.append(Ignored(path, f"a {kind}, not a {state} directory"))
            evidence.bad.append(path)
            continue
        try:
            job_fd = queue.open_job_dir(state, entry.name)
        except FileNotFoundError:
            continue  # removed while we looked
        except OSError as exc:
            # Swapped for a symlink since the listing (ELOOP, ENOTDIR), or not ours to read
            # (EACCES): what it holds is unknown, so nothing about J may be decided from it.
            result.ignored.append(Ignored(path, f"cannot be read: {errno_text(exc)}"))
            evidence.bad.append(path)
            continue
        try:
            _take_job_dir(evidence, state, job_fd, _listed_inode, result.ignored)
        finally:
            os.close(job_fd)


def _listed_inode(entry: os.DirEntry[str]) -> int:
    return entry.inode()


def _looked_up_inode(entry: os.DirEntry[str]) -> int:
    return entry.stat(follow_symlinks=False).st_ino


def _take_job_dir(
    evidence: JobEvidence,
    state: str,
    job_fd: int,
    inode_of: Callable[[os.DirEntry[str]], int],
    ignored: list[Ignored] | None = None,
) -> None:
    """Record what ``state/J/`` (open as ``job_fd``) holds: its one expected regular file
    (``claimed/J/J``, ``lease/J/worker``), and anything else there as evidence of the wrong
    kind, which makes J a conflict (Q-6), also added to ``ignored`` when given.  ``status``,
    ``show`` and ``recover`` judge a job from this one reading, so none of them takes a job
    for a repair that another calls a conflict.

    Entries are classified before the descriptor is closed: an entry of a listing made
    through a descriptor looks itself up through that descriptor again (a FIFO's kind, or
    any kind on a filesystem whose listings carry none).  ``inode_of`` reads the request's
    inode number as the rest of J's evidence was read (:func:`_listed_inode` by
    :func:`scan`, :func:`_looked_up_inode` by :func:`evidence_of`): they are compared, and
    a listing's number may differ from a lookup's (overlayfs).
    """
    path = f"{state}/{evidence.job}"
    if state == "claimed":
        evidence.claim_dir = True
    else:
        evidence.lease_dir = True
    expected = LEASE_FILE if state == "lease" else evidence.job
    for entry in sorted(_entries(job_fd), key=lambda entry: entry.name):
        inner_path = f"{path}/{entry.name}"
        kind = _kind(entry)
        try:
            inode = inode_of(entry) if kind == REGULAR_FILE else None
        except FileNotFoundError:
            kind = None
        if kind is None:
            continue  # moved on since the listing (a finish, a requeue): no longer here
        if entry.name != expected:
            reason = f"unexpected entry in {path}/"
        elif kind != REGULAR_FILE:
            reason = f"a {kind}, not a regular file"
        elif state == "claimed":
            evidence.claim_request = inode
            continue
        else:
            evidence.lease_file = True
            continue
        if ignored is not None:
            ignored.append(Ignored(inner_path, reason))
        evidence.bad.append(inner_path)


def _scan_terminal(queue: Queue, result: Scan, state: str) -> None:
    for entry in _entries(queue.dirs[state]):
        name = entry.name
        is_result = name.endswith(RESULT_SUFFIX)
        job = name[: -len(RESULT_SUFFIX)] if is_result else name
        path = f"{state}/{name}"
        if not is_job_name(job):
            result.ignored.append(Ignored(path, _name_reason(name)))
        elif not entry.is_file(follow_symlinks=False):
            kind = _kind(entry)
            if kind is None:
                continue  # removed since the listing
            result.ignored.append(Ignored(path, f"a {kind}, not a regular file"))
            result.job(job).bad.append(path)
        elif is_result:
            evidence = result.job(job)
            setattr(evidence, f"{state}_result", True)
            # Only a result beside a claimed request (claimed/ is scanned first) is taken as
            # proof of a run, by a roll-forward; the rest cost no lstat of a large done/.
            if evidence.claim_request is not None:
                with contextlib.suppress(FileNotFoundError):  # gone since the listing
                    found = entry.stat(follow_symlinks=False)
                    evidence.unproven_result = _unproven(
                        queue, queue.dirs[state], state, job, found
                    )
        else:
            setattr(result.job(job), f"{state}_request", entry.inode())


def scan_inbox(queue: Queue) -> list[Temp]:
    """The temp files in ``inbox/`` with their ages, by name."""
    result = Scan()
    _scan_inbox(queue, result)
    return result.temps


def _scan_inbox(queue: Queue, result: Scan) -> None:
    now = time.time()
    for entry in _entries(queue.inbox):
        path = f"inbox/{entry.name}"
        kind = _kind(entry)
        if kind is None:
            continue  # published or removed since the listing
        # A symlink (or FIFO, socket...) at a staging name holds that name as a dead
        # publisher's temp file does (J.publish.tmp is created O_EXCL), so it is a stray
        # temp too: recover --reconcile removes it after the grace period, and unlinking a
        # name never follows it.  A directory is never removed.
        staged = kind != "directory" and temp_job(entry.name) is not None
        if kind != REGULAR_FILE and not staged:
            result.ignored.append(Ignored(path, f"a {kind} in the staging directory"))
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue
        # Dated by its mtime, unless that lies after its ctime: the file's owner may date it
        # in 2100 (touch -d) and so hold J's name for ever, but not its ctime, which that
        # touch, like every write, sets to now.
        age = now - min(st.st_mtime, st.st_ctime)
        result.temps.append(Temp(entry.name, age, kind))
    result.temps.sort(key=lambda t: t.name)


def evidence_of(queue: Queue, job: str) -> JobEvidence:
    """The evidence of one job by direct lookups (no listing but of J's own ``claimed/J/``
    and ``lease/J/``), as :func:`scan` finds it."""
    evidence = JobEvidence(job)

    def regular(dir_fd: int, name: str, path: str) -> os.stat_result | None:
        st = lstat_at(dir_fd, name)
        if st is None:
            return None
        if not stat.S_ISREG(st.st_mode):
            evidence.bad.append(path)
            return None
        return st

    def inode(st: os.stat_result | None) -> int | None:
        return None if st is None else st.st_ino

    def job_dir(state: str) -> None:
        st = lstat_at(queue.dirs[state], job)
        if st is None:
            return
        if not stat.S_ISDIR(st.st_mode):
            evidence.bad.append(f"{state}/{job}")  # as scan() sees it: never followed
            return
        try:
            job_fd = queue.open_job_dir(state, job)
        except FileNotFoundError:
            return
        except OSError:
            evidence.bad.append(f"{state}/{job}")  # swapped for a symlink, or unreadable
            return
        try:
            _take_job_dir(evidence, state, job_fd, _looked_up_inode)
        finally:
            os.close(job_fd)

    evidence.pending = inode(regular(queue.pending, job, f"pending/{job}"))
    job_dir("claimed")
    job_dir("lease")
    for state in ("done", "failed"):
        dir_fd = queue.dirs[state]
        setattr(evidence, f"{state}_request", inode(regular(dir_fd, job, f"{state}/{job}")))
        path = f"{state}/{job}{RESULT_SUFFIX}"
        if (found := regular(dir_fd, job + RESULT_SUFFIX, path)) is not None:
            setattr(evidence, f"{state}_result", True)
            if evidence.claim_request is not None:  # what assess judges it for, as in scan
                evidence.unproven_result = _unproven(queue, dir_fd, state, job, found)
    return evidence


def _unproven(queue: Queue, dir_fd: int, state: str, job: str, st: os.stat_result) -> str:
    """Why the result ``state/J.result`` cannot be one a finish wrote, or "": larger than
    any finish stores (``max_result_bytes``), or not a result object of §2.1 whose status
    is the one its directory holds (``ok`` in done/, ``error`` in failed/), it is something
    else put there, and proves nothing of J's run."""
    path = f"{state}/{job}{RESULT_SUFFIX}"
    nothing = f"so it proves nothing of the run of {job}"
    limit = stored_result_limit(queue.config.max_result_bytes)
    if st.st_size > limit:
        return (
            f"{path} is {st.st_size} bytes, more than any finish writes ({limit}, after "
            f"max_result_bytes), {nothing}"
        )
    try:
        result = decode_result(read_regular_file(dir_fd, job + RESULT_SUFFIX, limit))
    except FileNotFoundError:
        return ""  # gone since it was listed: nothing to judge
    except (OSError, CtxError, ValueError) as exc:
        return f"{path} cannot be read as a result ({exc}), {nothing}"
    wanted = "ok" if state == "done" else "error"
    if not isinstance(result, dict) or result.get("status") != wanted:
        return (
            f"{path} is not a result object with status {wanted!r}, as a finish writes in "
            f"{state}/, {nothing}"
        )
    return ""


def no_job_but(queue: Queue, job: str) -> list[str]:
    """The entries at J's name when none of them is a queue file (a directory in
    ``pending/``, a FIFO at ``lease/J``…): J is then no job, only names ``status`` lists as
    ignored (Q-8), which a command acting on J must say so instead of calling them a job,
    a lease or a conflict; empty when J has evidence of its own, or nothing at all."""
    evidence = evidence_of(queue, job)
    return evidence.bad if assess(evidence).state == IGNORED else []


def no_job_here(queue: Queue, job: str, entries: list[str]) -> str:
    """What stands at J's name when it is :func:`no_job_but` those ``entries``, each with
    its kind (a directory, a FIFO…)."""
    shown = []
    for entry in entries:
        try:
            found = os.lstat(entry, dir_fd=queue.root_fd)
        except OSError:
            shown.append(entry)  # gone since: named as it was found
        else:
            shown.append(f"{entry} ({kind_of(found)})")
    return (
        f"{' and '.join(shown)} {'is' if len(shown) == 1 else 'are'} no queue file (the wrong "
        f"kind of entry, never followed or moved), so {job} is no job: 'ctx queue status' "
        "lists it as ignored"
    )


def assess(e: JobEvidence) -> Assessment:
    """The state of one job from its evidence (SPEC §2.1 and the Q-6 reconciliation table)."""
    has_claim = e.claim_request is not None
    orphans = (e.claim_dir or e.lease_dir or e.lease_file) and not has_claim
    done = e.done_request is not None or e.done_result
    failed = e.failed_request is not None or e.failed_result
    if e.bad:
        if not (e.pending is not None or e.claim_dir or e.lease_dir or done or failed):
            # Nothing of J but entries that are not queue files: not a job at all.
            return Assessment(IGNORED, "not a job: wrong kind of entry: " + ", ".join(e.bad))
        return Assessment(
            "conflict",
            "evidence of the wrong kind, ignored and never followed or moved: " + ", ".join(e.bad),
        )
    if done and failed:
        return Assessment("conflict", "both done and failed evidence")
    if done or failed:
        return _assess_terminal(e, "done" if done else "failed", has_claim, orphans)
    if e.pending is not None:
        if has_claim:
            if e.claim_request == e.pending:
                return Assessment(
                    "incomplete",
                    "claimed/J/J is a second link of pending/J (a move was interrupted)",
                    DROP_CLAIM_COPY,
                )
            return Assessment("conflict", "both pending and claimed, as different files")
        if orphans:
            return Assessment(
                "incomplete", "pending, with a leftover claim or lease", REMOVE_ORPHANS
            )
        return Assessment("pending", "waiting to be claimed")
    if has_claim:
        if e.lease_file:
            return Assessment("claimed", "claimed and leased")
        return Assessment(
            "incomplete", "claimed without a lease: execution never started", REQUEUE_UNLEASED
        )
    if orphans:
        return Assessment(
            "incomplete", "an empty claim directory or a lease with no request", REMOVE_ORPHANS
        )
    return Assessment("conflict", "no evidence")


def _assess_terminal(e: JobEvidence, state: str, has_claim: bool, orphans: bool) -> Assessment:
    request = e.done_request if state == "done" else e.failed_request
    result = e.done_result if state == "done" else e.failed_result
    if e.pending is not None:
        return Assessment("conflict", f"both pending and {state}")
    if request is not None and result:
        if has_claim:
            if e.claim_request == request:
                return Assessment(
                    "incomplete",
                    f"claimed/J/J is a second link of {state}/J (finish was interrupted)",
                    DROP_CLAIM_COPY,
                )
            return Assessment("conflict", f"both claimed and {state}, as different files")
        if orphans:
            return Assessment(
                "incomplete", f"{state}, with a leftover claim or lease", REMOVE_ORPHANS
            )
        return Assessment(state, "finished")
    if result and has_claim and e.unproven_result:
        return Assessment(
            "conflict", f"claimed, beside a result that is not one: {e.unproven_result}"
        )
    if result and has_claim:
        return Assessment(
            "incomplete",
            f"{state}/J{RESULT_SUFFIX} exists but the request is still in claimed/ "
            "(finish was interrupted after the result)",
            ROLL_FORWARD,
        )
    if result:
        return Assessment("conflict", f"{state}/J{RESULT_SUFFIX} exists but the request is nowhere")
    return Assessment("conflict", f"{state}/J exists without its result")
