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

import json
from collections import Counter
from pathlib import Path
from typing import Any, NamedTuple

from cortexfs import jsontext
from cortexfs.errors import invalid
from cortexfs.mcp.config import config_path_problem
from cortexfs.mcp.schema import schema_problem
from cortexfs.names import object_name_problem
from cortexfs.tools.manifest import (
    MANIFEST_SCHEMA,
    MANIFEST_VERSION,
    MAX_MANIFEST_BYTES,
    manifest_problems,
)
from cortexfs.tools.schemas import schema_problems

# 'ctxmcp list' writes no locator: the candidates it judges name this stand-in configuration.
LISTING_CONFIG = "/.mcp.json"
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
