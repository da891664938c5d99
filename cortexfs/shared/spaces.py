"""Shared spaces: ``shared/<name>/`` with ``tool/``, ``data/``, ``queue/``, ``agent/`` (SPEC X-1).

A shared space is a Linux-permission space, nothing more: its directories belong to one group
and are setgid, so that every file created inside belongs to the space's group, while everyone
else sees nothing (mode 0 for others).  ``data/`` is group-writable (02770): the members work
with each other's files.  The space's own directory, ``agent/`` and
``queue/`` also have the sticky bit (03770): a member adds entries but never renames or
removes another's (the host's ``tool/``, ``data/``, ``queue/``, the queue's six directories
and its config, another agent's sessions).  ``tool/`` is the host's
(02750): its tools run under the agents' grants, so no member may put code there for another
to run; the space's owner (who made it) installs them (``ctx object install --tier
shared:<name>``), and the authority chain refuses a tool any other uid could change.  So a
member completing a space never makes its ``tool/`` or ``agent/``, which would be the member's
(:func:`_require_owner_where_owners_alone`): only the space's owner or root does.

Whether an agent may use the space is decided by its uid, gid and groups (the mode bits), its
mounts and policy v0 (``shared:<name> read|write``), through the authority chain; the space
itself carries no collaboration rules.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from cortexfs import capabilities, durable, storage
from cortexfs.errors import DISK_ERROR_REMEDY, HOST_TROUBLES, CtxError, remedy_for_host_trouble
from cortexfs.locks import flock_within
from cortexfs.names import check_object_name
from cortexfs.queue.claim_order import start_hint
from cortexfs.queue.layout import STATE_DIRS, check_existing_queue, init_queue
from cortexfs.shared.session_modes import (
    check_session_modes,
    protected,
    repair_session_modes,
    session_directories,
)
from cortexfs.shared.tree import (
    Ownership,
    apply_repairs,
    close_repairs,
    ensure_directories,
    find_repairs,
    open_beneath,
)
from cortexfs.storage import check_space_name

SPACE_DIRS = ("tool", "data", "agent")
QUEUE_DIR = "queue"
SPACE_MODE = 0o2770  # data/ and the queue's directories: the members' to share
SPACE_ROOT_MODE = 0o3770  # the space, agent/ and queue/: each member's entries its own (sticky)
SPACE_TOOL_MODE = 0o2750  # tool/: the owner's alone; the members run what is there
_MODES = {"tool": SPACE_TOOL_MODE, "agent": SPACE_ROOT_MODE, "data": SPACE_MODE}


@dataclass
class SpaceReport:
    """What ``ctx shared create`` did: the space, its group, every path it created and, when
    it gave an existing space another group, the group it had, how many entries moved and
    what kept the old group, with why (``{"path", "reason"}``); and the space's directories
    whose group or mode it repaired, and the session directories whose mode it repaired."""

    path: Path
    gid: int
    created: list[str] = field(default_factory=list)
    regrouped_from: int | None = None
    regrouped: int = 0
    kept: list[dict[str, str]] = field(default_factory=list)
    repaired: list[str] = field(default_factory=list)
    sessions_repaired: list[str] = field(default_factory=list)  # "PATH (mode OLD -> NEW)"

    def to_json(self) -> dict[str, object]:
        return {
            "path": str(self.path),
            "gid": self.gid,
            "created": self.created,
            "regrouped_from": self.regrouped_from,
            "regrouped": self.regrouped,
            "kept": self.kept,
            "repaired": self.repaired,
            "sessions_repaired": self.sessions_repaired,
        }


def space_path(root: Path, name: str) -> Path:
    return root / "shared" / check_object_name(name, "shared space")


def create_shared_space(
    root: Path, name: str, *, gid: int | None = None, ops: durable.FsOps | None = None
) -> SpaceReport:
    """Create ``shared/<name>`` and its four directories where missing, owned by group ``gid``.

    Idempotent: what is missing is created, so a space whose queue came first (``ctx queue
    init``) is completed.  ``gid`` defaults to the group of the space when it exists (a
    repair keeps the space's group, whoever runs it), else to the caller's effective group.
    Without ``gid`` what exists is left as it is; a ``gid`` given for an existing space of
    another group gives it that group (:func:`_regroup`), gives each of the space's own
    directories (:func:`_documented_modes`) that group and its mode where either differs, and
    gives the session directories an older version made the setgid and sticky bits they
    lack (:mod:`cortexfs.shared.session_modes`).
    Every directory made or changed is reached without following a link, and changed only
    when it is this process's own (made here) or, for a repair, the space owner's: EEXIST or
    EPERM names one that is not.  A missing ``tool/`` or ``agent/`` of an existing space is
    made only by its owner or root: EPERM for anyone else, before anything is made.  A queue
    that every queue command would refuse (a config that is a FIFO or a link, a state
    directory that is not a real one) is refused with its path
    (:func:`~cortexfs.queue.layout.check_existing_queue`) before anything is made.  A
    storage root that does not exist (or is an empty directory) is bootstrapped first,
    whole.  Creators run one at a time (:func:`_one_creator_at_a_time`): a second one
    completes, or regroups, the space the first made, as if run after it.
    """
    ops = ops or durable.default_ops()
    path = space_path(root, check_space_name(name))
    created: list[str] = []
    if not _is_real_directory(path.parent):
        # No shared/ to lock yet: the checks come first, so that a refusal still makes
        # nothing, then the storage root (and with it shared/) is made.
        _check_before_making(root, path, name, gid, ops)
        with _completing(path, name, created):
            created += _make_root(root, ops)
    with _one_creator_at_a_time(path.parent):
        return _create_or_complete(root, path, name, gid, ops, created)


def _create_or_complete(
    root: Path, path: Path, name: str, gid: int | None, ops: durable.FsOps, created: list[str]
) -> SpaceReport:
    """The body of :func:`create_shared_space`, run while no other creator runs: the space's
    group is read, and everything checked, anew under the lock, since the creator that held
    it may have made or regrouped the space in the meantime."""
    existing, owner = _check_before_making(root, path, name, gid, ops)
    regrouped_from, regrouped, kept, repairs, sessions_repaired = None, 0, [], [], []
    if gid is not None and existing is not None:
        regrouped_from = existing if existing != gid else None
        # Checked before anything changes: a directory of the space that is not its owner's
        # is refused (EPERM) with the space as it was, and so is a session directory of an
        # older version's mode that the caller may not change.
        repairs = find_repairs(
            ops,
            path.parent,
            _documented_modes(name),
            gid=gid,
            regrouping=regrouped_from,
            made_by=os.stat(path).st_uid,
        )
        try:
            check_session_modes(path)
            if regrouped_from is not None:
                regrouped, kept = _regroup(path, regrouped_from, gid)
        except BaseException:
            close_repairs(ops, repairs)
            raise
    with _completing(path, name, created):
        repaired = apply_repairs(ops, repairs, gid=owner.gid)
        if gid is not None and existing is not None:
            sessions_repaired = repair_session_modes(ops, path)
        created += _make_root(root, ops)
        for parts, mode in _documented_modes(name):
            # Each level reached without following a link, and only a directory made here given
            # the group and mode (tree._require_made_here): a member who swaps another
            # directory in after the mkdir gets EEXIST, and theirs is left as it was.
            created += ensure_directories(ops, path.parent, list(parts), mode=mode, owner=owner)
        queue = path / QUEUE_DIR
        # The config, and the claim hint of a new pending/; a refusal is told by _completing,
        # as the space's.
        created += init_queue(queue, ops, explain_refusals=False)
        if str(queue / "pending") in created:
            start_hint(queue)
    report = SpaceReport(path, os.stat(path).st_gid, created)
    report.regrouped_from, report.regrouped, report.kept = regrouped_from, regrouped, kept
    report.repaired = repaired
    report.sessions_repaired = sessions_repaired
    return report


def _check_before_making(
    root: Path, path: Path, name: str, gid: int | None, ops: durable.FsOps
) -> tuple[int | None, Ownership]:
    """The group the space at ``path`` has (None: there is none yet) and the owner its
    directories get; raises, before anything is made, what the command must refuse."""
    existing = _existing_group(path)
    space_gid = gid if gid is not None else existing
    owner = Ownership(-1, os.getegid() if space_gid is None else space_gid)
    _require_no_obstacle(path)
    # A queue every queue command refuses (its config a FIFO, a state directory a link) is
    # not complete: refused with its path before anything is made, as 'ctx queue init' does.
    check_existing_queue(path / QUEUE_DIR, ops, within=root)
    if gid is not None or existing is None:
        _require_group_of_caller(owner.gid, existing=existing is not None)
    _require_writable_where_missing(path, name)
    _require_owner_where_owners_alone(path, name)
    return existing, owner


def _make_root(root: Path, ops: durable.FsOps) -> list[str]:
    """The storage root's entries made where missing, as full paths (the root ABI reports
    them relative to the root); a root that does not exist, or is an empty directory (made
    for it with mkdir), is bootstrapped whole."""
    if os.path.isdir(root) and not _is_empty_directory(root):
        return [str(root / entry) for entry in storage.ensure_root_abi(root, ops).created]
    return _bootstrap(root)


def _is_empty_directory(path: Path) -> bool:
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False  # not for this check to judge: the root ABI's making says what it meets


def _is_real_directory(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


# How long a creator waits for another to finish.  A creation takes a few fsyncs; a hold
# beyond this is a regroup walking a large data/, a process stuck, or not ours: whoever may
# open shared/ may lock it, an agent's shell.exec among them, and must not hold the host's
# creations up.  The creator then goes on unserialised, as on a filesystem without flock: the
# race the lock prevents leaves at worst a space that the same command run again regroups.
CREATE_LOCK_WAIT_SECONDS = 10.0
_LOCK_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)


@contextlib.contextmanager
def _one_creator_at_a_time(shared: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``shared/``, held for a whole creation or completion.

    Two creators of one space at once interleave otherwise: one makes directories with its
    group after the other's regroup walked past them, and the space is left with two groups,
    a state neither would leave alone.  Serialised, the second finds the space the first
    made and completes it (regroups it, with another ``--group``), as if run after it.
    ``shared/`` is opened without following a link; a filesystem without ``flock`` on
    directories, a ``shared/`` this user may not open for reading (an administrator narrowed
    it), or a lock held past :data:`CREATE_LOCK_WAIT_SECONDS` leaves creators unserialised,
    as they were before this lock."""
    try:
        fd = os.open(shared, _DIRECTORY_FLAGS)
    except PermissionError:
        yield
        return
    try:
        try:
            flock_within(fd, fcntl.LOCK_EX, CREATE_LOCK_WAIT_SECONDS)
        except OSError as exc:
            if exc.errno not in _LOCK_UNSUPPORTED:
                raise
        yield
    finally:
        os.close(fd)  # lets the lock go


