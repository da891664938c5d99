"""What ``ctx bootstrap`` puts back in the entries it owns, and what it must leave to a person
(SPEC R-5, P-5 step 2, P-6, D-1).

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
* **An entry another uid could change** — one that belongs to a uid other than the storage
  root's owner (or root), or that its group or others may write (:func:`untrusted`).  The
  authority chain refuses every tool below such an entry (``not host-owned``).  Giving it
  back (``chown``, ``chmod go-w``) keeps what it holds, so bootstrap does so only where it
  vouches for that itself.  The rule:

  - *A file* is never given back or chmodded.  One that bootstrap writes whole (an
    executable or control it compares with the manifest, ``bin/tsh``, ``bin/ctxterm``, a
    page) is rewritten from its source as a new file: whoever could write the old one,
    even through a descriptor it still holds, cannot reach the new one.  One whose content
    is the administrator's (a core tool's ``policy``, ``status``, ``log``, a hook,
    ``tool/tsh.d/config``) is left as it is and reported (:func:`kept_problem`): only a
    person can tell whether what it says is still theirs.
  - *A directory that holds the administrator's content bootstrap relies on* (``tool/``, a
    core tool's control directory, its hook directories, ``tool/tsh.d``) is left as it is
    and reported the same way: whoever could write it could have renamed, replaced or
    removed what is in it (a policy, a guard hook), with files that still belong to root.
    Bootstrap then writes nothing into it.
  - *Any other directory it owns* (the storage root, ``agent/``, ``model/``, ``home/``,
    ``shared/``, ``bin/``, the bundle's two directories) is given back (:func:`tighten`)
    before bootstrap writes anything into it: nothing in it is taken on trust, since what
    bootstrap keeps there it rewrites or compares byte for byte (``bin/tsh``, the pages),
    and the authority chain still judges every entry below it, owner and mode, on every
    call.

* **A temporary file** (``.NAME.TOKEN.tmp``) that a write killed before its rename left
  beside an entry bootstrap writes whole (:func:`sweep_temporaries`).  It is removed once it
  is :data:`TEMPORARY_GRACE` old; a younger one may be the write of a bootstrap or a
  ``tsh.config`` running now, whose rename would fail without it, and is named in a warning.

  An entry is reached through a descriptor opened with ``O_PATH | O_NOFOLLOW``: a name
  swapped for a link cannot redirect the change.  Only root may give an entry to another
  uid: anyone else is told to run bootstrap as root.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from typing import TYPE_CHECKING

from cortexfs import durable
from cortexfs.errors import CtxError

if TYPE_CHECKING:  # storage imports this module
    from cortexfs.storage import BootstrapReport

LOOSE_BITS = stat.S_IWGRP | stat.S_IWOTH  # what nobody but the owner may have on these entries
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


# Long past the moments a write spends between its temporary file and the rename.
TEMPORARY_GRACE = 60.0


def sweep_temporaries(
    ops: durable.FsOps, dir_fd: int, names: Iterable[str], where: str, report: BootstrapReport
) -> None:
    """Remove the temporary files left in ``dir_fd`` (shown as ``where``) by writes of
    ``names`` killed before their rename, once :data:`TEMPORARY_GRACE` old, and report them;
    a younger one is left alone and named in a warning."""
    removed = []
    for temporary, age in sorted(durable.leftover_temporaries(dir_fd, names)):
        if age < TEMPORARY_GRACE:
            report.warnings.append(
                f"{where}/{temporary}: written {age:.0f} s ago, perhaps by a write still in "
                f"progress; left for now: a bootstrap removes it once it is "
                f"{TEMPORARY_GRACE:.0f} s old"
            )
        elif durable.remove_entries(ops, [(dir_fd, temporary, False)]):
            removed.append(f"{where}/{temporary} (removed: left by an interrupted write)")
    if removed:
        durable.sync_dir(ops, dir_fd)
        report.repaired += removed


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


def untrusted(status: os.stat_result | None, owner: int) -> str:
    """Why another uid than root and ``owner`` could have changed the entry of ``status``
    (``"owner uid 995"``, ``"mode 0664"``, both joined by ``, ``), or ``""`` when none could
    (or there is no entry)."""
    if status is None:
        return ""
    why = []
    if status.st_uid not in (0, owner):
        why.append(f"owner uid {status.st_uid}")
    if status.st_mode & LOOSE_BITS:
        why.append(f"mode {stat.S_IMODE(status.st_mode):04o}")
    return ", ".join(why)


def kept_problem(shown: str, status: os.stat_result, owner: int, path: str) -> str:
    """The problem bootstrap reports for the administrator's file or directory ``shown`` (at
    ``path``) that another uid could have changed: it is left as it is, and a person checks
    what it holds before giving it back."""
    why = untrusted(status, owner)
    trusted_owner = status.st_uid in (0, owner)
    if stat.S_ISDIR(status.st_mode) and status.st_mode & stat.S_ISVTX and trusted_owner:
        # The sticky bit keeps others from renaming or removing what is there (when the
        # directory and its entries are the administrator's), not from putting an entry
        # where there was none.
        what = (
            "a file the administrator had not made yet (a policy, a hook...) could have been "
            "put in it"
        )
        check = "check what it holds"
    elif stat.S_ISDIR(status.st_mode):
        what = (
            "the administrator's files in it (a policy, a hook...) could have been renamed, "
            "replaced or removed"
        )
        check = "check what it holds"
    else:
        what = "what it says is the administrator's and could have been rewritten"
        check = "check its content"
    fix = []
    if not trusted_owner:
        fix.append(f"'chown {owner} {path}'")
    if status.st_mode & LOOSE_BITS:
        fix.append(f"'chmod go-w {path}'")
    return (
        f"{shown} ({why}): {what} by another uid, so bootstrap leaves it as it is; "
        f"{check}, then {' and '.join(fix)}"
    )


def status_beneath(top_fd: int, relative: str) -> os.stat_result | None:
    """The status of ``relative`` below the directory open as ``top_fd``, no link followed
    on the way or at the end; None when it or a directory on the way is missing or is not a
    real directory (the step that owns it reports that)."""
    *parents, name = relative.split("/")
    fd = os.dup(top_fd)
    try:
        for part in parents:
            try:
                inner = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    return None
                raise
            passed, fd = fd, inner  # rebound before the close: the cleanup after a Ctrl-C
            os.close(passed)  # between the two must not close this one again
        return durable.lstat_at(fd, name)
    finally:
        os.close(fd)


def tighten(
    dir_fd: int | None,
    name: str,
    owner: int,
    shown: str,
    *,
    mode: int | None = None,
    ops: durable.FsOps | None = None,
) -> str:
    """Give the directory ``name`` of ``dir_fd`` (None: ``name`` is a path) back to uid
    ``owner`` unless root or ``owner`` has it, and take its group's and others' write bits
    (or give it exactly ``mode``).  Only for the directories the module docstring lets
    bootstrap give back: a regular file is never changed here.  Returns what changed
    (``"mode 0777, now 0755"``), ``""`` when nothing did: a missing name, anything but a
    directory (its own step handles it) or a directory as it should be.  EPERM naming
    ``shown`` when only root could make the change."""
    ops = ops or durable.default_ops()
    try:
        fd = os.open(name, _PATH_FLAGS, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return ""
    try:
        status = os.fstat(fd)
        if not stat.S_ISDIR(status.st_mode):
            return ""
        current = stat.S_IMODE(status.st_mode)
        wanted = current & ~LOOSE_BITS if mode is None else mode
        give_back = status.st_uid not in (0, owner)
        if not give_back and wanted == current:
            return ""
        # Only root gives a directory away; only root or its owner changes its mode.
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
            # Giving an entry away clears its set-id bits: judge the mode the kernel left.
            current = stat.S_IMODE(os.fstat(fd).st_mode)
            wanted = current & ~LOOSE_BITS if mode is None else mode
        if wanted != current:
            ops.chmod_opened(fd, wanted)
            changed.append(f"mode {current:04o}, now {wanted:04o}")
        return "; ".join(changed)
    finally:
        os.close(fd)
