"""What a tool call returns: :class:`ToolResult`, and :class:`ToolError` when it did not succeed.

The shape is stable; workers store it in queue results (SPEC W-1) and ``ctx run --native``
prints it as its final ``result`` frame (docs/tools.md lists every field).

The records here, and those of every module ``ctx run`` imports, are ``NamedTuple`` classes
(or small plain classes where a record is filled in place), not dataclasses: ``ctx run`` starts
once per tool call, importing :mod:`dataclasses` costs it about 25 ms (it imports
:mod:`inspect`), and each frozen dataclass almost 1 ms more for the code it generates.
A record is then a tuple: it serialises only through its ``to_json``, never on its own.
"""

from __future__ import annotations

import errno as errno_names
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from cortexfs import jsontext

OK, ERROR = "ok", "error"


class ToolError(NamedTuple):
    """Why a call failed: an errno, the stage that stopped it and a sentence.

    The stages, in the order a call goes through them: ``caller``, ``agent``, ``session``,
    ``resolve``, ``authorize``, ``schema``, ``hook``, ``output`` (native mode: the caller could
    not take the ``call`` frame, so the tool was killed before it was given its input),
    ``run``, ``exit``, and ``record``
    for a call whose result could not be recorded (docs/tools.md).

    ``step`` and ``step_name`` name the denying step of the authority chain (P-5) when the
    stage is ``authorize`` or ``session``, and step 1 (peer credentials) for a caller who may
    not act as the agent (stage ``caller``).  A tool that ran and failed has stage ``exit``
    (errno taken from its JSON output when it reports one, else none: 0 here, null in JSON,
    as ``error`` is),
    ``run`` with ETIMEDOUT after a timeout, EINTR when its caller interrupted it, EFBIG
    when its output was too large, or ENOEXEC for a core tool killed by a signal whose
    launcher's archive is not what its stamp says (damaged: ``ctx bootstrap`` repairs it).
    """

    errno: int
    stage: str
    message: str
    step: int | None = None
    step_name: str | None = None

    @property
    def code_name(self) -> str | None:
        return errno_names.errorcode.get(self.errno) if self.errno else None

    def __str__(self) -> str:
        return f"{self.code_name}: {self.message}" if self.code_name else self.message

    def to_json(self) -> dict[str, object]:
        return {
            "error": self.code_name,
            "errno": self.errno or None,
            "stage": self.stage,
            "step": self.step,
            "step_name": self.step_name,
            "message": self.message,
        }


class ToolResult(NamedTuple):
    """The outcome of one call.  ``exit_status`` is None when the tool never ran.
    ``recorded`` says whether its ``tool_result`` is durably in the call's session (T-7), and
    ``record_error`` why the host could not record it, when it could not (stage ``record``;
    ``error`` is then the call's own first error, if it had one); neither is part of the
    result's JSON, which is what is recorded, nor is ``passed_on``."""

    status: str
    tool: str
    agent: str
    session: str
    call: str
    mode: str
    started: str
    finished: str
    output: Any = None
    exit_status: int | None = None
    error: ToolError | None = None
    stderr: str = ""
    post_hooks: Sequence[dict[str, object]] = ()
    timings: Mapping[str, float] = MappingProxyType({})
    recorded: bool = False
    record_error: ToolError | None = None
    # The termination signal the caller got and passed on to the tool's process group
    # (terminal mode): the command then ends as that signal asked, 128 + its number.
    passed_on: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_json(self) -> dict[str, object]:
        return {
            "status": self.status,
            "tool": self.tool,
            "agent": self.agent,
            "session": self.session,
            "call": self.call,
            "mode": self.mode,
            "output": self.output,
            "exit_status": self.exit_status,
            "error": None if self.error is None else self.error.to_json(),
            "stderr": self.stderr,
            "post_hooks": list(self.post_hooks),
            "started": self.started,
            "finished": self.finished,
            "timings_ms": dict(self.timings),
        }


def decode_output(stdout: bytes) -> Any:
    """The tool's stdout: its JSON value when it printed one, else its text.

    JSON as every reader takes it (:func:`cortexfs.jsontext.loads_strict`): ``NaN`` or
    ``Infinity``, which JSON has no number for, or nesting deeper than any document is
    meant to have, would make the result file, the session's events and the tool's log
    unreadable JSON, or fail their writing; such output is kept as the text it is."""
    text = stdout.decode("utf-8", "replace")
    try:
        return jsontext.loads_strict(text, unique_names=False)
    except ValueError:
        return text


def exit_error(tool: str, exit_status: int, output: Any, stderr: str) -> ToolError:
    """A failed run; a tool reporting ``{"errno": N, "message": …}`` keeps its errno.

    Only a number that names an errno counts (``true`` is an int to Python, and ``-5`` or
    ``2**64`` name none), and only a string as its message: anything else the tool printed
    is no errno, and the call's error names none (null), as for a tool that printed nothing.
    """
    code, message = 0, ""
    if (
        isinstance(output, dict)
        and _names_an_errno(output.get("errno"))
        and isinstance(output.get("message"), str)
    ):
        code, message = output["errno"], output["message"]
    detail = message or (stderr.strip().splitlines() or [""])[-1]
    return ToolError(
        code, "exit", f"{tool} exited with status {exit_status}" + (f": {detail}" if detail else "")
    )


def _names_an_errno(value: Any) -> bool:
    return type(value) is int and value in errno_names.errorcode
