"""The fsync discipline: every filesystem mutation CortexFS makes durable goes through here.

Two layers:

* :class:`FsOps` — one method per system call that changes the filesystem (``mkdir``,
  ``link``, ``rename``, ``fsync``…).  Every caller receives an instance instead of calling
  :mod:`os` directly, so the crash harness (``tests/crash``) can substitute a recorder that sees
  exactly what the protocol does, and a reader can audit every mutation in one place.
* A few named primitives built on it — :func:`write_file_synced`, :func:`move_noreplace`,
  :func:`replace_synced`, :func:`exchange_synced`, :func:`sync_dir`, :func:`sync_filesystem` —
  whose docstrings say what they guarantee and where that guarantee ends.

What "durable" means here.  POSIX promises nothing about power failure; what we rely on is
what Linux filesystems document and what ALICE (Pillai et al., OSDI 2014) measured:

* ``fsync(file)`` makes the file's data and size durable, not its name;
* ``fsync(dir)`` makes the entries created, removed or renamed in that directory durable, not
  the directory's own entry in its parent;
* ``rename`` is atomic on ext4, xfs, btrfs and tmpfs; on other filesystems a crash in the
  middle of a rename may leave neither name.  :func:`move_noreplace` therefore has two
  strategies, chosen per filesystem (:func:`default_move_strategy`).

Everything works on directory file descriptors opened with ``O_NOFOLLOW`` (SPEC Q-8): a
symlink swapped into a tree can never redirect an operation outside it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
import time
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from cortexfs.errors import CtxError
from cortexfs.libc import check, libc

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_RENAME_NOREPLACE = 1
_RENAME_EXCHANGE = 2

MOVE_RENAME = "rename"
MOVE_LINK = "link"


class FsOps:
    """Every mutating filesystem call of the protocol, one method per system call.

    ``move_strategy`` selects how :func:`move_noreplace` moves a name: ``"rename"`` uses
    ``renameat2(RENAME_NOREPLACE)`` (atomic on the filesystems listed in
    :data:`ATOMIC_RENAME_FILESYSTEMS`); ``"link"`` uses ``link`` + fsync + ``unlink``, which is
    safe wherever ``link`` is atomic (NFS included) at the price of one more barrier.
    ``None`` means: decide per directory with :func:`default_move_strategy`.
    """

    def __init__(self, move_strategy: str | None = None) -> None:
        if move_strategy not in (None, MOVE_RENAME, MOVE_LINK):
            raise ValueError(f"unknown move strategy {move_strategy!r}")
        self.move_strategy = move_strategy

    # Crash points: named protocol steps.  Real runs ignore them; the crash harness and the
    # kill tests substitute an FsOps whose step() records the name or kills the process.
    def step(self, name: str) -> None:
        """Mark that the protocol has reached the named step."""

    def open_dir(self, name: str, dir_fd: int | None = None) -> int:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def mkdir(self, name: str, dir_fd: int, mode: int = 0o777) -> None:
        os.mkdir(name, mode, dir_fd=dir_fd)

    def rmdir(self, name: str, dir_fd: int) -> None:
        os.rmdir(name, dir_fd=dir_fd)

    def unlink(self, name: str, dir_fd: int) -> None:
        os.unlink(name, dir_fd=dir_fd)

    def create_file(self, name: str, dir_fd: int, mode: int = 0o666) -> int:
        """Create a new regular file (never an existing one, never through a symlink)."""
        return os.open(name, _NEW_FILE_FLAGS, mode, dir_fd=dir_fd)

    def open_append(
        self, name: str, dir_fd: int, mode: int = 0o666, *, create: bool | None = None
    ) -> int:
        """Open a regular file for appends, never through a symlink: ``create`` None makes it
        if needed, True only makes it (FileExistsError when it is there), False only opens
        what is there (FileNotFoundError when it is not).

        Readable too, so that an appender can look at the file's last byte (a torn line)."""
        flags = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        if create is not False:
            flags |= os.O_CREAT | (os.O_EXCL if create else 0)
        return os.open(name, flags, mode, dir_fd=dir_fd)

    def write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def fchmod(self, fd: int, mode: int) -> None:
        os.fchmod(fd, mode)

    # fchmod and fchown refuse an O_PATH descriptor (EBADF); its /proc/self/fd entry names the
    # very inode it was opened on, as glibc's fchmodat(AT_SYMLINK_NOFOLLOW) uses it.  Not
    # durable by themselves: the change reaches the disk with the inode's next write-back.
    def chmod_opened(self, fd: int, mode: int) -> None:
        """chmod of the entry open as ``fd``, an ``O_PATH`` descriptor."""
        os.chmod(f"/proc/self/fd/{fd}", mode)

    def chown_opened(self, fd: int, uid: int, gid: int = -1) -> None:
        """Give the entry open as ``fd`` (an ``O_PATH`` descriptor) to ``uid`` and ``gid``
        (-1: the group kept)."""
        os.chown(f"/proc/self/fd/{fd}", uid, gid)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def syncfs(self, fd: int) -> None:
        check(libc().syncfs(fd), "syncfs")

    def link(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
        os.link(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, follow_symlinks=False)

    def rename(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
        """Rename, replacing ``dst`` if it exists (atomic replace)."""
        os.rename(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    def rename_noreplace(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
        """``renameat2(RENAME_NOREPLACE)``: EEXIST when ``dst`` exists; EINVAL where unsupported."""
        result = libc().renameat2(
            src_dir_fd, os.fsencode(src), dst_dir_fd, os.fsencode(dst), _RENAME_NOREPLACE
        )
        check(result, f"renameat2 {src} -> {dst}")

    def rename_exchange(self, src: str, src_dir_fd: int, dst: str, dst_dir_fd: int) -> None:
        """``renameat2(RENAME_EXCHANGE)``: swap two existing names; EINVAL where unsupported."""
        result = libc().renameat2(
            src_dir_fd, os.fsencode(src), dst_dir_fd, os.fsencode(dst), _RENAME_EXCHANGE
        )
        check(result, f"renameat2 exchange {src} <-> {dst}")


_DEFAULT_OPS = FsOps()


def default_ops() -> FsOps:
    """The process-wide real operations object (tests may substitute their own per call)."""
    return _DEFAULT_OPS


# statfs(2) magic numbers of filesystems whose rename is atomic across a crash.
ATOMIC_RENAME_FILESYSTEMS = {
    0xEF53: "ext2/3/4",
    0x58465342: "xfs",
    0x9123683E: "btrfs",
    0x01021994: "tmpfs",
    0xF2F52010: "f2fs",
}


@functools.cache
def _statfs_buffer() -> Any:
    """A ctypes struct statfs, as far as ``f_type`` (the rest is room for what follows)."""
    import ctypes

    class StatFs(ctypes.Structure):
        _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 112)]

    return StatFs


def filesystem_type(dir_fd: int) -> int:
    """The statfs(2) ``f_type`` of the filesystem holding ``dir_fd``."""
    import ctypes

    buf = _statfs_buffer()()
    check(libc().fstatfs(dir_fd, ctypes.byref(buf)), "fstatfs")
    return buf.f_type & 0xFFFFFFFF


def default_move_strategy(dir_fd: int) -> str:
    """``rename`` where the filesystem renames atomically, ``link`` everywhere else."""
    try:
        fs_type = filesystem_type(dir_fd)
    except OSError:
        return MOVE_LINK
    return MOVE_RENAME if fs_type in ATOMIC_RENAME_FILESYSTEMS else MOVE_LINK


# ----------------------------------------------------------------------------- primitives


def sync_dir(ops: FsOps, dir_fd: int) -> None:
    """Make the entries created, removed or renamed in this directory durable.

    Not the directory's own entry in its parent: sync the parent for that.  EINVAL is
    tolerated because some network filesystems refuse fsync on directories (and make entry
    operations durable on their own); every other error propagates.
    """
    try:
        ops.fsync(dir_fd)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise


def sync_dirs(ops: FsOps, dir_fds: Iterable[int]) -> None:
    """:func:`sync_dir` each directory once, in the given order."""
    seen: set[int] = set()
    for fd in dir_fds:
        if fd not in seen:
            seen.add(fd)
            sync_dir(ops, fd)


def sync_file(ops: FsOps, fd: int, *, data_only: bool = False) -> None:
    """Make what was written through ``fd`` durable: its data and size, and with them its
    other metadata unless ``data_only`` (``fdatasync``, which may leave a timestamp behind).

    Like every fsync, not the file's name: sync its directory for that.
    """
    if data_only:
        ops.fdatasync(fd)
    else:
        ops.fsync(fd)


def sync_filesystem(ops: FsOps, fd: int, written: Sequence[str] = ()) -> None:
    """One barrier for everything written to the filesystem holding ``fd`` (``syncfs(2)``).

    Used for group commits: N files written, one flush.  Linux waits for the writeback and,
    since 5.8, reports its errors.  It also flushes unrelated dirty data on that filesystem,
    so it is only worth it for batches, and only where it is a barrier at all
    (:func:`syncfs_is_a_barrier`).  Where the call itself is refused (ENOSYS or EPERM: a
    seccomp filter, as some container runtimes install), each of ``written``, regular files
    named in the directory ``fd``, is synced instead: the same guarantee, a barrier each.
    """
    try:
        ops.syncfs(fd)
    except OSError as exc:
        if exc.errno not in (errno.ENOSYS, errno.EPERM) or not written:
            raise
        for name in written:
            file_fd = os.open(name, _SYNC_FLAGS, dir_fd=fd)
            try:
                ops.fsync(file_fd)
            finally:
                os.close(file_fd)


_SYNC_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def syncfs_is_a_barrier(dir_fd: int) -> bool:
    """Whether ``syncfs(2)`` on the filesystem holding ``dir_fd`` makes the data written there
    durable: on the local filesystems of :data:`ATOMIC_RENAME_FILESYSTEMS`, whose drivers
    write back their own dirty pages.  Elsewhere each file is synced itself: the kernel
    forwards ``syncfs`` to no FUSE daemon (only to virtiofs), so on a FUSE mount of a
    storage root (``ctx mount``) it returns 0 having reached nothing, and what a network
    filesystem's ``syncfs`` does is the client's business."""
    try:
        return filesystem_type(dir_fd) in ATOMIC_RENAME_FILESYSTEMS
    except OSError:
        return False


def grant_group_access(ops: FsOps, fd: int, group_bits: int) -> None:
    """Give the file or directory open as ``fd`` at least ``group_bits`` (``0o070`` at most)
    for its group, whatever the umask took away at creation.

    For trees shared by a group (a setgid, group-writable directory): an entry one member
    creates must stay usable by the others, and the creating process's umask (022, typically)
    would otherwise leave it writable by its owner alone.  Works on the descriptor, so a
    symlink swapped in for the name cannot redirect it.  No fchmod when nothing is missing.
    Not durable by itself: the mode reaches the disk with the next fsync of the entry (or of
    the filesystem's journal), like any inode change.
    """
    if not group_bits:
        return
    st = os.fstat(fd)
    current = stat.S_IMODE(st.st_mode)
    if current & group_bits == group_bits or st.st_uid != os.geteuid():
        return  # only the owner may change the mode: an entry of another member is theirs
    ops.fchmod(fd, current | group_bits)


def write_file_synced(
    ops: FsOps,
    dir_fd: int,
    name: str,
    data: bytes,
    mode: int = 0o644,
    *,
    group: int = 0,
    exact_mode: bool = False,
    owner: int | None = None,
    owner_group: int = -1,
    keep_open: bool = False,
) -> int | None:
    """Create ``name`` (which must not exist) holding ``data``, and fsync it.

    On return the file's data and size are durable; its *name* is not, until ``dir_fd`` is
    synced.  ``group``: access bits the file's group gets whatever the umask
    (:func:`grant_group_access`).  ``exact_mode``: the file gets ``mode`` itself, not ``mode``
    less the umask (a replacement that keeps the bits of the file it replaces).  ``owner``
    and ``owner_group``: the uid and gid (-1: as created) the file is given (root only),
    durable with it.  On failure the partial file is removed.  ``keep_open``: the descriptor
    it was written through is returned, for the caller to close (a file whose mode lets its
    writer neither read nor write it cannot be opened again).
    """
    fd = ops.create_file(name, dir_fd, mode)
    try:
        if exact_mode and stat.S_IMODE(os.fstat(fd).st_mode) != mode:
            ops.fchmod(fd, mode)
        grant_group_access(ops, fd, group)
        if owner is not None:
            ops.chown_opened(fd, owner, owner_group)
        ops.write(fd, data)
        ops.fsync(fd)
    except BaseException:
        ops.close(fd)
        _unlink_quietly(ops, dir_fd, name)
        raise
    if keep_open:
        return fd
    ops.close(fd)
    return None


def write_file_unsynced(
    ops: FsOps, dir_fd: int, name: str, data: bytes, mode: int = 0o644, *, group: int = 0
) -> None:
    """Create ``name`` holding ``data`` without fsync; a later barrier must cover it."""
    fd = ops.create_file(name, dir_fd, mode)
    try:
        grant_group_access(ops, fd, group)
        ops.write(fd, data)
    except BaseException:
        ops.close(fd)
        _unlink_quietly(ops, dir_fd, name)
        raise
    ops.close(fd)


class Move(NamedTuple):
    """One name to move: ``src_dir/src`` → ``dst_dir/dst``."""

    src_dir: int
    src: str
    dst_dir: int
    dst: str


def move_strategy_for(ops: FsOps, dir_fd: int) -> str:
    return ops.move_strategy or default_move_strategy(dir_fd)


def move_noreplace(ops: FsOps, src_dir: int, src: str, dst_dir: int, dst: str) -> None:
    """Move ``src`` to ``dst`` without ever replacing ``dst`` (EEXIST if it exists), durably.

    On return both names' directories are synced: ``dst`` exists, ``src`` does not, and no
    crash can undo that.  A directory made to hold ``dst`` must already be durable
    (:func:`make_dir_synced`): a rename may reach the disk before the ``mkdir`` of its
    destination, which would leave the file in a directory no name leads to.

    What a crash *during* the call can leave depends on the strategy:

    * ``rename`` (atomic-rename filesystems): exactly one of the two names;
    * ``link``: ``dst`` is synced before ``src`` is unlinked, so at least one name survives,
      possibly both (two links to one inode), never neither.  A directory has no second name
      to give: it is renamed, once nothing is found at ``dst`` (a directory made there in the
      instant between would be replaced if empty; moves of directories are an install's, of
      names only it makes, under its lock).
    """
    (refused,) = move_noreplace_batch(ops, [Move(src_dir, src, dst_dir, dst)])
    if refused is not None:
        raise refused


def move_noreplace_batch(ops: FsOps, moves: Sequence[Move]) -> list[OSError | None]:
    """:func:`move_noreplace` for many names with one barrier per directory (group commit).

    Returns one entry per move: None when it moved, the OSError that refused it otherwise
    (EEXIST when the destination exists, ENOENT when the source vanished, EACCES…).  A barrier
    that fails is raised: what moved is then not known to be durable.
    """
    if not moves:
        return []
    strategy = move_strategy_for(ops, moves[0].dst_dir)
    outcomes: list[OSError | None] = []
    renamed: set[int] = set()  # the moves of the link strategy that were a directory's rename
    for number, move in enumerate(moves):
        try:
            if strategy == MOVE_RENAME:
                try:
                    ops.rename_noreplace(move.src, move.src_dir, move.dst, move.dst_dir)
                except OSError as exc:
                    # renameat2 unsupported here (an old kernel, a filesystem without it, a
                    # seccomp filter): degrade to the link strategy for the batch.
                    if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                        raise
                    strategy = MOVE_LINK
            if strategy == MOVE_LINK and _link_or_rename_directory(ops, move):
                renamed.add(number)
            outcomes.append(None)
        except OSError as exc:
            outcomes.append(exc)
    done = [m for m, outcome in zip(moves, outcomes, strict=True) if outcome is None]
    sync_dirs(ops, [m.dst_dir for m in done])
    if strategy == MOVE_LINK:
        # The new names are durable; only now may the old ones go.
        for number, move in enumerate(moves):
            if outcomes[number] is None and number not in renamed:
                ops.unlink(move.src, move.src_dir)
    sync_dirs(ops, [m.src_dir for m in done])
    return outcomes


def _link_or_rename_directory(ops: FsOps, move: Move) -> bool:
    """Link ``move``'s source at its destination (False); a directory, to which link(2) gives
    no second name (EPERM), is renamed there instead once nothing is at the destination
    (True: nothing left to unlink)."""
    try:
        ops.link(move.src, move.src_dir, move.dst, move.dst_dir)
        return False
    except PermissionError:
        source = lstat_at(move.src_dir, move.src)
        if source is None or not stat.S_ISDIR(source.st_mode):
            raise
    if lstat_at(move.dst_dir, move.dst) is not None:
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), move.dst)
    ops.rename(move.src, move.src_dir, move.dst, move.dst_dir)
    return True


