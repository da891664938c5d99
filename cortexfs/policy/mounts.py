"""An agent's mount table and what it can see through it (SPEC P-5 step 3, X-1, A-3).

``agent/<name>.d/mount`` is a JSON array of ``[source, target, "ro"|"rw"]`` triples: the host
path ``source`` appears at ``target`` in the agent's view, read-only or read-write.  The agent
sees only what lies under some target, so a host path is visible when some mount's source
holds it — unless a mount with a deeper target covers the spot where it would appear, as a
bind mount stacked on top does (the later of two mounts on one target wins, as in the kernel).
A mount is named in policy by the last component of its target: ``mount:workspace`` is the
mount at ``/workspace``.

Pure: sources are compared as given, so the caller resolves them to real paths first.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import PurePosixPath
from typing import NamedTuple

from cortexfs.errors import invalid

MOUNT_MODES = ("ro", "rw")


class Mount(NamedTuple):
    source: PurePosixPath
    target: PurePosixPath
    writable: bool

    @property
    def name(self) -> str:
        return self.target.name

    def __str__(self) -> str:
        return f"{self.source} -> {self.target} ({'rw' if self.writable else 'ro'})"


class View(NamedTuple):
    """Where the agent sees a host path, and through which mount."""

    path: PurePosixPath
    mount: Mount


def parse_mount_table(data: bytes) -> tuple[Mount, ...]:
    """The mounts of a mount control; EINVAL naming the first malformed entry."""
    try:
        table = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise invalid(f"the mount table is not JSON: {exc}") from None
    if not isinstance(table, list):
        raise invalid("the mount table must be a JSON array of [source, target, mode] triples")
    return tuple(_parse_mount(number, entry) for number, entry in enumerate(table, start=1))


def mounts_named(mounts: Sequence[Mount], name: str) -> list[Mount]:
    return [mount for mount in mounts if mount.name == name]


def views_of(mounts: Sequence[Mount], host_path: PurePosixPath) -> list[View]:
    """Every place the agent can actually reach ``host_path``, in mount-table order."""
    views = []
    for mount in mounts:
        if host_path != mount.source and mount.source not in host_path.parents:
            continue
        view = mount.target / host_path.relative_to(mount.source)
        if _topmost_mount(mounts, view) is mount:
            views.append(View(view, mount))
    return views


def _topmost_mount(mounts: Sequence[Mount], view: PurePosixPath) -> Mount | None:
    """The mount that shows ``view``: the deepest target above it, the later one on a tie."""
    topmost: Mount | None = None
    for mount in mounts:
        if view != mount.target and mount.target not in view.parents:
            continue
        if topmost is None or len(mount.target.parts) >= len(topmost.target.parts):
            topmost = mount
    return topmost


def _parse_mount(number: int, entry: object) -> Mount:
    where = f"mount entry {number}"
    if not (isinstance(entry, list) and len(entry) == 3):
        raise invalid(f"{where} must be a [source, target, mode] triple, not {entry!r}")
    source, target, mode = entry
    if mode not in MOUNT_MODES:
        raise invalid(f"{where}: mode {mode!r} must be 'ro' or 'rw'")
    return Mount(
        _absolute(where, "source", source), _absolute(where, "target", target), mode == "rw"
    )


def _absolute(where: str, role: str, path: object) -> PurePosixPath:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise invalid(f"{where}: the {role} must be an absolute path, not {path!r}")
    parts = [part for part in path.split("/") if part]
    if any(part in (".", "..") for part in parts):
        raise invalid(f"{where}: the {role} {path!r} must not contain '.' or '..'")
    return PurePosixPath("/", *parts)
