"""Projecting a server's tools into v2 manifest candidates (M-1, M-3, M-4).

A remote tool ``t`` of server ``s`` becomes the candidate ``s.t`` — exactly that name, no
``mcp.`` prefix — when ``s.t`` is a legal object name (R-3) and its input schema is a valid
JSON Schema that admits an object (MCP passes arguments as one); otherwise it is reported with
the reason and skipped.  A server that lists two tools under one name gets neither projected:
which of them ``s.t`` would run cannot be told, so each copy is reported and skipped.  The
candidate's ``mcp`` control locates the tool and nothing more: transport, the configuration
file's path *as the agent will see it* (``--runtime-config``), server and tool.  Command,
arguments and environment stay in that file; nothing of it is copied.

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

from cortexfs import durable
from cortexfs.errors import CtxError, exists, invalid
from cortexfs.fuse.mounts import cortexfs_mount_holding
from cortexfs.names import object_name_problem
from cortexfs.tools.manifest import MANIFEST_VERSION, config_path_problem, manifest_problems
from cortexfs.tools.schemas import schema_problems

MANIFEST_SUFFIX = ".manifest.json"
# 'ctxmcp list' writes no locator: the candidates it judges name this stand-in configuration.
LISTING_CONFIG = "/.mcp.json"
_CANDIDATE_MODE = 0o644


class Projection(NamedTuple):
    """One remote tool and what became of it: a candidate document, or why not."""

    remote: str
    name: str
    description: str
    manifest: dict[str, Any] | None
    problem: str | None

    def to_json(self) -> dict[str, Any]:
        return {
            "tool": self.remote,
            "name": self.name if self.manifest is not None else None,
            "description": self.description,
            "problem": self.problem,
        }


def check_runtime_config(runtime_config: str) -> str:
    """The locator's configuration path, as :func:`config_path_problem` wants it (M-4);
    else EINVAL, before any server is started."""
    problem = config_path_problem(runtime_config)
    if problem:
        raise invalid(f"--runtime-config {runtime_config!r}: {problem}")
    return runtime_config


def project_tools(
    server: str, tools: list[dict[str, Any]], runtime_config: str
) -> list[Projection]:
    """The candidates of ``server``'s ``tools``, in the server's order."""
    check_runtime_config(runtime_config)
    copies = Counter(tool.get("name") for tool in tools if isinstance(tool.get("name"), str))
    projections = []
    for tool in tools:
        projection = _project(server, tool, runtime_config)
        count = copies.get(tool.get("name"), 0)
        if count > 1 and projection.problem is None:
            projection = projection._replace(
                manifest=None,
                problem=f"the server lists {count} tools named {projection.remote!r}, so "
                f"{projection.name!r} could name any of them; none is projected (M-3)",
            )
        projections.append(projection)
    return projections


def _project(server: str, tool: dict[str, Any], runtime_config: str) -> Projection:
    remote = tool.get("name")
    if not isinstance(remote, str):
        return Projection(repr(remote), "", "", None, "the server gave a tool without a name")
    name = f"{server}.{remote}"
    description = _description(tool, name)
    problem = object_name_problem(name)  # the whole name is the object name (M-3)
    if problem:
        return Projection(remote, name, description, None, f"{name!r}: {problem} (M-3)")
    if "inputSchema" not in tool:
        problem = "the server gave no inputSchema; MCP requires one"
        return Projection(remote, name, description, None, problem)
    schema = tool["inputSchema"]
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
    problems = manifest_problems(document, Path("/"))
    if problems:
        return Projection(remote, name, description, None, problems[0])
    return Projection(remote, name, description, document, None)


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


def _description(tool: dict[str, Any], name: str) -> str:
    for key in ("description", "title"):
        value = tool.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()[:8192]
    return f"{name} (no description given by the server)"


def check_out_directory(out: Path, root: Path) -> None:
    """EINVAL when ``out`` is under ``/ctx``, the storage root ``root`` or any mount of a
    storage root, wherever it is mounted: ctxmcp writes candidates only, never into the tree
    agents see (M-1); ``ctx object install`` puts them there."""
    mount = cortexfs_mount_holding(out)
    if mount is not None:
        raise invalid(
            f"--out {out} is inside {mount}, a mount of a storage root (ctx mount): ctxmcp "
            "writes nothing under /ctx or the storage root (M-1); write the candidates "
            "elsewhere and install them with 'ctx object install'"
        )
    where = Path(os.path.realpath(out))
    for forbidden in (Path("/ctx"), root):
        resolved = Path(os.path.realpath(forbidden))
        if where == resolved or resolved in where.parents:
            raise invalid(
                f"--out {out} is inside {forbidden}: ctxmcp writes nothing under /ctx or the "
                "storage root (M-1); write the candidates elsewhere and install them with "
                "'ctx object install'"
            )


class Written(NamedTuple):
    path: Path
    replaced: bool  # an earlier candidate of that name was there (only with ``replace``)


def candidate_path(out: Path, projection: Projection) -> Path:
    return out / f"{projection.name}{MANIFEST_SUFFIX}"


def _is_directory(path: Path) -> bool:
    with contextlib.suppress(FileNotFoundError):
        return stat.S_ISDIR(os.lstat(path).st_mode)
    return False


def _ensure_writable_out(out: Path) -> None:
    """Make ``out`` when missing; EACCES (or the errno met) naming it and what to do when it
    cannot be made or written, before any candidate is, instead of naming a temporary file."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        if os.access(out, os.W_OK | os.X_OK, effective_ids=True):
            return
        reason = os.strerror(errno.EACCES)
        code = errno.EACCES
    except OSError as exc:
        reason, code = exc.strerror or str(exc), exc.errno or errno.EIO
    raise CtxError(
        code,
        f"cannot write candidates in --out {out}: {reason}; give a directory you may write "
        "(nothing was written)",
    )


