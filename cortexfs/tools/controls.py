"""A tool object: the executable ``<dir>/<name>`` and its control directory (SPEC T-1, C-2).

::

    <name>                  the executable endpoint; stdin/stdout is its interface (T-2)
    <name>.d/name           the tool's name, one line
    <name>.d/description    what it does, for people and models
    <name>.d/schema         the JSON Schema of its input; grants nothing, describes no output
    <name>.d/cap            declared facts, e.g. {"side_effects": false, "network": false}
                            (a fact left out counts as its cautious value, see cap_fact)
    <name>.d/policy         the tool's own policy v0, the second layer of P-6 (host-owned)
    <name>.d/status         available | disabled | unavailable: <reason>
    <name>.d/log            one line per call (T-7)
    <name>.d/hooks/pre.d/   executables run before each call, in name order; non-zero vetoes
    <name>.d/hooks/post.d/  executables run after each call; they see the result (T-6)
    <name>.d/origin         optional, diagnostic only: where the installed version came from
    <name>.d/mcp            optional: the stdio locator of an MCP-backed tool (M-4)
    <name>.d/program        optional: a success-result JSON Schema, reserved (C-1, C-2)

``<dir>`` is a tier: ``tool/``, ``home/<uid>/tool/`` or ``shared/<space>/tool/``.  Controls
are read without following links (:mod:`cortexfs.beneath`) and no further than their
limit (:func:`cortexfs.policy.controls.control_limit`: 1 MiB, 16 MiB for the policy).  A
control that is missing or malformed makes the tool unusable (ENOEXEC, "damaged"), one over
its limit too (EFBIG, naming it and the limit); a malformed ``program`` makes it
*unavailable* (C-2); ``status`` other than ``available`` refuses every call.  A control the
reading process may not read is none of these (:class:`ControlRefused`): that refusal is the
reader's own, and a reader that may (root, whose calls run the tool) meets the tool as it is.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

from cortexfs import beneath, jsontext
from cortexfs.errors import HOST_SHORTAGES, CtxError, denied
from cortexfs.names import check_object_name
from cortexfs.policy.controls import control_limit, too_large
from cortexfs.printable import quoted
from cortexfs.regular_file import read_regular_file
from cortexfs.storage import not_readable
from cortexfs.tools.remedy import is_core_tool, reinstall_advice
from cortexfs.tools.schemas import schema_problems

REQUIRED_FILES = ("name", "description", "schema", "cap", "policy", "status", "log")
HOOK_DIRS = ("hooks", "hooks/pre.d", "hooks/post.d")
PRE_HOOKS = "hooks/pre.d"
POST_HOOKS = "hooks/post.d"

STATUS_AVAILABLE = "available"
STATUS_DISABLED = "disabled"
STATUS_UNAVAILABLE = "unavailable"
_PROGRAM_CONTROL = "the program control"


# NamedTuple records, not dataclasses (see cortexfs.tools.result).  ToolObject checks its
# fields on construction, since the name becomes a path: hence the fields in a base class.
class _ToolPlace(NamedTuple):
    name: str
    directory: Path


# What opening <tool>.d/ meets when the tool's layout is at fault (reinstalling mends it).
_NOT_A_CONTROL_DIRECTORY = frozenset({errno.ENOENT, errno.ENOTDIR, errno.ELOOP})


class ToolObject(_ToolPlace):
    """Where one tool lives: its name and the tier directory holding its executable."""

    __slots__ = ()

    def __new__(cls, name: str, directory: Path) -> ToolObject:
        check_object_name(name, "tool")
        return super().__new__(cls, name, directory)

    @property
    def executable(self) -> Path:
        return self.directory / self.name

    @property
    def control_dir(self) -> Path:
        return self.directory / f"{self.name}.d"

    def control(self, name: str) -> Path:
        return self.control_dir / name

    def relative_control(self, name: str) -> PurePosixPath:
        return _relative_control(self.name, name)


# Paths are values, kept once made: a call reads the same few controls of its tool, and a
# PurePosixPath is slow to make on Python 3.11.
@functools.lru_cache(maxsize=1024)
def _relative_control(tool: str, control: str) -> PurePosixPath:
    return PurePosixPath(f"{tool}.d", *control.split("/"))


class ToolControls(NamedTuple):
    """What the runner needs from one installed version of a tool."""

    schema: dict[str, Any]
    cap: dict[str, Any]
    status: str
    program: dict[str, Any] | None
    program_problem: str = ""  # why the program control fails C-2; it makes status unavailable
    mcp_config: str | None = None  # an MCP-backed tool's configuration path, as the agent sees it


# What a fact a ``cap`` leaves out counts as (T-8): the cautious value, never the convenient one.
CAUTIOUS_CAP = {"side_effects": True, "network": True}


def cap_fact(cap: Mapping[str, Any], fact: str) -> bool:
    """The declared ``fact`` of a tool's ``cap``; a fact that is absent (or not a boolean, in a
    control someone edited by hand) counts as :data:`CAUTIOUS_CAP` says."""
    value = cap.get(fact)
    return value if isinstance(value, bool) else CAUTIOUS_CAP[fact]


class Damaged(CtxError):
    """A tool refused for its damage: the sentence names the tool, the ``reason`` and the
    remedy; ``reason`` alone is what a list of a tool's problems holds."""

    def __init__(self, tool: ToolObject, reason: str, code: int = errno.ENOEXEC) -> None:
        super().__init__(
            code,
            f"tool {tool.name} in {tool.directory} is damaged: {reason}; "
            f"{reinstall_advice(tool.directory, tool.name)}",
        )
        self.reason = reason


