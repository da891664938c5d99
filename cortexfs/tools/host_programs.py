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
import stat
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from cortexfs.policy import Identity


def find_program(name: str) -> str | None:
    """What ``shutil.which(name)`` answers for a name without a directory, among the trusted
    entries of ``PATH`` (of ``confstr("CS_PATH")`` when PATH is not set; none when it is
    empty): the first holding ``name`` as an executable that is not a directory, joined to
    that entry; else None.

    These programs run as the caller — root, for a call as an agent — before the switch to
    the agent's ids: an entry that is not absolute (``.``, an empty one) names whatever
    directory the caller stands in, an agent's workspace say, and is skipped; so, for root,
    is a program that another uid owns or may replace (it or its directory writable by
    group or others, as ``sudo``'s secure path would not have it)."""
    search = os.environ.get("PATH")
    if search is None:
        try:
            search = os.confstr("CS_PATH")
        except (AttributeError, ValueError):  # no confstr, or no CS_PATH, on this system
            search = os.defpath
    if not search:
        return None
    for directory in dict.fromkeys(search.split(os.pathsep)):
        if not os.path.isabs(directory):
            continue
        candidate = os.path.join(directory, name)
        if not (os.access(candidate, os.F_OK | os.X_OK) and not os.path.isdir(candidate)):
            continue
        if os.geteuid() != 0 or _only_root_may_replace(directory, candidate):
            return candidate
    return None


def _only_root_may_replace(directory: str, program: str) -> bool:
    """Whether ``program`` and ``directory``, links followed, are root's and writable by no
    one else (a sticky directory, such as /tmp, still lets others plant names), and so is
    each directory above: one that another uid may write could have root's directory renamed
    away and another put in its place — but for a sticky one (/tmp), where only the owner of
    an entry, root here, may rename it."""
    for path in (program, directory):
        try:
            status = os.stat(path)
        except OSError:
            return False
        if status.st_uid != 0 or status.st_mode & 0o022:
            return False
    above = os.path.dirname(os.path.realpath(directory))
    while True:
        try:
            status = os.stat(above)
        except OSError:
            return False
        if status.st_uid != 0 or (status.st_mode & 0o022 and not status.st_mode & stat.S_ISVTX):
            return False
        if above == "/":
            return True
        above = os.path.dirname(above)


def setpriv_id_options(identity: Identity) -> list[str] | None:
    """The ``--reuid``, ``--regid`` and ``--groups`` (or ``--clear-groups``) options under
    which setpriv(1) switches to exactly ``identity``'s ids; None when one of the ids cannot be
    spelt for it: it has no name of its own and its number is the name of another.

    setpriv looks each value up as a user or group *name* first and reads it as a number only
    when there is no such name (see :func:`names_setpriv_misreads`).  So an id is given by its
    own name where it has one that looks back up to it, else by its number where no name reads
    otherwise.  The name is also the cheaper spelling: a number has no entry in the host's
    files, so setpriv would ask every other source of the user database for it (on Debian,
    loading systemd's NSS module and its libraries, about a millisecond of every call).  A few
    lookups (tens of microseconds), asked on each call: the databases may change between calls.
    """
    user = _spelling(identity.uid, _USERS)
    group = _spelling(identity.gid, _GROUPS)
    listed = [_spelling(gid, _GROUPS) for gid in sorted(identity.groups)]
    if user is None or group is None or None in listed:
        return None
    return [
        f"--reuid={user}",
        f"--regid={group}",
        f"--groups={','.join(str(name) for name in listed)}" if listed else "--clear-groups",
    ]


def names_setpriv_misreads(identity: Identity) -> list[str]:
    """The users and groups whose names setpriv(1) would take for ``identity``'s ids given as
    numbers (as the terminal's sandbox gives them, where the names of other sources of the
    user database may not be reachable), in words; empty when it switches to exactly those ids.

    setpriv looks each ``--reuid``, ``--regid`` and ``--groups`` value up as a user or group
    *name* first and reads it as a number only when there is no such name: with a group named
    ``1001`` whose gid is 5000, ``--regid=1001`` switches to gid 5000.  Only root makes such
    names, and directories of users and groups may hold them."""
    numbers = [(identity.uid, _USERS)]
    numbers += [(gid, _GROUPS) for gid in sorted({identity.gid, *identity.groups})]
    found = [_number_misread(number, names) for number, names in numbers]
    return [problem for problem in found if problem is not None]


class _Names(NamedTuple):
    kind: str  # "user" or "group"
    id_kind: str  # "uid" or "gid"
    name_of: Callable[[int], str]  # KeyError when the id has no name
    id_of: Callable[[str], int]  # KeyError when no entry has the name


_USERS = _Names(
    "user", "uid", lambda uid: pwd.getpwuid(uid).pw_name, lambda name: pwd.getpwnam(name).pw_uid
)
_GROUPS = _Names(
    "group", "gid", lambda gid: grp.getgrgid(gid).gr_name, lambda name: grp.getgrnam(name).gr_gid
)


def _spelling(number: int, names: _Names) -> str | None:
    """What setpriv reads as the id ``number``: its own name, else the number; None when
    neither would do."""
    with contextlib.suppress(KeyError):
        name = names.name_of(number)
        # A comma would split --groups; a name that looks up to another id is a duplicate.
        if name and "," not in name and names.id_of(name) == number:
            return name
    return None if _number_misread(number, names) else str(number)


def _number_misread(number: int, names: _Names) -> str | None:
    """Why setpriv would not read ``number`` as that id, in words; None when it would."""
    try:
        stand_in = names.id_of(str(number))
    except KeyError:
        return None
    if stand_in == number:
        return None
    return f"the {names.kind} named {number} is {names.id_kind} {stand_in}, not {number}"
