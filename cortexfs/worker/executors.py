"""What a worker does with a claimed job: run its tool as the worker's agent (SPEC W-1).

:class:`ToolExecutor` runs the request's ``tool`` with its ``input`` through the tool runner in
native mode — schema validation, the six-step authority chain, hooks, the agent's uid/gid, a
per-job timeout that kills the tool's process group — and turns the :class:`ToolResult` into
the job's outcome: ``done/`` when the tool succeeded, ``failed/`` with the reason (the errno,
the stage, and for a denial the denying step) otherwise.

:class:`ShellExecutor` is the same, restricted to ``shell.exec`` jobs: a worker for shell
commands whose request format is documented in ``workers/README.md``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cortexfs import capabilities, storage, user_namespace
from cortexfs.agents.host import (
    require_host_administrator,
    require_no_groups_beyond,
    session_home_remedy,
)
from cortexfs.agents.view import AgentView
from cortexfs.errors import CtxError, remedy_for_host_trouble
from cortexfs.queue import Claim
from cortexfs.shared.events import EVENTS_FILE
from cortexfs.shared.redact import summarize
from cortexfs.shared.sessions import Session, SessionRef, open_session
from cortexfs.shared.tree import Ownership
from cortexfs.tools import offline
from cortexfs.tools.core.installed import require_this_versions_tools
from cortexfs.tools.result import ToolError
from cortexfs.tools.runner import run_native
from cortexfs.worker.outcome import JobControl, Outcome, failure, host_remedy, reason_of

# Queue transitions (S-5): durable in the session before they are reported or acted on.
DURABLE_TRANSITIONS = frozenset({"queue.claim", "queue.finish"})


def _no_job_claimed(refused: CtxError) -> CtxError:
    return refused.then("no job was claimed")


class ToolExecutor:
    """Run each job's tool as ``agent``, recording the job in the agent's session."""

    def __init__(
        self, root: Path, agent: str, session: str = "worker", queue: Path | None = None
    ) -> None:
        # Whether the tools may run at all depends only on who started the worker: asked
        # once, before any claim, rather than by every job's call after its claim (a worker
        # nobody may run would claim every job only to fail it).
        require_host_administrator(root, "start a worker that runs jobs' tools as an agent")
        view = AgentView.load(root, agent)
        needed = [capabilities.CAP_SETUID, capabilities.CAP_SETGID]
        offline_only = not view.allows("network", "default", "connect")
        if offline_only:
            # Its tools all run offline, in a network namespace a root joins by setns(2).
            needed.append(capabilities.CAP_SYS_ADMIN)
        try:
            capabilities.require(f"a worker that runs the tools of agent {agent}", *needed)
            require_no_groups_beyond(agent, view.identity)
        except CtxError as refused:  # every job would fail so, none by its own fault
            raise _no_job_claimed(refused) from None
        self.root = root
        self.agent = agent
        self.queue = None if queue is None else _where_in_root(queue, root)
        self.session_ref = SessionRef.home(root, view.identity.uid, agent, session)
        owner = Ownership(view.identity.uid, view.identity.gid)
        self.session: Session = _open_worker_session(self.session_ref, owner)
        self._running: dict[str, int] = {}
        try:
            if os.geteuid() == 0:  # as the runner asks once the session is open
                user_namespace.require_setgroups(f"run the tools of agent {agent}")
            if offline_only:
                offline.require_possible()  # a seccomp filter may refuse what capabilities allow
        except CtxError as refused:
            self.session.close()
            raise _no_job_claimed(refused) from None

    def close(self) -> None:
        self.session.close()

    def record(self, event: str, job: str, status: str, **facts: Any) -> None:
        """A queue transition in the worker's session.

        The transitions, ``queue.claim`` and ``queue.finish``, are fsynced before the worker
        reports them or acts on them (S-5): the claim before the job is announced and its tool
        started, the finish before the job is reported done.  ``queue.start`` is no transition;
        the fsync of the ``tool_result`` after it makes it durable too.
        """
        # The object is the job as the queue names it (S-2); ``queue`` says which queue, so
        # that the jobs of two projects one agent works, named alike, are told apart.
        where = {} if self.queue is None else {"queue": self.queue}
        self.session.record(
            event,
            object=f"queue/{job}",
            status=status,
            durable_event=event in DURABLE_TRANSITIONS,
            **where,
            **facts,
        )

    @property
    def session_file(self) -> Path:
        return self.session_ref.path / EVENTS_FILE

    def abort_running(self) -> None:
        """Kill the process group of every tool still running (a second SIGINT)."""
        for job in list(self._running):
            self.abort_job(job)

    def abort_job(self, job: str) -> None:
        """Kill the process group of ``job``'s tool, if it runs (its lease could not be kept:
        it must not run on once the lease lapses)."""
        pgid = self._running.get(job)
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)

    def accepts(self, request: Mapping[str, Any]) -> bool:
        """Every job is this executor's to claim (and to fail, when it cannot run it)."""
        return True

    def refusal(self, job: Claim) -> str | None:
        """Why this executor refuses the job's request (EINVAL) before running anything."""
        return job.invalid_reason  # it names the stored request and what is wrong with it

    def __call__(self, job: Claim, control: JobControl) -> Outcome:
        tool, input_value = job.request.get("tool"), job.request.get("input", {})
        refusal = self.refusal(job)
        if refusal is not None:
            refused = failure(ToolError(errno.EINVAL, "request", refusal))
            # The tool and the reason quote the stored request, which is anyone's to write:
            # summarised by the log rule (S-4), as a call's input is.
            self.record(
                "queue.refuse",
                job.job,
                "error",
                tool=summarize(tool),
                reason=summarize(refused.reason),
            )
            return refused
        self.record("queue.start", job.job, "ok", tool=tool)

        pgid: int | None = None

        def observe(frame: dict[str, Any]) -> None:
            nonlocal pgid
            if frame.get("type") == "call":
                # The tool leads a process group of its own: its pid is the group id.
                pgid = self._running[job.job] = int(frame["pid"])
                if control.stopped():  # aborted, given up or taken before the tool was known
                    self.abort_job(job.job)

        try:
            result = run_native(
                self.root,
                self.agent,
                str(tool),
                input_value,
                session=self.session_ref,
                timeout=control.timeout,
                observer=observe,
                interrupted=control.stopped,
                may_start=control.may_start,
                job=job.job,
            )
        finally:
            # Only this call's: a later claim of the job may run its own tool by now.
            if pgid is not None and self._running.get(job.job) == pgid:
                del self._running[job.job]
        details: dict[str, Any] = {
            "tool": result.tool,
            "agent": result.agent,
            "session": result.session,
            "call": result.call,
            "exit_status": result.exit_status,
            "error": None if result.error is None else result.error.to_json(),
            "stderr": result.stderr[-4096:],
            "post_hooks": list(result.post_hooks),  # a job done all the same (T-6)
            "timings_ms": result.timings,
        }
        reason = None if result.error is None else reason_of(result.error)
        unrecorded = None if result.record_error is None else result.record_error.errno
        interrupted = result.error is not None and result.error.errno == errno.EINTR
        return Outcome(
            result.ok,
            result.output,
            reason,
            details,
            unrecorded,
            interrupted=interrupted and control.stopped(),
        )


