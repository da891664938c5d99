"""An agent's mount table and what it can see through it (SPEC P-5 step 3, X-1, A-3).

``agent/<name>.d/mount`` is a JSON array of ``[source, target, "ro"|"rw"]`` triples: the host
path ``source`` appears at ``target`` in the agent's view, read-only or read-write.  The agent
sees only what lies under some target, so a host path is visible when some mount's source
holds it — unless a mount with a deeper target covers the spot where it would appear, as a
bind mount stacked on top does (the later of two mounts on one target wins, as in the kernel).
A mount is named in policy by the last component of its target: ``mount:workspace`` is the
mount at ``/workspace``.

Some targets are never a mount's: the directories the terminal's sandbox takes from the
system or makes itself (:data:`SYSTEM_TARGETS`) — the privilege drop that starts the agent's
shell runs as root inside the sandbox, through its ``/usr``, ``/etc`` and ``/lib`` — and
``/ctx``, the storage view, which only the storage root's own mount may take
(:func:`target_problem`).  A source is used only as the real path it was recorded as: one
whose path now runs through a symbolic link could lead anywhere the link's writer chose, so it
is never resolved again (:func:`source_problem`).

Pure but for :func:`source_problem`: sources are compared as given.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import NamedTuple

from cortexfs import jsontext
from cortexfs.errors import CtxError, invalid

MOUNT_MODES = ("ro", "rw")
CTX_TARGET = PurePosixPath("/ctx")
# What the sandbox binds from the system, mounts itself (/proc, /dev, tmpfs /run), or what a
# program run as root before the privilege drop may read; the rest of the usual system top
# level is refused alike, so no mount stands in for the system an agent's terminal runs on.
# /tmp is not among them: nothing run as root reads it, and a scratch directory there is an
# ordinary thing to mount where it is.
SYSTEM_TARGETS = tuple(
    PurePosixPath("/", name)
    for name in (
        "usr", "etc", "bin", "sbin", "lib", "lib32", "lib64", "libx32",
        "proc", "sys", "dev", "run", "var", "boot", "root",
    )
)  # fmt: skip


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
        table = jsontext.loads_text(data)
    except ValueError as exc:
        raise invalid(f"the mount table is not JSON: {exc}") from None
    if not isinstance(table, list):
        raise invalid("the mount table must be a JSON array of [source, target, mode] triples")
    return tuple(_parse_mount(number, entry) for number, entry in enumerate(table, start=1))


def parse_mount_entries(entries: list[object]) -> tuple[list[Mount], list[str]]:
    """The well-formed entries of a mount table given as a list, and why each other one is
    malformed: what asks for mounts (an agent request) is refused with every problem at once,
    where a recorded table is refused at its first (:func:`parse_mount_table`)."""
    mounts, problems = [], []
    for number, entry in enumerate(entries, start=1):
        try:
            mounts.append(_parse_mount(number, entry))
        except CtxError as exc:
            problems.append(exc.message)
    return mounts, problems


def target_problem(mount: Mount, storage_root: PurePosixPath, agent: str = "") -> str:
    """Why ``mount`` may not take its target, or "": at or above ``/``, at, under or above a
    directory of :data:`SYSTEM_TARGETS`, or at or under ``/ctx`` unless it is the mount of
    ``storage_root`` (a real path) at ``/ctx`` itself.  ``storage_root`` is empty
    (``PurePosixPath()``) for a mount asked for, not yet recorded: no source may take ``/ctx``
    then.  ``agent`` names the agent whose table it is, for the remedy."""
    target = mount.target
    if target == CTX_TARGET and _same_root(mount.source, storage_root):
        return ""
    table = f"agent/{agent}.d/mount" if agent else "the agent's mount table"
    if target == CTX_TARGET and at_or_below(mount.source, storage_root):
        return (
            f"the mount at {CTX_TARGET} names {mount.source}, a directory inside this storage "
            f"root {storage_root}, not the root itself: only the root may take {CTX_TARGET} "
            "(the agent's view of it already shows only what its policy grants); set its "
            f"source to {storage_root} in {table}"
        )
    if target == CTX_TARGET and storage_root != PurePosixPath():
        from cortexfs.fuse.mounts import cortexfs_mount_holding

        if cortexfs_mount_holding(Path(storage_root)) is not None:
            return (
                f"the mount at {CTX_TARGET} names the storage root {mount.source}, and this "
                f"root {storage_root} is a CortexFS mount ('ctx mount'): agents are judged "
                "and run on a storage root itself, never through a mount of it; name the "
                "root itself (--storage DIR or CTX_STORAGE)"
            )
        # What an agent's table holds after its storage root was moved or copied elsewhere:
        # the mount agent create recorded names the root as it was then.
        return (
            f"the mount at {CTX_TARGET} names another storage root ({mount.source}, not this "
            f"root {storage_root}): the agent was made for another root (one moved or copied "
            f"since); edit its source in {table}, or create the agent again"
        )
    if at_or_below(target, CTX_TARGET):
        return (
            f"mount target {target}: {CTX_TARGET} is the storage root's place (the agent's "
            "CortexFS view, mounted by the host); mount elsewhere"
        )
    if target == PurePosixPath("/"):
        return (
            "mount target /: a mount needs a directory below /, whose last part names it "
            "in policy (mount:<name>)"
        )
    for system in SYSTEM_TARGETS:
        if at_or_below(target, system):
            return (
                f"mount target {target}: {system} belongs to the system the agent's terminal "
                "runs on (its sandbox takes it from the host, or makes it); mount elsewhere"
            )
    return ""


def _same_root(source: PurePosixPath, storage_root: PurePosixPath) -> bool:
    """Whether ``source`` is ``storage_root``: by path, or as the same directory reached by
    another (a bind mount of the root, whose agents were made through the other path)."""
    if source == storage_root:
        return True
    if storage_root == PurePosixPath():
        return False
    try:
        return os.path.samefile(source, storage_root)
    except OSError:  # what cannot be looked at is not shown to be the root
        return False


def source_problem(mount: Mount) -> str:
    """Why ``mount``'s source may not be used, or "": it must still be the real path it was
    recorded as, with no symbolic link anywhere on it (one could since have been put there)."""
    real = os.path.realpath(mount.source)
    if real == str(mount.source):
        return ""
    return (
        f"mount source {mount.source}: its path runs through a symbolic link (it leads to "
        f"{real} now); a source is used only as the real path it was recorded as"
    )


def mount_problem(mount: Mount, storage_root: PurePosixPath, agent: str = "") -> str:
    """:func:`target_problem`, else :func:`source_problem`: why the mount is unusable, or "".
    ``storage_root`` is a real path its caller has just resolved, and a mount of it needs no
    second resolving of its source; or empty (``PurePosixPath()``) where no mount of the root
    counts as usable, as :func:`target_problem` says (the sandbox, which binds the root at
    ``/ctx`` itself)."""
    problem = target_problem(mount, storage_root, agent)
    if problem or (mount.target == CTX_TARGET and mount.source == storage_root):
        return problem
    if mount.target != CTX_TARGET and _same_root(mount.source, storage_root):
        return whole_root_problem(mount.source)
    return source_problem(mount)


def whole_root_problem(source: PurePosixPath | str) -> str:
    """Why the storage root itself may be mounted nowhere but ``/ctx``: raw, it shows every
    agent's controls and sessions and every space, past the filtered view an agent is given
    of it (T-5) — and a terminal's sandbox would bind it as it is."""
    return (
        f"mount source {source}: it is the storage root, which an agent sees only through its "
        f"view at {CTX_TARGET} (T-5); mount a directory of it instead"
    )


