"""The commit marker of a pair's reinstall (:mod:`cortexfs.tools.pairs`), for readers.

While a reinstall is between its two swaps (the control directory, then the entry), the old
entry stands beside the new controls, and ``.<name>~commit`` exists.  A reader that reads the
controls between two looks at the entry and at the marker reads one whole version.  Kept apart
from :mod:`cortexfs.tools.pairs` so that ``ctx run`` can look without importing the installer.
"""

from __future__ import annotations

import os
from pathlib import Path

_SUFFIX = "~commit"


def commit_marker(name: str) -> str:
    """The name of ``name``'s commit marker, present while a reinstall swaps its version."""
    return f".{name}{_SUFFIX}"


def marked_object(entry: str) -> str | None:
    """The name of the object whose commit marker ``entry`` is; None when it is none."""
    if not (entry.startswith(".") and entry.endswith(_SUFFIX)):
        return None
    name = entry[1 : -len(_SUFFIX)]
    return name if name and "~" not in name and "/" not in name else None


def commit_in_progress(directory: Path, name: str) -> bool:
    """True while a reinstall of ``name`` in ``directory`` is between its two swaps (or was
    interrupted there): its entry and its controls may then be of different versions."""
    return os.path.lexists(directory / commit_marker(name))
