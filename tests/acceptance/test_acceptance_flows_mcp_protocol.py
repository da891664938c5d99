"""End-to-end flows at the MCP wire level (SPEC §10 with §4 and §6), as the author of an MCP
stdio server sees CortexFS: ``ctxmcp`` and the bridge of an installed MCP-backed tool are the
*clients* of that server (ctxmcp serves nothing itself).  A server written by hand on raw
pipes scripts the traffic a real server may send while a request is in flight — logging,
progress and ``list_changed`` notifications, a ``ping`` under the very id of the client's
pending request, ``sampling``/``roots`` requests, a response split across writes — and
records every message it receives; the official MCP SDK's client is run against the same
server as the reference, and an SDK-written server talks back to the bridge from inside a
tool.  Then the failure side: lines that are not JSON-RPC, concurrent calls mixed with a
denied, a schema-invalid, a failing and a timed-out one, the caller interrupted or killed
mid-call, and a server that closes its stdout and stays alive.

The single claims of §10 (versions, names, locators, broken results) are checked in
test_acceptance_mcp*.py and tests/mcp/; the adoption and queue flows in
test_acceptance_flows_mcp.py.  Black-box: the installed ``ctx`` and ``ctxmcp``, real
processes and uids."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    REPO,
    OnStorage,
    Run,
    alive,
    kill_processes_of,
    new_scratch_dir,
    processes_of,
    read_jsonl,
    scratch_top,
    wait_for,
)

SCRATCH = scratch_top(__file__)
VENV_BIN = REPO / ".venv" / "bin"
CTXMCP = VENV_BIN / "ctxmcp"
PYTHON = VENV_BIN / "python"
LABEL = "coder_t"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid"),
    pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed in the venv"),
]

# A stdio MCP server on raw pipes.  argv[1] is its script (JSON):
#   record      a file each message received is appended to, {"pid", "got"} (and "eof")
#   chatter     methods during which the server first sends its own traffic and waits for
#               the client's answers, which a tools/call result then reports
#   split       write each response in two pieces, 0.3 s apart
#   raw         {method: line}: answer that method with this text verbatim (@ID@: its id)
#   hang        tools/call ignores SIGINT/SIGTERM, starts a grandchild and never answers
#   close_out   after reading initialize, close stdout and stay alive
#   pidfile     where tools/call writes the server's pid
WIRE_SERVER = r"""
import json, os, signal, subprocess, sys, time

SCRIPT = json.loads(sys.argv[1])
TOP = os.path.dirname(os.path.abspath(__file__))
buffer = b""

def note(**fact):
    if SCRIPT.get("record"):
        with open(SCRIPT["record"], "a") as record:
            record.write(json.dumps({"pid": os.getpid(), **fact}) + "\n")

def send_raw(data):
    os.write(1, data)

def send(message):
    send_raw(json.dumps(message).encode() + b"\n")

def receive():
    global buffer
    while b"\n" not in buffer:
        chunk = os.read(0, 65536)
        if not chunk:
            note(eof=True)
            sys.exit(0)
        buffer += chunk
    line, _, buffer = buffer.partition(b"\n")
    message = json.loads(line)
    note(got=message)
    return message

def chatter(in_flight):
    send({"jsonrpc": "2.0", "method": "notifications/message",
          "params": {"level": "info", "data": "working"}})
    send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
    send({"jsonrpc": "2.0", "method": "notifications/progress",
          "params": {"progressToken": "t", "progress": 1, "total": 2}})
    # a request of the server's own under the id of the client's pending request
    send({"jsonrpc": "2.0", "id": in_flight, "method": "ping"})
    send({"jsonrpc": "2.0", "id": "s-1", "method": "sampling/createMessage",
          "params": {"messages": [], "maxTokens": 1}})
    send({"jsonrpc": "2.0", "id": "r-1", "method": "roots/list"})
    answers = {}
    while len(answers) < 3:
        message = receive()
        answers[json.dumps(message.get("id"))] = {
            key: value for key, value in message.items() if key in ("result", "error")}
    return answers

