"""Who acts for the host: the host administrator (SPEC A-3, T-5, H-2).

Agents are created, and tools are run *as* an agent, only by the host administrator — root,
or the owner of the storage root (a personal root under ``~/.local/share``).  Nobody else can
claim an agent identity: a process that is neither is refused before anything is read.  A
storage owner who is not root keeps its own uid, gid and groups: it runs only agents whose
identity is its own, and cannot make an agent's home for another uid (S-1).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from cortexfs.errors import denied
from cortexfs.storage import require_root, use_own_root

if TYPE_CHECKING:
    from cortexfs.policy import Identity


def is_host_administrator(root: Path, uid: int) -> bool:
    """Whether ``uid`` is root or owns the storage root ``root``."""
    return uid == 0 or uid == os.stat(root).st_uid


def require_host_administrator(root: Path, action: str) -> None:
    """EACCES unless this process is root or owns the storage root; ``action`` says what for.
    A storage root that is not there is ENOENT, saying so (a mistyped ``--storage``)."""
    if os.geteuid() != 0:
        require_root(root)
    if not is_host_administrator(root, os.geteuid()):
        owner = os.stat(root).st_uid
        raise denied(
            f"only the host administrator (root, or uid {owner} who owns {root}) may {action}; "
            f"run it as one of them, or {use_own_root()}"
        )


def require_no_groups_beyond(agent: str, identity: Identity) -> None:
    """EACCES when this process, not root, holds supplementary groups that agent ``agent``'s
    ``identity`` leaves out (P-5 step 1, T-5): only root may drop groups, so every tool and
    hook it started for the agent would hold them, and reach what they guard.  A storage
    owner may well give an agent fewer groups than its own (``agent create --groups``)."""
    if os.geteuid() == 0:
        return
    extra = sorted(set(os.getgroups()) - identity.groups - {identity.gid})
    if not extra:
        return
    these = f"group{'s' if len(extra) > 1 else ''} {', '.join(map(str, extra))}"
    given = ", ".join(map(str, sorted(identity.groups))) or "none"
    raise denied(
        f"this process holds {these}, which agent {agent!r} is not given (gid "
        f"{identity.gid}, groups {given}): only root can start its tools without "
        f"{'them' if len(extra) > 1 else 'it'}; run as root, or from a session without "
        f"{'them' if len(extra) > 1 else 'it'} (sg, newgrp), or give the agent "
        f"{'them' if len(extra) > 1 else 'it'} in agent/{agent}.d/identity"
    )


def only_root_runs_as_another() -> str:
    """What a host administrator who is not root can do when step 1 of the chain refuses it
    an agent of another uid than its own (P-5): only root may start a process as another
    uid, which no group given the agent, nor any other change of the owner's, mends."""
    return (
        "only root may start a process as another uid: run it as root, or use an agent whose "
        f"identity is your own uid ({os.geteuid()})"
    )


def session_home_remedy(home: Path, uid: int, records: str, start: str) -> str:
    """What lets a host administrator who is not root record in a session of agent uid
    ``uid`` below its home ``home`` (``ROOT/home/<uid>``) once the kernel refused making it
    (EACCES, EPERM): only root gives what it creates to another uid, or creates in a
    ``home/`` it does not own.  ``records``: what records there (``the worker records every
    job``); ``start``: how it is started again (``start it``)."""
    return (
        f"{records} there and creates what is missing, from {home} down, for the agent's "
        f"uid {uid}: {start} as root, or create {home} owned by uid {uid} first"
    )
