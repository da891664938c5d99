"""The error branches of the MCP bridge, each reached from outside as a user reaches it, and
judged by SPEC §10, docs/tools.md and the help texts.

The angle: every refusal and every failure that ``ctxmcp list|project`` and the bridge of an
installed MCP-backed tool (``ctx run`` in terminal and native mode) can answer with, when the
stdio server misbehaves or the files around it are odd.  Small stdio servers written here on
raw pipes break the wire in one way each: a banner on stdout before the handshake, a line that
is not UTF-8 or holds ``NaN``, a message at the 512-level and 16 MiB limits, a listing of 1000
and 1001 pages, an ``initialize`` answered without a result object, refusals without a message
or a code, a server that closes its output or its input and lives on, a ``tools/call``
answered with a result that is no object or has no ``content`` list.  Around the server: a
command that cannot be started, an ``--out`` whose name is too long, that runs through a loop
of links, below a directory the caller cannot search, that is write-only, or that holds a
directory where a candidate goes; a configuration that became unusable after the tool was
installed (missing, a directory, a FIFO, over 1 MiB, below a file, an entry that can no
longer be started), directories above it that someone other than root could change, a host
that is not root mounting it read-write, and controls edited by hand (``description``,
``mcp``).

Each refusal is checked for the documented exit status, the errno word of the
``PROG: ERRNO: …`` line (and of the ``--json`` error object or the native result frame), that
the message names what is at fault, and that nothing is left half-done: no OUT made, no
candidate, no temporary, no server process left, the call recorded once as an error.

SPEC ids: §10 M-1..M-4, §6 T-1, T-3, T-7.  Docs: docs/tools.md (*MCP servers as tool sources*,
*Installed, an MCP-backed tool is an ordinary tool*, *Arguments in terminal mode*), and the
``--help`` texts of ``ctxmcp`` and ``ctx run``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    OnStorage,
    Run,
    kill_processes_of,
    new_scratch_dir,
    processes_of,
    read_jsonl,
    scratch_top,
    wait_for,
)
from tests.support.mcp_wire import WIRE
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

TOP = scratch_top(__file__)
BIN = Path(CTX_ARGV[0]).parent
CTXMCP = BIN / "ctxmcp"
PYTHON = BIN / "python"
LABEL = "coder_t"
MIB16 = 16 * 1024 * 1024

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid (needs root)"),
    pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed"),
]

# A stdio MCP server on raw pipes, driven by the JSON script in argv[1]:
#   record       a file each message received is appended to ({"pid", "method"}; "start")
#   stderr       written on stderr as it starts
#   banner       written on stdout before anything is read
#   raw          {method: line}: answer that method with this text verbatim (@ID@: its id)
#   encoding     how those lines are encoded (default UTF-8)
#   close_out    at this method: close stdout and live on
#   close_in     at this method: close stdin, answer, and live on
#   pages        tools/list hands out this many pages ("echo" on the first, "last" on the last)
#   depth        tools/list's answer nests this deep (the message object is level 1)
#   description  the length of echo's description
#   notice       {"size": N}: before the listing, a log notification of 120 bytes and one of
#                exactly N bytes (line ends not counted), written with the listing at once
SERVER = (
    WIRE
    + r"""
SCRIPT = json.loads(sys.argv[1])

def note(method):
    if SCRIPT.get("record"):
        with open(SCRIPT["record"], "a") as record:
            record.write(json.dumps({"pid": os.getpid(), "method": method}) + "\n")

def linger():
    time.sleep(120)
    sys.exit(0)

def notification(size):
    message = {"jsonrpc": "2.0", "method": "notifications/message",
               "params": {"level": "info", "data": ""}}
    message["params"]["data"] = "n" * (size - len(json.dumps(message)))
    data = json.dumps(message).encode()
    assert len(data) == size, (len(data), size)
    return data + b"\n"

note("start")
if SCRIPT.get("stderr"):
    os.write(2, SCRIPT["stderr"].encode())
if SCRIPT.get("banner"):
    send_bytes(SCRIPT["banner"].encode())
pages = 0
while True:
    message = receive()
    method = message.get("method")
    note(method)
    if "id" not in message:
        continue
    ident = message["id"]
    if method == SCRIPT.get("close_out"):
        os.close(1)
        linger()
    if method == SCRIPT.get("close_in"):
        os.close(0)
    raw = SCRIPT.get("raw", {}).get(method)
    if raw is not None:
        send_bytes(raw.replace("@ID@", json.dumps(ident)).encode(SCRIPT.get("encoding", "utf-8")))
        continue
    echo = {"name": "echo", "description": "e" * SCRIPT.get("description", 5),
            "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}}}
    if method == "initialize":
        result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                  "serverInfo": {"name": "wire", "version": "1"}}
    elif method == "tools/list":
        pages += 1
        last = SCRIPT.get("pages", 1)
        tools = [echo] if pages == 1 else []
        if pages == last and last > 1:
            tools.append(dict(echo, name="last"))
        result = {"tools": tools}
        if pages < last:
            result["nextCursor"] = "page-%d" % (pages + 1)
        if SCRIPT.get("depth"):
            inner = "[" * (SCRIPT["depth"] - 2) + "]" * (SCRIPT["depth"] - 2)
            send_bytes(('{"jsonrpc": "2.0", "id": %s, "result": {"tools": %s, "x": %s}}\n'
                        % (json.dumps(ident), json.dumps(tools), inner)).encode())
            continue
    elif method == "tools/call":
        text = json.dumps(message["params"]["arguments"], sort_keys=True)
        result = {"content": [{"type": "text", "text": text}], "isError": False}
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": method}})
        continue
    data = json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}).encode() + b"\n"
    if method == "tools/list" and SCRIPT.get("notice"):
        data = notification(120) + notification(SCRIPT["notice"]["size"]) + data
    send_bytes(data)
    if method == SCRIPT.get("close_in"):
        linger()