def write_candidates(
    projections: list[Projection],
    out: Path,
    *,
    replace: bool = False,
    ops: durable.FsOps | None = None,
) -> list[Written]:
    """Write each candidate to ``out/<name>.manifest.json`` (the directory is made if
    missing), each in one step: a reader sees a whole candidate or none.

    A candidate already in ``out`` is never overwritten silently: without ``replace`` the
    whole projection is refused with EEXIST, naming them, before anything is written (and a
    file that appears meanwhile is EEXIST too); with it, each is replaced and said so.
    ``ops``: the filesystem operations (:mod:`cortexfs.durable`) to write through.
    """
    wanted = [p for p in projections if p.manifest is not None]
    directories = [str(path) for p in wanted if _is_directory(path := candidate_path(out, p))]
    if directories:  # never replaceable: refused before anything is written
        raise CtxError(
            errno.EISDIR,
            f"{', '.join(directories)}: a directory where a candidate goes; move it away "
            "(--replace overwrites only files)",
        )
    if not replace:
        present = [str(path) for p in wanted if (path := candidate_path(out, p)).exists()]
        if present:
            raise exists(
                f"{', '.join(present)} already "
                f"{'exists' if len(present) == 1 else 'exist'}; give --replace to overwrite "
                "earlier candidates, or another --out"
            )
    _ensure_writable_out(out)
    ops = ops or durable.default_ops()
    out_fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # --out may be a link
    try:
        return [_write_candidate(ops, out_fd, out, p, replace=replace) for p in wanted]
    finally:
        os.close(out_fd)


def _write_candidate(
    ops: durable.FsOps, out_fd: int, out: Path, projection: Projection, *, replace: bool
) -> Written:
    """One candidate, whole and durable before it is reported written: a crash leaves the
    earlier file or the new one, never an empty candidate."""
    path = candidate_path(out, projection)
    data = (json.dumps(projection.manifest, indent=2, ensure_ascii=False) + "\n").encode()
    if replace:
        replaced = path.exists()
        durable.replace_file_synced(ops, out_fd, path.name, data, _CANDIDATE_MODE)
        return Written(path, replaced)
    temporary = f".{path.name}.{os.urandom(6).hex()}.tmp"
    durable.write_file_synced(ops, out_fd, temporary, data, _CANDIDATE_MODE)
    try:
        durable.move_noreplace(ops, out_fd, temporary, out_fd, path.name)
    except FileExistsError:
        raise exists(f"{path} appeared while ctxmcp wrote it; it was left as it is") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=out_fd)
    return Written(path, False)
