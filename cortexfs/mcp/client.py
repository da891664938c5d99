"""A minimal MCP client for one stdio server: initialise, list tools, call one (M-1, M-2).

The server is started with the command, arguments and environment of its configuration
entry, in a process group of its own, and spoken to in newline-delimited JSON-RPC 2.0 on its
stdin and stdout; its stderr is read as it comes, and its tail kept for error messages.  The
client announces :data:`~cortexfs.mcp.ANNOUNCED_VERSION` and refuses any negotiated version outside
:data:`~cortexfs.mcp.ACCEPTED_VERSIONS` — a draft, unknown or future version ends the session
before anything else is asked.  Requests the server makes of us (``ping``; sampling or roots,
which this client does not offer) are answered; notifications are read and dropped.

What the server writes is read as a server's words, never trusted to be sane: a message
larger than :data:`MAX_MESSAGE_BYTES` or nested deeper than :data:`MAX_MESSAGE_DEPTH`, a
listing of more than :data:`MAX_PAGES` pages, or a ``tools/call`` result holding a lone
surrogate (no character, so no text output can hold it), a text item whose text is no
string, or nested deeper than a tool's output may be (:data:`cortexfs.jsontext.MAX_DEPTH`)
breaks the protocol (``EPROTO``).
A server that exits before it answers is ``EIO`` with how it ended, whether its output ends
with it or a process it started (a launcher's helper) holds that output open; one that does
not read a request, or answer it, within the timeout is ``ETIMEDOUT``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO, Any

import cortexfs
from cortexfs import jsontext
from cortexfs.errors import CtxError, remedy_for_host_trouble
from cortexfs.mcp import ACCEPTED_VERSIONS, ANNOUNCED_VERSION
from cortexfs.mcp.config import ServerSpec
from cortexfs.process_limits import no_process_could_be_made
from cortexfs.readiness import readable, readable_or_writable, writable

DEFAULT_TIMEOUT = 30.0
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# Room for a tool's schema or result well beyond what a manifest holds (the tool is then
# reported and skipped, not the whole listing), and still far from the interpreter's
# recursion limit, which reading and re-encoding a message spend a frame of per level.
MAX_MESSAGE_DEPTH = 512
# A listing of more pages than this never ends: a server handing out fresh cursors forever.
MAX_PAGES = 1000
_STDERR_TAIL = 2000
_SHOWN_CHARACTERS = 60  # of a value the server gave where another belongs
_METHOD_NOT_FOUND = -32601
# How long a server whose output ended is given to exit, so that its status can be told.
_EXIT_GRACE = 2.0
# How often a wait for an answer looks whether the server is still running: a process it
# started (a launcher's helper) may hold its output open, which then never ends when it exits.
_EXIT_POLL = 0.1
# How long the stderr of a server that ended must stay silent to be taken as all it wrote,
# when a process it started holds it open: the server's last words are in the pipe already,
# and its reader takes them at once.
_STDERR_QUIET = 0.1


class McpError(CtxError):
    """The server failed, answered with an error, or broke the protocol."""


class StdioClient:
    """One session with a stdio server, as a context manager: started and initialised on
    entry; on exit its stdin is closed, then its process group is killed."""

    def __init__(
        self,
        spec: ServerSpec,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        own_process_group: bool = True,
        guard: Callable[[int], contextlib.AbstractContextManager[None]] | None = None,
    ) -> None:
        self.spec = spec
        self.timeout = timeout
        # A session of its own for the server, killed whole at the end (ctxmcp); or a child
        # in the caller's group, which whoever bounds the caller kills with it (a tool call).
        self.own_process_group = own_process_group
        # Given the server's process group as it starts, until it is killed at the end: what
        # kills the group should this process be killed first (SIGKILL ends no block).
        self.guard = guard
        self._guarded = contextlib.ExitStack()
        self.protocol_version = ""
        self.server_info: dict[str, Any] = {}
        self._ids = 0
        self._buffer = b""
        self._process: subprocess.Popen[bytes] | None = None
        self._stderr = _StderrTail()

    def __enter__(self) -> StdioClient:
        try:
            self._process = subprocess.Popen(
                [self.spec.command, *self.spec.args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, **self.spec.env},
                cwd=self.spec.cwd,
                start_new_session=self.own_process_group,
            )
        except OSError as exc:
            # subprocess names what failed: the command, or the cwd it could not enter.
            failed = self.spec.command
            if self.spec.cwd is not None and exc.filename == self.spec.cwd:
                failed = f"its cwd {self.spec.cwd}"
            mend = remedy_for_host_trouble(exc.errno)
            if exc.errno == errno.EAGAIN:  # fork refused: a limit of processes
                mend = no_process_could_be_made()
            raise McpError(
                exc.errno or errno.ENOEXEC,
                f"cannot start server {self.spec.name!r} ({failed}): {exc.strerror}"
                + (f"; {mend}, then try again" if mend else ""),
            ) from None
        assert self._process.stdin is not None
        # Written without blocking, so that a server that stops reading its input is cut off
        # at the deadline of what is being sent (:meth:`_send`), not waited on for ever.
        os.set_blocking(self._process.stdin.fileno(), False)
        if self.guard is not None:
            try:
                self._guarded.enter_context(self.guard(self._process.pid))
            except BaseException:
                self.__exit__(None, None, None)
                raise
        assert self._process.stderr is not None
        try:
            self._stderr.follow(self._process.stderr)
        except RuntimeError as exc:  # no thread to read its stderr: the server cannot be kept
            self._process.kill()
            self._process.wait()
            raise McpError(
                errno.EAGAIN,
                f"cannot follow server {self.spec.name!r}: no thread could be started to read "
                f"its stderr ({exc}): {no_process_could_be_made()}, then try again",
            ) from None
        try:
            self._initialize()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        process = self._process
        if process is not None:
            with contextlib.suppress(OSError):
                assert process.stdin is not None
                process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                # A server may exit by itself at the end of its input.
                process.wait(timeout=_EXIT_GRACE)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if self.own_process_group:
                    os.killpg(process.pid, signal.SIGKILL)
                else:
                    process.kill()
            process.wait()
            self._guarded.close()
            assert process.stdout is not None
            process.stdout.close()
        self._stderr.close()  # the server's group is gone: its stderr ends

    # ---------------------------------------------------------------- the protocol

    def _initialize(self) -> None:
        result = self.request(
            "initialize",
            {
                "protocolVersion": ANNOUNCED_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "ctxmcp", "version": cortexfs.__version__},
            },
        )
        version = result.get("protocolVersion") if isinstance(result, dict) else None
        if version not in ACCEPTED_VERSIONS:
            raise McpError(
                errno.EPROTO,
                f"server {self.spec.name!r} negotiated protocol version "
                f"{jsontext.spelt(version, _SHOWN_CHARACTERS)}; ctxmcp "
                f"accepts only {', '.join(ACCEPTED_VERSIONS)} (M-2)",
            )
        self.protocol_version = version
        info = result.get("serverInfo")
        self.server_info = info if isinstance(info, dict) else {}
        self.notify("notifications/initialized")

    def list_tools(self) -> list[Any]:
        """Every entry of the server's listing, across at most :data:`MAX_PAGES` pages: each
        should be a tool object, and one that is not is the projection's to report."""
        tools: list[Any] = []
        cursor = None
        seen: set[str] = set()
        for _ in range(MAX_PAGES):
            result = self.request("tools/list", {} if cursor is None else {"cursor": cursor})
            page = result.get("tools") if isinstance(result, dict) else None
            if not isinstance(page, list):
                raise self._broken("its tools/list result has no 'tools' list")
            tools += page
            cursor = result.get("nextCursor")
            if not cursor:
                return tools
            if not isinstance(cursor, str):
                shown = jsontext.spelt(cursor, _SHOWN_CHARACTERS)
                raise self._broken(f"its tools/list nextCursor {shown} is not a string")
            if cursor in seen:  # the same page again: it would never end
                raise self._broken(f"its tools/list gave the cursor {cursor!r} twice")
            seen.add(cursor)
        raise self._broken(f"its tools/list went on past {MAX_PAGES} pages, each with a new cursor")

    def call_tool(
        self, name: str, arguments: dict[str, Any], *, unbounded: bool = False
    ) -> dict[str, Any]:
        """One ``tools/call``.  ``unbounded``: no deadline of the client's own, for a caller that
        is bounded already (a tool call, which the runner's timeout kills): a remote tool
        may take as long as the call was given, not the client's timeout; a server that exits
        meanwhile ends the wait all the same (EIO)."""
        params = {"name": name, "arguments": arguments}
        result = self.request("tools/call", params, unbounded=unbounded)
        if not isinstance(result, dict):
            raise self._broken("its tools/call result is not an object")
        # What the caller is told rests on these: a success must not be made up of a result
        # whose content or error flag cannot be read.
        if not isinstance(result.get("content"), list):
            what = "no 'content'" if "content" not in result else "a 'content' that is not a list"
            raise self._broken(f"its tools/call result has {what}; MCP requires a list of items")
        if not all(isinstance(item, dict) for item in result["content"]):
            raise self._broken("its tools/call result's content holds an item that is no object")
        for item in result["content"]:
            # A text item's text is what a terminal caller is shown: anything but a string
            # would be shown in a spelling the server never sent (``None``, ``{'a': 1}``).
            if ("text" in item or item.get("type") == "text") and not isinstance(
                item.get("text"), str
            ):
                shown = json.dumps(item.get("text"))[:_SHOWN_CHARACTERS]
                raise self._broken(
                    f"its tools/call result's content holds a text item whose text is {shown}, "
                    "not a string"
                )
        # Its content and structured content, in an object, are the call's output, which
        # every reader takes only this deep (a result file, a session event, a native
        # frame): deeper, it would reach the caller as the text of its JSON, not the object.
        passed_on = [result["content"], result.get("structuredContent")]
        if any(jsontext.nested_deeper(part, jsontext.MAX_DEPTH - 1) for part in passed_on):
            raise self._broken(
                f"its tools/call result is nested deeper than {jsontext.MAX_DEPTH} levels, "
                "deeper than a tool's output may be"
            )
        if not isinstance(result.get("isError", False), bool):
            shown = json.dumps(result["isError"])[:_SHOWN_CHARACTERS]
            raise self._broken(f"its tools/call result's isError is {shown}, not true or false")
        character = jsontext.lone_surrogate(result)
        if character is not None:
            raise self._broken(
                f"its tools/call result holds {character!r}, a lone surrogate, which is not a "
                "character"
            )
        return result

    def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        """Send a notification, read by the server within the client's timeout."""
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self._send(message, time.monotonic() + self.timeout)

    def request(self, method: str, params: dict[str, Any], *, unbounded: bool = False) -> Any:
        """Send a request and wait for its response, answering the server meanwhile: for at
        most the client's timeout, sending included, or as long as it takes when
        ``unbounded``."""
        self._ids += 1
        ident = self._ids
        until = None if unbounded else time.monotonic() + self.timeout
        self._send({"jsonrpc": "2.0", "id": ident, "method": method, "params": params}, until)
        while True:
            message = self._receive(method, until)
            if "method" in message:
                self._answer(message, until)
                continue
            # One request is in flight at a time: a response to any other id answers nothing
            # this client asked, and waiting on would only wait for the timeout, or forever.
            if not (type(message.get("id")) is int and message["id"] == ident):
                shown = json.dumps(message.get("id"))[:_SHOWN_CHARACTERS]
                raise self._broken(
                    f"it answered id {shown}, but the only request in flight was {method}, "
                    f"id {ident}"
                )
            if "error" in message:
                error = message["error"]
                if not isinstance(error, dict):
                    shown = json.dumps(error)[:_SHOWN_CHARACTERS]
                    raise self._broken(f"its error answer to {method} is {shown}, not an object")
                told = error.get("message")
                # Shown as the server spelt them (JSON), never in Python's spelling (None).
                text = told if isinstance(told, str) and told else "no message"
                code = json.dumps(error.get("code"))[:_SHOWN_CHARACTERS]
                refused = f"server {self.spec.name!r} refused {method}"
                raise McpError(errno.EREMOTEIO, f"{refused}: {text} (code {code})")
            return message.get("result")

    def _answer(self, message: dict[str, Any], until: float | None) -> None:
        if "id" not in message:
            return  # a notification: progress, logging, list_changed
        if message["method"] == "ping":
            self._send({"jsonrpc": "2.0", "id": message["id"], "result": {}}, until)
        else:
            error = {"code": _METHOD_NOT_FOUND, "message": "not offered by ctxmcp"}
            self._send({"jsonrpc": "2.0", "id": message["id"], "error": error}, until)

    # ------------------------------------------------------------------ the wire

    def _send(self, message: dict[str, Any], until: float | None) -> None:
        """Write ``message`` whole by ``until``: a server that stops reading (its pipe full)
        is ETIMEDOUT there, as one that stops answering is; one that exits meanwhile, EIO."""
        assert self._process is not None and self._process.stdin is not None
        sent = str(message.get("method", "a response"))
        # A notification or a response: nothing answers it, so none is said to be owed.
        awaited = "id" in message and "method" in message
        stdin = self._process.stdin.fileno()
        assert self._process.stdout is not None
        stdout = self._process.stdout.fileno()
        data = memoryview(json.dumps(message).encode() + b"\n")
        watching_output = True
        while data:
            remaining = None if until is None else until - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise McpError(
                    errno.ETIMEDOUT,
                    f"server {self.spec.name!r} did not read {sent} within {self.timeout:g} s"
                    f"{self._stderr_tail()}",
                )
            wait = _EXIT_POLL if remaining is None else min(remaining, _EXIT_POLL)
            try:
                if watching_output:
                    has_written, takes = readable_or_writable(stdout, stdin, wait)
                else:
                    has_written, takes = False, bool(writable([stdin], wait))
                if has_written:
                    # A server may write while it reads (log notifications, a ping): taken
                    # now, for _receive, or a request larger than a pipe would have both wait
                    # on full pipes until the deadline.  Its output ended, or more of it
                    # kept than a message may hold, it is read no more while sending.
                    chunk = os.read(stdout, 65536)
                    self._buffer += chunk
                    if b"\n" in chunk:
                        self._drop_notifications()
                    watching_output = bool(chunk) and len(self._buffer) < MAX_MESSAGE_BYTES
                    continue
                if not takes:
                    # A process it started (a launcher's helper) may hold its input open.
                    if self._process.poll() is not None:
                        raise self._exited(sent, until, sending=True, awaited=awaited)
                    continue
                data = data[os.write(stdin, data) :]
            except BlockingIOError:
                continue
            except BrokenPipeError:
                raise self._exited(sent, until, sending=True, awaited=awaited) from None

    def _drop_notifications(self) -> None:
        """Drop the notifications (progress, logging) among the whole lines read: nothing
        answers them (:meth:`_answer`), and a server that logs as it reads a long request
        would otherwise fill what is kept for :meth:`_receive`.  A line that is not a
        well-formed JSON-RPC notification is kept, for :meth:`_receive` to say so."""
        *lines, rest = self._buffer.split(b"\n")
        kept = [line + b"\n" for line in lines if not _is_notification(line)]
        self._buffer = b"".join(kept) + rest

    def _receive(self, method: str, until: float | None) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            remaining = None if until is None else until - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise McpError(
                    errno.ETIMEDOUT,
                    f"server {self.spec.name!r} did not answer {method} within "
                    f"{self.timeout:g} s{self._stderr_tail()}",
                )
            assert self._process is not None and self._process.stdout is not None
            stdout = self._process.stdout.fileno()
            wait = _EXIT_POLL if remaining is None else min(remaining, _EXIT_POLL)
            if not readable([stdout], wait):
                # Whatever it wrote before it exited is in the pipe by then: read it first.
                if self._process.poll() is not None and not readable([stdout], 0):
                    raise self._exited(method, until)
                continue
            chunk = os.read(stdout, 65536)
            if not chunk:
                raise self._exited(method, until)
            self._buffer += chunk
            # The message is what comes before its line break: one read may bring the start
            # of the next message too, which is none of this one's size.
            end = self._buffer.find(b"\n")
            if (len(self._buffer) if end < 0 else end) > MAX_MESSAGE_BYTES:
                raise self._broken(f"a message is larger than {MAX_MESSAGE_BYTES} bytes")
        line, _, self._buffer = self._buffer.partition(b"\n")
        if len(line) > MAX_MESSAGE_BYTES:  # read whole while a request was being sent
            raise self._broken(f"a message is larger than {MAX_MESSAGE_BYTES} bytes")
        try:
            message = jsontext.loads_strict(line, unique_names=False, max_depth=MAX_MESSAGE_DEPTH)
        except json.JSONDecodeError as exc:
            problem = f"it wrote a line that cannot be read as JSON ({exc.msg}): {line[:80]!r}"
            raise self._broken(problem) from None
        except (UnicodeDecodeError, ValueError):
            raise self._broken(f"it wrote a line that is not JSON: {line[:80]!r}") from None
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            raise self._broken(f"it wrote a line that is not JSON-RPC 2.0: {line[:80]!r}")
        return message

    def _exited(
        self,
        method: str,
        until: float | None = None,
        *,
        sending: bool = False,
        awaited: bool = True,
    ) -> McpError:
        """EIO for a server whose output ended, or that exited, before it answered ``method``
        (or, ``sending``, whose input was closed before ``method`` could be sent to it; not
        ``awaited``, ``method`` is a notification or a response, which nothing answers).
        It can answer nothing more, so it is given no longer than a moment (and never past
        ``until``) to exit, for its status: a server that closed its output and lives on is
        stopped by :meth:`__exit__`, not waited for."""
        assert self._process is not None
        moment = _EXIT_GRACE if until is None else min(_EXIT_GRACE, until - time.monotonic())
        try:
            status = self._process.wait(timeout=max(0.0, moment))
        except subprocess.TimeoutExpired:
            closed = (
                f"closed its input before it was sent {method}"
                if sending
                else f"closed its output before answering {method}"
            )
            return McpError(
                errno.EIO,
                f"server {self.spec.name!r} {closed} and went on running; it was stopped"
                f"{self._stderr_tail()}",
            )
        # Whether a server that exits at once was sent the request first is the scheduler's
        # choice: said alike either way.
        before = f"before answering {method}" if awaited else f"before it could be sent {method}"
        return McpError(
            errno.EIO,
            f"server {self.spec.name!r} {_how_it_ended(status)} {before}{self._stderr_tail()}",
        )

    def _broken(self, what: str) -> McpError:
        return McpError(errno.EPROTO, f"server {self.spec.name!r} broke the protocol: {what}")

    def _stderr_tail(self) -> str:
        # A server that exited has written its last words: read them before they are shown.
        ended = self._process is not None and self._process.poll() is not None
        tail = self._stderr.tail(settle=_EXIT_GRACE if ended else 0.0)
        tail = tail.decode("utf-8", "replace").strip()
        return f"; its stderr ends: {tail}" if tail else ""