def damaged(tool: ToolObject, reason: str, code: int = errno.ENOEXEC) -> Damaged:
    return Damaged(tool, reason, code)


class ControlRefused(CtxError):
    """EACCES (or EPERM): this process may not read a control of a tool, or its control
    directory.  Not damage: the tool may be whole, and bootstrap or a reinstall would find
    nothing to mend; the sentence names what this uid may not read and who may."""


# What the kernel answers a process whose ids (or an attribute of the file) leave it out.
_REFUSALS = frozenset({errno.EACCES, errno.EPERM})


def read_control(tool: ToolObject, name: str) -> bytes | None:
    """The bytes of one control, None when it is absent; links are never followed, and no
    more than the control's limit is read (EFBIG beyond it)."""
    return _ControlDirectory(tool).read(name)


class _ControlDirectory:
    """Where the controls of ``tool`` are looked at and read: by path from its tier, or,
    :meth:`opened`, through one descriptor of ``<name>.d/`` opened beneath the tier through no
    link.  A call reads a tool's controls through one descriptor (two opens fewer for each
    control), and so all of one directory, should a reinstall exchange it meanwhile
    (:mod:`cortexfs.tools.pairs`; the runner then reads again)."""

    def __init__(self, tool: ToolObject, fd: int | None = None) -> None:
        self.tool = tool
        self.fd = fd

    @classmethod
    @contextlib.contextmanager
    def opened(cls, tool: ToolObject) -> Iterator[_ControlDirectory]:
        """The control directory through a descriptor; ENOEXEC (damaged) when it is missing,
        a link or not a directory, and the kernel's errno for anything else (EACCES on a
        root-squashed export, EIO, EMFILE…): the tool is not to blame, and no reinstall helps."""
        try:
            fd = beneath.open_directory(tool.directory, PurePosixPath(f"{tool.name}.d"))
        except OSError as exc:
            if exc.errno in _NOT_A_CONTROL_DIRECTORY:
                reason = f"its control directory {tool.name}.d/ is missing or not a directory"
                raise damaged(tool, reason) from None
            now = " now" if exc.errno in HOST_SHORTAGES else ""
            refused = ControlRefused if exc.errno in _REFUSALS else CtxError
            raise refused(
                exc.errno or errno.EIO,
                f"{tool.directory / tool.name}.d cannot be opened{now}: {exc.strerror}",
            ) from None
        try:
            yield cls(tool, fd)
        finally:
            os.close(fd)

    def status(self, name: str) -> os.stat_result | None:
        """The ``lstat`` of control ``name`` (a path below ``<name>.d/``), None when missing."""
        try:
            if self.fd is None:
                return os.lstat(self.tool.control(name))
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):  # e.g. a file where <name>.d/ belongs
            return None
        except OSError as exc:
            if exc.errno in _REFUSALS:
                raise self._refused(name) from None
            raise

    def read(self, name: str) -> bytes | None:
        """:func:`read_control`."""
        tool = self.tool
        relative = tool.relative_control(name)
        limit = control_limit(relative)
        try:
            if self.fd is None:
                return beneath.read_file(tool.directory, relative, limit)
            return read_regular_file(name, limit, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno in HOST_SHORTAGES:  # the host's state, not the tool's
                raise CtxError(
                    exc.errno, f"{tool.name}'s {name} cannot be read now: {exc.strerror}"
                ) from None
            if exc.errno == errno.EFBIG:  # said as damage, with the errno of what is wrong
                raise damaged(tool, too_large(relative), errno.EFBIG) from None
            if exc.errno in _REFUSALS:  # this process's ids, not the tool, are at fault
                raise self._refused(name) from None
            raise damaged(tool, f"{name} cannot be read safely ({exc.strerror})") from None

    def _refused(self, name: str) -> ControlRefused:
        """The refusal to read control ``name``: the directory on the way this process may
        not enter, or else the control, with its owner and mode, and who may read it."""
        tool = self.tool
        refusal = not_readable(tool.control(name), f"read the {name} control of tool {tool.name}")
        return ControlRefused(refusal.errno, refusal.message)


def parse_status(data: bytes) -> str:
    """The status: ``available``, ``disabled`` or ``unavailable: <reason>``, the whole control
    less the blanks around it.  Never its first line alone: ``available`` with a line
    ``disabled`` appended under it must not read as available."""
    return data.decode("utf-8", "replace").strip()


def read_controls(tool: ToolObject) -> ToolControls:
    """Read and check the controls a call depends on; ENOEXEC when one is damaged."""
    # A missing or linked directory is said once for the whole directory, rather than as its
    # first missing control.
    with _ControlDirectory.opened(tool) as directory:
        return _checked_controls(directory)


def _checked_controls(directory: _ControlDirectory) -> ToolControls:
    tool = directory.tool
    # The tool's own policy is the authority chain's to judge (step 6: a missing or linked
    # policy allows nothing), which every call asks next: refused there, the call says
    # EACCES and the step, as 'ctx policy explain' does (P-5, P-6).
    problems = _control_problems(directory, judged_by_the_chain=("policy",))
    if problems:
        raise damaged(tool, *problems[0])
    schema = _read_json(directory, "schema")
    cap = _read_json(directory, "cap")
    if not isinstance(cap, dict):
        raise damaged(tool, "the cap control is not a JSON object")
    locator_data = directory.read("mcp")
    locator = None if locator_data is None else _strict_locator(tool, locator_data)
    status_data = directory.read("status")
    if status_data is None:
        raise damaged(tool, "the status control is missing")
    program, problem = _read_program(directory)
    status = f"{STATUS_UNAVAILABLE}: {problem}" if problem else parse_status(status_data)
    problems = schema_problems(schema, "schema")
    if problems:
        raise damaged(tool, problems[0])
    mcp_config = None if locator is None else locator["config"]
    return ToolControls(schema, cap, status, program, problem, mcp_config)


def _strict_locator(tool: ToolObject, data: bytes) -> dict[str, str]:
    """The ``mcp`` control ``data`` of ``tool``, once it is the strict stdio locator its
    bridge would start a server by (M-4), as the bridge judges it; ENOEXEC (damaged) else."""
    from cortexfs.mcp.config import locator_problem  # only MCP-backed tools pay for it

    try:
        # A name given twice would be one locator to a reader keeping the first value and
        # another to one keeping the last: whoever checked it may approve another tool than
        # the bridge runs.
        locator = jsontext.loads_strict(data)
    except jsontext.DuplicateNames as exc:
        raise damaged(
            tool, f"the mcp control gives {', '.join(map(repr, exc.names))} more than once"
        ) from None
    except ValueError:
        raise damaged(tool, "the mcp control is not JSON") from None
    problem = locator_problem(locator, tool.name)
    if problem:
        raise damaged(tool, f"the mcp control is not a strict stdio locator (M-4): {problem}")
    return locator


def require_available(tool: ToolObject, controls: ToolControls) -> None:
    """EACCES unless the status is ``available`` (an administrator's ``disabled``, or C-2),
    saying what makes the tool available again."""
    status = controls.status
    if status == STATUS_AVAILABLE:
        return
    if controls.program_problem and is_core_tool(tool.directory, tool.name):
        # Nobody installs a core tool; bootstrap puts it back as it ships, with no program.
        remedy = "repair the storage root ('ctx bootstrap'), which puts it back without one"
    elif controls.program_problem:
        remedy = "reinstall it with a valid program control, or without one"
    else:
        remedy = f"it runs again once its status control {tool.name}.d/status reads 'available'"
    raise denied(f"tool {tool.name} is not available (status: {status or 'empty'}); {remedy}")


def layout_problems(tool: ToolObject) -> list[str]:
    """Everything wrong with the on-disk shape of ``tool``; empty when it is complete.

    The ``status`` an administrator wrote (``disabled``, ``unavailable: <reason>``) is a
    setting, not damage, and a ``program`` control that fails C-2 makes the tool unavailable,
    not damaged: neither is a layout problem (see :func:`read_controls`'s status).  A control
    this process may not read is listed too, as keeping the tool from being judged complete
    (bootstrap, as the storage root's owner, puts such a core tool back); whoever tells a
    user what a call meets asks :func:`readable_layout_problems`, which says the refusal."""
    try:
        return readable_layout_problems(tool)
    except ControlRefused as refusal:
        return [refusal.message]


def readable_layout_problems(tool: ToolObject) -> list[str]:
    """:func:`layout_problems` when this process may read every control of ``tool``; else
    :class:`ControlRefused`, which is this process's own refusal, not the tool's damage: a
    reader that may read them (root, whose calls run the tool) may find it complete."""
    problems = []
    try:
        status = os.lstat(tool.executable)
        if not stat.S_ISREG(status.st_mode) or not status.st_mode & 0o111:
            problems.append(f"{tool.name} is not an executable regular file")
    except (FileNotFoundError, NotADirectoryError):
        problems.append(f"{tool.name} is missing")
    try:
        problems += _missing_controls(_ControlDirectory(tool))
    except ControlRefused:
        raise
    except CtxError as exc:  # a name control over its limit or unreadable: damage all the same
        problems.append(_problem(exc))
    if not problems:
        try:
            read_controls(tool)
        except ControlRefused:
            raise
        except CtxError as exc:
            problems.append(_problem(exc))
    return problems


def _problem(refusal: CtxError) -> str:
    """One entry of a list of a tool's problems: for its damage, what is wrong (the list's
    reader names the tool and the remedy once), else the whole sentence."""
    return refusal.reason if isinstance(refusal, Damaged) else refusal.message


_READ_BY_PEOPLE = ("description", "origin")


def _missing_controls(
    directory: _ControlDirectory, judged_by_the_chain: tuple[str, ...] = ()
) -> list[str]:
    """What :func:`_control_problems` finds, each said as a sentence."""
    return [reason for reason, _ in _control_problems(directory, judged_by_the_chain)]


def _control_problems(
    directory: _ControlDirectory, judged_by_the_chain: tuple[str, ...] = ()
) -> list[tuple[str, int]]:
    """The controls of T-1 that are missing or of the wrong kind (ENOEXEC), over their limit
    (EFBIG), and a ``name`` control that names another tool (ENOEXEC), each with its errno:
    a call of such a tool is refused as damaged, as ``ctx object list`` reports it, never
    run with what happens to be there.  ``judged_by_the_chain``: controls left to the
    authority chain, which refuses the call for them itself."""
    tool = directory.tool
    problems = []
    for name in REQUIRED_FILES:
        status = directory.status(name)
        if name not in judged_by_the_chain and not _is(stat.S_ISREG, status):
            shape = _missing_or(status, "file")
            problems.append((f"{tool.name}.d/{name} is {shape}", errno.ENOEXEC))
    for name in HOOK_DIRS:
        status = directory.status(name)
        if not _is(stat.S_ISDIR, status):
            shape = _missing_or(status, "directory")
            problems.append((f"{tool.name}.d/{name}/ is {shape}", errno.ENOEXEC))
    if not problems:
        named = (directory.read("name") or b"").decode("utf-8", "replace").strip()
        if named != tool.name:
            other = f"{tool.name}.d/name names {quoted(named)}, not {tool.name}"
            problems.append((other, errno.ENOEXEC))
    # Controls no call reads, but listings and people do, and a listing's look at the policy,
    # which only the chain reads: over their limit, they are damage as any other control
    # would be (the chain refuses a call for its policy itself, at step 6).
    sized = _READ_BY_PEOPLE if "policy" in judged_by_the_chain else (*_READ_BY_PEOPLE, "policy")
    for name in sized:
        status = directory.status(name)
        relative = PurePosixPath(f"{tool.name}.d/{name}")
        if _is(stat.S_ISREG, status) and status.st_size > control_limit(relative):
            problems.append((too_large(relative), errno.EFBIG))
    return problems


def _read_json(directory: _ControlDirectory, name: str) -> Any:
    tool = directory.tool
    data = directory.read(name)
    if data is None:
        raise damaged(tool, f"the {name} control is missing")
    try:
        return jsontext.loads_text(data)
    except ValueError as exc:
        raise damaged(tool, f"the {name} control is not JSON ({exc})") from None


def program_problem(tool: ToolObject) -> str:
    """Why ``tool``'s ``program`` control makes it unavailable (C-2); empty when it is valid or
    absent."""
    return _read_program(_ControlDirectory(tool))[1]


def _read_program(directory: _ControlDirectory) -> tuple[dict[str, Any] | None, str]:
    data = directory.read("program")
    return (None, "") if data is None else _parse_program(data)


def _parse_program(data: bytes) -> tuple[dict[str, Any] | None, str]:
    """C-2: a program control is a JSON Schema object; anything else makes the tool unavailable."""
    try:
        program = jsontext.loads_text(data)
    except ValueError as exc:
        return None, f"{_PROGRAM_CONTROL} is not JSON: {exc} (C-2)"
    problems = schema_problems(program, _PROGRAM_CONTROL)
    if problems:
        return None, f"{problems[0]} (C-2)"
    return program, ""


def _missing_or(status: os.stat_result | None, kind: str) -> str:
    if status is not None and stat.S_ISLNK(status.st_mode):
        return f"not a {kind} (a symbolic link; links are not followed)"
    return f"missing or not a {'regular file' if kind == 'file' else kind}"


def _is(kind: Callable[[int], bool], status: os.stat_result | None) -> bool:
    """Whether ``status`` is of an entry of ``kind`` (``stat.S_ISREG``, ``stat.S_ISDIR``)."""
    return status is not None and kind(status.st_mode)