"""
)


# ------------------------------------------------------------------ common checks, the host


def refused(run: Run, errno_name: str, status: int, prog: str) -> str:
    """``run`` ended with ``status`` and said ``PROG: ERRNO: …`` as its one line on standard
    error (after click's usage lines, for a usage error), with no traceback; the message."""
    assert run.rc == status, run
    assert "Traceback" not in run.err, run
    last = run.err.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"{prog}: {errno_name}: "), run
    return last.removeprefix(f"{prog}: {errno_name}: ")


def refused_json(run: Run, errno_name: str, status: int) -> str:
    """As :func:`refused` for ``ctxmcp … --json``: stdout is the error object alone and says
    what stderr says; the message."""
    message = refused(run, errno_name, status, "ctxmcp")
    error = run.json()
    assert error == {"error": errno_name, "errno": error["errno"], "message": message}, run
    assert isinstance(error["errno"], int) and error["errno"] > 0, run
    return message


def run_program(
    argv: list[str],
    *,
    env: dict[str, str],
    user: UnprivilegedUser | None = None,
    cwd: Path | None = None,
    stdin: bytes = b"",
    timeout: float = 60,
) -> Run:
    as_user = {} if user is None else {"user": user.uid, "group": user.gid, "extra_groups": []}
    done = subprocess.run(argv, input=stdin, capture_output=True, env=env, cwd=cwd,
                          timeout=timeout, **as_user)  # fmt: skip
    return Run(
        argv[1:],
        done.returncode,
        done.stdout.decode("utf-8", "replace"),
        done.stderr.decode("utf-8", "replace"),
    )


@dataclass
class Host(OnStorage):
    """A directory every uid may search holding a bootstrapped storage root, ``mcp/`` (root's,
    0755: the server's program and its configuration, mounted read-only at the same path by
    the agent) and ``trace/`` (1777), where servers leave their records."""

    top: Path
    storage: Path
    mcp: Path
    trace: Path
    uid: int = 0
    _records: int = field(default=0)

    @property
    def config(self) -> Path:
        return self.mcp / "mcp.json"

    def script(self, **script) -> tuple[dict, Path]:
        """An entry of server ``w`` running the wire server with ``script``, and the record
        file it will write."""
        self._records += 1
        record = self.trace / f"record-{self._records}.jsonl"
        script = {"record": str(record), **script}
        entry = {"command": str(PYTHON), "args": [str(self.mcp / "wire.py"), json.dumps(script)]}
        return entry, record

    def configure(self, entry: dict, path: Path | None = None) -> None:
        path = path or self.config
        path.write_text(json.dumps({"mcpServers": {"w": entry}}))
        path.chmod(0o644)

    def wire(self, **script) -> Path:
        """``mcp.json`` naming server ``w`` with ``script``; its record file."""
        entry, record = self.script(**script)
        self.configure(entry)
        return record

    def ctxmcp(self, *args, user: UnprivilegedUser | None = None, cwd: Path | None = None,
               timeout: float = 60) -> Run:  # fmt: skip
        return run_program([str(CTXMCP), *map(str, args)], env=self.env, user=user, cwd=cwd,
                           timeout=timeout)  # fmt: skip

    def project(self, out: Path | str, *args, user: UnprivilegedUser | None = None,
                cwd: Path | None = None) -> Run:  # fmt: skip
        return self.ctxmcp("project", "--config", self.config, "--runtime-config", self.config,
                           "--server", "w", "--out", out, *args, user=user, cwd=cwd)  # fmt: skip

    def listing(self, *args) -> Run:
        return self.ctxmcp("list", "--config", self.config, "--server", "w", *args)

    def install(self, config: Path | None = None) -> Path:
        """``w.echo`` installed in the system tier, its locator naming ``config``, its own
        policy allowing the label, and agent ``coder`` granted it, ``mcp/`` mounted
        read-only at the same path."""
        manifest = self.top / "w.echo.manifest.json"
        manifest.write_text(json.dumps({
            "manifest": 2, "kind": "tool", "name": "w.echo", "description": "Echo the input.",
            "schema": {"type": "object", "properties": {"text": {"type": "string"}}},
            "cap": {"side_effects": False, "network": False},
            "mcp": {"transport": "stdio", "config": str(config or self.config), "server": "w",
                    "tool": "echo"},
        }))  # fmt: skip
        installed = self.ctx("object", "install", manifest, "--tier", "system")
        assert installed.rc == 0, installed
        self.allow_tool(LABEL, "w.echo")
        made = self.create_agent({"name": "coder", "label": LABEL, "tools": ["w.echo"],
                                  "mount": [[str(self.mcp), str(self.mcp), "ro"]]})  # fmt: skip
        self.uid = made["identity"]["uid"]
        return self.storage / "tool" / "w.echo"

    def terminal(self, session: str, *argv: str) -> Run:
        return self.ctx("run", "--agent", "coder", "--session", session, "w.echo", *argv)

    def native(self, session: str, payload: dict) -> tuple[Run, dict]:
        ran = self.ctx("run", "--agent", "coder", "--session", session, "--native", "w.echo",
                       input=json.dumps(payload))  # fmt: skip
        frames = [json.loads(line) for line in ran.lines() if line.strip()]
        assert frames and frames[-1]["type"] == "result", ran
        return ran, frames[-1]

    def results(self, session: str) -> list[tuple[str, int | None, str | None]]:
        """Status, exit status and errno of each ``tool_result`` of the session, in order (a
        terminal-mode call's errno is the tool's stderr, not recorded: None)."""
        events = (self.storage / "home" / str(self.uid) / "agent" / "coder" / "session" /
                  session / "events.jsonl")  # fmt: skip
        return [(e["status"], e["exit_status"], e["errno"]) for e in read_jsonl(events)
                if e["type"] == "tool_result"]  # fmt: skip

    def servers_left(self) -> list[int]:
        return processes_of(self.mcp)

    def nothing_left_running(self) -> bool:
        return wait_for(lambda: not self.servers_left(), 10)


