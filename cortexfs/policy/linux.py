"""Linux credentials and mode bits, judged the way the kernel judges them (SPEC P-5 steps 1-2).

The kernel picks exactly one class for a process — owner if its uid owns the entry, else group
if its gid or a supplementary group owns it, else other — and grants what that class's three
bits grant; reaching an entry needs search (``x``) on every directory above it; nothing on a
filesystem mounted ``noexec`` is executed, whatever its mode.  POSIX ACLs and capabilities are
not modelled: agents never run as root (step 1 refuses uid 0), and a storage root carries no
ACLs.
"""

from __future__ import annotations

import errno
import os
import stat
from enum import Enum
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from cortexfs.beneath import Entry, walk
from cortexfs.printable import shell_word
from cortexfs.storage import executes_nothing, mounted_noexec

READ, WRITE, EXECUTE = os.R_OK, os.W_OK, os.X_OK  # 4, 2, 1: the layout of one rwx triplet


class Credentials(NamedTuple):
    """A uid/gid as the kernel reports it: a socket peer, a FUSE request, or an exec."""

    uid: int
    gid: int

    def __str__(self) -> str:
        return f"uid {self.uid} gid {self.gid}"


class Identity(NamedTuple):
    """An agent's Linux identity, from its host-owned ``agent/<name>.d/identity``."""

    uid: int
    gid: int
    groups: frozenset[int] = frozenset()

    @property
    def credentials(self) -> Credentials:
        return Credentials(self.uid, self.gid)


class Kind(Enum):
    """What an object must be on disk."""

    FILE = "a regular file"
    DIRECTORY = "a directory"
    ANY = "an entry"


class PathVerdict(NamedTuple):
    """The mode-bit answer for one object: granted, or the errno and the reason why not."""

    allowed: bool
    errno: int
    detail: str


def granted_bits(status: os.stat_result, identity: Identity) -> int:
    """The rwx triplet of the one class (owner, group, other) the kernel applies to ``identity``."""
    if status.st_uid == identity.uid:
        return (status.st_mode >> 6) & 7
    if status.st_gid == identity.gid or status.st_gid in identity.groups:
        return (status.st_mode >> 3) & 7
    return status.st_mode & 7


def permits(status: os.stat_result, identity: Identity, access: int) -> bool:
    return granted_bits(status, identity) & access == access


def rwx(bits: int) -> str:
    return "".join(
        letter if bits & bit else "-" for letter, bit in zip("rwx", (4, 2, 1), strict=True)
    )


def check_access(
    top: Path,
    relative: PurePosixPath,
    identity: Identity,
    access: int,
    kind: Kind,
    entries: list[Entry] | None = None,
    executable: str = "the tool",
) -> PathVerdict:
    """Could ``identity`` reach ``top/relative`` and use it with ``access`` (rwx bits)?

    Reading or writing a directory also needs its ``x`` (listing it, creating in it).  A link
    anywhere on the way is refused, never followed.  The directories above ``top`` count as
    well: a process of ``identity`` reaches ``top`` through them (a storage root made inside
    a private directory, mode 0700, is out of every agent's reach).  ``entries``: the
    :func:`~cortexfs.beneath.walk` to ``top/relative``, when the caller has made it
    (and judges more on it).  ``executable``: what the file to execute is ("the hook"), for
    the remedy of one on a filesystem mounted ``noexec``, which is to put it elsewhere.
    """
    closed_above = unsearchable_above(top, identity)
    if closed_above:
        return _refused(closed_above)
    if entries is None:
        entries = walk(top, relative)
    *above, last = entries
    for directory in above:
        if not permits(_status(directory), identity, EXECUTE):
            return _refused(f"search (x) on {directory.shown} is denied to {_who(identity)}")
    if last.status is None:
        asked = relative.as_posix()
        if last.shown == asked:
            return PathVerdict(False, errno.ENOENT, f"{asked} does not exist")
        # Named whole, then where it ends: 'model:no/such' is not provider 'no' alone.
        return PathVerdict(False, errno.ENOENT, f"{asked} does not exist: {last.shown} is missing")
    if last.is_link:
        return _refused(f"{last.shown} is a symbolic link; links are never followed")
    if len(entries) < len(relative.parts) + 1:
        return PathVerdict(False, errno.ENOENT, f"{last.shown} is not a directory")
    if not _is_kind(last.status, kind):
        return _refused(f"{last.shown} is not {kind.value}")
    if stat.S_ISDIR(last.status.st_mode) and access & (READ | WRITE):
        access |= EXECUTE
    granted = granted_bits(last.status, identity)
    mode = f"mode {stat.S_IMODE(last.status.st_mode):04o}, owner {_owner(last.status)}"
    if granted & access != access:
        return _refused(
            f"{last.shown} needs {rwx(access)} but {mode} grants {rwx(granted)} to {_who(identity)}"
        )
    if access & EXECUTE and kind is Kind.FILE and mounted_noexec(top / relative):
        return _refused(executes_nothing(top / relative, last.shown, executable))
    return PathVerdict(True, 0, f"{last.shown}: {rwx(access)} granted to {_who(identity)} ({mode})")


