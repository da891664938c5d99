"""The modes of the session directories of a shared space, for the spaces older versions made
(SPEC S-6, X-1).

A shared session is made :data:`~cortexfs.shared.sessions.SHARED_MODE` (03770) at every level
below the space's ``agent/`` — ``agent/<agent>/``, its ``session/`` and each session — setgid and
sticky: the space's members write in it, and none renames or removes what the agent made.
Versions before the sticky bit made them 02770, and making a session keeps what exists, so a
member of an old space could rename another agent's sessions.  ``ctx shared create NAME
--group G`` gives them the bits of that mode that protect them, :data:`PROTECTIVE_BITS`
(:func:`check_session_modes`, then :func:`repair_session_modes`): a read, write or search
bit an agent took away is its choice, and is not given back.  ``ctx bootstrap`` names the
spaces that need it.

Every level is opened relative to its parent's descriptor without following a link (members
may plant one anywhere in the space), one level at a time
(:func:`~cortexfs.shared.level_walk.walk_levels`), and the mode is changed through that
descriptor: only what is there, and only directories.  They belong to the agents' uids: root
changes them all, anyone else only their own.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from cortexfs import durable
from cortexfs.errors import CtxError
from cortexfs.shared.level_walk import SESSION_LEVELS, open_child_directory, walk_levels
from cortexfs.shared.sessions import SHARED_MODE

# Sticky: members never rename or remove the agent's entries; setgid: what is made inside
# keeps the space's group.
PROTECTIVE_BITS = SHARED_MODE & (stat.S_ISVTX | stat.S_ISGID)


def protected(mode: int) -> int:
    """``mode`` with :data:`PROTECTIVE_BITS`: what a session directory of that mode is given
    (02770, which older versions made, becomes :data:`SHARED_MODE`)."""
    return mode | PROTECTIVE_BITS


def session_directories(space: Path) -> Iterator[tuple[int, Path]]:
    """``(descriptor, path)`` of each ``agent/<agent>/``, ``agent/<agent>/session/`` and
    session of the space at ``space``, parents first, each open until the walk goes on past
    what is below it.  Nothing is yielded below a link or what is not a directory; a space
    without ``agent/`` yields nothing."""
    space_fd = open_child_directory(str(space.parent), space.name)
    if space_fd is None:
        return
    try:
        with contextlib.closing(walk_levels(space_fd, SESSION_LEVELS)) as levels:
            for fd, names in levels:
                if len(names) > 1:  # agent/ itself is the space's, made with its modes
                    yield fd, space.joinpath(*names)
    finally:
        os.close(space_fd)


def check_session_modes(space: Path) -> None:
    """EPERM naming the first session directory of the space at ``space`` that lacks one of
    :data:`PROTECTIVE_BITS` and that the caller, neither root nor its owner, may not change:
    asked before anything of the space is changed, which then stays as it was."""
    if os.geteuid() == 0:
        return
    for fd, path in session_directories(space):
        status = os.fstat(fd)
        mode = stat.S_IMODE(status.st_mode)
        if protected(mode) != mode and status.st_uid != os.geteuid():
            raise CtxError(
                errno.EPERM,
                f"{path} belongs to uid {status.st_uid} and has mode {mode:04o}, not "
                f"{protected(mode):04o} (sticky: members never rename or remove the agent's "
                "sessions); only root or its owner may change it; nothing was changed (have "
                "root run the command)",
            )


def repair_session_modes(ops: durable.FsOps, space: Path) -> list[str]:
    """Give each session directory of the space at ``space`` the :data:`PROTECTIVE_BITS` it
    lacks through its descriptor, the change durable before it is reported: ``"PATH (mode
    2770 -> 3770)"`` for each one changed.  Nothing is held open beyond the walk's own
    levels, however many sessions the space has."""
    changed = []
    for fd, path in session_directories(space):
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if protected(mode) != mode:
            ops.fchmod(fd, protected(mode))
            durable.sync_dir(ops, fd)
            changed.append(f"{path} (mode {mode:04o} -> {protected(mode):04o})")
    return changed
