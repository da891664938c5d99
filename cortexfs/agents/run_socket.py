"""The run socket of an agent terminal: tsh's command lines, run on the host (SPEC H-1, T-5).

tsh, in the sandbox, reaches the terminal at ``/run/ctx/run.sock``.  Each connection carries
one JSON message, with tsh's stdin, stdout and stderr passed along (``SCM_RIGHTS``):

* ``{"tool": NAME, "argv": [...]}``: run the tool as the agent in a child process of the
  terminal — :func:`~cortexfs.tools.runner.run_terminal`, the whole authority chain, hooks, the
  tool's log and the session's events, as ``ctx run`` — which answers
  ``{"exit_status": N}`` on the connection when the tool has ended.  With ``"terminal":
  true`` tsh has let go of the PTY, its controlling terminal, for the tool to lead it (H-5):
  the tool starts a session of its own with the PTY as its controlling terminal, so that
  Ctrl-C, Ctrl-Z and ``/dev/tty`` reach it as on any terminal, and tsh takes the PTY back
  once the answer has come;
* ``{"interrupt": true}``: SIGINT to every running call (Ctrl-C in the terminal), which the
  runner passes on to the tool's process group.

**Who may send one: tsh, in the sandbox, and nothing else.**  The uid alone does not say it:
every process of the agent's uid on the host — another agent's ``shell.exec``, a hook, a
worker — has it too, and would run tools with this agent's grants, as this agent, in its
session (A-5, H-2).  The sandbox has a pid namespace of its own (``--unshare-pid``) that no
process outside it can enter (``setns`` needs ``CAP_SYS_ADMIN``), so the peer is admitted only
when its pid (``SO_PEERCRED``) lives in that namespace, and its uid is the agent's.  A peer that
is not, or whose namespace cannot be told (it has ended, the terminal's sandbox has no
namespace of its own), is answered ``{"error": "EACCES: …", "exit_status": 126}`` and nothing
is run or interrupted.  A malformed message from tsh is dropped without an answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import time
from pathlib import Path

from cortexfs import jsontext
from cortexfs.agents.sandbox import sandbox_processes
from cortexfs.agents.view import AgentView
from cortexfs.errors import denied
from cortexfs.printable import printable
from cortexfs.shared.sessions import SessionRef
from cortexfs.tools.spawn import STRAGGLER_GRACE, children_of

_MAX_REQUEST = 1024 * 1024
REQUEST_SECONDS = 2.0  # for tsh's message to arrive once it has connected
MAX_WAITING = 64  # connections whose message has not arrived yet, each holding a descriptor
CALL_END_SECONDS = 2.0  # for the calls running when the terminal ends to record their end
# Then for those a hangup ends (an interactive shell) to record theirs: the runner gives what
# the shell left in its group STRAGGLER_GRACE to go before it records, and the record
# needs its moment too; a call killed before then keeps its tool_call alone.
HANGUP_SECONDS = STRAGGLER_GRACE + 1.0
# Then for those whose tool was killed to record its end: the runner's own kill of what the
# tool left (STRAGGLER_GRACE after it), and the record.
RECORD_SECONDS = STRAGGLER_GRACE + 1.0
_REFUSED = 126  # tsh's status for a call the host did not run
Request = dict[str, object]
Namespace = tuple[int, int]  # a pid namespace: the device and inode of /proc/<pid>/ns/pid


class Refused(Exception):
    """A peer that is not tsh in this terminal's sandbox; the reason, for its answer."""


def pid_namespace(pid: int) -> Namespace | None:
    """The pid namespace process ``pid`` lives in; None when there is no such process."""
    try:
        found = os.stat(f"/proc/{pid}/ns/pid")
    except OSError:
        return None
    return found.st_dev, found.st_ino


def sandbox_namespace(shell_session: int) -> Namespace | None:
    """The pid namespace of the sandbox whose processes are in the session ``shell_session``
    (bubblewrap's pid: it was started as a session leader): the one namespace, other than this
    process's own, that they live in.  None when there is not exactly one such."""
    own = pid_namespace(os.getpid())
    found: set[Namespace] = set()
    for pid in sandbox_processes(shell_session):
        namespace = pid_namespace(pid)
        if namespace is not None and namespace != own:
            found.add(namespace)
    return found.pop() if len(found) == 1 else None


