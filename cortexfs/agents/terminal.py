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
* **The shell.**  ``/ctx/bin/tsh`` runs in the sandbox (:mod:`cortexfs.agents.sandbox`) as the
  agent's uid, gid and groups, with the PTY as its controlling terminal and ``CTX_PATH`` from
  the agent's policy and mounts.
* **The run socket** (:mod:`cortexfs.agents.run_socket`).  tsh hands each command line over
  it; the terminal runs the tool as the agent, through the whole authority chain, as
  ``ctx run`` would.  It serves the sandbox's pid namespace only, not the agent's uid at
  large, and sits in ``private/``: only the sandbox's bind of it reaches it.
* **The terminal socket** (A-2, :mod:`cortexfs.agents.terminal_socket`).  Clients watch or
  join the PTY; the directories are root's and searchable (0711) and the socket is 0666,
  because the peer's uid decides who may use it.  The view's mount point is in ``private/``
  (0700) beside it, out of everyone else's reach.
* **The runtime directory** (:mod:`cortexfs.agents.terminal_runtime`) holds both sockets, the
  pid file and the view's mount point; the terminal holds its lock from the first check of
  its start to the end of its cleanup.  A start finds it free and what a terminal that died
  left in it (its view still mounted): it cleans that up first, and says so (``cleaned``).

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
import os
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import IO

from cortexfs import capabilities, durable
from cortexfs.agents import log as agent_log
from cortexfs.agents import sandbox
from cortexfs.agents.run_socket import RunSocket, sandbox_namespace
from cortexfs.agents.terminal_runtime import RunDirectory
from cortexfs.agents.terminal_socket import (
    TerminalClients,
    Whose,
    answers_by_another_path,
    socket_address,
    started_by_another_path,
    terminal_uid,
)
from cortexfs.agents.view import WORKSPACE, AgentView
from cortexfs.errors import CtxError, errno_named_in, invalid, not_found
from cortexfs.fuse.mounts import cortexfs_mount_holding, mounted_type, unmount
from cortexfs.policy.mounts import Mount
from cortexfs.shared.events import EVENTS_FILE
from cortexfs.shared.sessions import SessionRef, open_session
from cortexfs.shared.tree import Ownership, open_beneath
from cortexfs.storage import executes_nothing, mounted_noexec
from cortexfs.tools.host_programs import find_program, names_setpriv_misreads
from cortexfs.tools.spawn import shell_status
from cortexfs.user_namespace import in_a_user_namespace

