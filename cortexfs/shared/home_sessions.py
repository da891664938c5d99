"""``ctx bootstrap`` for the sessions in agents' homes that older versions made readable by
the agent's group (SPEC S-1, R-5).

A session in an agent's home is the agent's alone: its inputs and outputs, a worker's job
outputs.  It is made :data:`~cortexfs.shared.sessions.HOME_SESSION_MODE` (and ``events.jsonl``
:data:`~cortexfs.shared.sessions.HOME_EVENTS_MODE`), so that two agents of different uids
sharing a primary group read none of each other's.  Versions before that made them 0750 and
0640, and the opener keeps an existing session's mode: every event recorded since still went
into a file the group reads.  Bootstrap walks only the levels of a session's path
(:func:`~cortexfs.shared.level_walk.walk_levels`)::

    home/<uid>/agent/<agent>/session/<session>/events.jsonl

and takes from each of those directories the bits beyond the session mode, and from each
``events.jsonl`` those beyond the events mode: tightened, never widened, each reported
``repaired`` with its mode before and after.  Every entry is opened relative to its
parent's descriptor without following a link (a home belongs to its user, who could plant
one): only what is there is changed, and only a directory or a regular file.

Only the home owner's own entries are changed (the owner of ``home/<uid>/``).  Root's chmod
would succeed on anything, so the home's user could otherwise have root change a file that
is not theirs: an entry of another uid (a directory moved in), or a regular file with more
than one name (a hard link to another uid's file that the user's group may write, which
``fs.protected_hardlinks`` allows; any file without it).  Such an entry is left as it is and
named in a warning, not a problem: it is the home user's doing, not the storage root's, and
must not make every bootstrap fail.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from cortexfs import capabilities, durable, storage
from cortexfs.errors import CtxError
from cortexfs.file_attributes import refusing_attribute
from cortexfs.shared.events import EVENTS_FILE
from cortexfs.shared.level_walk import (
    SESSION_LEVELS,
    open_child_directory,
    open_directory,
    walk_levels,
)
from cortexfs.shared.sessions import HOME_EVENTS_MODE, HOME_SESSION_MODE

_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


@dataclass
class Tightening:
    """What a walk changed, ``"SHOWN (mode 0750 -> 0700)"`` each, and what it left as it is
    because it is not the home owner's to change (module docstring), a sentence each."""

    tightened: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)


def tighten_home_sessions(root: Path, source: Path | None, report: storage.BootstrapReport) -> None:
    """The bootstrap step: every home session of ``root`` given its mode (module docstring),
    what is left reported as a warning.  Each home is a step of its own: one that cannot be
    changed (only root may chmod another uid's entries) is a problem naming it, and the
    others are still tightened."""
    ops = durable.default_ops()
    # The root is reached as every command reaches it, through a link the administrator may
    # have made (storage/current); below it nothing is followed.
    homes_fd = open_child_directory(os.path.realpath(root), "home")
    if homes_fd is None:
        return  # no home yet, or one the root's step reported
    # Each change is recorded as it is made: a problem part-way still leaves the earlier ones
    # reported.
    done = Tightening(tightened=report.repaired, left=report.warnings)
    try:
        for uid in sorted(os.listdir(homes_fd)):
            home = f"home/{uid}"
            with report.step(home, root / home):
                _tighten_home(ops, homes_fd, uid, home, done)
    finally:
        os.close(homes_fd)


def _tighten_home(ops: durable.FsOps, homes_fd: int, uid: str, home: str, done: Tightening) -> None:
    top = open_directory(homes_fd, uid)
    if top is None:
        return
    try:
        owner = os.fstat(top).st_uid
        with contextlib.closing(walk_levels(top, SESSION_LEVELS)) as levels:
            for dir_fd, names in levels:
                shown = "/".join((home, *names))
                _tighten(ops, dir_fd, HOME_SESSION_MODE, shown, owner, done)
                if len(names) == len(SESSION_LEVELS):
                    _tighten_events(ops, dir_fd, f"{shown}/{EVENTS_FILE}", owner, done)
    finally:
        os.close(top)


def tighten_session(session_fd: int, shown: str, done: Tightening) -> None:
    """The home session open as ``session_fd`` (its directory, reached without following a
    link) and its ``events.jsonl`` tightened as bootstrap does, for ``ctx session repair``,
    with the session directory's owner as the home owner; each change is added to ``done`` as
    it is made, so that a refusal of the file still leaves the directory's change said.
    EPERM when the caller is neither root nor their owner, or an attribute refuses it."""
    ops = durable.default_ops()
    owner = os.fstat(session_fd).st_uid
    _tighten(ops, session_fd, HOME_SESSION_MODE, shown, owner, done)
    _tighten_events(ops, session_fd, f"{shown}/{EVENTS_FILE}", owner, done)


