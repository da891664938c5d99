"""Which of root's capabilities this process holds (capabilities(7)).

A root in a container, or under a hardened service unit, holds only part of them: Docker's
default set has no ``CAP_SYS_ADMIN`` or ``CAP_NET_ADMIN``, and a unit may drop
``CAP_SETUID``, ``CAP_CHOWN`` or ``CAP_FSETID`` as well.  What CortexFS does as root on
others' behalf needs its own: running a tool under an agent's uid and gid, giving a
directory to an agent or a space's group, keeping a space's setgid bits.  Asked before
anything is made or run, so that a root without them is refused with the capability named,
never halfway through (a directory made and left root's, a job claimed and failed for a tool
that never ran).
"""

from __future__ import annotations

import errno
import functools
import os

from cortexfs.errors import CtxError

# The numbers of linux/capability.h this module asks about.
CAP_CHOWN = 0
CAP_DAC_OVERRIDE = 1
CAP_FOWNER = 3
CAP_FSETID = 4
CAP_SETGID = 6
CAP_SETUID = 7
CAP_NET_ADMIN = 12
CAP_SYS_PTRACE = 19
CAP_SYS_ADMIN = 21

_NAMES = {
    CAP_CHOWN: "CAP_CHOWN",
    CAP_DAC_OVERRIDE: "CAP_DAC_OVERRIDE",
    CAP_FOWNER: "CAP_FOWNER",
    CAP_FSETID: "CAP_FSETID",
    CAP_SETGID: "CAP_SETGID",
    CAP_SETUID: "CAP_SETUID",
    CAP_NET_ADMIN: "CAP_NET_ADMIN",
    CAP_SYS_PTRACE: "CAP_SYS_PTRACE",
    CAP_SYS_ADMIN: "CAP_SYS_ADMIN",
}


def _effective() -> int | None:
    """This process's effective set, from ``CapEff`` of /proc/self/status; None when it cannot
    be read (no /proc), when nothing is refused on its account."""
    return _effective_as(os.geteuid())


@functools.cache
def _effective_as(euid: int) -> int | None:
    """:func:`_effective`, read once for each effective uid: the kernel clears the effective
    set when the effective uid leaves 0 and gives it back on the return (a process acting
    for another uid for a while, ``seteuid``), so a set read under one uid is not another's."""
    field = _status_field("CapEff")
    try:
        return None if field is None else int(field, 16)
    except ValueError:
        return None


def no_new_privs() -> bool:
    """Whether this process may gain no privilege by exec (``NoNewPrivs: 1``: systemd's
    NoNewPrivileges=, ``setpriv --no-new-privs``), under which setuid programs run without
    theirs."""
    return _status_field("NoNewPrivs") == "1"


def _status_field(name: str) -> str | None:
    """The value of field ``name`` of /proc/self/status; None when it is not there or the
    file cannot be read."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key == name:
                    return value.strip()
    except OSError:
        return None
    return None


def lacking(*capabilities: int) -> list[str]:
    """The names of ``capabilities`` this root does not hold (none for a process that is not
    root, whose rights are its uid's, or whose set cannot be read)."""
    held = _effective()
    if os.geteuid() != 0 or held is None:
        return []
    return [_NAMES[cap] for cap in capabilities if not held >> cap & 1]


def root_without(capability: int) -> str | None:
    """For a refusal the kernel gave root: what to say instead of "run it as root" when this
    root lacks ``capability`` (which would have let it through), else None."""
    missing = lacking(capability)
    if not missing:
        return None
    return (
        f"this root lacks {missing[0]} (a container's or a service unit's capability set "
        "leaves it out): run as a root that holds it, or as the owner"
    )


def require(doing: str, *capabilities: int) -> None:
    """EPERM naming the capabilities of ``capabilities`` this root lacks for ``doing``."""
    missing = lacking(*capabilities)
    if missing:
        raise CtxError(
            errno.EPERM,
            f"{doing} needs {' and '.join(missing)}, which this root does not hold (a "
            "container's or a service unit's capability set leaves it out); nothing was "
            "done: run as a root that holds it (e.g. docker run --cap-add "
            f"{missing[0].removeprefix('CAP_')})",
        )
