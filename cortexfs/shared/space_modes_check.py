"""``ctx bootstrap`` names the shared spaces whose directories an older version made with
modes this one no longer gives (SPEC X-1, S-6, R-5).

Versions before the sticky bit made a space's ``queue/`` and its session directories 02770
(and the first ones the space itself 2770): a member could rename or remove the queue's
state directories or another agent's sessions.  Creating a space keeps what exists, and so
does bootstrap: it changes nothing in a space (its group is the space owner's choice, and
``ctx shared create NAME --group G`` is the repair that knows it), but warns, once per space,
naming the first such directory, how many there are, and that command.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cortexfs import storage
from cortexfs.names import is_object_name
from cortexfs.printable import shell_word
from cortexfs.shared.spaces import directories_of_other_modes


def warn_of_spaces_of_older_modes(
    root: Path, source: Path | None, report: storage.BootstrapReport
) -> None:
    """The bootstrap step: a warning for each space with directories of another mode than
    this version gives them (:func:`~cortexfs.shared.spaces.directories_of_other_modes`).  A
    space the caller may not read (bootstrap run by the storage owner, not root) is not
    judged."""
    shared = root / "shared"
    try:
        names = sorted(os.listdir(os.path.realpath(root) + "/shared"))
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return
    for name in names:
        if name == storage.DOCS_BUNDLE or not is_object_name(name):
            continue
        path = shared / name
        with report.step(f"shared/{name}", path):
            try:
                status = os.lstat(path)
                if not stat.S_ISDIR(status.st_mode):
                    continue
                found = directories_of_other_modes(path)
            except PermissionError:
                continue
            if found:
                report.warnings.append(_warning(name, status.st_gid, found))


def space_modes_warning(path: Path) -> str | None:
    """The warning for the space at ``path`` when some of its directories have another mode
    than this version gives them; None when none has, or the space cannot be read.  For the
    commands that complete a space and change nothing that exists (``ctx queue init``,
    ``ctx shared create`` without ``--group``): one stopped between a ``mkdir`` and the mode
    it gives is then completed by the repair this names, not left unsaid."""
    try:
        status = os.lstat(path)
        if not stat.S_ISDIR(status.st_mode):
            return None
        found = directories_of_other_modes(path)
    except (FileNotFoundError, PermissionError):
        return None
    return _warning(path.name, status.st_gid, found) if found else None


def _warning(name: str, gid: int, found: list[tuple[Path, int, int]]) -> str:
    (first, mode, wanted), more = found[0], len(found) - 1
    others = f" (and {more} more)" if more else ""
    return (
        f"shared space {name}: {first} has mode {mode:04o}, not {wanted:04o}{others}, as an "
        "older version made it or a create stopped midway left it: members may be refused "
        "what the space is for, or rename or remove entries that are not theirs (the queue's "
        f"state directories, other agents' sessions); run 'ctx shared create "
        f"{shell_word(name)} --group {gid}', which gives them their modes"
    )


storage.register_bootstrap_step(warn_of_spaces_of_older_modes)
