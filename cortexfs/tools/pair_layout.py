"""What an object pair looks like, and what may stand in the way of installing one.

A pair is the entry ``<name>`` (an executable file) and its control directory ``<name>.d/``
(T-1, A-3).  A :class:`PairKind` says which controls each version of one kind of object brings
and which it keeps; :mod:`cortexfs.tools.pairs` installs and repairs pairs of any kind.

Anything found where an install would write that an install did not write — a directory
where the entry belongs, a file where the control directory belongs, a link or a device in
place of a control — is an :class:`Obstacle`: never ours to replace (R-5, never destroy user
data), so the install is refused with nothing changed.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from cortexfs import durable

CONTROLS_SUFFIX = ".d"


@dataclass(frozen=True)
class PairKind:
    """What every object of one kind shares, so that a repair can finish any install of it.

    ``defined`` names the controls each version brings (they always replace the previous
    version's); every other entry of the previous control directory — its local state, such
    as a tool's policy, log and hooks — carries over.  ``defaults`` fill what is still missing
    after that, ``directories`` are created when missing, ``modes`` gives a control's mode
    (0644 otherwise).  ``host_written`` names the controls the host administrator (the storage
    root's owner) writes to while the object is used, such as a log every call is recorded
    in: one that root makes in a storage root another uid owns is given to that uid
    (:func:`cortexfs.tools.pairs.install_pair`), or else that uid could not record a call.
    """

    defined: frozenset[str]
    defaults: Mapping[str, bytes] = field(default_factory=dict)
    directories: Sequence[str] = ()
    modes: Mapping[str, int] = field(default_factory=dict)
    host_written: frozenset[str] = frozenset()


class Obstacle(NamedTuple):
    """Something that is not ours where an install would write: ``path`` (relative to the
    tier directory) is ``found``, where ``expected`` belongs."""

    errno: int
    path: str
    found: str
    expected: str

    def sentence(self) -> str:
        return f"{self.path} is {self.found}, not {self.expected}"


def obstacles(directory: Path, name: str, kind: PairKind) -> list[Obstacle]:
    """What stands where an install of ``name`` would write and is not ours to replace."""
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return []
    try:
        return obstacles_at(dir_fd, name, kind)
    finally:
        os.close(dir_fd)


def obstacles_at(dir_fd: int, name: str, kind: PairKind) -> list[Obstacle]:
    controls = name + CONTROLS_SUFFIX
    found = []
    entry = durable.lstat_at(dir_fd, name)
    if entry is not None and not stat.S_ISREG(entry.st_mode):
        found.append(_obstacle(name, entry, "an executable file"))
    status = durable.lstat_at(dir_fd, controls)
    if status is None:
        return found
    if not stat.S_ISDIR(status.st_mode):
        return [*found, _obstacle(controls, status, "a control directory")]
    controls_fd = os.open(controls, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        # The controls a version brings, and those carried over from the previous one (a
        # policy that is a directory would be carried over as it is, damaged for good).
        for control in sorted(kind.defined | kind.defaults.keys()):
            status = durable.lstat_at(controls_fd, control)
            if status is not None and not stat.S_ISREG(status.st_mode):
                where = f"{controls}/{control}"
                found.append(_obstacle(where, status, "a control file"))
        for directory in _with_parents(kind.directories):
            status = _lstat_path(controls_fd, directory)
            if status is not None and not stat.S_ISDIR(status.st_mode):
                where = f"{controls}/{directory}"
                found.append(_obstacle(where, status, "a directory"))
    finally:
        os.close(controls_fd)
    return found


def _obstacle(path: str, status: os.stat_result, expected: str) -> Obstacle:
    """EISDIR for a directory where a file belongs, ENOTDIR for a file where a directory
    belongs, EEXIST for a symlink or a special file in either place."""
    if stat.S_ISDIR(status.st_mode):
        return Obstacle(errno.EISDIR, path, "a directory", expected)
    if stat.S_ISLNK(status.st_mode):
        return Obstacle(errno.EEXIST, path, "a symbolic link", expected)
    if stat.S_ISREG(status.st_mode):
        return Obstacle(errno.ENOTDIR, path, "a file", expected)
    return Obstacle(errno.EEXIST, path, "a special file", expected)


def _with_parents(directories: Sequence[str]) -> list[str]:
    """``hooks/pre.d`` and its parent ``hooks``, parents first, each once."""
    every: dict[str, None] = {}
    for directory in directories:
        parts = directory.split("/")
        for depth in range(1, len(parts) + 1):
            every["/".join(parts[:depth])] = None
    return list(every)


def _lstat_path(dir_fd: int, relative: str) -> os.stat_result | None:
    """The status of ``relative`` under ``dir_fd``; None when it (or a parent) is absent or a
    parent is not a directory (that parent is reported on its own)."""
    try:
        return os.stat(relative, dir_fd=dir_fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return None
