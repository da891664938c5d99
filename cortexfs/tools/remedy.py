"""What repairs a damaged tool, by the tier it is in (SPEC R-5, T-8).

``ctx bootstrap`` maintains the core tools of the system tier (:data:`BOOTSTRAP_TOOLS`) and
puts them back whenever they differ.  Every other tool — a user's, a shared space's, or one
installed in the system tier — was installed from a manifest bootstrap does not have: only a
reinstall into its tier, by whoever may install there, repairs it.  A message that sends its
reader to a remedy sends them to the one that works.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cortexfs.storage import DOCS_BUNDLE, ROOT_ENTRIES
from cortexfs.tools.core import BOOTSTRAP_TOOLS


def is_core_tool(directory: Path, name: str) -> bool:
    """Whether ``name`` in the tier directory ``directory`` is a core tool bootstrap keeps."""
    return name in BOOTSTRAP_TOOLS and tier_of(directory) == "system"


def reinstall_advice(directory: Path, name: str) -> str:
    """What repairs the damaged tool ``name`` of the tier directory ``directory``."""
    if is_core_tool(directory, name):
        return "repair the storage root ('ctx bootstrap')"
    tier = tier_of(directory)
    if tier is None:
        return "reinstall it ('ctx object install MANIFEST')"
    if tier == "system":
        who = ""
    elif tier == "user":
        who = f" as uid {directory.parent.name}"
    else:
        who = f" as the owner of shared space {directory.parent.name}"
    return (
        f"reinstall it with 'ctx object install MANIFEST --tier {tier}'{who} ('ctx "
        "bootstrap' repairs only the core tools)"
    )


def tier_of(directory: Path) -> str | None:
    """The tier ``directory`` is, as ``--tier`` names it (``system``, ``user``,
    ``shared:<name>``); None when it is not the ``tool/`` of a storage root, of a user's home
    in one, or of a shared space in one.  A storage root is told by its six entries (R-2),
    not by the names of the directories above it."""
    if directory.name != "tool":
        return None
    holder = directory.parent
    if _is_storage_root(holder):
        return "system"
    if not _is_storage_root(holder.parent.parent):
        return None
    if holder.parent.name == "home" and holder.name.isdigit():
        return "user"
    if holder.parent.name == "shared" and holder.name != DOCS_BUNDLE:
        return f"shared:{holder.name}"
    return None


def _is_storage_root(path: Path) -> bool:
    for entry in ROOT_ENTRIES:
        try:
            if not stat.S_ISDIR(os.lstat(path / entry).st_mode):
                return False
        except OSError:
            return False
    return True
