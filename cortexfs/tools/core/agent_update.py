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

from cortexfs.tools.core.hostcall import (
    COUNT,
    MAX_UPDATE_BYTES,
    TEXT,
    ask_host,
    update_too_big,
)
from cortexfs.tools.core.toolio import Reply, ToolFailure, core_main, main_parameter, require


def update(request: dict[str, object], native: bool) -> Reply:
    control = require(request, "control", str)
    content = require(request, "content", str)
    size = len(content.encode("utf-8", "surrogatepass"))
    if size > MAX_UPDATE_BYTES:
        # Refused here as the host would: escaped as JSON, a prompt far over the limit would
        # outgrow the host's request line, which ends the call unanswered.
        raise ToolFailure(errno.EFBIG, update_too_big(control, size))
    message = {"op": "agent.update", "control": control, "content": content}
    answer = ask_host("agent.update", message, {"agent": TEXT, "control": TEXT, "bytes": COUNT})
    return Reply(answer, text=f"{control} of agent {answer['agent']} updated\n".encode())


def run() -> int:
    return core_main("agent.update", main_parameter("control"), update)