while True:
    message = receive()
    if "id" not in message:
        continue
    method, ident = message.get("method"), message["id"]
    if method == "initialize" and SCRIPT.get("close_out"):
        os.close(1)
        time.sleep(3600)
    answers = chatter(ident) if method in SCRIPT.get("chatter", []) else {}
    if method == "initialize":
        result = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {"listChanged": True}},
                  "serverInfo": {"name": "wire", "version": "1"}}
    elif method == "tools/list":
        schema = {"type": "object", "properties": {"text": {"type": "string"}},
                  "required": ["text"]}
        result = {"tools": [{"name": "echo", "description": "Echo text.", "inputSchema": schema}]}
    elif method == "tools/call":
        if SCRIPT.get("pidfile"):
            with open(SCRIPT["pidfile"] + ".part", "w") as pidfile:
                pidfile.write(str(os.getpid()))
            os.rename(SCRIPT["pidfile"] + ".part", SCRIPT["pidfile"])
        if SCRIPT.get("hang"):
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", TOP])
            time.sleep(3600)
        arguments = message["params"]["arguments"]
        result = {"content": [{"type": "text", "text": arguments.get("text", "")}],
                  "structuredContent": {"arguments": arguments, "answers": answers},
                  "isError": False}
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": method}})
        continue
    if method in SCRIPT.get("raw", {}):
        send_raw(SCRIPT["raw"][method].replace("@ID@", json.dumps(ident)).encode())
        continue
    data = json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}).encode() + b"\n"
    if SCRIPT.get("split"):
        send_raw(data[: len(data) // 2])
        time.sleep(0.3)
        send_raw(data[len(data) // 2 :])
    else:
        send_raw(data)
"""

# A server written with the MCP SDK whose tools talk back to their client while they work:
# a log message, progress, ``tools/list_changed``, a ``ping`` it awaits the answer to and a
# ``roots/list`` request the client does not offer.  Each start appends the id of the tool
# call that started it (``CTX_CALL``, from the call's environment) to argv[1].
SDK_SERVER = r"""
import os, sys
with open(sys.argv[1], "a") as starts:
    starts.write(f"{os.environ.get('CTX_CALL')}\n")

import asyncio, warnings
warnings.simplefilter("ignore")
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
server = MCPServer("sdk")

@server.tool(description="Echo text after talking back to the client.")
async def probe(text: str, ctx: Context) -> dict:
    await ctx.info(f"probing {text}")
    await ctx.report_progress(0.5, 1.0, "half way")
    await ctx.notify_tools_changed()
    await ctx.session.send_ping()
    try:
        await ctx.session.list_roots()
        roots = "answered"
    except Exception as exc:
        roots = f"{type(exc).__name__}: {exc}"
    return {"text": text, "ping": "answered", "roots": roots, "uid": os.getuid()}

@server.tool(description="Sleep for the seconds given.")
async def slow(seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "slept"

@server.tool(description="Always fails.")
def fail(why: str) -> str:
    raise ToolError(f"refused on purpose: {why}")

@server.tool(description="Never granted to the agent.")
def secret() -> str:
    return "the secret"

server.run("stdio")
"""

# The official SDK's client, as the reference an MCP server author tests with: initialise,
# list, call one tool; prints what it got as one JSON object.
SDK_CLIENT = r"""
import json, sys, anyio
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

async def main():
    entry = json.load(open(sys.argv[1]))["mcpServers"][sys.argv[2]]
    server = StdioServerParameters(command=entry["command"], args=entry.get("args", []))
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            listed = await session.list_tools()
            called = await session.call_tool(sys.argv[3], json.loads(sys.argv[4]))
            print(json.dumps({"version": init.protocol_version,
                              "tools": [tool.name for tool in listed.tools],
                              "result": called.model_dump(
                                  mode="json", by_alias=True, exclude_none=True)}))

anyio.run(main)
"""


# ---------------------------------------------------------------------------------- helpers


@dataclass
class Host(OnStorage):
    """A directory every uid may search: a bootstrapped storage root, ``mcp/`` (host-owned,
    mounted read-only at the same path by the agent) and ``trace/``, where servers running
    as the agent leave their records."""

    top: Path
    storage: Path
    mcp: Path
    trace: Path

    @property
    def config(self) -> Path:
        return self.mcp / "mcp.json"

    def configure(self, **servers: list[str]) -> None:
        """``mcp.json`` with each server NAME running PYTHON with the given arguments."""
        entries = {name: {"command": str(PYTHON), "args": args} for name, args in servers.items()}
        self.config.write_text(json.dumps({"mcpServers": entries}))
        self.config.chmod(0o644)

    def wire(self, name: str = "w", **script) -> None:
        self.configure(**{name: [str(self.mcp / "wire_server.py"), json.dumps(script)]})

    def ctxmcp(self, *args, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(CTXMCP), *map(str, args)], capture_output=True, text=True,
                              env=self.env, timeout=timeout)  # fmt: skip

    def adopt(self, server: str, tools: list[str], granted: list[str]) -> None:
        """Project SERVER, install each of its ``tools`` in the system tier with its own
        policy allowing the label, and make agent ``coder`` with ``granted`` of them."""
        out = Path(tempfile.mkdtemp(prefix="candidates-", dir=self.top))
        projected = self.ctxmcp(
            "project", "--config", self.config, "--runtime-config", self.config,
            "--server", server, "--out", out, "--replace",
        )  # fmt: skip
        assert projected.returncode == 0, projected
        for tool in tools:
            installed = self.ctx("object", "install", out / f"{tool}.manifest.json",
                                 "--tier", "system")  # fmt: skip
            assert installed.rc == 0, installed
            with (self.storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
                policy.write(f"allow {LABEL} tool:{tool} execute\n")
        req = {"name": "coder", "label": LABEL, "tools": granted,
               "mount": [[str(self.mcp), str(self.mcp), "ro"]]}  # fmt: skip
        made = self.ctx("agent", "create", "-", "--json", input=json.dumps(req))
        assert made.rc == 0, made
        self.uid = made.json()["identity"]["uid"]

    def native(self, tool: str, payload: dict, *opts: str) -> tuple[Run, dict]:
        ran = self.ctx("run", "--agent", "coder", "--native", *opts, tool,
                       input=json.dumps(payload))  # fmt: skip
        frames = [json.loads(line) for line in ran.lines() if line.strip()]
        assert frames and frames[-1]["type"] == "result", ran
        return ran, frames[-1]

    def start_native(self, tool: str, payload: dict) -> subprocess.Popen:
        argv = [str(VENV_BIN / "ctx"), "run", "--agent", "coder", "--native", tool]
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=self.env, text=True)  # fmt: skip
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(payload))
        proc.stdin.close()
        proc.stdin = None  # given whole: communicate() has nothing more to send
        return proc

    def events(self) -> list[dict]:
        path = (self.storage / "home" / str(self.uid) / "agent" / "coder" / "session" /
                "default" / "events.jsonl")  # fmt: skip
        return read_jsonl(path)


@pytest.fixture
def host(_template: Path) -> Iterator[Host]:
    top = new_scratch_dir(SCRATCH, "host-")
    try:
        storage = top / "storage"
        shutil.copytree(_template, storage, symlinks=True)
        mcp = top / "mcp"
        mcp.mkdir(mode=0o755)
        for name, text in (("wire_server.py", WIRE_SERVER), ("sdk_server.py", SDK_SERVER)):
            (mcp / name).write_text(text)
            (mcp / name).chmod(0o644)
        trace = top / "trace"
        trace.mkdir()
        trace.chmod(0o1777)
        yield Host(top, storage, mcp, trace)
    finally:
        kill_processes_of(top)
        shutil.rmtree(top, ignore_errors=True)


def by_call(events: list[dict]) -> dict[str, dict[str, dict]]:
    """``{call: {"tool_call": event, "tool_result": event}}`` of a session's events."""
    calls: dict[str, dict[str, dict]] = {}
    for event in events:
        if event["type"] in ("tool_call", "tool_result"):
            calls.setdefault(event["call"], {})[event["type"]] = event
    return calls


def sessions_of(record: list[dict]) -> dict[int, list[dict]]:
    """The messages a wire server received, per server process."""
    per_pid: dict[int, list[dict]] = {}
    for line in record:
        per_pid.setdefault(line["pid"], []).append(line)
    return per_pid


def received(lines: list[dict]) -> list[dict]:
    return [line["got"] for line in lines if "got" in line]


def probed(result: dict) -> dict:
    """What the SDK server's ``probe`` returned, from the text of a native result."""
    [item] = result["output"]["content"]
    return json.loads(item["text"])


def shape(answers: dict[str, dict]) -> dict[str, object]:
    """What a client answered to a wire server's chatter: the ping's reply in full, and
    whether each of the other two requests got an error (with an integer code)."""
    shaped: dict[str, object] = {}
    for key, reply in answers.items():
        if not key.startswith('"'):
            shaped["ping"] = reply
        else:
            refused = set(reply) == {"error"} and type(reply["error"].get("code")) is int
            shaped[json.loads(key)] = "error" if refused else reply
    return shaped


INITIALIZE_PARAMS_KEYS = {"protocolVersion", "capabilities", "clientInfo"}


def assert_client_handshake(messages: list[dict], method: str) -> None:
    """The client's side of one session: initialize (M-2, announcing 2025-11-25 and no
    capability it would then have to serve), initialized, then the one request ``method``
    under an integer id."""
    init, initialized, asked = messages[:3]
    assert init["method"] == "initialize" and set(init["params"]) == INITIALIZE_PARAMS_KEYS
    assert init["params"]["protocolVersion"] == "2025-11-25", init
    assert init["params"]["capabilities"] == {}, init  # no sampling, no roots offered
    assert init["params"]["clientInfo"]["name"] == "ctxmcp", init
    assert initialized == {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert asked["method"] == method and type(asked["id"]) is int, asked
    assert asked["id"] != init["id"], (init, asked)


# ======================================================= the server talks while it works


def test_server_traffic_mid_request_is_answered_as_the_sdk_client_answers_it(host: Host) -> None:
    """M-1, M-2, M-4, T-7, S-2: a server that, while ``tools/list`` and ``tools/call`` are in
    flight, sends notifications, a ``ping`` under the pending request's own id and requests
    for sampling and roots, and splits its response across writes, is served by ``ctxmcp
    list`` and by the installed bridge exactly as the SDK's client serves it: the ping
    answered ``{}`` under its id, the other requests refused with an error, notifications
    dropped, the response reassembled; each session ends by closing the server's stdin, and
    the call leaves its ``tool_call``/``tool_result`` pair in the session and the log."""
    record = host.trace / "wire.jsonl"
    host.wire(chatter=["tools/list", "tools/call"], split=True, record=str(record))

    # The reference: the official SDK client completes a call against this server.
    (host.top / "sdk_client.py").write_text(SDK_CLIENT)
    reference = subprocess.run([str(PYTHON), str(host.top / "sdk_client.py"), str(host.config),
                                "w", "echo", '{"text": "ref"}'], capture_output=True,
                               text=True, timeout=60)  # fmt: skip
    assert reference.returncode == 0, reference.stderr[-2000:]
    sdk = json.loads(reference.stdout)
    assert sdk["tools"] == ["echo"] and sdk["result"]["isError"] is False, sdk
    sdk_answers = sdk["result"]["structuredContent"]["answers"]
    record.unlink()

    listed = host.ctxmcp("list", "--config", host.config, "--server", "w", "--json")
    assert listed.returncode == 0, listed
    report = json.loads(listed.stdout)
    assert report["protocolVersion"] == "2025-11-25" and report["serverInfo"]["name"] == "wire"
    assert [(t["name"], t["problem"]) for t in report["tools"]] == [("w.echo", None)], report
    [(list_pid, list_lines)] = sessions_of(read_jsonl(record)).items()
    messages = received(list_lines)
    assert_client_handshake(messages, "tools/list")
    pending = messages[2]["id"]
    answers = {json.dumps(m["id"]): m for m in messages[3:]}
    assert answers[json.dumps(pending)] == {"jsonrpc": "2.0", "id": pending, "result": {}}
    for ident in ('"s-1"', '"r-1"'):
        assert "result" not in answers[ident] and type(answers[ident]["error"]["code"]) is int
    assert len(messages) == 6 and list_lines[-1] == {"pid": list_pid, "eof": True}, list_lines
    record.unlink()

    host.adopt("w", ["w.echo"], granted=["w.echo"])
    record.unlink(missing_ok=True)  # projection's own session
    ran, result = host.native("w.echo", {"text": "héllo"})
    assert ran.rc == 0 and result["status"] == "ok", ran
    output = result["output"]
    assert output["content"] == [{"type": "text", "text": "héllo"}] and not output["isError"]
    assert output["structuredContent"]["arguments"] == {"text": "héllo"}
    answers = output["structuredContent"]["answers"]
    [ping_id] = [key for key in answers if not key.startswith('"')]
    ours, theirs = shape(answers), shape(sdk_answers)
    assert ours == theirs == {"ping": {"result": {}}, "s-1": "error", "r-1": "error"}, (
        answers,
        sdk_answers,
    )  # the ping answered, sampling and roots refused, as the SDK client does
    [(call_pid, call_lines)] = sessions_of(read_jsonl(record)).items()
    messages = received(call_lines)
    assert_client_handshake(messages, "tools/call")
    assert messages[2]["params"] == {"name": "echo", "arguments": {"text": "héllo"}}
    assert int(ping_id) == messages[2]["id"]  # the server's ping reused the call's id
    assert call_lines[-1] == {"pid": call_pid, "eof": True}, call_lines  # stdin closed at end
    assert wait_for(lambda: not alive(call_pid), 5)

    calls = by_call(host.events())
    assert list(calls) == [result["call"]], calls
    pair = calls[result["call"]]
    assert pair["tool_call"]["input"] == {"text": "héllo"} and pair["tool_call"]["mode"] == "native"
    assert pair["tool_result"]["status"] == "ok" and pair["tool_result"]["object"] == "tool/w.echo"
    logged = read_jsonl(host.storage / "tool" / "w.echo.d" / "log")
    assert [(e["call"], e["status"]) for e in logged] == [(result["call"], "ok")], logged


# ========================================================= lines that are not JSON-RPC


@pytest.mark.parametrize(
    "line",
    [
        pytest.param('[{"jsonrpc": "2.0", "id": @ID@, "result": {"tools": []}}]\n', id="batch"),
        pytest.param('{"jsonrpc": "1.0", "id": @ID@, "result": {"tools": []}}\n', id="v1"),
        pytest.param('{"id": @ID@, "result": {"tools": []}}\n', id="no-jsonrpc"),
        pytest.param('\n{"jsonrpc": "2.0", "id": @ID@, "result": {"tools": []}}\n', id="blank"),
    ],
)
def test_a_line_that_is_not_json_rpc_ends_the_session_and_nothing_is_written(
    host: Host, line: str
) -> None:
    """M-1, M-4 (docs/tools.md, "A misbehaving server"): a ``tools/list`` answered with a
    JSON-RPC batch, a 1.0 message, a message without ``jsonrpc`` or an empty line is a broken
    protocol: ``ctxmcp project`` exits 1 naming EPROTO, writes no candidate (not even OUT) and
    leaves no server running; the same answer ended by CRLF is an ordinary line."""
    host.wire(raw={"tools/list": line})
    out = host.top / "out"
    projected = host.ctxmcp("project", "--config", host.config, "--runtime-config", host.config,
                            "--server", "w", "--out", out, "--timeout", "10")  # fmt: skip
    assert projected.returncode == 1, projected
    assert "EPROTO" in projected.stderr and "broke the protocol" in projected.stderr, projected
    assert not out.exists()
    assert wait_for(lambda: not processes_of(host.mcp), 5)

    host.wire(raw={"tools/list": '{"jsonrpc": "2.0", "id": @ID@, "result": {"tools": []}}\r\n'})
    crlf = host.ctxmcp("list", "--config", host.config, "--server", "w", "--json")
    assert crlf.returncode == 0 and json.loads(crlf.stdout)["tools"] == [], crlf


def test_a_call_answered_with_a_batch_fails_as_eproto_and_is_recorded(host: Host) -> None:
    """M-4, S-2, T-7: a ``tools/call`` answered with a JSON-RPC batch is the server's
    protocol error, never a success with the data dropped: the native call fails with EPROTO
    (exit 1), the session holds the pair with that errno and the log its line."""
    host.wire()
    host.adopt("w", ["w.echo"], granted=["w.echo"])
    batch = '[{"jsonrpc": "2.0", "id": @ID@, "result": {"content": [], "isError": false}}]\n'
    host.wire(raw={"tools/call": batch})
    ran, result = host.native("w.echo", {"text": "x"})
    assert ran.rc == 1 and result["status"] == "error", ran
    assert result["error"]["error"] == "EPROTO" and "JSON-RPC" in result["error"]["message"]
    pair = by_call(host.events())[result["call"]]
    assert pair["tool_result"]["status"] == "error" and pair["tool_result"]["errno"] == "EPROTO"
    logged = read_jsonl(host.storage / "tool" / "w.echo.d" / "log")
    assert [(e["call"], e["status"]) for e in logged] == [(result["call"], "error")]


def test_a_server_that_closes_its_stdout_and_lingers_is_cut_off_at_the_timeout(
    host: Host,
) -> None:
    """M-1 (docs/tools.md, exit statuses: a server that "exited, fell silent past
    --timeout"): a server that closes its stdout after ``initialize`` and stays alive ends
    ``ctxmcp list --timeout 1`` with exit 1 within a few seconds, its process killed."""
    host.wire(close_out=True)
    argv = [str(CTXMCP), "list", "--config", str(host.config), "--server", "w", "--timeout", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=host.env)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=4)
    except subprocess.TimeoutExpired:
        proc.terminate()  # ctxmcp unwinds on SIGTERM and takes its server with it
        proc.communicate(timeout=10)
        pytest.fail("ctxmcp list --timeout 1 was still waiting after 4 s")
    assert proc.returncode == 1 and err.startswith("ctxmcp: E"), (out, err)
    assert wait_for(lambda: not processes_of(host.mcp), 5)


# ============================================ many calls at once, and calls that go wrong


def test_concurrent_calls_of_an_sdk_server_that_talks_back_each_get_their_own_answer(
    host: Host,
) -> None:
    """M-4, P-6, T-3, T-7, S-2, S-5 with a server written with the official SDK, whose
    ``probe`` awaits a ``ping`` of its client and asks it for ``roots/list`` mid-call: calls
    made at the same time — probes in native and terminal mode with distinct inputs, one
    that times out, one failing remotely, one denied by the agent's policy and one with input
    its schema refuses — each get their own result: the probes their own text (the ping
    answered, roots refused as not offered, the server running as the agent's uid), the
    timeout ETIMEDOUT, the failure EREMOTEIO with the server's message, the denial EACCES
    (step 5) and the bad input EINVAL (stage schema), neither of the last two starting the
    server; the session holds one complete pair per call, and no server process is left."""
    starts = host.trace / "starts"
    host.configure(sdk=[str(host.mcp / "sdk_server.py"), str(starts)])
    tools = ["sdk.probe", "sdk.slow", "sdk.fail", "sdk.secret"]
    host.adopt("sdk", tools, granted=["sdk.probe", "sdk.slow", "sdk.fail"])
    starts.unlink(missing_ok=True)

    cases = {
        "one": ("sdk.probe", {"text": "one"}, ()),
        "two": ("sdk.probe", {"text": "two"}, ()),
        "slow": ("sdk.slow", {"seconds": 60}, ("--timeout", "2")),
        "fail": ("sdk.fail", {"why": "because"}, ()),
        "denied": ("sdk.secret", {}, ()),
        "bad": ("sdk.probe", {"text": 5}, ()),
    }
    results: dict[str, tuple[Run, dict]] = {}
    terminal: list[Run] = []

    def call(key: str) -> None:
        if key == "terminal":
            terminal.append(host.ctx("run", "--agent", "coder", "sdk.probe", '{"text": "tty"}'))
            return
        tool, payload, opts = cases[key]
        results[key] = host.native(tool, payload, *opts)

    threads = [threading.Thread(target=call, args=(key,)) for key in [*cases, "terminal"]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert set(results) == set(cases) and len(terminal) == 1, results

    for key in ("one", "two"):
        ran, result = results[key]
        assert ran.rc == 0 and result["status"] == "ok", ran
        answer = probed(result)
        assert (answer["text"], answer["ping"], answer["uid"]) == (key, "answered", host.uid)
        assert answer["roots"].startswith("MCPError") and "not offered by ctxmcp" in answer["roots"]
    assert host.uid != 0
    assert terminal[0].rc == 0 and json.loads(terminal[0].out)["text"] == "tty", terminal
    expected = {
        "slow": ("ETIMEDOUT", "run"),
        "fail": ("EREMOTEIO", "exit"),
        "denied": ("EACCES", "authorize"),
        "bad": ("EINVAL", "schema"),
    }
    for key, (code, stage) in expected.items():
        ran, result = results[key]
        assert ran.rc != 0 and result["status"] == "error", ran
        assert (result["error"]["error"], result["error"]["stage"]) == (code, stage), result
    assert results["denied"][1]["error"]["step"] == 5
    assert "refused on purpose: because" in results["fail"][1]["error"]["message"]

    started = starts.read_text().split()
    assert len(started) == len(set(started)), started  # one server per call
    ids = {key: result["call"] for key, (_, result) in results.items()}
    assert {ids["one"], ids["two"], ids["fail"]} <= set(started), (ids, started)
    assert ids["denied"] not in started and ids["bad"] not in started, (ids, started)
    assert wait_for(lambda: not processes_of(host.mcp), 10), processes_of(host.mcp)

    calls = by_call(host.events())
    native_calls = {result["call"]: key for key, (_, result) in results.items()}
    assert set(native_calls) < set(calls) and len(calls) == len(cases) + 1, calls
    for call_id, pair in calls.items():
        assert set(pair) == {"tool_call", "tool_result"}, pair
        if call_id in native_calls:
            key = native_calls[call_id]
            assert pair["tool_call"]["input"] == cases[key][1], (key, pair)
            assert pair["tool_result"]["status"] == results[key][1]["status"], (key, pair)
        else:
            assert pair["tool_call"]["mode"] == "terminal", pair
            assert pair["tool_result"]["status"] == "ok", pair
            assert call_id in started, (call_id, started)


# ==================================================== the caller goes away mid-call


def test_an_interrupted_or_killed_caller_leaves_no_server_and_the_next_call_works(
    host: Host,
) -> None:
    """S-2, T-7, I-4 with §10 (docs/sessions.md, docs/tools.md "Process group and bounds"):
    while a remote tool hangs — its server ignoring SIGINT and SIGTERM, with a child of its
    own — a ``ctx run`` interrupted by SIGINT exits 130 with an EINTR result at stage
    ``run``, recorded as the call's ``tool_result``; one killed by SIGKILL closes the
    server's stdin by dying; in both cases neither the server nor its child survives, and a
    next call of the tool succeeds."""
    pidfile = host.trace / "server.pid"
    host.wire()
    host.adopt("w", ["w.echo"], granted=["w.echo"])
    host.wire(hang=True, pidfile=str(pidfile))

    for stop in (signal.SIGINT, signal.SIGKILL):
        pidfile.unlink(missing_ok=True)
        caller = host.start_native("w.echo", {"text": stop.name})
        try:
            assert wait_for(lambda: pidfile.exists(), 30), caller.stderr
            server = int(pidfile.read_text())
            assert wait_for(lambda: len(processes_of(host.top)) >= 2, 10)  # server + child
            caller.send_signal(stop)
            out, err = caller.communicate(timeout=30)
        finally:
            if caller.poll() is None:
                caller.kill()
                caller.communicate()
        assert caller.returncode == (130 if stop == signal.SIGINT else -signal.SIGKILL), err
        assert wait_for(lambda: not processes_of(host.top), 10), processes_of(host.top)
        assert not alive(server)
        if stop == signal.SIGINT:
            result = json.loads(out.splitlines()[-1])
            assert result["type"] == "result" and result["status"] == "error", out
            assert (result["error"]["error"], result["error"]["stage"]) == ("EINTR", "run")
            pair = by_call(host.events())[result["call"]]
            assert pair["tool_result"]["errno"] == "EINTR", pair

    host.wire()
    ran, result = host.native("w.echo", {"text": "again"})
    assert ran.rc == 0 and result["output"]["content"][0]["text"] == "again", ran
    assert not processes_of(host.top)


def test_a_caller_stopped_by_sigterm_still_records_the_calls_result(host: Host) -> None:
    """S-2, S-5 (docs/sessions.md: "A recorded ``tool_call`` always gets its
    ``tool_result`` … only a session that cannot be written at all keeps its ``tool_call``
    without the ``tool_result``"): ``ctx run`` stopped with SIGTERM — what ``timeout(1)``
    and service managers send — while an MCP-backed tool hangs leaves the call's
    ``tool_result`` in the session, and no server process."""
    pidfile = host.trace / "server.pid"
    host.wire()
    host.adopt("w", ["w.echo"], granted=["w.echo"])
    host.wire(hang=True, pidfile=str(pidfile))
    caller = host.start_native("w.echo", {"text": "term"})
    try:
        assert wait_for(lambda: pidfile.exists(), 30)
        caller.send_signal(signal.SIGTERM)
        caller.communicate(timeout=30)
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.communicate()
    assert wait_for(lambda: not processes_of(host.top), 10)
    calls = by_call(host.events())
    assert len(calls) == 1, calls
    [pair] = calls.values()
    assert "tool_result" in pair and pair["tool_result"]["status"] == "error", pair
