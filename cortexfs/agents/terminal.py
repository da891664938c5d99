"""The agent terminal: ``ctxterm`` owns a PTY, runs ``tsh`` in a sandbox, and lets the host
watch or join it (SPEC A-1, A-2, H-1, T-5).

:class:`Terminal` is the process ``ctx agent start`` leaves running, as root:

* **The view.**  The agent's ``/ctx`` is ``ctx mount --as AGENT`` (the projection of T-5),
  mounted privately; the sandbox (bubblewrap) sees it at ``/ctx``, the agent's visible mounts
  at their targets, the system's ``/usr`` read-only, and nothing else of the host.
* **The workspace** (A-1).  When the agent's mounts have no ``/workspace``, the directory
  ``ctx agent start`` ran in (or ``--workspace DIR``) is bound there read-write — as far as
  Linux lets the agent's uid write — and tsh starts there.  The host administrator starting
  the terminal grants it, for this terminal only: the tools tsh runs see the same mount, and
  the agent's controls are not changed.
* **The shell.**  ``/ctx/bin/tsh`` runs there as the agent's uid, gid and groups, with the PTY
  as its controlling terminal, ``CTX_PATH`` from the agent's policy and mounts, and the run
  socket at ``/run/ctx/run.sock``.
* **The run socket.**  tsh hands each command line over it with its stdin, stdout and stderr
  (``SCM_RIGHTS``); the terminal checks the peer is the agent's uid and runs the tool with
  :func:`~cortexfs.tools.runner.run_terminal` in a child process — the whole authority chain,
  hooks, the tool's log and the session's events, as ``ctx run`` — then answers with the
  exit status.
* **The terminal socket** (A-2).  A client sends one mode line, then raw PTY bytes flow:
  ``watch`` reads the output only, ``attach`` also writes its input to the PTY.  A new client
  first gets the last :data:`SCROLLBACK` bytes.  The socket lives in
  ``/run/cortexfs/terminal/<uid>/<agent>/<session>/main.sock`` and the session directory's
  ``terminal/main.sock`` is a symlink to it.  Whoever may use it is decided by the peer's uid
  (``SO_PEERCRED``), as for the run socket, so the directories are root's and searchable
  (0711) and the socket is 0666: :func:`refusal` says who may watch and who may attach.  The
  view's mount point is in ``private/`` (0700) beside it, out of everyone else's reach.

:meth:`Terminal.start` returns once tsh runs in the sandbox and has printed its prompt; a
sandbox that ends first (bubblewrap cannot bind a mount, say) makes the start fail with what
it said, and nothing is left running.  When tsh exits, or on SIGTERM, the terminal closes its
clients, unmounts the view and removes its sockets and the directories its start made.  Its
start and its end are facts in the agent's log (:mod:`cortexfs.agents.log`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

from cortexfs import durable
from cortexfs.agents import log as agent_log
from cortexfs.agents.host import is_host_administrator
from cortexfs.agents.view import WORKSPACE, AgentView
from cortexfs.errors import CtxError, denied, invalid, not_found
from cortexfs.shared.events import EVENTS_FILE
from cortexfs.shared.sessions import SessionRef, open_session
from cortexfs.shared.tree import Ownership, open_beneath

RUN_BASE = Path("/run/cortexfs/terminal")
SCROLLBACK = 64 * 1024
SANDBOX_RUN_SOCKET = "/run/ctx/run.sock"
SANDBOX_TSH = "/ctx/bin/tsh"
MODES = (b"watch", b"attach")
_MAX_SOCKET_ADDRESS = 107  # bytes of a UNIX socket's path, sun_path less its NUL
_MAX_MODE_LINE = 64  # bytes a client may send before the newline that ends its mode line
STARTUP_SECONDS = 30.0  # for tsh to come up in its sandbox before the start is a failure
_SEARCHABLE = 0o711  # others may pass through to a socket they know the name of, not list
_SANDBOX_PROGRAMS = (b"bwrap", b"setpriv")  # what runs before tsh in the shell's session
_MAX_REQUEST = 1024 * 1024
_SYSTEM_DIRS = ("/usr", "/etc")
Request = dict[str, object]
LINK_NAME = "main.sock"
_NO_LINK_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def run_directory(uid: int, agent: str, session: str) -> Path:
    return RUN_BASE / str(uid) / agent / session


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


class Terminal:
    """One agent terminal, from start to cleanup."""

    def __init__(self, root: Path, agent: str, session: str, workspace: Path | None = None) -> None:
        """``workspace``: the directory for ``/workspace`` when the agent's mounts have none."""
        self.root = root
        self.workspace = None if workspace is None else Path(os.path.realpath(workspace))
        self.view = AgentView.load(root, agent).with_workspace(self.workspace)
        self.session = SessionRef.home(root, self.view.identity.uid, agent, session)
        self.run_dir = run_directory(self.view.identity.uid, agent, session)
        self.main_socket = self.run_dir / "main.sock"
        self.run_socket = self.run_dir / "run.sock"
        self.view_dir = self.run_dir / "private" / "ctx"
        self.made: list[Path] = []  # the run directories prepare() made (the base among them?)
        self.selector = selectors.DefaultSelector()
        self.clients: dict[socket.socket, bytes | None] = {}  # mode, None until its line
        self.peers: dict[socket.socket, int] = {}  # each client's uid
        self.partial_mode_lines: dict[socket.socket, bytes] = {}  # a mode line still arriving
        self.scrollback = b""
        self.master = -1
        self.pty_closed = False  # every process on the shell side has let go of it
        self.shell: subprocess.Popen[bytes] | None = None
        self.mount: subprocess.Popen[bytes] | None = None
        self.stopping = False
        self.started = False  # tsh runs and the start is recorded
        self.session_made = False  # prepare() made the session's directory
        self.calls: set[int] = set()  # children running a tool for tsh

    def workspace_warning(self) -> str | None:
        """Why the default ``/workspace`` may grant more than its starter meant: a workspace
        holding the storage root (started in ``/`` or in the root itself) shows the agent the
        root past its filtered view (T-5) — the mode bits still apply to its uid.  None when
        it does not."""
        workspace = self.view.workspace
        if workspace is None:
            return None
        root = Path(os.path.realpath(self.root))
        if not root.is_relative_to(workspace.source):
            return None
        return (
            f"/workspace is {workspace.source}, which holds the storage root {root}: "
            f"{self.view.name} reaches it there past its view of /ctx (as far as the mode "
            "bits let its uid); give --workspace DIR or --no-workspace to grant less"
        )

    # ------------------------------------------------------------------- starting

    def prepare(self) -> None:
        """Everything that can fail, before anything is left running: EINVAL/EEXIST."""
        if os.geteuid() != 0:
            agent = self.view.name
            reason = (
                "an agent terminal is started by root: its sandbox (bubblewrap) and the switch "
                f"to the agent's identity need root; have root run 'ctx --storage {self.root} "
                f"agent start {agent}', or run one tool call at a time with 'ctx run --agent "
                f"{agent} TOOL'"
            )
            raise CtxError(errno.EPERM, reason)
        if shutil.which("bwrap") is None:
            raise invalid("bubblewrap (bwrap) is not installed; the terminal runs in its sandbox")
        if not os.access(self.root / "bin" / "tsh", os.X_OK):
            raise invalid(f"{self.root}/bin/tsh is missing; run 'ctx bootstrap'")
        if self.view.workspace is not None and not os.path.isdir(self.view.workspace.source):
            raise CtxError(
                errno.ENOTDIR, f"the workspace {self.view.workspace.source} is not a directory"
            )
        self._require_mount_sources()
        if self.main_socket.exists():
            if listening(self.main_socket):
                agent, session = self.view.name, self.session.name
                raise CtxError(
                    errno.EEXIST,
                    f"the terminal of {agent} in session {session} is already running: watch "
                    f"it with 'ctx agent watch {agent} --session {session}', end it with "
                    f"'ctx agent stop {agent} --session {session}', or start another "
                    "session with --session",
                )
            self._remove_run_files()  # left by a terminal that did not end cleanly
        self._make_run_directory()
        identity = self.view.identity
        self.session_made = not os.path.lexists(self.session.path)
        open_session(self.session, owner=Ownership(identity.uid, identity.gid)).close()

    def _require_mount_sources(self) -> None:
        """ENOENT for a mount whose source is missing, before anything is started: the
        sandbox could not bind it and tsh would never run."""
        for mount in self.view.visible_mounts():
            if str(mount.target) == "/ctx":
                continue  # the projection, mounted from the storage root
            if not os.path.exists(mount.source):
                raise not_found(
                    f"the source {mount.source} of agent {self.view.name}'s mount at "
                    f"{mount.target} does not exist; create it or change agent/"
                    f"{self.view.name}.d/mount"
                )

    def _make_run_directory(self) -> None:
        """``RUN_BASE/<uid>/<agent>/<session>/private/``, each directory made here remembered
        in ``made``.  One that another terminal's end removes between two steps is made
        again."""
        agent_dir = self.run_dir.parent
        chain = [RUN_BASE, agent_dir.parent, agent_dir, self.run_dir, self.view_dir.parent]
        RUN_BASE.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        for _ in range(5):
            try:
                for directory in chain:
                    mode = 0o700 if directory == self.view_dir.parent else _SEARCHABLE
                    try:
                        directory.mkdir(mode=mode)
                        self.made.append(directory)
                    except FileExistsError:
                        pass
                    directory.chmod(mode)
                return
            except FileNotFoundError:
                continue
        raise CtxError(errno.EAGAIN, f"{self.run_dir} kept disappearing while it was made")

    def start(self) -> None:
        self._mount_view()
        self._listen()
        self._spawn_shell()
        self._await_tsh()
        with self._terminal_directory() as directory:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(LINK_NAME, dir_fd=directory)
            os.symlink(self.main_socket, LINK_NAME, dir_fd=directory)
        workspace = next(
            (m.source for m in self.view.visible_mounts() if m.target == WORKSPACE), None
        )
        agent_log.record(
            self.root,
            self.view.name,
            agent_log.TERMINAL_STARTED,
            session=self.session.name,
            pid=os.getpid(),
            workspace=None if workspace is None else str(workspace),
        )
        self.started = True

    @contextlib.contextmanager
    def _terminal_directory(self) -> Iterator[int]:
        """``session/<s>/terminal/``, made if missing.  The session belongs to the agent's uid,
        which could plant a link there: it is reached, and used, without following any."""
        ops = durable.default_ops()
        session = open_beneath(ops, self.root, self.session.relative.parts)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir("terminal", 0o755, dir_fd=session)
            directory = os.open("terminal", _NO_LINK_DIRECTORY, dir_fd=session)
        except OSError as exc:
            raise CtxError(
                errno.ELOOP,
                f"{self.session.path}/terminal is not a directory of its own "
                f"({exc.strerror}): the terminal socket is never put through a link",
            ) from None
        finally:
            os.close(session)
        try:
            yield directory
        finally:
            os.close(directory)

    def _mount_view(self) -> None:
        self.view_dir.mkdir(mode=0o700, exist_ok=True)
        self.mount = subprocess.Popen(
            [sys.executable, "-m", "cortexfs", "--storage", str(self.root), "mount",
             "--as", self.view.name, str(self.view_dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while not os.path.ismount(self.view_dir):
            if self.mount.poll() is not None or time.monotonic() > deadline:
                raise CtxError(errno.EIO, f"the view of {self.view.name} could not be mounted")
            time.sleep(0.05)

    def _listen(self) -> None:
        for path, handler in (
            (self.main_socket, self._accept_client),
            (self.run_socket, self._run),
        ):
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with socket_address(path) as address:
                listener.bind(address)
            listener.listen(16)
            listener.setblocking(False)
            self.selector.register(listener, selectors.EVENT_READ, handler)
        # Both are reached by whoever the peer uid check lets in (refusal(), _read_request).
        self.run_socket.chmod(0o666)
        self.main_socket.chmod(0o666)

    def _spawn_shell(self) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
        identity = self.view.identity
        groups = ",".join(str(g) for g in sorted(identity.groups))
        environment = {
            "PATH": "/usr/bin:/bin",
            "HOME": "/workspace" if self._workspace() else "/",
            "TERM": os.environ.get("TERM", "xterm-256color"),
            "LANG": "C.UTF-8",
            "CTX_AGENT": self.view.name,
            "CTX_SESSION": self.session.name,
            "CTX_PATH": self.view.ctx_path(),
            "CTX_RUN_SOCKET": SANDBOX_RUN_SOCKET,
        }
        command = [
            "bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            *self._network_isolation(),
            "--hostname", f"{self.view.name}", "--proc", "/proc", "--dev", "/dev",
            "--tmpfs", "/tmp", "--tmpfs", "/run",
            *_system_binds(),
            "--bind", str(self.view_dir), "/ctx",
            "--perms", "0755", "--dir", os.path.dirname(SANDBOX_RUN_SOCKET),
            "--bind", str(self.run_socket), SANDBOX_RUN_SOCKET,
            *self._mount_binds(),
            "--chdir", "/workspace" if self._workspace() else "/",
            "setpriv", f"--reuid={identity.uid}", f"--regid={identity.gid}",
            f"--groups={groups}" if groups else "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs",
            "--", SANDBOX_TSH,
        ]  # fmt: skip
        self.shell = subprocess.Popen(
            command,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            env=environment,
            start_new_session=True,
            preexec_fn=_take_terminal,
        )
        os.close(slave)
        os.set_blocking(self.master, False)
        self.selector.register(self.master, selectors.EVENT_READ, self._shell_output)

    def _await_tsh(self) -> None:
        """Return once tsh runs in the sandbox and has printed something (its prompt).

        bubblewrap and setpriv print only to fail, then end: whatever the sandbox says
        before it ends is the reason the start fails with (EIO unless it names an errno's
        text, as bubblewrap's "Can't find source path /x: No such file or directory").
        """
        assert self.shell is not None
        deadline = time.monotonic() + STARTUP_SECONDS
        while not (self.scrollback and self._tsh_runs()):
            if self.shell.poll() is not None:
                self._drain()
                said = " ".join(self.scrollback.decode(errors="replace").split())
                status = self.shell.returncode
                raise CtxError(
                    _errno_named_in(said),
                    f"the sandbox of {self.view.name} ended before tsh ran (exit {status})"
                    + (f": {said}" if said else ""),
                )
            if time.monotonic() > deadline:
                raise CtxError(
                    errno.ETIMEDOUT,
                    f"tsh did not come up in the sandbox of {self.view.name} within "
                    f"{STARTUP_SECONDS:.0f} s",
                )
            if self.pty_closed:
                time.sleep(0.05)  # the sandbox is ending: wait for its exit status
            elif select_readable(self.master, 0.05):
                self._shell_output(None)

    def _tsh_runs(self) -> bool:
        """Whether tsh itself (not bubblewrap or setpriv before it) runs in the shell's session."""
        assert self.shell is not None
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.getsid(int(entry)) != self.shell.pid:
                    continue
                argv = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue  # gone meanwhile
            if os.path.basename(argv[0]) not in _SANDBOX_PROGRAMS and SANDBOX_TSH.encode() in argv:
                return True
        return False

    def _network_isolation(self) -> list[str]:
        """No network in the terminal without ``network:default connect`` (P-4).  tsh reaches
        the host through the run socket, a path, which works from any network namespace."""
        return [] if self.view.allows("network", "default", "connect") else ["--unshare-net"]

    def _workspace(self) -> bool:
        return any(m.target == WORKSPACE for m in self.view.visible_mounts())

    def _mount_binds(self) -> list[str]:
        binds = []
        # A mount below another's target is bound after it, or the outer one would hide it.
        by_depth = sorted(self.view.visible_mounts(), key=lambda mount: len(mount.target.parts))
        for mount in by_depth:
            if str(mount.target) == "/ctx":
                continue  # the projection, not the raw root
            binds += [
                "--bind" if mount.writable else "--ro-bind",
                str(mount.source),
                str(mount.target),
            ]
        return binds

    # ------------------------------------------------------------------- serving

    def serve(self) -> int:
        """Relay until tsh exits or SIGTERM; then clean up.  tsh's exit status."""
        signal.signal(signal.SIGTERM, lambda *_: setattr(self, "stopping", True))
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select() to reap
        try:
            while not self.stopping:
                for key, _ in self.selector.select(timeout=0.2):
                    key.data(key.fileobj)
                self._reap()
                assert self.shell is not None
                if self.shell.poll() is not None:
                    self._drain()
                    break
        finally:
            self._record_stopped()
            self.close()
        return self._shell_status() or 0

    def _shell_status(self) -> int | None:
        """tsh's exit status as a shell reports it (128 + N after signal N, as a stop's
        SIGKILL leaves it); None while it runs.  A negative return code would reach the
        caller of ctxterm as its low byte (247 for SIGKILL)."""
        status = None if self.shell is None else self.shell.poll()
        return status if status is None or status >= 0 else 128 - status

    def _record_stopped(self) -> None:
        """The end, in the agent's log before the sockets go (``ctx agent stop`` waits for
        them to go); a log that cannot be written does not keep the terminal from ending."""
        exit_status = self._shell_status()
        facts: dict[str, object] = {"reason": "stop" if self.stopping else "exit"}
        if exit_status is not None:
            facts["exit_status"] = exit_status
        with contextlib.suppress(OSError, CtxError):
            agent_log.record(
                self.root,
                self.view.name,
                agent_log.TERMINAL_STOPPED,
                session=self.session.name,
                **facts,
            )

    def _shell_output(self, _: object) -> None:
        try:
            data = os.read(self.master, 65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:  # EIO: the shell side is closed
            if not self.pty_closed:
                self.pty_closed = True
                self.selector.unregister(self.master)
            return
        if data:
            self.scrollback = (self.scrollback + data)[-SCROLLBACK:]
            for client, mode in list(self.clients.items()):
                if mode is not None:
                    self._send(client, data)

    def _drain(self) -> None:
        with contextlib.suppress(OSError, KeyError, ValueError):
            self._shell_output(None)

    def _accept_client(self, listener: socket.socket) -> None:
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
        self.clients[client] = None
        self.selector.register(client, selectors.EVENT_READ, self._client_input)

    def _client_input(self, client: socket.socket) -> None:
        try:
            data = client.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(client)
            return
        mode = self.clients[client]
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
            self.clients[client] = mode = line.strip()
            self._send(client, self.scrollback)
            data = rest
        if mode == b"attach" and data:
            with contextlib.suppress(OSError):
                os.write(self.master, data)

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
        self.clients.pop(client, None)
        self.peers.pop(client, None)
        self.partial_mode_lines.pop(client, None)
        client.close()

    def _run(self, listener: socket.socket) -> None:
        """One message from tsh: a command line to run as the agent in a child process, which
        answers with its exit status; or an interrupt for the running call."""
        connection, _ = listener.accept()
        connection.setblocking(True)
        with connection:
            request, descriptors = self._read_request(connection)
            try:
                if request is None:
                    return
                if request.get("interrupt") is True:
                    self._interrupt_calls()
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

    def _read_request(
        self, connection: socket.socket
    ) -> tuple[dict[str, object] | None, list[int]]:
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

    def _interrupt_calls(self) -> None:
        """SIGINT to each running call; the runner passes it on to the tool's group."""
        for pid in self.calls:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)

    def _run_tool(self, tool: str, argv: list[str], descriptors: list[int]) -> int:
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

    def _reap(self) -> None:
        """Collect the calls that have ended (the shell and the view are Popen's to reap)."""
        for pid in list(self.calls):
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0] == 0:
                    continue
            self.calls.discard(pid)

    # ------------------------------------------------------------------- stopping

    def close(self) -> None:
        for client in list(self.clients):
            self._drop(client)
        if self.shell is not None and self.shell.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.shell.pid, signal.SIGKILL)
            self.shell.wait()
        if self.mount is not None and self.mount.poll() is None:
            self.mount.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.mount.wait(timeout=10)
        with contextlib.suppress(OSError, CtxError), self._terminal_directory() as directory:
            os.unlink(LINK_NAME, dir_fd=directory)
        self._remove_run_files()
        if self.session_made and not self.started:
            self._remove_unused_session()

    def _remove_unused_session(self) -> None:
        """A start that failed leaves no session of its own making behind: the directory goes
        when it holds nothing but the empty ``events.jsonl`` (and ``terminal/``) it was given.
        It is the agent's uid's to write, so it is reached without following any link."""
        ops = durable.default_ops()
        with contextlib.suppress(OSError, CtxError):
            sessions = open_beneath(ops, self.root, self.session.relative.parent.parts)
            try:
                session = os.open(self.session.name, _NO_LINK_DIRECTORY, dir_fd=sessions)
                try:
                    if os.stat(EVENTS_FILE, dir_fd=session, follow_symlinks=False).st_size == 0:
                        os.unlink(EVENTS_FILE, dir_fd=session)
                    with contextlib.suppress(OSError):
                        os.rmdir("terminal", dir_fd=session)
                finally:
                    os.close(session)
                os.rmdir(self.session.name, dir_fd=sessions)
            finally:
                os.close(sessions)

    def _remove_run_files(self) -> None:
        """Never a recursive removal: the view's mount point may still be mounted (an unmount
        that failed), and removing through it would remove the agent's files.  The session's
        directory goes, and the agent's and the uid's above it when nothing else (another
        session's terminal) is in them, whichever terminal made them: the one that made the
        agent's may have ended while this session's was in it.  (A terminal starting meanwhile
        makes them again: :meth:`_make_run_directory`.)  The base goes only if this one made it.
        """
        for name in ("main.sock", "run.sock", "pid"):
            with contextlib.suppress(FileNotFoundError):
                (self.run_dir / name).unlink()
        agent_dir = self.run_dir.parent
        emptied = [self.view_dir, self.view_dir.parent, self.run_dir, agent_dir, agent_dir.parent]
        if RUN_BASE in self.made:
            emptied.append(RUN_BASE)
        for directory in emptied:
            with contextlib.suppress(OSError):
                directory.rmdir()


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


def select_readable(fd: int, timeout: float) -> bool:
    """Whether ``fd`` has something to read within ``timeout`` seconds."""
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        return bool(selector.select(timeout))


def _errno_named_in(message: str) -> int:
    """The errno whose text (``No such file or directory``) ``message`` holds; EIO when none."""
    for code in (errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOTDIR):
        if os.strerror(code) in message:
            return code
    return errno.EIO


def _system_binds() -> list[str]:
    binds = []
    for directory in _SYSTEM_DIRS:
        binds += ["--ro-bind", directory, directory]
    for link in ("bin", "lib", "lib64", "sbin"):
        target = f"/{link}"
        if os.path.islink(target):
            binds += ["--symlink", os.readlink(target), target]
        elif os.path.isdir(target):
            binds += ["--ro-bind", target, target]
    return binds


def _take_terminal() -> None:
    """In the shell's process, before exec: the PTY becomes its controlling terminal, and
    Ctrl-C on it no longer ends the sandbox's own processes (the signal reaches the whole
    foreground group); tsh asks for SIGINT back for itself."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)
