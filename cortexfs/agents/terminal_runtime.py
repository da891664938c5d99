"""Where an agent terminal keeps its runtime files, who holds them, and cleaning up after a
terminal that died (SPEC A-1, A-2).

One directory per terminal, root's, under ``/run`` (a tmpfs: nothing outlives the machine)::

    /run/cortexfs/terminal/<root>/<uid>/<agent>/<session>/    0711, each level
        main.sock      the terminal socket (A-2), 0666: the peer's uid decides
        pid            ctxterm's pid, once it listens
        private/       0700: reached by root alone, and by the sandbox through its binds
            ctx        the view's mount point (``ctx mount --as AGENT``)
            run.sock   the run socket tsh hands its command lines to, 0666

``<root>`` is :func:`root_key` of the storage root and ``<uid>`` the agent's: the same agent
and session names in two storage roots are two terminals in two directories.

**The link and its alias.**  The session's ``terminal/main.sock`` in the storage root is a
symlink (A-2), and A-2 names where it may lead: ``/run/cortexfs/terminal/<uid>/<agent>/
<session>/main.sock``, a place that names no root.  (A-2's other place, under
``/run/user/<uid>``, is the agent uid's to write: a socket of that uid's own could stand
where root's ``attach`` looks.)  So the terminal puts an *alias* there, a symlink of its own
to ``main.sock`` above, and the session's link leads to the alias::

    /run/cortexfs/terminal/<uid>/<agent>/<session>/   0711
        main.sock      -> /run/cortexfs/terminal/<root>/<uid>/<agent>/<session>/main.sock

Two roots may run a terminal of one agent name, uid and session at once: the alias is the
first one's, and the second's link leads to its own socket directly (:meth:`RunDirectory.
claim_alias`).  An alias is changed only under the ``flock`` of its directory, and only by
the terminal it leads to, or over one whose socket is gone.  (A ``<uid>`` has at most ten
digits and a ``<root>`` sixteen: the two never share a name.)

**The lock.**  A terminal holds an exclusive ``flock`` on its directory from the start's first
check until its cleanup is done (:meth:`RunDirectory.make_and_lock`).  The kernel drops it
when ctxterm ends, however it ends, so a directory whose lock can be taken belongs to no
running terminal: what is in it was left by one that died without cleaning up (SIGKILL, a
crash, the OOM killer) — its view still mounted, its mount process running, its sockets and
pid file.  :meth:`RunDirectory.clean_up` removes those, and only while holding the lock, so
it never touches the resources of a terminal that runs or is starting.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from cortexfs import durable
from cortexfs.errors import CtxError
from cortexfs.fuse.mounts import mounted_type, unmount
from cortexfs.regular_file import read_regular_file_and_status
from cortexfs.shared.sessions import SessionRef
from cortexfs.shared.tree import open_beneath
from cortexfs.user_namespace import unmapped_owner

RUN_BASE = Path("/run/cortexfs/terminal")
SOCKET_NAME = "main.sock"
LINK_NAME = SOCKET_NAME  # the session's link bears the name of the socket it leads to
RUN_SOCKET_NAME = "run.sock"
PID_NAME = "pid"
MOUNT_END_SECONDS = 10.0  # for a view's mount process to unmount and end after SIGTERM
_ROOT_KEY_DIGITS = 16  # hex digits of a storage root's key: 64 bits, no two roots alike
_SEARCHABLE = 0o711  # others may pass through to a socket they know the name of, not list
_PRIVATE = 0o700
_NO_LINK_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAKE_ATTEMPTS = 5
ALIAS_LOCK_SECONDS = 2.0  # an alias's holders keep its lock for a few system calls


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


def started_uids(root: Path) -> list[int]:
    """The uids terminals of ``root`` were started under: the first level of its runtime
    directories, in order; none when no terminal of it was ever started on this host."""
    try:
        entries = os.listdir(RUN_BASE / root_key(root))
    except OSError:
        return []
    return sorted(int(entry) for entry in entries if entry.isascii() and entry.isdigit())


def started_sessions(root: Path, uid: int, agent: str) -> list[str]:
    """The sessions of ``agent`` whose terminals were started under ``uid`` on ``root`` and
    whose runtime directories are still there, in order."""
    try:
        return sorted(os.listdir(RUN_BASE / root_key(root) / str(uid) / agent))
    except OSError:
        return []


def alias_directory(uid: int, agent: str, session: str) -> Path:
    """Where A-2's root-less path to the terminal socket of ``agent`` (running as ``uid``) in
    ``session`` is: the directory of the alias of one root's terminal."""
    return RUN_BASE / str(uid) / agent / session


