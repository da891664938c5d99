"""The walk of a session's levels below a home or a shared space, through descriptors (SPEC
S-1, S-6).

A home or a space belongs to users, who may plant a symbolic link, a FIFO, a hard link or a
directory tree of any size and depth in it.  What root changes there (a session's mode) is
reached level by level, each level either one name (``agent``, ``session``) or every entry
of the level above (:data:`EVERY`: each agent, each session), so nothing outside a session's
path (:data:`SESSION_LEVELS`) is visited.  Each directory is opened relative to its parent's
descriptor with ``O_NOFOLLOW | O_DIRECTORY`` only when it is visited, depth first, and closed
before its next sibling is opened: the descriptors held at once are one per level, however
many entries a level has (a level of 25 000 sessions holds one).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Sequence

DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
EVERY = None  # a level made of every entry of the level above
# agent/<agent>/session/<session>/, below a home/<uid>/ or a shared/<space>/.
SESSION_LEVELS: tuple[str | None, ...] = ("agent", EVERY, "session", EVERY)


def open_directory(dir_fd: int, name: str) -> int | None:
    """``name`` in ``dir_fd`` opened as a directory, never through a link; None when it is
    missing, a link or anything but a directory (a FIFO is not waited on)."""
    try:
        return os.open(name, DIRECTORY_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise


def open_child_directory(parent: str, name: str) -> int | None:
    """``parent/name`` opened as :func:`open_directory` opens ``name``: ``parent`` is reached
    as the commands reach it (its own last name not through a link), ``name`` never through
    one; None as there."""
    parent_fd = os.open(parent, DIRECTORY_FLAGS)
    try:
        return open_directory(parent_fd, name)
    finally:
        os.close(parent_fd)


def walk_levels(
    top_fd: int, levels: Sequence[str | None] = SESSION_LEVELS
) -> Iterator[tuple[int, tuple[str, ...]]]:
    """``(descriptor, names below top)`` of each directory at ``levels`` below the directory
    open as ``top_fd``, parents first, each level in name order.  A descriptor is open until
    the walk goes on past what is below it: use it before asking for the next.  What is
    missing, a link or not a directory is not yielded, nor anything below it."""
    yield from _walk(top_fd, levels, ())


def _walk(
    dir_fd: int, levels: Sequence[str | None], above: tuple[str, ...]
) -> Iterator[tuple[int, tuple[str, ...]]]:
    # ``yield from`` all the way down: a walk closed early closes every level's descriptor.
    if not levels:
        return
    level, below = levels[0], levels[1:]
    names = sorted(os.listdir(dir_fd)) if level is EVERY else [level]
    for name in names:
        fd = open_directory(dir_fd, name)
        if fd is None:
            continue
        try:
            yield fd, (*above, name)
            yield from _walk(fd, below, (*above, name))
        finally:
            os.close(fd)
