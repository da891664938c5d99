"""One exception family for everything CortexFS refuses.

Every refusal carries an errno (the kernel's vocabulary, so a user and a test can match on it)
and one sentence the user can act on.  The rendering is always ``NAME: sentence``, e.g.
``EEXIST: job build-42.req.json is already done; publish under another name``.
"""

from __future__ import annotations

import errno as _errno
import os as _os
from typing import NamedTuple


class CtxError(Exception):
    """A refusal with an errno and an actionable sentence."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.errno = code
        self.message = message

    @property
    def code_name(self) -> str:
        return _errno.errorcode.get(self.errno, f"E{self.errno}")

    def __str__(self) -> str:
        return f"{self.code_name}: {self.message}"

    def to_json(self) -> dict[str, object]:
        return {"error": self.code_name, "errno": self.errno, "message": self.message}

    def then(self, said: str) -> CtxError:
        """This refusal with ``said`` after it (``nothing was changed``, what to run once it
        is mended): the same errno, where the step that met it says what became of its work."""
        return CtxError(self.errno, f"{self.message}; {said}")


# What the host ran short of: not the doing of a tool, its caller or a policy, and gone once
# descriptors, memory or space are freed.  A step that meets one did not judge what it was
# asked, and says so with this errno rather than with a verdict (EACCES, ENOEXEC).
HOST_SHORTAGES = frozenset(
    {_errno.EMFILE, _errno.ENFILE, _errno.ENOMEM, _errno.ENOSPC, _errno.EDQUOT}
)

# What a host short of resources answers a process it is asked to start: the shortages, and
# fork's EAGAIN at a limit of processes ('ulimit -u', a cgroup's pids.max).
PROCESS_SHORTAGES = HOST_SHORTAGES | {_errno.EAGAIN}

# What mends a shortage or a filesystem turned read-only, in the same words wherever a command
# stops for one: each caller adds its own next step ("and run the command again").
_HOST_REMEDIES = {
    _errno.ENOSPC: "free space or inodes on that filesystem",
    _errno.EDQUOT: "free space within that user's disk quota",
    _errno.EMFILE: "raise the limit of open files ('ulimit -n')",
    _errno.ENFILE: (
        "end processes that hold many files open, or raise the system's limit "
        "('sysctl fs.file-max')"
    ),
    _errno.ENOMEM: "free memory",
    _errno.EROFS: "remount that filesystem read-write",
    # From the kernel, a write past the process's limit of file size (SIGXFSZ ignored, as ctx
    # ignores it) or past the largest file the filesystem holds.
    _errno.EFBIG: "raise the limit of file size ('ulimit -f')",
}
# The host's troubles that remedy_for_host_trouble has words for.
HOST_TROUBLES = frozenset(_HOST_REMEDIES)
# What mends an I/O error from a disk, which is none of them: the disk's own trouble.
DISK_ERROR_REMEDY = "check that disk (the kernel's log says more)"

# What ran short, when the errno alone says it: descriptors are per process or system-wide,
# and "Too many open files" does not say which limit to raise.
_RAN_SHORT = {
    _errno.EMFILE: "this process has no file descriptor left",
    _errno.ENFILE: "the system has no file descriptor left",
    _errno.EFBIG: "a file reached the largest size this process may write",
}


class HostTrouble(NamedTuple):
    """What the host ran short of (``""`` when the errno's own text says all that is known)
    and what mends it, for a message that stops on one of :data:`HOST_TROUBLES`."""

    ran_short: str
    remedy: str

    @property
    def aside(self) -> str:
        """What ran short as a message puts it after the errno's text: `` (…)``, or nothing."""
        return f" ({self.ran_short})" if self.ran_short else ""


# Where a refusal happened, for what the host ran short of: a descriptor or a path on it.
Filesystem = int | str | _os.PathLike[str]


def explain_host_trouble(
    code: int | None, *, filesystem: Filesystem | None = None, uid: int | None = None
) -> HostTrouble | None:
    """What ran short and what mends it, for ``code`` one of :data:`HOST_TROUBLES`; None for
    any other.

    ``filesystem``, a descriptor or a path on the filesystem that refused: for ENOSPC its free
    bytes and inodes are told, and a filesystem out of inodes with bytes left is told to free inodes
    (told to free space, a user deletes big files, which frees no inode).  ``uid``, the user
    whose disk quota it is: for EDQUOT the remedy names it.
    """
    remedy = None if code is None else _HOST_REMEDIES.get(code)
    if code is None or remedy is None:
        return None
    if code == _errno.ENOSPC and filesystem is not None:
        return _filesystem_full(filesystem) or HostTrouble("", remedy)
    if code == _errno.EDQUOT and uid is not None:
        return HostTrouble("", f"free space within the disk quota of uid {uid}")
    return HostTrouble(_RAN_SHORT.get(code, ""), remedy)


def _filesystem_full(filesystem: Filesystem) -> HostTrouble | None:
    """The free bytes and inodes of the filesystem of ``filesystem`` (a descriptor or a path),
    and whether inodes or space is to be freed; None when the kernel does not say."""
    try:
        free = _os.statvfs(filesystem)
    except OSError:
        return None
    room = (
        f"its filesystem has {free.f_bavail * free.f_frsize} bytes and {free.f_favail} inodes free"
    )
    # A filesystem without an inode table of fixed size (btrfs, tmpfs unlimited) reports 0
    # inodes in all: then only bytes can have run out.
    if free.f_files and not free.f_favail and free.f_bavail:
        return HostTrouble(
            room, "free inodes on that filesystem (remove files there: bytes are left)"
        )
    return HostTrouble(room, "free space on that filesystem")


def remedy_for_host_trouble(
    code: int | None, *, filesystem: int | None = None, uid: int | None = None
) -> str | None:
    """What mends ``code`` when it is one of :data:`HOST_TROUBLES`; None for any other.
    ``filesystem`` and ``uid`` make it precise, as for :func:`explain_host_trouble`."""
    trouble = explain_host_trouble(code, filesystem=filesystem, uid=uid)
    return None if trouble is None else trouble.remedy


def describe(exc: BaseException) -> str:
    """``ENOSPC: No space left on device: <path>`` for an OSError, the rendering of a
    :class:`CtxError`, and ``Type: text`` for anything else."""
    if isinstance(exc, CtxError):
        return str(exc)
    if isinstance(exc, OSError) and exc.errno:
        name = _errno.errorcode.get(exc.errno, f"E{exc.errno}")
        where = f": {_os.fsdecode(exc.filename)}" if isinstance(exc.filename, str | bytes) else ""
        return f"{name}: {exc.strerror}{where}"
    return f"{type(exc).__name__}: {exc}"


def errno_text(exc: OSError) -> str:
    """``EIO: Input/output error``: what the kernel reported, without a file name (the
    message it goes into names the file in its own words)."""
    name = _errno.errorcode.get(exc.errno or 0, "EIO")
    return f"{name}: {exc.strerror or exc}"


def invalid(message: str) -> CtxError:
    """EINVAL: the input is malformed."""
    return CtxError(_errno.EINVAL, message)


def exists(message: str) -> CtxError:
    """EEXIST: the name already has evidence and must not be overwritten."""
    return CtxError(_errno.EEXIST, message)


def not_found(message: str) -> CtxError:
    """ENOENT: the object does not exist."""
    return CtxError(_errno.ENOENT, message)


def denied(message: str) -> CtxError:
    """EACCES: the caller is not allowed to do this."""
    return CtxError(_errno.EACCES, message)


def out_of_memory(standing: str) -> CtxError:
    """ENOMEM for a MemoryError: the host's memory, or the process's limit of it (``ulimit -v``,
    ``ulimit -d``), ran out; ``standing`` says where that left the work."""
    return CtxError(
        _errno.ENOMEM,
        f"out of memory; {standing}: free memory, or raise the process's limit of it "
        "('ulimit -v', 'ulimit -d')",
    )


def too_big(message: str) -> CtxError:
    """EFBIG: the data exceeds a configured limit."""
    return CtxError(_errno.EFBIG, message)


def owner_left_out(letter: str) -> str:
    """The remedy for a caller refused by the mode of a file or directory it owns: telling
    its owner to act as its owner would help nobody, the mode is what is missing."""
    return f"you own it, but its mode leaves you out: 'chmod u+{letter}' it"


def errno_named_in(message: str) -> int:
    """The errno whose text (``No such file or directory``) a program's error ``message``
    holds, as bubblewrap's "Can't find source path /x: No such file or directory" or libfuse's
    "fuse: failed to open /dev/fuse: Permission denied"; EIO when it names none.  The common
    refusals are looked for first, so a message naming two reads as the refusal."""
    common = (_errno.EACCES, _errno.EPERM, _errno.ENOENT, _errno.ENOTDIR)
    for code in (*common, *sorted(_errno.errorcode)):
        if _os.strerror(code) in message:
            return code
    return _errno.EIO
