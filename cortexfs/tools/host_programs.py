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
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

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


def setpriv_id_options(identity: Identity) -> list[str] | None:
    """The ``--reuid``, ``--regid`` and ``--groups`` (or ``--clear-groups``) options under
    which setpriv(1) switches to exactly ``identity``'s ids; None when one of the ids cannot be
    spelt for it (:func:`names_setpriv_misreads` says which).

    setpriv looks each value up as a user or group *name* first and reads it as a number only
    when there is no such name: with a group named ``1001`` whose gid is 5000, ``--regid=1001``
    switches to gid 5000.  So an id is given by its own name where it has one that looks back
    up to it, else by its number where no name reads otherwise.  The name is also the cheaper
    spelling: a number has no entry in the host's files, so setpriv would ask every other
    source of the user database for it (on Debian, loading systemd's NSS module and its
    libraries, about a millisecond of every call).  A few lookups (tens of microseconds),
    asked on each call: the databases may change between calls.
    """
    user = _spelling(identity.uid, _user_names)
    group = _spelling(identity.gid, _group_names)
    listed = [_spelling(gid, _group_names) for gid in sorted(identity.groups)]
    if any(spelt.text is None for spelt in (user, group, *listed)):
        return None
    return [
        f"--reuid={user.text}",
        f"--regid={group.text}",
        f"--groups={','.join(str(spelt.text) for spelt in listed)}" if listed else "--clear-groups",
    ]


def names_setpriv_misreads(identity: Identity) -> list[str]:
    """What keeps setpriv(1) from being given ``identity``'s ids (see
    :func:`setpriv_id_options`), in words: each id with no name of its own whose number is
    the name of another; empty when every id can be spelt."""
    spellings = [_spelling(identity.uid, _user_names)]
    spellings += [_spelling(gid, _group_names) for gid in sorted({identity.gid, *identity.groups})]
    return [spelt.problem for spelt in spellings if spelt.problem is not None]


class _Spelt(NamedTuple):
    text: str | None  # what setpriv reads as the id; None when nothing does
    problem: str | None


class _Names(NamedTuple):
    kind: str  # "user" or "group"
    id_kind: str  # "uid" or "gid"
    name_of: Callable[[int], str]  # KeyError when the id has no name
    id_of: Callable[[str], int]  # KeyError when no entry has the name


_user_names = _Names(
    "user", "uid", lambda uid: pwd.getpwuid(uid).pw_name, lambda name: pwd.getpwnam(name).pw_uid
)
_group_names = _Names(
    "group", "gid", lambda gid: grp.getgrgid(gid).gr_name, lambda name: grp.getgrnam(name).gr_gid
)


def _spelling(number: int, names: _Names) -> _Spelt:
    with contextlib.suppress(KeyError):
        name = names.name_of(number)
        # A comma would split --groups; a name that looks up to another id is a duplicate.
        if name and "," not in name and names.id_of(name) == number:
            return _Spelt(name, None)
    try:
        stand_in = names.id_of(str(number))
    except KeyError:
        return _Spelt(str(number), None)
    if stand_in == number:
        return _Spelt(str(number), None)
    return _Spelt(
        None,
        f"the {names.kind} named {number} is {names.id_kind} {stand_in}, not {number}",
    )