class ShellExecutor(ToolExecutor):
    """Only ``shell.exec`` jobs: ``{"tool": "shell.exec", "input": {"cmd": "..."}}``.  Jobs of
    other tools stay pending for the workers that run them (a project's queue is shared)."""

    def accepts(self, request: Mapping[str, Any]) -> bool:
        return request.get("tool") == "shell.exec"

    def refusal(self, job: Claim) -> str | None:
        # A request that is not valid names no tool: say that, not "not None".
        malformed = super().refusal(job)
        if malformed is None and job.request.get("tool") != "shell.exec":
            return f"this worker runs shell.exec jobs only, not {job.request.get('tool')!r}"
        return malformed


NO_AGENT = (
    "this worker was started without --agent or CTX_AGENT, so it has no agent identity; "
    "a job's tool runs only as an agent, under that agent's policy (W-1); start the worker "
    "with --agent NAME"
)


class AgentlessExecutor:
    """A worker with no agent identity: every job it claims is refused by the authority
    chain's first question, *as whom?*, and finished in ``failed/`` with EACCES (W-1).

    Nothing runs and there is no agent session to record in; the job's result holds the
    reason.
    """

    def close(self) -> None:
        pass

    def record(self, event: str, job: str, status: str, **facts: Any) -> None:
        pass

    def accepts(self, request: Mapping[str, Any]) -> bool:
        return True  # claimed to be refused: W-1's reason is recorded in each result

    def abort_running(self) -> None:
        pass

    def abort_job(self, job: str) -> None:
        pass

    @property
    def session_file(self) -> None:
        return None  # no agent, no session

    def __call__(self, job: Claim, control: JobControl) -> Outcome:
        return failure(ToolError(errno.EACCES, "authorize", NO_AGENT))


