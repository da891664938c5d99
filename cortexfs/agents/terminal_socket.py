"""The terminal socket of an agent session (SPEC A-2), from both ends.

Where it lives: ``/run/cortexfs/terminal/<root>/<uid>/<agent>/<session>/main.sock``, with the
session directory's ``terminal/main.sock`` a symlink to it through the root-less alias A-2
names (:mod:`cortexfs.agents.terminal_runtime`: agents of the same name in two storage roots
are two agents, and so are their terminals, which never share a directory).

Who may use it is decided by the peer's uid (``SO_PEERCRED``), by :func:`refusal` on both
ends: the client says no before it connects, the terminal again when the mode line arrives.
A client sends one mode line, ``watch`` or ``attach``, then raw PTY bytes flow.

The client's side is here (:func:`connect`, :func:`relay`, :func:`stop`), for ``ctx agent
watch|attach|stop``; so is the terminal's (:class:`TerminalClients`), which
:class:`cortexfs.agents.terminal.Terminal` serves.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import selectors
import signal
import socket
import struct
import sys
import termios
import time
import tty
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from cortexfs.agents import log as agent_log
from cortexfs.agents.host import is_host_administrator
from cortexfs.agents.terminal_runtime import (
    LINK_NAME,
    RunDirectory,
    run_directory,
    started_sessions,
    started_uids,
)
from cortexfs.agents.view import AgentView
from cortexfs.errors import CtxError, denied, not_found
from cortexfs.readiness import readable
from cortexfs.shared.sessions import SessionRef

MODES = (b"watch", b"attach")
DETACH = b"\x1d"  # Ctrl-]
QUIET_SECONDS = 1.0  # of no output, after a piped input ended, before attach leaves
STOP_SECONDS = 30.0  # for a terminal to end after SIGTERM before stop says it did not
SCROLLBACK = 64 * 1024  # bytes of the shell's output a new client gets first
_MAX_SOCKET_ADDRESS = 107  # bytes of a UNIX socket's path, sun_path less its NUL
_MAX_MODE_LINE = 64  # bytes a client may send before the newline that ends its mode line
MODE_LINE_SECONDS = 10.0  # for a client's mode line to arrive before it is dropped
MAX_CLIENTS = 64  # clients at once, besides root's: each holds one of ~1024 descriptors
MAX_BEHIND = 1024 * 1024  # bytes of output a client may have yet to take before it is dropped
STALL_SECONDS = 2.0  # a client that takes none of its waiting output for this long is dropped
CLOSING_SECONDS = 1.0  # for all clients together to take their last output as the terminal ends
ANSWER_SECONDS = 5.0  # for a terminal to send a watcher its first bytes (still_serves)


def socket_path(view: AgentView, session: str) -> Path:
    """Where the terminal of ``view``'s ``session`` listens."""
    return _run_directory(Whose.of(view), session).main_socket


class Whose(NamedTuple):
    """The agent whose terminal is looked for: its storage root, its name, and the uid of its
    identity; None when its controls are gone (removed by hand while its terminal ran)."""

    root: Path
    name: str
    uid: int | None

    @classmethod
    def of(cls, view: AgentView) -> Whose:
        return cls(view.root, view.name, view.identity.uid)


def terminal_uid(whose: Whose, session: str) -> int | None:
    """The uid the terminal of ``whose``'s ``session`` runs as: the agent's; or, when none was
    started under it, the one other uid one was started under: the agent's identity was
    changed (or its controls removed) since, and tsh keeps the ids it started with (its
    calls are refused, P-5 step 1), but it must still be found to be stopped.  None for an
    agent without an identity whose terminal is found under no uid, or under several."""

    def started_under(uid: int) -> bool:
        return os.path.lexists(run_directory(whose.root, uid, whose.name, session))

    if whose.uid is not None and started_under(whose.uid):
        return whose.uid
    others = [uid for uid in started_uids(whose.root) if started_under(uid)]
    return others[0] if len(others) == 1 else whose.uid


