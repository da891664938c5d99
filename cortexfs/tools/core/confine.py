"""Paths as an agent sees them, confined to its visible mounts (SPEC T-5; the ``fs.*`` tools).

A path names a place in the agent's view: absolute, or relative to ``CTX_CWD``.  The tools
resolve it themselves, never letting the kernel follow anything:

* ``..`` is refused outright (EINVAL), never normalised away; so are empty paths and NULs;
* a path ending in ``/`` (or ``/.``) names a directory, as it does to the kernel: a file there
  is ENOTDIR, and a tool that reads or writes files refuses it (EISDIR), never dropping the
  slash to act on a file of that name;
* the view path must lie under the target of a visible mount — the deepest target wins, the
  later mount on a tie, as in the kernel — or it is refused (EACCES);
* a *filtered* mount shows only the names it lists directly below its target: another name
  there is refused (EACCES) and left out of a listing of the target, as if it did not exist
  (the agent's ``/ctx``, T-5);
* the host path is walked from ``/`` through the mount's source and on one component at a
  time with ``O_NOFOLLOW``: a symbolic link on the way or at the end is refused (ELOOP), so
  nothing is ever followed out of a mount, nor a source repointed by a link put on its path;
* writing needs a writable mount (EROFS otherwise).

The kernel still judges every step with the tool's uid and gid (the agent's): mode bits apply.

The mounts come from ``CTX_MOUNTS``, which the runner derives from the agent's mount control
and policy: a JSON array of ``[source, target, "ro"|"rw"]``, or ``[source, target, mode,
[name, ...]]`` for a filtered mount.  The storage root reaches a tool only that way, as the
agent's projection of it (:mod:`cortexfs.agents.projection`): the root and its directories
whose entries the projection decides name by name are filtered read-only mounts, and the
agent's home and the spaces it may write are read-write mounts on top.  Without
``CTX_MOUNTS`` — a person running the tool directly — the view is the host's own filesystem:
one writable mount of ``/`` on ``/``, relative paths from the current directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import PurePosixPath
from typing import NamedTuple

from cortexfs.tools.core.toolio import ToolFailure

_PLACE = os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
_LISTABLE = os.O_RDONLY | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC
_READABLE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class Mount(NamedTuple):
    """``source`` shown at ``target``; ``names``, when not None, are the only entries directly
    below ``target`` that the agent may see."""

    source: str
    target: PurePosixPath
    writable: bool
    names: frozenset[str] | None = None

    def shows(self, view: PurePosixPath) -> bool:
        """Whether ``view``, a path at or below the target, passes the mount's filter."""
        if self.names is None or view == self.target:
            return True
        return view.relative_to(self.target).parts[0] in self.names


class Place(NamedTuple):
    """A resolved path: how the agent names it, its mount, and the components below the source.

    ``names_directory`` is true when the path ended in ``/`` or ``/.``: only a directory may be
    there.
    """

    view: PurePosixPath
    mount: Mount
    parts: tuple[str, ...]
    names_directory: bool = False

    @property
    def name(self) -> str:
        return self.parts[-1] if self.parts else ""


class View:
    """The agent's view: its visible mounts and its working directory."""

    def __init__(self, mounts: Sequence[Mount], cwd: PurePosixPath) -> None:
        self.mounts = list(mounts)
        self.cwd = cwd

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> View:
        if "CTX_MOUNTS" not in environ:
            return cls([Mount("/", PurePosixPath("/"), True)], PurePosixPath(os.getcwd()))
        try:
            mounts = [_mount(entry) for entry in json.loads(environ["CTX_MOUNTS"])]
        except (ValueError, TypeError) as exc:
            raise ToolFailure(errno.EINVAL, f"CTX_MOUNTS is malformed: {exc}") from None
        return cls(mounts, PurePosixPath(environ.get("CTX_CWD", "/")))

    def locate(self, path: object, *, write: bool = False) -> Place:
        """Where ``path`` is, or the refusal that explains why it may not be used."""
        parts = _components(path)
        base = PurePosixPath("/") if str(path).startswith("/") else self.cwd
        view = base.joinpath(*parts)
        mount = self._topmost(view)
        if mount is None:
            raise ToolFailure(errno.EACCES, f"{view} is outside every mount visible to the agent")
        if not mount.shows(view):
            raise ToolFailure(
                errno.EACCES,
                f"{view} is not in the agent's view ({mount.target} shows only what the "
                "agent's authority allows)",
            )
        if write and not mount.writable:
            raise ToolFailure(errno.EROFS, f"{view} is on a read-only mount ({mount.target})")
        names_directory = str(path).rsplit("/", 1)[-1] in ("", ".")
        return Place(view, mount, view.relative_to(mount.target).parts, names_directory)

    def _topmost(self, view: PurePosixPath) -> Mount | None:
        chosen = None
        for mount in self.mounts:
            if view != mount.target and mount.target not in view.parents:
                continue
            if chosen is None or len(mount.target.parts) >= len(chosen.target.parts):
                chosen = mount
        return chosen


