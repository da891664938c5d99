"""The tool runner: one call of one tool by one agent, through the whole chain (SPEC T-3..T-7).

A call passes these stages in order; the first that refuses ends it, and the result names
that stage (and, for the authority chain, the denying step):

=========  ===================================================================================
caller     the call's own arguments hold (a timeout is seconds; a relative root is made
           absolute); only the host administrator — root, or the owner of the storage root —
           may run a tool as an agent: nobody else can claim an agent identity
agent      the agent exists and has an identity
authorize  for a caller of another uid than the agent's, step 1 of the chain alone: only
           root runs a tool as another uid, and one refused so makes no session in the
           agent's home, which would be the caller's own (S-1)
session    the session is opened; ``tool_call`` is recorded.  The call writes its events
           there, so a session in a shared space needs ``shared:<space> write`` through the
           whole authority chain (S-6, X-1), checked before anything is created
resolve    the tool is on the agent's ``CTX_PATH`` (T-4) as an executable file (an ``x`` bit
           at all: whether it is the agent's is step 2 of the chain); its controls are
           intact; its status is ``available``
schema     native mode: the input satisfies the tool's ``schema`` (EINVAL otherwise)
authorize  the six-step authority chain for ``tool:<name> execute`` (P-5, P-6)
hook       ``hooks/pre.d/*`` in name order; a non-zero exit vetoes (T-6)
output     native mode: the observer took the ``call`` frame (see :func:`run_native`)
run        the tool runs under the agent's uid, gid and groups in a process group of its own,
           bounded by a timeout; then ``hooks/post.d/*`` see the result, and ``tool_result``
           is recorded durably in the session and in ``<tool>.d/log`` (S-5, T-7)
=========  ===================================================================================

Two modes, one chain (T-3): :func:`run_native` feeds the input as JSON on stdin, captures the
output and reports progress as frames; :func:`run_terminal` keeps the argv and lends the
tool the caller's stdin, stdout and stderr.  Terminal mode validates no schema: an argv is
not JSON, and the tool judges its own arguments (tsh never rejects an empty argv for it).

The runner reads a tool's controls between two looks at its executable and at its commit
marker; if a reinstall replaced the executable in between, or was between its two swaps, it
reads again (:mod:`cortexfs.tools.pairs` never shows an executable without complete controls,
and marks the moment the two may be of different versions).  Once the call is admitted the
executable is looked at once more: a reinstall since the controls were read (while the chain
and the pre-hooks ran) has the call admitted again, by the new version's controls, so that a
call is never judged by one version's schema and ``cap`` and run as the next one's program.
What is executed is the file the name holds at exec time, a moment later; a reinstall within
that moment runs a version installed by the same lifecycle, governed by the same policy.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, NamedTuple

from cortexfs import capabilities, jsontext, user_namespace
from cortexfs.absolute_paths import absolute
from cortexfs.agents.host import (
    only_root_runs_as_another,
    require_host_administrator,
    require_no_groups_beyond,
    session_home_remedy,
)
from cortexfs.agents.projection import RecentDecisions
from cortexfs.agents.view import AgentView
from cortexfs.errors import (
    CtxError,
    denied,
    describe,
    invalid,
    not_found,
    out_of_memory,
    remedy_for_host_trouble,
)
from cortexfs.interrupts import Stopped
from cortexfs.jsontext import dumps_utf8
from cortexfs.policy import Credentials, caller_refusal, check_authority, check_tool_execute
from cortexfs.policy.chain import AuthorityRequest, Decision, Step
from cortexfs.process_limits import no_process_could_be_made
from cortexfs.shared.sessions import Session, SessionRef, open_session
from cortexfs.shared.tree import Ownership
from cortexfs.timefmt import MAX_SECONDS, is_seconds, rfc3339
from cortexfs.tools import hooks, record
from cortexfs.tools.commit_marker import file_identity, read_one_version
from cortexfs.tools.controls import (
    ToolControls,
    ToolObject,
    damaged,
    read_controls,
    require_available,
)
from cortexfs.tools.core import BOOTSTRAP_TOOLS, NEEDS_CAPABILITY
from cortexfs.tools.core.toolio import MAX_INPUT_BYTES
from cortexfs.tools.ctxpath import Resolution, tier_location
from cortexfs.tools.result import ERROR, OK, ToolError, ToolResult, decode_output, exit_error
from cortexfs.tools.schemas import UnusableSchema, validate_input
from cortexfs.tools.spawn import (
    MAX_ARG_STRLEN,
    MAX_OUTPUT_BYTES,
    Finished,
    ProcessSpec,
    run_attached,
    run_captured,
)
from cortexfs.tools.startable import InterpreterRefused

if TYPE_CHECKING:
    from cortexfs.agents.capability import Capability

NATIVE, TERMINAL = "native", "terminal"
DEFAULT_TIMEOUT = 60.0

Frame = dict[str, Any]
Observer = Callable[[Frame], None]

# Which system tools a call's CTX_MOUNTS show, each answer kept a second: a worker calling
# tools back to back runs the chain for each call's own tool, not also for every other tool
# its agent may run (P-5 still admits every call afresh).
_SHOWN_TOOLS = RecentDecisions()


class UnreadableInput(NamedTuple):
    """A native input that is not JSON: refused at the ``schema`` stage with EINVAL, and
    recorded like any other refused call (its text summarised as an input is)."""

    text: str
    problem: str


def run_native(
    root: str | os.PathLike[str],
    agent: str,
    tool: str,
    input_value: Any,
    *,
    session: SessionRef | str | None = None,
    timeout: float | None = DEFAULT_TIMEOUT,
    observer: Observer | None = None,
    interrupted: Callable[[], bool] | None = None,
    may_start: Callable[[], str | None] | None = None,
    job: str | None = None,
) -> ToolResult:
    """Run ``tool`` as ``agent`` with ``input_value`` as its JSON input (agent native mode).

    Never raises for a refused or failed call: the :class:`ToolResult` says what happened.
    Only a result that cannot be recorded durably (a full disk…) raises, as an OSError, and an
    interrupt (KeyboardInterrupt, :class:`~cortexfs.interrupts.Stopped`) goes on once the call's
    ``tool_result`` is recorded (keeping what a tool it cut short had written, and how it
    ended) and its ``result`` frame given.
    ``root``, a path (a relative one is taken from the current directory once, as the call
    starts); anything else is a TypeError.  An input JSON cannot hold as it is (NaN, an
    integer of more digits than Python reads, a set…) is refused at stage ``schema`` as input
    that is not JSON is.  ``timeout`` is seconds above 0 and at most a year and a day, or
    None for none: anything else is refused (EINVAL) before anything is recorded.
    ``session`` is a :class:`SessionRef`, the name of a session in the agent's home, or None
    for its home session ``default``.  ``observer`` receives the frames of docs/tools.md as
    they happen: ``call`` when the tool starts, ``stderr`` per line, ``result`` at the end.
    What it raises is its caller's failure (a standard output that cannot be written), never
    the tool's: at the ``call`` frame the tool's process group is killed before the tool is
    given its input (its process has started by then: the frame carries its pid), and the call
    ends at stage ``output`` with that errno; at a later
    frame the observer is given no more frames, and the call goes on to its end and is
    recorded as if nobody watched, rather than kill a tool midway through what it does.  An
    interrupt it raises (one that came while it took a frame) ends the call, and the ``result``
    frame is the only one it is given after: the stderr lines the interrupt cut off would be
    missing between its frames and a later one.
    ``interrupted`` says whether the caller was interrupted and killed the tool's process
    group itself (a worker's second SIGINT): a tool that then ends in failure is recorded as
    interrupted, EINTR at stage ``run``, not as a tool that exited non-zero of its own accord.
    ``may_start`` is asked once more just before the tool's process starts, after the
    pre-hooks: a reason (a worker's claim of the job was lost while they ran) ends the call
    there, ECANCELED at stage ``run``, the tool never started.  ``job``: the queue job the
    call runs (a worker's), recorded in its ``tool_call`` and given to its hooks.
    """
    call = _Call(
        root,
        agent,
        tool,
        NATIVE,
        session,
        timeout,
        observer,
        interrupted=interrupted,
        may_start=may_start,
        job=job,
    )
    return call.execute(_json_input(input_value), None)


def run_terminal(
    root: str | os.PathLike[str],
    agent: str,
    tool: str,
    argv: list[str],
    *,
    session: SessionRef | str | None = None,
    timeout: float | None = None,
    workspace: Path | None = None,
    asking: tuple[int, int] | None = None,
    leads_terminal: bool = False,
    signalled_grace: float | None = None,
) -> ToolResult:
    """Run ``tool`` as ``agent`` with ``argv``, on the caller's stdin/stdout/stderr (T-3).

    ``workspace`` is the directory an agent terminal shows at ``/workspace`` when the agent's
    mounts have none (A-1): the tool sees it there too, read-write.  ``asking``: the uid and
    gid of the process that asks for the call on the agent's behalf (tsh in its terminal, by
    its socket's peer credentials), refused at step 1 of the chain unless they are still the
    agent's identity as this call reads it.  ``leads_terminal``: the asker let go of the
    terminal on stdin, and the tool takes it as its own controlling terminal, leading a
    session of its own (H-5: a shell typed at tsh has job control, a program opens /dev/tty).
    ``signalled_grace``: seconds the tool has to end once a signal sent to this process was
    passed on to it, then it is killed (``ctx run``); None passes the signal on only.
    """
    call = _Call(
        root, agent, tool, TERMINAL, session, timeout, None, workspace=workspace, asking=asking
    )
    call.leads_terminal = leads_terminal
    call.signalled_grace = signalled_grace
    return call.execute(None, argv)


class _Refused(Exception):
    def __init__(self, error: ToolError) -> None:
        super().__init__(str(error))
        self.error = error


class _CallerLost(_Refused):
    """The observer could not take the ``call`` frame: the call ends before the tool is given
    its input.  Not an OSError, so that no stage takes it for one of its own."""


class _Call:
    """The state of one call as it goes through the stages."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        agent: str,
        tool: str,
        mode: str,
        session: SessionRef | str | None,
        timeout: float | None,
        observer: Observer | None,
        *,
        workspace: Path | None = None,
        interrupted: Callable[[], bool] | None = None,
        may_start: Callable[[], str | None] | None = None,
        job: str | None = None,
        asking: tuple[int, int] | None = None,
    ) -> None:
        self.job = job
        self.asking = asking
        self.leads_terminal = False  # run_terminal's leads_terminal
        self.signalled_grace: float | None = None  # and its signalled_grace
        # Made absolute at stage caller (a relative root would name another tree in the
        # agent's working directory, where the tool starts); a Path at once, so that what is
        # no path is the caller's TypeError, not the call's failure.
        self.root, self.agent, self.tool_name, self.mode = Path(root), agent, tool, mode
        self.requested_session, self.timeout, self.observer = session, timeout, observer
        # When the pre-hooks start, the call's timeout starts too: pre-hooks and the tool share
        # it (W-4: a job that exceeds it is finished as failed, however the time went).
        self.deadline: float | None = None
        self.interrupted = interrupted
        self.may_start = may_start
        self.call = os.urandom(8).hex()
        self.started = rfc3339()
        self.clock = time.monotonic()
        self.timings: dict[str, float] = {}
        # How the tool's process ended, of itself or killed when an interruption cut the call
        # short, and what it had written (None until then): the result of a call that an
        # interruption ended keeps them, as a timeout's does.
        self.finished: Finished | None = None
        self.view: AgentView | None = None
        self.session_ref: SessionRef | None = None
        self.session: Session | None = None
        self.tool: ToolObject | None = None
        self.found: Resolution | None = None
        self.location = "tool"
        self.controls: ToolControls | None = None
        self.hook_names: dict[str, list[str]] = {}
        self.executable_identity: tuple[int, int, int] | None = None  # as its controls were read
        self.environment: dict[str, str] | None = None  # the tool's and its hooks'
        self.capability: Capability | None = None  # served while the tool runs
        self.request: dict[str, Any] = {}
        self.called_with: Any = None  # the input or argv, whose redacted values messages lose
        self.workspace = workspace
        self.stage = "caller"  # the stage in progress, for a failure no stage anticipated
        self.observer_failed = False
        self.observer_interrupted = False  # a frame it was taking was cut by an interruption
        self.unrecorded_call: CtxError | OSError | None = None  # the session refused tool_call

    @property
    def object_ref(self) -> str:
        return f"{self.location}/{self.tool_name}"

    def execute(self, input_value: Any, argv: list[str] | None) -> ToolResult:
        logged = input_value.text if isinstance(input_value, UnreadableInput) else input_value
        self.request = record.request_facts(self.call, self.mode, logged, argv, self.job)
        self.called_with = logged if argv is None else argv
        try:
            try:
                result = self._outcome(input_value, argv or [])
            except BaseException as interruption:
                # KeyboardInterrupt, Stopped, SystemExit: the caller goes on unwinding, but a
                # recorded tool_call still gets its tool_result, and a native caller its result
                # frame.
                self._finish(self._interrupted_result(self._unexpected(interruption)))
                raise
            return self._finish(result)
        finally:
            if self.session is not None:
                self.session.close()

    def _outcome(self, input_value: Any, argv: list[str]) -> ToolResult:
        try:
            self._admit_caller()
            self._admit_call_of_one_version(input_value)
            return self._run(input_value, argv)
        except _Refused as refusal:
            return self._result(ERROR, error=refusal.error)
        except Exception as exc:
            # Whatever else goes wrong once tool_call is recorded is still this call's result
            # (S-2: every tool_call has its tool_result), never an exception for the caller.
            return self._result(ERROR, error=self._unexpected(exc))

    def _finish(self, result: ToolResult) -> ToolResult:
        """Record ``result`` durably (session, then the tool's log) and emit its frame."""
        with self._timed("record"):
            tool_log = None if self.tool is None else PurePosixPath(self.object_ref + ".d/log")
            recorded = record.record_result(
                self.session,
                self.root,
                tool_log,
                self.object_ref,
                result,
                self.request,
                self.called_with,
            )
            result = result._replace(recorded=recorded.in_session)
            if recorded.failure is not None:  # a full disk, a read-only filesystem…
                result = _unrecorded(result, recorded.failure)
            if self.unrecorded_call is not None:  # said by the error of stage session
                missing = f"the call could not be recorded ({describe(self.unrecorded_call)})"
                code = self.unrecorded_call.errno or errno.EIO
                result = result._replace(record_error=ToolError(code, "record", missing))
        self._emit({"type": "result", **result.to_json()})
        return result

    def _interrupted_result(self, error: ToolError) -> ToolResult:
        """The result of a call an interruption ended with ``error``: a tool that had started
        keeps its exit status, its output (decoded as after a normal end) and its stderr."""
        finished = self.finished
        if finished is None:
            return self._result(ERROR, error=error)
        try:
            output = decode_output(finished.stdout) if self.mode == NATIVE else None
        except MemoryError:
            output = None  # the memory to hold it decoded ran short; the interruption stands
        return self._result(
            ERROR,
            output=output,
            exit_status=finished.exit_status,
            error=error,
            stderr=finished.stderr_tail.decode("utf-8", "replace"),
        )

    def _unexpected(self, exc: BaseException) -> ToolError:
        if isinstance(exc, KeyboardInterrupt):
            return ToolError(errno.EINTR, self.stage, "interrupted")
        if isinstance(exc, Stopped):
            return ToolError(errno.EINTR, self.stage, str(exc))
        if isinstance(exc, MemoryError):  # the host's shortage, not the call's failure
            return ToolError(errno.ENOMEM, self.stage, out_of_memory("the call stopped").message)
        code = exc.errno if isinstance(exc, CtxError | OSError) and exc.errno else errno.EIO
        message = str(exc) if isinstance(exc, CtxError) else f"{type(exc).__name__}: {exc}"
        return ToolError(code, self.stage, message)

    # ---------------------------------------------------------------------------- stages

    def _admit_caller(self) -> None:
        with self._stage("caller"):
            self.root = _absolute_root(self.root)
            _check_timeout(self.timeout)
        with self._stage("caller", Step.CREDENTIALS):
            require_host_administrator(self.root, "run a tool as an agent")
        with self._stage("agent"):
            self.view = AgentView.load(self.root, self.agent).with_workspace(self.workspace)
        with self._stage("authorize"):
            self._require_caller_is_the_agent()
        with self._stage("caller", Step.CREDENTIALS):
            require_no_groups_beyond(self.agent, self.view.identity)
            self._require_asked_by_the_agent()
        with self._stage("session"):
            self._open_session()
        with self._stage("caller"):
            # P-5 step 1, the exec uid/gid: a root that may not take the agent's ids would
            # start the hooks and the tool as root, or not at all (setpriv's own failure).
            capabilities.require(
                "running a tool as the agent's uid and gid",
                capabilities.CAP_SETUID,
                capabilities.CAP_SETGID,
            )
            if os.geteuid() == 0:
                user_namespace.require_setgroups("run a tool as the agent's uid, gid and groups")

    def _require_caller_is_the_agent(self) -> None:
        """Step 1 of the chain, before the session, for a caller of another uid than the
        agent's (a storage owner, not root, running an agent root made for another user): it
        would otherwise make the agent's home as its own, and record there a call that was
        never the agent's (S-1).  Said before the groups this process holds, which could not
        mend it.  Root runs the call with the agent's own ids, and a caller of the agent's
        uid makes the session the agent's (or is told why it cannot: a gid it may not give),
        so for them step 1 is judged, and recorded, with the rest of the chain."""
        assert self.view is not None
        if os.geteuid() in (0, self.view.identity.uid):
            return
        try:
            made = _session_ref(self.root, self.view, self.requested_session).events_path
        except CtxError:
            made = None  # a session it cannot name: stage session says why
        if made is not None and os.path.lexists(made):
            # Nothing left to make: the refusal is recorded there with the rest of the chain,
            # as a worker records every job's call in the session it opened first (S-2).
            return
        refusal = caller_refusal(self.root, self.agent, self._caller(), self.view.facts)
        if refusal is not None:
            self._require(refusal, "authorize", otherwise=only_root_runs_as_another())

    def _require_asked_by_the_agent(self) -> None:
        """EACCES unless the process asking (``asking``) runs with the agent's uid and gid as
        the agent's identity has them now: a terminal started before its identity was changed
        runs tsh with the old ids, and its calls would run with the new ones (P-5 step 1)."""
        assert self.view is not None
        identity = self.view.identity
        if self.asking is None or self.asking == (identity.uid, identity.gid):
            return
        uid, gid = self.asking
        raise denied(
            f"the call is asked for by uid {uid} gid {gid}, and agent {self.agent}'s identity "
            f"is uid {identity.uid} gid {identity.gid} now (agent/{self.agent}.d/identity "
            "changed since its terminal started): stop the terminal and start it again (ctx "
            "agent stop, then ctx agent start) to run it with those ids"
        )

    def _admit_call_of_one_version(self, input_value: Any) -> None:
        """Admit the call by the tool's controls, again while a reinstall replaced the
        executable during the admission (see the module's docstring)."""
        for _ in range(_ADMISSIONS):
            self._admit_call(input_value)
            assert self.tool is not None and self.view is not None
            now = file_identity(self.tool.executable)
            if now is None or now == self.executable_identity:
                return  # the same version; or none at all, which the start reports (ENOENT)
            # Judged again from the start: found again on the CTX_PATH (a link in its place is
            # no tool, T-4), and by the chain on what the name now holds, not by the verdict
            # the replaced file got.
            self.found = None
            self.view.facts.forget_object("tool", self.tool_name)
        with self._stage("resolve"):
            raise CtxError(
                errno.EAGAIN,
                f"tool {self.tool_name} was reinstalled {_ADMISSIONS} times while this call "
                "was admitted; it was not started: make the call again",
            )

    def _admit_call(self, input_value: Any) -> None:
        with self._stage("resolve"):
            self._resolve_tool()
        with self._stage("authorize"):
            assert self.view is not None
            decision = check_tool_execute(
                self.root,
                self.agent,
                self.tool_name,
                self._caller(),
                self.location,
                facts=self.view.facts,
            )
            self._require(decision, "authorize")
        # The input is judged only for a call the agent may make (P-6: otherwise EACCES): a
        # caller without the grant learns nothing of what the tool accepts.
        if self.mode == NATIVE:
            with self._stage("schema"):
                assert self.controls is not None
                if isinstance(input_value, UnreadableInput):
                    raise invalid(f"the input is not JSON: {input_value.problem}")
                try:
                    # Within the call's time: a pattern that may backtrack for ever is then
                    # applied in a child process (cortexfs.tools.schema_patterns), rather than
                    # here, where it would hold every thread of a worker.
                    validate_input(
                        self.controls.schema, input_value, self.tool_name, within=self.timeout
                    )
                except UnusableSchema as unusable:
                    assert self.tool is not None
                    reason = f"the schema control cannot be applied: {unusable}"
                    raise damaged(self.tool, reason) from None
        if self.hook_names.get(hooks.PRE):
            with self._stage("run"):
                # The hooks start where the tool does: a directory that is not there would
                # otherwise read as a guard that could not run, and veto the call.
                self._require_working_directory(str(self.view.working_directory()[1]))
        with self._stage("hook"):
            if self.timeout is not None:
                self.deadline = time.monotonic() + self.timeout
            runs = self._hooks(hooks.PRE, {})
            if runs and not runs[-1].passed:
                veto = runs[-1]
                raise denied(
                    f"{veto.shown} vetoed the call (exit {veto.exit_status})"
                    + (f": {veto.message}" if veto.message else "")
                )

    def _resolve_tool(self) -> None:
        assert self.view is not None
        # Any execute bit makes a hit (T-4); a file whose bits are not the agent's is refused
        # by step 2 of the chain with EACCES, as `ctx policy explain` reports it.
        found = self.found  # looked up as the session was opened, with its location
        if found is None:
            found = self.view.find_tool(self.tool_name)
            if found is None:
                raise not_found(
                    f"no tool {self.tool_name!r} on the CTX_PATH of agent {self.agent!r} "
                    f"({self.view.ctx_path()})"
                )
            self.location = tier_location(self.root, found.directory) or "tool"
        self.tool = ToolObject(self.tool_name, found.directory)
        self.controls = self._read_controls_consistently(self.tool)
        require_available(self.tool, self.controls)
        if self.location == "tool" and self.tool_name in BOOTSTRAP_TOOLS:
            # A core tool an older bootstrap copied may read the context this runner hands it
            # in another shape and fail every call in words that name neither cause nor cure.
            # Imported here: the module and the launcher's it imports cost about a millisecond
            # at start, which a call of any other tool need not pay (tests/tools/test_startup.py).
            from cortexfs.tools.core.installed import require_this_versions_tool

            require_this_versions_tool(self.root, self.tool_name, "the tool did not run")

    def _read_controls_consistently(self, tool: ToolObject) -> ToolControls:
        """The controls of the version whose executable is in place before and after reading,
        read while no reinstall is between its two swaps (:mod:`cortexfs.tools.pairs`)."""

        def read() -> tuple[tuple[int, int, int] | None, ToolControls, dict[str, list[str]]]:
            identity = file_identity(tool.executable)  # the one before and after, when kept
            controls = read_controls(tool)
            names = {phase: hooks.hook_names(tool, phase) for phase in hooks.PHASES}
            return identity, controls, names

        identity, controls, self.hook_names = read_one_version(tool.directory, tool.name, read)
        self.executable_identity = identity
        return controls

    def _open_session(self) -> None:
        assert self.view is not None
        ref = _session_ref(self.root, self.view, self.requested_session)
        if ref.space is not None:
            # The call appends its events to the session: writing in the space (S-6, X-1).
            request = AuthorityRequest(
                self.root, self.agent, "shared", ref.space, "write", self._caller()
            )
            missing = f"make the space with 'ctx shared create {ref.space}'"
            decision = check_authority(request, self.view.facts)
            self._require(decision, "session", if_missing=missing)
        identity = self.view.identity
        self.session_ref = ref
        try:
            self.session = open_session(ref, owner=Ownership(identity.uid, identity.gid))
        except OSError as exc:
            raise self._session_not_made(ref, exc) from None
        # Looked up before tool_call is recorded, so that it names the object its tool_result
        # will name (shared/<space>/tool/<name> for a space's tool); stage resolve judges it.
        self.found = self._lookup()
        try:
            record.record_requested(self.session, self.object_ref, self.request)
        except (CtxError, OSError) as exc:
            # No tool_call there, so no tool_result is owed to it: a session that refused
            # one line (kept locked, full) is not waited for a second time.
            self.session.close()
            self.session = None
            self.unrecorded_call = exc
            raise

    def _session_not_made(self, ref: SessionRef, exc: OSError) -> OSError | CtxError:
        """What to raise when the session ``ref`` could not be made: for a storage owner's
        call refused in the agent's home (a ``home/`` root owns, a home removed), the session,
        what the kernel refused and what to do, as ``ctx queue work`` says it (only root makes
        what is missing for another owner); ``exc`` as it is otherwise."""
        refused = exc.errno in (errno.EACCES, errno.EPERM)
        if ref.space is not None or not refused or os.geteuid() == 0:
            return exc
        assert self.view is not None
        uid = self.view.identity.uid
        home = self.root / "home" / str(uid)
        where = f": {os.fsdecode(exc.filename)}" if isinstance(exc.filename, str | bytes) else ""
        remedy = session_home_remedy(home, uid, "the call records its events", "run it")
        return CtxError(
            exc.errno or errno.EACCES,
            f"cannot open the session {ref.path} ({exc.strerror}{where}); the tool did not "
            f"run: {remedy}, then make the call again",
        )

    def _lookup(self) -> Resolution | None:
        assert self.view is not None
        try:
            found = self.view.find_tool(self.tool_name)
        except CtxError:
            return None  # an illegal name: stage resolve says so
        if found is not None:
            self.location = tier_location(self.root, found.directory) or "tool"
        return found

    def _run(self, input_value: Any, argv: list[str]) -> ToolResult:
        assert self.view is not None and self.tool is not None
        with self._stage("run"):
            # An argv from the terminal's run socket (what tsh read) may hold one; exec could
            # not pass it, and would fail as an unexpected error.
            held = next((n for n, word in enumerate(argv, 1) if "\0" in word), None)
            if held is not None:
                raise invalid(f"argument {held} holds a NUL character, which no program's argv can")
        with self._capability() as capability:
            spec = self._process_spec([str(self.tool.executable), *argv], self._time_left())
            spec = self._with_mcp_config_vouched_for(spec)
            if capability is not None:
                env = {**spec.env, **capability.environment()}
                spec = spec._replace(env=env, pass_fds=(capability.tool_descriptor,))
            return self._run_process(spec, input_value)

    def _with_mcp_config_vouched_for(self, spec: ProcessSpec) -> ProcessSpec:
        """``spec``, for an MCP-backed tool a non-root host starts offline, with its
        configuration held to StrictModes here, on the host (``mcp_bridge.VOUCHED_CONFIG``):
        in the user namespace that keeps it offline (:mod:`cortexfs.tools.offline`) the bridge
        sees root's files, as every uid's but the caller's, owned by the overflow uid, and
        would refuse every configuration.  Refused here, the call is refused as the bridge
        refuses it (stage ``run``, before the tool starts)."""
        assert self.tool is not None and self.controls is not None
        config = self.controls.mcp_config  # of the version this call admitted
        if config is None or os.geteuid() == 0 or spec.network:
            return spec
        from cortexfs.tools.core import mcp_bridge  # only MCP-backed tools pay for it
        from cortexfs.tools.core.toolio import ToolFailure

        owner = os.stat(self.tool.executable).st_uid
        with self._stage("run"):
            try:
                vouched = mcp_bridge.vouch_for_config(config, spec.env, owner)
            except ToolFailure as refusal:
                raise CtxError(refusal.errno, f"{self.tool_name}: {refusal.message}") from None
        return spec._replace(env={**spec.env, mcp_bridge.VOUCHED_CONFIG: vouched})

    @contextlib.contextmanager
    def _capability(self) -> Iterator[Any]:
        """The run capability of A-5, for the core tools that need the host to act for them
        (bound to this call's agent), served while the tool runs; None for every other tool.

        A name is not enough: an administrator may have installed a tool of their own under
        it before it became core, and bootstrap leaves it (R-5).  Only the tool installed from
        the core manifest is served; another at its name runs as it always did, without."""
        assert self.tool is not None
        core = self.tool_name in NEEDS_CAPABILITY and self.location == "tool"
        if not core:
            yield None
            return
        from cortexfs.tools.core.installed import installed_by_bootstrap

        if not installed_by_bootstrap(self.tool):
            yield None
            return
        from cortexfs.agents.capability import Capability

        assert self.session_ref is not None
        capability = Capability(self.root, self.agent, self.tool_name, self.session_ref.name)
        with capability.serving():
            self.capability = capability
            try:
                yield capability
            finally:
                self.capability = None

    def _run_process(self, spec: ProcessSpec, input_value: Any) -> ToolResult:
        with self._stage("run"):
            too_big = self.view.too_big_to_start(spec.env)
            if too_big is not None:
                raise too_big
            why_not = None if self.may_start is None else self.may_start()
            if why_not is not None:
                raise CtxError(errno.ECANCELED, f"not started: {why_not}")
            self._require_working_directory(spec.cwd)
            try:
                if self.mode == NATIVE:
                    finished = run_captured(
                        spec,
                        _encoded_input(input_value),
                        on_start=self._started,
                        on_stderr_line=self._stderr_line,
                        on_cut_short=self._cut_short,
                    )
                else:
                    leading = spec._replace(
                        leads_terminal=self.leads_terminal, signalled_grace=self.signalled_grace
                    )
                    finished = run_attached(leading, on_start=self._started)
                self.finished = finished
            except InterpreterRefused as exc:
                # The errno's words alone would read as the tool's own ("No such file or
                # directory" of a tool that is there): the interpreter at fault is named.
                raise CtxError(
                    exc.errno or errno.EIO,
                    f"cannot start {spec.argv[0]}: {exc.reason} ({exc.strerror})",
                ) from None
            except OSError as exc:
                raise CtxError(
                    exc.errno or errno.EIO,
                    f"cannot start {spec.argv[0]}: {exc.strerror}{_too_big_to_start(spec, exc)}"
                    + (f" ({no_process_could_be_made()})" if exc.errno == errno.EAGAIN else ""),
                ) from None
        result = self._finished_result(finished)
        with self._timed("post_hooks"):
            runs = self._hooks(hooks.POST, {"result": result.to_json()})
        failed = [run.to_json() for run in runs if not run.passed]
        return self._result(
            result.status,
            output=result.output,
            exit_status=result.exit_status,
            error=result.error,
            stderr=result.stderr,
            post_hooks=failed,
            passed_on=result.passed_on,
        )

    def _finished_result(self, finished: Finished) -> ToolResult:
        stderr = finished.stderr_tail.decode("utf-8", "replace")
        try:
            output = decode_output(finished.stdout) if self.mode == NATIVE else None
        except MemoryError:
            # The tool ran: its exit status stands.  What ran short is the memory to hold its
            # output decoded (a JSON value takes many times its text), which is not kept.
            standing = (
                f"{self.tool_name} ran and exited with status {finished.exit_status}, but its "
                f"output of {len(finished.stdout)} bytes could not be decoded, and is not kept"
            )
            error = ToolError(errno.ENOMEM, "run", out_of_memory(standing).message)
            return self._result(ERROR, exit_status=finished.exit_status, error=error, stderr=stderr)
        error = None
        if finished.exit_status != 0 and self.interrupted is not None and self.interrupted():
            error = ToolError(
                errno.EINTR,
                "run",
                f"interrupted: its caller was interrupted and killed its process group (exit "
                f"status {finished.exit_status})",
            )
        elif finished.passed_on is not None and (
            finished.exit_status != 0 or self.signalled_grace is not None
        ):
            # A caller that gives the group a grace (ctx run) was itself asked to stop, and
            # the call ends as stopped whatever the tool exited with once it had the signal,
            # 0 included (docs/tools.md: handled or killed, either way EINTR).  A terminal's
            # Ctrl-C, passed on with no grace, is an interactive tool's to take and go on:
            # only a failure after it is the interruption's.
            name = signal.Signals(finished.passed_on).name
            error = ToolError(
                errno.EINTR,
                "run",
                f"interrupted: its caller got {name} and passed it on to its process group"
                + (
                    ""
                    if self.signalled_grace is None
                    else f", killed if it still ran {self.signalled_grace:g} s later"
                )
                + f" (exit status {finished.exit_status})",
            )
        elif finished.timed_out:
            error = ToolError(
                errno.ETIMEDOUT,
                "run",
                f"timed out after {self.timeout:g}s; its process group was killed",
            )
        elif finished.output_overflow:
            # Reading stops at the limit and the process group is killed then; a tool that
            # had already exited keeps the status it exited with.
            error = ToolError(
                errno.EFBIG,
                "run",
                f"its output exceeded the limit of {MAX_OUTPUT_BYTES} bytes; the rest was not "
                "read, and what still ran of it was killed",
            )
        elif finished.exit_status != 0:
            error = self._damage_that_ended_it(finished.exit_status) or exit_error(
                self.tool_name, finished.exit_status, output, stderr
            )
        status = OK if error is None else ERROR
        return self._result(
            status,
            output=output,
            exit_status=finished.exit_status,
            error=error,
            stderr=stderr,
            passed_on=finished.passed_on if error is not None else None,
        )

    def _damage_that_ended_it(self, exit_status: int) -> ToolError | None:
        """ENOEXEC naming ``ctx bootstrap`` when a core tool ended by a signal that damaged
        bytecode causes and its launcher's archive is not the digest its stamp ends with: the
        interpreter crashed on a changed byte before the launcher's own check could say so.
        An intact launcher that ends so is reported as the signal it is.  Asked only after
        such an end: a call that ends otherwise never reads the launcher."""
        assert self.tool is not None
        signal_number = exit_status - 128  # the shell's convention, as spawn reports it
        if signal_number not in _SIGNALS_OF_DAMAGE:
            return None
        if self.location != "tool" or self.tool_name not in BOOTSTRAP_TOOLS:
            return None
        from cortexfs.tools.core.installed import damaged_core_launcher

        if not damaged_core_launcher(self.tool):
            return None
        return ToolError(
            errno.ENOEXEC,
            "run",
            f"{self.tool_name} was killed by {signal.Signals(signal_number).name} (exit status "
            f"{exit_status}): {self.tool.executable} is damaged (its archive is not the bytes "
            "its stamp's digest gives); run 'ctx bootstrap' to repair it",
        )

    # --------------------------------------------------------------------------- helpers

    def _require_working_directory(self, cwd: str) -> None:
        """ENOENT or ENOTDIR naming the agent's working directory, where the tool and its
        hooks start, and the mount it comes from, when it is not a directory: an exec failing
        on it reports ENOENT as if the program were missing."""
        if os.path.isdir(cwd):
            return
        assert self.view is not None
        target = self.view.working_directory()[0]
        fix = f"fix the mount at {target} in agent/{self.agent}.d/mount"
        if os.path.exists(cwd):
            raise CtxError(
                errno.ENOTDIR,
                f"agent {self.agent}'s working directory {cwd} is not a directory; {fix}",
            )
        raise not_found(f"agent {self.agent}'s working directory {cwd} does not exist; {fix}")

    def _hooks(self, phase: str, extra: dict[str, Any]) -> list[hooks.HookRun]:
        assert self.tool is not None
        names = self.hook_names.get(phase, [])
        if not names:
            return []
        # The request whole, not as it is logged: a guard judges what the tool will be given,
        # and a summary cut at 200 characters, its secrets redacted, would let a call padded
        # past the cut through unjudged.
        asked = "argv" if "argv" in self.request else "input"
        whole = {asked: self.called_with}
        context = {
            "tool": self.tool_name,
            "agent": self.agent,
            "session": str(self.session_ref),
            **self.request,
            **whole,
            **extra,
        }
        # Post-hooks see a result already decided, so the call's timeout no longer bounds them.
        deadline = self.deadline if phase == hooks.PRE else None
        spec = self._process_spec([], None)
        return hooks.run_hooks(self.tool, phase, names, context, spec, deadline=deadline)

    def _time_left(self) -> float | None:
        """What the pre-hooks left of the call's timeout for the tool (None: no timeout)."""
        if self.deadline is None:
            return self.timeout
        return max(self.deadline - time.monotonic(), 0.0)

    def _process_spec(self, argv: list[str], timeout: float | None) -> ProcessSpec:
        """How the tool, or one of its hooks, is started: all with one environment."""
        assert self.view is not None and self.session_ref is not None
        if self.environment is None:
            self.environment = self.view.tool_environment(
                tool=self.tool_name,
                session=self.session_ref.name,
                call=self.call,
                mode=self.mode,
                may_execute=functools.partial(_SHOWN_TOOLS.may_run, self.view),
            )
        env = self.environment
        _, cwd = self.view.working_directory()
        may_connect = self.view.allows("network", "default", "connect")
        return ProcessSpec(argv, env, str(cwd), self.view.identity, timeout, network=may_connect)

    def _caller(self) -> Credentials:
        """The credentials the tool will run with: the agent's as root, ours otherwise (P-5 1)."""
        assert self.view is not None
        if os.geteuid() == 0:
            return self.view.identity.credentials
        return Credentials(os.geteuid(), os.getegid())

    def _require(
        self, decision: Decision, stage: str, if_missing: str = "", otherwise: str = ""
    ) -> None:
        """Refuse the call at ``stage`` when ``decision`` denies it; ``if_missing`` is what to
        do when the object does not exist (ENOENT), ``otherwise`` for any other denial, added
        to the reason."""
        if decision.denial is not None:
            step = decision.denial.step
            reason = decision.reason
            remedy = if_missing if decision.errno == errno.ENOENT else otherwise
            if remedy:
                reason = f"{reason}; {remedy}"
            raise _Refused(ToolError(decision.errno, stage, reason, int(step), step.title))

    @contextlib.contextmanager
    def _stage(self, stage: str, step: Step | None = None) -> Iterator[None]:
        """Time ``stage`` and turn what refuses it into the call's error; ``step``, the step of
        the authority chain (P-5) a denial (EACCES) at this stage stands for."""
        started = time.monotonic()
        self.stage = stage
        try:
            yield
        except CtxError as exc:
            if step is not None and exc.errno == errno.EACCES:
                error = ToolError(exc.errno, stage, exc.message, int(step), step.title)
                raise _Refused(error) from None
            raise _Refused(ToolError(exc.errno, stage, exc.message)) from None
        except OSError as exc:
            message = _host_failure(stage, exc)
            raise _Refused(ToolError(exc.errno or errno.EIO, stage, message)) from None
        finally:
            self.timings[stage] = _milliseconds(time.monotonic() - started)

    @contextlib.contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = _milliseconds(time.monotonic() - started)

    def _result(self, status: str, **fields: Any) -> ToolResult:
        self.timings["total"] = _milliseconds(time.monotonic() - self.clock)
        return ToolResult(
            status=status,
            tool=self.tool_name,
            agent=self.agent,
            session="" if self.session_ref is None else str(self.session_ref),
            call=self.call,
            mode=self.mode,
            started=self.started,
            finished=rfc3339(),
            timings=self.timings,
            **fields,
        )

    def _cut_short(self, finished: Finished) -> None:
        self.finished = finished

    def _started(self, pid: int) -> None:
        if self.capability is not None:
            self.capability.bind(pid)  # the one process it answers
        self._emit(
            {
                "type": "call",
                "call": self.call,
                "tool": self.tool_name,
                "agent": self.agent,
                "session": str(self.session_ref),
                "pid": pid,
                "ts": rfc3339(),
            }
        )

    def _stderr_line(self, line: str) -> None:
        self._emit({"type": "stderr", "call": self.call, "text": line})

    def _emit(self, frame: Frame) -> None:
        """Hand ``frame`` to the observer; one that failed is given no more (see
        :func:`run_native`), one interrupted while it took a frame only the ``result``."""
        if self.observer is None or self.observer_failed:
            return
        if self.observer_interrupted and frame["type"] != "result":
            # The stderr lines the interruption cut off would be missing between the frames
            # it got and a later one (the start of a line read in part among them).
            return
        try:
            self.observer(frame)
        except Exception as exc:
            self.observer_failed = True
            if frame["type"] != "call":
                return
            code = exc.errno if isinstance(exc, OSError) and exc.errno else errno.EIO
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else describe(exc)
            raise _CallerLost(
                ToolError(
                    code,
                    "output",
                    f"the caller's output could not take the call's first frame ({reason}); "
                    "the tool's process had started and was killed before it was given its "
                    "input",
                )
            ) from None
        except BaseException:  # KeyboardInterrupt, Stopped: the call ends, with its result
            self.observer_interrupted = True
            raise


def _unrecorded(result: ToolResult, exc: OSError | CtxError) -> ToolResult:
    """``result``, which could not be recorded (T-7): a failed call, whatever the tool did,
    so that no caller takes an unlogged call for a good one; its output and exit status are
    kept, since the tool may have run and changed things.

    A result its session holds (``recorded``) lacks only the tool's log, which ``exc`` names:
    its ``record_error`` then says that alone, for the caller that tells what became of the
    call (``ctx run`` whose frames were lost), which must not send anyone to a session that
    has it."""
    code = exc.errno or errno.EIO
    ran = "did not run" if result.exit_status is None else f"exited {result.exit_status}"
    missing = f"its result could not be recorded ({describe(exc)})"
    if result.recorded:
        missing += f"; session {result.session} holds it"
    said = f"the tool {ran}, but {missing}"
    if result.error is not None:
        error = result.error._replace(message=f"{result.error.message}; and {missing}")
    else:
        error = ToolError(code, "record", said)
    record_error = ToolError(code, "record", _without_errno(exc) if result.recorded else said)
    return result._replace(status=ERROR, error=error, record_error=record_error)


def _without_errno(exc: OSError | CtxError) -> str:
    """What :func:`~cortexfs.errors.describe` says of ``exc`` (the file it names, the
    system's words), without the errno name a :class:`ToolError` carries apart."""
    if isinstance(exc, CtxError):
        return exc.message
    return describe(exc).split(": ", 1)[-1] if exc.errno else describe(exc)


# The stages before the tool is started: a failure there means it never ran, so the same call
# may simply be made again once the host's trouble is mended.
_BEFORE_THE_TOOL = frozenset(
    {"caller", "agent", "session", "resolve", "authorize", "schema", "hook"}
)


def _host_failure(stage: str, exc: OSError) -> str:
    """What a call the host itself could not carry on says: the file and the system's words,
    whether the tool ran, and for a full or read-only disk what to do."""
    message = f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc.strerror)
    if stage not in _BEFORE_THE_TOOL:
        return message
    remedy = remedy_for_host_trouble(exc.errno)
    message += "; the tool did not run"
    return message + (f": {remedy} and make the call again" if remedy else "")


def _session_ref(root: Path, view: AgentView, requested: SessionRef | str | None) -> SessionRef:
    if isinstance(requested, SessionRef):
        if requested.agent != view.name:
            raise invalid(
                f"session {requested} belongs to agent {requested.agent!r}, not {view.name!r}"
            )
        return requested
    if requested is None:
        return SessionRef.home(root, view.identity.uid, view.name)
    return SessionRef.home(root, view.identity.uid, view.name, requested)


def _absolute_root(root: Path) -> Path:
    """``root`` made absolute once, as the call starts: the tool and its hooks start in the
    agent's working directory, where a relative path to their executables would name another
    file, or none."""
    try:
        return Path(absolute(root))
    except FileNotFoundError:
        raise not_found(
            f"the storage root {root} is relative, and the current directory it is taken from "
            "was removed; give the root as an absolute path"
        ) from None


def _check_timeout(timeout: object) -> None:
    """EINVAL unless ``timeout`` is None (no timeout) or seconds above 0 and at most
    :data:`~cortexfs.timefmt.MAX_SECONDS`, the bounds of ``ctx run --timeout``: NaN compares
    false with every bound, and a str or a bool is no number of seconds, each of which would
    fail the call only once its pre-hooks or its tool ran."""
    if timeout is None:
        return
    remedy = (
        f"give seconds above 0 and at most {MAX_SECONDS:.0f} (a year and a day), or None for "
        "no timeout; the tool did not run"
    )
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise invalid(f"timeout is a {type(timeout).__name__}, not a number of seconds: {remedy}")
    if not is_seconds(timeout):
        # An int of thousands of digits is not repeated in full (nor can be past 4300).
        big = isinstance(timeout, int) and abs(timeout) >= 10**40
        shown = "of over 40 digits" if big else repr(timeout)
        raise invalid(f"timeout {shown} is not a number of seconds the call can take: {remedy}")


def _json_input(input_value: Any) -> Any:
    """``input_value``, or an :class:`UnreadableInput` when no strict reader could take it back
    as it is: NaN or an infinity, an integer of more digits than Python reads, a value that
    holds itself, nesting deeper than :data:`~cortexfs.jsontext.MAX_DEPTH`, a value JSON has
    none for (a set, an object).  docs/tools.md refuses such input at stage ``schema``, as
    input that is not JSON; recorded as it is, its ``tool_call`` would be a line every reader
    of the session skips as damaged (S-2), so it is recorded as text."""
    if isinstance(input_value, UnreadableInput):
        return input_value
    try:
        jsontext.dumps_document(input_value)
    except jsontext.Unwritable as exc:
        problem = f"it {exc}"
    except TypeError as exc:  # json's words: "Object of type set is not JSON serializable"
        problem = f"it holds a value JSON has none for ({exc})"
    else:
        return input_value
    return UnreadableInput(record.text_of_input(input_value, problem), problem)


_ADMISSIONS = 3  # a tool reinstalled during each of them is being reinstalled in a loop


def _encoded_input(input_value: Any) -> bytes:
    """The native input as the tool reads it, one line: ``json.dumps``'s form, which tools
    have always been given; compact UTF-8 when that form would be over what a core tool
    reads (ASCII escapes triple a text's accented letters), which is never longer than the
    input the caller gave, so that what the runner accepted the tool accepts too."""
    data = json.dumps(input_value).encode()
    if len(data) > MAX_INPUT_BYTES:
        data = dumps_utf8(input_value, separators=(",", ":"))
    return data + b"\n"


def _too_big_to_start(spec: ProcessSpec, exc: OSError) -> str:
    """For E2BIG, which of what the call hands the tool the kernel found too big: a variable
    or an argument over :data:`MAX_ARG_STRLEN` (CTX_MOUNTS of an agent with very many mounts
    or tools, say), else the whole of them."""
    if exc.errno != errno.E2BIG:
        return ""
    over = [
        name
        for name, value in spec.env.items()
        if len(os.fsencode(f"{name}={value}")) >= MAX_ARG_STRLEN
    ]
    over += [
        f"argument {number}"
        for number, word in enumerate(spec.argv)
        if len(os.fsencode(word)) >= MAX_ARG_STRLEN
    ]
    if over:
        return (
            f" ({', '.join(over)} holds over the {MAX_ARG_STRLEN} bytes the kernel passes in one "
            "variable or argument; for CTX_MOUNTS, give the agent fewer mounts or tools)"
        )
    return " (its arguments and environment together are more than the kernel passes)"


# How a launcher whose bytecode a changed byte corrupted may end: the interpreter executes what
# the bytes now say, reads or jumps where nothing is (SIGSEGV, SIGBUS, SIGILL, SIGFPE) or fails
# one of its own assertions (SIGABRT), all before the launcher could name the damage.
_SIGNALS_OF_DAMAGE = frozenset(
    {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}
)


def _milliseconds(seconds: float) -> float:
    return round(seconds * 1000, 3)