class Running(NamedTuple):
    """A terminal of an agent that runs: its session, the uid it runs as, ctxterm's pid."""

    session: str
    uid: int
    pid: int


def running_terminals(root: Path, agent: str) -> list[Running]:
    """The terminals of ``agent`` on ``root`` that run now, by session: those whose runtime
    directory a process holds open (its lock), under whichever uid each started as.  What
    this uid may not look at (another's pid file or descriptors) is not listed."""
    found = []
    for uid in started_uids(root):
        for session in started_sessions(root, uid, agent):
            with contextlib.suppress(OSError, CtxError):
                pid = RunDirectory(root, uid, agent, session).terminal_pid()
                if pid is not None:
                    found.append(Running(session, uid, pid))
    return found


def _run_directory(whose: Whose, session: str) -> RunDirectory:
    uid = terminal_uid(whose, session)
    if uid is None:
        raise not_running(whose.name, session)
    return RunDirectory(whose.root, uid, whose.name, session)


def terminal_link(session: SessionRef) -> Path:
    """The ABI path of a session's terminal socket (A-2): a symlink to the real one."""
    return session.path / "terminal" / LINK_NAME


def refusal(root: Path, agent: AgentView, uid: int, mode: bytes) -> str:
    """Why ``uid`` may not use ``agent``'s terminal in ``mode``; empty when it may.

    The host administrators (root, the owner of the storage root) may watch and attach;
    the agent's own uid may watch.  Attaching types into tsh as the agent, which only those
    who may start it may do (:func:`~cortexfs.agents.host.require_host_administrator`).
    """
    if is_host_administrator(root, uid):
        return ""
    if mode == b"watch" and uid == agent.identity.uid:
        return ""
    if mode == b"watch":
        return (
            f"uid {uid} may not watch agent {agent.name}'s terminal: only root, the owner of "
            f"{root} and the agent's uid {agent.identity.uid} may"
        )
    return (
        f"uid {uid} may not attach to agent {agent.name}'s terminal: only root and the owner "
        f"of {root} may (watch it instead)"
    )


@contextlib.contextmanager
def socket_address(path: Path) -> Iterator[str]:
    """An address that names the UNIX socket ``path`` for ``bind`` or ``connect``.

    An address holds at most 107 bytes, and the run directory of an agent and a session with
    names of legal length (R-3: 64 bytes each) is longer.  A longer ``path`` is named
    through its directory, opened here: ``/proc/self/fd/N/main.sock``."""
    if len(os.fsencode(path)) <= _MAX_SOCKET_ADDRESS:
        yield str(path)
        return
    directory = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{directory}/{path.name}"
    finally:
        os.close(directory)


def listening(path: Path) -> bool:
    """Whether a terminal answers on ``path`` (a socket left by a crash refuses)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            with socket_address(path) as address:
                probe.connect(address)
        except OSError:
            return False
    return True


def still_serves(path: Path, seconds: float = ANSWER_SECONDS) -> bool:
    """Whether a terminal still serves on ``path``, asked by a client it has just let go:
    it takes a watcher and sends it something (its scrollback, or why it refuses).

    A connection alone does not tell, then.  A killed terminal's descriptors are released one
    by one as it dies, its clients' connections often before its listener, so the client that
    sees its connection end can still connect for a moment: the connection waits in the dying
    listener's queue, and is reset when the listener goes.  One that is taken but not answered
    within ``seconds``, or kept waiting that long by a full queue of connections, counts as
    served: a terminal too busy to answer is not one that ended.
    """
    deadline = time.monotonic() + seconds

    def wait_left() -> float:  # never 0, which would make the socket non-blocking
        return max(0.001, deadline - time.monotonic())

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            with socket_address(path) as address:
                while True:
                    probe.settimeout(wait_left())
                    try:
                        probe.connect(address)
                        break
                    except BlockingIOError:  # a full queue: a listener is there
                        if time.monotonic() >= deadline:
                            return True
                        time.sleep(0.05)
            probe.settimeout(wait_left())
            probe.sendall(b"watch\n")
            return probe.recv(1) != b""
        except TimeoutError:
            return True
        except OSError:
            return False


def answers_by_another_path(run: RunDirectory) -> bool:
    """Whether the session's link leads, through the alias, to a terminal that answers but
    is not ``run``'s: one started when the storage root was reached by another path (moved
    since, or a link on its path changed).  Its directory is under the root's old key, so
    this one's lock is free, yet it is this root's terminal of the session all the same."""
    if run.link_target() != str(run.alias):
        return False
    try:
        leads_to = os.readlink(run.alias)
    except OSError:
        leads_to = None
    return leads_to != str(run.main_socket) and listening(run.alias)


def started_by_another_path(run: RunDirectory) -> str:
    """The terminal :func:`answers_by_another_path` found, in words: neither stopped nor
    started again on the root's path now, but on the path it was started on."""
    return (
        f"the terminal of {run.agent} in session {run.session.name} still runs (it answers at "
        f"{run.alias}), but it was started when the storage root {run.root} was reached by "
        "another path"
    )


