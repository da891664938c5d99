"""What ``ctx bootstrap`` puts back in the entries it owns (SPEC R-5, P-5 step 2, D-1).

Bootstrap owns the root ABI directories, the core tools (their executables, control
directories, controls and hook directories), ``bin/tsh``, ``bin/ctxterm``,
``tool/tsh.d/config`` and the manual bundle.  Besides rewriting what differs from this
version, it repairs two kinds of damage to them, here:

* **A stand-in** — a symbolic link, FIFO, socket or device where bootstrap writes a file
  whole (a page, a core tool's executable or a control its manifest defines, ``bin/tsh``…).
  It holds nobody's data, and every reader refuses it, so it is replaced by the file: the
  entry is replaced or unlinked, never followed, and what a link named is neither read nor
  changed.  A directory or a regular file of someone else's in such a place is not a
  stand-in: it is reported, never removed.
* **A loosened entry** — a directory or regular file that its group or others may write, or
  that belongs to a uid other than the storage root's owner (or root).  The authority chain
  refuses every tool below such an entry (``not host-owned``), so it is given back to the
  storage root's owner and its group and others lose their write bits (the bundle's
  directories get exactly their mode).  It is reached through a descriptor opened with
  ``O_PATH | O_NOFOLLOW``: a name swapped for a link cannot redirect the change.  A file
  with other names (hard links), which may lie outside the root, is left as it is and
  reported.  Only root may give an entry to another uid: anyone else is told to run
  bootstrap as root.

Contents are never touched here: a core tool's policy, status, log and hooks keep every byte.
"""

from __future__ import annotations

import errno
import os
import stat

from cortexfs import durable
from cortexfs.errors import CtxError

LOOSE_BITS = stat.S_IWGRP | stat.S_IWOTH  # what nobody but the owner may have on these entries
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def stand_in(status: os.stat_result | None) -> str:
    """What holds a name bootstrap writes whole, when it is a stand-in to replace: ``symbolic
    link``, ``FIFO``, ``socket`` or ``device``; ``""`` when the name is free, a regular file
    or a directory."""
    if status is None:
        return ""
    mode = status.st_mode
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return ""
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device"


def remove_stand_in(ops: durable.FsOps, dir_fd: int, name: str) -> str:
    """Unlink the stand-in at ``name`` (never following it) and sync ``dir_fd``, so that what
    bootstrap writes next takes the free name; what it was (see :func:`stand_in`), or ``""``
    and nothing changed when there is none."""
    kind = stand_in(durable.lstat_at(dir_fd, name))
    if kind:
        durable.remove_entries(ops, [(dir_fd, name, False)])
        durable.sync_dir(ops, dir_fd)
    return kind


def storage_owner(root: os.PathLike[str] | str) -> int:
    """The uid the authority chain calls the host administrator: the storage root's owner."""
    return os.stat(os.path.realpath(root)).st_uid


def tighten(
    dir_fd: int | None,
    name: str,
    owner: int,
    shown: str,
    *,
    mode: int | None = None,
    ops: durable.FsOps | None = None,
) -> str:
    """Give the directory or regular file ``name`` of ``dir_fd`` (None: ``name`` is a path)
    back to uid ``owner`` unless root or ``owner`` has it, and take its group's and others'
    write bits (or give it exactly ``mode``).  Returns what changed (``"mode 0777, now
    0755"``), ``""`` when nothing did: a missing name, a link or another kind of entry (its
    own step reports those) or an entry as it should be.  EPERM naming ``shown`` when only
    root could make the change, EMLINK for a file with other names."""
    ops = ops or durable.default_ops()
    try:
        fd = os.open(name, _PATH_FLAGS, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return ""
    try:
        status = os.fstat(fd)
        if not (stat.S_ISDIR(status.st_mode) or stat.S_ISREG(status.st_mode)):
            return ""
        current = stat.S_IMODE(status.st_mode)
        wanted = current & ~LOOSE_BITS if mode is None else mode
        give_back = status.st_uid not in (0, owner)
        if not give_back and wanted == current:
            return ""
        if stat.S_ISREG(status.st_mode) and status.st_nlink > 1:
            raise CtxError(
                errno.EMLINK,
                f"{shown} (owner uid {status.st_uid}, mode {current:04o}) has other names "
                "(hard links), which may lie outside the storage root; give it one name and "
                "run 'ctx bootstrap' again",
            )
        # Only root gives a file away; only root or its owner changes its mode.
        if os.geteuid() != 0 and (give_back or status.st_uid != os.geteuid()):
            raise CtxError(
                errno.EPERM,
                f"{shown} belongs to uid {status.st_uid} (mode {current:04o}): only root "
                f"can give it back to the storage root's owner, uid {owner}, and take its "
                "group's and others' write bits; run 'ctx bootstrap' as root",
            )
        changed = []
        if give_back:
            ops.chown_opened(fd, owner)
            changed.append(f"owner uid {status.st_uid}, now uid {owner}")
            # Giving a file away clears its set-id bits: judge the mode the kernel left.
            current = stat.S_IMODE(os.fstat(fd).st_mode)
            wanted = current & ~LOOSE_BITS if mode is None else mode
        if wanted != current:
            ops.chmod_opened(fd, wanted)
            changed.append(f"mode {current:04o}, now {wanted:04o}")
        return "; ".join(changed)
    finally:
        os.close(fd)


def tighten_beneath(
    top_fd: int,
    relative: str,
    owner: int,
    shown: str,
    *,
    mode: int | None = None,
    ops: durable.FsOps | None = None,
) -> str:
    """:func:`tighten` of ``relative`` (``fs.read.d/hooks/pre.d``) below the directory open as
    ``top_fd``, each directory on the way opened without following a link; ``""`` when one of
    them is missing or not a real directory (the step that owns it reports that)."""
    ops = ops or durable.default_ops()
    *parents, name = relative.split("/")
    fd = os.dup(top_fd)
    try:
        for part in parents:
            try:
                inner = ops.open_dir(part, fd)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    return ""
                raise
            ops.close(fd)
            fd = inner
        return tighten(fd, name, owner, shown, mode=mode, ops=ops)
    finally:
        ops.close(fd)
