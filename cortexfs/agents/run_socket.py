"""The run socket of an agent terminal: tsh's command lines, run on the host (SPEC H-1, T-5).

tsh, in the sandbox, reaches the terminal at ``/run/ctx/run.sock``.  Each connection carries
one JSON message, with tsh's stdin, stdout and stderr passed along (``SCM_RIGHTS``):

* ``{"tool": NAME, "argv": [...]}``: run the tool as the agent in a child process of the
  terminal — :func:`~cortexfs.tools.runner.run_terminal`, the whole authority chain, hooks, the
  tool's log and the session's events, as ``ctx run`` — which answers
  ``{"exit_status": N}`` on the connection when the tool has ended;
* ``{"interrupt": true}``: SIGINT to every running call (Ctrl-C in the terminal), which the
  runner passes on to the tool's process group.

A message is read only from the agent's own uid (``SO_PEERCRED``); anything else, or anything
malformed, is dropped without an answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path

from cortexfs.agents.view import AgentView
from cortexfs.shared.sessions import SessionRef

_MAX_REQUEST = 1024 * 1024
Request = dict[str, object]


class RunSocket:
    """The calls tsh asked for: started, interrupted, reaped."""

    def __init__(
        self, root: Path, view: AgentView, session: SessionRef, workspace: Path | None
    ) -> None:
        self.root = root
        self.view = view
        self.session = session
        self.workspace = workspace
        self.calls: set[int] = set()  # children running a tool for tsh

    def serve(self, listener: socket.socket) -> None:
        """One message from tsh: a command line to run as the agent in a child process, which
        answers with its exit status; or an interrupt for the running calls."""
        connection, _ = listener.accept()
        connection.setblocking(True)
        with connection:
            request, descriptors = self._read_request(connection)
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
                    try:
                        status = self._run_tool(tool, [str(arg) for arg in argv], descriptors)
                        connection.sendall(json.dumps({"exit_status": status}).encode() + b"\n")
                    finally:
                        os._exit(0)
                self.calls.add(pid)
            finally:
                for fd in descriptors:
                    with contextlib.suppress(OSError):
                        os.close(fd)

    def interrupt(self) -> None:
        """SIGINT to each running call; the runner passes it on to the tool's group."""
        for pid in self.calls:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)

    def reap(self) -> None:
        """Collect the calls that have ended."""
        for pid in list(self.calls):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            self.calls.discard(pid)

    def _read_request(self, connection: socket.socket) -> tuple[Request | None, list[int]]:
        """The JSON request and the descriptors passed with it; None unless it comes from the
        agent's uid (the only process that can reach this socket is tsh, in the sandbox)."""
        descriptors: list[int] = []
        try:
            credentials = connection.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
            )
            message, ancillary, _, _ = connection.recvmsg(_MAX_REQUEST, socket.CMSG_SPACE(12))
            for level, kind, data in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    descriptors += list(struct.unpack(f"{len(data) // 4}i", data))
            if struct.unpack("3i", credentials)[1] != self.view.identity.uid:
                return None, descriptors
            request = json.loads(message)
        except (OSError, ValueError):
            return None, descriptors
        return (request if isinstance(request, dict) else None), descriptors

    def _run_tool(self, tool: str, argv: list[str], descriptors: list[int]) -> int:
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
        result = run_terminal(
            self.root, self.view.name, tool, argv, session=self.session, workspace=self.workspace
        )
        if result.exit_status is None and result.error is not None:
            print(f"tsh: {tool}: {result.error}", file=sys.stderr, flush=True)
            return 126
        return result.exit_status or 0