# ------------------------------------------------------------------------- the client


def not_running(name: str, session: str) -> CtxError:
    return not_found(
        f"no terminal of {name} in session {session} is running; start one with "
        f"'ctx agent start {name} --session {session}'"
    )


def _not_answering(view: AgentView, session: str, path: Path, exc: OSError) -> CtxError:
    """Why nothing answered at the terminal socket ``path``: no terminal runs (ENOENT, start
    one); or one does, whose socket was removed or replaced since it started (ECONNREFUSED):
    'ctx agent start' would refuse to start another, so the way out is to stop it."""
    run = _run_directory(Whose.of(view), session)
    pid = run.terminal_pid()
    if pid is None:
        return not_running(view.name, session)
    return CtxError(
        errno.ECONNREFUSED,
        f"the terminal of {view.name} in session {session} runs (pid {pid}) but does not "
        f"answer at its socket {path} ({exc.strerror}: removed or replaced since it "
        f"started): end it with 'ctx agent stop {view.name} --session {session}', then "
        "start it again",
    )


@contextlib.contextmanager
def connect(root: Path, view: AgentView, session: str, mode: bytes) -> Iterator[socket.socket]:
    """The terminal socket of ``view``'s ``session``, connected in ``mode``: EACCES when this
    uid may not use it (the terminal refuses it too), ENOENT when no terminal answers there."""
    path = socket_path(view, session)
    reason = refusal(root, view, os.geteuid(), mode)
    if reason:
        raise denied(reason)
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with socket_address(path) as address:
            connection.connect(address)
    except OSError as exc:
        connection.close()
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise denied(
                f"the terminal socket {path} of {view.name}, session {session}, is not open "
                f"to uid {os.geteuid()} ({exc.strerror}); a terminal started by an older ctx "
                "keeps it root's: restart it, or watch as root"
            ) from None
        raise _not_answering(view, session, path, exc) from None
    with connection:
        # A terminal that turns this client away at once (too many clients) may have closed
        # before the mode line is sent: its reason is still there to read (relay).
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            connection.sendall(mode + b"\n")
        yield connection