def replace_synced(ops: FsOps, src_dir: int, src: str, dst_dir: int, dst: str) -> None:
    """Atomically replace ``dst`` by ``src`` (a file already fsynced) and sync both parents.

    Readers see the old or the new file, never a mixture; only for files the caller owns
    (a worker's own lease), never for evidence another process could have written.
    """
    ops.rename(src, src_dir, dst, dst_dir)
    sync_dirs(ops, [dst_dir, src_dir])


def move_synced_through_filesystem(
    ops: FsOps, dir_fd: int, src: str, dst: str, through: int, *, replace: bool
) -> None:
    """Move ``src`` to ``dst`` in ``dir_fd``, a directory this process may write and search
    but not open to read, so not sync (an ``O_PATH`` descriptor), and make the move durable
    by a sync of the whole filesystem through ``through``, a readable descriptor on it (the
    moved file's own).  Only where that is a barrier (:func:`syncfs_is_a_barrier`): there it
    covers the directory's new entry as syncing the directory would.  Without ``replace``,
    ``dst`` is never replaced (EEXIST), as :func:`move_noreplace` moves: by
    ``renameat2(RENAME_NOREPLACE)``, or a link made durable before the old name goes."""
    if replace:
        ops.rename(src, dir_fd, dst, dir_fd)
    elif not (
        move_strategy_for(ops, dir_fd) == MOVE_RENAME and _renamed_noreplace(ops, dir_fd, src, dst)
    ):
        ops.link(src, dir_fd, dst, dir_fd)
        ops.syncfs(through)
        ops.unlink(src, dir_fd)
    ops.syncfs(through)


