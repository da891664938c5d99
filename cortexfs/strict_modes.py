"""The StrictModes rule: whether anyone but the trusted uids could change a file (SPEC P-6).

As ssh's StrictModes does, a file that grants or runs something is only as safe as the
hands that may change it: its owner, anyone its group or others' write bit admits, and
whoever may rename an entry above it.  The authority chain holds an agent's controls, a
tool's policy, executable and hooks to it (:mod:`cortexfs.policy.chain`), and the bridge of
an MCP-backed tool the configuration that names its server's command
(:mod:`cortexfs.tools.core.mcp_bridge`).  Standard library only: the bridge runs as a
self-contained program that carries this module.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence


def loose_entry(
    statuses: Sequence[os.stat_result | None], owners: set[int], hosts: set[int]
) -> int | None:
    """The index of the first of ``statuses`` (the ``lstat`` of each entry of a walk from the
    top down) that a uid outside ``owners`` could change; None when none could.

    An entry is loose when it belongs to a uid outside ``owners``, or when its group or
    others may write it — unless it is a directory with the sticky bit that, like the entry
    below it, belongs to one of ``hosts``: then nobody else may rename or remove that entry
    (``/tmp``, a shared space's root).  The walk is judged up to its first missing entry or
    link, which whoever reads it refuses."""
    for index, status in enumerate(statuses):
        if status is None or stat.S_ISLNK(status.st_mode):
            return None
        below = statuses[index + 1] if index + 1 < len(statuses) else None
        loose_mode = stat.S_IMODE(status.st_mode) & (stat.S_IWGRP | stat.S_IWOTH)
        if status.st_uid not in owners or (loose_mode and not _sticky_over(status, below, hosts)):
            return index
    return None


def _sticky_over(directory: os.stat_result, below: os.stat_result | None, hosts: set[int]) -> bool:
    """Whether ``directory``, writable by others, still keeps ``below`` the host's: it has the
    sticky bit and both belong to the host, so only the host may rename or remove ``below``."""
    if below is None:
        return False
    sticky = directory.st_mode & stat.S_ISVTX
    return bool(sticky) and {directory.st_uid, below.st_uid} <= hosts