def _mount(entry: object) -> Mount:
    if not isinstance(entry, list) or len(entry) not in (3, 4):
        raise ValueError(
            f"{entry!r} is not [source, target, mode] or [source, target, mode, names]"
        )
    source, target, mode = entry[:3]
    # Judged here, with the table: a source no walk can take (a number, a NUL, a lone
    # surrogate no file name holds) would fail at the first look as a crash, not a refusal.
    if not isinstance(source, str) or "\0" in source or not _encodable(source):
        raise ValueError(f"the source of the mount at {target!r} is no path: {source!r}")
    names = None
    if len(entry) == 4:
        if not isinstance(entry[3], list) or not all(isinstance(n, str) for n in entry[3]):
            raise TypeError(f"the names of the mount at {target!r} must be a list of strings")
        names = frozenset(entry[3])
    return Mount(source, PurePosixPath(target), mode == "rw", names)


def _encodable(name: str) -> bool:
    try:
        os.fsencode(name)
    except UnicodeEncodeError:
        return False
    return True


def listed(place: Place, names: Iterable[str]) -> list[str]:
    """The entries a listing of the directory at ``place`` shows, in name order: at the target
    of a filtered mount, only those it lets through."""
    if place.mount.names is None or place.parts:
        return sorted(names)
    return sorted(name for name in names if name in place.mount.names)


def open_directory(place: Place, *, listable: bool = False) -> int:
    """A descriptor of the directory at ``place`` (``O_PATH`` unless it must be read)."""
    fd = _walk(place, place.parts)
    if listable:
        try:
            with reporting(place):
                reopened = os.open(".", _LISTABLE, dir_fd=fd)
        finally:
            os.close(fd)
        return reopened
    return fd


def open_parent(place: Place, *, writable: bool = False) -> int:
    """A descriptor of the directory holding ``place``: ``O_PATH``, or, ``writable``, readable
    so that it can be synced — unless the agent may write and search that directory but not
    read it (a drop box, mode 1733), which a file may be written into all the same: it stays
    ``O_PATH`` then (:func:`readable` tells)."""
    if not place.parts:
        raise ToolFailure(errno.EISDIR, f"{place.view} is the top of a mount")
    parent = Place(place.view.parent, place.mount, place.parts[:-1], True)
    fd = open_directory(parent)
    if not writable:
        return fd
    try:
        reopened = os.open(".", _LISTABLE, dir_fd=fd)
    except OSError as exc:
        if isinstance(exc, PermissionError) and _writable_and_searchable(fd):
            return fd
        os.close(fd)
        raise _failure(exc, parent.view) from None
    os.close(fd)
    return reopened


def _writable_and_searchable(fd: int) -> bool:
    """Whether the agent may make an entry in the directory open as ``fd`` and look it up:
    what a write there asks, reading it or not."""
    return os.access(".", os.W_OK | os.X_OK, dir_fd=fd, effective_ids=True)


def readable(fd: int) -> bool:
    """Whether ``fd`` may be read (and synced): not an ``O_PATH`` descriptor."""
    return not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_PATH


@contextlib.contextmanager
def reporting(place: Place) -> Iterator[None]:
    """Turn the kernel's refusals (EACCES for the agent's uid…) into failures naming the path."""
    try:
        yield
    except OSError as exc:
        raise _failure(exc, place.view) from None


def open_regular_file(place: Place) -> tuple[int, os.stat_result]:
    """``place`` opened for reading, with its status: never through a link, and only a regular
    file (EISDIR for a directory, EINVAL for anything else), judged before it is opened, so
    that a FIFO, a socket or a device found at the name is never opened (one put there
    between that look and the open is opened without waiting, and refused as opened)."""
    parent = open_parent(place)
    try:
        # A directory on the way the agent may not search refuses the look itself (EACCES):
        # named by its view path, as the walk names it, not by the last component alone.
        with reporting(place):
            found = lstat_at(parent, place.name)
        refuse_link(place, found)
        if found is not None:
            # Judged by its type before any open: opening a FIFO lets a writer waiting for
            # its reader through (then breaks its pipe), and a device answers its driver's
            # open (ENXIO without one; a loop node makes the kernel create the device).
            refuse_all_but_a_regular_file(place, found)
        with reporting(place):
            fd = os.open(place.name, _READABLE, dir_fd=parent)
    finally:
        os.close(parent)
    # Judged again as opened: something else may have been put at the name since the look.
    status = os.fstat(fd)
    try:
        refuse_all_but_a_regular_file(place, status)
    except ToolFailure:
        os.close(fd)
        raise
    return fd, status


