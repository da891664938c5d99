"""This process's mount table, ``/proc/self/mountinfo`` (proc(5)): what is mounted where.

Bind mounts of one filesystem share its device number, and a mount may hide another at the
same point, so only the table tells which mount holds a path and with what options.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

MOUNT_TABLE = Path("/proc/self/mountinfo")


class Mount(NamedTuple):
    device: str  # major:minor
    mount_point: str
    filesystem_type: str
    options: str  # the filesystem's own (super) options


def mounts() -> Iterator[Mount]:
    """The lines of the table, in order: a later mount at a point lies over an earlier one
    (the optional fields end at the lone ``-`` before the filesystem type)."""
    for line in MOUNT_TABLE.read_bytes().splitlines():
        fields = line.split(b" ")
        kind = fields.index(b"-") + 1
        yield Mount(
            os.fsdecode(fields[2]),
            _unescaped(fields[4]),
            os.fsdecode(fields[kind]),
            os.fsdecode(fields[kind + 2]),
        )


def mount_point_of(path: Path) -> str | None:
    """Where the filesystem holding ``path`` is mounted: the deepest mount point above its
    resolved path, the last mounted there; None when the table cannot be read."""
    mount = mount_holding(path)
    return None if mount is None else mount.mount_point


def mount_holding(path: Path) -> Mount | None:
    """The mount that holds ``path``: the one at the deepest mount point above its resolved
    path, the last mounted there; None when the table cannot be read."""
    target = os.path.realpath(path)
    deepest = None
    try:
        for mount in mounts():
            point = mount.mount_point
            inside = target == point or target.startswith(point.rstrip("/") + "/")
            if inside and (deepest is None or len(point) >= len(deepest.mount_point)):
                deepest = mount
    except OSError:
        return None
    return deepest


def _unescaped(field: bytes) -> str:
    """A path field, whose space, tab, newline and backslash are octal escapes (``\\040``)."""
    return os.fsdecode(re.sub(rb"\\([0-7]{3})", lambda octal: bytes([int(octal[1], 8)]), field))
