"""``ctx mount``: the storage root as the root ABI at a mount point, with FUSE (SPEC F-1).

Every operation is passed through to the storage root, never through a symbolic link of it,
after the :class:`~cortexfs.fuse.projection.Projection` has said the name is visible (and, for
a change, writable) to whoever the mount is for.  The kernel checks the mode bits against the
calling process (``default_permissions``), so a file keeps the owner and mode it has on disk;
what a caller creates is given the caller's uid and gid.  ``fsync`` on a file or a directory of
the mount is ``fsync`` on the file or directory behind it: once it returns, a write through the
mount is as durable as the same write made directly.

Inodes are the storage root's own numbers (the root is :data:`pyfuse3.ROOT_INODE`); each is
remembered with the path it was last looked up by.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pyfuse3

from cortexfs.fuse.projection import Projection

ENTRY_TIMEOUT = 1.0  # seconds the kernel may keep a name's answer: how late a policy change shows


class StorageFS(pyfuse3.Operations):
    """The storage root, as ``projection`` lets its viewer see it."""

    enable_writeback_cache = False

    def __init__(self, root: Path, projection: Projection) -> None:
        super().__init__()
        self.root = root
        self.projection = projection
        self._parts: dict[int, tuple[str, ...]] = {pyfuse3.ROOT_INODE: ()}

    # ------------------------------------------------------------------------- names

    def _path(self, parts: Sequence[str]) -> str:
        return os.path.join(self.root, *parts)

    def _parts_of(self, inode: int) -> tuple[str, ...]:
        try:
            return self._parts[inode]
        except KeyError:
            raise pyfuse3.FUSEError(errno.ESTALE) from None

    def _child(self, parent: int, name: bytes) -> tuple[str, ...]:
        text = os.fsdecode(name)
        if text in (".", "..") or "/" in text:
            raise pyfuse3.FUSEError(errno.EINVAL)
        parts = (*self._parts_of(parent), text)
        if not self.projection.visible(parts):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return parts

    def _writable(self, parts: tuple[str, ...]) -> None:
        if not self.projection.writable(parts):
            raise pyfuse3.FUSEError(errno.EACCES)

    def _attributes(self, parts: tuple[str, ...]) -> pyfuse3.EntryAttributes:
        try:
            status = os.lstat(self._path(parts))
        except OSError as exc:
            raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
        inode = pyfuse3.ROOT_INODE if not parts else status.st_ino
        self._parts[inode] = parts
        attributes = pyfuse3.EntryAttributes()
        attributes.st_ino = inode
        attributes.generation = 0
        attributes.entry_timeout = ENTRY_TIMEOUT
        attributes.attr_timeout = ENTRY_TIMEOUT
        for field in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_rdev", "st_size"):
            setattr(attributes, field, getattr(status, field))
        attributes.st_blksize = status.st_blksize
        attributes.st_blocks = status.st_blocks
        attributes.st_atime_ns = status.st_atime_ns
        attributes.st_mtime_ns = status.st_mtime_ns
        attributes.st_ctime_ns = status.st_ctime_ns
        return attributes

    # ---------------------------------------------------------------------- reading

    async def lookup(self, parent_inode, name, ctx=None):  # type: ignore[no-untyped-def]
        return self._attributes(self._child(parent_inode, name))

    async def getattr(self, inode, ctx=None):  # type: ignore[no-untyped-def]
        return self._attributes(self._parts_of(inode))

    async def readlink(self, inode, ctx):  # type: ignore[no-untyped-def]
        return _call(os.readlink, os.fsencode(self._path(self._parts_of(inode))))

    async def opendir(self, inode, ctx):  # type: ignore[no-untyped-def]
        parts = self._parts_of(inode)
        if not stat.S_ISDIR(_call(os.lstat, self._path(parts)).st_mode):
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh, start_id, token):  # type: ignore[no-untyped-def]
        parts = self._parts_of(fh)
        names = sorted(_call(os.listdir, self._path(parts)))
        for index, name in enumerate(names[start_id:], start=start_id):
            child = (*parts, name)
            if not self.projection.visible(child):
                continue
            try:
                attributes = self._attributes(child)
            except pyfuse3.FUSEError:
                continue  # removed meanwhile
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attributes, index + 1):
                return

    async def releasedir(self, fh):  # type: ignore[no-untyped-def]
        return None

    async def open(self, inode, flags, ctx):  # type: ignore[no-untyped-def]
        parts = self._parts_of(inode)
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND):
            self._writable(parts)
        fd = _call(os.open, self._path(parts), (flags & ~os.O_CREAT) | os.O_NOFOLLOW)
        return pyfuse3.FileInfo(fh=fd)

    async def read(self, fh, off, size):  # type: ignore[no-untyped-def]
        return _call(os.pread, fh, size, off)

    async def statfs(self, ctx):  # type: ignore[no-untyped-def]
        status = _call(os.statvfs, self.root)
        data = pyfuse3.StatvfsData()
        for field in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail"):
            setattr(data, field, getattr(status, field))
        for field in ("f_files", "f_ffree", "f_favail", "f_namemax"):
            setattr(data, field, getattr(status, field))
        return data

    # ---------------------------------------------------------------------- writing

    async def write(self, fh, off, buf):  # type: ignore[no-untyped-def]
        return _call(os.pwrite, fh, buf, off)

    async def fsync(self, fh, datasync):  # type: ignore[no-untyped-def]
        _call(os.fdatasync if datasync else os.fsync, fh)

    async def fsyncdir(self, fh, datasync):  # type: ignore[no-untyped-def]
        fd = _call(os.open, self._path(self._parts_of(fh)), os.O_RDONLY | os.O_DIRECTORY)
        try:
            _call(os.fsync, fd)
        finally:
            os.close(fd)

    async def flush(self, fh):  # type: ignore[no-untyped-def]
        return None

    async def release(self, fh):  # type: ignore[no-untyped-def]
        os.close(fh)

    async def create(self, parent_inode, name, mode, flags, ctx):  # type: ignore[no-untyped-def]
        parts = self._child_to_make(parent_inode, name)
        fd = _call(os.open, self._path(parts), flags | os.O_CREAT | os.O_NOFOLLOW, mode)
        self._give(fd, ctx)
        return pyfuse3.FileInfo(fh=fd), self._attributes(parts)

    async def mkdir(self, parent_inode, name, mode, ctx):  # type: ignore[no-untyped-def]
        parts = self._child_to_make(parent_inode, name)
        _call(os.mkdir, self._path(parts), mode)
        fd = _call(os.open, self._path(parts), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            self._give(fd, ctx)
        finally:
            os.close(fd)
        return self._attributes(parts)

    async def unlink(self, parent_inode, name, ctx):  # type: ignore[no-untyped-def]
        parts = self._child(parent_inode, name)
        self._writable(parts)
        _call(os.unlink, self._path(parts))

    async def rmdir(self, parent_inode, name, ctx):  # type: ignore[no-untyped-def]
        parts = self._child(parent_inode, name)
        self._writable(parts)
        _call(os.rmdir, self._path(parts))

    async def rename(  # type: ignore[no-untyped-def]
        self, parent_old, name_old, parent_new, name_new, flags, ctx
    ):
        old = self._child(parent_old, name_old)
        new = self._child_to_make(parent_new, name_new, existing_ok=True)
        self._writable(old)
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise pyfuse3.FUSEError(errno.EINVAL)
        if flags & pyfuse3.RENAME_NOREPLACE and os.path.lexists(self._path(new)):
            raise pyfuse3.FUSEError(errno.EEXIST)
        _call(os.rename, self._path(old), self._path(new))

    async def setattr(self, inode, attr, fields, fh, ctx):  # type: ignore[no-untyped-def]
        parts = self._parts_of(inode)
        self._writable(parts)
        path = self._path(parts)
        if fields.update_size:
            _call(os.truncate, path if fh is None else fh, attr.st_size)
        if fields.update_mode:
            _call(os.chmod, path, stat.S_IMODE(attr.st_mode), follow_symlinks=False)
        if fields.update_uid or fields.update_gid:
            uid = attr.st_uid if fields.update_uid else -1
            gid = attr.st_gid if fields.update_gid else -1
            _call(os.chown, path, uid, gid, follow_symlinks=False)
        if fields.update_atime or fields.update_mtime:
            status = _call(os.lstat, path)
            atime = attr.st_atime_ns if fields.update_atime else status.st_atime_ns
            mtime = attr.st_mtime_ns if fields.update_mtime else status.st_mtime_ns
            _call(os.utime, path, ns=(atime, mtime), follow_symlinks=False)
        return self._attributes(parts)

    def _child_to_make(
        self, parent: int, name: bytes, *, existing_ok: bool = False
    ) -> tuple[str, ...]:
        parts = (*self._parts_of(parent), os.fsdecode(name))
        if os.fsdecode(name) in (".", "..") or not self.projection.visible(parts):
            raise pyfuse3.FUSEError(errno.EACCES)
        self._writable(parts)
        if not existing_ok and os.path.lexists(self._path(parts)):
            raise pyfuse3.FUSEError(errno.EEXIST)
        return parts

    def _give(self, fd: int, ctx: pyfuse3.RequestContext) -> None:
        """What a caller creates is the caller's, as it would be on a local filesystem."""
        if os.geteuid() == 0:
            _call(os.fchown, fd, ctx.uid, ctx.gid)


def _call(function, *args, **kwargs):  # type: ignore[no-untyped-def]
    """An OS call whose failure the kernel should see as the same errno."""
    try:
        return function(*args, **kwargs)
    except OSError as exc:
        raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None


def serve(root: Path, mountpoint: Path, projection: Projection, *, allow_other: bool) -> None:
    """Mount, answer until SIGTERM, SIGINT or an unmount, then unmount cleanly."""
    import signal as signals

    import trio

    options = set(pyfuse3.default_options) | {"fsname=cortexfs", "subtype=cortexfs"}
    if allow_other:
        options.add("allow_other")
    pyfuse3.init(StorageFS(root, projection), str(mountpoint), options)

    async def main() -> None:
        async with trio.open_nursery() as nursery:

            async def on_signal() -> None:
                with trio.open_signal_receiver(signals.SIGTERM, signals.SIGINT) as received:
                    async for _ in received:
                        pyfuse3.terminate()
                        return

            nursery.start_soon(on_signal)
            await pyfuse3.main()
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    except BaseException:
        pyfuse3.close(unmount=True)
        raise
    pyfuse3.close(unmount=True)
