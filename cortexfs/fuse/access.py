"""What a file's POSIX access ACL lets a caller of the mount do (SPEC F-1): the storage
root's own verdict, kept through the mount.

The kernel checks each caller of the mount against the mode bits the daemon reports
(``default_permissions``).  For a file with an access ACL (``system.posix_acl_access``)
those bits are not the verdict the storage root gives: their group bits are the ACL's
mask, the most that a named user, a named group or the owning group may have (POSIX.1e).
A member of the owning group whose entry grants only read sees ``rw`` there, and the kernel
lets it open the file for writing; the daemon, root, would then write for it.  So before
the mount opens, makes, removes or renames anything for a caller, it asks
:func:`acl_allows` what the storage root would answer, by the access check algorithm of
acl(5).

A file without an ACL costs one ``getxattr`` (ENODATA), answered at once (EOPNOTSUPP) on a
filesystem that keeps no ACLs.
"""

from __future__ import annotations

import errno
import os
import stat
import struct
from pathlib import Path
from typing import Protocol

READ, WRITE, EXECUTE = 4, 2, 1  # an ACL entry's permissions, as a mode's bits for one class

ACCESS_ACL = "system.posix_acl_access"

# The kernel's xattr form of an ACL (linux/posix_acl_xattr.h): a version, then entries of
# tag, permissions and id, sorted by tag.
_VERSION = 2
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")
_USER_OBJ, _USER, _GROUP_OBJ, _GROUP, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
_NO_ACL = (errno.ENODATA, errno.EOPNOTSUPP, errno.ENOTSUP)

_Entry = tuple[int, int, int]  # tag, permissions, uid or gid


class Caller(Protocol):
    """Who asks (a request's context): its filesystem uid and gid, and its thread's id."""

    @property
    def uid(self) -> int: ...

    @property
    def gid(self) -> int: ...

    @property
    def pid(self) -> int: ...


def acl_allows(descriptor: int, caller: Caller, wanted: int) -> bool:
    """Whether the access ACL of the file ``descriptor`` holds (``O_PATH`` will do) gives
    ``caller`` every permission of ``wanted`` (:data:`READ` | :data:`WRITE` |
    :data:`EXECUTE`).  True for a file without one, whose mode bits, which the kernel has
    checked, are the whole verdict, and for root, whose capabilities override an ACL as
    they override mode bits.  False when the answer turns on the caller's supplementary
    groups and they cannot be read.  OSError (EIO for an ACL the kernel would not have
    stored) when the file cannot be asked, and as :func:`caller_groups` raises it."""
    if caller.uid == 0:
        return True
    try:
        value = os.getxattr(f"/proc/self/fd/{descriptor}", ACCESS_ACL)
    except OSError as exc:
        if exc.errno in _NO_ACL:
            return True
        raise
    entries = _entries(value)
    owner = os.fstat(descriptor)
    if not owner.st_mode & stat.S_IRWXG:
        # The kernel consults no ACL of a file whose group bits (its mask) are empty: the
        # mode bits are the whole verdict there too.
        return True
    if caller.uid == owner.st_uid:
        return _grants(_permissions(entries, _USER_OBJ), wanted)
    mask = _permissions(entries, _MASK, default=READ | WRITE | EXECUTE)
    for tag, permissions, uid in entries:
        if tag == _USER and uid == caller.uid:
            return _grants(permissions & mask, wanted)
    groups = caller_groups(caller)
    if groups is None:
        return False
    in_groups = [
        permissions
        for tag, permissions, gid in entries
        if (tag == _GROUP_OBJ and owner.st_gid in groups) or (tag == _GROUP and gid in groups)
    ]
    if in_groups:
        # One matching entry that grants is enough; matching only entries that do not is a
        # refusal, never a fall back to "other".
        return any(_grants(permissions & mask, wanted) for permissions in in_groups)
    return _grants(_permissions(entries, _OTHER), wanted)


def caller_groups(caller: Caller) -> frozenset[int] | None:
    """The caller's gid and supplementary groups, which a request does not carry: read from
    its thread while it waits on the call.  None when they cannot be read (a caller in
    another pid namespace, whose id the kernel gives as 0).  OSError (EMFILE, ENFILE) when
    no descriptor is left to read them with: a shortage says nothing of the caller, whom
    None would refuse (or deny a set-group-ID bit) for it."""
    try:
        status = Path(f"/proc/{caller.pid}/status").read_text() if caller.pid else ""
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE):
            raise
        return None
    for line in status.splitlines():
        if line.startswith("Groups:"):
            return frozenset({caller.gid, *map(int, line.split()[1:])})
    return None


def _entries(value: bytes) -> list[_Entry]:
    count, rest = divmod(len(value) - _HEADER.size, _ENTRY.size)
    if count < 0 or rest or _HEADER.unpack_from(value)[0] != _VERSION:
        raise OSError(errno.EIO, f"{ACCESS_ACL} is not an ACL the kernel stores")
    return [_ENTRY.unpack_from(value, _HEADER.size + i * _ENTRY.size) for i in range(count)]


def _permissions(entries: list[_Entry], tag: int, default: int | None = None) -> int:
    for entry_tag, permissions, _ in entries:
        if entry_tag == tag:
            return permissions
    if default is None:  # every access ACL has its owner's and other's entries
        raise OSError(errno.EIO, f"{ACCESS_ACL} is not an ACL the kernel stores")
    return default


def _grants(permissions: int, wanted: int) -> bool:
    return permissions & wanted == wanted