def _renamed_noreplace(ops: FsOps, dir_fd: int, src: str, dst: str) -> bool:
    """``renameat2(RENAME_NOREPLACE)`` of ``src`` to ``dst``; False where it is not supported
    (an old kernel, a filesystem without it, a seccomp filter)."""
    try:
        ops.rename_noreplace(src, dir_fd, dst, dir_fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS):
            raise
        return False
    return True


def exchange_synced(ops: FsOps, dir_fd: int, first: str, second: str) -> None:
    """Swap the two existing names ``first`` and ``second`` of ``dir_fd`` in one step, and
    sync the directory.

    For replacing a whole directory, which ``rename`` cannot do over a non-empty one: readers
    of either name see the old or the new entry, never none.  A crash leaves the swap done
    or not done; only the caller can tell which (by an inode it recorded, say).  EINVAL
    (or ENOSYS) where the filesystem cannot exchange (NFS, among others): nothing changed,
    and the caller must fall back on moves.
    """
    ops.rename_exchange(first, dir_fd, second, dir_fd)
    sync_dir(ops, dir_fd)


def replace_file_synced(
    ops: FsOps, dir_fd: int, name: str, data: bytes, mode: int, *, owner: int | None = None
) -> None:
    """Replace ``name`` in ``dir_fd`` by a file holding ``data``, whole and durably.

    The data is written beside it under a fresh temporary name, given exactly ``mode``
    (whatever the umask) and ``owner`` (root only: the uid of the file it replaces, say)
    through its descriptor, fsynced, renamed over ``name``, and the
    directory synced: readers see the old file or the new one.  On failure the temporary file
    is removed.  For files the caller owns (controls, pages, programs), like
    :func:`replace_synced`, in a directory no other uid may write: the temporary name is
    never used to reach the file again (a name swapped for a link by whoever could write the
    directory cannot redirect the mode), but only the directory's owner decides what its
    names hold.
    """
    temporary = temporary_name(name)
    write_file_synced(ops, dir_fd, temporary, data, mode, exact_mode=True, owner=owner)
    try:
        replace_synced(ops, dir_fd, temporary, dir_fd, name)
    except BaseException:
        _unlink_quietly(ops, dir_fd, temporary)
        raise