STARTUP_SECONDS = 30.0  # for tsh to come up in its sandbox before the start is a failure
TYPED_BACKLOG = 64 * 1024  # bytes typed but not yet taken by the PTY before clients wait
ACCEPT_REST_SECONDS = 0.5  # a listener rests this long after an accept found no descriptor
_NO_LINK_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Terminal:
    """One agent terminal, from start to cleanup."""

    def __init__(self, root: Path, agent: str, session: str, workspace: Path | None = None) -> None:
        """``workspace``: the directory for ``/workspace`` when the agent's mounts have none."""
        self.root = root
        self.workspace = None if workspace is None else Path(os.path.realpath(workspace))
        self.view = AgentView.load(root, agent).with_workspace(self.workspace)
        started_as = terminal_uid(Whose.of(self.view), session)
        if started_as != self.view.identity.uid:
            # Another of this session, of the agent's old ids, would run beside it unseen.
            raise CtxError(
                errno.EEXIST,
                f"the terminal of {agent} in session {session} was started as uid "
                f"{started_as}, before agent/{agent}.d/identity changed to uid "
                f"{self.view.identity.uid}, and was not stopped: end it with 'ctx agent stop "
                f"{agent} --session {session}', then start it again",
            )
        self.session = SessionRef.home(root, self.view.identity.uid, agent, session)
        self.runtime = RunDirectory(root, self.view.identity.uid, agent, session)
        self.run_dir = self.runtime.path
        self.main_socket = self.runtime.main_socket
        self.run_socket = self.runtime.run_socket
        self.view_dir = self.runtime.view_dir
        self.cleaned: list[str] = []  # what prepare() removed that a terminal that died left
        self.dead_pid: int | None = None  # that terminal's pid
        self.selector = selectors.DefaultSelector()
        self.clients = TerminalClients(root, self.view, self.selector, self._type_in)
        self.master = -1
        self.pty_closed = False  # every process on the shell side has let go of it
        self.typed = bytearray()  # what attached clients typed that the PTY has not taken yet
        self.shell: subprocess.Popen[bytes] | None = None
        self.bwrap = "bwrap"  # bubblewrap, as prepare finds it
        self.mount: subprocess.Popen[bytes] | None = None
        self.view_lost = False  # the view's mount ended while the terminal served
        self.stopping = False
        self.started = False  # tsh runs and the start is recorded
        # What prepare() made for the session, which a start that fails takes away: the
        # directories from the session's up (deepest first), its events.jsonl, its terminal/.
        self.made_for_session: list[PurePosixPath] = []
        self.made_in_session: list[str] = []
        self.run_calls = RunSocket(root, self.view, self.session, self.workspace, self.selector)
        self.resting: dict[socket.socket, tuple[Callable[[socket.socket], None], float]] = {}
        self.listeners: list[socket.socket] = []

    def workspace_mount(self) -> Mount | None:
        """The mount this terminal shows at ``/workspace``: the agent's own mount there, or
        the default the host gave (A-1); None for neither."""
        return next((m for m in self.view.visible_mounts() if m.target == WORKSPACE), None)

    def workspace_source(self) -> PurePosixPath | None:
        """The directory this terminal shows at ``/workspace``; None for none."""
        mount = self.workspace_mount()
        return None if mount is None else mount.source

    def workspace_overridden(self) -> str | None:
        """Why the directory given for ``/workspace`` is not mounted: the agent's mount
        control has a ``/workspace`` of its own, which wins (A-1); None when it is used."""
        source = self.workspace_source()
        if self.workspace is None or self.view.workspace is not None or source is None:
            return None
        return (
            f"{self.workspace} is not mounted at /workspace: agent {self.view.name}'s mount "
            f"control has its own /workspace ({source}), which wins"
        )

    def workspace_warning(self) -> str | None:
        """Why the default ``/workspace`` may grant more than its starter meant: a workspace
        holding the storage root (started in ``/`` or in the root itself), lying inside it
        (started in ``ROOT/shared``), or on a CortexFS mount shows the agent storage objects
        past its filtered view (T-5, F-1) — the mode bits still apply to its uid.  None when
        it does not."""
        workspace = self.view.workspace
        if workspace is None:
            return None
        source = Path(workspace.source)
        root = Path(os.path.realpath(self.root))
        if root.is_relative_to(source):
            where = f"which holds the storage root {root}"
        elif Path(os.path.realpath(source)).is_relative_to(root):
            where = f"inside the storage root {root}"
        elif (mount := cortexfs_mount_holding(source)) is not None:
            where = f"on the CortexFS mount {mount}"
        else:
            return None
        return (
            f"/workspace is {source}, {where}: {self.view.name} reaches the objects there "
            "past its view of /ctx and its policy (as far as the mode bits let its uid); give "
            "--workspace DIR or --no-workspace to grant less"
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
        needed = [capabilities.CAP_SYS_ADMIN, capabilities.CAP_SETUID, capabilities.CAP_SETGID]
        # tsh runs undumpable as the agent: the host tells a call from its sandbox by the
        # caller's pid namespace (/proc/PID/ns/pid), which only CAP_SYS_PTRACE may read there.
        needed.append(capabilities.CAP_SYS_PTRACE)
        if not self.view.allows("network", "default", "connect"):
            needed.append(capabilities.CAP_NET_ADMIN)  # bwrap's loopback in the new network
        capabilities.require(
            f"a terminal of {self.view.name} (its view mounted, its sandbox, tsh as the agent)",
            *needed,
        )
        # Root runs it before any switch of ids: found as the runner finds setpriv, on PATH's
        # absolute directories of root's only, and run from where it was found.  Looked for
        # after the capabilities: in a user namespace no directory is root's, and what to say
        # there is that the namespace lacks them.
        bwrap = find_program("bwrap")
        if bwrap is None and in_a_user_namespace():
            raise invalid(
                "no bubblewrap (bwrap) in a directory of root's: in this user namespace the "
                "host's root is not mapped, so no system directory is root's here; the "
                "terminal runs in its sandbox: start it outside the namespace, as root"
            )
        if bwrap is None:
            raise invalid(
                "bubblewrap (bwrap) is not installed (looked for in PATH's absolute "
                "directories that only root may change); the terminal runs in its sandbox"
            )
        self.bwrap = bwrap
        tsh = self.root / "bin" / "tsh"
        if not os.access(tsh, os.X_OK):
            if os.path.isfile(tsh) and mounted_noexec(tsh):
                raise CtxError(errno.EACCES, executes_nothing(tsh, tsh, "the storage root"))
            shape = "is not executable" if os.path.lexists(tsh) else "is missing"
            raise invalid(f"{tsh} {shape}; run 'ctx bootstrap'")
        if self.view.workspace is not None and not os.path.isdir(self.view.workspace.source):
            raise CtxError(
                errno.ENOTDIR, f"the workspace {self.view.workspace.source} is not a directory"
            )
        self._require_mount_sources()
        self._require_ids_setpriv_reads_as_numbers()
        if answers_by_another_path(self.runtime):
            # Its directory is under the root's old key: the lock taken next says nothing of
            # it, and the clean-up would take its link for a dead terminal's.
            raise CtxError(
                errno.EEXIST,
                f"{started_by_another_path(self.runtime)}: move the root back to where it was "
                "and stop the terminal there, then move the root again and start it; or start "
                "another session with --session",
            )
        self.runtime.make_and_lock()
        cleaned_up = False  # until then, what is here is a dead terminal's, and stays
        try:
            self.dead_pid = self.runtime.recorded_pid()
            self.cleaned = self.runtime.clean_up()
            cleaned_up = True
            if self.cleaned:
                agent_log.record_lost_terminal(
                    self.root, self.view.name, self.session.name, self.dead_pid, self.cleaned
                )
            identity = self.view.identity
            self._note_what_the_session_lacks()
            open_session(self.session, owner=Ownership(identity.uid, identity.gid)).close()
            self.runtime.require_link_place()
        except BaseException:
            # A clean-up refused (a view that cannot be unmounted: EBUSY) leaves the dead
            # terminal's files as they are, for 'ctx agent stop' or the next start to name.
            self.runtime.remove(files=cleaned_up)
            self._remove_unused_session()
            self.runtime.release()
            raise

    def _note_what_the_session_lacks(self) -> None:
        """Before the session is opened: what opening it and linking its terminal will make."""
        for relative in (self.session.relative, *self.session.relative.parents[:-1]):
            if os.path.lexists(self.root / relative):
                break
            self.made_for_session.append(relative)
        lacking = (EVENTS_FILE, "terminal")
        self.made_in_session = [n for n in lacking if not os.path.lexists(self.session.path / n)]

    def cleaned_warning(self) -> str | None:
        """What the start cleaned up after a terminal of this session that had died (killed,
        its view left mounted); None when there was nothing."""
        if not self.cleaned:
            return None
        pid = "" if self.dead_pid is None else f" (pid {self.dead_pid})"
        return (
            f"the terminal of {self.view.name} in session {self.session.name}{pid} had ended "
            "without cleaning up: " + "; ".join(self.cleaned)
        )

    def _require_ids_setpriv_reads_as_numbers(self) -> None:
        """EINVAL when a user or group is named like one of the agent's ids: setpriv, which
        switches tsh to them inside the sandbox, would take that name's id instead (a group
        named 1001 with gid 5000 would make the agent gid 5000)."""
        misread = names_setpriv_misreads(self.view.identity)
        if misread:
            raise invalid(
                f"the terminal of {self.view.name} cannot be started with its identity: "
                f"{'; '.join(misread)}, and setpriv, which switches tsh to the agent's ids, "
                "reads a name before a number; rename what is named like a number, or give "
                f"the agent other ids in agent/{self.view.name}.d/identity"
            )

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

    def start(self) -> None:
        self._mount_view()
        self._listen()
        self._spawn_shell()
        self._await_tsh()
        self._admit_sandbox()
        self.runtime.make_link()
        workspace = self.workspace_source()
        agent_log.record(
            self.root,
            self.view.name,
            agent_log.TERMINAL_STARTED,
            session=self.session.name,
            pid=os.getpid(),
            workspace=None if workspace is None else str(workspace),
        )
        self.started = True

    def _mount_view(self) -> None:
        self.view_dir.mkdir(mode=0o700, exist_ok=True)
        # Its complaints go to a file of no name, read only when the mount fails: a pipe that
        # nobody reads while the view serves would stop it once full.
        with tempfile.TemporaryFile() as complaints:
            self.mount = subprocess.Popen(
                [sys.executable, "-m", "cortexfs", "--storage", str(self.root), "mount",
                 "--as", self.view.name, str(self.view_dir)],
                stdout=subprocess.DEVNULL, stderr=complaints,
            )  # fmt: skip
            deadline = time.monotonic() + 30
            while not os.path.ismount(self.view_dir):
                if self.mount.poll() is not None or time.monotonic() > deadline:
                    raise self._not_mounted(complaints)
                time.sleep(0.05)

    def _not_mounted(self, complaints: IO[bytes]) -> CtxError:
        """Why the view could not be mounted: the last line ``ctx mount`` wrote (``ctx:
        ENOSYS: FUSE support is not installed …``), its errno kept; EIO when it said nothing."""
        complaints.seek(0)
        said = complaints.read()[-4096:].decode("utf-8", "replace").strip().splitlines()
        last = said[-1] if said else ""
        code, reason = errno.EIO, ""
        if last.startswith("ctx: "):
            name, _, reason = last[len("ctx: ") :].partition(": ")
            code = getattr(errno, name, errno.EIO) if name.isupper() else errno.EIO
        elif last:
            reason = last
        where = f"the view of {self.view.name} could not be mounted"
        return CtxError(code, f"{where}: {reason}" if reason else where)

    def _listen(self) -> None:
        for path, take in (
            (self.main_socket, self.clients.take),
            (self.run_socket, self.run_calls.serve),
        ):
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            with socket_address(path) as address:
                listener.bind(address)
            listener.listen(16)
            listener.setblocking(False)
            self.listeners.append(listener)
            self.selector.register(listener, selectors.EVENT_READ, self._accepting(take))
        # The peer decides: its uid for the terminal socket (refusal()), its pid namespace
        # for the run socket, which tsh reaches through the sandbox's bind (RunSocket).
        self.run_socket.chmod(0o666)
        self.main_socket.chmod(0o666)

    def _accepting(self, take: Callable[[socket.socket], None]) -> Callable[[socket.socket], None]:
        """The handler of a listener: accept a connection and hand it to ``take``.  Out of
        descriptors (or memory), the connection stays queued and the listener readable, so
        the loop would wake at once, round after round; the listener rests instead, until
        :data:`ACCEPT_REST_SECONDS` have passed (:meth:`_wake_rested`)."""

        def accept(listener: socket.socket) -> None:
            try:
                connection, _ = listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return  # the client went before it was taken
            except OSError:
                self.selector.unregister(listener)
                self.resting[listener] = (accept, time.monotonic() + ACCEPT_REST_SECONDS)
                return
            take(connection)

        return accept

    def _wake_rested(self) -> None:
        now = time.monotonic()
        for listener, (accept, until) in list(self.resting.items()):
            if until <= now:
                del self.resting[listener]
                self.selector.register(listener, selectors.EVENT_READ, accept)

    def _spawn_shell(self) -> None:
        sources = sandbox.open_mount_sources(self.view)
        try:
            self.master, slave = os.openpty()
            try:
                fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
                self.shell = subprocess.Popen(
                    sandbox.shell_command(
                        self.bwrap, self.view, self.view_dir, self.run_socket, sources
                    ),
                    stdin=slave,
                    stdout=slave,
                    stderr=slave,
                    env=sandbox.shell_environment(self.view, self.session.name),
                    start_new_session=True,
                    preexec_fn=sandbox.spare_the_sandbox,
                    pass_fds=[source.descriptor for source in sources],
                )
            finally:
                os.close(slave)
        finally:
            sandbox.close_sources(sources)  # bubblewrap has its own copies
        os.set_blocking(self.master, False)
        self.selector.register(self.master, selectors.EVENT_READ, self._master_ready)

    def _await_tsh(self) -> None:
        """Return once tsh runs in the sandbox and has printed something (its prompt).

        bubblewrap and setpriv print only to fail, then end: whatever the sandbox says
        before it ends is the reason the start fails with (EIO unless it names an errno's
        text, as bubblewrap's "Can't find source path /x: No such file or directory").
        """
        assert self.shell is not None
        deadline = time.monotonic() + STARTUP_SECONDS
        while not (self.clients.scrollback and sandbox.tsh_runs(self.shell.pid)):
            if self.shell.poll() is not None:
                self._drain()
                said = " ".join(self.clients.scrollback.decode(errors="replace").split())
                status = self.shell.returncode
                raise CtxError(
                    errno_named_in(said),
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
            elif _readable_within(self.master, 0.05):
                self._shell_output(None)

    def _admit_sandbox(self) -> None:
        """The run socket serves tsh's pid namespace and no other (:mod:`run_socket`): EPERM
        when the sandbox has none of its own, for then every process of the agent's uid
        would look like tsh to it."""
        assert self.shell is not None
        self.run_calls.sandbox = sandbox_namespace(self.shell.pid)
        if self.run_calls.sandbox is None:
            raise CtxError(
                errno.EPERM,
                f"the sandbox of {self.view.name} has no pid namespace of its own, so its run "
                f"socket cannot tell tsh from other processes of uid {self.view.identity.uid}",
            )

    # ------------------------------------------------------------------- serving

    def serve(self) -> int:
        """Relay until tsh exits or SIGTERM; then clean up.  tsh's exit status."""
        # SIGHUP too: the controlling terminal of a foreground ctxterm went away, or someone
        # hung it up; either way the terminal ends as a stop ends it, cleaned up and logged.
        for ending in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(ending, lambda *_: setattr(self, "stopping", True))
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select() to reap
        # Each tool call runs in a child forked from here (RunSocket): a child holding the lock
        # would keep a terminal killed while a tool runs looking alive until the tool ends.
        os.register_at_fork(after_in_child=self.runtime.forget_lock)
        try:
            while not self.stopping:
                for key, _ in self.selector.select(timeout=0.2):
                    key.data(key.fileobj)
                self.run_calls.reap()
                self._notice_view_lost()
                self.run_calls.drop_silent()
                self.clients.drop_silent()
                self._wake_rested()
                assert self.shell is not None
                if self.shell.poll() is not None:
                    self._drain()
                    break
        finally:
            self.run_calls.end()  # their results are recorded before the terminal's end
            self._record_stopped()
            self.close()
        return self._tsh_status() or 0

    def _notice_view_lost(self) -> None:
        """Reap the view's mount once it has ended (killed, or out of memory), which would
        otherwise wait as a zombie until the terminal ends, and say so in the agent's log
        once: the agent's ``/ctx`` answers ``ENOTCONN`` from then on, and only a stop and a
        start give it a view again.  The terminal serves on, its clients kept (tsh says why it
        finds no tool): what the agent was doing is for its administrator to judge."""
        if self.mount is None or self.view_lost or self.mount.poll() is None:
            return
        self.view_lost = True
        with contextlib.suppress(OSError, CtxError):
            agent_log.record(
                self.root,
                self.view.name,
                agent_log.TERMINAL_VIEW_LOST,
                session=self.session.name,
                pid=self.mount.pid,
                exit_status=shell_status(self.mount.returncode),
            )

    def _tsh_status(self) -> int | None:
        """tsh's exit status as a shell reports it (128 + N after signal N, as a stop's
        SIGKILL leaves it); None while it runs.  A negative return code would reach the
        caller of ctxterm as its low byte (247 for SIGKILL)."""
        status = None if self.shell is None else self.shell.poll()
        return None if status is None else shell_status(status)

    def _record_stopped(self) -> None:
        """The end, in the agent's log before the sockets go (``ctx agent stop`` waits for
        them to go); a log that cannot be written does not keep the terminal from ending."""
        exit_status = self._tsh_status()
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
            self.clients.broadcast(data)

    def _master_ready(self, _: object) -> None:
        self._shell_output(None)
        self._feed()

    def _type_in(self, data: bytes) -> None:
        """What an attached client typed, to the PTY as if the agent typed it: all of it, in
        order (:meth:`_feed`)."""
        self.typed += data
        self._feed()

    def _feed(self) -> None:
        """Give the PTY as much of what was typed as it takes now, and the rest as it becomes
        writable, from the loop that serves everything else: the PTY takes a few KiB at a
        time, and tsh reads more only once the calls it asked for (on the run socket, served
        by this loop) have answered.  While more than :data:`TYPED_BACKLOG` bytes wait, the
        attached clients' input waits in their sockets instead."""
        while self.typed and not self.pty_closed:
            try:
                written = os.write(self.master, self.typed)
            except BlockingIOError:
                break
            except OSError:
                break  # the shell side is closed: nothing reads input any more
            del self.typed[:written]
        if self.pty_closed:
            self.typed.clear()
        else:
            waiting = selectors.EVENT_WRITE if self.typed else 0
            self.selector.modify(self.master, selectors.EVENT_READ | waiting, self._master_ready)
        self.clients.hold_input(len(self.typed) >= TYPED_BACKLOG)

    def _drain(self) -> None:
        with contextlib.suppress(OSError, KeyError, ValueError):
            self._shell_output(None)

    # ------------------------------------------------------------------- stopping

    def close(self) -> None:
        # No more connections first: a client let go now finds nothing answers, and says the
        # terminal ended rather than that it was dropped (ctx agent watch).
        for listener in self.listeners:
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(listener)
            listener.close()
        self.resting.clear()
        self.clients.close()
        self.run_calls.end()
        if self.shell is not None and self.shell.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.shell.pid, signal.SIGKILL)
            self.shell.wait()
        if self.mount is not None and self.mount.poll() is None:
            self.mount.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.mount.wait(timeout=10)
        if self.mount is not None and mounted_type(self.view_dir) is not None:
            # A mount process that died (the view lost) left its mount point answering
            # ENOTCONN, and its directory could not be removed while mounted.
            with contextlib.suppress(CtxError):
                unmount(self.view_dir)
        self.runtime.remove_link()
        self.runtime.remove()
        if not self.started:
            self._remove_unused_session()
        self.runtime.release()  # last: until here a start of this session would be refused

    def _remove_unused_session(self) -> None:
        """A start that failed leaves nothing of its own making in the session: the empty
        ``events.jsonl`` and ``terminal/`` it made, then the directories it made from the
        session's up, each when empty.  It is the agent's uid's to write, so it is reached
        without following any link."""
        ops = durable.default_ops()
        with contextlib.suppress(OSError, CtxError):
            session = open_beneath(ops, self.root, self.session.relative.parts)
            try:
                if "terminal" in self.made_in_session:
                    with contextlib.suppress(OSError):
                        os.rmdir("terminal", dir_fd=session)
                if EVENTS_FILE in self.made_in_session:
                    events = os.stat(EVENTS_FILE, dir_fd=session, follow_symlinks=False)
                    if events.st_size == 0:
                        os.unlink(EVENTS_FILE, dir_fd=session)
            finally:
                os.close(session)
        for relative in self.made_for_session:  # deepest first
            with contextlib.suppress(OSError, CtxError):
                parent = open_beneath(ops, self.root, relative.parent.parts)
                try:
                    os.rmdir(relative.name, dir_fd=parent)
                finally:
                    os.close(parent)


def _readable_within(fd: int, timeout: float) -> bool:
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        return bool(selector.select(timeout))
