"""Projecting a server's tools into v2 manifest candidates (M-1, M-3, M-4).

A remote tool ``t`` of server ``s`` becomes the candidate ``s.t`` — exactly that name, no
``mcp.`` prefix — when ``s.t`` is a legal object name (R-3), its input schema is a valid JSON
Schema that admits an object (MCP passes arguments as one) and the candidate as written fits
in a manifest (:data:`~cortexfs.tools.manifest.MAX_MANIFEST_BYTES`), so that
``ctx object check`` and ``ctx object install`` take it; otherwise it is reported with the
reason and skipped, and so is an entry of the listing that is not a tool object at all.  A
description longer than a manifest holds is cut, and the projection says so (a note).  A
server that lists two tools under one name gets neither projected: which of them ``s.t``
would run cannot be told, so each copy is reported and skipped.  The candidate's ``mcp``
control locates the tool and nothing more: transport, the configuration file's path *as the
agent will see it* (``--runtime-config``), server and tool.  Command, arguments and
environment stay in that file; nothing of it is copied.

``cap`` is taken from the tool's annotations, conservatively: a tool has side effects unless
it declares ``readOnlyHint``, and may reach the network unless it declares ``openWorldHint``
false (both MCP defaults).  Like every ``cap``, this describes; it grants nothing.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

from cortexfs import durable, jsontext
from cortexfs.errors import CtxError, exists, invalid
from cortexfs.mcp.config import config_path_problem
from cortexfs.mcp.out_directory import check_out_directory as check_out_directory
from cortexfs.mcp.out_directory import forbidden_directories, refuse_inside
from cortexfs.mcp.schema import schema_problem
from cortexfs.names import object_name_problem
from cortexfs.tools.manifest import (
    MANIFEST_SCHEMA,
    MANIFEST_VERSION,
    MAX_MANIFEST_BYTES,
    manifest_problems,
)
from cortexfs.tools.schemas import schema_problems

MANIFEST_SUFFIX = ".manifest.json"
# 'ctxmcp list' writes no locator: the candidates it judges name this stand-in configuration.
LISTING_CONFIG = "/.mcp.json"
_CANDIDATE_MODE = 0o644
MAX_DESCRIPTION_CHARACTERS: int = MANIFEST_SCHEMA["properties"]["description"]["maxLength"]
# How much of an entry that is not a tool a report shows.
_SHOWN_CHARACTERS = 60


class Projection(NamedTuple):
    """One remote tool and what became of it: a candidate document, or why not; ``note``,
    what the candidate could not keep of the tool (a description cut to fit)."""

    remote: str
    name: str
    description: str
    manifest: dict[str, Any] | None
    problem: str | None
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": self.remote,
            "name": self.name if self.manifest is not None else None,
            "description": self.description,
            "problem": self.problem,
            "note": self.note,
        }


def check_runtime_config(runtime_config: str) -> str:
    """The locator's configuration path, as :func:`config_path_problem` wants it (M-4);
    else EINVAL, before any server is started."""
    problem = config_path_problem(runtime_config)
    if problem is None and jsontext.lone_surrogate(runtime_config) is not None:
        problem = "it is not UTF-8 text, and a manifest is"
    if problem:
        raise invalid(f"--runtime-config {runtime_config!r}: {problem}")
    return runtime_config


def project_tools(server: str, tools: list[Any], runtime_config: str) -> list[Projection]:
    """The candidates of ``server``'s ``tools`` (the entries of its listing), in the server's
    order."""
    check_runtime_config(runtime_config)
    names = [tool.get("name") for tool in tools if isinstance(tool, dict)]
    copies = Counter(name for name in names if isinstance(name, str))
    projections = []
    for tool in tools:
        projection = _project(server, tool, runtime_config)
        count = copies.get(projection.remote, 0) if projection.name else 0
        if count > 1 and projection.problem is None:
            projection = projection._replace(
                manifest=None,
                problem=f"the server lists {count} tools named {projection.remote!r}, so "
                f"{projection.name!r} could name any of them; none is projected (M-3)",
            )
        projections.append(projection)
    return projections


def _project(server: str, tool: Any, runtime_config: str) -> Projection:
    if not isinstance(tool, dict):
        shown = _shown(tool)
        problem = f"the server listed {shown}, which is not a tool object; MCP lists objects"
        return Projection(shown, "", "", None, problem)
    remote = tool.get("name")
    if not isinstance(remote, str):
        return Projection(_shown(remote), "", "", None, "the server gave a tool without a name")
    name = f"{server}.{remote}"
    description, note = _description(tool, name)
    problem = object_name_problem(name)  # the whole name is the object name (M-3)
    if problem:
        # The object-name rule quotes the name already, cut short; a megabyte of it is not
        # repeated.
        return Projection(remote, name, description, None, f"{problem} (M-3)")
    if "inputSchema" not in tool:
        problem = "the server gave no inputSchema; MCP requires one"
        return Projection(remote, name, description, None, problem)
    character = jsontext.lone_surrogate(description)
    if character is not None:
        problem = f"its description holds {character!r}, a lone surrogate, which is not a character"
        return Projection(remote, name, description, None, problem)
    schema = tool["inputSchema"]
    # Depth first: the checks after it recurse into the schema.
    problem = schema_problem(schema)
    if problem:
        return Projection(remote, name, description, None, problem)
    problems = schema_problems(schema, "its inputSchema") or _arguments_problems(schema)
    if problems:
        return Projection(remote, name, description, None, problems[0])
    annotations = tool.get("annotations") if isinstance(tool.get("annotations"), dict) else {}
    document = {
        "manifest": MANIFEST_VERSION,
        "kind": "tool",
        "name": name,
        "description": description,
        "schema": schema,
        "cap": {
            "side_effects": annotations.get("readOnlyHint") is not True,
            "network": annotations.get("openWorldHint") is not False,
        },
        "mcp": {"transport": "stdio", "config": runtime_config, "server": server, "tool": remote},
    }
    size = len(candidate_bytes(document))
    if size > MAX_MANIFEST_BYTES:
        problem = (
            f"its candidate would be {size} bytes, and a manifest is at most "
            f"{MAX_MANIFEST_BYTES}, so 'ctx object check' and 'ctx object install' would refuse "
            "it (its inputSchema is too large)"
        )
        return Projection(remote, name, description, None, problem)
    problems = manifest_problems(document, Path("/"))
    if problems:
        return Projection(remote, name, description, None, problems[0])
    return Projection(remote, name, description, document, None, note)


def candidate_bytes(document: dict[str, Any]) -> bytes:
    """The candidate ``document`` as its file holds it."""
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode()


def _shown(value: Any) -> str:
    """A value of the server's, as a report names it: in JSON, as the server gave it, cut
    short."""
    shown = json.dumps(value)
    return shown if len(shown) <= _SHOWN_CHARACTERS else f"{shown[:_SHOWN_CHARACTERS]}…"


def _arguments_problems(schema: dict[str, Any]) -> list[str]:
    """A tools/call carries its arguments as an object: a schema whose type admits no object
    would make a tool no input can call (every object fails it, anything else the server
    refuses)."""
    declared = schema.get("type", "object")
    types = declared if isinstance(declared, list) else [declared]
    if "object" in types:
        return []
    return [
        f"its inputSchema has type {declared!r}, but MCP passes a tool's arguments as an "
        "object: no call could satisfy it"
    ]


def _description(tool: dict[str, Any], name: str) -> tuple[str, str | None]:
    """The candidate's description, and a note when the tool's had to be cut to fit."""
    for key in ("description", "title"):
        value = tool.get(key)
        if isinstance(value, str) and value.strip():
            text = value.strip()
            if len(text) <= MAX_DESCRIPTION_CHARACTERS:
                return text, None
            cut = text[:MAX_DESCRIPTION_CHARACTERS].rstrip()
            note = (
                f"its {key} of {len(text)} characters was cut to its first {len(cut)}: a "
                f"manifest's description holds at most {MAX_DESCRIPTION_CHARACTERS}"
            )
            return cut, note
    return f"{name} (no description given by the server)", None


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
            raise _cannot_write(out, exc.strerror or str(exc), exc.errno or errno.EIO) from None
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


def _cannot_write(out: Path, reason: str, code: int) -> CtxError:
    return CtxError(
        code,
        f"cannot write candidates in --out {out}: {reason}; give a directory you may write "
        "(nothing was written)",
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
            raise CtxError(
                exc.errno or errno.EIO,
                f"cannot write the candidate {entry.path}: {exc.strerror or exc}; written: "
                f"{done}; not written: {left}; project again with --replace",
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