@pytest.fixture
def host(_template: Path) -> Iterator[Host]:
    top = new_scratch_dir(TOP, "host-")
    try:
        storage = copy_of_root(_template, top / "storage")
        mcp = top / "mcp"
        mcp.mkdir(mode=0o755)
        mcp.chmod(0o755)
        (mcp / "wire.py").write_text(SERVER)
        (mcp / "wire.py").chmod(0o644)
        trace = top / "trace"
        trace.mkdir()
        trace.chmod(0o1777)
        yield Host(top, storage, mcp, trace)
    finally:
        kill_processes_of(top)
        shutil.rmtree(top, ignore_errors=True)


def methods(record: Path) -> list[str]:
    """What the server that wrote ``record`` received, in order ("start" as it started)."""
    return [line["method"] for line in read_jsonl(record)]


def hidden_entries(directory: Path) -> list[str]:
    return [name for name in os.listdir(directory) if name.startswith(".")]


# ======================================================= ctxmcp: a server that breaks the wire


def test_a_banner_on_stdout_before_the_handshake_is_eproto_naming_the_line(host: Host) -> None:
    """docs/tools.md *A misbehaving server*: "a line that is not JSON-RPC ... ends the session
    with EPROTO, exit 1, nothing written".  A server that greets on stdout (``Starting server
    on stdio...``, as many do by mistake) is refused at that line, which the message shows;
    ``project --json`` answers with the error object alone, makes no OUT and leaves no server
    running."""
    host.wire(banner="Starting server on stdio...\n")
    listed = host.listing()
    message = refused(listed, "EPROTO", 1, "ctxmcp")
    assert message.startswith("server 'w' broke the protocol: it wrote a line that cannot be "), (
        listed
    )
    assert "Starting server on stdio..." in message and listed.out == "", listed
    out = host.top / "out"
    message = refused_json(host.project(out, "--json"), "EPROTO", 1)
    assert "Starting server on stdio..." in message
    assert not out.exists()
    assert host.nothing_left_running(), host.servers_left()


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(b'{"jsonrpc": "2.0", "id": @ID@, "result": {"tools": [], "n": "\xff"}}\n',
                     id="not-utf-8"),
        pytest.param(b'{"jsonrpc": "2.0", "id": @ID@, "result": {"tools": [], "n": NaN}}\n',
                     id="nan"),
    ],
)  # fmt: skip
def test_a_listing_that_is_not_utf8_or_holds_nan_is_eproto(host: Host, line: bytes) -> None:
    """docs/tools.md *A misbehaving server*: JSON-RPC is UTF-8 JSON, which has no ``NaN``:
    a ``tools/list`` answer holding a byte that is not UTF-8, or ``NaN``, is "a line that is
    not JSON-RPC": EPROTO, exit 1, the line shown escaped, never a success that drops it."""
    record = host.wire(raw={"tools/list": line.decode("latin-1")}, encoding="latin-1")
    listed = host.listing("--json")
    message = refused_json(listed, "EPROTO", 1)
    assert message.startswith("server 'w' broke the protocol: it wrote a line that is not JSON"), (
        listed
    )
    assert ("\\xff" if b"\xff" in line else "NaN") in message, message
    assert methods(record) == ["start", "initialize", "notifications/initialized", "tools/list"]
    assert host.nothing_left_running(), host.servers_left()


def test_a_message_512_levels_deep_is_read_and_one_513_deep_is_eproto(host: Host) -> None:
    """docs/tools.md *A misbehaving server* and ``ctxmcp project --help``: "a message nested
    deeper than 512 levels ... is the server's protocol error (EPROTO)".  A listing whose
    message nests exactly 512 levels is read (exit 0, its tool listed); one level more is
    EPROTO, exit 1, naming the limit, and OUT is not made."""
    host.wire(depth=512)
    listed = host.listing("--json")
    assert listed.rc == 0, listed
    assert [tool["name"] for tool in listed.json()["tools"]] == ["w.echo"], listed
    host.wire(depth=513)
    out = host.top / "out"
    message = refused_json(host.project(out, "--json"), "EPROTO", 1)
    assert "nested deeper than 512 levels" in message, message
    assert not out.exists()


