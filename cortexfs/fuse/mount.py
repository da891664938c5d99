"""``ctx mount``: the storage root as the root ABI at a mount point, with FUSE (SPEC F-1).

Every operation is passed through to the storage root, never through a symbolic link of it,
after the :class:`~cortexfs.fuse.projection.Projection` has said the name is visible (and, for
a change, writable) to whoever the mount is for.  An agent's view serves that agent's uid
and whoever runs the mount, nobody else (:meth:`Projection.serves`, P-5 step 1).  The kernel
checks the mode bits against the calling process (``default_permissions``), so a file keeps
the owner and mode it has on disk; what a caller creates is given the caller's uid and gid.
``fsync`` on a file or a directory of the mount is ``fsync`` on the file or directory behind
it: once it returns, a write through the mount is as durable as the same write made directly.

Node ids are the storage root's own inode numbers (the root is :data:`pyfuse3.ROOT_INODE`),
but for a file whose number the kernel still holds for another, removed file: each node is
remembered with the identity of its file and the names it was looked up, created or linked by,
and a rename, link, unlink or rmdir through the mount changes those names at once
(:mod:`cortexfs.fuse.inodes`): the kernel goes on using a node it knows under its new name
without asking again, and a node never stands for another file than its own.  Paths are never given
to the kernel whole: see :meth:`StorageFS._parent`.  The process that mounts it and answers the
kernel is :mod:`cortexfs.fuse.daemon`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import inspect
import itertools
import os
import stat
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyfuse3
import trio

from cortexfs import durable
from cortexfs.agents.projection import FRESH_SECONDS
from cortexfs.fuse.access import EXECUTE, READ, WRITE, acl_allows, caller_groups
from cortexfs.fuse.identity import Identity, generation_of, identity_of
from cortexfs.fuse.inodes import InodeNames
from cortexfs.fuse.projection import Projection
from cortexfs.libc import check, libc

# Seconds the kernel may keep a name's answer, on top of the projection's own (as long): how
# late a policy change shows.
ENTRY_TIMEOUT = FRESH_SECONDS

# How often an open waiting for another process's lease on its file to be broken tries again.
LEASE_RETRY_SECONDS = 0.05


@dataclass
class _Listing:
    """An open directory handle: the directory's node, a descriptor of the directory itself
    (``O_PATH``), and the names the kernel's offsets into its listing count through (None
    until the first ``readdir``)."""

    inode: int
    directory_fd: int
    names: list[str] | None = None


_Operations = TypeVar("_Operations", bound=type[pyfuse3.Operations])


def _answering_eio_for_bugs(handler: Callable[..., Any]) -> Callable[..., Any]:
    """``handler``, answering EIO, with the traceback on ``ctx mount``'s standard error, for
    an error that is not a :class:`pyfuse3.FUSEError`: pyfuse3 ends its main loop on one,
    and one bad request would leave a dead mount that fails every access with ENOTCONN.
    Running out of file descriptors is no such error, wherever the daemon meets it (an
    agent's controls are read by the policy library, with descriptors of its own): EMFILE
    or ENFILE, as any open the daemon makes itself answers it."""

    @functools.wraps(handler)
    async def answering(*args: Any, **kwargs: Any) -> Any:
        try:
            return await handler(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except Exception as exc:
            if isinstance(exc, OSError) and exc.errno in _SHORT_OF_DESCRIPTORS:
                raise pyfuse3.FUSEError(exc.errno) from None
            # Said where it can be: a terminal gone since the mount began is no reason to end.
            with contextlib.suppress(OSError, ValueError):
                print(
                    f"ctx mount: {handler.__name__} answered EIO for an error of its own:",
                    file=sys.stderr,
                )
                traceback.print_exc()
            raise pyfuse3.FUSEError(errno.EIO) from None

    return answering


def _request_handlers(operations: _Operations) -> list[tuple[str, Callable[..., Any]]]:
    """The request handlers ``operations`` defines itself, by name."""
    return [
        (name, handler)
        for name, handler in vars(operations).items()
        if hasattr(pyfuse3.Operations, name) and inspect.iscoroutinefunction(handler)
    ]


def _every_request_answered(operations: _Operations) -> _Operations:
    """``operations`` with each request handler it defines :func:`_answering_eio_for_bugs`."""
    for name, handler in _request_handlers(operations):
        setattr(operations, name, _answering_eio_for_bugs(handler))
    return operations


# The requests that may act through a file already open, which decide their caller
# themselves: an open descriptor goes on working for whoever holds it, as a local file's
# does once its mode changed (a read past the kernel's half second asks getattr again, in
# the reader's name; an ftruncate is a setattr with the descriptor's handle).
_THROUGH_OPEN_FILES = frozenset({"getattr", "setattr"})


def _each_caller_served(operations: _Operations) -> _Operations:
    """``operations`` with each request handler that is told its caller (``ctx``) answering
    EACCES to a caller its projection does not serve: step 1 of the authority chain (P-5,
    peer credentials), before any name is looked at.  The requests without a caller go on
    with a handle opened for one served (a read, a listing, a release)."""
    for name, handler in _request_handlers(operations):
        if "ctx" in inspect.signature(handler).parameters and name not in _THROUGH_OPEN_FILES:
            setattr(operations, name, _serving_its_viewer_only(handler))
    return operations


def _serving_its_viewer_only(handler: Callable[..., Any]) -> Callable[..., Any]:
    position = list(inspect.signature(handler).parameters).index("ctx")  # self is 0

    @functools.wraps(handler)
    async def served(self: StorageFS, *args: Any, **kwargs: Any) -> Any:
        ctx = kwargs.get("ctx", args[position - 1] if len(args) >= position else None)
        if not self._serves(ctx):
            raise pyfuse3.FUSEError(errno.EACCES)
        return await handler(self, *args, **kwargs)

    return served


@_every_request_answered
@_each_caller_served
class StorageFS(pyfuse3.Operations):
    """The storage root, as ``projection`` lets its viewer see it."""

    enable_writeback_cache = False

    def __init__(self, root: Path, projection: Projection) -> None:
        super().__init__()
        self.root = root
        self.projection = projection
        self._root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        self._names = InodeNames(pyfuse3.ROOT_INODE)
        # Each open descriptor → the inode and the name it was opened by: a file unlinked
        # while open has no name left, and is reached through one of these until released.
        self._open_files: dict[int, tuple[int, tuple[str, ...]]] = {}
        # Each open directory handle → its inode and the names its listing goes through.  The
        # kernel resumes a listing at the offset of the last entry it took: an offset into one
        # listing taken at the start, not into a new one that lost or gained names ahead of it
        # (which skips or repeats entries nobody touched: a delete-while-listing loop, `git
        # clean`, would leave files behind).
        self._open_directories: dict[int, _Listing] = {}
        self._next_directory_handle = itertools.count(1)
        # Each node → the version of its file (inode, size, ctime) at its last open: the
        # kernel keeps a file's cached pages across opens only while that version holds.
        self._opened_versions: dict[int, tuple[int, int, int]] = {}
        # The descriptors opened for appending, whose writes come straight, not through the
        # kernel's page cache (see _opened_file).
        self._appending: set[int] = set()

    # ------------------------------------------------------------------------- names
    #
    # The daemon runs as root for every viewer, so no path is ever handed to the kernel
    # whole: each is walked one component at a time from the root's descriptor with
    # O_NOFOLLOW, and the last component is used through its parent's descriptor.  A
    # directory swapped for a symbolic link between two requests cannot redirect the daemon
    # outside the storage root (ELOOP/ENOTDIR instead).

    @contextlib.contextmanager
    def _parent(self, parts: Sequence[str]) -> Iterator[int]:
        """A descriptor of the directory holding ``parts[-1]``, walked without links.  A
        daemon out of descriptors answers EMFILE here as at every other open, not a bug's
        EIO."""
        fd = _call(os.open, ".", _WALK, dir_fd=self._root_fd)
        try:
            for name in parts[:-1]:
                child = _call(os.open, name, _WALK | os.O_NOFOLLOW, dir_fd=fd)
                passed, fd = fd, child  # rebound before the close: the cleanup after a Ctrl-C
                os.close(passed)  # between the two must not close this one again
            yield fd
        finally:
            os.close(fd)

    def _open(self, parts: Sequence[str], flags: int, mode: int = 0o777) -> int:
        if not parts:
            return _call(os.open, ".", flags, dir_fd=self._root_fd)
        with self._parent(parts) as parent:
            return _call(
                os.open, parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent
            )

    def _lstat(self, parts: Sequence[str]) -> os.stat_result:
        if not parts:
            return _call(os.fstat, self._root_fd)
        with self._parent(parts) as parent:
            return _call(os.stat, parts[-1], dir_fd=parent, follow_symlinks=False)

    def _identified(self, parts: Sequence[str]) -> tuple[os.stat_result, Identity | None]:
        """The status and the identity of what ``parts`` leads to, both of that one file."""
        if not parts:
            return _call(os.fstat, self._root_fd), None
        with self._parent(parts) as parent:
            return _identified_in(parent, parts[-1])

    def _parts_of(self, inode: int) -> tuple[str, ...]:
        try:
            return self._names.path(inode)
        except KeyError:
            raise pyfuse3.FUSEError(errno.ESTALE) from None

    def _checked(self, inode: int) -> tuple[tuple[str, ...], os.stat_result]:
        """The name node ``inode`` is known by, once checked to lead to its file still, and
        that file's status: ESTALE when another file has taken that name (renamed there
        outside the mount, by someone who may write the directory, or made there after the
        file was removed, even with its inode number).  The daemon acts as root, so acting
        on whatever now has the name would act on that other file for the caller: read it,
        write it, chmod it, make a file in it."""
        parts = self._parts_of(inode)
        status, identity = self._identified(parts)
        if parts and (status.st_ino, identity) != self._names.file(inode):
            raise pyfuse3.FUSEError(errno.ESTALE)
        return parts, status

    def _still(self, inode: int) -> tuple[str, ...]:
        return self._checked(inode)[0]

    def _holding(self, fd: int, inode: int, parts: Sequence[str]) -> int:
        """``fd``, opened by ``parts``, if it holds node ``inode``'s file; else closed, and
        ESTALE."""
        if parts:
            try:
                held = (os.fstat(fd).st_ino, identity_of(fd))
            except OSError:
                held = None
            if held != self._names.file(inode):
                os.close(fd)
                raise pyfuse3.FUSEError(errno.ESTALE)
        return fd

    def _reopened(
        self, inode: int, parts: Sequence[str], flags: int, ctx: pyfuse3.RequestContext
    ) -> int:
        """Node ``inode``'s file, reached by ``parts``, opened with ``flags``: the name is
        opened ``O_PATH`` first (which waits on no FIFO, wakes no device and truncates
        nothing), checked to hold the node's file (:meth:`_holding`) and to be a regular file
        or a directory, and only then opened with ``flags`` through that descriptor.  A link
        is ELOOP, anything else ESTALE, on which the kernel looks the name up again.  Opened
        by name, a file swapped for a FIFO behind the kernel's entry by whoever may write its
        directory would keep the daemon waiting for a writer that may never come, and every
        caller of the mount, ``ctx umount`` included, waiting behind it; ``O_TRUNC`` would
        have emptied the file now at the name, perhaps one the caller may not write, before
        the check.  EACCES where the file's ACL refuses the caller what ``flags`` ask
        (:func:`_acl_permits`).  :class:`_LeaseBreaking` while another process's lease on
        the file is being broken (:func:`_open_at_once`)."""
        handle = self._holding(self._open(parts, os.O_PATH), inode, parts)
        try:
            kind = stat.S_IFMT(_call(os.fstat, handle).st_mode)
            if kind == stat.S_IFLNK:  # never followed: what an open by name would have said
                raise pyfuse3.FUSEError(errno.ELOOP)
            if kind not in (stat.S_IFREG, stat.S_IFDIR):
                raise pyfuse3.FUSEError(errno.ESTALE)
            _acl_permits(handle, ctx, _asked_by_open(flags))
            return _open_at_once(f"/proc/self/fd/{handle}", flags)
        finally:
            os.close(handle)

    def _child(self, parent: int, name: bytes) -> tuple[str, ...]:
        text = os.fsdecode(name)
        if text in (".", "..") or "/" in text:
            raise pyfuse3.FUSEError(errno.EINVAL)
        parts = (*self._still(parent), text)
        self._visible(parts)
        return parts

    def _visible(self, parts: tuple[str, ...]) -> None:
        """ENOENT unless the viewer may see ``parts`` now: a node the kernel learned of
        before a grant was revoked (a working directory, an ``O_PATH`` descriptor) is no way
        around the view."""
        if not self.projection.visible(parts):
            raise pyfuse3.FUSEError(errno.ENOENT)

    def _writable(self, parts: tuple[str, ...]) -> None:
        if not self.projection.writable(parts):
            raise pyfuse3.FUSEError(errno.EACCES)

    def _entry(
        self, parts: tuple[str, ...], descriptor: int | None = None
    ) -> pyfuse3.EntryAttributes:
        """The attributes of ``parts`` (the file ``descriptor`` holds, when given: the one
        just made), whose node the kernel now knows by that name."""
        if descriptor is None:
            status, identity = self._identified(parts)
        else:
            status, identity = _call(os.fstat, descriptor), _call(identity_of, descriptor)
        node = self._names.node_for(status.st_ino, identity)
        self._names.remember(node, tuple(parts), status.st_ino, identity)
        return self._described(status, node, identity)

    def _described(
        self, status: os.stat_result, node: int, identity: Identity | None = None
    ) -> pyfuse3.EntryAttributes:
        """``status`` as the kernel is given it, for ``node``.  A directory's link count
        counts its subdirectories; in a view that hides entries it would tell how many are
        hidden (T-5), so there it is 1, which says "not counted" (as on many FUSE
        filesystems, and as find(1) and fts(3) understand it)."""
        attributes = _described(status, node, generation_of(identity) if identity else 0)
        if self.projection.hides_entries and stat.S_ISDIR(status.st_mode):
            attributes.st_nlink = 1
        return attributes

    def _serves(self, ctx: pyfuse3.RequestContext | None) -> bool:
        """Whether the projection serves the caller (P-5 step 1, peer credentials; see
        :func:`_each_caller_served`); a request without one goes on."""
        return ctx is None or self.projection.serves(ctx.uid)

    def _is_open(self, inode: int) -> bool:
        return any(held == inode for held, _ in self._open_files.values())

    def _open_file(self, inode: int) -> tuple[int, tuple[str, ...]]:
        """A descriptor the kernel opened ``inode`` by, and the name it was opened by;
        ESTALE when none is open."""
        for descriptor, (held, parts) in self._open_files.items():
            if held == inode:
                return descriptor, parts
        raise pyfuse3.FUSEError(errno.ESTALE)

    def _opened_file(self, inode: int, fd: int, parts: tuple[str, ...]) -> pyfuse3.FileInfo:
        """The kernel's handle of ``fd``, opened for node ``inode``.  The pages the kernel
        cached of the file are kept only when it has not changed since its last open here:
        a file rewritten on the storage root in place, its size and mtime kept (``cp -p``,
        ``rsync --inplace --times``), looks unchanged to the kernel, which would serve its
        old bytes for as long as it keeps them.  Its ctime, which no one can set, tells."""
        try:
            status = _call(os.fstat, fd)
        except BaseException:
            os.close(fd)
            raise
        version = (status.st_ino, status.st_size, status.st_ctime_ns)
        unchanged = self._opened_versions.get(inode) == version
        self._opened_versions[inode] = version
        self._open_files[fd] = (inode, parts)
        # An appender's write(2) must reach the file as one append (S-5: a line is never
        # torn by another appender, one on the storage root included).  Through the page
        # cache the kernel may split it where a page is not cached yet, into writes the
        # descriptor's O_APPEND puts at the end one by one; direct I/O sends it whole (up to
        # the kernel's largest FUSE request, 128 KiB by default).
        appending = bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND)
        if appending:
            self._appending.add(fd)
        return pyfuse3.FileInfo(fh=fd, keep_cache=unchanged, direct_io=appending)

    # ---------------------------------------------------------------------- reading

    async def lookup(self, parent_inode, name, ctx=None):  # type: ignore[no-untyped-def]
        return self._entry(self._child(parent_inode, name))

    async def getattr(self, inode, ctx=None):  # type: ignore[no-untyped-def]
        if not self._serves(ctx) and not self._is_open(inode):  # see _THROUGH_OPEN_FILES
            raise pyfuse3.FUSEError(errno.EACCES)
        try:
            parts, status = self._checked(inode)
            # Hidden since the kernel learned of it: described only while a descriptor of it
            # is open (a file opened before a revocation goes on being used, and stat'ed).
            if not self.projection.visible(parts) and not self._is_open(inode):
                raise pyfuse3.FUSEError(errno.ENOENT)
        except pyfuse3.FUSEError:
            if not self._is_open(inode):
                raise
        else:
            return self._described(status, inode)
        # No name leads to it any more (unlinked while open, or changed outside the mount).
        descriptor, _ = self._open_file(inode)
        return self._described(_call(os.fstat, descriptor), inode)

    async def forget(self, inode_list):  # type: ignore[no-untyped-def]
        for inode, count in inode_list:
            self._names.forget(inode, count)
            if self._names.file(inode) is None:
                self._opened_versions.pop(inode, None)

    async def readlink(self, inode, ctx):  # type: ignore[no-untyped-def]
        parts = self._still(inode)
        self._visible(parts)  # an O_PATH descriptor of a link hidden since reads no target
        with self._parent(parts) as parent:
            return os.fsencode(_call(os.readlink, parts[-1], dir_fd=parent))

    async def opendir(self, inode, ctx):  # type: ignore[no-untyped-def]
        parts = self._still(inode)
        self._visible(parts)
        directory = self._holding(self._open(parts, os.O_PATH), inode, parts)
        try:
            if not stat.S_ISDIR(_call(os.fstat, directory).st_mode):
                raise pyfuse3.FUSEError(errno.ENOTDIR)
            _acl_permits(directory, ctx, READ)
        except BaseException:
            os.close(directory)
            raise
        handle = next(self._next_directory_handle)
        self._open_directories[handle] = _Listing(inode, directory)
        return handle

    async def readdir(self, fh, start_id, token):  # type: ignore[no-untyped-def]
        listing = self._open_directories[fh]
        inode = listing.inode
        parts = self._parts_of(inode)
        if start_id == 0 or listing.names is None:  # a listing from the start (rewinddir too)
            directory = self._holding(self._open(parts, _LIST), inode, parts)
            try:
                on_disk = sorted(_call(os.listdir, directory))
            finally:
                os.close(directory)
            # Only the names the viewer may see count: an offset past a hidden one would tell
            # how many are hidden, and where.  One hidden since is skipped below.
            shown = [name for name in on_disk if self.projection.visible((*parts, name))]
            listing.names = [".", "..", *shown]
        elif _call(os.fstat, listing.directory_fd).st_nlink == 0:
            return  # removed: its listing ends here, as a removed directory's does on a disk
        # Once begun, a listing goes on in the directory it began in, reached through the
        # descriptor held since it was opened, not by its name: one moved or replaced on the
        # storage root meanwhile lists the rest of its own entries, as on a local disk, never
        # another directory's, and never ends short.
        names = listing.names
        replied = False
        for index, name in enumerate(names[start_id:], start=start_id):
            if name in (".", ".."):  # the kernel holds no entry for either: not remembered
                itself = parts if name == "." else parts[:-1]
                status = self._lstat(itself)
                node = inode if name == "." else self._names.node_at(itself) or status.st_ino
                attributes = self._described(status, node)
                if not pyfuse3.readdir_reply(token, os.fsencode(name), attributes, index + 1):
                    return
                replied = True
                continue
            child = (*parts, name)
            if not self.projection.visible(child):
                continue
            try:
                status, identity = _identified_in(listing.directory_fd, name)
            except pyfuse3.FUSEError as failed:
                if failed.errno == errno.ENOENT:
                    continue  # removed meanwhile
                # Never skipped: a listing that quietly ended here would look complete.  The
                # entries given so far stand (the kernel asks again from the last one), and
                # the error (EMFILE, EIO…) comes when the next request starts at this name.
                if replied:
                    return
                raise
            node = self._names.node_for(status.st_ino, identity)
            attributes = self._described(status, node, identity)
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attributes, index + 1):
                return
            # An entry the kernel now holds.
            self._names.remember(node, child, status.st_ino, identity)
            replied = True

    async def releasedir(self, fh):  # type: ignore[no-untyped-def]
        listing = self._open_directories.pop(fh, None)
        if listing is not None:
            os.close(listing.directory_fd)

    async def open(self, inode, flags, ctx):  # type: ignore[no-untyped-def]
        try:
            parts = self._parts_of(inode)
        except pyfuse3.FUSEError:  # reopened by descriptor (/proc/PID/fd/N) once unlinked
            return await self._open_by_descriptor(inode, flags, ctx)
        self._visible(parts)
        if flags & _WRITING:
            self._writable(parts)
        try:
            opened = await _once_no_lease_holds_it(lambda: self._reopened(inode, parts, flags, ctx))
        except pyfuse3.FUSEError as gone:
            if not self._gone_but_open(inode, gone):
                raise
            return await self._open_by_descriptor(inode, flags, ctx)
        return self._opened_file(inode, opened, parts)

    async def _open_by_descriptor(
        self, inode: int, flags: int, ctx: pyfuse3.RequestContext
    ) -> pyfuse3.FileInfo:
        """``inode`` opened again through a descriptor it is open by (``/proc/PID/fd/N``),
        as writable as its name was: no name leads to it any more."""
        descriptor, parts = self._open_file(inode)
        self._visible(parts)
        if flags & _WRITING:
            self._writable(parts)
        _acl_permits(descriptor, ctx, _asked_by_open(flags))
        reopened = await _once_no_lease_holds_it(
            lambda: _open_at_once(f"/proc/self/fd/{descriptor}", flags)
        )
        return self._opened_file(inode, reopened, parts)

    def _gone_but_open(self, inode: int, refused: pyfuse3.FUSEError) -> bool:
        """Whether ``refused`` says the name of ``inode`` no longer leads to it — the file
        was unlinked (ENOENT) or replaced (ESTALE) on the storage root itself, not through
        the mount — while a descriptor of it is open here: a caller holding it may still
        change it, as on a local filesystem (``ftruncate``, ``fchmod``, a reopen)."""
        if refused.errno not in (errno.ENOENT, errno.ESTALE):
            return False
        return any(held == inode for held, _ in self._open_files.values())

    async def read(self, fh, off, size):  # type: ignore[no-untyped-def]
        return _call(os.pread, fh, size, off)

    async def statfs(self, ctx):  # type: ignore[no-untyped-def]
        status = _call(os.statvfs, self._root_fd)
        data = pyfuse3.StatvfsData()
        for field in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail"):
            setattr(data, field, getattr(status, field))
        for field in ("f_files", "f_ffree", "f_favail", "f_namemax"):
            setattr(data, field, getattr(status, field))
        return data

    # ---------------------------------------------------------------------- writing

    async def write(self, fh, off, buf):  # type: ignore[no-untyped-def]
        if fh in self._appending:
            _clear_set_id_bits(fh)
        return _call(os.pwrite, fh, buf, off)

    async def fsync(self, fh, datasync):  # type: ignore[no-untyped-def]
        _call(durable.sync_file, durable.default_ops(), fh, data_only=bool(datasync))

    async def fsyncdir(self, fh, datasync):  # type: ignore[no-untyped-def]
        # The directory the handle stands for, or ESTALE: one renamed away outside the mount
        # and replaced must not be answered by a sync of its successor.
        inode = self._open_directories[fh].inode
        parts = self._parts_of(inode)
        directory = self._holding(self._open(parts, _LIST), inode, parts)
        try:
            _call(durable.sync_dir, durable.default_ops(), directory)
        finally:
            os.close(directory)

    async def flush(self, fh):  # type: ignore[no-untyped-def]
        return None

    async def release(self, fh):  # type: ignore[no-untyped-def]
        self._open_files.pop(fh, None)
        self._appending.discard(fh)
        os.close(fh)

    async def create(self, parent_inode, name, mode, flags, ctx):  # type: ignore[no-untyped-def]
        exclusive = bool(flags & os.O_EXCL)  # the caller's; the daemon's own open is always
        parts = self._child_to_make(parent_inode, name, existing_ok=not exclusive)
        with self._parent(parts) as parent:
            # O_EXCL: a file put at the name since the kernel looked is never opened here, let
            # alone given to the caller by _give.  For a caller who did not ask for O_EXCL it
            # is ESTALE instead: the kernel then walks the path again, finds that file, and
            # opens it as any existing file is opened, permissions checked (open(2)).
            made_here = (flags & ~_NOT_OURS) | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            _acl_permits(parent, ctx, WRITE | EXECUTE)
            try:
                with _callers_umask(ctx):
                    fd = _call(
                        os.open,
                        parts[-1],
                        made_here,
                        mode & ~ctx.umask,
                        dir_fd=parent,
                    )
            except pyfuse3.FUSEError as refused:
                if refused.errno == errno.EEXIST and not exclusive:
                    raise pyfuse3.FUSEError(errno.ESTALE) from None
                raise
            try:
                self._give(fd, ctx, parent, set_id=mode & ~ctx.umask & _SET_ID)
                attributes = self._entry(parts, fd)
            except BaseException:
                _take_back(parent, parts[-1], os.fstat(fd))
                os.close(fd)
                raise
        return self._opened_file(attributes.st_ino, fd, parts), attributes

    async def mkdir(self, parent_inode, name, mode, ctx):  # type: ignore[no-untyped-def]
        parts = self._child_to_make(parent_inode, name)
        with self._parent(parts) as parent:
            _acl_permits(parent, ctx, WRITE | EXECUTE)
            with _callers_umask(ctx):
                _call(os.mkdir, parts[-1], mode & ~ctx.umask, dir_fd=parent)
            try:
                directory = _call(os.open, parts[-1], _LIST, dir_fd=parent)
            except BaseException:
                _take_back(parent, parts[-1], None)
                raise
            try:
                made = os.fstat(directory)
                if made.st_uid != os.geteuid():
                    # Another directory, someone else's, put at the name since the mkdir.
                    raise pyfuse3.FUSEError(errno.EEXIST)
                try:
                    self._give(directory, ctx, parent)
                    return self._entry(parts, directory)
                except BaseException:
                    _take_back(parent, parts[-1], made)
                    raise
            finally:
                os.close(directory)

    async def unlink(self, parent_inode, name, ctx):  # type: ignore[no-untyped-def]
        parts = self._child(parent_inode, name)
        _not_a_root_entry(parts)
        self._writable(parts)
        with self._parent(parts) as parent:
            _acl_permits(parent, ctx, WRITE | EXECUTE)
            doomed = durable.lstat_at(parent, parts[-1])
            _call(os.unlink, parts[-1], dir_fd=parent)
        # Other names of the file (hard links) stay.
        self._names.removed(parts, last_name=doomed is not None and doomed.st_nlink == 1)

    async def rmdir(self, parent_inode, name, ctx):  # type: ignore[no-untyped-def]
        parts = self._child(parent_inode, name)
        _not_a_root_entry(parts)
        self._writable(parts)
        with self._parent(parts) as parent:
            _acl_permits(parent, ctx, WRITE | EXECUTE)
            _call(os.rmdir, parts[-1], dir_fd=parent)
        self._names.removed(parts, last_name=True)

    async def rename(  # type: ignore[no-untyped-def]
        self, parent_old, name_old, parent_new, name_new, flags, ctx
    ):
        if flags & ~_RENAME_FLAGS:
            # RENAME_WHITEOUT: it leaves a device node at the old name, which the mount never
            # makes; done as a plain rename it would quietly do less than was asked.
            raise pyfuse3.FUSEError(errno.EINVAL)
        old = self._child(parent_old, name_old)
        _not_a_root_entry(old)
        self._writable(old)
        if flags & pyfuse3.RENAME_EXCHANGE:
            new = self._child(parent_new, name_new)  # both exist; both change
            _not_a_root_entry(new)
            self._writable(new)
        else:
            new = self._child_to_make(parent_new, name_new, existing_ok=True)
            _not_a_root_entry(new)
        with self._parent(old) as source, self._parent(new) as target:
            _acl_permits(source, ctx, WRITE | EXECUTE)
            replaced = durable.lstat_at(target, new[-1])
            moving = durable.lstat_at(source, old[-1])
            if parent_old != parent_new:
                _acl_permits(target, ctx, WRITE | EXECUTE)
                # A directory moved to another one has its ".." changed: the kernel asks
                # write on it too (an exchange moves both).
                exchanged = replaced if flags & pyfuse3.RENAME_EXCHANGE else None
                moved = ((source, old[-1], moving), (target, new[-1], exchanged))
                for directory, entry, status in moved:
                    if status is not None and stat.S_ISDIR(status.st_mode):
                        _acl_permits_at(directory, entry, ctx, WRITE)
            if flags & (pyfuse3.RENAME_EXCHANGE | pyfuse3.RENAME_NOREPLACE):
                _renameat2(source, old[-1], target, new[-1], flags)
            else:
                _call(os.rename, old[-1], new[-1], src_dir_fd=source, dst_dir_fd=target)
        if flags & pyfuse3.RENAME_EXCHANGE:
            self._names.exchanged(old, new)
        elif not _same_file(replaced, moving):  # two names of one file: rename does nothing
            self._names.moved(
                old,
                new,
                replaced_last_name=replaced is not None
                and (stat.S_ISDIR(replaced.st_mode) or replaced.st_nlink == 1),
            )

    async def link(self, inode, new_parent_inode, new_name, ctx):  # type: ignore[no-untyped-def]
        """A second name for a file (the queue's no-replace move, Q-1, N-1): both the file and
        the directory the name is made in must be writable in this view, as for a rename —
        a name in a writable place must not open a file of a read-only one to writes."""
        source = self._still(inode)
        self._visible(source)
        self._writable(source)
        new = self._child_to_make(new_parent_inode, new_name)
        with self._parent(source) as directory, self._parent(new) as target:
            _acl_permits(target, ctx, WRITE | EXECUTE)
            _call(
                os.link,
                source[-1],
                new[-1],
                src_dir_fd=directory,
                dst_dir_fd=target,
                follow_symlinks=False,
            )
        return self._entry(new)

    async def setattr(self, inode, attr, fields, fh, ctx):  # type: ignore[no-untyped-def]
        if fh is None and not self._serves(ctx):  # see _THROUGH_OPEN_FILES
            raise pyfuse3.FUSEError(errno.EACCES)
        try:
            parts = self._parts_of(inode)
        except pyfuse3.FUSEError:
            return await self._set_by_descriptor(inode, attr, fields, fh, ctx)
        if not _truncates_an_open_file(fields, fh):
            self._writable(parts)
        try:
            parts = self._still(inode)
        except pyfuse3.FUSEError as gone:
            if not self._gone_but_open(inode, gone):
                raise
            return await self._set_by_descriptor(inode, attr, fields, fh, ctx)
        if fields.update_size:
            if fh is not None:
                _call(os.truncate, fh, attr.st_size)
            else:
                file = await _once_no_lease_holds_it(
                    lambda: self._reopened(inode, parts, os.O_WRONLY, ctx)
                )
                try:
                    _call(os.truncate, file, attr.st_size)
                finally:
                    os.close(file)
        if fields.update_mode:
            # chmod has no "do not follow" on Linux: change the inode the descriptor holds.
            handle = self._holding(self._open(parts, os.O_PATH), inode, parts)
            try:
                _call(os.chmod, f"/proc/self/fd/{handle}", stat.S_IMODE(attr.st_mode))
            finally:
                os.close(handle)
        # The root of the view has no name in a parent: it is "." of its own descriptor.
        name = parts[-1] if parts else "."
        with self._parent(parts) as parent:
            if fields.update_uid or fields.update_gid:
                uid, gid = _owner_asked(attr, fields)
                _call(os.chown, name, uid, gid, dir_fd=parent, follow_symlinks=False)
            if fields.update_atime or fields.update_mtime:
                times = _times_asked(attr, fields, self._lstat(parts))
                _call(os.utime, name, ns=times, dir_fd=parent, follow_symlinks=False)
        return self._described(self._lstat(parts), inode)

    async def _set_by_descriptor(self, inode, attr, fields, fh, ctx):  # type: ignore[no-untyped-def]
        """``setattr`` on a file no name leads to any more, through a descriptor it is open
        by (``ftruncate``, ``fchmod``… after an unlink), as writable as its name was."""
        descriptor, parts = self._open_file(inode)
        if not _truncates_an_open_file(fields, fh):
            self._writable(parts)
        if fields.update_size:
            if fh is not None:
                _call(os.truncate, fh, attr.st_size)
            else:  # opened, not truncated by path, which would wait out a lease in place
                _acl_permits(descriptor, ctx, WRITE)
                file = await _once_no_lease_holds_it(
                    lambda: _open_at_once(f"/proc/self/fd/{descriptor}", os.O_WRONLY)
                )
                try:
                    _call(os.truncate, file, attr.st_size)
                finally:
                    os.close(file)
        if fields.update_mode:
            _call(os.chmod, descriptor, stat.S_IMODE(attr.st_mode))
        if fields.update_uid or fields.update_gid:
            _call(os.chown, descriptor, *_owner_asked(attr, fields))
        if fields.update_atime or fields.update_mtime:
            times = _times_asked(attr, fields, _call(os.fstat, descriptor))
            _call(os.utime, descriptor, ns=times)
        return self._described(_call(os.fstat, descriptor), inode)

    def _child_to_make(
        self, parent: int, name: bytes, *, existing_ok: bool = False
    ) -> tuple[str, ...]:
        text = os.fsdecode(name)
        parts = (*self._still(parent), text)
        if text in (".", "..") or "/" in text or not self.projection.visible(parts):
            raise pyfuse3.FUSEError(errno.EACCES)
        self._writable(parts)
        if not existing_ok:
            with self._parent(parts) as directory:
                if durable.lstat_at(directory, text) is not None:
                    raise pyfuse3.FUSEError(errno.EEXIST)
        return parts

    def _give(self, fd: int, ctx: pyfuse3.RequestContext, parent: int, *, set_id: int = 0) -> None:
        """What a caller creates is the caller's, as it would be on a local filesystem: its
        uid, and its gid unless the directory (``parent``) is setgid, whose group the entry
        keeps (a shared space, X-1, stays usable by its group through the mount too).

        ``set_id``: the set-user-ID and set-group-ID bits the caller's file was made with,
        which the kernel takes off a regular file at any change of its owner, root's too:
        given back as the caller's own creation would keep them (set-group-ID only where
        the caller is in the file's group, as the kernel judges at a creation)."""
        if os.geteuid() != 0:
            return
        setgid = _call(os.fstat, parent).st_mode & stat.S_ISGID
        _call(os.fchown, fd, ctx.uid, -1 if setgid else ctx.gid)
        if set_id:
            status = _call(os.fstat, fd)
            if status.st_gid != ctx.gid and not _in_group(ctx, status.st_gid):
                set_id &= ~stat.S_ISGID
            if set_id:
                _call(os.fchmod, fd, stat.S_IMODE(status.st_mode) | set_id)


def _clear_set_id_bits(fd: int) -> None:
    """Clear the set-user-ID bit of the file a write is about to go to, and its set-group-ID
    bit when group execution is on, as Linux does for a writer without CAP_FSETID (POSIX lets
    write(2) clear them for any writer).  The kernel does it itself for writes through its
    page cache; for direct ones (an appender's) it leaves it to the daemon, which cannot tell
    who writes.  Before the write, as the kernel does it: a file whose bits cannot be cleared
    (append-only, ``chattr +a``) refuses the write with EPERM, as the storage root refuses
    it, and is never written while still set-user-ID.  A daemon that is not root has its
    own write(2) do it, as for any writer without CAP_FSETID."""
    if os.geteuid() != 0:
        return
    mode = _call(os.fstat, fd).st_mode
    kill = mode & stat.S_ISUID | (mode & stat.S_ISGID if mode & stat.S_IXGRP else 0)
    if kill:
        _call(os.fchmod, fd, stat.S_IMODE(mode) & ~kill)


def _take_back(parent: int, name: str, made: os.stat_result | None) -> None:
    """Remove ``name``, made in ``parent`` for a caller it could not be handed to (the daemon
    out of descriptors, say): never left behind as root's.  Only while the name still holds
    what was made (``made``; None for a directory made but never opened: one of the daemon's
    own, which an rmdir removes only while empty)."""
    with contextlib.suppress(OSError):
        now = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if made is None:
            if stat.S_ISDIR(now.st_mode) and now.st_uid == os.geteuid():
                os.rmdir(name, dir_fd=parent)
        elif (now.st_dev, now.st_ino) == (made.st_dev, made.st_ino):
            if stat.S_ISDIR(now.st_mode):
                os.rmdir(name, dir_fd=parent)
            else:
                os.unlink(name, dir_fd=parent)


def _not_a_root_entry(parts: tuple[str, ...]) -> None:
    """R-2: the root shows exactly its six entries, in every view, so none of them is removed,
    renamed away or replaced through the mount (``EPERM``), as nothing else is made beside
    them (the projection shows no other name at the root)."""
    if len(parts) == 1:
        raise pyfuse3.FUSEError(errno.EPERM)


def _in_group(ctx: pyfuse3.RequestContext, gid: int) -> bool:
    """Whether the caller of ``ctx`` is root or has ``gid`` among its groups
    (:func:`~cortexfs.fuse.access.caller_groups`)."""
    if ctx.uid == 0:
        return True
    groups = _call(caller_groups, ctx)
    return groups is not None and gid in groups


def _acl_permits(descriptor: int, ctx: pyfuse3.RequestContext, wanted: int) -> None:
    """EACCES unless the storage root would let the caller of ``ctx`` have ``wanted`` of the
    file ``descriptor`` holds.  The kernel checked the mode bits only, and for a file with
    an ACL they may show more than the ACL gives the caller (:mod:`cortexfs.fuse.access`):
    the daemon, root, would otherwise open, make or remove for the caller what it may not."""
    if not _call(acl_allows, descriptor, ctx, wanted):
        raise pyfuse3.FUSEError(errno.EACCES)


def _acl_permits_at(directory: int, name: str, ctx: pyfuse3.RequestContext, wanted: int) -> None:
    """:func:`_acl_permits` for ``name`` in ``directory``, never followed if a link."""
    entry = _call(os.open, name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
    try:
        _acl_permits(entry, ctx, wanted)
    finally:
        os.close(entry)


def _asked_by_open(flags: int) -> int:
    """What an open with the kernel's ``flags`` asks of the file, as the kernel judges it:
    execution alone for the open execve(2) makes (a program may be executable and not
    readable), else read and write as the access mode says, and write for ``O_TRUNC``."""
    if flags & _EXECUTING:
        return EXECUTE
    access_mode = flags & os.O_ACCMODE
    asked = 0 if access_mode == os.O_WRONLY else READ
    if access_mode != os.O_RDONLY or flags & os.O_TRUNC:
        asked |= WRITE
    return asked


@contextlib.contextmanager
def _callers_umask(ctx: pyfuse3.RequestContext) -> Iterator[None]:
    """The daemon's own umask set aside while it makes a file or a directory for ``ctx``,
    whose mode is masked with the caller's umask only.  The kernel has masked it already
    (pyfuse3 does not ask it for ``FUSE_DONT_MASK``, which would leave that to the daemon),
    even in a directory with a default ACL, where the storage root would not (docs/mount.md,
    *Permissions and ACLs*)."""
    own = os.umask(0)
    try:
        yield
    finally:
        os.umask(own)


def _renameat2(source: int, old: str, target: int, new: str, flags: int) -> None:
    """``renameat2`` with the kernel's flags (``RENAME_NOREPLACE``, ``RENAME_EXCHANGE``, the
    same values as pyfuse3's), on the storage root: as atomic there as the caller through the
    mount was promised, never a test followed by a plain rename."""
    try:
        check(libc().renameat2(source, os.fsencode(old), target, os.fsencode(new), flags), old)
    except OSError as exc:
        raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None


def _truncates_an_open_file(fields: pyfuse3.SetattrFields, fh: int | None) -> bool:
    """Whether a setattr is ``ftruncate`` on a descriptor: the size alone, through an open
    file, which the kernel passes on only for one opened for writing.  Its open was judged
    (as a ``write`` on it is not judged again): a policy changed since refuses the next open,
    not this descriptor's truncate, as a local file's mode changed after its open would not."""
    others = (
        fields.update_mode,
        fields.update_uid,
        fields.update_gid,
        fields.update_atime,
        fields.update_mtime,
    )
    return fh is not None and fields.update_size and not any(others)


def _owner_asked(attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields) -> tuple[int, int]:
    """The uid and gid a ``setattr`` sets: -1, which ``chown`` leaves alone, for one it does
    not."""
    return (
        attr.st_uid if fields.update_uid else -1,
        attr.st_gid if fields.update_gid else -1,
    )


def _times_asked(
    attr: pyfuse3.EntryAttributes, fields: pyfuse3.SetattrFields, status: os.stat_result
) -> tuple[int, int]:
    """The atime and mtime (ns) a ``setattr`` sets: ``status``'s own for one it does not,
    since ``utime`` sets both."""
    return (
        attr.st_atime_ns if fields.update_atime else status.st_atime_ns,
        attr.st_mtime_ns if fields.update_mtime else status.st_mtime_ns,
    )


def _described(status: os.stat_result, node: int, generation: int) -> pyfuse3.EntryAttributes:
    """``status`` as the kernel is given it, for ``node``."""
    attributes = pyfuse3.EntryAttributes()
    attributes.st_ino = node
    attributes.generation = generation
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


def _same_file(first: os.stat_result | None, second: os.stat_result | None) -> bool:
    return (
        first is not None
        and second is not None
        and (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)
    )


_RENAME_FLAGS = pyfuse3.RENAME_EXCHANGE | pyfuse3.RENAME_NOREPLACE  # the ones passed through
_WRITING = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND
# __FMODE_EXEC: the kernel's mark on the open of a program execve(2) makes, which it passes on
# in the open's flags.
_EXECUTING = 0o40
_SET_ID = stat.S_ISUID | stat.S_ISGID
# Flags of the caller's open that the daemon's own open of the file must not take: with
# O_DIRECT, its reads and writes (pyfuse3's buffers, aligned to nothing) would be refused
# EINVAL; what the caller asked of its I/O is the kernel's side of the mount.
_NOT_OURS = os.O_DIRECT
_WALK = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_SHORT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)
_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class _LeaseBreaking(Exception):
    """Another process holds a lease on the file being opened, which the kernel is breaking."""


def _open_at_once(reopened: str, flags: int) -> int:
    """``reopened`` (a ``/proc/self/fd/N``) opened with the kernel's open ``flags``, without
    waiting: ``O_NONBLOCK``, cleared again unless the caller asked for it.  Whoever owns a
    file may take a lease on it (``fcntl(2)``, ``F_SETLEASE``), and an open that conflicts
    with it waits until its holder lets go, for up to ``/proc/sys/fs/lease-break-time`` (45 s
    by default), as often as the owner takes one again: the daemon, which answers every
    caller from one thread, would wait with it, and every caller behind it.  Such an open is
    :class:`_LeaseBreaking` (the caller waits, see :func:`_once_no_lease_holds_it`), or
    EWOULDBLOCK for a caller that asked for ``O_NONBLOCK``, as on a local filesystem.  Not
    ``O_NOFOLLOW`` either, which that link itself would fail (ELOOP), nor ``O_CREAT``: the
    file is there already."""
    asked = (flags & ~(os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _NOT_OURS)) | os.O_CLOEXEC
    try:
        fd = os.open(reopened, asked | os.O_NONBLOCK)
    except BlockingIOError:
        if flags & os.O_NONBLOCK:
            raise pyfuse3.FUSEError(errno.EWOULDBLOCK) from None
        raise _LeaseBreaking from None
    except OSError as exc:
        raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
    if not flags & os.O_NONBLOCK:
        os.set_blocking(fd, True)
    return fd


async def _once_no_lease_holds_it(open_it: Callable[[], int]) -> int:
    """``open_it()``, tried again every :data:`LEASE_RETRY_SECONDS` while a lease on the file
    is being broken: the caller waits for it as it would on the storage root, and meanwhile
    the daemon answers everyone else."""
    while True:
        try:
            return open_it()
        except _LeaseBreaking:
            await trio.sleep(LEASE_RETRY_SECONDS)


def _identified_in(directory: int, name: str) -> tuple[os.stat_result, Identity | None]:
    """The status and the identity of entry ``name`` of ``directory`` (never followed)."""
    handle = _call(os.open, name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
    try:
        return _call(os.fstat, handle), _call(identity_of, handle)
    finally:
        os.close(handle)


def _call(function, *args, **kwargs):  # type: ignore[no-untyped-def]
    """An OS call whose failure the kernel should see as the same errno."""
    try:
        return function(*args, **kwargs)
    except OSError as exc:
        raise pyfuse3.FUSEError(exc.errno or errno.EIO) from None