@contextlib.contextmanager
def _completing(path: Path, name: str, created: list[str]) -> Iterator[None]:
    """Turn a shortage or a read-only filesystem (:data:`~cortexfs.errors.HOST_TROUBLES`), or
    a disk's I/O error, that cuts the making of space ``name`` short into an error that says
    what was made (``created`` so far), that the space is incomplete and that running the
    command again, once the trouble is mended, completes it."""
    try:
        yield
    except (OSError, CtxError) as exc:
        if exc.errno not in HOST_TROUBLES and exc.errno != errno.EIO:
            raise
        if isinstance(exc, CtxError):
            reason = exc.message
        else:
            where = f" (at {os.fsdecode(exc.filename)})" if exc.filename is not None else ""
            reason = f"{exc.strerror}{where}"
        made = f"made {', '.join(created)}, which is kept" if created else "nothing was made"
        remedy = remedy_for_host_trouble(exc.errno) or DISK_ERROR_REMEDY
        raise CtxError(
            exc.errno,
            f"shared space {path} could not be completed: {reason}; {made}: {remedy}, then "
            f"run 'ctx shared create {name}' again, which completes it",
        ) from None


def _documented_modes(name: str) -> list[tuple[tuple[str, ...], int]]:
    """The space's own directories below ``shared/`` and the mode each has (X-1,
    docs/sessions.md), parents first: the space, ``tool/``, ``data/``, ``agent/``, ``queue/``
    and the queue's six directories."""
    modes = [((name,), SPACE_ROOT_MODE)]
    modes += [((name, directory), _MODES[directory]) for directory in SPACE_DIRS]
    # Sticky too: the six state directories and config are the owner's, so a member cannot
    # rename or remove them (and stop the queue, or have a repair made by root meet a
    # directory of the member's at that name); what is inside them stays the members' to share.
    modes.append(((name, QUEUE_DIR), SPACE_ROOT_MODE))
    modes += [((name, QUEUE_DIR, state), SPACE_MODE) for state in STATE_DIRS]
    return modes


