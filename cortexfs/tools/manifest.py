"""Object manifests, version 2 (SPEC T-8): what ``ctx object check`` validates and installs.

A v2 manifest is one JSON object::

    {
      "manifest": 2,
      "kind": "tool",
      "name": "fs.read",                          an object name (R-3)
      "description": "Read a file …",
      "schema": {"type": "object", …},            the input JSON Schema; must be a valid schema
      "cap": {"side_effects": false, "network": false},   declared facts (see below)
      "exec": "bin/fs-read",                      the program, relative to the manifest …
      "mcp": {"transport": "stdio", …},           … or the locator of an MCP-backed tool (M-4)
      "program": {"type": "object", …}            optional success-result schema (C-2)
    }

``cap`` is any JSON object of declared facts.  ``side_effects`` and ``network``, when present,
are booleans; a fact left out counts as the cautious value (side effects possible, network
possible: :func:`cortexfs.tools.controls.cap_fact`).  Facts describe; they grant nothing.

Exactly one of ``exec`` and ``mcp``.  Nothing in a manifest grants anything: there is no
policy field, and the installed ``policy`` control starts empty (default deny, P-2).
:func:`check_manifest` lists *every* reason a manifest is invalid, not just the first.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cortexfs import jsontext
from cortexfs.errors import CtxError
from cortexfs.names import object_name_problem
from cortexfs.tools.schemas import brief_message, schema_problems

if TYPE_CHECKING:
    from jsonschema import ValidationError

MANIFEST_VERSION = 2
MAX_MANIFEST_BYTES = 1024 * 1024
MAX_PROGRAM_BYTES = 64 * 1024 * 1024

# The shape of a manifest; names, embedded schemas and the exec file are checked in code so
# that each problem gets a sentence of its own.
MANIFEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["manifest", "kind", "name", "description", "schema", "cap"],
    "additionalProperties": False,
    "properties": {
        "manifest": {"const": MANIFEST_VERSION},
        "kind": {"const": "tool"},
        "name": {"type": "string"},
        "description": {"type": "string", "minLength": 1, "maxLength": 8192},
        "schema": {"type": "object"},
        "cap": {
            "type": "object",
            "properties": {"side_effects": {"type": "boolean"}, "network": {"type": "boolean"}},
        },
        "exec": {"type": "string", "minLength": 1},
        "mcp": {
            "type": "object",
            "required": ["transport", "config", "server", "tool"],
            "additionalProperties": False,
            "properties": {
                "transport": {"const": "stdio"},
                "config": {"type": "string", "pattern": "^/"},
                "server": {"type": "string"},
                "tool": {"type": "string"},
            },
        },
        "program": {"type": "object"},
    },
}


class ManifestError(CtxError):
    """EINVAL for an invalid manifest; :attr:`problems` holds every reason."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        super().__init__(errno.EINVAL, f"{source}: {problems[0]}{more}")
        self.source = source
        self.problems = tuple(problems)


@dataclass(frozen=True)
class Manifest:
    """A valid v2 manifest."""

    source: Path
    name: str
    description: str
    schema: dict[str, Any]
    cap: dict[str, Any]
    exec_path: Path | None
    mcp: dict[str, str] | None
    program: dict[str, Any] | None

    def controls(self) -> dict[str, bytes]:
        """The controls this manifest defines, as files of the installed ``<name>.d/``."""
        files = {
            "name": f"{self.name}\n".encode(),
            "description": f"{self.description.rstrip()}\n".encode(),
            "schema": _json_file(self.schema),
            "cap": _json_file(self.cap),
        }
        if self.program is not None:
            files["program"] = _json_file(self.program)
        if self.mcp is not None:
            files["mcp"] = _json_file(self.mcp)
        return files

    def read_program(self) -> bytes:
        """The bytes of the ``exec`` program; an MCP-backed tool has none (ENOSYS: it is
        installed with the bridge built into ctx, see ``install_manifest``)."""
        if self.exec_path is None:
            raise CtxError(errno.ENOSYS, f"{self.name} is MCP-backed: it has no program of its own")
        return self.exec_path.read_bytes()


def load_manifest(path: Path) -> Manifest:
    """Read and validate the manifest at ``path``; :class:`ManifestError` lists every problem."""
    source = str(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_MANIFEST_BYTES + 1)
    except OSError as exc:
        raise CtxError(exc.errno or errno.EIO, f"cannot read {source}: {exc.strerror}") from None
    if len(data) > MAX_MANIFEST_BYTES:
        raise ManifestError(source, [f"a manifest is at most {MAX_MANIFEST_BYTES} bytes"])
    try:
        document = jsontext.loads_strict(data)
    except jsontext.DuplicateNames as exc:
        # A reviewer could approve one `exec` while another is installed: every problem of
        # the manifest as Python reads it is listed too, so that one round fixes them all.
        document = jsontext.loads_strict(data, unique_names=False)
        problems = [f"the manifest {jsontext.duplicate_names_problem(exc.names)}"]
        raise ManifestError(source, problems + manifest_problems(document, path.parent)) from None
    except jsontext.NotAJsonNumber as exc:
        raise ManifestError(source, [f"not JSON: {exc} is not a JSON number"]) from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ManifestError(source, [f"not JSON: {exc}"]) from None
    return parse_manifest(document, source=path)