def relay(connection: socket.socket, *, write: bool) -> bool:
    """Terminal output to stdout; with ``write``, stdin to the terminal (raw on a tty) until
    Ctrl-] (:data:`DETACH`) or the end of input.  After the end of input (a script piped in)
    the output goes on until the terminal has been quiet for :data:`QUIET_SECONDS`, so that
    what the script typed is seen answered.  Whether it was the terminal that closed the
    connection (it ended, or it refused this client, saying why)."""
    stdin = sys.stdin.fileno()
    raw = write and os.isatty(stdin)
    saved = termios.tcgetattr(stdin) if raw else None
    if raw:
        tty.setraw(stdin)
    reading = write
    first = True
    try:
        while True:
            waited = [connection] + ([stdin] if reading else [])
            timeout = QUIET_SECONDS if write and not reading else None
            ready = readable(waited, timeout)
            if not ready:
                return False  # quiet since the input ended
            if connection in ready:
                try:
                    data = connection.recv(65536)
                except ConnectionResetError:
                    return True
                if not data:
                    return True
                if first:
                    first = False
                    data = _unless_refused(connection, data)
                os.write(sys.stdout.fileno(), data)
            if stdin in ready:
                data = os.read(stdin, 4096)
                # What came before Ctrl-] in the same read (a paste, a script) is the user's
                # input all the same: it reaches the terminal before detaching.
                typed, detach, _ = data.partition(DETACH)
                if typed:
                    try:
                        connection.sendall(typed)
                    except (BrokenPipeError, ConnectionResetError):
                        return True  # the terminal let this client go, or ended
                if detach:
                    return False
                reading = bool(data)
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)


class Stopped(NamedTuple):
    """What ``ctx agent stop`` did: ended a running terminal (``running``), and removed what a
    terminal that died had left (``cleaned``, in words)."""

    pid: int | None  # the terminal's, as its pid file says (None: there was none)
    running: bool
    cleaned: tuple[str, ...]


def stop(whose: Whose, session: str) -> Stopped:
    """End the terminal of ``whose``'s ``session`` and return once it has ended and nothing of it
    is left.  A terminal that died without cleaning up (killed: its view still mounted) is
    cleaned up after instead.  ENOENT when none runs and none left anything, EPERM when this
    user may not end it (root started it), EBUSY when it does not end."""
    run = _run_directory(whose, session)
    if os.geteuid() != 0:
        _refuse_to_stop(whose, session, run)
    held = run.try_lock()
    if held is None:  # nothing ran here since the machine started; a link may be left
        if answers_by_another_path(run):
            raise CtxError(
                errno.EBUSY,
                f"{started_by_another_path(run)}: move the root back to where it was, stop "
                "the terminal there, then move the root again",
            )
        if run.remove_link(stale_only=True):
            link = terminal_link(run.session)
            return Stopped(None, False, (f"removed the link {link} to a socket that is gone",))
        raise not_running(whose.name, session)
    if held:
        return _clean_up_after(run, whose, session)
    pid = _end_running(run, whose, session)
    if not run.locked:
        return Stopped(pid, True, ())  # it ended and removed its directory, as it should
    try:  # it ended and left something behind (an unmount that failed)
        cleaned = tuple(run.clean_up())
        run.remove()
    finally:
        run.release()
    return Stopped(pid, True, cleaned)


def _clean_up_after(run: RunDirectory, whose: Whose, session: str) -> Stopped:
    """No terminal runs (the caller holds the lock): remove what one that died left."""
    try:
        pid = run.recorded_pid()
        cleaned = tuple(run.clean_up())
        run.remove()
    finally:
        run.release()
    if not cleaned:
        raise not_running(whose.name, session)
    if whose.uid is not None:  # an agent whose controls are gone has no log to keep it in
        agent_log.record_lost_terminal(whose.root, whose.name, session, pid, cleaned)
    return Stopped(pid, False, cleaned)


def _end_running(run: RunDirectory, whose: Whose, session: str) -> int | None:
    """SIGTERM to the terminal that holds the lock, once its pid file names it (a terminal
    still starting has none yet); its pid once the lock is free, held here if the directory
    is still there (what the terminal left, for the caller to clean up)."""
    deadline = time.monotonic() + STOP_SECONDS
    signalled = None
    while True:
        pid = run.terminal_pid()
        if pid is not None and pid != signalled:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            signalled = pid
        if run.try_lock() is not False:
            return signalled
        if time.monotonic() > deadline:
            which = f"(pid {signalled})" if signalled else "(still starting: no pid yet)"
            kill = f"'kill -9 {signalled}'" if signalled else "killing it"
            raise CtxError(
                errno.EBUSY,
                f"the terminal of {whose.name} {which} did not stop within {STOP_SECONDS:.0f} s;"
                f" after {kill}, 'ctx agent stop {whose.name} --session {session}' cleans up "
                "after it",
            )
        time.sleep(0.05)