def test_a_listing_of_1000_pages_is_read_and_a_1001st_page_is_eproto(host: Host) -> None:
    """docs/tools.md *A misbehaving server*: "a listing that runs past 1000 pages ... ends the
    session with EPROTO, exit 1, nothing written".  1000 pages, each with a new cursor but the
    last, are one listing (its first and last tools both projected); 1001 are refused, naming
    the limit, with no candidate written."""
    host.wire(pages=1000)
    out = host.top / "out"
    projected = host.project(out, "--json")
    assert projected.rc == 0, projected
    assert sorted(os.listdir(out)) == ["w.echo.manifest.json", "w.last.manifest.json"]
    host.wire(pages=1001)
    fresh = host.top / "fresh"
    message = refused_json(host.project(fresh, "--json"), "EPROTO", 1)
    assert message == (
        "server 'w' broke the protocol: its tools/list went on past 1000 pages, each with a "
        "new cursor"
    )
    assert not fresh.exists()
    assert host.nothing_left_running(), host.servers_left()


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param('{"jsonrpc": "2.0", "id": @ID@}\n', id="no-result"),
        pytest.param('{"jsonrpc": "2.0", "id": @ID@, "result": ["2025-06-18"]}\n', id="a-list"),
        pytest.param('{"jsonrpc": "2.0", "id": @ID@, "result": null}\n', id="null"),
    ],
)
def test_an_initialize_answer_without_a_result_object_negotiates_no_version(
    host: Host, answer: str
) -> None:
    """M-2 (docs/tools.md *Versions*: "anything else (a draft, an unknown or future version,
    none) ends the session with EPROTO, exit 1, and nothing written"): an ``initialize``
    answered with no result, a list or ``null`` negotiates no version: EPROTO naming ``null``
    and the accepted versions, and the session goes no further than the handshake."""
    record = host.wire(raw={"initialize": answer})
    message = refused(host.listing(), "EPROTO", 1, "ctxmcp")
    assert message == (
        "server 'w' negotiated protocol version null; ctxmcp accepts only 2025-11-25, "
        "2025-06-18, 2025-03-26, 2024-11-05 (M-2)"
    )
    assert methods(record) == ["start", "initialize"]
    assert host.nothing_left_running(), host.servers_left()


@pytest.mark.parametrize(
    ("error", "said"),
    [
        ({"code": -32000}, "server 'w' refused tools/list: no message (code -32000)"),
        ({"message": "down"}, "server 'w' refused tools/list: down (code null)"),
        ({"code": 7, "message": ""}, "server 'w' refused tools/list: no message (code 7)"),
    ],
)  # fmt: skip
def test_a_refusal_without_a_message_or_a_code_is_said_as_the_server_gave_it(
    host: Host, error: dict, said: str
) -> None:
    """docs/tools.md *Exit statuses*: a server that "refused a request" is exit 1, "named with
    its errno": a JSON-RPC error object without a message, without a code or with an empty
    message is still the server's refusal, EREMOTEIO, said in JSON's spelling (``null``),
    never in Python's (``None``), and nothing is written."""
    answer = json.dumps({"jsonrpc": "2.0", "id": 0, "error": error}).replace(
        '"id": 0', '"id": @ID@'
    )
    host.wire(raw={"tools/list": answer + "\n"})
    out = host.top / "out"
    assert refused_json(host.project(out, "--json"), "EREMOTEIO", 1) == said
    assert not out.exists()


def test_a_server_that_closes_its_output_and_lives_on_is_eio_long_before_the_timeout(
    host: Host,
) -> None:
    """docs/tools.md *Exit statuses* (a server that "exited" is EIO "as soon as it exits"):
    a server that closes its stdout before answering ``initialize`` can answer nothing more:
    with the default ``--timeout`` (30 s) ctxmcp gives up within seconds, EIO, saying it closed
    its output and was stopped, and no process of it is left."""
    host.wire(close_out="initialize", stderr="about to go quiet\n")
    started = time.monotonic()
    listed = host.listing()
    took = time.monotonic() - started
    message = refused(listed, "EIO", 1, "ctxmcp")
    assert message.startswith(
        "server 'w' closed its output before answering initialize and went on running; it was "
        "stopped"
    ), listed
    assert message.endswith("its stderr ends: about to go quiet"), listed
    assert took < 15, took
    assert host.nothing_left_running(), host.servers_left()


def test_a_server_that_closes_its_input_and_lives_on_is_eio_and_stopped(host: Host) -> None:
    """docs/tools.md *Exit statuses*: a server that stops reading its requests (it closes its
    stdin, answers ``initialize`` and lives on) cannot be asked anything more: EIO, exit 1,
    within seconds, with the tail of its stderr, and no process of it left."""
    host.wire(close_in="initialize", stderr="stdin closed\n")
    started = time.monotonic()
    listed = host.listing()
    message = refused(listed, "EIO", 1, "ctxmcp")
    assert message.startswith(
        "server 'w' closed its input before it was sent notifications/initialized and went on "
        "running; it was stopped"
    ), message
    assert message.endswith("its stderr ends: stdin closed"), message
    assert time.monotonic() - started < 15
    assert host.nothing_left_running(), host.servers_left()


@pytest.mark.parametrize("case", ["cwd-missing", "not-executable", "a-directory"])
def test_a_server_that_cannot_be_started_is_named_with_the_kernels_errno(
    host: Host, case: str
) -> None:
    """docs/tools.md *Exit statuses*: "1 ... the server could not start ... named with its
    errno": a ``cwd`` that does not exist is ENOENT naming the cwd, a command that is a file
    without execute bits or a directory EACCES naming the command; OUT is not made."""
    entry, record = host.script()
    if case == "cwd-missing":
        entry["cwd"] = str(host.top / "gone")
        errno_name, said = "ENOENT", f"cannot start server 'w' (its cwd {host.top / 'gone'}): "
    else:
        command = host.mcp / "wire.py" if case == "not-executable" else host.mcp
        entry = {"command": str(command)}
        errno_name, said = "EACCES", f"cannot start server 'w' ({command}): Permission denied"
    host.configure(entry)
    out = host.top / "out"
    message = refused_json(host.project(out, "--json"), errno_name, 1)
    assert message.startswith(said), message
    assert not out.exists() and not record.exists()


