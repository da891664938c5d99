"""What an install that fails needs and says (:mod:`cortexfs.tools.pairs`).

An install that fails settles its own attempt before it reports: before its commit marker is
durable it removes everything it staged, after that it finishes the commit.  The clean-up
needs no space, but it needs descriptors, so an install sets aside, before it stages anything,
the few its clean-up holds open at most (:func:`descriptors_set_aside`): running out of them
(EMFILE) then fails the install, never its clean-up too.

Its error (:func:`failed_install`) says what went wrong and where (the filesystem, for a full
or read-only one), what was and was not done — nothing installed and nothing left; or, when
even the clean-up could not run, the hidden names still there and the command that finishes
or removes them — and what to do before running the command again.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from cortexfs.errors import CtxError, describe, remedy_for_host_trouble

# What the clean-up of a failed install holds open at most: the staged control directory, a
# hook directory and the one below it, and the copy of the last that os.listdir makes.
CLEANUP_DESCRIPTORS = 4
# Errors about the filesystem the install writes to, which the error then names.
_FILESYSTEM_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)


@dataclass(frozen=True)
class Settled:
    """What the clean-up of a failed install did."""

    committed: bool  # its commit marker was durable: the install is finished, not undone
    left: tuple[str, ...] = ()  # the hidden names the clean-up could not remove
    trouble: BaseException | None = None  # why it could not

    @property
    def finished(self) -> bool:
        """The install is complete after all: it may be reported done."""
        return self.committed and self.trouble is None


@contextlib.contextmanager
def descriptors_set_aside(dir_fd: int, path: Path) -> Iterator[Callable[[], None]]:
    """Hold :data:`CLEANUP_DESCRIPTORS` descriptors for the install of ``path`` until the
    clean-up calls what this yields (or the block ends); EMFILE, with nothing changed, when
    there are not that many to hold."""
    spare: list[int] = []

    def release() -> None:
        while spare:
            os.close(spare.pop())

    try:
        for _ in range(CLEANUP_DESCRIPTORS):
            spare.append(os.dup(dir_fd))
    except OSError as exc:
        release()
        code = exc.errno or errno.EIO
        raise CtxError(
            code, f"cannot install {path}: {exc.strerror}; nothing was changed: {advice(code)}"
        ) from exc
    try:
        yield release
    finally:
        release()


def could_not_look(directory: Path, name: str, exc: OSError | CtxError) -> CtxError:
    """The error of an install of ``name`` that could not settle what interrupted installs
    left in ``directory``, which it does before it makes anything."""
    code = exc.errno or errno.EIO
    return CtxError(
        code,
        f"cannot install {directory / name}: settling what interrupted installs left in "
        f"{directory} failed ({describe(exc)}); nothing of this install was made: "
        f"{advice(code)}",
    )


def failed_install(
    directory: Path,
    name: str,
    failure: OSError | CtxError,
    settled: Settled,
    *,
    had_entry: bool,
    settled_by: str,
) -> CtxError:
    """The error of the install of ``name`` into ``directory`` that met ``failure`` and was
    then settled as ``settled`` says; ``settled_by`` is what finishes or removes what is left
    ("running the same command again")."""
    code = failure.errno or errno.EIO
    if isinstance(failure, CtxError):
        reason = failure.message
    else:
        filesystem = f" on the filesystem of {directory}" if code in _FILESYSTEM_ERRORS else ""
        where = f" (at {os.fsdecode(failure.filename)})" if failure.filename is not None else ""
        reason = f"{failure.strerror or failure}{filesystem}{where}"
    path = directory / name
    if settled.trouble is None:
        kept = ", the previous version is still in place," if had_entry else ""
        return CtxError(
            code,
            f"cannot install {path}: {reason}; nothing was installed{kept} and nothing of "
            f"this attempt is left: {advice(code)}",
        )
    left = ", ".join(str(directory / hidden) for hidden in settled.left) or "nothing"
    verb = "are" if len(settled.left) > 1 else "is"
    if settled.committed:
        done = (
            f"its new version was committed, but finishing the commit failed too "
            f"({describe(settled.trouble)}), so {left} {verb} left; {settled_by} finishes it"
        )
    else:
        kept = " (the previous version is still in place)" if had_entry else ""
        done = (
            f"nothing was installed{kept}, but removing what this attempt staged failed too "
            f"({describe(settled.trouble)}), so {left} {verb} left, hidden; {settled_by} "
            "removes it"
        )
    return CtxError(code, f"cannot install {path}: {reason}; {done}: {advice(code)}")


def advice(code: int) -> str:
    """What to do about ``code`` before the same command is run again."""
    remedy = remedy_for_host_trouble(code)
    return f"{remedy or 'correct that'} and run the command again"
