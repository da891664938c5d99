"""``ctx bootstrap`` for the sessions in agents' homes that older versions made readable by
the agent's group (SPEC S-1, R-5).

A session in an agent's home is the agent's alone: its inputs and outputs, a worker's job
outputs.  It is made :data:`~cortexfs.shared.sessions.HOME_SESSION_MODE` (and ``events.jsonl``
:data:`~cortexfs.shared.sessions.HOME_EVENTS_MODE`), so that two agents of different uids
sharing a primary group read none of each other's.  Versions before that made them 0750 and
0640, and the opener keeps an existing session's mode: every event recorded since still went
into a file the group reads.  Bootstrap walks::

    home/<uid>/agent/<agent>/session/<session>/events.jsonl

and takes from each directory below ``home/<uid>/`` the bits beyond the session mode, and
from each ``events.jsonl`` those beyond the events mode: tightened, never widened, each
reported ``repaired`` with its mode before and after.  Every entry is opened relative to its
parent's descriptor without following a link (a home belongs to its user, who could plant
one): only what is there is changed, and only a directory or a regular file.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from cortexfs import durable, storage
from cortexfs.errors import CtxError
from cortexfs.shared.events import EVENTS_FILE
from cortexfs.shared.sessions import HOME_EVENTS_MODE, HOME_SESSION_MODE

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
# The levels below home/<uid>/, each made with the session mode: agent/, <agent>/, session/,
# <session>/.
_LEVELS = 4


def tighten_home_sessions(root: Path, source: Path | None, report: storage.BootstrapReport) -> None:
    """The bootstrap step: every home session of ``root`` given its mode (module docstring).
    Each home is a step of its own: one that cannot be changed (only root may chmod another
    uid's entries) is a problem naming it, and the others are still tightened."""
    ops = durable.default_ops()
    # The root is reached as every command reaches it, through a link the administrator may
    # have made (storage/current); below it nothing is followed.
    root_fd = os.open(os.path.realpath(root), _DIR_FLAGS)
    try:
        homes_fd = _open_directory(root_fd, "home")
    finally:
        os.close(root_fd)
    if homes_fd is None:
        return  # no home yet, or one the root's step reported
    try:
        for uid in sorted(os.listdir(homes_fd)):
            home = f"home/{uid}"
            with report.step(home, root / home):
                _tighten_below(ops, homes_fd, uid, home, report.repaired)
    finally:
        os.close(homes_fd)


def _tighten_below(
    ops: durable.FsOps, homes_fd: int, uid: str, home: str, repaired: list[str]
) -> None:
    """Tighten what lies below home ``uid``, each change added to ``repaired`` as it is
    made (a problem part-way still leaves the earlier ones reported)."""
    top = _open_directory(homes_fd, uid)
    if top is None:
        return
    # (descriptor, shown, depth below home/<uid>/): directories still to look into.
    stack = [(top, home, 0)]
    try:
        while stack:
            dir_fd, shown, depth = stack.pop()
            try:
                if depth == _LEVELS:
                    _tighten_events(ops, dir_fd, f"{shown}/{EVENTS_FILE}", repaired)
                    continue
                names = ["agent"] if depth == 0 else sorted(os.listdir(dir_fd))
                for name in reversed(names):
                    inner = _open_directory(dir_fd, name)
                    if inner is None:
                        continue
                    stack.append((inner, f"{shown}/{name}", depth + 1))
                    _tighten(ops, inner, HOME_SESSION_MODE, f"{shown}/{name}", repaired)
            finally:
                os.close(dir_fd)
    finally:
        for dir_fd, _, _ in stack:
            os.close(dir_fd)


def tighten_session(session_fd: int, shown: str) -> list[str]:
    """The home session open as ``session_fd`` (its directory, reached without following a
    link) and its ``events.jsonl`` tightened as bootstrap does, for ``ctx session repair``;
    ``["SHOWN (mode 0750 -> 0700)", …]`` for what changed.  EPERM when the caller is neither
    root nor their owner."""
    ops = durable.default_ops()
    repaired: list[str] = []
    _tighten(ops, session_fd, HOME_SESSION_MODE, shown, repaired)
    _tighten_events(ops, session_fd, f"{shown}/{EVENTS_FILE}", repaired)
    return repaired


def _open_directory(dir_fd: int, name: str) -> int | None:
    """``name`` in ``dir_fd`` opened as a directory, never through a link; None when it is
    missing, a link or anything but a directory (nothing of a session's to tighten)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise


def _tighten_events(ops: durable.FsOps, dir_fd: int, shown: str, repaired: list[str]) -> None:
    """The session's ``events.jsonl``, when it is a regular file (opened without following a
    link, nor waiting on a FIFO)."""
    try:
        fd = os.open(EVENTS_FILE, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENXIO):
            return
        raise
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            _tighten(ops, fd, HOME_EVENTS_MODE, shown, repaired)
    finally:
        os.close(fd)


def _tighten(ops: durable.FsOps, fd: int, allowed: int, shown: str, repaired: list[str]) -> None:
    """Take from the entry open as ``fd`` every mode bit beyond ``allowed``; report it."""
    status = os.fstat(fd)
    current = stat.S_IMODE(status.st_mode)
    wanted = current & allowed
    if wanted == current:
        return
    if os.geteuid() not in (0, status.st_uid):
        raise CtxError(
            errno.EPERM,
            f"{shown} belongs to uid {status.st_uid} and has mode {current:04o}, which lets "
            f"its group or others read it; only root or its owner may make it {wanted:04o}: "
            "run 'ctx bootstrap' as root",
        )
    ops.fchmod(fd, wanted)
    # The mode reaches the disk before bootstrap reports it repaired.
    if stat.S_ISDIR(status.st_mode):
        durable.sync_dir(ops, fd)
    else:
        ops.fsync(fd)
    repaired.append(f"{shown} (mode {current:04o} -> {wanted:04o})")


storage.register_bootstrap_step(tighten_home_sessions)
