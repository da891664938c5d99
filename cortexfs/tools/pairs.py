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
discarded (an older version's ``~entry`` without ``<name>`` is rolled forward as it was).
Installs and repairs of one directory hold an exclusive ``flock`` on it.

A reinstall replaces only what an install wrote: the entry (a regular file), the control
directory and, inside it, the controls of ``kind.defined`` (regular files) and the directories
of ``kind.directories``.  Anything else found in one of those places — a directory where the
entry belongs, a file where the control directory belongs — is not ours: it is an
*obstacle* (:mod:`cortexfs.tools.pair_layout`), and the install is refused with nothing
changed (R-5, never destroy user data).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cortexfs import durable
from cortexfs.errors import CtxError, exists
from cortexfs.tools.commit_marker import commit_marker, marked_object
from cortexfs.tools.pair_layout import CONTROLS_SUFFIX, PairKind, obstacles_at

_STAGED = re.compile(
    r"\.(?P<name>[^~/]+)~(?P<token>[0-9a-f]{12})~"
    r"(?P<role>controls|entry-tmp|entry|old-entry|old-controls)"
)


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
) -> bool:
    """Install ``name`` in ``directory``; True when it replaced a previous version.

    ``controls`` must define exactly the controls of ``kind.defined`` this version has.
    Without ``replace``, an existing ``name`` or ``name.d`` is EEXIST and nothing changes.
    With it, an :class:`~cortexfs.tools.pair_layout.Obstacle` is refused with its errno
    (EISDIR, ENOTDIR, EEXIST) and nothing changes either.
    """
    ops = ops or durable.default_ops()
    dir_fd = durable.open_dir_path(ops, str(directory))
    try:
        with _exclusive(dir_fd):
            _repair_locked(ops, dir_fd, kind)
            had_entry = durable.lstat_at(dir_fd, name) is not None
            if not replace and (had_entry or durable.lstat_at(dir_fd, name + CONTROLS_SUFFIX)):
                raise exists(f"{directory / name} already exists; it is never overwritten")
            found = obstacles_at(dir_fd, name, kind)
            if found:
                raise CtxError(
                    found[0].errno,
                    f"{directory}/{found[0].sentence()}; it is not ours to replace, so nothing "
                    "was changed: move it away and install again",
                )
            staging = _Staging(name, os.urandom(6).hex())
            try:
                _stage(ops, dir_fd, staging, kind, entry, entry_mode, controls)
                with _previous_controls_locked(ops, dir_fd, name + CONTROLS_SUFFIX):
                    _complete_controls(ops, dir_fd, staging, kind, name + CONTROLS_SUFFIX)
                    _commit(ops, dir_fd, staging)
            except BaseException:
                # Before the commit marker this discards the staging; after it, it finishes
                # the commit rather than leave two versions side by side.
                _repair_locked(ops, dir_fd, kind)
                raise
        return had_entry
    finally:
        ops.close(dir_fd)


def repair_staged(directory: Path, kind: PairKind, ops: durable.FsOps | None = None) -> list[str]:
    """Finish or discard what interrupted installs left in ``directory``; say what was done."""
    ops = ops or durable.default_ops()
    dir_fd = durable.open_dir_path(ops, str(directory))
    try:
        with _exclusive(dir_fd):
            return [f"{directory}/{line}" for line in _repair_locked(ops, dir_fd, kind)]
    finally:
        ops.close(dir_fd)


# ------------------------------------------------------------------------------- steps


def _stage(
    ops: durable.FsOps,
    dir_fd: int,
    staging: _Staging,
    kind: PairKind,
    entry: bytes,
    entry_mode: int,
    controls: Mapping[str, bytes],
) -> None:
    """Step 1: the new version's controls, then its entry; both durable."""
    ops.mkdir(staging.controls, dir_fd, 0o755)
    controls_fd = ops.open_dir(staging.controls, dir_fd)
    try:
        os.fchmod(controls_fd, 0o755)
        for control, data in controls.items():
            durable.write_file_synced(
                ops, controls_fd, control, data, kind.modes.get(control, 0o644), exact_mode=True
            )
        durable.sync_dir(ops, controls_fd)
    finally:
        ops.close(controls_fd)
    durable.write_file_synced(ops, dir_fd, staging.entry_tmp, entry, entry_mode, exact_mode=True)
    durable.move_noreplace(ops, dir_fd, staging.entry_tmp, dir_fd, staging.entry)


