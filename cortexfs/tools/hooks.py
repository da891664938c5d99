"""Tool hooks (SPEC T-6): ``hooks/pre.d/*`` before a call, ``hooks/post.d/*`` after it.

Hooks are executables in the tool's control directory, run in the byte order of their names;
names starting with ``.`` are ignored (as ``run-parts`` does).  Each reads one JSON object on
stdin: the call (tool, agent, session, call id, mode, input or argv) and, after the call, its
result.

* A pre-hook may veto the call: a non-zero exit or a timeout refuses it with EACCES, naming
  the hook and quoting the last line of its stderr.  An entry of ``pre.d`` that is not an
  executable regular file vetoes too: a guard that cannot run must not let calls through.
* A post-hook sees the result; its exit status is recorded with the call and changes nothing.

Hooks run as the tool does — under the agent's identity, with the tool's environment plus
``CTX_HOOK=pre|post``, in the same working directory — each bounded by :data:`HOOK_TIMEOUT`.
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, NamedTuple

from cortexfs.tools.controls import POST_HOOKS, PRE_HOOKS, ToolObject
from cortexfs.tools.spawn import ProcessSpec, run_captured

HOOK_TIMEOUT = 10.0
MAX_HOOK_OUTPUT = 64 * 1024
PRE, POST = "pre", "post"
PHASES = (PRE, POST)
_PHASE_DIRECTORIES = {PRE: PRE_HOOKS, POST: POST_HOOKS}


class HookRun(NamedTuple):
    """One hook's outcome: exit status 0 passes; ``message`` says why it did not."""

    phase: str
    name: str
    exit_status: int
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.exit_status == 0

    def to_json(self) -> dict[str, object]:
        return {
            "hook": f"{_PHASE_DIRECTORIES[self.phase]}/{self.name}",
            "exit_status": self.exit_status,
            "message": self.message,
        }


def hook_names(tool: ToolObject, phase: str) -> list[str]:
    """The hooks of one phase, in the order they run (none when the directory is missing)."""
    try:
        names = os.listdir(tool.control(_PHASE_DIRECTORIES[phase]))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted((name for name in names if not name.startswith(".")), key=os.fsencode)


def run_hooks(
    tool: ToolObject, phase: str, names: list[str], call: dict[str, Any], base: ProcessSpec
) -> list[HookRun]:
    """Run ``names`` in order; a pre-hook that does not pass stops the run (it is the veto)."""
    directory = tool.control(_PHASE_DIRECTORIES[phase])
    stdin_data = json.dumps({"hook": phase, **call}, default=str).encode() + b"\n"
    runs = []
    for name in names:
        path = directory / name
        problem = _not_runnable(path)
        if problem:
            run = HookRun(phase, name, 126, problem)
        else:
            spec = base._replace(
                argv=[str(path)], env={**base.env, "CTX_HOOK": phase}, timeout=HOOK_TIMEOUT
            )
            run = _run_one(phase, name, spec, stdin_data)
        runs.append(run)
        if phase == PRE and not run.passed:
            break
    return runs


def _run_one(phase: str, name: str, spec: ProcessSpec, stdin_data: bytes) -> HookRun:
    try:
        finished = run_captured(spec, stdin_data, max_output=MAX_HOOK_OUTPUT)
    except OSError as exc:
        return HookRun(phase, name, 126, f"cannot be run: {exc.strerror}")
    if finished.timed_out:
        return HookRun(phase, name, finished.exit_status, f"timed out after {HOOK_TIMEOUT:g}s")
    last_line = finished.stderr_tail.decode("utf-8", "replace").strip().splitlines()[-1:]
    return HookRun(phase, name, finished.exit_status, last_line[0] if last_line else "")


def _not_runnable(path: os.PathLike[str]) -> str:
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return "vanished before it could run"
    if not stat.S_ISREG(status.st_mode):
        return "is not a regular file (links are not followed)"
    if not status.st_mode & 0o111:
        return "is not executable"
    return ""