def test_config_that_is_a_directory_is_a_usage_error_in_text_and_json(host: Host) -> None:
    """docs/tools.md: "The configuration is read only as a regular file"; *Exit statuses*: "2
    a configuration ... that cannot be used".  ``--config`` naming a directory is EINVAL, exit
    2, naming it, in text and as the ``--json`` error object, before any server starts."""
    text = host.ctxmcp("list", "--config", host.mcp, "--server", "w")
    assert f"'{host.mcp}' is a directory" in refused(text, "EINVAL", 2, "ctxmcp"), text
    as_json = host.ctxmcp("list", "--config", host.mcp, "--server", "w", "--json")
    assert f"'{host.mcp}' is a directory" in refused_json(as_json, "EINVAL", 2)


def test_no_message_larger_than_16_mib_is_no_message_larger_than_16_mib(host: Host) -> None:
    """docs/tools.md *A misbehaving server*: "A message larger than 16 MiB ... ends the
    session with EPROTO".  A short log notification, then one of 16777215 bytes (its line 16
    MiB with its line end), then a listing of some 70 kB, all in one write: none is such a
    message, so the notifications are dropped, the listing read and the tool listed."""
    host.wire(notice={"size": MIB16 - 1}, description=70_000)
    listed = host.listing("--json")
    assert listed.rc == 0, listed
    assert [tool["name"] for tool in listed.json()["tools"]] == ["w.echo"]


# ======================================================================== ctxmcp: odd --out


def test_an_out_whose_name_is_too_long_is_enametoolong_before_the_server_starts(
    host: Host,
) -> None:
    """docs/tools.md *Exit statuses*: "2 ... an --out that ctxmcp may not write into ... each
    said before the server starts".  An OUT below a name of 300 bytes (the kernel's limit is
    255) is ENAMETOOLONG, exit 2, naming OUT; nothing is made and the server never starts."""
    record = host.wire()
    out = host.top / ("x" * 300) / "out"
    message = refused_json(host.project(out, "--json"), "ENAMETOOLONG", 2)
    assert message.startswith(f"--out {out}: ") and "(nothing was written)" in message
    assert sorted(os.listdir(host.top)) == ["mcp", "storage", "trace"]
    assert not record.exists()


@pytest.mark.parametrize("below", [False, True], ids=["the-loop", "below-the-loop"])
def test_an_out_through_a_loop_of_links_is_eloop_before_the_server_starts(
    host: Host, below: bool
) -> None:
    """docs/tools.md *Exit statuses* (an --out refused "before the server starts", with its
    errno): an OUT that is, or lies below, a loop of symbolic links is ELOOP, exit 2, naming
    it; the links are left as they were and the server never starts."""
    record = host.wire()
    (host.top / "loop-a").symlink_to("loop-b")
    (host.top / "loop-b").symlink_to("loop-a")
    out = host.top / "loop-a" / "out" if below else host.top / "loop-a"
    message = refused_json(host.project(out, "--json"), "ELOOP", 2)
    assert message.startswith(f"--out {out}: ") and "(nothing was written)" in message
    assert os.readlink(host.top / "loop-a") == "loop-b"
    assert os.readlink(host.top / "loop-b") == "loop-a"
    assert not record.exists()


def test_an_out_below_a_directory_the_caller_cannot_search_is_eacces_before_the_server_starts(
    host: Host, unprivileged_user: UnprivilegedUser
) -> None:
    """docs/tools.md *Candidates (M-4)*: OUT "and each directory above it, walking up ``..``,
    are compared by device and inode" with the storage root; *Exit statuses*: 2, "each said
    before the server starts".  A user whose working directory lies below a directory they
    may not search gives a relative OUT there: the walk up cannot be made, so ctxmcp cannot
    tell it is outside the root: EACCES, exit 2, saying so, nothing made, no server
    started."""
    record = host.wire()
    locked = host.top / "locked"
    inner = locked / "inner"
    inner.mkdir(parents=True)
    locked.chmod(0o700)
    os.chown(inner, unprivileged_user.uid, unprivileged_user.gid)
    run = host.project("out", "--json", user=unprivileged_user, cwd=inner)
    message = refused_json(run, "EACCES", 2)
    assert message.startswith(
        "cannot tell whether --out out is inside the storage root: a directory above it cannot "
        "be searched"
    ), message
    assert os.listdir(inner) == []
    assert not record.exists()


def test_a_write_only_out_is_written_or_refused_before_the_server_starts(
    host: Host, unprivileged_user: UnprivilegedUser
) -> None:
    """docs/tools.md *Exit statuses*: "2 ... an --out that ctxmcp may not write into ... one
    whose nearest existing directory it may not write (EACCES) ... each said before the
    server starts".  A drop directory of the caller's own, mode 0300, is one the caller may
    write into: either the candidate is written there (exit 0), or the refusal comes before
    the server starts (exit 2), never after it ran, with advice the directory already
    meets."""
    record = host.wire()
    drop = host.top / "drop"
    drop.mkdir()
    os.chown(drop, unprivileged_user.uid, unprivileged_user.gid)
    drop.chmod(0o300)
    run = host.project(drop, user=unprivileged_user, cwd=host.top)
    if run.rc == 0:
        assert os.listdir(drop) == ["w.echo.manifest.json"], run
    else:
        refused(run, "EACCES", 2, "ctxmcp")
        assert not record.exists(), "the server was started before the refusal"
    assert not hidden_entries(drop)