class RunSocket:
    """The calls tsh asked for: started, interrupted, reaped."""

    def __init__(
        self,
        root: Path,
        view: AgentView,
        session: SessionRef,
        workspace: Path | None,
        selector: selectors.BaseSelector,
    ) -> None:
        self.root = root
        self.view = view
        self.session = session
        self.workspace = workspace
        self.selector = selector  # the terminal's loop, where each message is awaited
        self.waiting: dict[socket.socket, float] = {}  # connections yet to send, their deadline
        self.calls: set[int] = set()  # children running a tool for tsh
        self.sandbox: Namespace | None = None  # tsh's pid namespace; None: no peer is admitted

    def serve(self, connection: socket.socket) -> None:
        """A connection to the run socket: its message is read once it has arrived (tsh sends
        it as it connects), from the loop that serves the whole terminal, which never waits
        for it.  One that sends nothing within :data:`REQUEST_SECONDS` is dropped
        (:meth:`drop_silent`), and so is one beyond :data:`MAX_WAITING`."""
        if len(self.waiting) >= MAX_WAITING:
            connection.close()
            return
        connection.setblocking(False)
        self.waiting[connection] = time.monotonic() + REQUEST_SECONDS
        self.selector.register(connection, selectors.EVENT_READ, self._request)

    def drop_silent(self) -> None:
        """Drop the connections whose message has not come within :data:`REQUEST_SECONDS`."""
        now = time.monotonic()
        for connection, deadline in list(self.waiting.items()):
            if deadline <= now:
                self._stop_waiting(connection)
                connection.close()

    def _stop_waiting(self, connection: socket.socket) -> None:
        self.waiting.pop(connection, None)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(connection)

    def _request(self, connection: socket.socket) -> None:
        """The message of ``connection`` has arrived: a command line to run as the agent in a
        child process, which answers with its exit status; or an interrupt for the running
        calls."""
        self._stop_waiting(connection)
        with connection:
            try:
                request, descriptors = self._read_request(connection)
            except Refused as refused:
                with contextlib.suppress(OSError):
                    answer = {"error": str(denied(str(refused))), "exit_status": _REFUSED}
                    connection.sendall(json.dumps(answer).encode() + b"\n")
                return
            try:
                if request is None:
                    return
                if request.get("interrupt") is True:
                    self.interrupt()
                    return
                tool, argv = request.get("tool"), request.get("argv")
                if not isinstance(tool, str) or not isinstance(argv, list) or len(descriptors) != 3:
                    return
                pid = os.fork()
                if pid == 0:  # the child: this call only, then gone
                    self._let_go_of_the_terminal(connection)
                    connection.settimeout(None)  # the answer waits for the tool, however long
                    try:
                        leads = request.get("terminal") is True
                        words = [str(arg) for arg in argv]
                        status = self._run_tool(tool, words, descriptors, leads_terminal=leads)
                        connection.sendall(json.dumps({"exit_status": status}).encode() + b"\n")
                    finally:
                        os._exit(0)
                self.calls.add(pid)
            finally:
                for fd in descriptors:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def _let_go_of_the_terminal(self, connection: socket.socket) -> None:
        """In a call's child: close what the terminal's loop waits on (its listeners, its
        clients' connections, the PTY's master, the loop itself), but this call's
        connection.  Kept open, a terminal killed while the call runs would live on in it:
        its clients would see no end, and a new client would reach a listener nobody serves."""
        ours = connection.fileno()
        for key in list(self.selector.get_map().values()):
            if key.fd != ours:
                with contextlib.suppress(OSError):
                    os.close(key.fd)
        with contextlib.suppress(OSError):
            os.close(self.selector.fileno())  # type: ignore[attr-defined]

    def interrupt(self) -> None:
        """SIGINT to each running call; the runner passes it on to the tool's group."""
        self._signal_calls(signal.SIGINT)

    def end(self, grace: float = CALL_END_SECONDS) -> None:
        """The terminal is ending: no call outlives it.  Connections whose message has not come
        are closed; each running call is interrupted
        (the runner passes SIGINT on to its tool's group and records the call's result).
        One still running after ``grace`` seconds (an interactive shell ignores SIGINT) is
        told the terminal hung up, SIGHUP, as a closing terminal tells its shell, which
        ends on it, and its result is recorded too; one whose tool still runs
        :data:`HANGUP_SECONDS` later (it ignores both) has its tool's group killed, and its
        result is recorded as the tool's death by SIGKILL; a call still running
        :data:`RECORD_SECONDS` later is killed, and whatever it started with it (the tool
        dies with the process that started it: its parent-death signal), its result
        unrecorded."""
        for connection in list(self.waiting):
            self._stop_waiting(connection)
            connection.close()
        self.interrupt()
        self._wait_for_calls(grace)
        if self.calls:
            self._signal_calls(signal.SIGHUP)
            self._wait_for_calls(HANGUP_SECONDS)
        if self.calls:
            # Each call's children are its tool and hooks, each the leader of its own group.
            for child in children_of(self.calls):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child, signal.SIGKILL)
            self._wait_for_calls(RECORD_SECONDS)
        for pid in self.calls:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in self.calls:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self.calls.clear()

    def _signal_calls(self, signum: int) -> None:
        for pid in self.calls:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def _wait_for_calls(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.calls and time.monotonic() < deadline:
            time.sleep(0.02)
            self.reap()

    def reap(self) -> None:
        """Collect the calls that have ended."""
        for pid in list(self.calls):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            self.calls.discard(pid)

    def _read_request(self, connection: socket.socket) -> tuple[Request | None, list[int]]:
        """The JSON request and the descriptors passed with it (None when it is malformed);
        :class:`Refused`, with the descriptors closed, unless the peer is tsh in the sandbox."""
        descriptors: list[int] = []
        try:
            credentials = connection.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
            )
            message, ancillary, _, _ = connection.recvmsg(_MAX_REQUEST, socket.CMSG_SPACE(12))
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    descriptors += list(struct.unpack(f"{len(data) // 4}i", data))
        except OSError:
            return None, descriptors
        try:
            self._check_peer(*struct.unpack("3i", credentials)[:2])
        except Refused:
            for fd in descriptors:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise
        try:
            request = jsontext.loads_strict(message, unique_names=False)  # nesting bounded
        except ValueError:
            return None, descriptors
        return (request if isinstance(request, dict) else None), descriptors

    def _check_peer(self, pid: int, uid: int) -> None:
        """Refused unless process ``pid`` of ``uid`` is tsh in this terminal's sandbox: the
        agent's uid, in the sandbox's pid namespace (pid 0: a namespace this one cannot see)."""
        agent = self.view.name
        if uid != self.view.identity.uid:
            raise Refused(
                f"uid {uid} may not run tools as agent {agent}: the run socket serves only tsh "
                f"in {agent}'s terminal"
            )
        if self.sandbox is None or pid <= 0 or pid_namespace(pid) != self.sandbox:
            raise Refused(
                f"process {pid} is not in the sandbox of agent {agent}'s terminal, session "
                f"{self.session.name}: its run socket serves only the tsh running there, not "
                f"every process of uid {uid}; run a tool as {agent} with 'ctx run --agent "
                f"{agent} TOOL' as the host administrator"
            )

    def _run_tool(
        self, tool: str, argv: list[str], descriptors: list[int], *, leads_terminal: bool
    ) -> int:
        """In the call's child: tsh's descriptors become its own, then the tool runs."""
        from cortexfs.tools.runner import run_terminal

        for target, fd in enumerate(descriptors):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 (the child's own streams)
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # forwarded to the tool
        # tsh runs with the ids the agent had when its terminal started (_check_peer).
        identity = self.view.identity
        result = run_terminal(
            self.root,
            self.view.name,
            tool,
            argv,
            session=self.session,
            workspace=self.workspace,
            asking=(identity.uid, identity.gid),
            leads_terminal=leads_terminal,
        )
        if result.exit_status is None and result.error is not None:
            # The error quotes what others wrote (a hook's name and message): never raw onto
            # the terminal and those watching it.
            print(printable(f"tsh: {tool}: {result.error}"), file=sys.stderr, flush=True)
            return 126
        return result.exit_status or 0