def temporary_name(name: str) -> str:
    """A fresh name beside ``name`` for the file that will replace it: ``.NAME.TOKEN.tmp``."""
    return f".{name}.{os.urandom(6).hex()}.tmp"


def leftover_temporaries(dir_fd: int, names: Iterable[str]) -> list[tuple[str, float]]:
    """The regular files of ``dir_fd`` named as :func:`temporary_name` names them for one of
    ``names``: what a write killed before its rename left (or one in flight now), each with
    its age in seconds, from the earlier of its mtime and ctime (a clock set back, or an mtime
    in the future, makes no file younger than it is)."""
    wanted = set(names)
    found = []
    now = time.time()
    for entry in os.listdir(dir_fd):
        stem, dot, token = entry[1:-4].rpartition(".") if entry.endswith(".tmp") else ("", "", "")
        if not (entry.startswith(".") and dot and stem in wanted and _is_token(token)):
            continue
        status = lstat_at(dir_fd, entry)
        if status is not None and stat.S_ISREG(status.st_mode):
            found.append((entry, now - min(status.st_mtime, status.st_ctime)))
    return found


def _is_token(text: str) -> bool:
    return len(text) == 12 and all(char in "0123456789abcdef" for char in text)


def make_dir_synced(
    ops: FsOps, parent_fd: int, name: str, mode: int = 0o777, *, exact_mode: bool = False
) -> bool:
    """``mkdir`` + sync the parent; False (and nothing changed) when it already exists.

    ``exact_mode``: the new directory gets ``mode`` itself, not ``mode`` less the umask, set
    through a descriptor opened without following a link (never by name)."""
    try:
        ops.mkdir(name, parent_fd, mode)
    except FileExistsError:
        return False
    if exact_mode:
        fd = ops.open_dir(name, parent_fd)
        try:
            if stat.S_IMODE(os.fstat(fd).st_mode) != mode:
                ops.fchmod(fd, mode)
        finally:
            ops.close(fd)
    sync_dir(ops, parent_fd)
    return True


