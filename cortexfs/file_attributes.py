"""File attributes (``chattr``) that refuse what a mode allows, to root too.

An immutable file or directory (``+i``) may not be changed, moved or removed; an append-only
one (``+a``) may only grow.  No owner, group or mode explains such a refusal, and the kernel
reports it as a bare EPERM: these helpers name the attribute, the file and the ``chattr``
that lifts it, so that a refused step says where to look instead of blaming a directory
whose mode allows it.  They read the attributes with ``FS_IOC_GETFLAGS`` of linux/fs.h, as
``lsattr`` does; a filesystem that keeps none answers nothing, and so do they.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from cortexfs.errors import CtxError

# _IOR('f', 1, long) of linux/fs.h.
_FS_IOC_GETFLAGS = (2 << 30) | (struct.calcsize("l") << 16) | (ord("f") << 8) | 1


class Attribute(NamedTuple):
    flag: int
    name: str
    letter: str
    in_directory: str  # what it refuses in a directory
    on_file: str  # what it refuses of a file


REFUSING_ATTRIBUTES = (
    Attribute(
        0x10,
        "immutable",
        "i",
        "nothing in it may be added, moved or removed",
        "it may not be changed, moved or removed",
    ),
    Attribute(
        0x20,
        "append-only",
        "a",
        "entries may be added to it but none moved out or removed",
        "it may only grow, never be truncated, moved or removed",
    ),
)


def refusing_attribute(fd: int) -> Attribute | None:
    """The attribute of the file open as ``fd`` that refuses changes its mode allows; None
    when it has none, or its filesystem keeps no attributes."""
    try:
        flags = struct.unpack_from("i", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, bytes(8)))[0]
    except OSError:
        return None
    for attribute in REFUSING_ATTRIBUTES:
        if flags & attribute.flag:
            return attribute
    return None


def attribute_refusal(fd: int, action: str, path: Path) -> CtxError | None:
    """EPERM for ``action`` when the directory open as ``fd`` (``path``; closed here) has an
    attribute that refuses changes whatever its mode; None when it has none."""
    try:
        attribute = refusing_attribute(fd)
    finally:
        os.close(fd)
    return None if attribute is None else _refused_by(attribute, action, path, directory=True)


def entry_attribute_refusal(dir_fd: int, name: str, action: str, path: Path) -> CtxError | None:
    """EPERM for ``action`` when the file or directory ``name`` in ``dir_fd`` (``path``) has an
    attribute that refuses changes whatever its mode: a file to be moved, replaced, truncated
    or removed, or a directory to be changed.  None when it has none, is gone, or is neither
    a regular file nor a directory (never opened: Q-8)."""
    try:
        found = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None
    if stat.S_ISDIR(found.st_mode):
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError:
            return None
        return attribute_refusal(fd, action, path)
    if not stat.S_ISREG(found.st_mode):
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        attribute = refusing_attribute(fd)
    finally:
        os.close(fd)
    return None if attribute is None else _refused_by(attribute, action, path, directory=False)


def _refused_by(attribute: Attribute, action: str, path: Path, *, directory: bool) -> CtxError:
    """EPERM for ``action``, refused by ``attribute`` of ``path`` (a directory or a file)."""
    shows, refuses = (
        ("'lsattr -d'", attribute.in_directory) if directory else ("'lsattr'", attribute.on_file)
    )
    return CtxError(
        errno.EPERM,
        f"cannot {action}: {path} is {attribute.name} (attribute '{attribute.letter}', which "
        f"{shows} shows): {refuses}, by root too; have root remove it with "
        f"'chattr -{attribute.letter} {path}'",
    )


def tree_attribute_refusal(
    dir_fd: int, names: Iterable[str], action: str, directory: Path
) -> CtxError | None:
    """:func:`entry_attribute_refusal` of ``names`` in ``dir_fd`` (``directory``) and of
    everything below those that are directories, never following a link: the first refusal
    that replacing or removing them whole would meet."""
    for name in names:
        path = directory / name
        refused = entry_attribute_refusal(dir_fd, name, action, path)
        if refused is not None:
            return refused
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
        except OSError:
            continue  # not a directory (or gone): nothing below it
        try:
            refused = tree_attribute_refusal(fd, os.listdir(fd), action, path)
        except OSError:
            refused = None  # unreadable: the step itself says what it meets
        finally:
            os.close(fd)
        if refused is not None:
            return refused
    return None


def removal_refusal(exc: OSError, dir_fd: int, name: str, action: str) -> CtxError | OSError:
    """The error of removing ``name`` from ``dir_fd`` that the kernel refused with ``exc``:
    when an attribute of the entry or of its directory refused it (EPERM), an error naming
    that attribute, the path (as the kernel knows the directory) and the ``chattr`` that lifts
    it; ``exc`` otherwise."""
    if exc.errno != errno.EPERM:
        return exc
    try:
        directory = Path(os.readlink(f"/proc/self/fd/{dir_fd}"))
        own = os.open(".", os.O_RDONLY | os.O_DIRECTORY, dir_fd=dir_fd)
    except OSError:
        return exc
    refused = entry_attribute_refusal(dir_fd, name, action, directory / name)
    if refused is not None:
        os.close(own)
        return refused
    return attribute_refusal(own, action, directory) or exc