def test_a_directory_where_a_candidate_goes_is_eisdir_with_or_without_replace(
    host: Host,
) -> None:
    """docs/tools.md *Candidates (M-4)* ("all or none") and *Earlier candidates* ("--replace
    ... each is overwritten"): a directory in the place of ``w.echo.manifest.json`` can be
    neither refused as an earlier candidate nor overwritten: EISDIR, exit 1, naming it and
    what to do, with and without ``--replace``; the other tool's candidate is not written
    either, the directory and its content are untouched and no temporary is left."""
    host.wire(pages=2)
    out = host.top / "out"
    in_the_way = out / "w.echo.manifest.json"
    in_the_way.mkdir(parents=True)
    (in_the_way / "keep").write_text("mine\n")
    for extra in ((), ("--replace",)):
        message = refused_json(host.project(out, "--json", *extra), "EISDIR", 1)
        assert message == (
            f"{in_the_way}: a directory where a candidate goes; move it away (--replace "
            "overwrites only files)"
        )
        assert sorted(os.listdir(out)) == ["w.echo.manifest.json"]
        assert (in_the_way / "keep").read_text() == "mine\n"
    assert host.nothing_left_running(), host.servers_left()


# ======================================================== the bridge: a server that misbehaves


BROKEN_CALLS = {
    "result-a-list": (
        '{"jsonrpc": "2.0", "id": @ID@, "result": [{"type": "text", "text": "hi"}]}\n',
        "its tools/call result is not an object",
    ),
    "neither-result-nor-error": (
        '{"jsonrpc": "2.0", "id": @ID@}\n',
        "its tools/call result is not an object",
    ),
    "content-a-string": (
        '{"jsonrpc": "2.0", "id": @ID@, "result": {"content": "hi", "isError": false}}\n',
        "its tools/call result has a 'content' that is not a list; MCP requires a list of items",
    ),
    "a-line-of-log-text": (
        "INFO echo called\n",
        "it wrote a line that cannot be read as JSON",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN_CALLS))
def test_a_call_answered_with_no_result_object_or_content_list_is_eproto_in_both_modes(
    host: Host, case: str
) -> None:
    """M-4, docs/tools.md (the bridge's step 5: a result "without a content list ... is the
    server's fault, never the caller's, and never a success with the data dropped: EPROTO,
    exit 1, in both modes"): a ``tools/call`` answered with a list, with neither ``result``
    nor ``error``, with a ``content`` that is a string, or with a line of log
    text fails the call with EPROTO naming what is wrong, natively (the result frame) and in
    terminal mode (nothing on stdout); each call is recorded once as an error, and no server
    is left."""
    line, said = BROKEN_CALLS[case]
    host.install()
    host.wire(raw={"tools/call": line})
    ran, result = host.native("broken", {"text": "hi"})
    assert ran.rc == 1 and result["status"] == "error", ran
    error = result["error"]
    assert (error["error"], error["stage"]) == ("EPROTO", "exit"), error
    assert f"server 'w' broke the protocol: {said}" in error["message"], error
    said_in_terminal = host.terminal("broken", '{"text": "hi"}')
    message = refused(said_in_terminal, "EPROTO", 1, "w.echo")
    assert said_in_terminal.out == "" and said in message, said_in_terminal
    records = host.results("broken")
    assert records == [("error", 1, "EPROTO"), ("error", 1, None)], records
    assert host.nothing_left_running(), host.servers_left()


def test_a_server_that_closes_its_output_at_the_call_fails_it_with_eio_within_seconds(
    host: Host,
) -> None:
    """M-4, docs/tools.md (the bridge's step 4: the answer is awaited "as long as the call's
    timeout allows and the server runs"; a server that cannot answer fails the call with EIO
    naming how it ended): a server that closes its stdout on ``tools/call`` and lives on
    fails the call with EIO, exit 1, well before the native default timeout of 60 s, and is
    stopped; the call is recorded as an error."""
    host.install()
    host.wire(close_out="tools/call", stderr="no more output\n")
    started = time.monotonic()
    ran, result = host.native("closed", {"text": "hi"})
    assert time.monotonic() - started < 20
    assert ran.rc == 1 and result["error"]["error"] == "EIO", ran
    assert result["error"]["message"].endswith(
        "server 'w' closed its output before answering tools/call and went on running; it was "
        "stopped; its stderr ends: no more output"
    ), result
    assert host.nothing_left_running(), host.servers_left()
    assert host.results("closed") == [("error", 1, "EIO")]


# ================================================ the bridge: a configuration that changed


def _config_missing(host: Host) -> None:
    host.config.unlink()


def _config_a_directory(host: Host) -> None:
    host.config.unlink()
    host.config.mkdir()


def _config_a_fifo(host: Host) -> None:
    host.config.unlink()
    os.mkfifo(host.config, 0o644)


def _config_too_large(host: Host) -> None:
    document = json.loads(host.config.read_text())
    document["padding"] = "p" * (1024 * 1024)
    host.config.write_text(json.dumps(document))


def _config_below_a_file(host: Host) -> None:
    # The locator names mcp/sub/mcp.json; sub is now a file.
    (host.mcp / "sub").write_text("not a directory\n")


def _entry_relative_command(host: Host) -> None:
    host.configure({"command": "./wire.py"})


def _entry_cwd_missing(host: Host) -> None:
    document = json.loads(host.config.read_text())
    document["mcpServers"]["w"]["cwd"] = str(host.top / "gone")
    host.config.write_text(json.dumps(document))


CHANGED_CONFIGS = {
    "missing": (_config_missing, "ENOENT", "{config}: No such file or directory"),
    "a-directory": (_config_a_directory, "EISDIR", "{config} is a directory, not a file"),
    "a-fifo": (_config_a_fifo, "EINVAL", "{config} is not a regular file"),
    "over-1-mib": (_config_too_large, "EINVAL", "{config} is larger than 1048576 bytes"),
    "below-a-file": (_config_below_a_file, "ENOTDIR", "{mcp}/sub is not a directory"),
    "relative-command": (
        _entry_relative_command,
        "EINVAL",
        "{config}: server 'w': 'command' './wire.py' is a relative path",
    ),
    "cwd-missing": (
        _entry_cwd_missing,
        "ENOENT",
        "cannot start server 'w' (its cwd {top}/gone): No such file or directory",
    ),
}