def _open_worker_session(ref: SessionRef, owner: Ownership) -> Session:
    """The worker's session, created as the agent's when missing; a refusal names the
    session's directory, what the kernel refused and what to do, not only the component the
    kernel refused.  Nothing is claimed before it is open."""
    home = ref.root / "home" / str(owner.uid)
    try:
        # Long-lived: an events.jsonl renamed away is followed, so that the queue's events
        # stay beside the tool calls', which each call records by the name.
        return open_session(ref, owner=owner, follow_rotation=True)
    except CtxError as exc:  # said in full already (an id a user namespace does not map)
        raise CtxError(
            exc.errno,
            f"cannot open the worker's session {ref.path}: {exc.message}; no job was claimed",
        ) from None
    except OSError as exc:
        refused = f": {os.fsdecode(exc.filename)}" if isinstance(exc.filename, str | bytes) else ""
        said = f"cannot open the worker's session {ref.path} ({exc.strerror}{refused})"
        raise CtxError(
            exc.errno or errno.EIO,
            f"{said}; no job was claimed: {_session_remedy(exc.errno, home, owner.uid)}, then "
            "start the worker again",
        ) from None


def _session_remedy(code: int | None, home: Path, uid: int) -> str:
    """What lets a worker open its session after ``code``: ownership only for a permission
    refusal of a worker not run as root (one run as root creates what is missing, for any
    uid); root refused EPERM meets a file's attribute (immutable, append-only)."""
    if code == errno.EPERM and os.geteuid() == 0:
        return host_remedy(code)
    if code in (errno.EACCES, errno.EPERM):
        return session_home_remedy(home, uid, "the worker records every job", "start it")
    refused = os.strerror(code or errno.EIO)
    # A quota is charged to the uid that creates the files, this process's: root, which gives
    # what it creates to the agent, is exempt from quota limits.
    remedy = remedy_for_host_trouble(code, uid=os.geteuid())
    return remedy or f"fix what refused it ({refused})"


def _where_in_root(queue: Path, root: Path) -> str:
    """The queue's path from the storage root (``shared/ml/queue``), else as given: a queue
    named through a link to the root (``storage/current``), or a bind mount of it, is the
    same queue as one named without it (:func:`~cortexfs.storage.place_in_root`)."""
    place = storage.place_in_root(root, queue)
    return str(queue) if place is None else place.as_posix()


def executor_for(
    kind: str, root: Path, agent: str | None, session: str, queue: Path | None = None
) -> ToolExecutor | AgentlessExecutor:
    """The executor of a worker kind: ``tool`` (any tool) or ``shell`` (shell.exec only);
    with no agent, one that refuses every job (:class:`AgentlessExecutor`).  EINVAL when
    the root's core tools are not this version's (:func:`~cortexfs.tools.core.installed.
    require_this_versions_tools`): they run only after 'ctx bootstrap'."""
    kinds = {"tool": ToolExecutor, "shell": ShellExecutor}
    if kind not in kinds:
        raise CtxError(22, f"unknown worker kind {kind!r}; choose one of {', '.join(kinds)}")
    if agent is None:
        return AgentlessExecutor()
    # Core tools an older bootstrap copied may read the runner's context in another shape and
    # fail every job: refused here, before any claim, rather than each job moved to failed/.
    require_this_versions_tools(root, "the worker claimed no job")
    _require_startable_tools(root, agent)
    return kinds[kind](root, agent, session, queue)


def _require_startable_tools(root: Path, agent: str) -> None:
    """E2BIG before any claim when no tool of ``agent`` could be started: its ``CTX_PATH`` or
    ``CTX_MOUNTS`` is more than the kernel passes in one variable (thousands of spaces in its
    policy), and every job would otherwise be claimed and moved to failed/ for it."""

    try:
        view = AgentView.load(root, agent)
    except CtxError:
        return  # the agent's own trouble: each call reports it, as before
    too_big = view.too_big_to_start(
        view.tool_environment(tool="", session="", call="", mode="native")
    )
    if too_big is not None:
        raise too_big.then("the worker claimed no job")