def unsearchable_above(top: Path, identity: Identity) -> str:
    """Why ``identity`` cannot reach ``top`` through the directories above it (its real path's,
    from ``/`` down), or "" when it can search them all."""
    real = Path(os.path.realpath(top))
    for directory in reversed(real.parents):
        try:
            status = os.stat(directory)
        except OSError:
            return ""  # the walk below says what is missing
        if not permits(status, identity, EXECUTE):
            mode = stat.S_IMODE(status.st_mode)
            return (
                f"search (x) on {directory}, above {top}, is denied to {_who(identity)} "
                f"(mode {mode:04o}, owner {_owner(status)}): a process of the agent reaches "
                "nothing below it; let it search the directory "
                f"(chmod o+x {shell_word(str(directory))}) or put the storage root and the "
                "agent's mounts where it can"
            )
    return ""


def unsearchable(top: Path, identity: Identity) -> str:
    """Why ``identity`` cannot search the directory ``top`` or one above it, or "" when it
    can search them all: what step 2 meets first for anything below ``top``."""
    denied = unsearchable_above(top, identity)
    if denied or (status := _refusing(top, identity, EXECUTE)) is None:
        return denied
    return (
        f"search (x) on {top} is denied to {_who(identity)} ({_mode_and_owner(status)}): a "
        "process of the agent reaches nothing below it; let it search the directory "
        f"(chmod o+x {shell_word(str(top))}) or put the storage root where it can"
    )


def closed_directory(top: Path, identity: Identity) -> str:
    """Why ``identity`` cannot list and enter the directory ``top`` (a directory above it it
    may not search, or ``top`` itself without read and search), or "" when it can."""
    denied = unsearchable_above(top, identity)
    if denied or (status := _refusing(top, identity, READ | EXECUTE)) is None:
        return denied
    return (
        f"read and search (rx) on {top} are denied to {_who(identity)} ({_mode_and_owner(status)})"
    )


def _refusing(top: Path, identity: Identity, access: int) -> os.stat_result | None:
    """``top``'s status when its mode bits refuse ``identity`` ``access``; None when they
    grant it, or when ``top`` cannot be looked at (what is missing is said where it is used)."""
    try:
        status = os.stat(top)
    except OSError:
        return None
    return None if permits(status, identity, access) else status


def _mode_and_owner(status: os.stat_result) -> str:
    return f"mode {stat.S_IMODE(status.st_mode):04o}, owner {_owner(status)}"


def writable_entries(top: Path, relative: PurePosixPath, identity: Identity) -> list[str]:
    """Every entry from ``top`` down to ``top/relative`` that ``identity`` could change.

    A directory it may write and search lets it replace any name inside — but for a sticky
    directory (``chmod +t``) it does not own, only the names it owns, so there it counts only
    when the next entry on the way is its own; a file it may write lets it rewrite the
    contents.  Empty when the whole path is out of its reach.
    """
    return writable_on_walk(walk(top, relative), identity)


def writable_on_walk(entries: list[Entry], identity: Identity) -> list[str]:
    """:func:`writable_entries` of the entries of a walk already made
    (:func:`~cortexfs.beneath.walk`)."""
    writable = []
    for index, entry in enumerate(entries):
        if entry.status is None or entry.is_link:
            break
        needed = WRITE | EXECUTE if entry.is_directory else WRITE
        if not permits(entry.status, identity, needed):
            continue
        below = entries[index + 1].status if index + 1 < len(entries) else None
        sticky = entry.is_directory and entry.status.st_mode & stat.S_ISVTX
        others = sticky and entry.status.st_uid != identity.uid
        if others and (below is None or below.st_uid != identity.uid):
            continue  # the kernel lets it rename or remove its own names only
        writable.append(entry.shown)
    return writable


def _status(entry: Entry) -> os.stat_result:
    assert entry.status is not None, "walk() only continues through existing directories"
    return entry.status


def _is_kind(status: os.stat_result, kind: Kind) -> bool:
    if kind is Kind.FILE:
        return stat.S_ISREG(status.st_mode)
    if kind is Kind.DIRECTORY:
        return stat.S_ISDIR(status.st_mode)
    return True


def _refused(detail: str) -> PathVerdict:
    return PathVerdict(False, errno.EACCES, detail)


def _who(identity: Identity) -> str:
    return f"uid {identity.uid}"


def _owner(status: os.stat_result) -> str:
    return f"{status.st_uid}:{status.st_gid}"