def _refuse_to_stop(whose: Whose, session: str, run: RunDirectory) -> None:
    """Only root ends a terminal (root started it) or cleans up after one: EPERM when there
    is one, ENOENT when there is none."""
    if listening(run.main_socket):
        raise CtxError(
            errno.EPERM,
            f"the terminal of {whose.name} runs as root, who started it; stop it as root",
        )
    if run.pid_file.exists():
        raise CtxError(
            errno.EPERM,
            f"the terminal of {whose.name} in session {session} ended without cleaning up (its "
            f"view may still be mounted); root cleans up after it with 'ctx agent stop "
            f"{whose.name} --session {session}'",
        )
    raise not_running(whose.name, session)


# ------------------------------------------------------------------------- the terminal


def _unless_refused(connection: socket.socket, data: bytes) -> bytes:
    """The first bytes the terminal sent, to be shown; CtxError with the terminal's errno and
    reason when they are its refusal of this client: one line ``ctxterm: ENAME: reason``
    followed by the end of the connection.  Output that merely begins so (the scrollback)
    goes on instead, and is shown whole."""
    if not data.startswith(_REFUSAL):
        return data
    connection.settimeout(REFUSAL_SECONDS)
    try:
        while b"\n" not in data and len(data) <= _MAX_REFUSAL:
            more = connection.recv(_MAX_REFUSAL)
            if not more:
                break
            data += more
        line, _, after = data.partition(b"\n")
        ended = not after and not connection.recv(1, socket.MSG_PEEK)
    except (TimeoutError, BlockingIOError):
        return data  # the connection goes on: output
    except ConnectionResetError:
        line, ended = data.partition(b"\n")[0], True
    finally:
        connection.settimeout(None)
    if not ended:
        return data
    name, _, reason = line[len(_REFUSAL) :].decode("utf-8", "replace").partition(": ")
    code = getattr(errno, name, None) if name.isupper() else None
    if not isinstance(code, int) or not reason:
        return data
    raise CtxError(code, f"the terminal refused this client: {reason}")


_REFUSAL = b"ctxterm: "
_MAX_REFUSAL = 4096
REFUSAL_SECONDS = 1.0  # for the end of the connection after a line that may be a refusal