@pytest.mark.parametrize("case", sorted(CHANGED_CONFIGS))
def test_a_configuration_that_became_unusable_fails_each_call_naming_it(
    host: Host, case: str
) -> None:
    """M-4, docs/tools.md (the bridge's step 3: it "reads the configuration at the locator's
    path in the agent's view", a regular file of at most 1 MiB, never waiting on a FIFO; an
    entry's command is absolute or a bare name, and a server that cannot start is named with
    its errno): after the tool was installed and called once, its configuration goes missing,
    becomes a directory, a FIFO, larger than 1 MiB, lies below a file, or its entry names a
    relative command or a cwd that is gone.  Each call then fails with the errno of the kernel
    or EINVAL, exit 1, one line naming the file (or the server), nothing on stdout, the same
    error in the native result frame; no server starts and each call is recorded once as an
    error."""
    change, errno_name, said = CHANGED_CONFIGS[case]
    config = host.mcp / "sub" / "mcp.json" if case == "below-a-file" else host.config
    record = host.wire()
    host.install(config)
    if case == "below-a-file":
        (host.mcp / "sub").mkdir()
        shutil.copy(host.config, config)
        config.chmod(0o644)
    intact = host.terminal("intact", '{"text": "hi"}')
    assert intact.rc == 0 and json.loads(intact.out) == {"text": "hi"}, intact
    if case == "below-a-file":
        shutil.rmtree(host.mcp / "sub")
    record.unlink()
    change(host)
    expected = said.format(config=config, mcp=host.mcp, top=host.top)
    started = time.monotonic()
    ran = host.terminal("changed", '{"text": "hi"}')
    assert time.monotonic() - started < 20
    message = refused(ran, errno_name, 1, "w.echo")
    assert message.startswith(expected) and ran.out == "", ran
    assert len(ran.err.splitlines()) == 1, ran
    native, result = host.native("changed", {"text": "hi"})
    assert native.rc == 1 and result["status"] == "error", native
    assert result["error"]["error"] == errno_name, result
    assert result["output"]["message"].startswith(expected), result
    assert not record.exists(), methods(record)
    records = host.results("changed")
    assert records == [("error", 1, None), ("error", 1, errno_name)], records


@pytest.mark.parametrize("case", ["owned-by-another-uid", "group-writable", "root-sticky"])
def test_directories_above_the_configuration_are_held_to_strict_modes(
    host: Host, unprivileged_user: UnprivilegedUser, case: str
) -> None:
    """M-4, docs/tools.md (the bridge's step 3): the configuration names the command the tool
    runs, so "the file and every directory above it must belong to root or to the tool's
    owner and be writable by the owner alone (a sticky directory such as /tmp may be writable
    by others when it and the entry below it are root's or the owner's)".  A directory above
    it that belongs to another uid, or that its group may write, refuses every call with
    EACCES naming that directory and the fix (chown, chmod go-w), exit 1, no server started;
    a sticky directory of root's, writable by all, does not."""
    sub = host.mcp / "sub"
    sub.mkdir()
    config = sub / "mcp.json"
    record = host.wire()
    shutil.copy(host.config, config)
    config.chmod(0o644)
    host.install(config)
    if case == "owned-by-another-uid":
        os.chown(sub, unprivileged_user.uid, unprivileged_user.gid)
        why = f"{sub} belongs to uid {unprivileged_user.uid}"
    elif case == "group-writable":
        sub.chmod(0o775)
        why = f"{sub} is writable by its group or by others (mode 0775)"
    else:
        sub.chmod(0o1777)
        why = ""
    ran = host.terminal("strict", '{"text": "hi"}')
    if not why:
        assert ran.rc == 0 and json.loads(ran.out) == {"text": "hi"}, ran
        assert methods(record)[-1] == "tools/call"
        return
    message = refused(ran, "EACCES", 1, "w.echo")
    assert message.startswith(f"{config} (on the host {config}) names the command this tool runs, "
                              f"but {why}"), message  # fmt: skip
    assert message.endswith("(chown, chmod go-w)"), message
    assert not record.exists()
    assert host.results("strict") == [("error", 1, None)]


# ================================================================ the bridge: odd controls


def test_help_of_a_description_that_is_not_utf8_prints_it_or_the_tool_is_damaged(
    host: Host,
) -> None:
    """docs/tools.md *Arguments in terminal mode*: "``s.t --help`` ... prints the tool's
    description and input schema from its controls (``<name>.d/description``,
    ``<name>.d/schema``) and starts no server"; *Tools as files*: a malformed control makes
    the tool damaged, as ``ctx object list`` reports it, its calls refused at stage
    ``resolve`` (exit 126).  A description edited to hold the byte 0xff is one or the other:
    printed (never the raw byte) with the schema, or a damaged tool everywhere — not a tool
    listed ``available`` whose own help calls it unreadable."""
    record = host.wire()
    tool = host.install()
    (Path(f"{tool}.d") / "description").write_bytes(b"Echoes \xff the input.\n")
    argv = [*CTX_ARGV, "run", "--agent", "coder", "w.echo", "--help"]
    done = subprocess.run(argv, capture_output=True, env=host.env, timeout=60)
    listed = host.ctx("object", "list", "--json")
    [entry] = [e for e in listed.json() if e["name"] == "w.echo"]
    if entry["status"] == "damaged":
        assert done.returncode == 126 and b"ENOEXEC" in done.stderr, done
    else:
        assert done.returncode == 0, done
        assert done.stdout.startswith(b"Echoes ") and b"\xff" not in done.stdout, done
        assert b'"text"' in done.stdout, done
    assert not record.exists()