def refuse_all_but_a_regular_file(place: Place, status: os.stat_result) -> None:
    """ENOTDIR for ``a.txt/``, EISDIR for a directory, EINVAL for anything else that is not
    a regular file (a FIFO, a socket, a device)."""
    refuse_file_named_as_directory(place, status)
    if stat.S_ISDIR(status.st_mode):
        raise ToolFailure(errno.EISDIR, f"{place.view} is a directory, not a file")
    if not stat.S_ISREG(status.st_mode):
        raise ToolFailure(errno.EINVAL, f"{place.view} is not a regular file")


def refuse_file_named_as_directory(place: Place, status: os.stat_result | None) -> None:
    """ENOTDIR for ``a.txt/``: the trailing slash asks for a directory, and what is there is not
    one (the kernel's answer; dropping the slash would act on the file).  A link there would
    have to be followed to tell, so it is refused as every link is (ELOOP)."""
    if not place.names_directory or status is None:
        return
    refuse_link(place, status)
    if not stat.S_ISDIR(status.st_mode):
        raise ToolFailure(
            errno.ENOTDIR, f"{place.view} is not a directory, but the path ends in '/'"
        )


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def refuse_link(place: Place, status: os.stat_result | None) -> None:
    if status is not None and stat.S_ISLNK(status.st_mode):
        raise ToolFailure(errno.ELOOP, f"{place.view} is a symbolic link; never followed")


def _open_source(mount: Mount) -> int:
    """The mount's source, walked from ``/`` one component at a time without following any
    link: a source whose path runs through a link now (one put there since the mount was
    recorded) is refused (ELOOP), never followed to wherever the link's writer chose."""
    parts = [part for part in mount.source.split("/") if part]
    if not mount.source.startswith("/") or any(part in (".", "..") for part in parts):
        raise ToolFailure(
            errno.EINVAL, f"{mount.target}: its source {mount.source!r} is not a real path"
        )
    fd = os.open("/", _PLACE)
    try:
        for part in parts:
            status = lstat_at(fd, part)
            if status is not None and stat.S_ISLNK(status.st_mode):
                raise ToolFailure(
                    errno.ELOOP,
                    f"{mount.target}: its source {mount.source} runs through a symbolic link; "
                    "links are never followed",
                )
            inner = os.open(part, _PLACE, dir_fd=fd)  # O_NOFOLLOW: a link swapped in fails
            passed, fd = fd, inner  # rebound before the close: the cleanup after a Ctrl-C
            os.close(passed)  # between the two must not close this one again
    except OSError as exc:
        os.close(fd)
        raise _failure(exc, mount.target) from None
    except ToolFailure:
        os.close(fd)
        raise
    return fd


def _walk(place: Place, parts: Sequence[str]) -> int:
    fd = _open_source(place.mount)
    shown = place.mount.target
    try:
        for part in parts:
            shown = shown / part
            status = lstat_at(fd, part)
            if status is None:
                raise ToolFailure(errno.ENOENT, f"{shown} does not exist")
            if stat.S_ISLNK(status.st_mode):
                raise ToolFailure(
                    errno.ELOOP, f"{shown} is a symbolic link; links are never followed"
                )
            if not stat.S_ISDIR(status.st_mode):
                raise ToolFailure(errno.ENOTDIR, f"{shown} is not a directory")
            inner = os.open(part, _PLACE, dir_fd=fd)
            passed, fd = fd, inner  # rebound before the close: the cleanup after a Ctrl-C
            os.close(passed)  # between the two must not close this one again
    except OSError as exc:
        os.close(fd)
        raise _failure(exc, shown) from None
    except ToolFailure:
        os.close(fd)
        raise
    return fd


def _components(path: object) -> list[str]:
    if not isinstance(path, str) or not path:
        raise ToolFailure(errno.EINVAL, "a path must be a non-empty string", usage=True)
    if "\0" in path:
        raise ToolFailure(errno.EINVAL, "a path must not contain NUL", usage=True)
    # Before any mount is judged: a lone surrogate other than a byte escape ("\ud800") names
    # no file anywhere, and is EINVAL (toolio), not a path outside the agent's view.
    os.fsencode(path)
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ToolFailure(errno.EINVAL, f"{path!r}: '..' is not allowed in a path", usage=True)
    return parts


def _failure(exc: OSError, shown: PurePosixPath) -> ToolFailure:
    return ToolFailure(exc.errno or errno.EIO, f"{shown}: {exc.strerror}")
