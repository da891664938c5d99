"""Finding the host programs a tool is started through (setpriv, unshare) on ``PATH``.

This is ``shutil.which`` for a bare program name, written out because the runner is imported
by every ``ctx run``: shutil loads zlib, bz2 and lzma when it is imported, a few milliseconds
of every tool call spent on modules the call never uses.
"""

from __future__ import annotations

import os


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
