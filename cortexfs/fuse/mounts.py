"""Where ``ctx mount`` may mount, and ``ctx umount`` (SPEC F-1).

:func:`check_mount_point` refuses, before anything is mounted, a mount point that is not an
empty directory, one that is already a CortexFS mount, and one inside the storage root, also
under another name (a bind mount): the daemon walks the storage root itself, so a mount inside
it would wait on its own answers.  It refuses a storage root on a CortexFS mount as well: two
daemons could then each wait on the other.

The mount table, not ``stat``, says what is mounted where: a mount whose daemon was killed
answers every ``stat`` with ``ENOTCONN``, and is exactly the one a user most needs to remove.
Only a mount that ``ctx mount`` made (type ``fuse.cortexfs``) is unmounted; anything else at
that path is refused, so a mistyped path cannot unmount another filesystem, even as root.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from pathlib import Path

from cortexfs import mount_table, storage
from cortexfs.errors import CtxError, invalid, not_found
from cortexfs.mount_table import Mount
from cortexfs.printable import shell_word
from cortexfs.tools.host_programs import find_program

FILESYSTEM_TYPE = "fuse.cortexfs"  # what ``subtype=cortexfs`` makes the kernel call it


def check_mount_point(root: Path, mountpoint: Path) -> None:
    """Refuse what ``ctx mount`` must not mount, with nothing mounted: a storage root that is
    missing (ENOENT), not one (EINVAL), or on a CortexFS mount itself (EINVAL); a mount point
    that is missing (ENOENT), not a directory (ENOTDIR), a dead mount (ENOTCONN), already a
    CortexFS mount (EBUSY), not empty (ENOTEMPTY), or inside the storage root (EINVAL)."""
    storage.require_root(root)
    if not (root / "tool").is_dir():
        raise invalid(f"{root} is not a storage root; create it with 'ctx bootstrap'")
    _require_empty_directory(mountpoint)
    _require_outside(root, mountpoint)
    served_by = cortexfs_mount_holding(root)
    if served_by is not None:
        # The mount shows another storage root's files at the same places: what lies at
        # ``root`` is that root's own directory of the same relative path (that root itself
        # only when nothing follows the mount point).
        try:
            below = Path(os.path.realpath(root)).relative_to(os.path.realpath(served_by))
        except ValueError:  # reached through another mount point of the same mount
            below = Path(".")
        instead = (
            "the storage root that mount serves"
            if below == Path(".")
            else f"the directory {below} of the storage root that mount serves (the path "
            f"that mount's --storage was given, then /{below})"
        )
        raise invalid(
            f"the storage root {root} lies on the CortexFS mount {served_by}: a mount served "
            "from another mount's answers can end up waiting on itself; nothing was mounted: "
            f"give --storage {instead}"
        )


def _require_outside(root: Path, mountpoint: Path) -> None:
    """EINVAL when ``mountpoint`` is the storage root or lies inside it, by name or as the
    same directory under another name (a bind mount of the root, or of a directory above
    it): the file's identity (device and inode) is compared, not only its path.  A mount
    placed there, or propagated there from a shared bind mount, would be walked by the
    daemon itself, which would then wait on its own answers, and every caller with it."""
    if storage.place_in_root(root, mountpoint) is not None:
        raise invalid(
            f"the mount point {mountpoint} is inside the storage root {root} (by path, or "
            "through a bind mount or another name for it), which the mount serves from: it "
            "would wait on itself; nothing was mounted: mount it outside the storage root"
        )


def _require_empty_directory(mountpoint: Path) -> None:
    try:
        is_directory = stat.S_ISDIR(os.stat(mountpoint).st_mode)
        # Listed first: a dead mount may still answer stat from the kernel's cache, never a
        # listing (ENOTCONN).  Then the mount table, whatever the listing held: a CortexFS
        # mount may list nothing (an agent's view while its entry cannot be read), and one
        # mounted over it would hide it while it still serves.
        listed = os.listdir(mountpoint) if is_directory else []
        if is_directory and mounted_type(_absolute(mountpoint)) == FILESYSTEM_TYPE:
            raise CtxError(
                errno.EBUSY,
                f"{mountpoint} is already a CortexFS mount; unmount it with "
                f"'ctx umount {shell_word(str(mountpoint))}' first, or mount on another "
                "empty directory",
            )
        if listed:
            raise CtxError(
                errno.ENOTEMPTY,
                f"the mount point {mountpoint} is not empty; mount on an empty directory",
            )
    except FileNotFoundError:
        raise not_found(
            f"the mount point {mountpoint} does not exist; create an empty directory there"
        ) from None
    except OSError as exc:
        reason = f"the mount point {mountpoint}: {exc.strerror}"
        if exc.errno == errno.ENOTCONN:  # a mount whose process died is still in the way
            reason += _dead_mount_remedy(mountpoint)
        raise CtxError(exc.errno or errno.EIO, reason) from None
    if not is_directory:
        raise CtxError(
            errno.ENOTDIR, f"the mount point {mountpoint} is not a directory; give an empty one"
        )


def _dead_mount_remedy(path: Path) -> str:
    """How to remove the dead mount that ``path`` lies on, named by its own mount point from
    the mount table: ``path`` may lie below it (``/ctx/home``), and no unmount of a path that
    is no mount point removes it."""
    dead = mount_table.mount_holding(path)
    if dead is None:  # the table cannot be read: the path given is the best guess
        return f"; remove the dead mount with 'ctx umount {shell_word(str(path))}'"
    if dead.filesystem_type != FILESYSTEM_TYPE:
        return (
            f"; the {dead.filesystem_type} mount at {dead.mount_point} lost its process, and "
            "is not one of 'ctx mount': unmount it with umount(8)"
        )
    return f"; remove the dead mount with 'ctx umount {shell_word(dead.mount_point)}'"


def unmount(mountpoint: Path) -> None:
    """Unmount the CortexFS mount at ``mountpoint``, live or with its daemon gone; its
    process then exits.  ENOENT, EINVAL (not a mount point, or another filesystem's), EPERM
    (another uid's mount, which only that uid or root may unmount) or EBUSY (still in use,
    with the system's reason) otherwise, with nothing changed."""
    where = _absolute(mountpoint)
    mount = _topmost_mount(where)
    if mount is None:
        if not os.path.lexists(where):
            raise not_found(f"{mountpoint} does not exist")
        raise invalid(f"{mountpoint} is not a mount point")
    if mount.filesystem_type != FILESYSTEM_TYPE:
        raise invalid(
            f"{mountpoint} is a {mount.filesystem_type} mount, not one of 'ctx mount'; "
            "unmount it with umount(8)"
        )
    owner = _mounted_by(mount)
    if os.geteuid() != 0 and owner is not None and owner != os.geteuid():
        # fusermount3 would refuse with words about /etc/mtab, which read like "busy".
        raise CtxError(
            errno.EPERM,
            f"cannot unmount {mountpoint}: it was mounted by uid {owner}, and only that uid "
            "or root may unmount it",
        )
    # As root, the program is found among PATH's trusted entries only: one found in the
    # working directory or in a directory another uid may write would run as root.
    fusermount, umount = find_program("fusermount3"), find_program("umount")
    if fusermount is not None:
        command = [fusermount, "-u", str(where)]
    elif umount is not None:
        command = [umount, str(where)]
    else:
        raise not_found(
            f"cannot unmount {mountpoint}: neither fusermount3 (package fuse3) nor umount "
            "(util-linux) is in a trusted directory of PATH"
            + (" (one owned by root, not writable by others)" if os.geteuid() == 0 else "")
        )
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        reason = " ".join(done.stderr.split()) or f"{command[0]} exited {done.returncode}"
        if "Operation not permitted" in reason:
            # umount2(2)'s EPERM: a root whose capability set leaves out CAP_SYS_ADMIN (a
            # container's) may not unmount; the mount is in use by nobody's fault.
            raise CtxError(
                errno.EPERM,
                f"cannot unmount {mountpoint}: {reason} (unmounting takes CAP_SYS_ADMIN, "
                "which a container's root may lack)",
            )
        raise CtxError(errno.EBUSY, f"cannot unmount {mountpoint}: {reason}")


def the_only_mount() -> Path:
    """Where the one CortexFS mount this user may unmount is (``ctx umount`` without a
    MOUNTPOINT, as SPEC F-1 writes it): the caller's own mounts, or every one for root.
    ENOENT when there is none; EINVAL, naming them, when there are several."""
    mine = sorted(
        {
            mount.mount_point
            for mount in mount_table.mounts()
            if mount.filesystem_type == FILESYSTEM_TYPE
            and (os.geteuid() == 0 or _mounted_by(mount) in (None, os.geteuid()))
        }
    )
    if not mine:
        raise not_found("no storage root is mounted with 'ctx mount' here: nothing to unmount")
    if len(mine) > 1:
        raise invalid(
            f"{len(mine)} storage roots are mounted with 'ctx mount' ({', '.join(mine)}): "
            "name the MOUNTPOINT to unmount"
        )
    return Path(mine[0])


def mounted_type(mountpoint: Path) -> str | None:
    """The filesystem type of the topmost mount at ``mountpoint`` (absolute, normalised);
    None when nothing is mounted there."""
    mount = _topmost_mount(mountpoint)
    return None if mount is None else mount.filesystem_type


def _topmost_mount(mountpoint: Path) -> Mount | None:
    found = None
    for mount in mount_table.mounts():
        if mount.mount_point == str(mountpoint):
            found = mount  # a later line is mounted over an earlier one
    return found


def _mounted_by(mount: Mount) -> int | None:
    """The uid a FUSE mount was made by (its ``user_id=`` option); None when not said."""
    for option in mount.options.split(","):
        if option.startswith("user_id="):
            return int(option.removeprefix("user_id="))
    return None


def cortexfs_mount_holding(path: Path) -> Path | None:
    """The mount point of the CortexFS mount that ``path`` (or, when it does not exist yet,
    the nearest directory above it that does) lies on; None when it lies on none."""
    existing = Path(os.path.abspath(path))
    while True:
        try:
            device = os.stat(existing).st_dev
            break
        except FileNotFoundError:
            if existing.parent == existing:
                return None
            existing = existing.parent
        except OSError:
            return None  # what cannot be looked at is refused by whoever writes there
    wanted = f"{os.major(device)}:{os.minor(device)}"
    for mount in mount_table.mounts():
        if mount.device == wanted and mount.filesystem_type == FILESYSTEM_TYPE:
            return Path(mount.mount_point)
    return None


def _absolute(path: Path) -> Path:
    """``path`` made absolute as the kernel mounts on it, following symbolic links, without
    ``stat`` of the path itself (that of a mount whose daemon died fails with ENOTCONN):
    the parent's links are resolved, and the last name's when it is a link (``lstat``).
    ELOOP when they lead round in a loop, as the kernel would say."""
    absolute = Path(os.path.abspath(path))
    if not absolute.name:
        return absolute
    where = _resolved(absolute.parent, path) / absolute.name
    return _resolved(where, path) if os.path.islink(where) else where


def _resolved(path: Path, given: Path) -> Path:
    """``path`` with its links resolved; what is missing or cannot be looked at (a dead
    mount, a directory the caller may not search) is kept as it is written, for the mount
    table to judge.  A loop is ELOOP naming ``given``: a path resolved as far as the loop
    would name neither a mount nor what is wrong."""
    try:
        return Path(os.path.realpath(path, strict=True))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CtxError(
                errno.ELOOP,
                f"{given}: {exc.strerror} (its symbolic links lead round in a loop); name "
                "the mount point by a path without the loop",
            ) from None
        return Path(os.path.realpath(path))