def _tighten_events(
    ops: durable.FsOps, dir_fd: int, shown: str, owner: int, done: Tightening
) -> None:
    """The session's ``events.jsonl``, when it is a regular file (opened without following a
    link, nor waiting on a FIFO)."""
    try:
        fd = os.open(EVENTS_FILE, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENXIO):
            return
        raise OSError(exc.errno, exc.strerror, shown) from None  # named whole, not as the file
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            _tighten(ops, fd, HOME_EVENTS_MODE, shown, owner, done)
    finally:
        os.close(fd)


def _tighten(
    ops: durable.FsOps, fd: int, allowed: int, shown: str, owner: int, done: Tightening
) -> None:
    """Take from the entry open as ``fd`` every mode bit beyond ``allowed`` when it is the
    home owner's (``owner``) alone; report it, or why it was left."""
    status = os.fstat(fd)
    current = stat.S_IMODE(status.st_mode)
    wanted = current & allowed
    if wanted == current:
        return
    not_the_owners = _not_the_owners(status, owner)
    if not_the_owners:
        linked = stat.S_ISREG(status.st_mode) and status.st_nlink > 1
        why = (
            "a chmod would change the file under every name it has"
            if linked
            else "what another uid put there is that uid's to change"
        )
        done.left.append(
            f"{shown} has mode {current:04o} but is left as it is, not made {wanted:04o}: it "
            f"{not_the_owners}; only the home owner's own sessions are tightened, and {why}; "
            "check what it is, and move it out of the home if it is not the agent's"
        )
        return
    if os.geteuid() not in (0, status.st_uid):
        raise CtxError(
            errno.EPERM,
            f"{shown} belongs to uid {status.st_uid} and has mode {current:04o}, which lets "
            f"its group or others read it; only root or its owner may make it {wanted:04o}: "
            "run 'ctx bootstrap' as root",
        )
    if os.geteuid() != status.st_uid:
        capabilities.require(
            f"making {shown} (uid {status.st_uid}'s, mode {current:04o}) {wanted:04o}",
            capabilities.CAP_FOWNER,
        )
    try:
        ops.fchmod(fd, wanted)
    except PermissionError as exc:
        # Refused to the owner and to root alike: an attribute, which the kernel's bare
        # "Operation not permitted" does not name.
        raise _mode_change_refused(fd, status, shown, wanted) or OSError(
            exc.errno, exc.strerror, shown
        ) from None
    # The mode reaches the disk before bootstrap reports it repaired.
    if stat.S_ISDIR(status.st_mode):
        durable.sync_dir(ops, fd)
    else:
        ops.fsync(fd)
    done.tightened.append(f"{shown} (mode {current:04o} -> {wanted:04o})")


def _mode_change_refused(
    fd: int, status: os.stat_result, shown: str, wanted: int
) -> CtxError | None:
    """EPERM naming the attribute of the entry open as ``fd`` (``shown``) that refuses a
    change of its mode whatever its owner (immutable, append-only) and the ``chattr`` that
    lifts it; None when it has none."""
    attribute = refusing_attribute(fd)
    if attribute is None:
        return None
    lister = "'lsattr -d'" if stat.S_ISDIR(status.st_mode) else "'lsattr'"
    try:
        # Where the kernel has it: bootstrap shows the entry relative to the storage root,
        # and chattr needs a path that works from anywhere.
        path = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        path = shown
    return CtxError(
        errno.EPERM,
        f"cannot make {shown} {wanted:04o} (mode {stat.S_IMODE(status.st_mode):04o}): it is "
        f"{attribute.name} (attribute '{attribute.letter}', which {lister} shows), which "
        "refuses a change of its mode, by root too; have root remove it with "
        f"'chattr -{attribute.letter} {path}', then run the command again",
    )


def _not_the_owners(status: os.stat_result, owner: int) -> str:
    """Why the entry of ``status`` is not the home owner's (uid ``owner``) alone to have
    changed, or ``""`` when it is."""
    why = []
    if status.st_uid != owner:
        why.append(f"belongs to uid {status.st_uid}, not to uid {owner} whose home it is in")
    if stat.S_ISREG(status.st_mode) and status.st_nlink > 1:
        why.append(
            f"is a file with {status.st_nlink} names (hard links), another of which may be "
            "another uid's file"
        )
    return ", and ".join(why)


storage.register_bootstrap_step(tighten_home_sessions)