class RunDirectory:
    """One terminal's runtime directory: its paths, its lock, making and removing it."""

    def __init__(self, root: Path, uid: int, agent: str, session: str) -> None:
        self.root = root
        self.agent = agent
        self.session = SessionRef.home(root, uid, agent, session)
        self.path = run_directory(root, uid, agent, session)
        self.main_socket = self.path / SOCKET_NAME
        self.pid_file = self.path / PID_NAME
        self.view_dir = self.path / "private" / "ctx"
        # Only tsh may reach it (run_socket.py): out of the host's reach beside the view, and
        # bound into the sandbox at /run/ctx/run.sock.
        self.run_socket = self.view_dir.parent / RUN_SOCKET_NAME
        self.alias = alias_directory(uid, agent, session) / SOCKET_NAME
        self.made: list[Path] = []  # the directories made here (the base among them?)
        self.lock_fd = -1

    @property
    def locked(self) -> bool:
        return self.lock_fd >= 0

    # ------------------------------------------------------------------- the lock

    def make_and_lock(self) -> None:
        """Make the directory (each level made here remembered in ``made``) and take its lock;
        EEXIST when a terminal of this agent and session runs or is starting.  A level that
        another terminal's end removes meanwhile is made again."""
        above = self.path.parents  # the agent's, the uid's, the storage root's directory
        levels = [RUN_BASE, above[2], above[1], above[0], self.path]
        _make_searchable(RUN_BASE.parent)
        for _ in range(_MAKE_ATTEMPTS):
            try:
                for directory in levels:
                    self._make(directory, _SEARCHABLE)
                taken = self._take_lock()
            except FileNotFoundError:
                continue
            if taken is None:
                continue  # removed between its mkdir and its lock: make it again
            if not taken:
                name, session = self.agent, self.session.name
                raise CtxError(
                    errno.EEXIST,
                    f"the terminal of {name} in session {session} is already running: watch "
                    f"it with 'ctx agent watch {name} --session {session}', end it with "
                    f"'ctx agent stop {name} --session {session}', or start another "
                    "session with --session",
                )
            self._make(self.view_dir.parent, _PRIVATE)
            return
        raise CtxError(errno.EAGAIN, f"{self.path} kept disappearing while it was made")

    def try_lock(self) -> bool | None:
        """Take the lock if no terminal holds it: True when taken (no terminal runs here),
        False when a running terminal holds it, None when there is no directory at all."""
        try:
            return self._take_lock()
        except FileNotFoundError:
            return None

    def release(self) -> None:
        if self.locked:
            os.close(self.lock_fd)
            self.lock_fd = -1

    def forget_lock(self) -> None:
        """In a child forked from the terminal (a tool call): close this process's copy of the
        lock, which must not outlive ctxterm."""
        if self.locked:
            with contextlib.suppress(OSError):
                os.close(self.lock_fd)
            self.lock_fd = -1

    def _take_lock(self) -> bool | None:
        """The lock of the directory now at ``path``: None when it was removed between the
        open and the lock (its terminal's end), so the lock taken is of no directory."""
        fd = os.open(self.path, _NO_LINK_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        if not _still_at(self.path, fd):
            os.close(fd)
            return None
        self.lock_fd = fd
        return True

    def _make(self, directory: Path, mode: int) -> None:
        try:
            directory.mkdir(mode=mode)
            self.made.append(directory)
        except FileExistsError:
            pass
        # A level that is not ours (a link, another uid's directory: an older install's, or
        # a mistaken chown) would let its owner swap what the terminal keeps below it — the
        # pid file a stop signals, the sockets — so it is never used as it is.
        status = directory.lstat()
        if not stat.S_ISDIR(status.st_mode) or status.st_uid != os.geteuid():
            what = "a symbolic link" if stat.S_ISLNK(status.st_mode) else "not a directory"
            if stat.S_ISDIR(status.st_mode):
                what = f"a directory of uid {status.st_uid}"
            foreign = unmapped_owner(status.st_uid) if stat.S_ISDIR(status.st_mode) else None
            if foreign is not None:  # the host's, seen from a user namespace: not ours to remove
                raise CtxError(
                    errno.EINVAL,
                    f"{directory} is a directory of the host's, which this user namespace sees "
                    f"as uid {status.st_uid}: {foreign}; a terminal started in the namespace "
                    "needs a /run of its own (a private tmpfs)",
                )
            raise CtxError(
                errno.EPERM,
                f"{directory} is {what}, not uid {os.geteuid()}'s directory: whoever owns it "
                "could replace the terminal's pid file and sockets below it; have root remove "
                "it, and start the terminal again",
            )
        directory.chmod(mode)

    # ------------------------------------------------------------------- removing

    def remove(self, *, files: bool = True) -> None:
        """Remove the files and the directories of the terminal; the caller holds the lock.
        Without ``files``, only the directories that are empty: a start refused before its
        clean-up ended leaves a dead terminal's files (and alias) for the next to name.

        Never a recursive removal: the view's mount point may still be mounted (an unmount
        that failed), and removing through it would remove the agent's files.  The session's
        directory goes, and the agent's, the uid's and the storage root's above it when nothing
        else (another session's terminal) is in them, whichever terminal made them: the one
        that made the agent's may have ended while this session's was in it.  (A terminal
        starting meanwhile makes them again: :meth:`make_and_lock`.)  The base goes only if
        this one made it.
        """
        if files:
            self.release_alias()
            for path in (self.main_socket, self.run_socket, self.pid_file):
                # A directory in a file's place stays (clean_up said so): the rest still goes.
                with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                    path.unlink()
        above = self.path.parents
        emptied = [self.view_dir, self.view_dir.parent, self.path, above[0], above[1], above[2]]
        if RUN_BASE in self.made:
            emptied.append(RUN_BASE)
        for directory in emptied:
            with contextlib.suppress(OSError):
                directory.rmdir()

    def clean_up(self) -> list[str]:
        """Remove what a terminal that died left here, holding the lock (none runs): end its
        view's mount process, unmount the view, remove its sockets, its pid file and the
        session's link to its socket; the directories stay (:meth:`remove`).  What it did, in
        words; empty when there was nothing.  EBUSY, with the rest left as it is, when the
        view cannot be unmounted."""
        assert self.locked, "only the holder of the lock cleans up"
        cleaned: list[str] = []
        was_mounted = mounted_type(self.view_dir) is not None
        ended = [str(pid) for pid in self._mount_processes() if _end(pid)]  # SIGTERM: unmounts
        if mounted_type(self.view_dir) is not None:
            try:
                unmount(self.view_dir)
            except CtxError as exc:
                raise CtxError(
                    errno.EBUSY,
                    f"the view {self.view_dir} of a terminal of {self.agent} that ended "
                    f"without cleaning up cannot be unmounted ({exc.message}); unmount it with "
                    f"'ctx umount {self.view_dir}' and try again",
                ) from None
        if was_mounted:
            cleaned.append(f"unmounted its view at {self.view_dir}")
        if ended:
            cleaned.append(f"ended its mount process (pid {', '.join(ended)})")
        self._refuse_directories_in_place_of_files()
        left = [
            str(p.relative_to(self.path))
            for p in (self.main_socket, self.run_socket, self.pid_file)
            if p.exists()
        ]
        if left:
            cleaned.append(f"removed {' and '.join(left)} from {self.path}")
        if self.remove_link(stale_only=True):
            cleaned.append(f"removed the link {self.session.path / 'terminal' / LINK_NAME}")
        if self.release_alias():
            cleaned.append(f"removed the link {self.alias}")
        for path in (self.main_socket, self.run_socket, self.pid_file):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        return cleaned

    def _refuse_directories_in_place_of_files(self) -> None:
        """EISDIR for a directory where the terminal's socket or pid file belongs: no terminal
        makes one, and only root can (the directories are root's), so it is not removed
        unseen; nothing else of the terminal can be settled until it is gone."""
        for path in (self.main_socket, self.run_socket, self.pid_file):
            if path.is_dir() and not path.is_symlink():
                raise CtxError(
                    errno.EISDIR,
                    f"{path} is a directory, where the terminal of {self.agent} in session "
                    f"{self.session.name} keeps its {_ROLES[path.name]}; no terminal makes "
                    f"one, so look at what it holds, remove it (rmdir {path}) and try again",
                )

    def record_pid(self, pid: int) -> None:
        """Write the pid file a stop signals: this uid's alone to write (0644), whatever the
        umask, since whoever could write it could have root signal any process."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self.pid_file, flags | os.O_NONBLOCK, 0o644)  # a FIFO there: ENXIO
        try:
            os.fchmod(fd, 0o644)
            os.write(fd, str(pid).encode())
        finally:
            os.close(fd)

    def recorded_pid(self) -> int | None:
        """The pid in the pid file: ctxterm's, once it listens.  None for a pid file that is
        not this uid's regular file, or that others may write (an older version's, made under
        a loose umask): a pid anyone could have put there is never signalled."""
        try:
            data, status = read_regular_file_and_status(self.pid_file, 64, owner=os.geteuid())
            return None if status.st_mode & 0o022 else int(data)
        except (OSError, ValueError):
            return None

    def terminal_pid(self) -> int | None:
        """The pid, as this pid namespace numbers it, of the terminal that recorded its pid
        and holds this directory open for its lock: the pid file's when that process holds
        it, else the one process found holding it.  A terminal started inside another pid
        namespace recorded the number it has there, which here may name any process; a pid
        file others may write (or not this uid's) names whatever its writer chose: a stop
        signals none but the terminal.  None while the terminal is still starting (no pid
        file yet) or no process holds the directory."""
        recorded = self.recorded_pid()
        if recorded is not None and self._held_open_by(recorded):
            return recorded
        if not os.path.lexists(self.pid_file):
            return None  # still starting: a stop waits for the pid it records
        pids = (int(entry) for entry in os.listdir("/proc") if entry.isdigit())
        holders = [pid for pid in pids if self._held_open_by(pid)]
        return holders[0] if len(holders) == 1 else None

    def _held_open_by(self, pid: int) -> bool:
        """Whether process ``pid`` has this directory open (not through a link of the same
        name: the directory's device and inode are compared)."""
        try:
            wanted = os.stat(self.path)
            descriptors = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            return False
        for fd in descriptors:
            try:
                status = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue  # closed meanwhile, or not a path (a socket, a pipe)
            if (status.st_dev, status.st_ino) == (wanted.st_dev, wanted.st_ino):
                return True
        return False

    def _mount_processes(self) -> list[int]:
        """Root's processes serving this directory's view: ``… mount --as AGENT VIEW_DIR``.
        The view's path holds the root's key, the uid, the agent and the session: no other
        terminal's mount has it."""
        wanted = os.fsencode(self.view_dir)
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                argv = Path("/proc", entry, "cmdline").read_bytes().split(b"\0")[:-1]
                owner = os.stat(Path("/proc", entry)).st_uid
            except OSError:
                continue  # gone meanwhile
            if owner == 0 and argv[-1:] == [wanted] and b"mount" in argv and b"--as" in argv:
                found.append(int(entry))
        return found

    # ------------------------------------------------------------------- the session's link

    @contextlib.contextmanager
    def terminal_directory(self, *, make: bool) -> Iterator[int]:
        """``session/<s>/terminal/`` in the storage root (made if missing, with ``make``).  The
        session belongs to the agent's uid, which could plant a link there: it is reached, and
        used, without following any."""
        ops = durable.default_ops()
        session = open_beneath(ops, self.root, self.session.relative.parts)
        try:
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir("terminal", 0o755, dir_fd=session)
            directory = os.open("terminal", _NO_LINK_DIRECTORY, dir_fd=session)
            if make and os.fstat(directory).st_uid == os.geteuid():
                # The agent's uid reaches the socket's link through it, whatever the umask
                # the terminal was started under.
                os.fchmod(directory, 0o755)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise
            raise self._unusable_terminal_directory(session, exc) from None
        finally:
            os.close(session)
        try:
            yield directory
        finally:
            os.close(directory)

    def _unusable_terminal_directory(self, session: int, exc: OSError) -> CtxError:
        """Why ``session/<s>/terminal`` cannot hold the link, by what is there: a link is
        ELOOP (never followed), anything else but a directory ENOTDIR, a directory the
        kernel would not open its own errno.  Whatever it is, nothing is written through or
        over it: the agent's uid may have put it there."""
        path = f"{self.session.path}/terminal"
        status = durable.lstat_at(session, "terminal")
        if status is None or stat.S_ISDIR(status.st_mode):
            return CtxError(exc.errno or errno.EIO, f"{path} cannot be opened ({exc.strerror})")
        if stat.S_ISLNK(status.st_mode):
            return CtxError(
                errno.ELOOP,
                f"{path} is a symbolic link of uid {status.st_uid}, and the terminal socket is "
                "never put through a link: remove it and start the terminal again",
            )
        return CtxError(
            errno.ENOTDIR,
            f"{path} is {_kind(status)} of uid {status.st_uid}, not the directory that holds "
            "the terminal socket's link: remove it and start the terminal again",
        )

    def make_link(self) -> None:
        """The session's ``terminal/main.sock`` (A-2), a symlink to the socket: through the
        alias when this terminal holds it, to the socket itself when another root's does."""
        target = self.alias if self.claim_alias() else self.main_socket
        with self.terminal_directory(make=True) as directory:
            try:
                os.unlink(LINK_NAME, dir_fd=directory)
            except FileNotFoundError:
                pass
            except IsADirectoryError:
                raise self._directory_at_link() from None
            os.symlink(target, LINK_NAME, dir_fd=directory)

    def require_link_place(self) -> None:
        """EISDIR, before the terminal starts, when a directory stands where the session's
        link goes: every other entry there is replaced by the link, but a directory cannot
        be (the agent's uid, whose session it is, may have made it)."""
        try:
            with self.terminal_directory(make=False) as directory:
                status = durable.lstat_at(directory, LINK_NAME)
        except (FileNotFoundError, CtxError):
            return  # no terminal/ yet, or one make_link refuses, naming it, as it makes it
        if status is not None and stat.S_ISDIR(status.st_mode):
            raise self._directory_at_link(status.st_uid)

    def _directory_at_link(self, uid: int | None = None) -> CtxError:
        path = f"{self.session.path}/terminal/{LINK_NAME}"
        whose = "" if uid is None else f" of uid {uid}"
        return CtxError(
            errno.EISDIR,
            f"{path} is a directory{whose}, where the terminal socket's link goes: remove it "
            "and start the terminal again",
        )

    def link_target(self) -> str | None:
        """Where the session's link leads (never followed); None when there is none."""
        with contextlib.suppress(OSError, CtxError), self.terminal_directory(make=False) as fd:
            return os.readlink(LINK_NAME, dir_fd=fd)
        return None

    def remove_link(self, *, stale_only: bool = False) -> bool:
        """Remove the session's link; with ``stale_only``, only a link a terminal of this
        directory made (to its socket or to the alias: the link is in this root's session).
        Whether one was removed."""
        ours = (str(self.main_socket), str(self.alias))
        removed = False
        with contextlib.suppress(OSError, CtxError), self.terminal_directory(make=False) as fd:
            if stale_only and os.readlink(LINK_NAME, dir_fd=fd) not in ours:
                return False
            os.unlink(LINK_NAME, dir_fd=fd)
            removed = True
        if removed:
            self._remove_empty_terminal_directory()
        return removed

    def _remove_empty_terminal_directory(self) -> None:
        """``session/<s>/terminal/`` once its link is gone, when nothing else is in it: a start
        made it, as root, in a session that is the agent's uid's, and the next start makes it
        again; left, it would be the one entry of root's in a user's own storage root."""
        ops = durable.default_ops()
        with contextlib.suppress(OSError, CtxError):
            session = open_beneath(ops, self.root, self.session.relative.parts)
            try:
                os.rmdir("terminal", dir_fd=session)  # ENOTEMPTY, ENOTDIR: not ours to remove
            finally:
                os.close(session)

    # ------------------------------------------------------------------- the alias

    def claim_alias(self) -> bool:
        """Make the alias lead to this terminal's socket; whether it does.  It stays another's
        while that one's socket is there (a terminal of another root runs, or died and its
        directory is not cleaned up yet), and so does anything but a symlink in its place (a
        terminal of an older ctx, in its own directory there)."""
        with self._alias_directory_locked(make=True) as directory:
            if directory is None:
                return False
            try:
                leads_to = os.readlink(SOCKET_NAME, dir_fd=directory)
            except FileNotFoundError:
                leads_to = None
            except OSError:  # not a symlink
                return False
            if leads_to == str(self.main_socket):
                return True  # left by a terminal of this directory that died
            if leads_to is not None:
                if os.path.lexists(leads_to):
                    return False
                os.unlink(SOCKET_NAME, dir_fd=directory)
            os.symlink(self.main_socket, SOCKET_NAME, dir_fd=directory)
            return True

    def release_alias(self) -> bool:
        """Remove the alias if it leads to this terminal's socket, and its directories when
        nothing else is in them; whether it was removed."""
        with self._alias_directory_locked(make=False) as directory:
            if directory is None:
                return False
            try:
                if os.readlink(SOCKET_NAME, dir_fd=directory) != str(self.main_socket):
                    return False
            except OSError:
                return False
            os.unlink(SOCKET_NAME, dir_fd=directory)
            session_level = self.alias.parent
            for level in (session_level, session_level.parent, session_level.parent.parent):
                with contextlib.suppress(OSError):
                    level.rmdir()
            return True

    @contextlib.contextmanager
    def _alias_directory_locked(self, *, make: bool) -> Iterator[int | None]:
        """The alias's directory, open and under its ``flock``: None when it is missing (and
        not to be made), is not a directory or stays locked (a terminal of a ctx that put its
        own directory there holds it while it runs).  A directory removed between its making,
        or its open, and the lock (the alias's last user ended) is made or opened again."""
        session_level = self.alias.parent
        for _ in range(_MAKE_ATTEMPTS):
            try:
                if make:
                    for level in (session_level.parent.parent, session_level.parent, session_level):
                        self._make(level, _SEARCHABLE)
                fd = os.open(session_level, _NO_LINK_DIRECTORY)
            except FileNotFoundError:
                if make:
                    continue
                yield None
                return
            except OSError:  # a link or a file where a directory belongs: not ours to use
                yield None
                return
            try:
                if not _lock_within(fd, ALIAS_LOCK_SECONDS):
                    yield None  # a terminal of an older ctx holds it: its own directory
                    return
                if not _still_at(session_level, fd):
                    continue
                yield fd
                return
            finally:
                os.close(fd)
        raise CtxError(errno.EAGAIN, f"{session_level} kept disappearing while it was made")


_ROLES = {SOCKET_NAME: "socket", RUN_SOCKET_NAME: "run socket", PID_NAME: "pid file"}


def _make_searchable(directory: Path) -> None:
    """``/run/cortexfs``, searchable by every uid (0755) whatever the umask: an agent's uid
    passes through it to its terminal's socket.  One of root's that an earlier start left
    unsearchable (made under ``umask 077``) is given that mode too."""
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o755, parents=True)
    status = directory.lstat()
    ours = stat.S_ISDIR(status.st_mode) and status.st_uid == os.geteuid()
    if ours and status.st_mode & 0o755 != 0o755:
        directory.chmod(status.st_mode | 0o755)


def _still_at(path: Path, fd: int) -> bool:
    """Whether the directory open as ``fd`` is still the one at ``path`` (not removed, nor
    replaced, since it was opened)."""
    try:
        now = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return os.path.samestat(now, os.fstat(fd))


def _lock_within(fd: int, seconds: float) -> bool:
    """Take the exclusive ``flock`` of ``fd`` if it comes free within ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


def _kind(status: os.stat_result) -> str:
    mode = status.st_mode
    for test, word in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return word
    return "a special file"


def _end(pid: int) -> bool:
    """SIGTERM to ``pid`` (a view's mount process, which then unmounts), SIGKILL if it has
    not ended within :data:`MOUNT_END_SECONDS`; whether it was running."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + MOUNT_END_SECONDS
    while not _gone(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    return True


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended: no process, or a zombie its new parent has not reaped (a
    container's init may never reap it)."""
    try:
        status = Path("/proc", str(pid), "stat").read_text()
    except OSError:
        return True
    return status.rpartition(")")[2].split()[0] in ("Z", "X")