def remove_entries(ops: FsOps, removals: Sequence[tuple[int, str, bool]]) -> list[str]:
    """Remove ``(dir_fd, name, is_dir)`` entries in order; names already gone are skipped.
    Returns the names this call removed (another process may have removed the rest).

    Removal is the last step of a transition and may be repeated after a crash, hence the
    tolerance.  Not durable by itself: the caller syncs the parents that still exist (a
    removed directory's own contents need no sync, its entry in the parent is what counts).
    """
    removed = []
    for dir_fd, name, is_dir in removals:
        try:
            if is_dir:
                ops.rmdir(name, dir_fd)
            else:
                ops.unlink(name, dir_fd)
        except FileNotFoundError:
            continue
        removed.append(name)
    return removed


def _unlink_quietly(ops: FsOps, dir_fd: int, name: str) -> None:
    with contextlib.suppress(OSError):
        ops.unlink(name, dir_fd)


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    """``name``'s status in ``dir_fd``, never following a symlink; None when it is absent.

    A read, not a mutation: it is here because every ``*at`` caller of this module needs it.
    """
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def open_dir_path(ops: FsOps, path: str) -> int:
    """Open a directory by path; the last component must not be a symlink (ELOOP)."""
    try:
        return ops.open_dir(path)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
            raise CtxError(errno.ELOOP, f"{path} is a symlink; refusing to follow it") from exc
        if exc.errno == errno.ENOTDIR:
            raise CtxError(errno.ENOTDIR, f"{path} is not a directory") from exc
        raise
