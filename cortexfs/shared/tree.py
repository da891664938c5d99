"""Creating directory paths under the storage root durably, with the owner and mode they need.

Sessions (S-1) and shared spaces (X-1) create several levels of directories whose ownership
and mode bits are part of the security model: a shared space is group-writable and setgid so
that everything created inside belongs to the space's group; a user's tier belongs to that
user.  ``mkdir`` applies the umask, so the mode is set explicitly afterwards.  Every level is
opened with ``O_NOFOLLOW`` relative to the previous one (Q-8 style): a symlink planted in the
tree is refused, never followed.  The top of the tree is the one exception: it is the storage
root or one of the root's own directories, which only its administrator names, and the root
may be reached through a link they made (``storage/current`` -> a release, R-1).
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from cortexfs import capabilities, durable, user_namespace
from cortexfs.errors import CtxError
from cortexfs.interrupts import held_interrupts
from cortexfs.storage import not_readable


class Ownership(NamedTuple):
    """Who a created directory belongs to; ``-1`` leaves that id as the kernel chose it."""

    uid: int = -1
    gid: int = -1


def ensure_directories(
    ops: durable.FsOps,
    top: Path,
    parts: Sequence[str],
    *,
    mode: int,
    owner: Ownership | None = None,
) -> list[str]:
    """Create ``top/parts[0]/…/parts[-1]`` where missing; return the created paths.

    ``top`` must exist.  Directories that already exist are left exactly as they are.  The
    mode is applied to every new directory, and so is the owner where the kernel lets us (see
    :func:`_apply`).  Each new directory's entry is durable when this returns.
    """
    created: list[str] = []
    fd = _open_top(ops, top)
    try:
        for depth, name in enumerate(parts):
            if owner is not None and _gives_away(owner) and durable.lstat_at(fd, name) is None:
                # Asked before the mkdir: one made and then refused its owner would be left
                # root's, and kept so by every later run.
                made_for = f"{top.joinpath(*parts[: depth + 1])} owned by {_ids(owner)}"
                capabilities.require(f"making {made_for}", capabilities.CAP_CHOWN)
                user_namespace.require_mapped(f"make {made_for}", owner.uid, owner.gid)
            # Ctrl-C waits for the mode: a directory left with the mkdir's would be left so by
            # the next run, which leaves what exists as it is.
            with held_interrupts():
                made = durable.make_dir_synced(ops, fd, name, mode)
                inner = _open_level(ops, fd, top, parts[: depth + 1])
                if made:
                    created.append(str(top.joinpath(*parts[: depth + 1])))
                    _require_made_here(ops, inner, top.joinpath(*parts[: depth + 1]))
                    _apply(ops, inner, mode, owner)
            passed, fd = fd, inner  # rebound before the close: the cleanup after a Ctrl-C
            ops.close(passed)  # between the two must not close this one again
    finally:
        ops.close(fd)
    return created


def _open_top(ops: durable.FsOps, top: Path) -> int:
    """``top``, through whatever links lead to it (see the module's docstring)."""
    return durable.open_dir_path(ops, os.path.realpath(top))


def open_beneath(ops: durable.FsOps, top: Path, parts: Sequence[str]) -> int:
    """A descriptor of the directory ``top/parts…``, reached without following any link.

    For a writer running as root inside a tree a user may change (a home, a shared space): a
    component swapped for a symlink makes this fail (ELOOP/ENOTDIR) instead of redirecting the
    write.  FileNotFoundError when a component is missing.
    """
    fd = _open_top(ops, top)
    try:
        for depth in range(len(parts)):
            inner = _open_level(ops, fd, top, parts[: depth + 1])
            passed, fd = fd, inner  # rebound before the close: the cleanup after a Ctrl-C
            ops.close(passed)  # between the two must not close this one again
    except BaseException:
        ops.close(fd)
        raise
    return fd


def _require_made_here(ops: durable.FsOps, fd: int, path: Path) -> None:
    """EEXIST unless ``fd`` is still this process's own directory, as the one it has just made
    is.  Between the mkdir and the open, a user who may write the parent can put another
    directory at the name (theirs), which must not be given away or chmodded.  (Its entries
    are no sign: another process making the same path may already be making the next level
    in it.)"""
    status = os.fstat(fd)
    if status.st_uid != os.geteuid():
        ops.close(fd)
        raise CtxError(
            errno.EEXIST,
            f"{path} was replaced by another directory while it was being made; left as it "
            "is, and its owner and mode unchanged",
        )


class Repair(NamedTuple):
    """An existing directory whose group or mode is not what it should be, held open (reached
    without following a link) until :func:`apply_repairs` changes it or it is closed."""

    fd: int
    path: Path
    status: os.stat_result
    mode: int  # the mode it should have


def find_repairs(
    ops: durable.FsOps,
    top: Path,
    wanted: Sequence[tuple[Sequence[str], int]],
    *,
    gid: int,
    regrouping: int | None = None,
    made_by: int,
) -> list[Repair]:
    """The directories ``top/parts…`` of ``wanted`` (``(parts, mode)`` pairs) that exist but
    have another group than ``gid`` or another mode, each opened without following a link.
    A directory of group ``regrouping`` (which the caller is giving ``gid`` anyway) needs no
    repair for its group alone.

    EPERM, with nothing opened kept, naming the first that does not belong to ``made_by`` (the
    uid that made the tree: a directory put in it by someone else is theirs, and its group
    and mode are not changed on their behalf), or that the caller, neither root nor its
    owner, may not change.  Missing ones are skipped: creating them is
    :func:`ensure_directories`' job."""
    repairs: list[Repair] = []
    try:
        for parts, mode in wanted:
            try:
                fd = open_beneath(ops, top, parts)
            except FileNotFoundError:
                continue
            status = os.fstat(fd)
            if status.st_gid in (gid, regrouping) and stat.S_IMODE(status.st_mode) == mode:
                ops.close(fd)
                continue
            path = top.joinpath(*parts)
            repairs.append(Repair(fd, path, status, mode))
            wrong = (
                f"its group {status.st_gid} and mode {stat.S_IMODE(status.st_mode):04o} should "
                f"be {gid} and {mode:04o}"
            )
            if status.st_uid != made_by:
                raise CtxError(
                    errno.EPERM,
                    f"{path} belongs to uid {status.st_uid}, not to uid {made_by}, who made "
                    f"the rest: {wrong}, but they are not changed for another owner; nothing "
                    f"was changed (have root give it back, keeping what is in it, with 'chown "
                    f"{made_by} {path}', and run the command again)",
                )
            if os.geteuid() not in (0, status.st_uid):
                raise CtxError(
                    errno.EPERM,
                    f"{path}: {wrong}, and only root or its owner, uid {status.st_uid}, may "
                    "change them; nothing was changed",
                )
    except BaseException:
        close_repairs(ops, repairs)
        raise
    return repairs


def apply_repairs(ops: durable.FsOps, repairs: Sequence[Repair], *, gid: int) -> list[str]:
    """Give each directory of ``repairs`` group ``gid`` and the mode it should have, through
    the descriptor :func:`find_repairs` opened; closes them all.  Returns their paths."""
    try:
        for repair in repairs:
            _apply(ops, repair.fd, repair.mode, Ownership(-1, gid))
    finally:
        close_repairs(ops, repairs)
    return [str(repair.path) for repair in repairs]


def close_repairs(ops: durable.FsOps, repairs: Sequence[Repair]) -> None:
    for repair in repairs:
        ops.close(repair.fd)


def _gives_away(owner: Ownership) -> bool:
    """Whether root giving a directory to ``owner`` takes CAP_CHOWN: another uid, or a group
    root is not in (a file's owner may give it any group of its own without it)."""
    if os.geteuid() != 0:
        return False
    other_uid = owner.uid not in (-1, 0)
    other_group = owner.gid not in (-1, os.getegid(), *os.getgroups())
    return other_uid or other_group


def _ids(owner: Ownership) -> str:
    """``uid U, gid G``, or the one of them that is given (-1: left as it is)."""
    given = [f"{kind} {n}" for kind, n in (("uid", owner.uid), ("gid", owner.gid)) if n != -1]
    return ", ".join(given)


def _apply(ops: durable.FsOps, fd: int, mode: int, owner: Ownership | None) -> None:
    """Owner and mode of an open directory; its own fsync makes the inode change durable.

    Only root may give a file away; anyone may change the group of their own file to one of
    their groups, so a non-root owner's request is passed on when it keeps the uid (and the
    kernel refuses a group the caller is not in with EPERM).
    """
    if owner is not None and (os.geteuid() == 0 or owner.uid in (-1, os.geteuid())):
        try:
            os.fchown(fd, owner.uid, owner.gid)
        except PermissionError:
            where = os.readlink(f"/proc/self/fd/{fd}")
            raise CtxError(
                errno.EPERM,
                f"cannot give {where} to group {owner.gid}: only root may give a directory "
                "to a group its owner is not in; run as root, or give the agent a gid you "
                "hold (its identity control)",
            ) from None
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            # Inside a user namespace (unshare --map-root-user) a uid or gid its map leaves out
            # names nobody there: the kernel says EINVAL, which alone names no id.
            where = os.readlink(f"/proc/self/fd/{fd}")
            user_namespace.require_mapped(f"give {where} to {_ids(owner)}", owner.uid, owner.gid)
            raise
    # After chown: changing the owner clears the setgid bit on some filesystems.
    os.fchmod(fd, mode)
    durable.sync_dir(ops, fd)


def _open_level(ops: durable.FsOps, parent_fd: int, top: Path, parts: Sequence[str]) -> int:
    try:
        return ops.open_dir(parts[-1], parent_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        where = top.joinpath(*parts)
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CtxError(
                exc.errno, f"{where} is not a directory (or is a symlink); left untouched"
            ) from None
        if exc.errno == errno.EACCES:
            # The bare OSError names only the last component ("agent: Permission denied"); the
            # advice names the group only where the mode grants it something.
            raise not_readable(where, f"open {where}") from None
        raise


HOME_MODE = 0o755


def user_ownership(uid: int) -> Ownership:
    """``uid`` and its primary group (from the password database; kept as is when unknown).

    A user making their own home as themselves keeps the group their process runs with, as a
    plain mkdir would: after ``newgrp`` it may be one they hold while the passwd group is
    not, and only root may give a directory to a group its owner is not in."""
    if uid == os.geteuid() != 0:
        return Ownership(uid, os.getegid())
    try:
        return Ownership(uid, pwd.getpwuid(uid).pw_gid)
    except KeyError:
        return Ownership(uid, -1)


def ensure_home(ops: durable.FsOps, root: Path, owner: Ownership) -> Path:
    """``home/<uid>/``, a user's tier (R-4): created owned by that user (as root), mode 0755."""
    ensure_directories(ops, root / "home", [str(owner.uid)], mode=HOME_MODE, owner=owner)
    return root / "home" / str(owner.uid)
