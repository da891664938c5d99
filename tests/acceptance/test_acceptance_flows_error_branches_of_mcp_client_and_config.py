"""The error branches of ``ctxmcp``'s stdio client, of the configuration it reads and of the
directory it writes candidates into, each reached from outside as an operator reaches it, and
judged by SPEC §10 (M-1..M-4), docs/tools.md (*MCP servers as tool sources*: the entry rules,
*Versions*, *Names*, *A misbehaving server*, *Candidates*, *Earlier candidates*, *Exit
statuses*) and ``ctxmcp --help`` / ``ctxmcp project --help``.

The angle: ``cortexfs/mcp/config.py``, ``client.py``, ``project.py``, ``out_directory.py`` and
``candidates.py`` read line by line, every refusal driven through ``ctxmcp list|project``.
Configuration entries whose values hold a lone surrogate of the range the file system's
escape uses (``"\\udcff"``), that the kernel will not start (an argument past its limit, a
file that is no program, an emptied ``PATH``, a ``cwd`` that is a file), a configuration
below a file.  Servers written here on raw pipes that answer ``initialize`` twice, answer
with no id, ``true``, ``2.0`` or the id as a string, stay silent at the handshake, flood
their stderr with bytes that are not UTF-8, close their input and exit once initialised,
stop reading while they are sent a cursor they made a megabyte long, list tools without a
name, and, while they list, swap OUT for a link into the storage root or the directory above
it for a file.  An OUT on a read-only bind mount, immutable, append-only, on a full tmpfs or
one out of inodes, two levels below a file, inside a second storage root or behind a space's
``tool/`` made a link, with an earlier candidate made immutable or a FIFO or dangling link at
a candidate's name.  ``--runtime-config`` bytes that are not UTF-8.  ctxmcp stopped by
Ctrl-C, and sent SIGHUP under ``nohup``.

Each check reads the exit status (0, 1, 2 or 130 as documented), the errno word of the
``ctxmcp: ERRNO: sentence`` line and of the ``--json`` error object, that the message names
what is at fault and the remedy, that no traceback is printed, and that nothing is
half-done: OUT not made or left as it was, no temporary left, nothing written through a
link or into the storage root, the server never started where the refusal comes first, and
no process of it left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    Run,
    clean_env,
    kill_processes_of,
    new_scratch_dir,
    processes_of,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.support.mcp_wire import WIRE
from tests.support.scratch_mounts import ScratchMounts
from tests.support.storage import attribute, copy_of_root

TOP = scratch_top(__file__)
BIN = Path(CTX_ARGV[0]).parent
CTXMCP = BIN / "ctxmcp"
PYTHON = BIN / "python"
RUNTIME = "/mcp/mcp.json"
ECHO = {"name": "echo", "description": "Echo.", "inputSchema": {"type": "object"}}

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts and chattr need root"),
    pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed"),
]

# A stdio MCP server on raw pipes, driven by the JSON script in argv[1]:
#   record   a file each message received is appended to (its method; "start" first)
#   noise    this many bytes of "n" written on stderr as it starts, then
#   stderr   this text (surrogate escapes written as the bytes they stand for)
#   act      {method: [argv, ...]}: run each before answering that method
#   exit     {method: status}: exit with it instead of answering
#   silent   [method, ...]: never answer it (and go on reading nothing)
#   raw      {method: line}: answer with this text verbatim (@ID@: the request's id;
#            @CURSOR@: "c" repeated "cursor" times, too long to be an argument)
#   close_in [method, ...]: close stdin before answering it
#   exit_after {method: status}: exit with it right after answering
#   stall    [method, ...]: after answering it, read nothing more and never exit
#   tools    the listing (a single page)
SERVER = (
    WIRE
    + r"""
import subprocess

SCRIPT = json.loads(sys.argv[1])

def note(what):
    if SCRIPT.get("record"):
        with open(SCRIPT["record"], "a") as record:
            record.write(what + "\n")

note("start")
if SCRIPT.get("noise"):
    os.write(2, b"n" * SCRIPT["noise"])
if SCRIPT.get("stderr"):
    os.write(2, SCRIPT["stderr"].encode("utf-8", "surrogateescape"))
while True:
    message = receive()
    method = message.get("method")
    note(str(method))
    if "id" not in message:
        continue
    ident = message["id"]
    for argv in SCRIPT.get("act", {}).get(method, []):
        subprocess.run(argv, check=False)
    if method in SCRIPT.get("exit", {}):
        os._exit(SCRIPT["exit"][method])
    if method in SCRIPT.get("silent", []):
        time.sleep(600)
        sys.exit(0)
    if method in SCRIPT.get("close_in", []):
        os.close(0)
    raw = SCRIPT.get("raw", {}).get(method)
    if raw is not None:
        raw = raw.replace("@CURSOR@", "c" * SCRIPT.get("cursor", 0))
        send_bytes(raw.replace("@ID@", json.dumps(ident)).encode())
    elif method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "branches", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": SCRIPT.get("tools", [])}})
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": method}})
    if method in SCRIPT.get("exit_after", {}):
        os._exit(SCRIPT["exit_after"][method])
    if method in SCRIPT.get("stall", []):
        time.sleep(600)
        sys.exit(0)
