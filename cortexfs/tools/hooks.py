"""Tool hooks (SPEC T-6): ``hooks/pre.d/*`` before a call, ``hooks/post.d/*`` after it.

Hooks are executables in the tool's control directory, run in the byte order of their names,
all of them (T-6): a name starting with ``.`` hides no hook, so an executable nobody lists by
default still guards the calls (a hook is disabled by taking its execute bits away).  A
dot-named entry that is no regular file is not even a failed hook: editors leave such links
beside the file they edit.  Each reads one JSON object on stdin: the call (tool, agent,
session, call id, mode, and the input or argv whole, as the tool gets it, never the logged
summary a guard could be slipped past) and, after the call, its result.

* A pre-hook may veto the call: a non-zero exit or a timeout refuses it with EACCES, naming
  the hook and quoting the last line of its stderr.
* A post-hook sees the result; its exit status is recorded with the call and changes nothing.

Only executables are hooks (T-6): a regular file without any execute bit (a README) and a
subdirectory are skipped, as ``run-parts`` skips them.  What looks like a hook but cannot be
run is a failed hook, and in ``pre.d`` a veto — a guard that cannot run must not let calls
through: a symbolic link (never followed, so a hook is never taken from outside the
directory), a special file, a hook that vanished after it was listed, one whose execute bits
are not the agent's.  The hook directories themselves are opened without following links: a
link in their place makes the tool damaged (ENOEXEC), as :func:`layout_problems` reports it.

Hooks run as the tool does — under the agent's identity, with the tool's environment plus
``CTX_HOOK=pre|post``, in the same working directory — each bounded by :data:`HOOK_TIMEOUT`,
and a pre-hook also by what is left of the call's timeout, which it shares with the tool.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from typing import Any, NamedTuple

from cortexfs.errors import PROCESS_SHORTAGES, CtxError, explain_host_trouble
from cortexfs.policy.linux import EXECUTE, Identity, Kind, check_access
from cortexfs.process_limits import no_process_could_be_made
from cortexfs.tools.controls import POST_HOOKS, PRE_HOOKS, ToolObject, damaged
from cortexfs.tools.spawn import ProcessSpec, run_captured
from cortexfs.tools.startable import InterpreterRefused

HOOK_TIMEOUT = 10.0
# A hook's message is the last line of its stderr, cut to this many characters: enough for a
# sentence, short enough to quote in a refusal and record with the call.
MAX_HOOK_MESSAGE = 1000
PRE, POST = "pre", "post"
PHASES = (PRE, POST)
_PHASE_DIRECTORIES = {PRE: PRE_HOOKS, POST: POST_HOOKS}
_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# What a start that cannot enter its working directory fails with (chdir(2)).
_NOT_ENTERED = (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.ELOOP)


class HookRun(NamedTuple):
    """One hook's outcome: exit status 0 passes; ``message`` says why it did not."""

    phase: str
    name: str
    exit_status: int
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.exit_status == 0

    @property
    def shown(self) -> str:
        """``hooks/pre.d/NAME`` as records and messages give it: a byte of the name that is not
        UTF-8 (a lone surrogate to Python) as the text ``\\xNN``, which every strict reader
        takes, not a lone surrogate, which readers of other languages refuse."""
        name = self.name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        return f"{_PHASE_DIRECTORIES[self.phase]}/{name}"

    def to_json(self) -> dict[str, object]:
        return {
            "hook": self.shown,
            "exit_status": self.exit_status,
            "message": self.message,
        }


def hook_names(tool: ToolObject, phase: str) -> list[str]:
    """The entries of one phase's directory, in the order they run (none when it is missing).

    The directory is reached from the tool's tier without following links; ENOEXEC (the tool
    is damaged) when ``<name>.d``, ``hooks`` or the phase's directory is a link or a file.
    """
    fd = _open_hook_directory(tool, _PHASE_DIRECTORIES[phase])
    if fd is None:
        return []
    try:
        names = [name for name in os.listdir(fd) if not _dotted_non_file(fd, name)]
    finally:
        os.close(fd)
    return sorted(names, key=os.fsencode)


