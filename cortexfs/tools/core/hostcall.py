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
from collections.abc import Callable, Mapping
from typing import Any

from cortexfs import jsontext
from cortexfs.names import is_decimal
from cortexfs.printable import printable, shortened
from cortexfs.tools.core.toolio import ToolFailure

ENVIRONMENT = "CTX_RUN_CAPABILITY"
# The longest request line the host reads; past it, the host ends the capability unanswered.
MAX_REQUEST_LINE = 64 * 1024
# What agent.update may write into one of its agent's prompts.
MAX_UPDATE_BYTES = 8 * 1024
_QUOTED_CHARACTERS = 200  # of an answer no host gives, shown in the failure that quotes it

# The fields of the host's answer a caller reads (its tool's output): each one's name, and
# what its value must be, in words and as a test (of None when it is absent).
Fact = tuple[str, Callable[[Any], bool]]
Facts = Mapping[str, Fact]
TEXT: Fact = ("a string", lambda value: isinstance(value, str))
TEXTS: Fact = (
    "a list of strings",
    lambda value: isinstance(value, list) and all(isinstance(item, str) for item in value),
)
COUNT: Fact = (
    "a whole number",
    lambda value: isinstance(value, int) and not isinstance(value, bool) and value >= 0,
)


def update_too_big(control: str, size: int) -> str:
    """The refusal of ``size`` bytes of content for ``control``, in the host's words."""
    return f"{control} may hold at most {MAX_UPDATE_BYTES} bytes, not {size}"


def ask_host(tool: str, request: dict[str, Any], facts: Facts) -> dict[str, Any]:
    """The host's answer to ``request``, holding ``facts`` (what the caller reads of it); its
    refusal (or no capability: EPERM) as a failure.  An answer no host gives — not one JSON
    object, a refusal without an errno and a message, a success without its facts — is
    EPROTO: the capability's other end may be anything a person handed the tool."""
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
            said = capability.makefile("rb").readline()
        except (BrokenPipeError, ConnectionResetError):
            # The host ended the capability: another process used a copy of it, or the
            # call it served is over.  Either way no answer comes, as for an empty one.
            said = b""
    if not said:
        raise ToolFailure(errno.EIO, "the host gave no answer")
    answer = _answer(said)
    if answer.pop("ok", False) is True:
        missing = [f"{name!r} ({kind})" for name, (kind, holds) in facts.items()
                   if not holds(answer.get(name))]  # fmt: skip
        if missing:
            raise _no_answer_of_the_host(said, f"a success without {', '.join(missing)}")
        return answer
    code, message = answer.get("errno"), answer.get("message")
    if isinstance(code, str):  # its name, which the host puts in "error"
        code = getattr(errno, code, None) if code.isupper() else None
    if isinstance(code, bool) or not isinstance(code, int) or code not in errno.errorcode:
        raise _no_answer_of_the_host(said, "a refusal without a known errno")
    if not isinstance(message, str):
        raise _no_answer_of_the_host(said, "a refusal whose message is no string")
    # EINVAL is the host's judgement of the input the call was given: a usage error (exit
    # 2), as the same input refused by the tool's schema is.
    raise ToolFailure(code, message, usage=code == errno.EINVAL)


def _answer(said: bytes) -> dict[str, Any]:
    """The host's answer line as the object it must be; EPROTO when it is none."""
    try:
        answer = jsontext.loads_strict(said, unique_names=False)
    except ValueError:  # not UTF-8, not JSON, nested past jsontext.MAX_DEPTH
        raise _no_answer_of_the_host(said, "not JSON") from None
    if not isinstance(answer, dict):
        raise _no_answer_of_the_host(said, "not a JSON object")
    return answer


def _no_answer_of_the_host(said: bytes, what: str) -> ToolFailure:
    """EPROTO, quoting what came (shortened, escaped: whoever holds the other end wrote it)."""
    text = said.decode("utf-8", "replace").removesuffix("\n")
    quoted = printable(shortened(text, _QUOTED_CHARACTERS))
    return ToolFailure(
        errno.EPROTO, f"the run capability answered what no host says ({what}): {quoted}"
    )
