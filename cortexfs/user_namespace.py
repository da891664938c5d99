"""What uid 0 of a user namespace may not do, whatever capabilities it holds there.

A rootless container (podman, ``unshare --map-root-user``) runs its root in a user namespace
that maps a range of ids onto ids outside it.  An id its maps leave out names nobody there:
``chown`` to it is EINVAL, a file owned by it shows as the overflow uid (65534) and no
capability of the namespace applies to it.  And ``/proc/self/setgroups`` may say ``deny``,
which refuses the change of groups that running a tool as an agent needs.  These helpers read
the maps, so that a command refuses before it makes anything, naming the namespace, rather
than halfway with a bare EINVAL or EPERM, or with advice ("run it as root") that cannot help.
"""

from __future__ import annotations

import errno

from cortexfs.errors import CtxError

# The map of the initial user namespace: every id is itself.
_WHOLE = [(0, 0, 4294967295)]


def _ranges(kind: str) -> list[tuple[int, int, int]]:
    """``/proc/self/{uid,gid}_map`` as (inside, outside, length) ranges; the whole map when
    it cannot be read (a kernel without user namespaces)."""
    try:
        with open(f"/proc/self/{kind}_map", encoding="ascii") as lines:
            ranges = [tuple(int(word) for word in line.split()) for line in lines]
    except (OSError, ValueError):
        return _WHOLE
    return [r for r in ranges if len(r) == 3] or _WHOLE  # type: ignore[misc]


def in_a_user_namespace() -> bool:
    """Whether this process's user namespace maps less than every uid onto itself."""
    return _ranges("uid") != _WHOLE


def maps(kind: str, number: int) -> bool:
    """Whether this user namespace maps uid (``kind`` "uid") or gid ("gid") ``number``."""
    return any(inside <= number < inside + length for inside, _, length in _ranges(kind))


def overflow_uid() -> int:
    """The uid a file owned by an id this namespace does not map shows (65534 by default)."""
    try:
        with open("/proc/sys/kernel/overflowuid", encoding="ascii") as value:
            return int(value.read())
    except (OSError, ValueError):
        return 65534


def setgroups_denied() -> bool:
    """Whether ``setgroups`` is refused in this user namespace (``/proc/self/setgroups``)."""
    try:
        with open("/proc/self/setgroups", encoding="ascii") as value:
            return value.read().strip() == "deny"
    except OSError:
        return False


def require_mapped(action: str, uid: int = -1, gid: int = -1) -> None:
    """EINVAL for ``action`` (before it makes anything) when this user namespace maps not
    ``uid`` or ``gid`` (-1: no change of it), which no file here may then be given."""
    missing = [
        f"{kind} {number}"
        for kind, number in (("uid", uid), ("gid", gid))
        if number != -1 and not maps(kind, number)
    ]
    if missing:
        raise CtxError(
            errno.EINVAL,
            f"cannot {action}: this user namespace maps no {' and no '.join(missing)} (see "
            "/proc/self/uid_map and gid_map), so nothing here may be given to it; nothing was "
            "made: run it where those ids exist, or use ids mapped here",
        )


def unmapped_owner(owner: int) -> str | None:
    """Why uid 0 of this user namespace may not act on a file whose owner shows as ``owner``:
    the overflow uid of a user namespace is an owner it does not map, to which none of its
    capabilities apply; None otherwise."""
    if owner != overflow_uid() or not in_a_user_namespace() or maps("uid", owner):
        return None
    return (
        f"uid {owner} stands for an owner this user namespace does not map, and no capability "
        "held in the namespace applies to its files: run it outside the namespace (as that "
        "owner, or as the host's root), or use a storage root of ids mapped here"
    )


def require_setgroups(action: str) -> None:
    """EPERM for ``action`` (a root starting a tool as an agent) where setgroups is denied: a
    tool is started with the agent's groups only, which it cannot be given then."""
    if not setgroups_denied():
        return
    raise CtxError(
        errno.EPERM,
        f"cannot {action}: this user namespace denies setgroups (/proc/self/setgroups says "
        "'deny'), and a tool runs with the agent's groups only; run it where setgroups is "
        "allowed (a namespace whose maps were written by newuidmap, or outside it)",
    )