def _is_notification(line: bytes) -> bool:
    """Whether ``line`` is a JSON-RPC 2.0 notification, as :meth:`StdioClient._receive` would
    read it: a message with a method and no id."""
    try:
        message = jsontext.loads_strict(line, unique_names=False, max_depth=MAX_MESSAGE_DEPTH)
    except (ValueError, RecursionError):
        return False
    return (
        isinstance(message, dict)
        and message.get("jsonrpc") == "2.0"
        and "method" in message
        and "id" not in message
    )


def _how_it_ended(returncode: int) -> str:
    """``exited (status 3)``, or ``was killed by SIGXFSZ (exit status 153)`` for a server a
    signal ended (a negative return code), as a shell reports it."""
    if returncode >= 0:
        return f"exited (status {returncode})"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"was killed by {name} (exit status {128 - returncode})"


class _StderrTail:
    """A server's stderr, read as it comes by a thread of its own, of which only the last
    :data:`_STDERR_TAIL` bytes are kept (for error messages): a server that logs freely, idle
    or while a call waits, neither blocks on a full pipe nor fills memory or disk."""

    def __init__(self) -> None:
        self._kept = bytearray()
        self._heard = threading.Condition()  # notified at each chunk read, and at the end
        self._chunks = 0
        self._ended = False
        self._reader: threading.Thread | None = None

    def follow(self, pipe: IO[bytes]) -> None:
        self._reader = threading.Thread(
            target=self._drain, args=(pipe,), name="mcp-server-stderr", daemon=True
        )
        self._reader.start()

    def _drain(self, pipe: IO[bytes]) -> None:
        try:
            with pipe:
                while chunk := os.read(pipe.fileno(), 65536):
                    with self._heard:
                        self._kept += chunk
                        del self._kept[: max(0, len(self._kept) - _STDERR_TAIL)]
                        self._chunks += 1
                        self._heard.notify_all()
        finally:
            with self._heard:
                self._ended = True
                self._heard.notify_all()

    def tail(self, settle: float = 0.0) -> bytes:
        """The last bytes read; ``settle``: first wait at most that long for the server's last
        words (:meth:`_settle`)."""
        self._settle(settle)
        with self._heard:
            return bytes(self._kept)

    def close(self) -> None:
        """Wait for the reader to see the end of the server's stderr (its last writer gone);
        a descendant that kept it open is waited for only until it falls silent."""
        self._settle(_EXIT_GRACE)

    def _settle(self, longest: float) -> None:
        """Wait, at most ``longest`` seconds, for the end of the stream, or for it to stay
        silent for :data:`_STDERR_QUIET`: once the server has ended, only a process it started
        can hold its stderr open, and what that one writes is not the server's to say."""
        if self._reader is None:
            return
        deadline = time.monotonic() + longest
        with self._heard:
            while not self._ended:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                heard = self._chunks
                self._heard.wait(min(left, _STDERR_QUIET))
                if self._chunks == heard and not self._ended:
                    return
