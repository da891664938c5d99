"""Who acts for the host: the host administrator (SPEC A-3, T-5, H-2).

Agents are created, and tools are run *as* an agent, only by the host administrator — root,
or the owner of the storage root (a personal root under ``~/.local/share``).  Nobody else can
claim an agent identity: a process that is neither is refused before anything is read.
"""

from __future__ import annotations

import os
from pathlib import Path

from cortexfs.errors import denied
from cortexfs.storage import require_root, use_own_root


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
