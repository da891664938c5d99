"""The terminal socket of an agent session (SPEC A-2), from both ends.

Where it lives: ``/run/cortexfs/terminal/<root>/<uid>/<agent>/<session>/main.sock``, with the
session directory's ``terminal/main.sock`` a symlink to it.  ``<root>`` names the storage root
(:func:`root_key`) and ``<uid>`` is the agent's: agents of the same name in two storage roots
are two agents, and so are their terminals, which never share a directory.

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
import hashlib
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

from cortexfs.agents.host import is_host_administrator
from cortexfs.agents.view import AgentView
from cortexfs.errors import CtxError, denied, not_found
from cortexfs.shared.sessions import SessionRef

RUN_BASE = Path("/run/cortexfs/terminal")
SOCKET_NAME = "main.sock"
LINK_NAME = SOCKET_NAME  # the session's link bears the name of the socket it leads to
MODES = (b"watch", b"attach")
DETACH = b"\x1d"  # Ctrl-]
STOP_SECONDS = 30.0  # for a terminal to end after SIGTERM before stop says it did not
SCROLLBACK = 64 * 1024  # bytes of the shell's output a new client gets first
_MAX_SOCKET_ADDRESS = 107  # bytes of a UNIX socket's path, sun_path less its NUL
_MAX_MODE_LINE = 64  # bytes a client may send before the newline that ends its mode line
_ROOT_KEY_DIGITS = 16  # hex digits of a storage root's key: 64 bits, no two roots alike


def root_key(root: Path) -> str:
    """The storage root's directory under :data:`RUN_BASE`: the first 16 hex digits of the
    SHA-256 of its real path.  Links are resolved, so a root reached through a link
    (``storage/current``) and by the directory it names is one root; a digest, not the path,
    keeps the socket's path short and free of the root's own characters."""
    real = os.fsencode(os.path.realpath(root))
    return hashlib.sha256(real).hexdigest()[:_ROOT_KEY_DIGITS]


def run_directory(root: Path, uid: int, agent: str, session: str) -> Path:
    """The runtime directory of the terminal of ``agent`` (running as ``uid``) in ``session``
    of the storage root ``root``."""
    return RUN_BASE / root_key(root) / str(uid) / agent / session


def socket_path(view: AgentView, session: str) -> Path:
    """Where the terminal of ``view``'s ``session`` listens."""
    return run_directory(view.root, view.identity.uid, view.name, session) / SOCKET_NAME


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


# ------------------------------------------------------------------------- the client


def not_running(name: str, session: str) -> CtxError:
    return not_found(
        f"no terminal of {name} in session {session} is running; start one with "
        f"'ctx agent start {name} --session {session}'"
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
        raise not_running(view.name, session) from None
    with connection:
        connection.sendall(mode + b"\n")
        yield connection


def relay(connection: socket.socket, *, write: bool) -> None:
    """Terminal output to stdout; with ``write``, stdin to the terminal (raw on a tty) until
    end of input or Ctrl-] (:data:`DETACH`)."""
    stdin = sys.stdin.fileno()
    raw = write and os.isatty(stdin)
    saved = termios.tcgetattr(stdin) if raw else None
    if raw:
        tty.setraw(stdin)
    try:
        while True:
            readable = [connection] + ([stdin] if write else [])
            ready, _, _ = select.select(readable, [], [])
            if connection in ready:
                data = connection.recv(65536)
                if not data:
                    return
                os.write(sys.stdout.fileno(), data)
            if stdin in ready:
                data = os.read(stdin, 4096)
                # What came before Ctrl-] in the same read (a paste, a script) is the user's
                # input all the same: it reaches the terminal before detaching.
                typed, detach, _ = data.partition(DETACH)
                if typed:
                    connection.sendall(typed)
                if not data or detach:
                    return
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)


def stop(view: AgentView, session: str) -> int:
    """End the terminal of ``view``'s ``session`` and return its pid once it has ended:
    ENOENT when none runs, EPERM when another user started it, EBUSY when it does not end."""
    run_dir = run_directory(view.root, view.identity.uid, view.name, session)
    try:
        pid = int((run_dir / "pid").read_text())
    except (OSError, ValueError):
        pid = 0
    if not pid or not listening(socket_path(view, session)):  # a pid file alone may be stale
        raise not_running(view.name, session)
    try:
        os.kill(pid, signal.SIGTERM)
    except PermissionError:
        raise CtxError(
            errno.EPERM,
            f"the terminal of {view.name} (pid {pid}) runs as another user, who started it; "
            "stop it as that user or as root",
        ) from None
    deadline = time.monotonic() + STOP_SECONDS
    while run_dir.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if run_dir.exists():
        raise CtxError(errno.EBUSY, f"the terminal of {view.name} (pid {pid}) did not stop")
    return pid


# ------------------------------------------------------------------------- the terminal


class TerminalClients:
    """The terminal's side of the socket: its clients, their mode lines and the scrollback.

    A client is accepted with its peer uid; its first line says ``watch`` or ``attach``, and
    :func:`refusal` decides for that uid.  An accepted client first gets the last
    :data:`SCROLLBACK` bytes, then everything the shell prints; what an attached one sends
    goes to ``type_in`` (the PTY).  A client that cannot take output within two seconds is
    dropped rather than let it stall the terminal.
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

    def accept(self, listener: socket.socket) -> None:
        client, _ = listener.accept()
        client.setblocking(False)
        try:
            credentials = client.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")
            )
        except OSError:
            client.close()
            return
        self.peers[client] = struct.unpack("3i", credentials)[1]
        self.modes[client] = None
        self.selector.register(client, selectors.EVENT_READ, self._input)

    def broadcast(self, data: bytes) -> None:
        """What the shell printed: into the scrollback, and to every accepted client."""
        self.scrollback = (self.scrollback + data)[-SCROLLBACK:]
        for client, mode in list(self.modes.items()):
            if mode is not None:
                self._send(client, data)

    def close(self) -> None:
        for client in list(self.modes):
            self._drop(client)

    def _input(self, client: socket.socket) -> None:
        try:
            data = client.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(client)
            return
        mode = self.modes[client]
        if mode is None:
            # A stream keeps no message boundaries: the mode line may come in pieces.
            data = self.partial_mode_lines.pop(client, b"") + data
            line, newline, rest = data.partition(b"\n")
            if not newline and len(data) <= _MAX_MODE_LINE:
                self.partial_mode_lines[client] = data
                return
            if line.strip() not in MODES:
                self._send(client, b"ctxterm: expected 'watch' or 'attach' on the first line\n")
                self._drop(client)
                return
            reason = refusal(self.root, self.view, self.peers[client], line.strip())
            if reason:
                self._send(client, f"ctxterm: {denied(reason)}\n".encode())
                self._drop(client)
                return
            self.modes[client] = mode = line.strip()
            self._send(client, self.scrollback)
            data = rest
        if mode == b"attach" and data:
            self.type_in(data)

    def _send(self, client: socket.socket, data: bytes) -> None:
        try:
            client.setblocking(True)
            client.settimeout(2)
            client.sendall(data)
            client.setblocking(False)
        except OSError:
            self._drop(client)

    def _drop(self, client: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(client)
        self.modes.pop(client, None)
        self.peers.pop(client, None)
        self.partial_mode_lines.pop(client, None)
        client.close()
