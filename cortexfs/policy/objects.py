"""Where each policy object lives and what each permission asks of it (SPEC P-5, P-6, T-4, S-1).

=================  ===============================================  ============  =======
class:permission   object, relative to the storage root             must be       needs
=================  ===============================================  ============  =======
tool:N execute     ``<location>/N`` (``tool/`` unless CTX_PATH       regular file  ``x``
                   found it in ``home/<uid>/tool/`` or
                   ``shared/<space>/tool/``)
model:P/M use      ``model/P/M``                                     any entry     ``r``
shared:N read      ``shared/N``                                      directory     ``r``
shared:N write     ``shared/N``                                      directory     ``w``
session:N read     ``<location>/N``, location ``home/<uid>/agent/    directory     ``r``
                   <agent>/session`` or ``shared/<space>/agent/
                   <agent>/session``
session:N write    same                                              directory     ``w``
session:N resume   same                                              directory     ``rw``
agent:N create     ``agent`` (N does not exist yet; the host makes   directory     ``x``
                   it on the agent's behalf)
agent:N start/stop ``agent/N``                                       any entry     ``x``
agent:N read       ``agent/N``                                       any entry     ``r``
agent:N write      ``agent/N``                                       any entry     ``w``
mount:N read/write the mount's host source (from the mount table)   any entry     ``r``/``w``
network:default    nothing on disk; steps 2, 3 and 6 do not apply
=================  ===============================================  ============  =======

Reading or writing a directory also needs its ``x`` (:func:`cortexfs.policy.linux.check_access`).
Tools and models carry their own policy in ``<object>.d/policy`` (step 6, P-6).
"""

from __future__ import annotations

import functools
import re
from pathlib import PurePosixPath
from types import MappingProxyType
from typing import NamedTuple

from cortexfs.errors import invalid
from cortexfs.names import is_object_name
from cortexfs.policy.linux import EXECUTE, READ, WRITE, Kind
from cortexfs.storage import DOCS_BUNDLE

NEEDED_ACCESS = MappingProxyType(
    {
        ("tool", "execute"): EXECUTE,
        ("model", "use"): READ,
        ("shared", "read"): READ,
        ("shared", "write"): WRITE,
        ("session", "read"): READ,
        ("session", "write"): WRITE,
        ("session", "resume"): READ | WRITE,
        ("agent", "create"): EXECUTE,
        ("agent", "start"): EXECUTE,
        ("agent", "stop"): EXECUTE,
        ("agent", "read"): READ,
        ("agent", "write"): WRITE,
        ("mount", "read"): READ,
        ("mount", "write"): WRITE,
    }
)
DEFAULT_TOOL_LOCATION = "tool"
OWN_POLICY = "policy"
# The files of a tool's control directory (T-1) that make the tool what it is, held to
# StrictModes with its policy at step 6; not its log, a record the host appends to.
TOOL_CONTROLS = (
    OWN_POLICY,
    *("name", "description", "schema", "cap", "status", "program", "mcp", "origin"),
)

_TOOL_LOCATION = re.compile(r"tool|home/[0-9]+/tool|shared/(?P<space>[^/]+)/tool")
_SESSION_LOCATION = re.compile(
    r"(?:home/[0-9]+|shared/(?P<space>[^/]+))/agent/(?P<agent>[^/]+)/session"
)
_LOCATED_CLASSES = {"tool": _TOOL_LOCATION, "session": _SESSION_LOCATION}


class Site(NamedTuple):
    """The entry the Linux steps judge (2 and 3) and the object's own policy (step 6)."""

    path: PurePosixPath
    kind: Kind
    access: int
    own_policy: PurePosixPath | None = None


# A site is a value, kept once made: the chain asks for the same few at every call (the
# projection for each tool the agent may run), and a PurePosixPath is slow to make on 3.11.
@functools.lru_cache(maxsize=1024)
def storage_site(
    object_class: str, object_name: str, permission: str, location: str | None = None
) -> Site | None:
    """The site of a storage object; None for ``mount`` and ``network``, which live elsewhere.

    ``location`` names the directory holding a tool or session (see the table above); EINVAL
    when it is malformed, missing for a session, or given for any other class.
    """
    place = check_location(object_class, location)
    access = NEEDED_ACCESS.get((object_class, permission), 0)
    name = object_name
    match (object_class, place):
        case ("tool", PurePosixPath() as directory):
            return Site(directory / name, Kind.FILE, access, directory / f"{name}.d" / OWN_POLICY)
        case ("session", PurePosixPath() as directory):
            return Site(directory / name, Kind.DIRECTORY, access)
        case ("model", _):
            path = PurePosixPath("model", name)
            return Site(path, Kind.ANY, access, path.with_name(f"{path.name}.d") / OWN_POLICY)
        case ("shared", _):
            return Site(PurePosixPath("shared", name), Kind.DIRECTORY, access)
        case ("agent", _) if permission == "create":
            return Site(PurePosixPath("agent"), Kind.DIRECTORY, access)
        case ("agent", _):
            return Site(PurePosixPath("agent", name), Kind.ANY, access)
    return None


def check_location(
    object_class: str, location: str | None, as_given: str | None = None
) -> PurePosixPath | None:
    """The validated directory holding a tool or a session; EINVAL for anything else, which
    quotes the location ``as_given`` by the user when it was given otherwise (an absolute
    path to the same place)."""
    pattern = _LOCATED_CLASSES.get(object_class)
    if pattern is None:
        if location is not None:
            raise invalid(f"a {object_class} object has one place; do not give a location")
        return None
    if location is None:
        if object_class == "tool":
            return PurePosixPath(DEFAULT_TOOL_LOCATION)
        raise invalid(
            "a session is found through its directory; give its location, e.g. "
            "home/1000/agent/coder/session or shared/project-a/agent/coder/session"
        )
    match = pattern.fullmatch(location)
    names = [] if match is None else [name for name in match.groupdict().values() if name]
    shown = repr(location if as_given is None else as_given)
    if match is None or not all(is_object_name(name) for name in names):
        raise invalid(f"{shown} is not a place where a {object_class} lives")
    if match["space"] == DOCS_BUNDLE:
        what = "no tier: no tool there is ever run" if object_class == "tool" else "no sessions"
        raise invalid(
            f"{shown} lies in {DOCS_BUNDLE}, the system-maintained manual bundle (X-2), "
            f"which holds {what}"
        )
    return PurePosixPath(location)
