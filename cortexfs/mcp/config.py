"""Which stdio server to start: one entry of an MCP client configuration file.

CortexFS defines no configuration format of its own (§10): it reads the one MCP clients
share, a JSON object whose ``mcpServers`` (or ``servers``) maps a server name to
``{"command": str, "args": [str], "env": {str: str}, "cwd": str}``.  Only stdio servers —
entries with a ``command`` — can be projected (M-1); an entry with a ``url`` or another
``type`` is refused.

An installed MCP-backed tool finds its server through its ``mcp`` control, the strict stdio
locator of M-4 (:func:`locator_problem`): ``transport``, the configuration's absolute path as
the agent sees it, ``server`` and ``tool``, and nothing else.

A server to project must have a name without a dot (:func:`load_server`): its tools are named
``<server>.<tool>`` (M-3), and a remote tool's name may hold dots, so were server names allowed
them too, server ``a``'s tool ``b.c`` and server ``a.b``'s tool ``c`` would both be ``a.b.c``,
and installing one would silently put the other server behind a tool already granted.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from cortexfs import jsontext
from cortexfs.errors import CtxError, invalid, not_found
from cortexfs.names import object_name_problem
from cortexfs.regular_file import read_regular_file

MAX_CONFIG_BYTES = 1024 * 1024
LOCATOR_KEYS = ("transport", "config", "server", "tool")


class ServerSpec(NamedTuple):
    """How to start one stdio server."""

    name: str
    command: str
    args: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None


def config_path_problem(config: str) -> str | None:
    """What keeps ``config`` from being an MCP locator's configuration path (M-4): an
    absolute path of a file, as the agent sees it.  The bridge reads it in the agent's view,
    where ``..`` is refused (never normalised away): a locator holding one would name a tool
    that can never run.  None when it is one."""
    if not config.startswith("/"):
        return "not an absolute path; give it as the agent sees it"
    if "\0" in config:
        return "holds a NUL character, which no path can hold"
    if ".." in config.split("/"):
        return "'..' is not allowed; the agent's view resolves no '..', so give the path without it"
    if config.endswith("/"):
        return "ends in '/'; it must name the configuration file itself"
    return None


def locator_problem(locator: object, tool_name: str) -> str | None:
    """What keeps ``locator`` from being the ``mcp`` control of tool ``tool_name`` (M-4): a
    strict stdio locator holds exactly :data:`LOCATOR_KEYS`, all strings, the transport
    ``stdio`` and an absolute configuration path, and locates the remote tool the name says,
    ``<server>.<tool>`` (M-3).  The bridge holds the installed control to what ``ctx object
    install`` checked in the manifest: a relative path would be read from wherever the agent
    stands, and a locator naming another remote tool would run, under a granted name, a tool
    nobody granted.  None when it is one."""
    if not isinstance(locator, dict) or sorted(locator) != sorted(LOCATOR_KEYS):
        return f"must hold exactly {', '.join(LOCATOR_KEYS)}"
    if not all(isinstance(locator[key], str) for key in LOCATOR_KEYS):
        return f"each of {', '.join(LOCATOR_KEYS)} must be a string"
    if locator["transport"] != "stdio":
        return "only the stdio transport is supported"
    problem = config_path_problem(locator["config"])
    if problem:
        return f"config {locator['config']!r}: {problem}"
    server, remote = locator["server"], locator["tool"]
    if not remote or tool_name != f"{server}.{remote}":
        return (
            f"it locates tool {remote!r} of server {server!r}, which is named "
            f"'{server}.{remote}' (M-3), not {tool_name!r}"
        )
    return None


def load_server(config_path: Path, name: str) -> ServerSpec:
    """Server ``name`` of the configuration file at ``config_path``, to project its tools;
    EINVAL or ENOENT saying why it cannot be started or projected."""
    if "." in name:
        raise invalid(
            f"server name {name!r} holds a '.': its tools would be named {name}.<tool>, and "
            f"a server {name.split('.', 1)[0]!r} with a tool named "
            f"'{name.split('.', 1)[1]}.<tool>' would project to the same names (M-3); give the "
            f"server a name without dots in {config_path} and project that"
        )
    try:
        # Never opened for reading unless it is a regular file: a FIFO would block the open
        # until some writer came, a device would give what it likes.
        data = read_regular_file(config_path, MAX_CONFIG_BYTES, follow_link=True)
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            raise invalid(f"{config_path} is larger than {MAX_CONFIG_BYTES} bytes") from None
        if exc.errno == errno.EINVAL:
            raise invalid(f"{config_path} is not a regular file, so not a configuration") from None
        reason = f"cannot read {config_path}: {exc.strerror}"
        raise CtxError(exc.errno or errno.EIO, reason) from None
    return parse_server(data, str(config_path), name)


def parse_server(data: bytes, where: str, name: str) -> ServerSpec:
    """Server ``name`` of the configuration ``data`` (read from ``where``)."""
    problem = object_name_problem(name)
    if problem:
        raise invalid(f"server name {name!r}: {problem}; a projected tool is named <server>.<tool>")
    if len(data) > MAX_CONFIG_BYTES:
        raise invalid(f"{where} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        document = jsontext.loads_strict(data)
    except jsontext.DuplicateNames as exc:
        raise invalid(f"{where} {jsontext.duplicate_names_problem(exc.names)}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise invalid(f"{where} is not JSON: {exc}") from None
    servers = _servers(document, where)
    if name not in servers:
        known = ", ".join(sorted(servers)) or "none"
        raise not_found(f"{where} has no server {name!r} (servers: {known})")
    return _spec(name, servers[name], where)


def _servers(document: Any, where: str) -> dict[str, Any]:
    if isinstance(document, dict):
        for key in ("mcpServers", "servers"):
            if isinstance(document.get(key), dict):
                return document[key]
    raise invalid(f"{where} has no 'mcpServers' object mapping server names to their commands")


def _spec(name: str, entry: Any, where: str) -> ServerSpec:
    place = f"{where}: server {name!r}"
    if not isinstance(entry, dict):
        raise invalid(f"{place} is not an object")
    if "url" in entry or entry.get("type", "stdio") != "stdio":
        raise invalid(f"{place} is not a stdio server; ctxmcp projects stdio servers only (M-1)")
    command, args = entry.get("command"), entry.get("args", [])
    env, cwd = entry.get("env", {}), entry.get("cwd")
    if not isinstance(command, str) or not command:
        raise invalid(f"{place}: 'command' must be a non-empty string")
    if "/" in command and not command.startswith("/"):
        # Run from wherever the command stands — ctxmcp's directory when projecting, the
        # agent's when the tool is called — it would be another program each time.
        raise invalid(
            f"{place}: 'command' {command!r} is a relative path, which each caller would "
            "find in its own directory; give an absolute path, or a bare name looked up on "
            "the PATH"
        )
    if not (isinstance(args, list) and all(isinstance(arg, str) for arg in args)):
        raise invalid(f"{place}: 'args' must be a list of strings")
    if not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
        raise invalid(f"{place}: 'env' must map names to strings")
    if cwd is not None and not isinstance(cwd, str):
        raise invalid(f"{place}: 'cwd' must be a string")
    for variable in env:
        if not variable or "=" in variable:
            raise invalid(
                f"{place}: 'env' name {variable!r} cannot be set: it is empty or holds '='"
            )
    fields = [("command", command), *(("args", arg) for arg in args)]
    fields += [("env", text) for pair in env.items() for text in pair]
    fields += [("cwd", cwd)] if cwd is not None else []
    for field, text in fields:
        problem = _exec_string_problem(text)
        if problem:
            # The value itself may be a secret (an env value): named by its field only.
            raise invalid(f"{place}: a value of '{field}' {problem}, which no process is given")
    return ServerSpec(name, command, tuple(args), dict(env), cwd)


def _exec_string_problem(text: str) -> str | None:
    """Why ``text`` cannot reach a process (argv, environment, cwd), or None."""
    if "\0" in text:
        return "holds a NUL character"
    # Any lone surrogate, U+DC80..U+DCFF included: the filesystem's escape would hand one of
    # those to the process as a byte (0xff) that no UTF-8 configuration holds.
    if jsontext.lone_surrogate(text) is not None:
        return "holds a lone surrogate, not text"
    return None
