"""Writing a projection's candidates into the directory ``--out`` names (M-1, M-4): all of
them or none, each whole, never over another file silently, never inside a storage root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path
from typing import NamedTuple

from cortexfs import durable
from cortexfs.errors import CtxError, exists, explain_host_trouble
from cortexfs.file_attributes import entry_attribute_refusal
from cortexfs.mcp.out_directory import check_out_directory, forbidden_directories, refuse_inside
from cortexfs.mcp.project import Projection, candidate_bytes

MANIFEST_SUFFIX = ".manifest.json"
_CANDIDATE_MODE = 0o644


class Written(NamedTuple):
    path: Path
    replaced: bool  # an earlier candidate of that name was there (only with ``replace``)


def candidate_path(out: Path, projection: Projection) -> Path:
    return out / f"{projection.name}{MANIFEST_SUFFIX}"


def _make_out(out: Path) -> list[Path]:
    """Make the directories of ``out`` that are missing, from the top down; the ones this call
    made, so that a refusal after it can take them back (:func:`_unmake`).  One that appears
    meanwhile is used as it is, and not counted."""
    missing = []
    place = out
    while not os.path.isdir(place) and place.parent != place:
        missing.append(place)
        place = place.parent
    made: list[Path] = []
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            if os.path.isdir(directory):
                continue
            _unmake(made)
            raise _cannot_write(out, os.strerror(errno.EEXIST), errno.EEXIST) from None
        except OSError as exc:
            _unmake(made)
            code = exc.errno or errno.EIO
            raise _cannot_write(out, exc.strerror or str(exc), code, directory.parent) from None
        made.append(directory)
    return made


def _unmake(made: list[Path]) -> None:
    """Remove the directories :func:`_make_out` made, the deepest first, each only when empty."""
    for directory in reversed(made):
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def _open_out(out: Path) -> int:
    """Open ``out`` once, for every candidate; EACCES (or the errno met) naming it and what to
    do when it cannot be written, before any candidate is, instead of naming a temporary file.
    ``out`` may be a link the caller gave: what it leads to is checked
    (:func:`refuse_inside`), not its name."""
    try:
        fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _cannot_write(out, exc.strerror or str(exc), exc.errno or errno.EIO) from None
    if os.access(f"/proc/self/fd/{fd}", os.W_OK | os.X_OK, effective_ids=True):
        return fd
    os.close(fd)
    raise _cannot_write(out, os.strerror(errno.EACCES), errno.EACCES)


def _cannot_write(out: Path, reason: str, code: int, place: Path | None = None) -> CtxError:
    """``code`` writing into ``out`` (in ``place``, on the filesystem that refused): a host
    short of room is told to make some, not to find a directory it may write."""
    trouble = explain_host_trouble(code, filesystem=place, uid=os.geteuid())
    mend = "give a directory you may write"
    if trouble is not None:
        reason += trouble.aside
        mend = f"{trouble.remedy}, or give another --out, then project again"
    return CtxError(
        code, f"cannot write candidates in --out {out}: {reason}; {mend} (nothing was written)"
    )


def write_candidates(
    projections: list[Projection],
    out: Path,
    *,
    replace: bool = False,
    root: Path | None = None,
    ops: durable.FsOps | None = None,
) -> list[Written]:
    """Write each candidate to ``out/<name>.manifest.json`` (the directory is made if
    missing): all of them or, on failure, none, each whole.

    ``out`` is checked again (:func:`check_out_directory`) before any directory of it is
    made, then opened once, and every file is written through that descriptor, after checking
    that the directory it names is not in ``/ctx``, ``root`` (the storage root) or any other
    storage root (:func:`refuse_inside`): whatever replaced ``out`` since the check before the
    server started (the server runs as the caller) cannot lead the candidates there.  Every
    candidate is first written and synced under a temporary name; only when all are does each
    take its name.  A failure (``ENOSPC``, say) removes what this projection wrote, the
    directories it made included, and says so.  An interruption (Ctrl-C, or SIGTERM and
    SIGHUP, which ctxmcp raises as an exception too) leaves no temporary either, and without
    ``replace`` takes back every candidate that took its name, so that nothing was written;
    with it, the candidates replaced before it stay so.

    A candidate already in ``out`` is never overwritten silently: without ``replace`` the
    whole projection is refused with EEXIST, naming them, before anything is written (and a
    file that appears meanwhile is EEXIST too, and the others are taken back); with it, each
    is replaced and said so.  ``ops``: the filesystem operations (:mod:`cortexfs.durable`)
    to write through.
    """
    wanted = [p for p in projections if p.manifest is not None]
    contents = [(p, candidate_bytes(p.manifest)) for p in wanted if p.manifest is not None]
    ops = ops or durable.default_ops()
    check_out_directory(out, root)
    staged: list[_Staged] = []
    made = _make_out(out)
    try:
        out_fd = _open_out(out)
        try:
            refuse_inside(out_fd, out, forbidden_directories(root))
            _refuse_names_in_the_way(out_fd, out, wanted, replace=replace)
            _stage(ops, out_fd, out, contents, staged)
            if replace:
                return _replace_into_place(ops, out_fd, out, staged)
            return _move_into_place(ops, out_fd, out, staged)
        except BaseException as stop:
            # An interruption lands between any two steps, where no failure's own handling
            # runs; tidying up must not fail in its place, or ctxmcp would not end as the
            # signal ends it.
            _remove_quietly(out_fd, [entry.temporary for entry in staged])
            if not replace and not isinstance(stop, Exception):
                _take_back(ops, out_fd, staged)
            raise
        finally:
            os.close(out_fd)
    except BaseException:
        _unmake(made)  # only when empty: what a failure part-way left there stays
        raise


def _refuse_names_in_the_way(
    out_fd: int, out: Path, wanted: list[Projection], *, replace: bool
) -> None:
    """EISDIR for a directory where a candidate goes (never replaceable); EEXIST, without
    ``replace``, for any entry there: before anything is written."""
    in_the_way = {p.name: durable.lstat_at(out_fd, candidate_path(out, p).name) for p in wanted}
    directories = [
        str(candidate_path(out, p))
        for p in wanted
        if (status := in_the_way[p.name]) is not None and stat.S_ISDIR(status.st_mode)
    ]
    if directories:
        raise CtxError(
            errno.EISDIR,
            f"{', '.join(directories)}: a directory where a candidate goes; move it away "
            "(--replace overwrites only files)",
        )
    present = [str(candidate_path(out, p)) for p in wanted if in_the_way[p.name] is not None]
    if present and not replace:
        raise exists(
            f"{', '.join(present)} already "
            f"{'exists' if len(present) == 1 else 'exist'}; give --replace to overwrite "
            "earlier candidates, or another --out"
        )


class _Staged(NamedTuple):
    path: Path  # the candidate's name in OUT
    temporary: str  # where it is, whole and synced, until it takes that name
    # The device and inode of the file once written: what tells it, under the candidate's
    # name, from a file another process put there.
    written: tuple[int, int] | None = None


def _stage(
    ops: durable.FsOps,
    out_fd: int,
    out: Path,
    contents: list[tuple[Projection, bytes]],
    staged: list[_Staged],
) -> None:
    """Every candidate written and synced under a temporary name in ``out``, each entered in
    ``staged`` before its file is made, so that whatever stops the projection finds every
    temporary it made; on failure the ones written are removed and the error says that
    nothing was written."""
    for projection, data in contents:
        path = candidate_path(out, projection)
        temporary = f".{path.name}.{os.urandom(6).hex()}.tmp"
        staged.append(_Staged(path, temporary))
        try:
            durable.write_file_synced(ops, out_fd, temporary, data, _CANDIDATE_MODE)
            status = os.stat(temporary, dir_fd=out_fd, follow_symlinks=False)
        except OSError as exc:
            _remove(out_fd, [entry.temporary for entry in staged])
            raise CtxError(
                exc.errno or errno.EIO,
                f"cannot write the candidate {path}: {exc.strerror or exc}; nothing was "
                f"written (none of the {len(contents)} candidates is in {out}); make room or "
                "give another --out, then project again",
            ) from None
        staged[-1] = staged[-1]._replace(written=(status.st_dev, status.st_ino))


def _move_into_place(
    ops: durable.FsOps, out_fd: int, out: Path, staged: list[_Staged]
) -> list[Written]:
    """Each staged candidate takes its name, never replacing a file; if one cannot (a file
    appeared there meanwhile), the others are taken back and nothing is written."""
    moves = [durable.Move(out_fd, entry.temporary, out_fd, entry.path.name) for entry in staged]
    try:
        outcomes = durable.move_noreplace_batch(ops, moves)
    except OSError as exc:
        _remove(out_fd, [entry.temporary for entry in staged])
        raise CtxError(
            exc.errno or errno.EIO,
            f"cannot make the candidates in {out} durable: {exc.strerror or exc}; whether "
            f"{', '.join(str(entry.path) for entry in staged)} are there after a crash is not "
            "known; project again with --replace",
        ) from None
    refused = [(entry, outcome) for entry, outcome in zip(staged, outcomes, strict=True) if outcome]
    if not refused:
        return [Written(entry.path, False) for entry in staged]
    moved = [
        entry.path.name for entry, outcome in zip(staged, outcomes, strict=True) if not outcome
    ]
    _remove(out_fd, moved + [entry.temporary for entry, _ in refused])
    durable.sync_dir(ops, out_fd)
    entry, error = refused[0]
    if error.errno == errno.EEXIST:
        raise exists(
            f"{entry.path} appeared while ctxmcp wrote it; it was left as it is, and nothing "
            "was written; give --replace to overwrite it, or another --out"
        )
    raise CtxError(
        error.errno or errno.EIO,
        f"cannot write the candidate {entry.path}: {error.strerror or error}; nothing was written",
    )


def _replace_into_place(
    ops: durable.FsOps, out_fd: int, out: Path, staged: list[_Staged]
) -> list[Written]:
    """Each staged candidate replaces its name: earlier candidates cannot be taken back, so a
    failure part-way names what was written and what was not."""
    written: list[Written] = []
    for index, entry in enumerate(staged):
        replaced = durable.lstat_at(out_fd, entry.path.name) is not None
        try:
            durable.replace_synced(ops, out_fd, entry.temporary, out_fd, entry.path.name)
        except OSError as exc:
            _remove(out_fd, [later.temporary for later in staged[index:]])
            done = ", ".join(str(w.path) for w in written) or "none"
            left = ", ".join(str(later.path) for later in staged[index:])
            action = f"write the candidate {entry.path}"
            # An earlier candidate made immutable or append-only refuses root too: say which
            # attribute, and the chattr that lifts it, or --replace would only fail again.
            refused = None
            if exc.errno == errno.EPERM:
                refused = entry_attribute_refusal(out_fd, entry.path.name, action, entry.path)
            why = refused.message if refused else f"cannot {action}: {exc.strerror or exc}"
            raise CtxError(
                exc.errno or errno.EIO,
                f"{why}; written: {done}; not written: {left}; project again with --replace",
            ) from None
        written.append(Written(entry.path, replaced))
    return written


def _remove(out_fd: int, names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=out_fd)


def _remove_quietly(out_fd: int, names: list[str]) -> None:
    """:func:`_remove`, each name that cannot be removed left as it is."""
    for name in names:
        with contextlib.suppress(OSError):
            os.unlink(name, dir_fd=out_fd)


def _take_back(ops: durable.FsOps, out_fd: int, staged: list[_Staged]) -> None:
    """Remove, quietly, each candidate of ``staged`` that took its name: only where that
    name holds the very file this projection wrote."""
    for entry in staged:
        with contextlib.suppress(OSError):
            status = durable.lstat_at(out_fd, entry.path.name)
            if status is not None and (status.st_dev, status.st_ino) == entry.written:
                os.unlink(entry.path.name, dir_fd=out_fd)
    with contextlib.suppress(OSError):
        durable.sync_dir(ops, out_fd)
