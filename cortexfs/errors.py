"""One exception family for everything CortexFS refuses.

Every refusal carries an errno (the kernel's vocabulary, so a user and a test can match on it)
and one sentence the user can act on.  The rendering is always ``NAME: sentence``, e.g.
``EEXIST: job build-42.req.json is already done; publish under another name``.
"""

from __future__ import annotations

import errno as _errno
import os as _os


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


# What the host ran short of: not the doing of a tool, its caller or a policy, and gone once
# descriptors, memory or space are freed.  A step that meets one did not judge what it was
# asked, and says so with this errno rather than with a verdict (EACCES, ENOEXEC).
HOST_SHORTAGES = frozenset(
    {_errno.EMFILE, _errno.ENFILE, _errno.ENOMEM, _errno.ENOSPC, _errno.EDQUOT}
)

# What mends a shortage or a filesystem turned read-only, in the same words wherever a command
# stops for one: each caller adds its own next step ("and run the command again").
_HOST_REMEDIES = {
    _errno.ENOSPC: "free space or inodes on that filesystem",
    _errno.EDQUOT: "free space within that user's disk quota",
    _errno.EMFILE: "raise the limit of open files ('ulimit -n')",
    _errno.ENFILE: "end processes that hold many files open",
    _errno.ENOMEM: "free memory",
    _errno.EROFS: "remount that filesystem read-write",
}
# The host's troubles that remedy_for_host_trouble has words for.
HOST_TROUBLES = frozenset(_HOST_REMEDIES)


def remedy_for_host_trouble(code: int | None) -> str | None:
    """What mends ``code`` when it is one of :data:`HOST_TROUBLES`; None for any other."""
    return _HOST_REMEDIES.get(code) if code is not None else None


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


def too_big(message: str) -> CtxError:
    """EFBIG: the data exceeds a configured limit."""
    return CtxError(_errno.EFBIG, message)


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