def granted_mounts(mounts: Sequence[Mount], allows: Callable[[str, str], bool]) -> list[Mount]:
    """The mounts the agent's policy lets it see (P-5 step 3): those granted
    ``mount:<name> read``, writable only where the table says ``rw`` and the policy grants
    ``mount:<name> write``.  ``allows(name, permission)`` asks the agent's policy.  Two mounts
    of one name are neither: a rule naming it could not say which it grants."""
    names = Counter(mount.name for mount in mounts)
    granted = []
    for mount in mounts:
        if names[mount.name] > 1 or not allows(mount.name, "read"):
            continue
        writable = mount.writable and allows(mount.name, "write")
        granted.append(Mount(mount.source, mount.target, writable))
    return granted


def mounts_named(mounts: Sequence[Mount], name: str) -> list[Mount]:
    return [mount for mount in mounts if mount.name == name]


def views_of(mounts: Sequence[Mount], host_path: PurePosixPath) -> list[View]:
    """Every place the agent can actually reach ``host_path``, in mount-table order."""
    views = []
    for mount in mounts:
        if not at_or_below(host_path, mount.source):
            continue
        view = mount.target.joinpath(*host_path.parts[len(mount.source.parts) :])
        if _topmost_mount(mounts, view) is mount:
            views.append(View(view, mount))
    return views


def _topmost_mount(mounts: Sequence[Mount], view: PurePosixPath) -> Mount | None:
    """The mount that shows ``view``: the deepest target above it, the later one on a tie."""
    topmost: Mount | None = None
    for mount in mounts:
        if not at_or_below(view, mount.target):
            continue
        if topmost is None or len(mount.target.parts) >= len(topmost.target.parts):
            topmost = mount
    return topmost


def at_or_below(path: PurePosixPath, top: PurePosixPath) -> bool:
    """Whether ``path`` is ``top`` or lies below it, component by component: for the absolute,
    normalised paths of a mount table, ``path == top or top in path.parents`` without making
    a path object of each parent (the chain asks this for every mount at every call).  A
    ``top`` with no parts (``.``, the empty path) has nothing below it: never "everything"."""
    return bool(top.parts) and path.parts[: len(top.parts)] == top.parts


def _parse_mount(number: int, entry: object) -> Mount:
    where = f"mount entry {number}"
    if not (isinstance(entry, list) and len(entry) == 3):
        raise invalid(
            f"{where} must be a [source, target, mode] triple, not {jsontext.spelt(entry)}"
        )
    source, target, mode = entry
    if mode not in MOUNT_MODES:
        raise invalid(f"{where}: mode {mode!r} must be 'ro' or 'rw'")
    return Mount(
        _absolute(where, "source", source), _absolute(where, "target", target), mode == "rw"
    )


def _absolute(where: str, role: str, path: object) -> PurePosixPath:
    if not isinstance(path, str) or not path.startswith("/") or "\0" in path:
        raise invalid(f"{where}: the {role} must be an absolute path, not {path!r}")
    try:
        path.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as exc:
        # JSON can spell a surrogate that stands for no byte ("\ud800"), so for no path: the
        # kernel could not be given it.  One of \udc80 to \udcff is a byte of a name that
        # is not UTF-8, as a table written from such a path holds it.
        raise invalid(
            f"{where}: the {role} {path!r} holds {path[exc.start]!r}, a lone surrogate that "
            "stands for no byte, which no path can hold"
        ) from None
    parts = [part for part in path.split("/") if part]
    if any(part in (".", "..") for part in parts):
        raise invalid(f"{where}: the {role} {path!r} must not contain '.' or '..'")
    return PurePosixPath("/", *parts)
