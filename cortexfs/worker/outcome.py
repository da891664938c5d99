"""What a worker's executor is given and gives back for one job (SPEC §3, W-1, W-4): the
job's :class:`JobControl` (its deadline, the signals that stop it), the :class:`Outcome` of
its execution, and how a failure and a host's refusal are told.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cortexfs.errors import DISK_ERROR_REMEDY, HOST_SHORTAGES, remedy_for_host_trouble
from cortexfs.queue import Claim
from cortexfs.tools.result import ToolError


@dataclass
class Outcome:
    """What an execution produced: success, the output, and facts for the result file."""

    ok: bool
    output: Any = None
    reason: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    # The errno with which the host refused to record the call (the session or the tool's log
    # on a full or read-only disk…), whether or not the call had failed already.
    unrecorded: int | None = None
    # Whether the tool was killed because the worker was aborted or the job given up: its
    # outcome is not the tool's.
    interrupted: bool = False


# What the host refuses, not a job: a shortage (HOST_SHORTAGES), a read-only filesystem, a file
# or directory that is immutable (EPERM even for root) or whose mode leaves the worker out, a
# failing disk.  A job that meets one of them is no more the job's failure than a full disk.
HOST_REFUSALS = HOST_SHORTAGES | {errno.EROFS, errno.EPERM, errno.EACCES, errno.EIO}


def host_remedy(code: int | None) -> str:
    """What mends the host refusal ``code`` (:data:`HOST_REFUSALS`), for a stop message."""
    worker_refusals = {
        errno.EPERM: "make it writable again (an immutable or append-only attribute shows in "
        "'lsattr' and goes with 'chattr -i -a')",
        errno.EACCES: "give the worker's user write access to it (its mode, owner or ACL)",
        errno.EIO: DISK_ERROR_REMEDY,
    }
    code = code or errno.EIO
    # The queue's and the session's files are this process's, and so is the quota they count
    # against.
    remedy = remedy_for_host_trouble(code, uid=os.geteuid())
    return remedy or worker_refusals.get(code, "fix the cause")


def failure(error: ToolError, details: Mapping[str, Any] | None = None) -> Outcome:
    """A job failed by ``error``: its ``reason`` (:func:`reason_of`) and its ``error`` object,
    the one shape every failed result has (the tool runner's, docs/tools.md), over the other
    facts in ``details``."""
    return Outcome(False, None, reason_of(error), {**(details or {}), "error": error.to_json()})


def reason_of(error: ToolError) -> str:
    """A failed job's ``reason``: ``EACCES: step 6 (tool/model policy): … [authorize]`` — the
    errno when there is one, the sentence, the stage."""
    return f"{error} [{error.stage}]"


class JobControl:
    """Handed to the executor: the job's deadline, the worker's abort signal (a second
    SIGINT) and the job's own (its lease could not be kept:
    :class:`~cortexfs.worker.lease_keeper.LeaseKeeper`)."""

    def __init__(
        self,
        timeout: float,
        abort: threading.Event,
        claimed_at: float | None = None,
        may_start: Callable[[], str | None] | None = None,
    ) -> None:
        self.timeout = timeout
        self.abort = abort
        self.claimed_at = claimed_at  # which claim of the job this is (its lease's claimed_at)
        self.may_start = may_start  # asked just before the tool starts: why not, or None
        self.given_up = threading.Event()
        self.taken = threading.Event()  # its claim was lost: requeued, perhaps claimed again
        self.finishing = False  # set once the execution returned and the finish began

    def stopped(self) -> bool:
        """Whether the job's tool is to be killed, or never started."""
        return self.abort.is_set() or self.given_up.is_set() or self.taken.is_set()


class Executor(Protocol):
    """Runs claimed jobs, records queue transitions in its session, can kill what it runs."""

    def __call__(self, job: Claim, control: JobControl) -> Outcome: ...

    def record(self, event: str, job: str, status: str, **facts: Any) -> None: ...

    def abort_running(self) -> None: ...

    def abort_job(self, job: str) -> None:
        """Kill what runs for ``job`` (its lease could not be kept)."""
        ...

    @property
    def session_file(self) -> Path | None:
        """Where the executor records the jobs (``events.jsonl``), for messages."""
        ...

    def accepts(self, request: Mapping[str, Any]) -> bool:
        """Whether to claim a pending job with this request at all (others stay pending)."""
        ...
