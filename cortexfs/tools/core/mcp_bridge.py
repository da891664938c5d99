"""The executable of an MCP-backed tool: one ``tools/call`` on its server (SPEC §10, M-4).

``ctx object install`` installs this program for a manifest that names an ``mcp`` locator
instead of an ``exec`` program.  It runs like any tool — as the agent, through the whole
authority chain, in terminal or native mode — and:

1. reads the locator in its own control directory (``<name>.d/mcp``, beside the executable);
2. reads the configuration file the locator names, *as the agent sees it*: the path is
   resolved inside the agent's visible mounts, never through a symlink, with the agent's uid
   (:mod:`~cortexfs.tools.core.confine`), so a tool can start only a server the agent could
   itself read the configuration of;
3. starts that stdio server in the tool's own process group (a timeout of the call kills it
   too), negotiates a version of M-2, and calls the remote tool with the call's input, waiting
   for its answer as long as the call's own timeout lets it run;
4. answers with the result: in native mode the MCP result object (``content``,
   ``structuredContent`` when given, ``isError``); in terminal mode the text of its content.
   A result marked ``isError`` makes the call fail (exit 1).
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path
from typing import Any

from cortexfs.errors import CtxError
from cortexfs.mcp.client import StdioClient
from cortexfs.mcp.config import MAX_CONFIG_BYTES, ServerSpec, parse_server
from cortexfs.tools.core import confine
from cortexfs.tools.core.toolio import Reply, ToolFailure, main, main_parameter

LOCATOR_KEYS = ("transport", "config", "server", "tool")


def read_locator(executable: str) -> dict[str, str]:
    """The ``mcp`` control of the tool whose executable is ``executable``."""
    path = Path(os.path.abspath(executable) + ".d") / "mcp"
    try:
        locator = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ToolFailure(errno.ENOEXEC, f"{path} is not a readable MCP locator: {exc}") from None
    if not isinstance(locator, dict) or sorted(locator) != sorted(LOCATOR_KEYS):
        raise ToolFailure(errno.ENOEXEC, f"{path} must hold exactly {', '.join(LOCATOR_KEYS)}")
    if locator["transport"] != "stdio":
        raise ToolFailure(errno.ENOEXEC, f"{path}: only the stdio transport is supported")
    return locator


def read_config(view_path: str) -> bytes:
    """The configuration file at ``view_path`` in the agent's view."""
    place = confine.View.from_environment(os.environ).locate(view_path)
    fd, _ = confine.open_regular_file(place)
    with open(fd, "rb") as config:
        return config.read(MAX_CONFIG_BYTES + 1)


def call(locator: dict[str, str], request: dict[str, Any], native: bool) -> Reply:
    spec = _server(locator)
    try:
        with StdioClient(spec, own_process_group=False) as client:
            result = client.call_tool(locator["tool"], request, unbounded=True)
    except CtxError as exc:
        raise ToolFailure(exc.errno, exc.message) from None
    content = result.get("content") if isinstance(result.get("content"), list) else []
    text = "".join(
        f"{item['text']}\n" for item in content if isinstance(item, dict) and "text" in item
    )
    if result.get("isError") is True:
        raise ToolFailure(errno.EREMOTEIO, text.strip() or "the server reported an error")
    data: dict[str, Any] = {"content": content, "isError": False}
    if "structuredContent" in result:
        data["structuredContent"] = result["structuredContent"]
    return Reply(data, text=text.encode())


def _server(locator: dict[str, str]) -> ServerSpec:
    data = read_config(locator["config"])
    try:
        return parse_server(data, locator["config"], locator["server"])
    except CtxError as exc:
        raise ToolFailure(exc.errno, exc.message) from None


def run() -> int:
    executable = sys.argv[0]
    return main(
        os.path.basename(executable),
        main_parameter("input"),
        lambda request, native: call(read_locator(executable), request, native),
    )
