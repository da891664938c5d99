"""Asking the host over the run capability, from a core tool (SPEC A-4, A-5).

The runner gives the tools of ``cortexfs.tools.core.NEEDS_CAPABILITY`` one end of a socket
pair, named by ``CTX_RUN_CAPABILITY`` (:mod:`cortexfs.agents.capability` serves the other).
One request, one answer, each one JSON line.
"""

from __future__ import annotations

import errno
import json
import os
import socket
from typing import Any

from cortexfs.names import is_decimal
from cortexfs.tools.core.toolio import ToolFailure

ENVIRONMENT = "CTX_RUN_CAPABILITY"
# The longest request line the host reads; past it, the host ends the capability unanswered.
MAX_REQUEST_LINE = 64 * 1024
# What agent.update may write into one of its agent's prompts.
MAX_UPDATE_BYTES = 8 * 1024


def update_too_big(control: str, size: int) -> str:
    """The refusal of ``size`` bytes of content for ``control``, in the host's words."""
    return f"{control} may hold at most {MAX_UPDATE_BYTES} bytes, not {size}"


def ask_host(tool: str, request: dict[str, Any]) -> dict[str, Any]:
    """The host's answer to ``request``; its refusal (or no capability: EPERM) as a failure."""
    descriptor = os.environ.get(ENVIRONMENT, "")
    if not is_decimal(descriptor):
        raise ToolFailure(
            errno.EPERM, f"{tool} runs through the runner, which gives it the capability"
        )
    line = json.dumps(request).encode() + b"\n"
    if len(line) > MAX_REQUEST_LINE:
        # The host would end the capability unanswered, and the call would say only that.
        raise ToolFailure(
            errno.EFBIG,
            f"the request is {len(line)} bytes as JSON; the host reads at most {MAX_REQUEST_LINE}",
        )
    with socket.socket(fileno=int(descriptor)) as capability:
        try:
            capability.sendall(line)
            answer = json.loads(capability.makefile("rb").readline() or b"{}")
        except (BrokenPipeError, ConnectionResetError):
            # The host ended the capability: another process used a copy of it, or the
            # call it served is over.  Either way no answer comes, as for an empty one.
            answer = {}
    if not answer.pop("ok", False):
        message = answer.get("message", "the host gave no answer")
        code = answer.get("errno", errno.EIO)
        # EINVAL is the host's judgement of the input the call was given: a usage error (exit
        # 2), as the same input refused by the tool's schema is.
        raise ToolFailure(code, message, usage=code == errno.EINVAL)
    return answer