def _commit(ops: durable.FsOps, dir_fd: int, staging: _Staging) -> None:
    """Steps 2 to 5: the marker, then the two swaps."""
    new_controls = os.stat(staging.controls, dir_fd=dir_fd, follow_symlinks=False).st_ino
    marker = f"{staging.token} {new_controls}\n".encode()
    durable.write_file_synced(ops, dir_fd, commit_marker(staging.name), marker)
    durable.sync_dir(ops, dir_fd)
    _finish_commit(ops, dir_fd, staging, new_controls)


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
        _complete_controls(ops, dir_fd, staging, kind, staging.old_controls)
        durable.move_noreplace(ops, dir_fd, staging.controls, dir_fd, controls)
    durable.move_noreplace(ops, dir_fd, staging.entry, dir_fd, staging.name)
    _remove(ops, dir_fd, [staging.old_entry, staging.old_controls])


def _complete_controls(
    ops: durable.FsOps, dir_fd: int, staging: _Staging, kind: PairKind, previous: str
) -> None:
    """Carry the local state of the ``previous`` control directory (if any) over into the
    staged one, then fill in defaults."""
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
                durable.write_file_synced(
                    ops, new_fd, control, data, kind.modes.get(control, 0o644), exact_mode=True
                )
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


def _repair_locked(ops: durable.FsOps, dir_fd: int, kind: PairKind) -> list[str]:
    done = []
    for entry in sorted(os.listdir(dir_fd)):
        name = marked_object(entry)
        if name is not None:
            done.append(_finish_interrupted_commit(ops, dir_fd, name))
    groups: dict[tuple[str, str], set[str]] = {}
    for entry in os.listdir(dir_fd):
        match = _STAGED.fullmatch(entry)
        if match:
            groups.setdefault((match["name"], match["token"]), set()).add(match["role"])
    for (name, token), roles in sorted(groups.items()):
        staging = _Staging(name, token)
        if "entry" in roles and durable.lstat_at(dir_fd, name) is None:
            _publish_interrupted(ops, dir_fd, staging, kind)
            done.append(f"{name}: finished an interrupted install")
        else:
            _remove(ops, dir_fd, [staging.role(role) for role in sorted(roles)])
            done.append(f"{name}: removed what an interrupted install left behind")
    return done


def _finish_interrupted_commit(ops: durable.FsOps, dir_fd: int, name: str) -> str:
    marker = commit_marker(name)
    text = _read_marker(dir_fd, marker)
    try:
        if not text.endswith("\n"):  # the newline is written last
            raise ValueError(text)
        token, inode = text.split()
        staging, new_controls = _Staging(name, token), int(inode)
    except ValueError:
        # A marker cut short by a crash: it is durable before any swap, so none was made.
        _remove(ops, dir_fd, [marker])
        return f"{name}: removed the unfinished commit marker of an interrupted install"
    _finish_commit(ops, dir_fd, staging, new_controls)
    return f"{name}: finished an interrupted install"


def _read_marker(dir_fd: int, name: str) -> str:
    """The text of a small file of ``dir_fd``, never through a symlink."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return os.read(fd, 4096).decode("ascii", "replace")
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- primitives


@contextlib.contextmanager
def _exclusive(dir_fd: int) -> Iterator[None]:
    fcntl.flock(dir_fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(dir_fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def _previous_controls_locked(ops: durable.FsOps, dir_fd: int, controls: str) -> Iterator[None]:
    """Hold the previous control directory's exclusive ``flock`` from the carry-over of its
    local state to the swap, so that a writer of local state that takes it (``tsh.config``
    updating ``tsh.d/config``) writes before the carry-over or into the new directory, and
    its update is never left behind in the directory the swap retires."""
    status = durable.lstat_at(dir_fd, controls)
    if status is None or not stat.S_ISDIR(status.st_mode):
        yield
        return
    fd = ops.open_dir(controls, dir_fd)
    try:
        with _exclusive(fd):
            yield
    finally:
        ops.close(fd)


def _make_dirs(ops: durable.FsOps, top_fd: int, relative: str) -> None:
    fd = os.dup(top_fd)
    try:
        for part in relative.split("/"):
            created = durable.make_dir_synced(ops, fd, part, 0o755)
            inner = ops.open_dir(part, fd)
            if created:
                # Exact, whatever the installer's umask: the agents a tool runs as list and
                # run its hooks (hooks/pre.d, hooks/post.d).
                os.fchmod(inner, 0o755)
            ops.close(fd)
            fd = inner
    finally:
        ops.close(fd)


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
        durable.remove_entries(ops, [(dir_fd, name, stat.S_ISDIR(status.st_mode))])
    durable.sync_dir(ops, dir_fd)
