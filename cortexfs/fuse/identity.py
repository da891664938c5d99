"""Which file an inode number stands for now: the storage filesystem's own file handle.

An inode number is reused: remove a directory and make another, and ext4 gives the new one
the number the old one had.  The kernel's file handle (``name_to_handle_at(2)``, what NFS
serves files by) names a file for as long as it exists and never names another after it
is gone: on ext4, xfs, btrfs and tmpfs it holds the inode number *and* the inode's
generation, which the filesystem changes each time it reuses the number.  Two handles that
differ are two files, whatever their inode numbers say.

A filesystem that gives no handles (``EOPNOTSUPP``: some FUSE and network filesystems) has
no identity here (None): there a reused number cannot be told from the file it was.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os

from cortexfs.libc import libc

Identity = bytes

_MAX_HANDLE_SZ = 128  # linux/fcntl.h
_AT_EMPTY_PATH = 0x1000
_UNSUPPORTED = (errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS)


def identity_at(directory: int, name: str) -> Identity | None:
    """The identity of ``name`` in ``directory`` (a link itself, never what it points to);
    None where the filesystem has none; OSError when ``name`` is not there."""
    return _handle(directory, os.fsencode(name), 0)


def identity_of(descriptor: int) -> Identity | None:
    """The identity of the file ``descriptor`` holds (None where the filesystem has none)."""
    return _handle(descriptor, b"", _AT_EMPTY_PATH)


def generation_of(identity: Identity) -> int:
    """A FUSE generation for the file ``identity`` names: the same for the same file, and
    (but for a chance of one in 2**64) another for any other file given the same number."""
    return int.from_bytes(hashlib.blake2b(identity, digest_size=8).digest(), "little") or 1


def _handle(directory: int, name: bytes, flags: int) -> Identity | None:
    buffer = ctypes.create_string_buffer(8 + _MAX_HANDLE_SZ)
    ctypes.c_uint.from_buffer(buffer).value = _MAX_HANDLE_SZ
    mount_id = ctypes.c_int()
    if libc().name_to_handle_at(directory, name, buffer, ctypes.byref(mount_id), flags) != 0:
        code = ctypes.get_errno()
        if code in _UNSUPPORTED:
            return None
        raise OSError(code, os.strerror(code), os.fsdecode(name))
    size = ctypes.c_uint.from_buffer(buffer).value
    # The mount's id too: one storage root may span filesystems, whose handles may coincide.
    return mount_id.value.to_bytes(4, "little", signed=True) + buffer.raw[4 : 8 + size]
