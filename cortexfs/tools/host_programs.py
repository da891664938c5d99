"""Finding the host programs a tool is started through (setpriv, unshare) on ``PATH``, and
what setpriv would make of an agent's ids.

This is ``shutil.which`` for a bare program name, written out because the runner is imported
by every ``ctx run``: shutil loads zlib, bz2 and lzma when it is imported, a few milliseconds
of every tool call spent on modules the call never uses.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cortexfs.policy import Identity


def find_program(name: str) -> str | None:
    """What ``shutil.which(name)`` answers for a name without a directory: the first entry of
    ``PATH`` (of ``confstr("CS_PATH")`` when PATH is not set; none when it is empty) holding
    ``name`` as an executable that is not a directory, joined to that entry; else None."""
    search = os.environ.get("PATH")
    if search is None:
        try:
            search = os.confstr("CS_PATH")
        except (AttributeError, ValueError):  # no confstr, or no CS_PATH, on this system
            search = os.defpath
    if not search:
        return None
    for directory in dict.fromkeys(search.split(os.pathsep)):
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.F_OK | os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def names_setpriv_misreads(identity: Identity) -> list[str]:
    """The users and groups whose names setpriv(1) would take for ``identity``'s ids, in
    words; empty when it switches to exactly those ids.

    setpriv looks each ``--reuid``, ``--regid`` and ``--groups`` value up as a user or group
    *name* first and reads it as a number only when there is no such name: with a group named
    ``1001`` whose gid is 5000, ``--regid=1001`` switches to gid 5000.  Only root makes such
    names, and directories of users and groups may hold them.  Two or three lookups in the
    user and group databases (tens of microseconds), asked on each call: the databases may
    change between calls.
    """
    found = []
    with contextlib.suppress(KeyError):
        user = pwd.getpwnam(str(identity.uid))
        if user.pw_uid != identity.uid:
            found.append(f"the user named {user.pw_name} is uid {user.pw_uid}, not {identity.uid}")
    for gid in sorted({identity.gid, *identity.groups}):
        with contextlib.suppress(KeyError):
            group = grp.getgrnam(str(gid))
            if group.gr_gid != gid:
                found.append(f"the group named {group.gr_name} is gid {group.gr_gid}, not {gid}")
    return found