def directories_of_other_modes(path: Path) -> list[tuple[Path, int, int]]:
    """``[(directory, its mode, the mode it should have)]`` for the space at ``path``: its own
    directories (:func:`_documented_modes`) whose mode is not the one this version gives
    them, and its session directories that lack the setgid or sticky bit
    (:mod:`cortexfs.shared.session_modes`): those an older version made.  Each is reached
    without following a link; what is missing, a link or not a directory is skipped (the
    commands that use it say so).
    PermissionError when the caller may not read the space."""
    ops = durable.default_ops()
    found = []
    for parts, wanted in _documented_modes(path.name):
        try:
            fd = open_beneath(ops, path.parent, parts)
        except FileNotFoundError:
            continue
        except CtxError as exc:
            if exc.errno == errno.EACCES:
                raise PermissionError(exc.errno, exc.message) from None
            continue  # a link or no directory: refused by the commands that use it
        try:
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
        finally:
            ops.close(fd)
        if mode != wanted:
            found.append((path.parent.joinpath(*parts), mode, wanted))
    for fd, session in session_directories(path):
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if protected(mode) != mode:
            found.append((session, mode, protected(mode)))
    return found


def _existing_group(path: Path) -> int | None:
    """The group of the space directory at ``path``, None when there is none (or something
    else is there, which :func:`_require_no_obstacle` refuses)."""
    try:
        status = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return status.st_gid if stat.S_ISDIR(status.st_mode) else None