def parse_manifest(document: object, *, source: Path) -> Manifest:
    """Validate a decoded manifest; ``exec`` is resolved against ``source``'s directory."""
    problems = manifest_problems(document, source.parent)
    if problems:
        raise ManifestError(str(source), problems)
    assert isinstance(document, dict)
    exec_value = document.get("exec")
    return Manifest(
        source=source,
        name=document["name"],
        description=document["description"],
        schema=document["schema"],
        cap=document["cap"],
        exec_path=None if exec_value is None else _exec_path(exec_value, source.parent),
        mcp=document.get("mcp"),
        program=document.get("program"),
    )


def manifest_problems(document: object, base: Path) -> list[str]:
    """Every reason ``document`` is not a valid v2 manifest; empty when it is one."""
    import jsonschema  # here: about 100 ms that no other command of ctx needs

    validator = jsonschema.Draft202012Validator(MANIFEST_SCHEMA)
    problems = [_describe(error) for error in validator.iter_errors(document)]
    if not isinstance(document, dict):
        return problems
    name = document.get("name")
    if isinstance(name, str):
        problem = object_name_problem(name)
        if problem:
            problems.append(f"name: {problem}")
    description = document.get("description")
    if isinstance(description, str) and description and not description.strip():
        # Installed with its trailing blanks cut, it would be an empty control (T-1).
        problems.append("description: only blanks; say what the tool does")
    if isinstance(document.get("schema"), dict):
        problems += schema_problems(document["schema"], "schema")
    if isinstance(document.get("program"), dict):
        problems += schema_problems(document["program"], "program")
    has_exec, has_mcp = "exec" in document, "mcp" in document
    if has_exec == has_mcp:
        problems.append("a manifest names exactly one of 'exec' (a program) and 'mcp'")
    if isinstance(document.get("exec"), str) and document["exec"]:
        problems += _exec_problems(_exec_path(document["exec"], base))
    if isinstance(document.get("mcp"), dict):
        problems += _mcp_problems(document["mcp"], name)
    return problems


def _describe(error: ValidationError) -> str:
    path = "/".join(str(part) for part in error.absolute_path)
    if error.validator == "additionalProperties" and not path:
        return f"{brief_message(error)}; a v2 manifest has no such field"
    return f"{path or 'manifest'}: {brief_message(error)}"


def _exec_path(value: str, base: Path) -> Path:
    return Path(value) if os.path.isabs(value) else base / value


def _exec_problems(path: Path) -> list[str]:
    try:
        status = os.stat(path)
    except OSError as exc:
        return [f"exec: {path}: {exc.strerror}"]
    if not stat.S_ISREG(status.st_mode):
        return [f"exec: {path} is not a regular file"]
    if status.st_size > MAX_PROGRAM_BYTES:
        return [f"exec: {path} is larger than {MAX_PROGRAM_BYTES} bytes"]
    if not os.access(path, os.R_OK):
        return [f"exec: {path} is not readable"]
    return []


def config_path_problem(config: str) -> str | None:
    """What keeps ``config`` from being an MCP locator's configuration path (M-4): an
    absolute path of a file, as the agent sees it.  The bridge reads it in the agent's view,
    where ``..`` is refused (never normalised away): a locator holding one would name a tool
    that can never run.  None when it is one."""
    if not config.startswith("/"):
        return "not an absolute path; give it as the agent sees it"
    if ".." in config.split("/"):
        return "'..' is not allowed; the agent's view resolves no '..', so give the path without it"
    if config.endswith("/"):
        return "ends in '/'; it must name the configuration file itself"
    return None


def _mcp_problems(locator: dict[str, Any], name: object) -> list[str]:
    """M-3: an MCP-backed tool is named exactly ``<server>.<remote_tool>``.

    The server is an object name of its own (a key of the configuration, named in tool
    names); the remote tool's name need only make that whole name legal (R-3), so a server's
    ``-dash`` is projected as ``srv.-dash``."""
    problems = []
    config = locator.get("config")
    if isinstance(config, str) and config.startswith("/"):  # the schema wants the '/'
        problem = config_path_problem(config)
        if problem:
            problems.append(f"mcp/config: {problem}")
    server, remote = locator.get("server"), locator.get("tool")
    if not (isinstance(server, str) and isinstance(remote, str)):
        return problems
    problem = object_name_problem(server)
    if problem:
        problems.append(f"mcp/server: {problem}")
    if not remote:
        problems.append("mcp/tool: the remote tool's name must not be empty")
    if name != f"{server}.{remote}":
        problems.append(
            f"name: an MCP-backed tool is named '{server}.{remote}' (M-3), not {name!r}"
        )
    return problems


def _json_file(value: object) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