def test_a_removed_mcp_control_is_enoexec_before_the_server_starts(host: Host) -> None:
    """M-4, docs/tools.md (the bridge's step 1: it "reads ``<name>.d/mcp`` beside its
    executable, and refuses it (ENOEXEC, before the server starts) unless it is the tool's
    strict stdio locator"): with the ``mcp`` control removed by hand, each call fails with
    ENOEXEC naming the control, exit 1, in both modes, recorded as an error; no server
    starts.  (``ctx object list`` still lists the tool ``available``: ``mcp`` is optional
    for a tool, and only the bridge knows it needs one.)"""
    record = host.wire()
    tool = host.install()
    control = Path(f"{tool}.d") / "mcp"
    control.unlink()
    ran = host.terminal("unlocated", '{"text": "hi"}')
    message = refused(ran, "ENOEXEC", 1, "w.echo")
    assert message == f"{control} is not a readable MCP locator: No such file or directory", ran
    native, result = host.native("unlocated", {"text": "hi"})
    assert native.rc == 1 and result["error"]["error"] == "ENOEXEC", native
    assert not record.exists()
    assert host.results("unlocated") == [("error", 1, None), ("error", 1, "ENOEXEC")]
    [entry] = [e for e in host.ctx("object", "list", "--json").json() if e["name"] == "w.echo"]
    assert entry["status"] == "available", entry


# ============================================================ a host that is not root


def test_a_host_that_is_not_root_mounting_its_configuration_read_write_is_refused_at_run(
    host: Host, unprivileged_user: UnprivilegedUser
) -> None:
    """M-4, docs/tools.md (the bridge's step 3): the agent of a host that is not root runs as
    that host, so "the call is refused with EACCES too when the agent's uid may write the
    file, or a directory from the source of one of its read-write mounts down to it, naming
    the mount"; there "the runner holds the configuration to the same rule on the host before
    it starts the bridge (a refusal is the call's error at stage ``run``)".  With ``mcp/``
    mounted read-write the call is EACCES at stage run (exit 126 in terminal mode), naming
    the mount and what to do, and no server starts; mounted read-only, the same tool runs."""
    user = unprivileged_user
    home = host.top / "home"
    home.mkdir()
    os.chown(home, user.uid, user.gid)
    env = {"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
           "CTX_STORAGE": str(home / "storage")}  # fmt: skip

    def as_owner(*args: str, stdin: str = "") -> Run:
        return run_program([*CTX_ARGV, *args], env=env, user=user, cwd=home,
                           stdin=stdin.encode())  # fmt: skip

    assert as_owner("bootstrap").rc == 0
    mcp = home / "mcp"
    mcp.mkdir()
    (mcp / "wire.py").write_text(SERVER)
    record = home / "record.jsonl"
    script = {"record": str(record)}
    entry = {"command": str(PYTHON), "args": [str(mcp / "wire.py"), json.dumps(script)]}
    (mcp / "mcp.json").write_text(json.dumps({"mcpServers": {"w": entry}}))
    manifest = home / "w.echo.json"
    manifest.write_text(json.dumps({
        "manifest": 2, "kind": "tool", "name": "w.echo", "description": "Echo the input.",
        "schema": {"type": "object"}, "cap": {"side_effects": False, "network": False},
        "mcp": {"transport": "stdio", "config": "/mcp/mcp.json", "server": "w", "tool": "echo"},
    }))  # fmt: skip
    for path in (mcp, mcp / "wire.py", mcp / "mcp.json", manifest):
        os.chown(path, user.uid, user.gid)
    assert as_owner("object", "install", str(manifest), "--tier", "system").rc == 0
    with (home / "storage" / "tool" / "w.echo.d" / "policy").open("a") as policy:
        policy.write(f"allow {LABEL} tool:w.echo execute\nallow reader_t tool:w.echo execute\n")
    for name, label, how in (("coder", LABEL, "rw"), ("reader", "reader_t", "ro")):
        request = {"name": name, "label": label, "tools": ["w.echo"],
                   "mount": [[str(mcp), "/mcp", how]]}  # fmt: skip
        made = as_owner("agent", "create", "-", "--json", stdin=json.dumps(request))
        assert made.rc == 0 and made.json()["identity"]["uid"] == user.uid, made

    ran = as_owner("run", "--agent", "coder", "w.echo", '{"text": "hi"}')
    message = refused(ran, "EACCES", 126, "ctx")
    assert message.startswith("w.echo: /mcp/mcp.json (on the host "), message
    assert f"through its read-write mount of {mcp} at /mcp" in message, message
    assert message.endswith("outside its read-write mounts"), message
    native = as_owner("run", "--agent", "coder", "--native", "w.echo", stdin='{"text": "hi"}')
    result = json.loads(native.out.splitlines()[-1])
    assert native.rc == 1 and (result["error"]["error"], result["error"]["stage"]) == (
        "EACCES",
        "run",
    ), native
    assert not record.exists()

    read_only = as_owner("run", "--agent", "reader", "w.echo", '{"text": "hi"}')
    assert read_only.rc == 0 and json.loads(read_only.out) == {"text": "hi"}, read_only
    assert methods(record)[-1] == "tools/call"
    assert wait_for(lambda: not processes_of(mcp), 10), processes_of(mcp)