def _regroup(path: Path, old_gid: int, new_gid: int) -> tuple[int, list[dict[str, str]]]:
    """Give the space at ``path`` group ``new_gid``: every entry in it that belongs to
    ``old_gid``, the space's group until now, changes group (entries of any other group were
    given theirs on purpose and keep it).  Returns how many entries changed, and what kept
    the old group and why: files with other names (hard links), which may lie outside the
    space, and what lies deeper than :data:`MAX_REGROUP_DEPTH` directories.

    Each entry is opened without following a link and changed through its descriptor, after
    checking it is still the entry listed: a member who swaps an entry for a link, or for a
    hard link to a file elsewhere, while root regroups the space cannot make root give the
    group anything outside it.  Symbolic links are neither opened nor changed (a link's group
    grants nothing); a socket or a device node, whose group bits say who may connect to it or
    use the device, is opened ``O_PATH`` (neither connected to nor opened as the device) and
    changed as the others are.  A change of group keeps a directory's setgid
    bit (the kernel clears set-id bits of files only).  A caller other than root may change
    only its own entries, so it must own every one of them: EPERM, before anything changes,
    names the first it does not.
    """

    def require_own(fd: int, status: os.stat_result, shown: str) -> None:
        if status.st_gid == old_gid and status.st_uid != os.geteuid():
            raise CtxError(
                errno.EPERM,
                f"{shown} belongs to uid {status.st_uid}, so only root can change its group; "
                "nothing was changed (have root run the command)",
            )

    changed, kept = 0, []

    def change(fd: int, status: os.stat_result, shown: str) -> None:
        nonlocal changed
        if status.st_gid != old_gid:
            return
        if not stat.S_ISDIR(status.st_mode) and status.st_nlink > 1:
            reason = "it has other names (hard links), which may lie outside the space"
            kept.append({"path": shown, "reason": reason})
            return
        _give_group(fd, status, new_gid)
        changed += 1

    def too_deep(shown: str) -> None:
        reason = f"deeper than {MAX_REGROUP_DEPTH} directories: what it holds was not walked"
        kept.append({"path": shown, "reason": reason})

    if os.geteuid() != 0:
        _visit_beneath(path, require_own, lambda shown: None)
    _visit_beneath(path, change, too_deep)
    return changed, kept


