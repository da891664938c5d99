"""Where ``ctxmcp project`` may write its candidates: nowhere under ``/ctx`` or a storage root
(M-1), whatever name leads there.

A directory is judged by identity, not by its name: it and every directory above it, as the
kernel walks up (``..``), are compared by device and inode with ``/ctx``, the storage root and
the root's tool directories, and each is looked at for the six entries of a storage root
(R-2).  A bind mount, a link or a second name of the root therefore leads nowhere else.  What
does not exist yet has no identity: the path OUT leads to, its links resolved, is therefore
also compared by name with ``/ctx`` and the storage root (:func:`refuse_by_name`), so that
making OUT never makes ``/ctx`` or a root that is still to be bootstrapped.  The check runs on
the path given, before the server starts, and again before OUT is made
(:func:`check_out_directory`), then on the directory descriptor the candidates are written
through (:func:`refuse_inside`), because the server, running as the caller, may replace OUT
meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from cortexfs.errors import CtxError, invalid, remedy_for_host_trouble
from cortexfs.file_attributes import attribute_refusal
from cortexfs.fuse.mounts import cortexfs_mount_holding
from cortexfs.storage import ROOT_ENTRIES

_PLACE = os.O_PATH | os.O_CLOEXEC


CTX = Path("/ctx")


def check_out_directory(out: Path, root: Path | None) -> None:
    """EINVAL when ``out`` is under ``/ctx``, the storage root ``root`` or any mount of a
    storage root, wherever it is mounted: ctxmcp writes candidates only, never into the tree
    agents see (M-1); ``ctx object install`` puts them there.

    Checked before the server starts and before anything is made: by name
    (:func:`refuse_by_name`), then on ``out`` or, when it is missing, the nearest directory
    above it that exists, by identity: that directory and each one above it, as the kernel
    walks up (``..``), against the device and inode of ``/ctx``, of ``root`` and of its tool
    directories, so that no other name of them (a bind mount, a link) gets through.  ENOTDIR
    when something on the way is not a directory, and EROFS, EPERM or EACCES when ctxmcp may
    not write there (:func:`_refuse_what_cannot_be_written`).
    :func:`write_candidates` checks again the directory it writes through."""
    mount = cortexfs_mount_holding(out)
    if mount is not None:
        raise invalid(
            f"--out {out} is inside {mount}, a mount of a storage root (ctx mount): ctxmcp "
            "writes nothing under /ctx or the storage root (M-1); write the candidates "
            "elsewhere and install them with 'ctx object install' (nothing was written)"
        )
    refuse_by_name(out, root)
    existing = out
    while not _is_directory(existing) and existing.parent != existing:
        _refuse_what_cannot_become_a_directory(existing, out)
        existing = existing.parent
    _refuse_what_cannot_be_written(existing, out)
    if existing == out and not os.access(out, os.R_OK, effective_ids=True):
        # The candidates are made durable through a descriptor of --out, which open(2) gives
        # only to a reader: refused here, before the server starts, not once it has run.
        raise CtxError(
            errno.EACCES,
            f"--out {out}: ctxmcp may write into it but not read it, and it opens it to make "
            "the candidates durable (an fsync of the directory); give a directory you may "
            "read and write (nothing was written)",
        )
    fd = _open_place(existing, out)
    try:
        refuse_inside(fd, out, forbidden_directories(root))
    finally:
        os.close(fd)


def refuse_by_name(out: Path, root: Path | None) -> None:
    """EINVAL when the path ``out`` leads to — its links, as far as they exist, resolved and
    the rest taken as written — is ``/ctx`` or ``root`` or lies under one of them, whether or
    not that place exists yet: making OUT there would make ``/ctx`` or the root itself (a root
    that ``ctx bootstrap`` would later adopt as it found it)."""
    leads_to = Path(os.path.realpath(out))
    places = [CTX] if root is None else [CTX, root]
    for place in places:
        for name in dict.fromkeys((place, Path(os.path.realpath(place)))):
            if leads_to == name or name in leads_to.parents:
                raise _inside(out, name)


def forbidden_directories(root: Path | None) -> dict[tuple[int, int], Path]:
    """``/ctx``, ``root`` and the tool directories of ``root`` that exist, by identity."""
    places = [CTX]
    if root is not None:
        places += [root, root / "tool"]
        for tier in ("home", "shared"):
            with contextlib.suppress(OSError), os.scandir(root / tier) as entries:
                places += [Path(entry.path) / "tool" for entry in entries]
    forbidden = {}
    for place in places:
        with contextlib.suppress(OSError):
            status = os.stat(place)
            forbidden.setdefault((status.st_dev, status.st_ino), place)
    return forbidden


def refuse_inside(fd: int, out: Path, forbidden: dict[tuple[int, int], Path]) -> None:
    """EINVAL when the directory ``fd`` or one above it is in ``forbidden`` or is a storage
    root (it holds the six entries of R-2); EACCES when the way up cannot be walked."""
    fd = os.dup(fd)
    try:
        while True:
            status = os.fstat(fd)
            place = forbidden.get((status.st_dev, status.st_ino))
            if place is None and _holds_root_abi(fd):
                place = Path(os.readlink(f"/proc/self/fd/{fd}"))
            if place is not None:
                raise _inside(out, place)
            try:
                parent = os.open("..", _PLACE, dir_fd=fd)
            except OSError as exc:
                raise CtxError(
                    exc.errno or errno.EACCES,
                    f"cannot tell whether --out {out} is inside the storage root: a directory "
                    f"above it cannot be searched ({exc.strerror}); give an --out whose "
                    "directories you may search (nothing was written)",
                ) from None
            above = os.fstat(parent)
            passed, fd = fd, parent  # rebound before the close: the cleanup after a Ctrl-C
            os.close(passed)  # between the two must not close this one again
            if (above.st_dev, above.st_ino) == (status.st_dev, status.st_ino):
                return  # "/" is its own parent
    finally:
        os.close(fd)


def _inside(out: Path, place: Path) -> CtxError:
    return invalid(
        f"--out {out} is inside {place}: ctxmcp writes nothing under /ctx or the storage root "
        "(M-1); write the candidates elsewhere and install them with 'ctx object install' "
        "(nothing was written)"
    )


def _holds_root_abi(fd: int) -> bool:
    for entry in ROOT_ENTRIES:
        try:
            if not stat.S_ISDIR(os.stat(entry, dir_fd=fd, follow_symlinks=False).st_mode):
                return False
        except OSError:
            return False
    return True


def _open_place(path: Path, out: Path) -> int:
    try:
        return os.open(path, _PLACE | os.O_DIRECTORY)
    except OSError as exc:
        raise CtxError(
            exc.errno or errno.EIO,
            f"cannot look at --out {out} ({path}: {exc.strerror}); give a directory you may "
            "write (nothing was written)",
        ) from None


def _refuse_what_cannot_be_written(place: Path, out: Path) -> None:
    """EROFS, EPERM or EACCES when ctxmcp may not write into ``place``, the nearest directory
    of ``out`` that exists: a read-only filesystem or an attribute (``chattr``) refuses root
    too, whatever the modes, so neither is blamed on a mode.  ``out`` itself append-only is
    refused too: the candidates' temporaries could be made in it, but none could take its
    name or be taken back."""
    writable = os.access(place, os.W_OK | os.X_OK, effective_ids=True)
    if writable and place != out:
        return
    try:
        read_only = not writable and bool(os.statvfs(place).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        raise CtxError(
            errno.EROFS,
            f"--out {out}: {place} is on a read-only filesystem; "
            f"{remedy_for_host_trouble(errno.EROFS)}, or give another --out (nothing was "
            "written)",
        )
    try:
        fd = os.open(place, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        fd = None
    refused = (
        None if fd is None else attribute_refusal(fd, f"write candidates in --out {out}", place)
    )
    if refused is not None:
        raise CtxError(refused.errno, f"{refused.message} (nothing was written)")
    if not writable:
        raise CtxError(
            errno.EACCES,
            f"--out {out}: ctxmcp may not write into {place}; give a directory you may "
            "write (nothing was written)",
        )


def _refuse_what_cannot_become_a_directory(place: Path, out: Path) -> None:
    """ENOTDIR when ``place``, on the way to ``out``, is something other than a directory (a
    file, a FIFO, a device), which no mkdir makes one; the link's own errno when it is a
    symbolic link to nothing or a loop.  Said before the server starts, not after."""
    try:
        os.stat(place)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR) and not os.path.islink(place):
            # Missing: made by the projection; or below something that is not a directory,
            # which the walk up comes to and names.
            return
        if exc.errno == errno.ENOENT:
            raise CtxError(
                errno.ENOENT,
                f"--out {out}: {place} is a symbolic link to {os.readlink(place)}, which does "
                "not exist; make that directory or give another --out (nothing was written)",
            ) from None
        raise CtxError(
            exc.errno or errno.EIO,
            f"--out {out}: {place} cannot be followed ({exc.strerror}); give another --out "
            "(nothing was written)",
        ) from None
    raise CtxError(
        errno.ENOTDIR,
        f"--out {out} can never be a directory: {place} is not one; give another --out "
        "(nothing was written)",
    )


def _is_directory(path: Path) -> bool:
    with contextlib.suppress(OSError):
        return stat.S_ISDIR(os.stat(path).st_mode)
    return False
