"""Locks of CortexFS: a bounded wait for an ``flock``, and the lock file of a directory.

Whoever may open a file may lock it, so no lock of CortexFS's is waited for without bound: a
process that keeps one (stuck, or not ours) must not hold a worker, a tool call or a repair
forever.  ``flock`` itself cannot time out, so the wait is a poll with a growing pause: a
lock taken and let go within the first milliseconds costs almost nothing to wait for.

**The lock file of a directory.**  A lock that must be waited for without a time limit (an
install waits for the install before it, however long that takes) is taken on a file only
those who may write the directory can open: the hidden file :data:`LOCK_FILE` in it.  A lock
on the directory itself would do no such thing: ``flock`` needs only a descriptor, and any
uid that may read a directory may open it and hold its lock for ever.  The lock file is
mode 0600, the owner's alone, in a group-writable directory too: only a directory's owner
installs there (a space's ``tool/`` is its owner's, and a tool from a tier its group may
write runs for nobody), so no member needs to open it, and none can hold it.  Made by root,
it is given to the directory's owner and group, so that the owner, who installs there, may
open it after; one of another uid (put there by a member of a group-writable tier, who could
hold it) is refused as in the way, never taken.  A leading dot is not a legal object name
(R-3): the file is never taken for an object, and it is kept for good (removing a lock file
lets two holders lock two different files).  A wait for a lock file that is root's but that
others may open (made so by hand) is still bounded where others' tiers are looked at (``ctx
bootstrap`` looking at every space's tier), and :func:`lock_holders` names who holds it.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable
from contextvars import ContextVar
from pathlib import Path

from cortexfs.errors import CtxError

LOCK_FILE = ".install-lock"
# Never follows a link at the name; O_NONBLOCK: a FIFO put there does not hang the open (it is
# refused once the open returns: only a regular file is a lock file).
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY


def flock_within(fd: int, kind: int, seconds: float) -> bool:
    """``flock(fd, kind)`` (``LOCK_SH`` or ``LOCK_EX``), waiting at most ``seconds`` (0: not
    at all); False when it is still held by another then.  Other errors are raised."""
    deadline = time.monotonic() + seconds
    pause = 0.001
    while True:
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


# Told, once, that a lock is being waited for without a time limit and who holds it: the
# command line makes it a line on stderr, so that a command waiting behind a stuck install says
# why it does nothing; a library caller is told nothing.
WAITING_NOTICE: ContextVar[Callable[[str], None] | None] = ContextVar(
    "waiting_notice", default=None
)


# A lock still held after this many seconds is waited for aloud: two commands run at once
# take turns within milliseconds, and say nothing.
QUIET_WAIT = 1.0


def flock_saying_so(fd: int, kind: int, path: Path) -> None:
    """``flock(fd, kind)`` of the lock file ``path`` without a time limit, telling
    :data:`WAITING_NOTICE` which processes hold it when it is still held after
    :data:`QUIET_WAIT` seconds."""
    if flock_within(fd, kind, QUIET_WAIT):
        return
    tell = WAITING_NOTICE.get()
    if tell is not None:
        holders = lock_holders(fd)
        by = f" by pid {', '.join(map(str, holders))}" if holders else ""
        tell(
            f"waiting for {path}, held{by}: a change to {path.parent} waits for the one "
            "before it to end (Ctrl-C stops waiting, and makes nothing of this change)"
        )
    fcntl.flock(fd, kind)


def open_lock_file(dir_fd: int, directory: Path, *, create: bool = True) -> int:
    """A descriptor of the lock file of the directory open as ``dir_fd`` (shown as
    ``directory``), made first when it is missing and ``create`` is set.

    Raises the kernel's OSError, naming the lock file, when it is missing (without
    ``create``) or cannot be made (EROFS, ENOSPC…) or opened (EMFILE…); CtxError EACCES or
    EPERM, saying whose it is, when this uid may not open it, and EEXIST (EISDIR for a
    directory) when what is at its name is no regular file."""
    path = directory / LOCK_FILE
    while True:
        try:
            fd = os.open(LOCK_FILE, _OPEN_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            if not create:
                raise FileNotFoundError(
                    errno.ENOENT, os.strerror(errno.ENOENT), str(path)
                ) from None
            fd = _make_lock_file(dir_fd, path)
            if fd < 0:
                continue  # another made it first: open theirs
        except OSError as exc:
            raise _refused(dir_fd, path, exc) from None
        found = os.fstat(fd)
        kind = found.st_mode
        if stat.S_ISREG(kind):
            _require_owned_by_directory_owner(fd, dir_fd, found, path)
            return fd
        os.close(fd)
        found = "a directory" if stat.S_ISDIR(kind) else "a special file"
        code = errno.EISDIR if stat.S_ISDIR(kind) else errno.EEXIST
        raise CtxError(
            code,
            f"{path} is {found}, not the lock file that serialises changes to {directory}: "
            "move it away",
        )


def _require_owned_by_directory_owner(
    fd: int, dir_fd: int, found: os.stat_result, path: Path
) -> None:
    """EEXIST, closing ``fd``, when the lock file is neither root's nor the directory's
    owner's: another uid that may write the directory (a member of an older space's
    group-writable tier) put it there, and could hold it, so that the owner's installs would
    wait for ever.  It is in the way, as a link or a FIFO at the name is."""
    owner = os.fstat(dir_fd).st_uid
    if found.st_uid in (0, owner):
        return
    os.close(fd)
    raise CtxError(
        errno.EEXIST,
        f"{path} belongs to uid {found.st_uid}, not to uid {owner}, the owner of "
        f"{path.parent}, or root: another user put it there, and would decide when changes to "
        f"{path.parent} may be made; have root or uid {owner} remove it ('rm {path}') and run "
        "the command again",
    )


def _make_lock_file(dir_fd: int, path: Path) -> int:
    """The lock file, made now with its mode and owner; -1 when another made it first.

    Only the file this open made is given away and chmodded: one found at the name may be
    anybody's, linked there by a user who may write the directory."""
    try:
        fd = os.open(LOCK_FILE, _OPEN_FLAGS | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dir_fd)
    except FileExistsError:
        return -1
    except OSError as exc:
        raise _refused(dir_fd, path, exc) from None
    try:
        if os.geteuid() == 0:
            directory = os.fstat(dir_fd)
            os.fchown(fd, directory.st_uid, directory.st_gid)
        os.fchmod(fd, 0o600)  # whatever the umask made of it
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refused(dir_fd: int, path: Path, exc: OSError) -> Exception:
    """The error for an open or a creation of the lock file that the kernel refused."""
    code = exc.errno or errno.EIO
    if code == errno.ELOOP:
        return CtxError(
            errno.EEXIST,
            f"{path} is a symbolic link, not the lock file that serialises changes to "
            f"{path.parent}: move it away",
        )
    if code not in (errno.EACCES, errno.EPERM):
        return OSError(code, exc.strerror, str(path))
    try:
        held = os.stat(LOCK_FILE, dir_fd=dir_fd, follow_symlinks=False)
        whose = f" (it belongs to uid {held.st_uid}, mode {stat.S_IMODE(held.st_mode):04o})"
    except OSError:
        whose = ""
    return CtxError(
        code,
        f"{path} cannot be opened by uid {os.geteuid()}: {exc.strerror}{whose}; it "
        f"serialises changes to {path.parent}, and only those who may write there may take "
        "it: run the command as the directory's owner",
    )


def lock_holders(fd: int) -> list[int]:
    """The pids that ``/proc/locks`` shows holding a lock on the file open as ``fd``, in this
    process's pid namespace: none when it cannot be read (no ``/proc``) or the holder is
    outside the namespace (pid 0 there).  A lock passed on to a child (``flock FILE
    COMMAND``) shows the pid of the process that took it."""
    status = os.fstat(fd)
    # /proc/locks names a file as MAJOR:MINOR:INODE, the device numbers in hexadecimal.
    wanted = f"{os.major(status.st_dev):02x}:{os.minor(status.st_dev):02x}:{status.st_ino}"
    holders = []
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as table:
            for line in table:
                fields = line.split()
                if "->" in fields:  # a request waiting for the lock, not a holder
                    continue
                for at, field in enumerate(fields[:-1]):
                    if fields[at + 1] == wanted and field.isdigit() and int(field) > 0:
                        holders.append(int(field))
    except OSError:
        return []
    return sorted(set(holders))