MAX_REGROUP_DEPTH = 256  # directories below the space a regroup enters: one descriptor each
_ENTRY_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
# A socket cannot be opened, and opening a device node would open the device: both are
# reached through a descriptor of the entry alone.
_PATH_ONLY_TYPES = (stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK)
_PATH_ONLY_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
Visitor = Callable[[int, os.stat_result, str], None]


def _visit_beneath(path: Path, visit: Visitor, too_deep: Callable[[str], None]) -> None:
    """Call ``visit(fd, fstat, shown)`` for every entry below ``path`` but symbolic links,
    then for ``path`` itself, each opened relative to a descriptor of its own
    directory with ``O_NOFOLLOW``: what is visited is what was listed, never what a link
    names.  The walk keeps its own stack and enters no directory deeper than
    :data:`MAX_REGROUP_DEPTH` (``too_deep`` hears of each), so no tree a member makes stops
    it halfway; ``path`` comes last: a regroup cut short leaves the space's own group as it
    was, so the next run finds the space still to regroup and finishes it."""
    parent_fd = os.open(path.parent, _DIRECTORY_FLAGS)
    try:
        top = _open_listed(parent_fd, path.name)
    finally:
        os.close(parent_fd)
    if top is None:
        return
    top_fd, top_status = top
    try:
        if stat.S_ISDIR(top_status.st_mode):
            _visit_below(top_fd, str(path), visit, too_deep)
        visit(top_fd, top_status, str(path))
    finally:
        os.close(top_fd)


def _visit_below(top_fd: int, shown: str, visit: Visitor, too_deep: Callable[[str], None]) -> None:
    # Each directory's descriptor stays open while its entries are visited: a stack of
    # (descriptor, shown, entries still to visit, last first), as deep as the walk goes.
    stack = [(top_fd, shown, sorted(os.listdir(top_fd), reverse=True))]
    try:
        while stack:
            dir_fd, where, names = stack[-1]
            if not names:
                stack.pop()
                if dir_fd != top_fd:
                    os.close(dir_fd)
                continue
            name = names.pop()
            opened = _open_listed(dir_fd, name)
            if opened is None:
                continue
            fd, status = opened
            try:
                visit(fd, status, f"{where}/{name}")
                entries = (
                    sorted(os.listdir(fd), reverse=True) if stat.S_ISDIR(status.st_mode) else []
                )
            except BaseException:
                os.close(fd)
                raise
            if entries and len(stack) < MAX_REGROUP_DEPTH:
                stack.append((fd, f"{where}/{name}", entries))
                continue
            if entries:
                too_deep(f"{where}/{name}")
            os.close(fd)
    finally:
        for dir_fd, _, _ in stack:
            if dir_fd != top_fd:
                os.close(dir_fd)


def _open_listed(dir_fd: int, name: str) -> tuple[int, os.stat_result] | None:
    """``name`` in ``dir_fd`` opened without following a link (a socket or a device node
    ``O_PATH``: :data:`_PATH_ONLY_TYPES`), and its ``fstat``; None when it is a link (never
    opened), or gone or replaced since it was listed."""
    try:
        listed = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(listed.st_mode):
        return None
    path_only = stat.S_IFMT(listed.st_mode) in _PATH_ONLY_TYPES
    try:
        fd = os.open(name, _PATH_ONLY_FLAGS if path_only else _ENTRY_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.ENXIO):
            return None
        raise
    status = os.fstat(fd)
    if (status.st_dev, status.st_ino) != (listed.st_dev, listed.st_ino):
        os.close(fd)
        return None
    return fd, status


def _give_group(fd: int, status: os.stat_result, gid: int) -> None:
    """Group ``gid`` for the entry open as ``fd`` (by :func:`_open_listed`; ``status`` its
    fstat), through that descriptor: an ``O_PATH`` one, which fchown refuses, through the
    ``/proc/self/fd`` entry that names the very inode it was opened on."""
    if stat.S_IFMT(status.st_mode) in _PATH_ONLY_TYPES:
        durable.default_ops().chown_opened(fd, -1, gid)
    else:
        os.fchown(fd, -1, gid)


