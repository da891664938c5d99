"""Projecting a server's tools into v2 manifest candidates (M-1, M-3, M-4).

A remote tool ``t`` of server ``s`` becomes the candidate ``s.t`` — exactly that name, no
``mcp.`` prefix — when ``s.t`` is a legal object name (R-3) and its input schema is a valid
JSON Schema; otherwise it is reported with the reason and skipped.  The candidate's ``mcp``
control locates the tool and nothing more: transport, the configuration file's path *as the
agent will see it* (``--runtime-config``), server and tool.  Command, arguments and
environment stay in that file; nothing of it is copied.

``cap`` is taken from the tool's annotations, conservatively: a tool has side effects unless
it declares ``readOnlyHint``, and may reach the network unless it declares ``openWorldHint``
false (both MCP defaults).  Like every ``cap``, this describes; it grants nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from cortexfs.errors import invalid
from cortexfs.names import object_name_problem
from cortexfs.tools.manifest import MANIFEST_VERSION, manifest_problems
from cortexfs.tools.schemas import schema_problems

MANIFEST_SUFFIX = ".manifest.json"


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
    """The locator's configuration path: absolute, as the agent sees it (M-4); else EINVAL."""
    if not os.path.isabs(runtime_config):
        raise invalid(
            f"--runtime-config {runtime_config!r} must be an absolute path, as the agent sees it"
        )
    return runtime_config


def project_tools(
    server: str, tools: list[dict[str, Any]], runtime_config: str
) -> list[Projection]:
    """The candidates of ``server``'s ``tools``, in the server's order."""
    check_runtime_config(runtime_config)
    return [_project(server, tool, runtime_config) for tool in tools]


def _project(server: str, tool: dict[str, Any], runtime_config: str) -> Projection:
    remote = tool.get("name")
    if not isinstance(remote, str):
        return Projection(repr(remote), "", "", None, "the server gave a tool without a name")
    name = f"{server}.{remote}"
    description = _description(tool, name)
    problem = object_name_problem(name)  # the whole name is the object name (M-3)
    if problem:
        return Projection(remote, name, description, None, f"{name!r}: {problem} (M-3)")
    schema = tool.get("inputSchema")
    problems = schema_problems(schema, "its inputSchema")
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


def _description(tool: dict[str, Any], name: str) -> str:
    for key in ("description", "title"):
        value = tool.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()[:8192]
    return f"{name} (no description given by the server)"


def check_out_directory(out: Path, root: Path) -> None:
    """EINVAL when ``out`` is under ``/ctx`` or the storage root ``root``: ctxmcp writes
    candidates only, never into the tree agents see (M-1); ``ctx object install`` puts them
    there."""
    where = Path(os.path.realpath(out))
    for forbidden in (Path("/ctx"), root):
        resolved = Path(os.path.realpath(forbidden))
        if where == resolved or resolved in where.parents:
            raise invalid(
                f"--out {out} is inside {forbidden}: ctxmcp writes nothing under /ctx or the "
                "storage root (M-1); write the candidates elsewhere and install them with "
                "'ctx object install'"
            )


def write_candidates(projections: list[Projection], out: Path) -> list[Path]:
    """Write each candidate to ``out/<name>.manifest.json`` (the directory is made if
    missing), each in one rename: a reader sees a whole candidate or none."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for projection in projections:
        if projection.manifest is None:
            continue
        path = out / f"{projection.name}{MANIFEST_SUFFIX}"
        temporary = out / f".{path.name}.{os.urandom(6).hex()}.tmp"
        temporary.write_text(json.dumps(projection.manifest, indent=2, ensure_ascii=False) + "\n")
        os.replace(temporary, path)
        written.append(path)
    return written