"""
)


# ------------------------------------------------------------------------ the world, checks


def refused(run: Run, errno_name: str, status: int) -> str:
    """``run`` ended with ``status`` and said ``ctxmcp: ERRNO: …`` as the last line of its
    standard error, with no traceback; the message."""
    assert run.rc == status, run
    assert "Traceback" not in run.err, run
    assert run.err.strip(), run
    last = run.err.rstrip("\n").splitlines()[-1]
    assert last.startswith(f"ctxmcp: {errno_name}: "), run
    return last.removeprefix(f"ctxmcp: {errno_name}: ")


def refused_json(run: Run, errno_name: str, status: int) -> str:
    """As :func:`refused` for ``--json``: stdout is the error object alone, saying what
    stderr says; the message."""
    message = refused(run, errno_name, status)
    error = run.json()
    assert error == {"error": errno_name, "errno": error["errno"], "message": message}, run
    assert isinstance(error["errno"], int) and error["errno"] > 0, run
    return message


def hidden(directory: Path) -> list[str]:
    """Entries a projection may have left half-done in ``directory`` (temporaries)."""
    return sorted(name for name in os.listdir(directory) if name.startswith("."))


@dataclass
class World:
    """A scratch directory holding a bootstrapped storage root (``CTX_STORAGE``), the server
    program ``srv.py`` and ``mcp.json`` naming server ``w``; mounts made below it."""

    top: Path
    storage: Path
    mounts: ScratchMounts
    _records: int = field(default=0)

    @property
    def config(self) -> Path:
        return self.top / "mcp.json"

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    def configure(self, entry: dict) -> None:
        self.config.write_text(json.dumps({"mcpServers": {"w": entry}}))

    def entry(self, **script) -> tuple[dict, Path]:
        """An entry running the server with ``script``; the record it will write."""
        self._records += 1
        record = self.top / f"record-{self._records}.txt"
        script = {"record": str(record), **script}
        return {"command": str(PYTHON), "args": [str(self.top / "srv.py"), json.dumps(script)]}, (
            record
        )

    def serve(self, **script) -> Path:
        """``mcp.json`` naming server ``w`` with ``script``; its record file."""
        entry, record = self.entry(**script)
        self.configure(entry)
        return record

    def ctxmcp(self, *args, cwd: Path | None = None, timeout: float = 60) -> Run:
        argv = [a if isinstance(a, bytes) else str(a) for a in args]
        done = subprocess.run([str(CTXMCP), *argv], input=b"", capture_output=True,
                              env=self.env, cwd=cwd or self.top, timeout=timeout)  # fmt: skip
        return Run(
            [os.fsdecode(a) for a in argv],
            done.returncode,
            done.stdout.decode("utf-8", "replace"),
            done.stderr.decode("utf-8", "replace"),
        )

    def listing(self, *args, timeout: float = 60) -> Run:
        return self.ctxmcp("list", "--config", self.config, "--server", "w", *args,
                           timeout=timeout)  # fmt: skip

    def project(self, out: Path, *args) -> Run:
        return self.ctxmcp("project", "--config", self.config, "--runtime-config", RUNTIME,
                           "--server", "w", "--out", out, *args)  # fmt: skip

    def project_argv(self, out: Path, *args: str) -> list[str]:
        return [str(CTXMCP), "project", "--config", str(self.config), "--runtime-config",
                RUNTIME, "--server", "w", "--out", str(out), *args]  # fmt: skip

    def nothing_left_running(self) -> bool:
        return wait_for(lambda: not processes_of(self.top), 10)


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(TOP, "w-")
    mounts = ScratchMounts(top)
    try:
        storage = copy_of_root(_template, top / "storage")
        (top / "srv.py").write_text(SERVER)
        yield World(top, storage, mounts)
    finally:
        kill_processes_of(top)
        mounts.close()


def started(record: Path) -> list[str]:
    """What the server that writes ``record`` received ("start" as it started)."""
    return record.read_text().split() if record.exists() else []


# ================================================= the configuration: values and starting


@pytest.mark.parametrize("field_name", ["args", "env-name", "env-value", "cwd"])
def test_a_lone_surrogate_of_the_escape_range_is_refused_like_any_other(
    world: World, field_name: str
) -> None:
    """docs/tools.md (*MCP servers as tool sources*): "so is a command, argument, ``env``
    value or ``cwd`` holding a NUL or a lone surrogate ... no process can be given those
    (``EINVAL``, exit 2, naming the field, never an ``env`` value)".  JSON can spell
    ``"\\udcff"`` as well as ``"\\ud800"``; both are lone surrogates, no character, and no
    UTF-8 file holds them.  An entry holding ``\\udcff`` in an argument, an ``env`` name or
    value, or its ``cwd`` is refused like one holding ``\\ud800``: EINVAL, exit 2, naming the
    field, before the server starts and before OUT is made — never started with the byte
    0xff in its place."""
    entry, record = world.entry(tools=[ECHO])
    lone = "\udcff"
    if field_name == "args":
        entry["args"].append(f"--token={lone}")
        said = "a value of 'args' holds a lone surrogate"
    elif field_name == "env-name":
        entry["env"] = {f"TOKEN{lone}": "x"}
        said = "a value of 'env' holds a lone surrogate"
    elif field_name == "env-value":
        entry["env"] = {"TOKEN": f"secret{lone}"}
        said = "a value of 'env' holds a lone surrogate"
    else:
        (world.top / "srvdir").mkdir()
        entry["cwd"] = str(world.top / f"srvdir{lone}")
        said = "a value of 'cwd' holds a lone surrogate"
    world.configure(entry)
    assert "\\udcff" in world.config.read_text()
    out = world.top / "out"
    message = refused_json(world.project(out, "--json"), "EINVAL", 2)
    assert message.startswith(f"{world.config}: server 'w': {said}"), message
    assert "secret" not in message
    assert not out.exists()
    assert started(record) == []


@pytest.mark.parametrize("case", ["argument-too-long", "not-a-program", "path-emptied",
                                  "cwd-a-file"])  # fmt: skip
def test_a_server_the_kernel_will_not_start_is_named_with_its_errno(
    world: World, case: str
) -> None:
    """docs/tools.md *Exit statuses*: "1 ... the server could not start ... named with its
    errno"; *MCP servers as tool sources*: a bare command "is looked up on the PATH of that
    environment" (the configuration's ``env`` included).  An argument of 200000 bytes (past
    the kernel's limit for one string) is E2BIG naming the command and never echoing the
    argument, which may be a secret; an executable file that is no program is ENOEXEC; a
    bare command looked up on an entry's emptied ``PATH`` is ENOENT naming that bare name;
    a ``cwd`` that is a file is ENOTDIR naming the cwd.  Exit 1, the error object with
    ``--json``, OUT not made, no process left."""
    entry, record = world.entry(tools=[ECHO])
    if case == "argument-too-long":
        entry["args"].append("s" * 200_000)
        errno_name, said = "E2BIG", f"cannot start server 'w' ({PYTHON}): Argument list too long"
    elif case == "not-a-program":
        program = world.top / "not-a-program"
        program.write_bytes(b"\x7fELF and then nothing a loader knows\n")
        program.chmod(0o755)
        entry = {"command": str(program)}
        errno_name, said = "ENOEXEC", f"cannot start server 'w' ({program}): Exec format error"
    elif case == "path-emptied":
        entry = {"command": "python3", "args": ["-c", "pass"], "env": {"PATH": ""}}
        errno_name = "ENOENT"
        said = "cannot start server 'w' (python3): No such file or directory"
    else:
        (world.top / "a-file").write_text("not a directory\n")
        entry["cwd"] = str(world.top / "a-file")
        errno_name = "ENOTDIR"
        said = f"cannot start server 'w' (its cwd {world.top / 'a-file'}): Not a directory"
    world.configure(entry)
    out = world.top / "out"
    run = world.project(out, "--json")
    message = refused_json(run, errno_name, 1)
    assert message.startswith(said), message
    assert "s" * 100 not in run.out + run.err
    assert not out.exists()
    assert started(record) == []
    assert world.nothing_left_running(), processes_of(world.top)


def test_a_configuration_below_a_file_is_enotdir_naming_it_before_anything_starts(
    world: World,
) -> None:
    """docs/tools.md *Exit statuses*: "2 a configuration or server name that cannot be used",
    named with the kernel's errno.  ``--config`` below a regular file is ENOTDIR, exit 2,
    naming the path given, in text and as the ``--json`` error object; the file in the way is
    left as it was and no OUT is made."""
    record = world.serve(tools=[ECHO])
    (world.top / "notes").write_text("mine\n")
    config = world.top / "notes" / "mcp.json"
    text = world.ctxmcp("list", "--config", config, "--server", "w")
    assert refused(text, "ENOTDIR", 2) == f"cannot read {config}: Not a directory"
    out = world.top / "out"
    as_json = world.ctxmcp("project", "--config", config, "--runtime-config", RUNTIME,
                           "--server", "w", "--out", out, "--json")  # fmt: skip
    assert refused_json(as_json, "ENOTDIR", 2) == f"cannot read {config}: Not a directory"
    assert (world.top / "notes").read_text() == "mine\n"
    assert not out.exists() and started(record) == []


# ====================================================================== the stdio client


def test_a_second_answer_to_initialize_answers_no_request_and_ends_the_session(
    world: World,
) -> None:
    """docs/tools.md *A misbehaving server*: "a response to an id that was never asked ...
    one request is in flight at a time ... ends the session with EPROTO, exit 1, nothing
    written".  A server that answers ``initialize`` twice has its second answer (id 1) read
    while ``tools/list`` (id 2) is in flight: EPROTO naming both ids, never the stale answer
    taken for a listing; ``list`` prints nothing, ``project`` makes no OUT, and no process
    of the server is left."""
    answer = ('{"jsonrpc": "2.0", "id": @ID@, "result": {"protocolVersion": "2025-06-18", '
              '"capabilities": {}}}\n')  # fmt: skip
    record = world.serve(tools=[ECHO], raw={"initialize": answer * 2})
    said = (
        "server 'w' broke the protocol: it answered id 1, but the only request in flight was "
        "tools/list, id 2"
    )
    listed = world.listing()
    assert refused(listed, "EPROTO", 1) == said and listed.out == "", listed
    out = world.top / "out"
    assert refused_json(world.project(out, "--json"), "EPROTO", 1) == said
    assert not out.exists()
    assert started(record)[-1] == "tools/list"
    assert world.nothing_left_running(), processes_of(world.top)


@pytest.mark.parametrize(
    ("answer", "shown"),
    [
        pytest.param('{"jsonrpc": "2.0", "result": {"tools": []}}\n', "null", id="no-id"),
        pytest.param('{"jsonrpc": "2.0", "id": true, "result": {"tools": []}}\n', "true",
                     id="true"),
        pytest.param('{"jsonrpc": "2.0", "id": 2.0, "result": {"tools": []}}\n', "2.0",
                     id="a-float"),
        pytest.param('{"jsonrpc": "2.0", "id": "2", "result": {"tools": []}}\n', '"2"',
                     id="a-string"),
    ],
)  # fmt: skip
def test_a_listing_answered_under_no_id_or_an_id_of_another_type_is_eproto(
    world: World, answer: str, shown: str
) -> None:
    """docs/tools.md *A misbehaving server*: a response to an id that was never asked —
    "another number, the right number as a string, ``null``" — is EPROTO, exit 1.  The
    listing (id 2) answered with no id, ``true`` (no number, though Python counts it one),
    ``2.0`` or ``"2"`` is refused naming the id as the server spelt it in JSON, and OUT is
    not made."""
    world.serve(tools=[ECHO], raw={"tools/list": answer})
    out = world.top / "out"
    message = refused_json(world.project(out, "--json"), "EPROTO", 1)
    assert message == (
        f"server 'w' broke the protocol: it answered id {shown}, but the only request in "
        "flight was tools/list, id 2"
    )
    assert not out.exists()


def test_a_server_silent_at_the_handshake_is_cut_off_at_the_timeout_with_its_stderr(
    world: World,
) -> None:
    """docs/tools.md *Exit statuses*: a server that "fell silent past ``--timeout``" is exit
    1, "named with its errno and the tail of the server's stderr".  One that never answers
    ``initialize`` is ETIMEDOUT after ``--timeout 1``, within seconds, saying what it did not
    answer and ending with its last words; OUT is not made and its process is stopped."""
    record = world.serve(silent=["initialize"], stderr="waiting for a token\n")
    out = world.top / "out"
    began = time.monotonic()
    run = world.project(out, "--timeout", "1", "--json")
    took = time.monotonic() - began
    message = refused_json(run, "ETIMEDOUT", 1)
    assert message == (
        "server 'w' did not answer initialize within 1 s; its stderr ends: waiting for a token"
    )
    assert took < 12, took
    assert started(record) == ["start", "initialize"]
    assert not out.exists()
    assert world.nothing_left_running(), processes_of(world.top)


def test_the_stderr_tail_of_a_server_that_exited_is_bounded_and_undecodable_bytes_replaced(
    world: World,
) -> None:
    """docs/tools.md *Exit statuses*: a server that exited is "EIO with its status, ``exited
    (status N)``", with "the tail of the server's stderr".  A server that writes 300 kB on
    stderr, then a line holding the byte 0xff, and exits with status 3 before answering
    ``initialize``: EIO, exit 1; the message ends with its last words, the 0xff shown as the
    replacement character (never the raw byte, in text or JSON), and only a tail is kept —
    not 300 kB."""
    world.serve(exit={"initialize": 3}, noise=300_000, stderr="fatal: \udcff bad key\n")
    listed = world.listing("--json")
    message = refused_json(listed, "EIO", 1)
    assert message.startswith(
        "server 'w' exited (status 3) before answering initialize; its stderr ends: nnn"
    ), message[:200]
    assert message.endswith("fatal: \ufffd bad key"), message[-200:]
    assert len(message) < 4000, len(message)
    assert "\\xff" not in listed.err and "\udcff" not in listed.err


def test_a_server_that_exits_once_initialised_is_not_said_to_owe_an_answer_to_a_notification(
    world: World,
) -> None:
    """docs/tools.md *Exit statuses*: a server that exited is "EIO with its status, ``exited
    (status N)``", with the tail of its stderr.  A server that closes its input, answers
    ``initialize`` and exits with status 4 cannot be sent ``notifications/initialized``:
    EIO, exit 1, its status and last words — but a notification is never answered (JSON-RPC
    2.0: "The Server MUST NOT reply to a Notification"), so the message is not to say the
    server exited "before answering" it; it exited before it could be sent it."""
    world.serve(close_in=["initialize"], exit_after={"initialize": 4}, stderr="bye\n")
    out = world.top / "out"
    message = refused_json(world.project(out, "--json"), "EIO", 1)
    assert message.startswith("server 'w' exited (status 4) "), message
    assert message.endswith("; its stderr ends: bye"), message
    assert not out.exists()
    assert "before answering notifications/initialized" not in message, message


def test_a_server_that_stops_reading_while_sent_its_huge_cursor_is_cut_off_at_the_timeout(
    world: World,
) -> None:
    """docs/tools.md *A misbehaving server*: "each page waits at most ``--timeout``; a server
    that hands out new cursors forever is cut off there"; *Exit statuses*: a server that
    "fell silent past ``--timeout``" is exit 1.  A server hands out a cursor of 1 MB (well
    within a 16 MiB message) and then reads nothing more: the next ``tools/list`` carrying
    that cursor cannot all go into its pipe.  With ``--timeout 2`` ctxmcp must still end
    within seconds, ETIMEDOUT (or EIO), exit 1, OUT not made, no process left — not wait for
    ever."""
    page = '{"jsonrpc": "2.0", "id": @ID@, "result": {"tools": [], "nextCursor": "@CURSOR@"}}\n'
    world.serve(raw={"tools/list": page}, cursor=1_000_000, stall=["tools/list"])
    out = world.top / "out"
    proc = subprocess.Popen(world.project_argv(out, "--timeout", "2", "--json"),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=world.env, cwd=world.top)  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("ctxmcp was still waiting 15 s after it started, with --timeout 2")
    run = Run(["project"], proc.returncode, stdout.decode(), stderr.decode())
    errno_name = run.json()["error"] if run.out.strip() else ""
    assert errno_name in ("ETIMEDOUT", "EIO"), run
    refused_json(run, errno_name, 1)
    assert not out.exists()
    assert world.nothing_left_running(), processes_of(world.top)


# ============================================================ the projection of a listing


def test_tools_without_a_name_are_skipped_and_the_named_one_written(world: World) -> None:
    """docs/tools.md *Names (M-3)* and *Exit statuses*: an entry of the listing that cannot
    be a tool is "reported and skipped", the others written, and the exit status is then 1,
    ``--json`` listing each skip with its ``problem``.  Tools without a ``name``, with the
    name ``5`` or ``null`` are skipped as "a tool without a name", each shown as the server
    gave it (in JSON); ``echo`` is written whole; ``list`` shows all four and exits 0."""
    nameless = {"description": "no name", "inputSchema": {"type": "object"}}
    tools = [nameless, dict(nameless, name=5), dict(nameless, name=None), ECHO]
    world.serve(tools=tools)
    listed = world.listing()
    assert listed.rc == 0, listed
    assert listed.out.splitlines() == [
        "null\t(not projectable: the server gave a tool without a name)",
        "5\t(not projectable: the server gave a tool without a name)",
        "null\t(not projectable: the server gave a tool without a name)",
        "w.echo\tEcho.",
    ], listed
    out = world.top / "out"
    projected = world.project(out, "--json")
    assert projected.rc == 1 and "Traceback" not in projected.err, projected
    report = projected.json()
    assert report["written"] == [str(out / "w.echo.manifest.json")], report
    assert [(s["tool"], s["name"], s["problem"]) for s in report["skipped"]] == [
        ("null", None, "the server gave a tool without a name"),
        ("5", None, "the server gave a tool without a name"),
        ("null", None, "the server gave a tool without a name"),
    ], report
    assert os.listdir(out) == ["w.echo.manifest.json"]
    candidate = json.loads((out / "w.echo.manifest.json").read_text())
    assert candidate["mcp"] == {"transport": "stdio", "config": RUNTIME, "server": "w",
                                "tool": "echo"}  # fmt: skip


def test_a_runtime_config_that_is_not_utf8_is_refused_before_the_server_starts(
    world: World,
) -> None:
    """M-4 and docs/tools.md *Exit statuses*: "2 ... a ``--runtime-config`` that" cannot be
    the locator's path, said before the server starts.  A ``--runtime-config`` holding the
    byte 0xff can be no text of a UTF-8 manifest: EINVAL, exit 2, naming the option with the
    byte shown escaped; no server started, no OUT made."""
    record = world.serve(tools=[ECHO])
    out = world.top / "out"
    run = world.ctxmcp("project", "--config", world.config, "--runtime-config",
                       b"/mcp/\xff.json", "--server", "w", "--out", out, "--json")  # fmt: skip
    message = refused_json(run, "EINVAL", 2)
    assert message == (
        "--runtime-config '/mcp/\\udcff.json': it is not UTF-8 text, and a manifest is"
    )
    assert not out.exists() and started(record) == []


# ============================================================================== odd --out


def test_another_root_and_a_space_tool_directory_linked_outside_are_refused_by_identity(
    world: World,
) -> None:
    """docs/tools.md *Candidates (M-4)*: OUT "and each directory above it ... are compared by
    device and inode with ``/ctx``, the storage root and its tool directories, and any
    directory holding the six root entries counts as a storage root".  A copy of the root
    elsewhere (a second root, not the one ``CTX_STORAGE`` names) is refused below a directory
    still to be made in it, and so is the outside directory a space's ``tool/`` was made a
    link to: EINVAL, exit 2, each naming the root or the tool directory, before the server
    starts; nothing is made in either."""
    record = world.serve(tools=[ECHO])
    other = world.top / "other-root"
    copy_of_root(world.storage, other)
    out = other / "shared" / "new" / "out"
    message = refused(world.project(out), "EINVAL", 2)
    assert message.startswith(f"--out {out} is inside {other}: "), message
    assert not (other / "shared" / "new").exists()

    space = world.storage / "shared" / "proj"
    outside = world.top / "outside-tool"
    (space / "tool").rename(outside)
    (space / "tool").symlink_to(outside)
    before = snapshot(outside)
    message = refused(world.project(outside), "EINVAL", 2)
    assert message.startswith(f"--out {outside} is inside {space / 'tool'}: "), message
    assert "(nothing was written)" in message
    assert snapshot(outside) == before and started(record) == []


def test_an_out_on_a_read_only_mount_is_erofs_before_the_server_starts(world: World) -> None:
    """docs/tools.md *Exit statuses*: an ``--out`` that ctxmcp may not write into is exit 2,
    "each said before the server starts", named with its errno.  A directory bind-mounted
    read-only is no matter of modes: no chmod or chown lets anyone, root included, write
    there.  As every other command of the product says it (``cortexfs.storage``: "EROFS on
    a read-only filesystem"), the refusal is EROFS naming the filesystem and the remount,
    exit 2, before the server starts; nothing is made there."""
    record = world.serve(tools=[ECHO])
    sealed = world.top / "sealed"
    sealed.mkdir()
    world.mounts.bind_self(sealed, "ro")
    for out in (sealed, sealed / "out"):
        message = refused(world.project(out), "EROFS", 2)
        assert "read-only" in message and "remount" in message, message
        assert "nothing was written" in message, message
    assert os.listdir(sealed) == [] and started(record) == []


def test_an_immutable_out_is_eperm_naming_the_attribute_before_the_server_starts(
    world: World,
) -> None:
    """docs/tools.md *Exit statuses* (an ``--out`` ctxmcp may not write into: exit 2, before
    the server starts).  An OUT made immutable (``chattr +i``) refuses root too, whatever its
    mode: blaming the mode (EACCES, "a directory you may write") sends the operator to
    chmod, which changes nothing.  The product names such a refusal EPERM with the attribute
    and the ``chattr -i`` that lifts it (``cortexfs/file_attributes.py``); the server does
    not start and OUT stays empty."""
    record = world.serve(tools=[ECHO])
    out = world.top / "out"
    out.mkdir()
    with attribute(out, "i"):
        run = world.project(out, "--json")
        message = refused_json(run, "EPERM", 2)
    assert "immutable" in message and f"chattr -i {out}" in message, message
    assert os.listdir(out) == [] and started(record) == []


def test_an_append_only_out_is_refused_naming_it_and_leaves_no_temporary(world: World) -> None:
    """docs/tools.md *Candidates (M-4)*: candidates are written "all or none": "A failure
    while writing ... removes what was written ... and says that nothing was".  An OUT made
    append-only (``chattr +a``) takes new entries but lets none be moved or removed, so a
    candidate staged under a temporary name can neither take its name nor be taken back.
    The refusal must come before anything is staged: EPERM, naming OUT, the attribute and
    ``chattr -a``, no temporary left in OUT, never a bare temporary's name."""
    world.serve(tools=[ECHO])
    out = world.top / "out"
    out.mkdir()
    with attribute(out, "a"):
        run = world.project(out)
        left = hidden(out)
    assert run.rc != 0 and "Traceback" not in run.err, run
    message = refused(run, "EPERM", run.rc)
    assert ".tmp" not in message, message
    assert str(out) in message and "append-only" in message, message
    assert f"chattr -a {out}" in message, message
    assert left == [], left


def test_an_out_on_a_full_tmpfs_takes_back_the_directories_it_made(world: World) -> None:
    """docs/tools.md *Candidates (M-4)*: "A failure while writing (``ENOSPC``, ``EFBIG``, …)
    removes what was written, and the directories made for OUT, and says that nothing was".
    On a tmpfs filled to its last byte, a projection into ``a/b/c`` below it fails at the
    candidate: ENOSPC, exit 1, naming the candidate, saying that none is in OUT and to make
    room; ``a/b/c`` are all taken back and the disk holds what it held.  Room made, the same
    command writes the candidate."""
    record = world.serve(tools=[ECHO])
    disk = world.mounts.tmpfs("disk", "size=16k")
    fill = os.open(disk / "fill", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while os.write(fill, b"f" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fill)
    before = snapshot(disk)
    out = disk / "a" / "b" / "c"
    message = refused_json(world.project(out, "--json"), "ENOSPC", 1)
    assert message == (
        f"cannot write the candidate {out / 'w.echo.manifest.json'}: No space left on device; "
        f"nothing was written (none of the 1 candidates is in {out}); make room or give "
        "another --out, then project again"
    )
    assert snapshot(disk) == before
    assert started(record)[-1] == "tools/list"
    # The repair the message names: make room, then project again.
    (disk / "fill").unlink()
    again = world.project(out)
    assert again.rc == 0 and again.out.splitlines() == [str(out / "w.echo.manifest.json")], again
    assert os.listdir(out) == ["w.echo.manifest.json"]


def test_an_out_on_a_tmpfs_out_of_inodes_is_enospc_with_the_remedy_of_a_full_disk(
    world: World,
) -> None:
    """docs/tools.md *Candidates (M-4)* (a failure while writing "says that nothing was")
    and *Exit statuses*.  On a tmpfs whose inodes are all taken, OUT's first directory
    cannot be made: ENOSPC, exit 1, nothing made.  What ran short is room on that
    filesystem, and the remedy said for a full disk is to make room (as the ENOSPC of a
    candidate's write says): "give a directory you may write" is advice the directory
    already meets."""
    world.serve(tools=[ECHO])
    disk = world.mounts.tmpfs("inodes", "size=1m,nr_inodes=8")
    count = 0
    try:
        while True:
            (disk / f"f{count}").touch()
            count += 1
    except OSError:
        pass
    before = snapshot(disk)
    out = disk / "a" / "b"
    message = refused(world.project(out), "ENOSPC", 1)
    assert "nothing was written" in message, message
    assert snapshot(disk) == before
    assert "a directory you may write" not in message, message
    assert "room" in message or "free" in message, message


def test_replace_over_an_immutable_earlier_candidate_names_the_attribute(world: World) -> None:
    """docs/tools.md *Candidates (M-4)*: "with ``--replace``, a failure part-way names what
    was written and what was not".  The earlier ``w.b`` candidate is immutable: replacing
    it is refused by the kernel whatever the modes, so the message must say why — the
    attribute and the ``chattr -i`` that lifts it — beside what was written; the immutable
    file is left byte for byte and no temporary is left in OUT.  With the attribute lifted,
    projecting again with ``--replace`` makes the half-replaced OUT whole."""
    tools = [dict(ECHO, name="a"), dict(ECHO, name="b")]
    world.serve(tools=tools)
    out = world.top / "out"
    out.mkdir()
    kept = out / "w.b.manifest.json"
    kept.write_text('{"earlier": "b"}\n')
    with attribute(kept, "i"):
        run = world.project(out, "--replace")
        left = hidden(out)
        message = refused(run, "EPERM", 1)
    assert f"written: {out / 'w.a.manifest.json'}; not written: {kept}" in message, message
    assert kept.read_text() == '{"earlier": "b"}\n'
    assert left == [], left
    # Half there now (w.a new, w.b earlier): with the attribute lifted, the repair the message
    # names, projecting again with --replace, makes both whole.
    again = world.project(out, "--replace", "--json")
    assert again.rc == 0, again
    assert sorted(again.json()["replaced"]) == [str(out / "w.a.manifest.json"), str(kept)]
    assert sorted(os.listdir(out)) == ["w.a.manifest.json", "w.b.manifest.json"]
    assert json.loads(kept.read_text())["name"] == "w.b"
    assert "immutable" in message and f"chattr -i {kept}" in message, message


@pytest.mark.parametrize("planted", ["fifo", "dangling-link"])
def test_a_fifo_or_a_dangling_link_at_a_candidates_name_is_eexist_and_left_alone(
    world: World, planted: str
) -> None:
    """docs/tools.md *Earlier candidates*: "A candidate already in OUT is never overwritten
    silently: without ``--replace``, ``project`` refuses with ``EEXIST``, naming the files in
    the way, before anything is written".  A FIFO at ``w.echo.manifest.json`` is refused at
    once (never opened, so never waited on), and so is a link to nothing (never followed to
    make its target): EEXIST, exit 1, naming it and ``--replace``; OUT as it was.  The
    repair named, ``--replace``, then puts a regular candidate at that name, reported as
    replaced, and still makes nothing where the link pointed."""
    world.serve(tools=[ECHO, dict(ECHO, name="other")])
    out = world.top / "out"
    out.mkdir()
    name = out / "w.echo.manifest.json"
    target = world.top / "made-through-the-link"
    if planted == "fifo":
        os.mkfifo(name)
    else:
        name.symlink_to(target)
    before = snapshot(out)
    message = refused_json(world.project(out, "--json"), "EEXIST", 1)
    assert message.startswith(f"{name} already exists; give --replace"), message
    assert snapshot(out) == before
    assert not os.path.lexists(target)
    # The repair the message names: --replace puts a regular candidate in its place.
    replaced = world.project(out, "--replace", "--json")
    assert replaced.rc == 0, replaced
    assert replaced.json()["replaced"] == [str(name)], replaced
    assert name.is_file() and not name.is_symlink()
    assert json.loads(name.read_text())["name"] == "w.echo"
    assert not os.path.lexists(target) and hidden(out) == []


def test_a_server_that_swaps_out_for_a_link_into_the_root_while_it_lists_writes_nothing(
    world: World,
) -> None:
    """docs/tools.md *Candidates (M-4)*: "After the server ran, OUT is checked again the same
    way before any directory of it is made (the server runs as the caller and may replace
    OUT or a directory above it meanwhile: ``EINVAL``, exit 1, nothing written)".  OUT does
    not exist when ctxmcp starts; while the server lists, it makes OUT a link to the storage
    root's ``tool/`` directory.  EINVAL, exit 1, naming the root; ``tool/`` holds exactly
    what it held, and the link is left as the server made it."""
    out = world.top / "out"
    tool = world.storage / "tool"
    world.serve(tools=[ECHO], act={"tools/list": [["ln", "-s", str(tool), str(out)]]})
    before = snapshot(tool)
    message = refused_json(world.project(out, "--json"), "EINVAL", 1)
    assert message.startswith(f"--out {out} is inside {world.storage}: ctxmcp writes nothing "
                              "under /ctx or the storage root (M-1)"), message  # fmt: skip
    assert message.endswith("(nothing was written)"), message
    assert snapshot(tool) == before
    assert os.readlink(out) == str(tool)


def test_a_server_that_turns_the_directory_above_out_into_a_file_writes_nothing(
    world: World,
) -> None:
    """The same second check (docs/tools.md *Candidates (M-4)*): while the server lists, the
    existing directory above OUT is removed and a file written in its place.  ctxmcp refuses
    with ENOTDIR, exit 1, saying nothing was written; the file is left byte for byte and no
    directory or candidate appears."""
    parent = world.top / "parent"
    parent.mkdir()
    swap = f"rmdir {parent} && echo mine > {parent}"
    world.serve(tools=[ECHO], act={"tools/list": [["sh", "-c", swap]]})
    out = parent / "out"
    message = refused(world.project(out), "ENOTDIR", 1)
    assert message.startswith(f"--out {out} can never be a directory: {parent} is not one")
    assert "(nothing was written)" in message, message
    assert parent.read_text() == "mine\n"


def test_an_out_two_levels_below_a_file_names_that_file(world: World) -> None:
    """docs/tools.md *Exit statuses*: "2 ... an ``--out`` ... that lies below something that
    is not a directory (``ENOTDIR``: a file, ``/dev/null``, a FIFO)", said before the server
    starts.  The refusal is to name what is in the way — the file ``notes`` — so that the
    operator knows what to move (the product's own wording: "--out OUT can never be a
    directory: PLACE is not one"), not OUT, which does not exist, as a link that "cannot be
    followed"."""
    record = world.serve(tools=[ECHO])
    notes = world.top / "notes"
    notes.write_text("mine\n")
    out = notes / "a" / "out"
    message = refused(world.project(out), "ENOTDIR", 2)
    assert started(record) == [] and notes.read_text() == "mine\n"
    assert f"{notes} is not" in message, message
    assert "cannot be followed" not in message, message


# ================================================================================ signals


def _wait_for_listing(record: Path) -> None:
    assert wait_for(lambda: "tools/list" in started(record), 20), started(record)


def test_ctrl_c_while_the_server_lists_is_eintr_130_and_leaves_nothing(world: World) -> None:
    """docs/tools.md *Candidates (M-4)*: stopped by Ctrl-C it ends with ``EINTR``, exit 130.
    Interrupted while the server is slow to list: the error object on stdout with
    ``--json``, the ``ctxmcp: EINTR:`` line, no traceback, OUT not made, and the server and
    the child it was waiting on both gone."""
    record = world.serve(tools=[ECHO], act={"tools/list": [["sleep", "60"]]})
    out = world.top / "out"
    proc = subprocess.Popen(world.project_argv(out, "--json"), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=world.env,
                            cwd=world.top)  # fmt: skip
    try:
        _wait_for_listing(record)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    run = Run(["project"], proc.returncode, stdout.decode(), stderr.decode())
    message = refused_json(run, "EINTR", 130)
    assert message.startswith("interrupted (SIGINT)"), message
    assert not out.exists()
    assert world.nothing_left_running(), processes_of(world.top)


def _ignore_sighup() -> None:
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def test_under_nohup_a_sighup_leaves_the_projection_running_to_its_end(world: World) -> None:
    """docs/tools.md *Candidates (M-4)*: "SIGTERM or SIGHUP: it stops its server and ends by
    that signal" — a SIGHUP that reaches it.  ``nohup ctxmcp project …`` is how an operator
    keeps a projection going past a closed terminal: SIGHUP is ignored for it, and the
    product keeps an ignored SIGHUP ignored ("SIGHUP ignored by ``nohup`` is left as it is",
    ``cortexfs/interrupts.py``; ``ctx run`` does so).  Sent SIGHUP while the server lists,
    the projection goes on: exit 0, the candidate written, nothing left running."""
    record = world.serve(tools=[ECHO], act={"tools/list": [["sleep", "2"]]})
    out = world.top / "out"
    proc = subprocess.Popen(world.project_argv(out), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=world.env,
                            cwd=world.top, preexec_fn=_ignore_sighup)  # fmt: skip
    try:
        _wait_for_listing(record)
        proc.send_signal(signal.SIGHUP)
        stdout, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert world.nothing_left_running(), processes_of(world.top)
    assert proc.returncode == 0, (proc.returncode, stderr.decode())
    assert stdout.decode().splitlines() == [str(out / "w.echo.manifest.json")]
    assert os.listdir(out) == ["w.echo.manifest.json"]