def _bootstrap(root: Path) -> list[str]:
    """A storage root that is not there, made whole as ``ctx bootstrap`` makes it (R-2: core
    tools, tsh config, manual), never only the directories a space needs."""
    import cortexfs.bootstrap_steps  # noqa: F401  (every step bootstrap runs)

    report = storage.bootstrap(root)
    error = report.error()
    if error is not None:
        raise error
    return [str(root / entry) for entry in report.created]


def _require_no_obstacle(path: Path) -> None:
    """ENOTDIR, before anything is made, when the root entry ``shared/``, the space or one of
    its directories is in the way as something else (a file, a symlink): creating the others
    first (the root ABI included) would leave a half-made space behind the refusal."""
    for entry in (path.parent, *_space_directories(path)):
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            if not stat.S_ISDIR(os.lstat(entry).st_mode):
                what = "the root entry shared/" if entry == path.parent else "a directory"
                raise CtxError(
                    errno.ENOTDIR,
                    f"{entry} is in the way: it should be {what} of the shared space; "
                    "move it aside, nothing was changed",
                )


def _require_writable_where_missing(path: Path, name: str) -> None:
    """EACCES, saying who may write there and what to do, before anything is made, when the
    first missing directory of the space is to be made where the caller may not write (a
    space of the system's storage root, made by root)."""
    for entry in _space_directories(path):
        if not entry.is_dir():
            if entry.parent.is_dir():
                storage.require_writable(entry.parent, f"create shared space {name}")
            return


# The space's directories only its owner or root may make, and what a member who made one
# could do there: the sticky bit spares no entry from the directory's own owner.
_OWNERS_ALONE = {
    "tool": "put code in it for the agents to run",
    "agent": "rename or remove the other agents' sessions",
}


def _require_owner_where_owners_alone(path: Path, name: str) -> None:
    """EPERM, before anything is made, when a caller who is neither root nor the owner of the
    existing space at ``path`` would make its missing ``tool/`` or ``agent/``: the directory
    would be the caller's.  It cannot be made the space owner's instead, since only root
    gives a directory to another uid.  A new space is the caller's whole, and a complete one
    needs nothing made."""
    try:
        space_owner = os.lstat(path).st_uid
    except (FileNotFoundError, NotADirectoryError):
        return
    if os.geteuid() in (0, space_owner):
        return
    who = "root" if space_owner == 0 else f"the space's owner (uid {space_owner}) or root"
    for directory, would_let in _OWNERS_ALONE.items():
        if not os.path.lexists(path / directory):
            raise CtxError(
                errno.EPERM,
                f"{path / directory} is missing, and only {who} may make it: made by uid "
                f"{os.geteuid()} it would be theirs, who could then {would_let}; nothing was "
                f"made (have {who} run 'ctx shared create {name}')",
            )


def _space_directories(path: Path) -> tuple[Path, ...]:
    """The space at ``path`` and its directories, in the order they are made."""
    return (path, *(path / directory for directory in (*SPACE_DIRS, QUEUE_DIR)))


def _require_group_of_caller(gid: int, *, existing: bool) -> None:
    """EPERM, before anything is made, unless the caller may give its files group ``gid``:
    the kernel lets only root chown to a group the caller is not a member of, and would
    refuse it after the space's directory was already made.  A root must hold the
    capabilities that takes (and, for an ``existing`` space, the one that changes the modes
    of directories others own, its members' sessions)."""
    if gid == os.getegid() or gid in os.getgroups():
        return
    if os.geteuid() == 0:
        # A root whose capability set leaves these out could make the directories but not
        # give them the group, nor keep their setgid bit (the kernel clears it for a caller
        # outside the group): refused before anything is made.
        needed = [capabilities.CAP_CHOWN, capabilities.CAP_FSETID]
        if existing:
            needed.append(capabilities.CAP_FOWNER)
        capabilities.require(f"giving a shared space group {gid} and its setgid bits", *needed)
        return
    raise CtxError(
        errno.EPERM,
        f"you are not a member of group {gid}, so you cannot give a shared space that group; "
        "join the group, or have root create the space",
    )