class TerminalClients:
    """The terminal's side of the socket: its clients, their mode lines and the scrollback.

    A client is accepted with its peer uid; its first line says ``watch`` or ``attach``, and
    :func:`refusal` decides for that uid.  An accepted client first gets the last
    :data:`SCROLLBACK` bytes, then everything the shell prints; what an attached one sends
    goes to ``type_in`` (the PTY).

    Output is never sent to a client by waiting on it: what its socket does not take at once
    waits in the client's own buffer, sent as its socket drains, so a client that stops
    reading (any process of the agent's uid may connect one) costs the terminal and the other
    clients nothing.  It is dropped once it has taken none of that output for
    :data:`STALL_SECONDS`, or is more than :data:`MAX_BEHIND` bytes behind.
    """

    def __init__(
        self,
        root: Path,
        view: AgentView,
        selector: selectors.BaseSelector,
        type_in: Callable[[bytes], None],
    ) -> None:
        self.root = root
        self.view = view
        self.selector = selector
        self.type_in = type_in
        self.scrollback = b""
        self.modes: dict[socket.socket, bytes | None] = {}  # mode, None until its line
        self.peers: dict[socket.socket, int] = {}  # each client's uid
        self.partial_mode_lines: dict[socket.socket, bytes] = {}  # a mode line still arriving
        self.arrived: dict[socket.socket, float] = {}  # when each client connected
        self.others: set[socket.socket] = set()  # clients of uids not the host administrators'
        self.holding = False  # attached clients' input left in their sockets for now
        self.behind: dict[socket.socket, bytearray] = {}  # output a client has yet to take
        self.progressed: dict[socket.socket, float] = {}  # when it last took some of it
        self.ended: set[socket.socket] = set()  # clients that shut their sending side

    def take(self, client: socket.socket) -> None:
        """A new client, kept only if its uid may at least watch (the socket is open to every
        uid, and a connection holds one of the terminal's descriptors), and only until
        :data:`MODE_LINE_SECONDS` pass without its mode line (:meth:`drop_silent`).  Clients
        of uids other than the host administrators' (the agent's own, watching) are kept
        while there are fewer than :data:`MAX_CLIENTS` of them: whatever runs as the agent
        cannot fill the terminal and keep its operator out."""
        client.setblocking(False)
        try:
            credentials = client.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
            )
        except OSError:
            client.close()
            return
        uid = struct.unpack("3i", credentials)[1]
        counted = not is_host_administrator(self.root, uid)
        problem: CtxError | None = None
        reason = refusal(self.root, self.view, uid, b"watch")
        if reason:
            problem = denied(reason)
        elif counted and len(self.others) >= MAX_CLIENTS:
            problem = CtxError(
                errno.EAGAIN,
                f"the terminal serves {MAX_CLIENTS} clients of uids other than root and the "
                f"owner of {self.root} at once; try again later",
            )
        if problem is not None:
            with contextlib.suppress(OSError):
                client.send(f"ctxterm: {problem}\n".encode())
                # Its mode line, if it came, read: a socket closed with bytes unread resets
                # the connection, and the client would get no reason but ECONNRESET.
                client.recv(_MAX_MODE_LINE + 1)
            client.close()
            return
        self.peers[client] = uid
        self.modes[client] = None
        self.arrived[client] = time.monotonic()
        if counted:
            self.others.add(client)
        self.selector.register(client, selectors.EVENT_READ, self._ready)

    def hold_input(self, hold: bool) -> None:
        """Stop reading what attached clients type (``hold``), or read it again: while the
        terminal holds more typed input than the PTY has taken, the rest waits in the
        clients' sockets, and a client sending more waits for it, rather than the terminal
        buffering without bound."""
        if hold == self.holding:
            return
        self.holding = hold
        for client, mode in list(self.modes.items()):
            if mode == b"attach":
                self._watch(client)

    def drop_silent(self) -> None:
        """Drop the clients whose mode line has not come within :data:`MODE_LINE_SECONDS`,
        those that have taken none of their waiting output for :data:`STALL_SECONDS`, and
        those that shut their sending side and have closed since (on an idle terminal, no
        send would tell)."""
        now = time.monotonic()
        late = now - MODE_LINE_SECONDS
        for client, mode in list(self.modes.items()):
            silent = mode is None and self.arrived.get(client, late) <= late
            stalled = (
                bool(self.behind.get(client)) and self.progressed[client] <= now - STALL_SECONDS
            )
            if silent or stalled or (client in self.ended and _hung_up(client)):
                self._drop(client)

    def broadcast(self, data: bytes) -> None:
        """What the shell printed: into the scrollback, and to every accepted client."""
        self.scrollback = (self.scrollback + data)[-SCROLLBACK:]
        for client, mode in list(self.modes.items()):
            if mode is not None:
                self._send(client, data)

    def close(self) -> None:
        """Give each client what it has yet to take, within :data:`CLOSING_SECONDS` for all of
        them together (the shell's last words, that the terminal ended), then drop them."""
        deadline = time.monotonic() + CLOSING_SECONDS
        for client in list(self.modes):
            waiting = self.behind.get(client)
            left = deadline - time.monotonic()
            if waiting and left > 0:
                with contextlib.suppress(OSError):
                    client.settimeout(left)
                    client.sendall(waiting)
            self._drop(client)

    def _ready(self, client: socket.socket) -> None:
        """The client's socket can take output or has input (the selector does not say which:
        both are tried, neither waits)."""
        if self.behind.get(client):
            self._flush(client)
        if client in self.modes and self._reads(client):
            self._input(client)

    def _reads(self, client: socket.socket) -> bool:
        """Whether what ``client`` sends is read now: not once it has sent all it will, nor
        while an attached one's input is held."""
        if client in self.ended:
            return False
        return not (self.holding and self.modes.get(client) == b"attach")

    def _watch(self, client: socket.socket) -> None:
        """Register ``client`` for what the terminal waits on it for: its input unless that is
        held, its socket's room while output waits for it; neither, not at all."""
        events = (selectors.EVENT_READ if self._reads(client) else 0) | (
            selectors.EVENT_WRITE if self.behind.get(client) else 0
        )
        try:
            registered = self.selector.get_key(client).events
        except KeyError:
            registered = 0
        if events == registered:
            return
        if not events:
            self.selector.unregister(client)
        elif registered:
            self.selector.modify(client, events, self._ready)
        else:
            self.selector.register(client, events, self._ready)

    def _input(self, client: socket.socket) -> None:
        try:
            data = client.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(client)  # reset: gone
            return
        if not data:
            if self.modes[client] is None or _hung_up(client):
                self._drop(client)  # its mode line can no longer come, or it closed
            else:
                # It shut its sending side only (nc -N and socat do at the end of their
                # input): what it sent is typed, and the output goes on reaching it until it
                # goes away (a send then fails) or the terminal ends.
                self.ended.add(client)
                self._watch(client)
            return
        mode = self.modes[client]
        if mode is None:
            # A stream keeps no message boundaries: the mode line may come in pieces.
            data = self.partial_mode_lines.pop(client, b"") + data
            line, newline, rest = data.partition(b"\n")
            if not newline and len(data) <= _MAX_MODE_LINE:
                self.partial_mode_lines[client] = data
                return
            # Exactly 'watch\n' or 'attach\n': a line with anything more is a client
            # that speaks another protocol, and is told so rather than guessed at.
            if line not in MODES:
                self._send(client, b"ctxterm: expected 'watch' or 'attach' on the first line\n")
                self._drop(client)
                return
            reason = refusal(self.root, self.view, self.peers[client], line)
            if reason:
                self._send(client, f"ctxterm: {denied(reason)}\n".encode())
                self._drop(client)
                return
            self.modes[client] = mode = line
            self._send(client, self.scrollback)
            data = rest
        if mode == b"attach" and data:
            self.type_in(data)
        if mode == b"attach" and self.holding and client in self.modes:
            self._watch(client)  # it attached while input is held: what it types waits too

    def _send(self, client: socket.socket, data: bytes) -> None:
        """``data`` after what ``client`` has yet to take, sent as far as its socket takes it
        now; the rest waits for the socket's room (:meth:`_ready`)."""
        if client not in self.peers or not data:
            return
        waiting = self.behind.setdefault(client, bytearray())
        if not waiting:
            self.progressed[client] = time.monotonic()
        waiting += data
        if len(waiting) > MAX_BEHIND:
            self._drop(client)
            return
        self._flush(client)

    def _flush(self, client: socket.socket) -> None:
        waiting = self.behind[client]
        while waiting:
            try:
                sent = client.send(waiting)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._drop(client)
                return
            del waiting[:sent]
            self.progressed[client] = time.monotonic()
        self._watch(client)

    def _drop(self, client: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(client)
        self.modes.pop(client, None)
        self.peers.pop(client, None)
        self.partial_mode_lines.pop(client, None)
        self.arrived.pop(client, None)
        self.others.discard(client)
        self.behind.pop(client, None)
        self.progressed.pop(client, None)
        self.ended.discard(client)
        client.close()


def _hung_up(client: socket.socket) -> bool:
    """Whether the peer of ``client`` closed its end, not only shut its sending side: the
    kernel then reports a hang-up, which a half-closed socket (``nc -N``) does not."""
    poller = select.poll()
    poller.register(client, select.POLLIN)
    return any(events & select.POLLHUP for _, events in poller.poll(0))
