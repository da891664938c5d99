"""The commit marker of a pair's reinstall (:mod:`cortexfs.tools.pairs`), for readers.

While a reinstall is between its two swaps (the control directory, then the entry), the old
entry stands beside the new controls, and ``.<name>~commit`` exists.  A reader that reads the
controls between two looks at the entry and at the marker reads one whole version.  Kept apart
from :mod:`cortexfs.tools.pairs` so that ``ctx run`` can look without importing the installer.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from cortexfs.errors import CtxError

_SUFFIX = "~commit"
_WHOLE_VERSION_SECONDS = 2.0  # reinstalls back to back may keep a reader waiting

Read = TypeVar("Read")


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


def read_one_version(
    directory: Path,
    name: str,
    read: Callable[[], Read],
    *,
    seconds: float = _WHOLE_VERSION_SECONDS,
) -> Read:
    """What ``read`` returns when it ran while the entry ``directory/name`` stayed one file
    and no reinstall of it was between its two swaps: what it read is one whole version.

    ``read`` may fail (CtxError, OSError): a failure met during a swap is dropped and the read
    made again, a steady version's failure is raised.  Reinstalls that keep it changing for
    ``seconds`` end in the last failure, else EAGAIN."""
    entry = directory / name
    deadline = time.monotonic() + seconds
    attempt = 0
    failure: CtxError | OSError | None = None
    while attempt == 0 or time.monotonic() < deadline:
        attempt += 1
        before = file_identity(entry)
        swapping = commit_in_progress(directory, name)
        try:
            result, failure = read(), None
        except (CtxError, OSError) as exc:  # judged below: a steady version's failure is its own
            failure = exc
        swapping = swapping or commit_in_progress(directory, name)
        if not swapping and before is not None and before == file_identity(entry):
            if failure is not None:
                raise failure
            return result
        if _left_by_an_interrupted_install(directory, name, seconds):
            break  # no install takes that long between its swaps: waiting changes nothing
        time.sleep(min(0.005 * attempt, 0.05))
    if failure is not None:
        raise failure
    raise CtxError(
        errno.EAGAIN,
        f"{name} kept changing while it was read: an install of it is in progress; retry, "
        "and run 'ctx bootstrap' if an interrupted install left it so",
    )


def _left_by_an_interrupted_install(directory: Path, name: str, seconds: float) -> bool:
    """Whether ``name``'s commit marker has stood for ``seconds`` already: an install that
    was interrupted between its swaps left it, for ``ctx bootstrap`` to finish."""
    try:
        made = os.lstat(directory / commit_marker(name)).st_mtime
    except FileNotFoundError:
        return False
    return time.time() - made > seconds


def file_identity(path: Path) -> tuple[int, int, int] | None:
    """The file at ``path`` (None when there is none): a reinstall's rename puts another
    there, or changes its ctime."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return None
    return status.st_dev, status.st_ino, status.st_ctime_ns
