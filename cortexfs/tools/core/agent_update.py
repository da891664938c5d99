"""``agent.update``: the calling agent rewrites its own ``system.md`` or ``prompt.template.md``
(SPEC A-5).

Input ``{"control": "system.md" | "prompt.template.md", "content": str}`` (at most 8 KiB).  The
controls belong to the host, so the tool cannot write them itself: it asks the host over the
run capability the runner gave this call (``CTX_RUN_CAPABILITY``), which is bound to the
calling agent — the tool names no agent and can change no other.  Native output
``{"agent", "control", "bytes"}``.  Run any other way than by the runner, it has no capability
and refuses (EPERM).
"""

from __future__ import annotations

import errno
import json
import os
import socket

from cortexfs.tools.core.toolio import Reply, ToolFailure, main, require


def update(request: dict[str, object], native: bool) -> Reply:
    control = require(request, "control", str)
    content = require(request, "content", str)
    descriptor = os.environ.get("CTX_RUN_CAPABILITY", "")
    if not descriptor.isdigit():
        raise ToolFailure(
            errno.EPERM, "agent.update runs through the runner, which gives it the capability"
        )
    message = {"op": "agent.update", "control": control, "content": content}
    with socket.socket(fileno=int(descriptor)) as capability:
        capability.sendall(json.dumps(message).encode() + b"\n")
        answer = json.loads(capability.makefile("rb").readline() or b"{}")
    if not answer.get("ok"):
        code = answer.get("errno", errno.EIO)
        raise ToolFailure(code, answer.get("message", "the host gave no answer"))
    answer.pop("ok")
    return Reply(answer, text=f"{control} of agent {answer['agent']} updated\n".encode())


def run() -> int:
    return main("agent.update", "control", update)