def _dotted_non_file(directory_fd: int, name: str) -> bool:
    """A dot-named entry that is not a regular file: an editor's lock link (``.#10-guard``)
    or the like, never a hook — where any other link or special file is a failed hook."""
    if not name.startswith("."):
        return False
    try:
        return not stat.S_ISREG(os.stat(name, dir_fd=directory_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return True


def _open_hook_directory(tool: ToolObject, relative: str) -> int | None:
    """A descriptor of ``<tier>/<name>.d/<relative>``, every component opened without following
    a link (as the tool's controls are read); None when one is missing."""
    fd = None
    try:
        fd = os.open(tool.directory, _DIRECTORY_FLAGS)
        for part in tool.relative_control(relative).parts:
            inner = os.open(part, _DIRECTORY_FLAGS, dir_fd=fd)
            passed, fd = fd, inner  # rebound before the close: the cleanup after a Ctrl-C
            os.close(passed)  # between the two must not close this one again
    except OSError as exc:
        if fd is not None:
            os.close(fd)
        if isinstance(exc, FileNotFoundError):
            return None
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            reason = f"{relative}/ is not a directory (links are not followed)"
            raise damaged(tool, reason) from None
        raise
    return fd


def run_hooks(
    tool: ToolObject,
    phase: str,
    names: list[str],
    call: dict[str, Any],
    base: ProcessSpec,
    *,
    deadline: float | None = None,
) -> list[HookRun]:
    """Run ``names`` in order; a pre-hook that does not pass stops the run (it is the veto).
    ``deadline`` (a :func:`time.monotonic` time) is when the call's timeout runs out: no hook
    runs past it."""
    directory = tool.control(_PHASE_DIRECTORIES[phase])
    stdin_data = json.dumps({"hook": phase, **call}, default=str).encode() + b"\n"
    runs = []
    for name in names:
        path = directory / name
        problem = _not_runnable(path)
        if problem == "" and base.identity is not None:
            problem = _not_the_agents(tool, phase, name, base.identity)
        if problem is None:
            continue  # a directory or a file with no execute bit: not a hook (T-6)
        if problem:
            run = HookRun(phase, name, 126, problem)
        else:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            bound = HOOK_TIMEOUT if left is None or left >= HOOK_TIMEOUT else left
            spec = base._replace(
                argv=[str(path)], env={**base.env, "CTX_HOOK": phase}, timeout=bound
            )
            run = _run_one(phase, name, spec, stdin_data, call_timeout_left=bound != HOOK_TIMEOUT)
        runs.append(run)
        if phase == PRE and not run.passed:
            break
    return runs


def _run_one(
    phase: str, name: str, spec: ProcessSpec, stdin_data: bytes, *, call_timeout_left: bool
) -> HookRun:
    try:
        finished = run_captured(spec, stdin_data, max_output=None)  # stdout is nobody's
    except OSError as exc:
        if phase == PRE and exc.errno in PROCESS_SHORTAGES:
            # No verdict was given: the host ran short (of descriptors, memory or processes),
            # and the call is refused with that
            # errno (a worker then leaves the job claimed), never as a veto for good.  A post
            # hook judges a call that ran: its failure is listed with the result, as ever.
            raise CtxError(
                exc.errno or errno.EIO,
                f"{_PHASE_DIRECTORIES[phase]}/{name} could not be started: "
                f"{exc.strerror}{_short_of(exc.errno)}; it gave no verdict",
            ) from None
        if isinstance(exc, InterpreterRefused):  # its errno's words alone name no culprit
            return HookRun(phase, name, 126, f"cannot be run: {exc.reason} ({exc.strerror})")
        if exc.filename == spec.cwd and exc.errno in _NOT_ENTERED:
            # The start failed to enter the working directory, before any exec: the hook is
            # there, the directory is not (removed while the tool ran), and its errno's words
            # alone would read as the hook's own ("No such file or directory").  (subprocess
            # names the directory for any failure before the exec: only these are chdir's.)
            why = f"cannot start in its working directory {spec.cwd}: {exc.strerror}"
            return HookRun(phase, name, 126, why)
        return HookRun(phase, name, 126, f"cannot be run: {exc.strerror}")
    if finished.timed_out:
        if call_timeout_left:
            why = f"ran past the call's timeout (killed after {spec.timeout:.3g}s)"
        else:
            why = f"timed out after {HOOK_TIMEOUT:g}s"
        return HookRun(phase, name, finished.exit_status, why)
    last_line = finished.stderr_tail.decode("utf-8", "replace").strip().splitlines()[-1:]
    message = last_line[0] if last_line else ""
    if len(message) > MAX_HOOK_MESSAGE:
        message = message[: MAX_HOOK_MESSAGE - 1] + "…"
    return HookRun(phase, name, finished.exit_status, message)


def _short_of(code: int | None) -> str:
    """`` (what ran short): what mends it`` for a hook the host could not start."""
    trouble = explain_host_trouble(code)
    if trouble is not None:
        return f"{trouble.aside}: {trouble.remedy}"
    return f" ({no_process_could_be_made()})"


def _not_runnable(path: os.PathLike[str]) -> str | None:
    """Why ``path`` cannot run as a hook, "" when it can, None when it is no hook at all."""
    try:
        status = os.lstat(path)
    except FileNotFoundError:
        return "vanished before it could run"
    if stat.S_ISDIR(status.st_mode):
        return None
    if stat.S_ISLNK(status.st_mode):
        return "is a symbolic link (links are not followed)"
    if not stat.S_ISREG(status.st_mode):
        return "is not a regular file"
    if not status.st_mode & 0o111:
        return None
    return ""


def _not_the_agents(tool: ToolObject, phase: str, name: str, identity: Identity) -> str:
    """Why the agent may not execute the hook ``name`` (its search of the directories on the
    way, the hook's execute bits), "" when it may.

    Judged here as the kernel would, not left to the kernel: the host starts an agent's
    process through setpriv, which still holds root's capabilities when it execs, so a hook
    only root may execute would run as the agent all the same (the tool itself is judged so
    by step 2 of the chain)."""
    relative = tool.relative_control(_PHASE_DIRECTORIES[phase]) / name
    verdict = check_access(
        tool.directory, relative, identity, EXECUTE, Kind.FILE, executable="the hook"
    )
    return "" if verdict.allowed else f"may not be executed by the agent: {verdict.detail}"
