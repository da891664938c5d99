"""Installing an object as a pair: the entry ``<name>`` and its control directory ``<name>.d/``.

Tools (T-1, T-8) and agents (A-3) are both an executable entry plus controls.  Readers find
an object by its entry (CTX_PATH looks for the executable, T-4), so the entry must never be
missing, nor its control directory, nor a control be half-written: a reinstall swaps in the
new control directory whole (``renameat2(RENAME_EXCHANGE)``) and then the new entry (an atomic
``rename`` over the old one).  Between the two swaps the old entry stands beside the new
controls; the commit marker ``.<name>~commit`` exists for exactly that long (and no longer),
so a reader that reads controls between two looks at the entry and at the marker
(:mod:`cortexfs.tools.commit_marker`) reads one whole version, and every reader finds one.

Staged names are hidden — a leading dot is not a legal object name (R-3) — and carry a token::

    .<name>~<token>~controls      the new control directory, written and synced, carrying
                                  the previous version's local state (policy, log, hooks, …)
                                  as hard links; after the swap, the previous directory
    .<name>~<token>~entry-tmp     the new entry while it is written
    .<name>~<token>~entry         the new entry, complete and synced
    .<name>~<token>~old-entry     (older versions of this module: the previous entry)
    .<name>~<token>~old-controls  the previous control directory, moved aside where the
                                  filesystem cannot exchange names
    .<name>~commit                the commit marker: the token and the inode number of the
                                  new control directory

The commit; every step is durable (its directory synced) before the next::

    1. stage ~controls (carrying the local state over), write ~entry-tmp, move it to ~entry
    2. write .<name>~commit                                   old version visible
    3. exchange ~controls and <name>.d                        old entry, new controls
    4. rename ~entry over <name>                              new version visible
    5. remove ~controls (now the previous directory), then .<name>~commit

After a crash, :func:`repair_staged` decides from what is left: with a commit marker it rolls
forward (the marker's inode number tells whether step 3 was done), without one the staging is
discarded.  (What older versions of this module left once their commit had begun — the
previous entry moved aside to ``~old-entry``, or a new object's ``~controls`` already moved to
``<name>.d`` — is rolled forward, as they did.)  Installs and repairs of one directory take
turns: each holds the exclusive ``flock`` of the directory's lock file
(:func:`cortexfs.locks.open_lock_file`) from its first look to its last step, never one on the
directory, which any uid that may read it could hold for ever.  A writer of a tool's local
state that must not race a reinstall's carry-over (``tsh.config`` updating ``tsh.d/config``)
takes the same lock: an update is made before the carry-over or into the new directory.

An install that fails (a full disk, no descriptor left) settles its own attempt the same way
before it says so: before its marker is durable it removes its staging, and reports that
nothing was installed; after, it finishes the commit, and the install succeeded.  Neither
needs the resource that ran out — removing takes no space, and the descriptors it needs were
set aside before staging began — so a failed install leaves nothing, and when even that
cannot be done the error names what is left and what settles it.

A reinstall replaces only what an install wrote: the entry (a regular file), the control
directory and, inside it, the controls of ``kind.defined`` (regular files) and the directories
of ``kind.directories``.  Anything else found in one of those places — a directory where the
entry belongs, a file where the control directory belongs — is not ours: it is an
*obstacle* (:mod:`cortexfs.tools.pair_layout`), and the install is refused with nothing
changed (R-5, never destroy user data).

Root may install into a storage root another uid owns (``ctx bootstrap``, ``ctx object
install`` or ``ctx agent create`` run as root).  That uid, the host administrator, records
every call in the object's log (T-7) when it runs the calls itself, so the controls of
``kind.host_written`` that root's install makes are given to it (``host``), their mode and
group kept: a log of root's would refuse every call it runs.  A log left root's by an
earlier version is given the same way by a repair (:func:`repair_staged`, which ``ctx
bootstrap`` runs).  Only a file of one name is given away, so root never hands out a file a
hard link brought in from elsewhere.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cortexfs import durable
from cortexfs.errors import CtxError, exists
from cortexfs.file_attributes import removal_refusal, tree_attribute_refusal
from cortexfs.locks import (
    LOCK_FILE,
    flock_saying_so,
    flock_within,
    lock_holders,
    open_lock_file,
)
from cortexfs.names import is_object_name
from cortexfs.shared.tree import open_beneath
from cortexfs.tools import install_failure
from cortexfs.tools.commit_marker import commit_marker, marked_object
from cortexfs.tools.pair_layout import CONTROLS_SUFFIX, PairKind, obstacles_at

_STAGED = re.compile(
    r"\.(?P<name>[^~/]+)~(?P<token>[0-9a-f]{12})~"
    r"(?P<role>controls|entry-tmp|entry|old-entry|old-controls)"
)

_FINISHED = "finished an interrupted install"
# The entry goes before the controls: a clean-up cut short never leaves a staged entry without
# its controls, which would read as an older version's commit begun (_older_commit_begun).
_DISCARD_ORDER = ("entry-tmp", "entry", "old-entry", "controls", "old-controls")


@dataclass(frozen=True)
class _Staging:
    """The hidden names of one install of ``name``."""

    name: str
    token: str

    def role(self, role: str) -> str:
        return f".{self.name}~{self.token}~{role}"

    @property
    def controls(self) -> str:
        return self.role("controls")

    @property
    def entry_tmp(self) -> str:
        return self.role("entry-tmp")

    @property
    def entry(self) -> str:
        return self.role("entry")

    @property
    def old_entry(self) -> str:
        return self.role("old-entry")

    @property
    def old_controls(self) -> str:
        return self.role("old-controls")


def install_pair(
    directory: Path,
    name: str,
    kind: PairKind,
    *,
    entry: bytes,
    controls: Mapping[str, bytes],
    replace: bool,
    entry_mode: int = 0o755,
    ops: durable.FsOps | None = None,
    settled_by: str = "running the same command again",
    host: int | None = None,
    unless_current: Callable[[], bool] | None = None,
    refuse_under_lock: Callable[[], None] | None = None,
    root: Path | None = None,
) -> bool | None:
    """Install ``name`` in ``directory``; True when it replaced a previous version.

    ``unless_current``: asked under the directory's lock, once interrupted installs are
    settled, whether what is installed is already this version; if so, nothing is done and
    None is returned.  Asked before the lock instead, two runs at once (two bootstraps) would
    both find the object missing, and the second would install it again behind the first.

    ``refuse_under_lock``: called under the lock once the name is found free, to raise the
    refusal of an install that another install into the directory could make wrong between a
    look before the lock and the install (two agents made at once taking one label).

    ``controls`` must define exactly the controls of ``kind.defined`` this version has; a new
    object (without ``replace``) may also give the first content of a default control (an
    agent's log holding its creation, so that the two appear together).
    Without ``replace``, an existing ``name`` or ``name.d`` is EEXIST and nothing changes.
    With it, an :class:`~cortexfs.tools.pair_layout.Obstacle` is refused with its errno
    (EISDIR, ENOTDIR, EEXIST) and nothing changes either.

    An install that fails settles its own attempt before it raises (module docstring): the
    error says that nothing was installed, or — when the clean-up could not run either —
    which hidden names are left and that ``settled_by`` (the command to run) finishes or
    removes them.

    ``host``: the uid of the storage root's owner, who is given the controls of
    ``kind.host_written`` this install makes when it runs as root (module docstring).

    ``root``: the storage root ``directory`` lies in, reached from there without following
    a link (ELOOP or ENOTDIR for one met): a space or a home on the way is a place others may
    change, and a link put there would lead the install out of the root.
    """
    if replace and not controls.keys() <= kind.defined:
        raise ValueError(f"a reinstall replaces only defined controls, not {sorted(controls)}")
    ops = ops or durable.default_ops()
    if root is None:
        dir_fd = durable.open_dir_path(ops, str(directory))
    else:
        dir_fd = open_beneath(ops, root, directory.relative_to(root).parts)
    try:
        try:
            lock = open_lock_file(dir_fd, directory)
        except (OSError, CtxError) as failure:
            raise install_failure.failed_install(
                directory,
                name,
                failure,
                install_failure.Settled(committed=False),
                had_entry=False,
                settled_by=settled_by,
            ) from failure
        with (
            _exclusive(lock, directory),
            install_failure.descriptors_set_aside(dir_fd, directory / name) as release,
        ):
            finished = _repair_before_install(ops, dir_fd, directory, name, kind)
            if unless_current is not None and unless_current():
                return None
            had_entry = durable.lstat_at(dir_fd, name) is not None
            if not replace and (had_entry or durable.lstat_at(dir_fd, name + CONTROLS_SUFFIX)):
                earlier = (
                    " (an earlier install of it, interrupted after its commit, was finished "
                    "just now)"
                    if name in finished
                    else ""
                )
                raise exists(f"{directory / name} already exists{earlier}; it is never overwritten")
            found = obstacles_at(dir_fd, name, kind)
            if found:
                raise CtxError(
                    found[0].errno,
                    f"{directory}/{found[0].sentence()}; it is not ours to replace, so nothing "
                    "was changed: move it away and install again",
                )
            if refuse_under_lock is not None:
                refuse_under_lock()
            if had_entry:
                # The previous version goes whole once the new one is in: a file of it that
                # an attribute pins would stop the commit midway, so it refuses it first.
                pinned = tree_attribute_refusal(
                    dir_fd, [name, name + CONTROLS_SUFFIX], f"install {directory / name}", directory
                )
                if pinned is not None:
                    raise pinned.then("nothing was changed")
            staging = _Staging(name, os.urandom(6).hex())
            receiver = _receiver(host)
            marked = False  # the commit marker is durable: from then on the install completes
            try:
                _stage(ops, dir_fd, staging, kind, entry, entry_mode, controls, receiver)
                _complete_controls(ops, dir_fd, staging, kind, name + CONTROLS_SUFFIX, receiver)
                new_controls = _mark_commit(ops, dir_fd, staging)
                marked = True
                _finish_commit(ops, dir_fd, staging, new_controls)
            except BaseException as failure:
                release()  # the clean-up's descriptors
                settled = _settle_failed_install(ops, dir_fd, staging, marked)
                if settled.finished and isinstance(failure, Exception):
                    return had_entry  # committed, and now finished: the install is done
                if isinstance(failure, OSError | CtxError):
                    raise install_failure.failed_install(
                        directory,
                        name,
                        failure,
                        settled,
                        had_entry=had_entry,
                        settled_by=settled_by,
                    ) from failure
                raise
        return had_entry
    finally:
        ops.close(dir_fd)


def repair_staged(
    directory: Path,
    kind: PairKind,
    ops: durable.FsOps | None = None,
    *,
    host: int | None = None,
    wait: float | None = None,
    root: Path | None = None,
) -> list[str]:
    """Finish or discard what interrupted installs left in ``directory``; say what was done.
    With ``root`` (the storage root ``directory`` lies in), the directories below ``root``
    are reached without following a link (CtxError ELOOP or ENOTDIR for one met).

    Run as root with ``host`` (the storage root's owner) another uid, it also gives that uid
    every control of ``kind.host_written`` still root's (module docstring), and says so.

    A directory whose lock this uid may not take (not its to write, or on a read-only
    filesystem) has nothing done to it: that is no error when nothing is left there to
    finish or discard (``ctx bootstrap`` looks at every space's tier), and the lock's error
    otherwise.  With ``wait``, the lock is waited for that many seconds at most: a directory
    whose lock another process holds longer has nothing done to it either, and EAGAIN says
    which process holds it."""
    ops = ops or durable.default_ops()
    if root is None:
        dir_fd = durable.open_dir_path(ops, str(directory))
    else:
        dir_fd = open_beneath(ops, root, directory.relative_to(root).parts)
    try:
        try:
            lock = open_lock_file(dir_fd, directory)
        except (OSError, CtxError) as refused:
            if refused.errno in _NOT_OURS_TO_CHANGE and not _interrupted_installs(dir_fd):
                return []
            raise
        with _exclusive(lock, directory, wait):
            done = [
                f"{directory}/{name}: {what}" for name, what in _repair_locked(ops, dir_fd, kind)
            ]
            receiver = _receiver(host)
            if receiver is not None:
                done += _give_host_written(ops, dir_fd, directory, kind, receiver)
            return done
    finally:
        ops.close(dir_fd)


def _receiver(host: int | None) -> int | None:
    """The uid to give the host-written controls root makes to: ``host``, when this process is
    root and ``host`` is another uid; None when nothing is to be given."""
    return host if os.geteuid() == 0 and host not in (None, 0) else None


def _write_control(
    ops: durable.FsOps,
    kind: PairKind,
    dir_fd: int,
    control: str,
    data: bytes,
    receiver: int | None,
) -> None:
    """Write ``control`` durably in the control directory ``dir_fd`` with its kind's mode,
    given to ``receiver`` when it is one the host writes to (module docstring)."""
    durable.write_file_synced(
        ops,
        dir_fd,
        control,
        data,
        kind.modes.get(control, 0o644),
        exact_mode=True,
        owner=receiver if control in kind.host_written else None,
    )


def _give_host_written(
    ops: durable.FsOps, dir_fd: int, directory: Path, kind: PairKind, receiver: int
) -> list[str]:
    """Give ``receiver`` each control of ``kind.host_written`` that root has in a control
    directory of ``dir_fd``: ``["<directory>/<name>.d/log: owner uid 0, now uid N …"]``."""
    given = []
    for entry in sorted(os.listdir(dir_fd)):
        name = entry.removesuffix(CONTROLS_SUFFIX)
        if name == entry or not is_object_name(name):
            continue
        try:
            controls_fd = ops.open_dir(entry, dir_fd)
        except OSError:
            continue  # not a control directory (a link, a file): the layout check says so
        try:
            for control in sorted(kind.host_written):
                if give_if_roots(ops, controls_fd, control, receiver):
                    given.append(
                        f"{directory}/{entry}/{control}: owner uid 0, now uid {receiver}, the "
                        "storage root's owner, who records in it the calls it runs"
                    )
        finally:
            ops.close(controls_fd)
    return given


# Why a directory's lock may not be taken by a uid that may only read the directory.
_NOT_OURS_TO_CHANGE = (errno.EACCES, errno.EPERM, errno.EROFS)


def _interrupted_installs(dir_fd: int) -> bool:
    """Whether an interrupted install left a commit marker or a staged name in the directory."""
    return any(_installed_by(entry) is not None for entry in os.listdir(dir_fd))


def install_under_way(dir_fd: int, name: str) -> bool:
    """Whether the directory open as ``dir_fd`` holds a staged name or the commit marker of
    an install of ``name``: one under way, or one a crash interrupted.  False when it cannot
    be listed."""
    try:
        return any(_installed_by(entry) == name for entry in os.listdir(dir_fd))
    except OSError:
        return False


def _installed_by(entry: str) -> str | None:
    """The object whose install the hidden name ``entry`` belongs to (a staged name or a
    commit marker); None for any other entry."""
    staged = _STAGED.fullmatch(entry)
    return staged["name"] if staged else marked_object(entry)


# ------------------------------------------------------------------------------- steps


def _stage(
    ops: durable.FsOps,
    dir_fd: int,
    staging: _Staging,
    kind: PairKind,
    entry: bytes,
    entry_mode: int,
    controls: Mapping[str, bytes],
    receiver: int | None,
) -> None:
    """Step 1: the new version's controls, then its entry; both durable."""
    ops.mkdir(staging.controls, dir_fd, 0o755)
    controls_fd = ops.open_dir(staging.controls, dir_fd)
    try:
        _set_directory_mode(controls_fd)
        for control, data in controls.items():
            _write_control(ops, kind, controls_fd, control, data, receiver)
        durable.sync_dir(ops, controls_fd)
    finally:
        ops.close(controls_fd)
    durable.write_file_synced(ops, dir_fd, staging.entry_tmp, entry, entry_mode, exact_mode=True)
    durable.move_noreplace(ops, dir_fd, staging.entry_tmp, dir_fd, staging.entry)


def _mark_commit(ops: durable.FsOps, dir_fd: int, staging: _Staging) -> int:
    """Step 2: the durable marker, naming the new control directory by its inode number,
    which :func:`_finish_commit` (steps 3 to 5) is given."""
    new_controls = os.stat(staging.controls, dir_fd=dir_fd, follow_symlinks=False).st_ino
    marker = f"{staging.token} {new_controls}\n".encode()
    durable.write_file_synced(ops, dir_fd, commit_marker(staging.name), marker)
    durable.sync_dir(ops, dir_fd)
    return new_controls


def _finish_commit(ops: durable.FsOps, dir_fd: int, staging: _Staging, new_controls: int) -> None:
    """Steps 3 to 5; each is skipped when a crash had already completed it.  ``new_controls``
    (the inode number of the new control directory) tells whether the swap of step 3 was done.
    """
    controls = staging.name + CONTROLS_SUFFIX
    staged = durable.lstat_at(dir_fd, staging.controls)
    if staged is not None and staged.st_ino == new_controls:
        if durable.lstat_at(dir_fd, controls) is None:
            durable.move_noreplace(ops, dir_fd, staging.controls, dir_fd, controls)
        else:
            _swap_controls(ops, dir_fd, staging, controls)
    if durable.lstat_at(dir_fd, staging.entry) is not None:
        durable.replace_synced(ops, dir_fd, staging.entry, dir_fd, staging.name)
    _remove(ops, dir_fd, [staging.controls, staging.old_controls])
    _remove(ops, dir_fd, [commit_marker(staging.name)])


def _swap_controls(ops: durable.FsOps, dir_fd: int, staging: _Staging, controls: str) -> None:
    """Step 3: the new control directory takes the place of the previous one in one step;
    where the filesystem cannot exchange names, the previous one is moved aside first (the
    commit marker tells readers to wait for the end of the commit)."""
    try:
        durable.exchange_synced(ops, dir_fd, staging.controls, controls)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS):
            raise
        durable.move_noreplace(ops, dir_fd, controls, dir_fd, staging.old_controls)
        durable.move_noreplace(ops, dir_fd, staging.controls, dir_fd, controls)


def _publish_interrupted(
    ops: durable.FsOps, dir_fd: int, staging: _Staging, kind: PairKind
) -> None:
    """Roll forward an install that older versions of this module interrupted after they had
    moved the previous entry aside (``~old-entry``): nothing is visible until it is done."""
    controls = staging.name + CONTROLS_SUFFIX
    if durable.lstat_at(dir_fd, staging.controls) is not None:
        if durable.lstat_at(dir_fd, controls) is not None:
            durable.move_noreplace(ops, dir_fd, controls, dir_fd, staging.old_controls)
        _complete_controls(ops, dir_fd, staging, kind, staging.old_controls, None)
        durable.move_noreplace(ops, dir_fd, staging.controls, dir_fd, controls)
    durable.move_noreplace(ops, dir_fd, staging.entry, dir_fd, staging.name)
    _remove(ops, dir_fd, [staging.old_entry, staging.old_controls])


def _complete_controls(
    ops: durable.FsOps,
    dir_fd: int,
    staging: _Staging,
    kind: PairKind,
    previous: str,
    receiver: int | None,
) -> None:
    """Carry the local state of the ``previous`` control directory (if any) over into the
    staged one, then fill in defaults, those of ``kind.host_written`` given to ``receiver``.
    A carried-over control keeps its owner here: it has two names until the commit."""
    new_fd = ops.open_dir(staging.controls, dir_fd)
    try:
        status = durable.lstat_at(dir_fd, previous)
        if status is not None and stat.S_ISDIR(status.st_mode):
            old_fd = ops.open_dir(previous, dir_fd)
            try:
                _carry_over(ops, old_fd, new_fd, skip=kind.defined)
            finally:
                ops.close(old_fd)
        for directory in kind.directories:
            _make_dirs(ops, new_fd, directory)
        for control, data in kind.defaults.items():
            if durable.lstat_at(new_fd, control) is None:
                _write_control(ops, kind, new_fd, control, data, receiver)
        durable.sync_dir(ops, new_fd)
    finally:
        ops.close(new_fd)


def _carry_over(ops: durable.FsOps, old_fd: int, new_fd: int, skip: frozenset[str]) -> None:
    """Hard-link every entry of ``old_fd`` missing from ``new_fd``, recursing into directories.

    Hard links keep the very same files: a log being appended to or a policy being edited
    through an open descriptor lands in the new version too.
    """
    for child in sorted(os.listdir(old_fd)):
        if child in skip:
            continue
        status = durable.lstat_at(old_fd, child)
        if status is None:
            continue
        if stat.S_ISDIR(status.st_mode):
            if durable.lstat_at(new_fd, child) is None:
                ops.mkdir(child, new_fd, stat.S_IMODE(status.st_mode))
            old_child, new_child = ops.open_dir(child, old_fd), ops.open_dir(child, new_fd)
            try:
                _carry_over(ops, old_child, new_child, frozenset())
                durable.sync_dir(ops, new_child)
            finally:
                ops.close(old_child)
                ops.close(new_child)
        elif durable.lstat_at(new_fd, child) is None:
            ops.link(child, old_fd, child, new_fd)


def _repair_locked(ops: durable.FsOps, dir_fd: int, kind: PairKind) -> list[tuple[str, str]]:
    """Settle every interrupted install of the directory: ``(name, what was done)`` for each."""
    done = []
    for entry in sorted(os.listdir(dir_fd)):
        name = marked_object(entry)
        if name is not None:
            done.append((name, _finish_interrupted_commit(ops, dir_fd, name)))
    groups: dict[tuple[str, str], set[str]] = {}
    for entry in os.listdir(dir_fd):
        match = _STAGED.fullmatch(entry)
        if match:
            groups.setdefault((match["name"], match["token"]), set()).add(match["role"])
    for (name, token), roles in sorted(groups.items()):
        staging = _Staging(name, token)
        if _older_commit_begun(dir_fd, staging, roles):
            _publish_interrupted(ops, dir_fd, staging, kind)
            done.append((name, _FINISHED))
        else:
            # Without a commit marker nothing of it was visible: an install that stopped
            # before its marker (or before its own clean-up was done) is discarded.
            _remove(ops, dir_fd, [staging.role(role) for role in _DISCARD_ORDER if role in roles])
            done.append((name, "removed what an interrupted install left behind"))
    return done


def _older_commit_begun(dir_fd: int, staging: _Staging, roles: set[str]) -> bool:
    """Whether ``roles`` are what an older version of this module left once its commit, which
    had no marker, had begun: the previous entry moved aside, or a new object's staged
    controls already moved to ``<name>.d``, its staged entry not yet at ``<name>``.  This
    version's own staging never looks like that."""
    if "entry" not in roles or durable.lstat_at(dir_fd, staging.name) is not None:
        return False
    if "old-entry" in roles:
        return True
    controls_in_place = durable.lstat_at(dir_fd, staging.name + CONTROLS_SUFFIX) is not None
    return "controls" not in roles and controls_in_place


def _finish_interrupted_commit(ops: durable.FsOps, dir_fd: int, name: str) -> str:
    marker = commit_marker(name)
    parsed = _parse_marker(_read_marker(dir_fd, marker))
    if parsed is None:
        # A marker cut short by a crash: it is durable before any swap, so none was made.
        _remove(ops, dir_fd, [marker])
        return "removed the unfinished commit marker of an interrupted install"
    token, new_controls = parsed
    _finish_commit(ops, dir_fd, _Staging(name, token), new_controls)
    return _FINISHED


def _parse_marker(text: str) -> tuple[str, int] | None:
    """The token and the new controls' inode number of a commit marker; None when it is cut
    short (the newline is written last)."""
    try:
        if not text.endswith("\n"):
            raise ValueError(text)
        token, inode = text.split()
        return token, int(inode)
    except ValueError:
        return None


# ------------------------------------------------------------------- a failed install


def _repair_before_install(
    ops: durable.FsOps, dir_fd: int, directory: Path, name: str, kind: PairKind
) -> set[str]:
    """Settle what interrupted installs left in ``directory``; the names whose commit was
    finished."""
    try:
        return {done for done, what in _repair_locked(ops, dir_fd, kind) if what == _FINISHED}
    except (OSError, CtxError) as exc:
        raise install_failure.could_not_look(directory, name, exc) from exc


def _settle_failed_install(
    ops: durable.FsOps, dir_fd: int, staging: _Staging, marked: bool
) -> install_failure.Settled:
    """Finish this install when its commit marker is durable, else remove all it staged.
    ``marked``: the marker was made durable; its absence then means that step 5 removed it
    and only the sync after could fail: the install is complete (a crash before that sync
    may bring the marker back, and a repair rolls forward over a commit already whole)."""
    marker = commit_marker(staging.name)
    mine = [staging.entry_tmp, staging.entry, staging.controls, staging.old_controls, marker]
    committed = False
    try:
        parsed = None
        if durable.lstat_at(dir_fd, marker) is not None:
            parsed = _parse_marker(_read_marker(dir_fd, marker))
        elif marked:
            return install_failure.Settled(committed=True)
        committed = parsed is not None and parsed[0] == staging.token
        if parsed is not None and committed:
            _finish_commit(ops, dir_fd, staging, parsed[1])
        else:
            # A marker of this install cut short goes too; another's is impossible (the
            # directory is locked and was settled first), and would be left alone.
            _remove(ops, dir_fd, mine if parsed is None else mine[:-1])
    except Exception as trouble:
        left = tuple(name for name in mine if durable.lstat_at(dir_fd, name) is not None)
        return install_failure.Settled(committed, left, trouble)
    return install_failure.Settled(committed)


def _read_marker(dir_fd: int, name: str) -> str:
    """The text of a small file of ``dir_fd``, never through a symlink, and never waiting on
    a FIFO someone made at its name: what is there and is no regular file is an OSError
    naming it (a directory's read would say EISDIR without a name)."""
    opening = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(name, opening, dir_fd=dir_fd)
    try:
        kind = os.fstat(fd).st_mode
        if not stat.S_ISREG(kind):
            refused = errno.EISDIR if stat.S_ISDIR(kind) else errno.EINVAL
            raise OSError(refused, f"{os.strerror(refused)}: it is no regular file", name)
        return os.read(fd, 4096).decode("ascii", "replace")
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- primitives


@contextlib.contextmanager
def _exclusive(lock: int, directory: Path, wait: float | None = None) -> Iterator[None]:
    """Hold the exclusive ``flock`` of the lock file of ``directory``, open as ``lock``
    (closed at the end).  Without ``wait`` it is waited for without a time limit: only those
    who may install into the directory can open its lock file, and an install waits for the
    one before it, however long it takes.  With ``wait``, EAGAIN after that many seconds,
    naming the holders :func:`cortexfs.locks.lock_holders` finds."""
    try:
        if wait is None:
            flock_saying_so(lock, fcntl.LOCK_EX, directory / LOCK_FILE)
        elif not flock_within(lock, fcntl.LOCK_EX, wait):
            raise _still_locked(lock, directory, wait)
        yield
    finally:
        os.close(lock)  # lets the lock go


def _still_locked(lock: int, directory: Path, wait: float) -> CtxError:
    holders = lock_holders(lock)
    by = f" (pid {', '.join(map(str, holders))})" if holders else ""
    return CtxError(
        errno.EAGAIN,
        f"{directory / LOCK_FILE} is locked by another process{by}, still after {wait:g} s, "
        f"so nothing was finished or discarded in {directory}: end that process, or wait for "
        "it to let go, and run the command again",
    )


def _set_directory_mode(dir_fd: int) -> None:
    """0755, whatever the installer's umask, keeping the setgid bit a space's directory gave
    the new one: what is made in a shared space belongs to the space's group (X-1), whether
    the tool was installed before the space had its group or after."""
    os.fchmod(dir_fd, 0o755 | (os.fstat(dir_fd).st_mode & stat.S_ISGID))


def _make_dirs(ops: durable.FsOps, top_fd: int, relative: str) -> None:
    fd = os.dup(top_fd)
    try:
        for part in relative.split("/"):
            created = durable.make_dir_synced(ops, fd, part, 0o755)
            inner = ops.open_dir(part, fd)
            if created:
                # Exact, whatever the installer's umask: the agents a tool runs as list and
                # run its hooks (hooks/pre.d, hooks/post.d).
                _set_directory_mode(inner)
            passed, fd = fd, inner  # rebound before the close: the cleanup after a Ctrl-C
            ops.close(passed)  # between the two must not close this one again
    finally:
        ops.close(fd)


def give_if_roots(ops: durable.FsOps, dir_fd: int, name: str, receiver: int) -> bool:
    """Give the regular file ``name`` of ``dir_fd`` to uid ``receiver``, its group and mode
    kept, and sync it, when root owns it and it has no other name; whether it was given.
    Never through a link: the file is opened as it is, and judged by what was opened."""
    try:
        fd = os.open(
            name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd
        )
    except OSError:
        return False  # absent, a link, or not openable: not a control to give
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode) or status.st_uid != 0 or status.st_nlink != 1:
            return False
        ops.chown_opened(fd, receiver)
        durable.sync_file(ops, fd)  # the new owner is durable with the file
        return True
    finally:
        os.close(fd)


def _remove(ops: durable.FsOps, dir_fd: int, names: Sequence[str]) -> None:
    """Remove files and whole trees (never following links), then sync ``dir_fd``."""
    for name in names:
        status = durable.lstat_at(dir_fd, name)
        if status is None:
            continue
        if stat.S_ISDIR(status.st_mode):
            fd = ops.open_dir(name, dir_fd)
            try:
                _remove(ops, fd, os.listdir(fd))
            finally:
                ops.close(fd)
        try:
            durable.remove_entries(ops, [(dir_fd, name, stat.S_ISDIR(status.st_mode))])
        except PermissionError as exc:
            raise removal_refusal(exc, dir_fd, name, "remove what an install left") from exc
    durable.sync_dir(ops, dir_fd)
