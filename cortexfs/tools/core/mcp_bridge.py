"""The executable of an MCP-backed tool: one ``tools/call`` on its server (SPEC §10, M-4).

``ctx object install`` installs this program for a manifest that names an ``mcp`` locator
instead of an ``exec`` program.  It runs like any tool — as the agent, through the whole
authority chain, in terminal or native mode — and:

1. reads the locator and the input schema in its own control directory (``<name>.d/mcp``,
   ``<name>.d/schema``, beside the executable), refuses a locator that is not this tool's
   strict stdio locator (M-4: an absolute configuration path, the server and remote tool
   its name says), and checks the call's input against the schema, in terminal mode as in
   native (where the runner checked it already): a remote tool receives only arguments its
   own schema admits (EINVAL, exit 2, otherwise);
2. reads the configuration file the locator names, *as the agent sees it*: the path is
   resolved inside the agent's visible mounts, never through a symlink, with the agent's uid
   (:mod:`~cortexfs.tools.core.confine`), so a tool can start only a server the agent could
   itself read the configuration of.  That file names the command the tool runs, so it is
   held to StrictModes (:func:`~cortexfs.strict_modes.loose_entry`), as a tool's policy and
   hooks are: it and every directory above it must belong to root or to the tool's owner and
   be writable by the owner alone (EACCES otherwise).  Else whoever may write it — the agent
   itself through a read-write mount, with ``fs.write`` — could make the tool run any
   command, which no grant of the agent allows.  An agent running as the tool's owner (every
   agent of a host that is not root) passes that rule, so it is refused as well when its uid
   may change the file through one of its read-write mounts;
3. starts that stdio server in the tool's own process group (a timeout of the call kills it
   too), negotiates a version of M-2, and calls the remote tool with the call's input, waiting
   for its answer as long as the call's own timeout lets it run and the server runs (one that
   exits first is EIO naming how it ended, even while a process it started holds its output);
4. answers with the result: in native mode the MCP result object (``content``,
   ``structuredContent`` when given, ``isError``); in terminal mode the text of its content.
   A result marked ``isError`` makes the call fail (exit 1).

In terminal mode, ``--help`` or ``-h`` alone prints the tool's description and input schema
from its controls and starts no server: a person asking what a remote tool does must not run
it (any other lone word is the value of ``input``).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from cortexfs import jsontext
from cortexfs.errors import HOST_SHORTAGES, CtxError
from cortexfs.mcp.client import StdioClient
from cortexfs.mcp.config import MAX_CONFIG_BYTES, ServerSpec, locator_problem, parse_server
from cortexfs.printable import printable
from cortexfs.regular_file import MAX_CONTROL_BYTES, read_regular_file
from cortexfs.strict_modes import loose_entry
from cortexfs.tools import schema_subset
from cortexfs.tools.core import confine
from cortexfs.tools.core.toolio import (
    NATIVE,
    Reply,
    ToolFailure,
    check_input,
    main,
    main_parameter,
)


def read_locator(executable: str) -> dict[str, str]:
    """The ``mcp`` control of the tool whose executable is ``executable``: ENOEXEC (a
    damaged tool) unless it is the strict stdio locator of that tool (M-4)."""
    # A name given twice is refused, as the runner reads the control (a reader keeping the
    # first value would see another locator than this one).
    path, locator = _json_control(executable, "mcp", "MCP locator", jsontext.loads_strict)
    problem = locator_problem(locator, os.path.basename(executable))
    if problem:
        raise ToolFailure(errno.ENOEXEC, f"{path}: {problem}")
    return locator


def read_schema(executable: str) -> dict[str, Any]:
    """The ``schema`` control of the tool whose executable is ``executable``."""
    path, schema = _json_control(executable, "schema", "JSON Schema", jsontext.loads_strict)
    if not isinstance(schema, dict):
        raise ToolFailure(errno.ENOEXEC, f"{path} is not a JSON Schema object")
    return schema


def _json_control(
    executable: str, name: str, what: str, loads: Callable[[bytes], Any]
) -> tuple[Path, Any]:
    """The path and the JSON value (read by ``loads``) of control ``name`` of the tool whose
    executable is ``executable``: ENOEXEC (a damaged tool) when it cannot be read or is not
    JSON, and EFBIG when it holds more than a control may (:data:`MAX_CONTROL_BYTES`, of
    which no more than one byte past is read), but the host's shortage of descriptors, memory
    or space with its own errno, since that is no damage.  A link or a FIFO in its place is
    neither followed nor waited on, as the runner reads controls."""
    path = Path(os.path.abspath(executable) + ".d") / name
    try:
        return path, loads(read_regular_file(path, MAX_CONTROL_BYTES))
    except OSError as exc:
        if exc.errno == errno.EFBIG:
            limit = f"{path} holds more than {MAX_CONTROL_BYTES} bytes, the limit of a control"
            raise ToolFailure(errno.EFBIG, limit) from None
        code = exc.errno if exc.errno in HOST_SHORTAGES else errno.ENOEXEC
        raise ToolFailure(code, f"{path} is not a readable {what}: {exc.strerror}") from None
    except ValueError as exc:
        raise ToolFailure(errno.ENOEXEC, f"{path} is not a readable {what}: {exc}") from None


def check_arguments(schema: dict[str, Any], request: dict[str, Any], tool: str) -> None:
    """EINVAL (exit 2) when ``request`` does not satisfy the tool's input schema: all of it
    when it keeps to the common keywords (:mod:`~cortexfs.tools.schema_subset`), else its
    top-level ``required``, ``additionalProperties`` and property types
    (:func:`~cortexfs.tools.core.toolio.check_input`) — this program carries no jsonschema,
    and in native mode the runner has checked the whole schema already."""
    problems = schema_subset.problems(schema, request)
    if problems is None:
        check_input(tool, schema, request)
    elif problems:
        where, message = problems[0]
        at = f"at /{'/'.join(str(part) for part in where)}: " if where else ""
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        problem = f"input does not match the schema of {tool}: {at}{message}{more}"
        raise ToolFailure(errno.EINVAL, problem, usage=True)


# Set by the runner to the ``DEV:INO`` of the configuration it held to StrictModes on the
# host, for a bridge it starts in a user namespace of its own (a non-root host's call without
# network: cortexfs.tools.offline).  There only the caller's uid is mapped: root's files, like
# every other uid's, show the overflow uid, and the owners are the host's to judge.
VOUCHED_CONFIG = "CTX_MCP_CONFIG_VOUCHED"


def read_config(view_path: str, tool_owner: int) -> bytes:
    """The configuration file at ``view_path`` in the agent's view, when nobody but root and
    ``tool_owner`` could have changed it (StrictModes, see above)."""
    place = confine.View.from_environment(os.environ).locate(view_path)
    fd, status = confine.open_regular_file(place)
    with open(fd, "rb") as config:
        if os.environ.get(VOUCHED_CONFIG) != _identity(status):
            statuses = _require_strict_modes(view_path, place, status, tool_owner)
            if "CTX_MOUNTS" in os.environ:  # else a person runs it, in the host's own view
                view = confine.View.from_environment(os.environ)
                _require_out_of_agents_reach(view_path, place, statuses, view)
        return config.read(MAX_CONFIG_BYTES + 1)


def vouch_for_config(view_path: str, environment: Mapping[str, str], tool_owner: int) -> str:
    """For the runner, on the host: the ``DEV:INO`` (:data:`VOUCHED_CONFIG`) of the
    configuration at ``view_path`` in the view ``environment`` describes, once it is held to
    StrictModes as :func:`read_config` holds it; ToolFailure (EACCES…) saying why not."""
    view = confine.View.from_environment(environment)
    place = view.locate(view_path)
    fd, status = confine.open_regular_file(place)
    try:
        statuses = _require_strict_modes(view_path, place, status, tool_owner)
        _require_out_of_agents_reach(view_path, place, statuses, view)
    finally:
        os.close(fd)
    return _identity(status)


def _identity(status: os.stat_result) -> str:
    return f"{status.st_dev}:{status.st_ino}"


def _require_strict_modes(
    view_path: str, place: confine.Place, status: os.stat_result, tool_owner: int
) -> list[os.stat_result]:
    """The ``lstat`` of ``/`` and of each entry down to the configuration at ``place``, once
    none of them could be changed by anyone but root and ``tool_owner``."""
    host_path = PurePosixPath(place.mount.source, *place.parts)
    statuses = _walk_statuses(host_path)
    last = statuses[-1]
    if (
        len(statuses) != len(host_path.parts)
        or last is None
        or ((last.st_dev, last.st_ino) != (status.st_dev, status.st_ino))
    ):
        raise ToolFailure(errno.EACCES, f"{view_path} changed while it was read; call again")
    owners = {0, tool_owner}
    loose = loose_entry(statuses, owners, owners)
    if loose is None:
        return [entry for entry in statuses if entry is not None]  # a whole walk: none is None
    entry = statuses[loose]
    assert entry is not None
    shown = PurePosixPath(*host_path.parts[: loose + 1])
    why = (
        f"belongs to uid {entry.st_uid}"
        if entry.st_uid not in owners
        else f"is writable by its group or by others (mode {stat.S_IMODE(entry.st_mode):04o})"
    )
    raise ToolFailure(
        errno.EACCES,
        f"{view_path} (on the host {host_path}) names the command this tool runs, but {shown} "
        f"{why}, so someone other than root or the tool's owner (uid {tool_owner}) could "
        "change that command; make the file and every directory above it owned by root or "
        f"uid {tool_owner} and writable by the owner alone (chown, chmod go-w)",
    )


def _require_out_of_agents_reach(
    view_path: str, place: confine.Place, statuses: list[os.stat_result], view: confine.View
) -> None:
    """EACCES when the agent could change the configuration at ``place`` through one of its
    read-write mounts: the file, or a directory from that mount's source down to it, is
    writable by the agent's uid (this process's), as the kernel judges it.  StrictModes alone
    lets that pass when the agent runs as the tool's owner (every agent of a host that is not
    root does), and an agent that may write files, not run commands, would make this tool
    run any command of its choosing.  ``statuses``: the walk to it that StrictModes judged."""
    host_path = PurePosixPath(place.mount.source, *place.parts)
    places = {(status.st_dev, status.st_ino): index for index, status in enumerate(statuses)}
    for mount in view.mounts:
        if not mount.writable:
            continue
        try:
            source = os.stat(mount.source)
        except OSError:
            continue  # nothing there for the agent to write through
        top = places.get((source.st_dev, source.st_ino))
        if top is None:
            continue
        changed = _first_changeable(host_path, statuses, top)
        if changed is not None:
            raise ToolFailure(
                errno.EACCES,
                f"{view_path} (on the host {host_path}) names the command this tool runs, but "
                f"the agent (uid {os.getuid()}) may change {changed} through its read-write "
                f"mount of {mount.source} at {mount.target}, so it could make this tool run "
                "any command; keep the configuration in a directory the agent sees read-only, "
                "outside its read-write mounts",
            )


def _first_changeable(
    host_path: PurePosixPath, statuses: list[os.stat_result], top: int
) -> PurePosixPath | None:
    """The first entry of the walk to ``host_path``, from index ``top`` on, that this process
    may change: the file when it may write it, or the entry below a directory it may write
    (unless that directory is sticky and neither it nor the entry is its own); None if none."""
    uid = os.getuid()
    last = len(statuses) - 1
    for index in range(top, last + 1):
        path = PurePosixPath(*host_path.parts[: index + 1])
        status = statuses[index]
        if index == last:
            return path if os.access(path, os.W_OK) else None
        below = statuses[index + 1]
        sticky = status.st_mode & stat.S_ISVTX and uid not in (status.st_uid, below.st_uid)
        if os.access(path, os.W_OK | os.X_OK) and not sticky:
            return PurePosixPath(*host_path.parts[: index + 2])
    return None


def _walk_statuses(host_path: PurePosixPath) -> list[os.stat_result | None]:
    """The ``lstat`` of ``/`` and of each entry down to ``host_path``, never following a link:
    the list ends early at a link or a missing entry."""
    fd = os.open("/", os.O_PATH | os.O_CLOEXEC)
    statuses: list[os.stat_result | None] = [os.fstat(fd)]
    try:
        for name in host_path.parts[1:]:
            try:
                status = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                return [*statuses, None]
            statuses.append(status)
            if not stat.S_ISDIR(status.st_mode):
                break
            inner = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            passed, fd = fd, inner  # rebound before the close: the cleanup after a Ctrl-C
            os.close(passed)  # between the two must not close this one again
    finally:
        os.close(fd)
    return statuses


def call(executable: str, locator: dict[str, str], request: dict[str, Any], native: bool) -> Reply:
    check_arguments(read_schema(executable), request, os.path.basename(executable))
    spec = _server(locator, os.stat(executable).st_uid)
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


def _server(locator: dict[str, str], tool_owner: int) -> ServerSpec:
    data = read_config(locator["config"], tool_owner)
    try:
        return parse_server(data, locator["config"], locator["server"])
    except CtxError as exc:
        raise ToolFailure(exc.errno, exc.message) from None


def describe(executable: str) -> Reply:
    """The tool's ``description`` and ``schema`` controls, for a person asking for help: the
    server wrote both, so what is not printable is shown escaped, never sent to the terminal."""
    # Read as 'ctx object list' reads it: a byte that is not UTF-8 is shown replaced, not
    # taken for damage that no listing reports.
    _, description = _json_control(
        executable, "description", "description", lambda data: data.decode("utf-8", "replace")
    )
    description = "\n".join(printable(line) for line in description.splitlines())
    schema = json.dumps(read_schema(executable), indent=2)  # ASCII: JSON escapes the rest
    text = f"{description.rstrip()}\n\ninput (a JSON object) as its schema states it:\n{schema}\n"
    return Reply({}, text=text.encode())


def run() -> int:
    executable = sys.argv[0]
    if sys.argv[1:] in (["--help"], ["-h"]) and os.environ.get("CTX_MODE") != NATIVE:
        return main(
            os.path.basename(executable),
            lambda _: {},
            lambda _request, _native: describe(executable),
        )
    return main(
        os.path.basename(executable),
        main_parameter("input"),
        lambda request, native: call(executable, read_locator(executable), request, native),
    )
