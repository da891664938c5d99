"""Flows of MCP-backed tools whose remote tools answer with unusual results (SPEC §10 M-1..M-4,
with T-3, T-7, S-2, S-4, S-5, W-1): image and audio content, embedded resources (text and
blob) and resource links, ``structuredContent`` with and without an ``outputSchema``,
``isError`` results (with text, with no content, with only an image), an empty ``content``,
thousands of content items, a text of more than 1 MiB, non-ASCII text and control
characters, progress and log notifications and a ``ping`` of the server's own before the
result, a result sent under an id that was never asked, an ``isError`` that is not a boolean
and a text that is not a string.

A server written by hand on raw pipes (one remote tool ``act``, whose ``how`` argument picks
the answer) and one written with the MCP SDK (an image, an audio clip and a typed result, for
which the SDK declares an ``outputSchema``) are projected with ``ctxmcp project``, installed
with ``ctx object install`` and called as an agent with ``ctx run`` in terminal and native
mode and by ``ctx queue work``.  Each call is checked against docs/tools.md (*MCP servers as
tool sources*, step 5 of the bridge; *Running a tool*; *The result*) and docs/sessions.md
(events, S-4 summaries): what the caller gets, the exit status, the frames, the session's
``tool_call``/``tool_result`` pair and the tool's log line.  Nothing may crash, hang or pass
off a broken result as a success.  Black-box: the installed ``ctx`` and ``ctxmcp``, real
processes and the agent's own uid."""

from __future__ import annotations

import base64
import errno
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    REPO,
    OnStorage,
    QueueCLI,
    Run,
    kill_processes_of,
    new_scratch_dir,
    read_jsonl,
    request,
    scratch_top,
)
from tests.support.mcp_wire import WIRE
from tests.support.storage import copy_of_root

SCRATCH = scratch_top(__file__)
VENV_BIN = REPO / ".venv" / "bin"
CTXMCP = VENV_BIN / "ctxmcp"
PYTHON = VENV_BIN / "python"
LABEL = "coder_t"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid"),
    pytest.mark.skipif(not CTXMCP.exists(), reason="ctxmcp is not installed in the venv"),
]

# A 1x1 PNG and a few bytes of a WAV header: what an image or audio item carries, base64.
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5E"
    "rkJggg=="
)
WAV = base64.b64encode(b"RIFF$\x00\x00\x00WAVEfmt \x10\x00\x00\x00\x01\x00\x01\x00").decode()
# Non-ASCII text with terminal control sequences, a bell, a carriage return, a NUL, a
# right-to-left override and a byte order mark.
WEIRD = (
    "h\u00e9llo w\u00f6rld \u2713 \u65e5\u672c\u8a9e \U0001f642 "
    "\x1b[31mred\x1b[0m\x07\r\n\ttab\x00nul \u202eRTL\u202c \ufeffend"
)
# What a hostile server would put in a message to clear or retitle the caller's terminal.
ESCAPES = "\x1b[2J\x1b]0;pwned\x07gone"
BIG_LINES = 60_000  # "line 000000 …" lines of 26 bytes: 1.5 MiB of text
MANY_ITEMS = 3000
DEEP = 200  # levels of a structuredContent: within the 512 a message may nest (docs/tools.md)

MEDIA = [
    {"type": "text", "text": "caption \u2713"},
    {"type": "image", "data": PNG, "mimeType": "image/png",
     "annotations": {"audience": ["user"], "priority": 0.5}},
    {"type": "audio", "data": WAV, "mimeType": "audio/wav"},
    {"type": "resource", "resource": {"uri": "file:///notes.txt", "mimeType": "text/plain",
                                      "text": "embedded text"}},
    {"type": "resource", "resource": {"uri": "file:///blob.bin",
                                      "mimeType": "application/octet-stream", "blob": "AAEC"}},
    {"type": "resource_link", "uri": "file:///data/big.csv", "name": "big.csv",
     "mimeType": "text/csv", "_meta": {"size": 123}},
]  # fmt: skip

# The raw server: one remote tool ``act``; ``how`` picks the answer (see ANSWERS below, and
# the special cases in the loop).  Every tools/call it gets is appended to argv[1].
RAW_SERVER = (
    WIRE
    + r"""
RECORD = sys.argv[1]
ANSWERS = json.loads(open(sys.argv[2]).read())

def big_text():
    return "".join("line %06d of the answer\n" % n for n in range(%BIG_LINES%))

while True:
    message = receive()
    if "id" not in message:
        continue
    method, ident = message.get("method"), message["id"]
    if method == "initialize":
        result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                  "serverInfo": {"name": "raw", "version": "1"}}
    elif method == "tools/list":
        schema = {"type": "object", "properties": {"how": {"type": "string"}},
                  "required": ["how"]}
        out = {"type": "object", "properties": {"celsius": {"type": "number"}},
               "required": ["celsius"], "additionalProperties": False}
        result = {"tools": [
            {"name": "act", "description": "Answer as asked.", "inputSchema": schema},
            {"name": "weather", "description": "Typed answer.", "inputSchema": schema,
             "outputSchema": out},
        ]}
    elif method == "tools/call":
        with open(RECORD, "a") as record:
            record.write(json.dumps(message["params"]) + "\n")
        how = message["params"]["arguments"].get("how", "")
        if how == "chatty":
            token = (message["params"].get("_meta") or {}).get("progressToken", "t")
            send({"jsonrpc": "2.0", "method": "notifications/progress",
                  "params": {"progressToken": token, "progress": 1, "total": 3,
                             "message": "starting \u2713"}})
            send({"jsonrpc": "2.0", "method": "notifications/message",
                  "params": {"level": "warning", "logger": "raw", "data": {"step": 1}}})
            send({"jsonrpc": "2.0", "id": "srv-ping", "method": "ping"})
            answer = receive()
            send({"jsonrpc": "2.0", "method": "notifications/progress",
                  "params": {"progressToken": token, "progress": 3, "total": 3}})
            result = {"content": [{"type": "text",
                                   "text": "pong " + json.dumps(answer.get("result"))}],
                      "isError": False}
        elif how == "big":
            result = {"content": [{"type": "text", "text": big_text()}], "isError": False}
        elif how == "many":
            result = {"content": [{"type": "text", "text": "item %d" % n}
                                  for n in range(%MANY%)], "isError": False}
        elif how == "wrong-id":
            send({"jsonrpc": "2.0", "id": 4242, "result": {
                "content": [{"type": "text", "text": "for somebody else"}], "isError": False}})
            continue
        elif how == "null-id":
            send({"jsonrpc": "2.0", "id": None,
                  "error": {"code": -32700, "message": "Parse error"}})
            continue
        elif how == "rpc-error":
            send({"jsonrpc": "2.0", "id": ident,
                  "error": {"code": -32602, "message": "no such city \u2713"}})
            continue
        elif how == "rpc-error-bare":
            send({"jsonrpc": "2.0", "id": ident, "error": "boom"})
            continue
        elif how == "flood":
            for n in range(20000):
                send({"jsonrpc": "2.0", "method": "notifications/message",
                      "params": {"level": "debug", "data": "step %d" % n}})
            result = {"content": [{"type": "text", "text": "after the flood"}],
                      "isError": False}
        elif how == "deep":
            value = {"leaf": True}
            for _ in range(%DEEP%):
                value = {"d": value}
            result = {"content": [], "structuredContent": value, "isError": False}
        elif how == "string-id":
            send({"jsonrpc": "2.0", "id": str(ident), "result": {
                "content": [{"type": "text", "text": "as a string"}], "isError": False}})
            continue
        else:
            result = ANSWERS[how]
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": method}})
        continue
    send({"jsonrpc": "2.0", "id": ident, "result": result})
""".replace("%BIG_LINES%", str(BIG_LINES))
    .replace("%MANY%", str(MANY_ITEMS))
    .replace("%DEEP%", str(DEEP))
)

ANSWERS = {
    "media": {"content": MEDIA, "isError": False},
    "empty": {"content": [], "isError": False},
    "no-flag": {"content": [{"type": "text", "text": "no isError at all"}]},
    "weird": {"content": [{"type": "text", "text": WEIRD}], "isError": False},
    "two": {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b\n"}],
            "isError": False},
    "loose": {"content": [{"type": "text", "text": "{\"n\": 1}"}],
              "structuredContent": {"n": 1, "nested": {"list": [1, "\u2713", None]}},
              "isError": False},
    "fail": {"content": [{"type": "text", "text": "quota exceeded for r\u00e9gion \u2713"}],
             "isError": True},
    "fail-empty": {"content": [], "isError": True},
    "fail-image": {"content": [{"type": "image", "data": PNG, "mimeType": "image/png"}],
                   "isError": True},
    "fail-structured": {"content": [{"type": "text", "text": "bad city"}],
                        "structuredContent": {"error": "bad city"}, "isError": True},
    "flag-string": {"content": [{"type": "text", "text": "x"}], "isError": "true"},
    "flag-null": {"content": [{"type": "text", "text": "x"}], "isError": None},
    "no-content": {"structuredContent": {"n": 1}, "isError": False},
    "item-string": {"content": ["just a string"], "isError": False},
    "surrogate": {"content": [{"type": "text", "text": "\ud800"}], "isError": False},
    "null-text": {"content": [{"type": "text", "text": None}], "isError": False},
    "number-text": {"content": [{"type": "text", "text": 5}], "isError": False},
    "object-text": {"content": [{"type": "text", "text": {"a": 1}}], "isError": False},
    "fail-escapes": {"content": [{"type": "text", "text": ESCAPES}], "isError": True},
    "typed-ok": {"content": [{"type": "text", "text": "{\"celsius\": 21.5}"}],
                 "structuredContent": {"celsius": 21.5}, "isError": False},
    "typed-bad": {"content": [{"type": "text", "text": "{\"kelvin\": \"warm\"}"}],
                  "structuredContent": {"kelvin": "warm"}, "isError": False},
}  # fmt: skip

# A server written with the MCP SDK: an image, an audio clip, and a typed result (the SDK
# declares its outputSchema and fills structuredContent).
SDK_SERVER = r"""
import base64, sys, warnings
warnings.simplefilter("ignore")
from typing import TypedDict
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.utilities.types import Audio, Image

server = MCPServer("sdk")
PNG = base64.b64decode(sys.argv[1])

class Reading(TypedDict):
    celsius: float
    city: str

@server.tool(description="A picture.")
def picture(label: str) -> Image:
    return Image(data=PNG, format="png")

@server.tool(description="A sound.")
def sound(label: str) -> Audio:
    return Audio(data=b"RIFF0000WAVE", format="wav")

@server.tool(description="A typed reading.")
def reading(city: str) -> Reading:
    return {"celsius": 21.5, "city": city}

server.run("stdio")
"""


# ---------------------------------------------------------------------------------- helpers


@dataclass
class Host(OnStorage):
    """A directory every uid may search: a bootstrapped storage root with project ``proj``'s
    queue, ``mcp/`` (the host's configuration and servers, mounted read-only at the same path
    by agent ``coder``) and ``trace/``, where the raw server records the calls it gets."""

    top: Path
    storage: Path
    mcp: Path
    trace: Path
    uid: int = 0
    tools: list[str] = field(default_factory=list)

    @property
    def config(self) -> Path:
        return self.mcp / "mcp.json"

    def ctxmcp(self, *args) -> subprocess.CompletedProcess:
        return subprocess.run([str(CTXMCP), *map(str, args)], capture_output=True,
                              env=self.env, timeout=120)  # fmt: skip

    def terminal(self, tool: str, payload: dict, session: str) -> subprocess.CompletedProcess:
        """``ctx run --agent coder TOOL JSON`` in terminal mode, its output as bytes."""
        argv = [str(VENV_BIN / "ctx"), "run", "--agent", "coder", "--session", session,
                tool, json.dumps(payload)]  # fmt: skip
        return subprocess.run(argv, capture_output=True, env=self.env, timeout=120,
                              stdin=subprocess.DEVNULL)  # fmt: skip

    def native(self, tool: str, payload: dict, session: str) -> tuple[Run, list[dict]]:
        ran = self.ctx("run", "--agent", "coder", "--native", "--session", session, tool,
                       input=json.dumps(payload), timeout=120)  # fmt: skip
        frames = [json.loads(line) for line in ran.lines() if line.strip()]
        assert frames and frames[-1]["type"] == "result", ran
        assert [f["type"] for f in frames if f["type"] != "stderr"] == ["call", "result"], ran
        assert frames[0]["call"] == frames[-1]["call"], frames
        return ran, frames

    def events(self, session: str) -> list[dict]:
        return read_jsonl(self.storage / "home" / str(self.uid) / "agent" / "coder" / "session"
                          / session / "events.jsonl")  # fmt: skip

    def log(self, tool: str) -> list[dict]:
        return read_jsonl(self.storage / "tool" / f"{tool}.d" / "log")

    def calls_received(self) -> list[dict]:
        return read_jsonl(self.trace / "calls.jsonl")


def pair(host: Host, session: str, call: str) -> tuple[dict, dict]:
    """The ``tool_call`` and ``tool_result`` events of ``call`` in ``session``: exactly one
    of each, in that order, each line one strict JSON object of at most 64 KiB (S-5)."""
    path = (host.storage / "home" / str(host.uid) / "agent" / "coder" / "session" / session
            / "events.jsonl")  # fmt: skip
    raw = path.read_bytes()
    for line in raw.splitlines():
        assert len(line) <= 64 * 1024, len(line)
        json.loads(line)
    mine = [e for e in host.events(session) if e.get("call") == call]
    assert [e["type"] for e in mine] == ["tool_call", "tool_result"], mine
    return mine[0], mine[1]


def logged(host: Host, tool: str, call: str) -> dict:
    """The one line of ``tool``'s log about ``call``."""
    mine = [e for e in host.log(tool) if e.get("call") == call]
    assert len(mine) == 1, mine
    return mine[0]


@pytest.fixture(scope="module")
def host(_template: Path) -> Iterator[Host]:
    top = new_scratch_dir(SCRATCH, "host-")
    try:
        storage = top / "storage"
        copy_of_root(_template, storage)
        mcp = top / "mcp"
        mcp.mkdir(mode=0o755)
        for name, text in (
            ("raw_server.py", RAW_SERVER),
            ("sdk_server.py", SDK_SERVER),
            ("answers.json", json.dumps(ANSWERS)),
        ):
            (mcp / name).write_text(text)
            (mcp / name).chmod(0o644)
        trace = top / "trace"
        trace.mkdir()
        trace.chmod(0o1777)
        made = Host(top, storage, mcp, trace)
        servers = {
            "raw": {"command": str(PYTHON), "args": [str(mcp / "raw_server.py"),
                                                     str(trace / "calls.jsonl"),
                                                     str(mcp / "answers.json")]},
            "sdk": {"command": str(PYTHON), "args": [str(mcp / "sdk_server.py"), PNG]},
        }  # fmt: skip
        made.config.write_text(json.dumps({"mcpServers": servers}))
        made.config.chmod(0o644)
        for server in servers:
            out = Path(tempfile.mkdtemp(prefix=f"candidates-{server}-", dir=top))
            projected = made.ctxmcp("project", "--config", made.config, "--runtime-config",
                                    made.config, "--server", server, "--out", out)  # fmt: skip
            assert projected.returncode == 0, projected
            for manifest in sorted(out.iterdir()):
                installed = made.ctx("object", "install", manifest, "--tier", "system")
                assert installed.rc == 0, installed
                tool = manifest.name.removesuffix(".manifest.json")
                made.allow_tool(LABEL, tool)
                made.tools.append(tool)
        req = {"name": "coder", "label": LABEL, "tools": made.tools,
               "mount": [[str(mcp), str(mcp), "ro"]]}  # fmt: skip
        made.uid = made.create_agent(req)["identity"]["uid"]
        yield made
    finally:
        kill_processes_of(top)
        shutil.rmtree(top, ignore_errors=True)


def error_of(frame: dict) -> dict:
    assert frame["status"] == "error" and isinstance(frame["error"], dict), frame
    return frame["error"]


# ============================================================ what projection keeps


def test_projection_of_both_servers_writes_every_tool_and_no_output_schema(host: Host) -> None:
    """M-1, M-3, M-4, C-1: both servers' tools are projected and installed under
    ``<server>.<tool>``; a remote ``outputSchema`` becomes no part of the tool's ``schema``
    (the input schema), which stays the remote ``inputSchema``."""
    assert sorted(host.tools) == [
        "raw.act",
        "raw.weather",
        "sdk.picture",
        "sdk.reading",
        "sdk.sound",
    ], host.tools
    schema = json.loads((host.storage / "tool" / "raw.weather.d" / "schema").read_text())
    assert schema["required"] == ["how"] and "celsius" not in json.dumps(schema), schema
    controls = set(os.listdir(host.storage / "tool" / "raw.weather.d"))
    assert "mcp" in controls and not any("output" in name for name in controls), controls


# ============================================================ media and resources


def test_media_and_resources_reach_a_native_caller_whole(host: Host) -> None:
    """M-4 step 5, T-3, T-7, S-2: image, audio, embedded resources and a resource link come
    back natively exactly as the server sent them (annotations and ``_meta`` kept), with
    ``isError`` false; the call is one ``tool_call``/``tool_result`` pair in the session and
    one line of the tool's log, all ``ok``; the server got the arguments as given."""
    ran, frames = host.native("raw.act", {"how": "media"}, "media-native")
    result = frames[-1]
    assert ran.rc == 0 and result["status"] == "ok", ran
    assert result["output"] == {"content": MEDIA, "isError": False}, result["output"]
    assert result["exit_status"] == 0 and result["error"] is None
    call, done = pair(host, "media-native", result["call"])
    assert call["mode"] == "native" and call["input"] == {"how": "media"}, call
    assert done["status"] == "ok" and done["exit_status"] == 0, done
    assert done["object"] == "tool/raw.act"
    line = logged(host, "raw.act", result["call"])
    assert line["status"] == "ok", line
    received = [c for c in host.calls_received() if c["arguments"] == {"how": "media"}]
    assert received and received[-1]["name"] == "act", received


def test_media_in_terminal_mode_prints_the_text_items_only(host: Host) -> None:
    """M-4 step 5, T-3: in terminal mode the answer is the text of its content — the caption —
    and the binary items are not dumped on the terminal; exit 0; the call is recorded
    ``terminal`` with its argv."""
    ran = host.terminal("raw.act", {"how": "media"}, "media-terminal")
    assert ran.returncode == 0, ran
    assert ran.stdout.decode() == "caption \u2713\n", ran.stdout
    assert PNG.encode() not in ran.stdout and WAV.encode() not in ran.stdout
    [call] = [e for e in host.events("media-terminal") if e["type"] == "tool_call"]
    assert call["mode"] == "terminal" and call["argv"] == [json.dumps({"how": "media"})], call
    _, done = pair(host, "media-terminal", call["call"])
    assert done["status"] == "ok" and done["exit_status"] == 0, done


def test_sdk_server_image_audio_and_typed_result(host: Host) -> None:
    """M-4 step 5: what the SDK makes of an ``Image``, an ``Audio`` and a typed result reaches
    a native caller as the MCP result (``structuredContent`` kept beside the text); in
    terminal mode the image call prints nothing and succeeds, the typed one prints its
    text."""
    ran, frames = host.native("sdk.picture", {"label": "x"}, "sdk")
    assert ran.rc == 0, ran
    [item] = frames[-1]["output"]["content"]
    assert (item["type"], item["mimeType"], item["data"]) == ("image", "image/png", PNG), item
    ran, frames = host.native("sdk.sound", {"label": "x"}, "sdk")
    assert ran.rc == 0, ran
    [item] = frames[-1]["output"]["content"]
    assert item["type"] == "audio" and item["mimeType"] == "audio/wav", item
    assert base64.b64decode(item["data"]) == b"RIFF0000WAVE"
    ran, frames = host.native("sdk.reading", {"city": "K\u00f6ln"}, "sdk")
    assert ran.rc == 0, ran
    output = frames[-1]["output"]
    assert output["structuredContent"] == {"celsius": 21.5, "city": "K\u00f6ln"}, output
    assert output["isError"] is False
    assert json.loads(output["content"][0]["text"]) == output["structuredContent"]

    picture = host.terminal("sdk.picture", {"label": "x"}, "sdk")
    assert (picture.returncode, picture.stdout) == (0, b""), picture
    typed = host.terminal("sdk.reading", {"city": "Lyon"}, "sdk")
    assert typed.returncode == 0, typed
    assert json.loads(typed.stdout) == {"celsius": 21.5, "city": "Lyon"}, typed.stdout


# ============================================================ structuredContent


def test_structured_content_with_and_without_an_output_schema(host: Host) -> None:
    """M-4 step 5, C-1: ``structuredContent`` is passed on as the server sent it, for a tool
    without an ``outputSchema`` and for one whose declared schema it satisfies; a result
    without ``structuredContent`` has no such key."""
    ran, frames = host.native("raw.act", {"how": "loose"}, "structured")
    assert ran.rc == 0, ran
    assert frames[-1]["output"] == ANSWERS["loose"], frames[-1]["output"]
    ran, frames = host.native("raw.weather", {"how": "typed-ok"}, "structured")
    assert ran.rc == 0, ran
    assert frames[-1]["output"]["structuredContent"] == {"celsius": 21.5}
    ran, frames = host.native("raw.act", {"how": "two"}, "structured")
    assert ran.rc == 0 and "structuredContent" not in frames[-1]["output"], frames[-1]


def test_structured_content_that_breaks_the_declared_output_schema_is_passed_on(
    host: Host,
) -> None:
    """M-4 step 5, C-1 (doubtful: CortexFS never treats a schema as an output schema, and
    the projection keeps no ``outputSchema``): a ``structuredContent`` that the remote
    tool's own ``outputSchema`` refuses is handed on unchecked as a success."""
    ran, frames = host.native("raw.weather", {"how": "typed-bad"}, "structured-bad")
    assert ran.rc == 0 and frames[-1]["status"] == "ok", ran
    assert frames[-1]["output"]["structuredContent"] == {"kelvin": "warm"}


# ============================================================ errors the server reports


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("fail", "quota exceeded for r\u00e9gion \u2713"),
        ("fail-empty", "the server reported an error"),
        ("fail-image", "the server reported an error"),
        ("fail-structured", "bad city"),
    ],
)
def test_is_error_fails_the_call_with_eremoteio_in_both_modes(
    host: Host, how: str, said: str
) -> None:
    """M-4 step 5, T-3, T-7: a result marked ``isError`` fails the call with ``EREMOTEIO`` and
    the server's message (or a sentence saying the server reported an error, when it gave no
    text): natively a ``result`` frame ``error`` at stage ``exit`` and exit 1, in terminal
    mode exit 1 and the message on stderr, nothing on stdout; each call's ``tool_result`` is
    ``error`` with that errno, in the session and in the log."""
    session = f"is-error-{how}"
    ran, frames = host.native("raw.act", {"how": how}, session)
    result = frames[-1]
    assert ran.rc == 1, ran
    error = error_of(result)
    assert (error["error"], error["errno"], error["stage"]) == (
        "EREMOTEIO",
        errno.EREMOTEIO,
        "exit",
    ), error
    assert said in error["message"], error
    assert result["exit_status"] == 1, result
    _, done = pair(host, session, result["call"])
    assert done["status"] == "error" and done["errno"] in (errno.EREMOTEIO, "EREMOTEIO"), done
    assert logged(host, "raw.act", result["call"])["status"] == "error"

    ran = host.terminal("raw.act", {"how": how}, session)
    assert ran.returncode == 1 and ran.stdout == b"", ran
    assert "EREMOTEIO" in ran.stderr.decode() and said in ran.stderr.decode(), ran.stderr
    results = [e for e in host.events(session) if e["type"] == "tool_result"]
    assert [e["status"] for e in results] == ["error", "error"], results


def test_a_json_rpc_error_to_the_call_fails_it_with_the_servers_message(host: Host) -> None:
    """M-4 step 4/5: a JSON-RPC ``error`` answering ``tools/call`` (the server refused the
    request) fails the call, exit 1 in both modes, with ``EREMOTEIO`` and the server's message
    and code; it is recorded as an error."""
    ran, frames = host.native("raw.act", {"how": "rpc-error"}, "rpc-error")
    assert ran.rc == 1, ran
    error = error_of(frames[-1])
    assert error["error"] == "EREMOTEIO", error
    assert "no such city \u2713" in error["message"] and "-32602" in error["message"], error
    _, done = pair(host, "rpc-error", frames[-1]["call"])
    assert done["status"] == "error", done
    ran = host.terminal("raw.act", {"how": "rpc-error"}, "rpc-error")
    assert ran.returncode == 1 and ran.stdout == b"", ran
    assert "no such city \u2713" in ran.stderr.decode(), ran.stderr


def test_an_error_message_with_terminal_escapes_is_shown_escaped(host: Host) -> None:
    """M-4 step 5, T-3: the message of an ``isError`` result is the server's text; on a
    terminal caller's stderr its escape sequences are shown escaped (``\\x1b``), never sent raw
    to clear or retitle the terminal, while the native error keeps the text as it was."""
    ran = host.terminal("raw.act", {"how": "fail-escapes"}, "escapes")
    assert ran.returncode == 1, ran
    assert b"\x1b" not in ran.stderr and b"\x07" not in ran.stderr, ran.stderr
    assert b"\\x1b[2J" in ran.stderr and b"gone" in ran.stderr, ran.stderr
    ran, frames = host.native("raw.act", {"how": "fail-escapes"}, "escapes")
    assert ran.rc == 1 and ESCAPES in error_of(frames[-1])["message"], frames[-1]


# ============================================================ empty, many, big, odd text


def test_empty_content_and_a_missing_is_error_are_plain_successes(host: Host) -> None:
    """M-4 step 5: ``content: []`` is a success with nothing to print (terminal: no output,
    exit 0; native: ``{"content": [], "isError": false}``); a result without ``isError`` is
    a success too (MCP's default), answered with ``isError`` false."""
    ran, frames = host.native("raw.act", {"how": "empty"}, "empty")
    assert ran.rc == 0 and frames[-1]["output"] == {"content": [], "isError": False}, ran
    ran = host.terminal("raw.act", {"how": "empty"}, "empty")
    assert (ran.returncode, ran.stdout) == (0, b""), ran
    ran, frames = host.native("raw.act", {"how": "no-flag"}, "empty")
    assert ran.rc == 0 and frames[-1]["output"]["isError"] is False, ran
    ran = host.terminal("raw.act", {"how": "two"}, "empty")
    assert (ran.returncode, ran.stdout) == (0, b"a\nb\n\n"), ran


def test_many_content_items_arrive_whole_and_are_summarised_in_the_records(host: Host) -> None:
    """M-4 step 5, S-4, S-5: thousands of content items reach both modes whole (one line per
    text item in terminal mode), while the session's and the log's summary of the output stays
    a small line (a list keeps its first 20 items)."""
    ran, frames = host.native("raw.act", {"how": "many"}, "many")
    assert ran.rc == 0, ran
    content = frames[-1]["output"]["content"]
    assert content == [{"type": "text", "text": f"item {n}"} for n in range(MANY_ITEMS)]
    _, done = pair(host, "many", frames[-1]["call"])
    assert len(json.dumps(done)) < 16 * 1024, len(json.dumps(done))
    assert len(json.dumps(logged(host, "raw.act", frames[-1]["call"]))) < 16 * 1024
    ran = host.terminal("raw.act", {"how": "many"}, "many")
    assert ran.returncode == 0, ran
    assert ran.stdout.decode().splitlines() == [f"item {n}" for n in range(MANY_ITEMS)]


def test_a_text_of_more_than_one_mebibyte_arrives_whole(host: Host) -> None:
    """M-4 step 5, S-4, S-5: a 1.5 MiB text reaches a native caller and a terminal byte for
    byte; the events and the log line stay small (a string keeps its first 200 characters),
    and nothing of it is cut off or lost."""
    text = "".join(f"line {n:06d} of the answer\n" for n in range(BIG_LINES))
    assert len(text) > 1024 * 1024
    ran, frames = host.native("raw.act", {"how": "big"}, "big")
    assert ran.rc == 0, ran.err
    assert frames[-1]["output"]["content"] == [{"type": "text", "text": text}]
    _, done = pair(host, "big", frames[-1]["call"])
    assert len(json.dumps(done)) < 16 * 1024
    assert len(json.dumps(logged(host, "raw.act", frames[-1]["call"]))) < 16 * 1024
    ran = host.terminal("raw.act", {"how": "big"}, "big")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == (text + "\n").encode(), len(ran.stdout)


def test_non_ascii_and_control_characters_keep_natively_and_stay_escaped_in_records(
    host: Host,
) -> None:
    """M-4 step 5, S-4, S-5: a text holding accents, CJK, an emoji, escape sequences, a bell,
    a carriage return, a NUL, a right-to-left override and a BOM comes back natively exactly;
    the session and the log hold it as JSON escapes, never as raw control bytes that would
    break a line or a terminal reading the file."""
    ran, frames = host.native("raw.act", {"how": "weird"}, "weird")
    assert ran.rc == 0, ran
    assert frames[-1]["output"]["content"] == [{"type": "text", "text": WEIRD}]
    raw = (host.storage / "home" / str(host.uid) / "agent" / "coder" / "session" / "weird"
           / "events.jsonl").read_bytes()  # fmt: skip
    for control in (b"\x1b", b"\x00", b"\x07", b"\r"):
        assert control not in raw, control
    assert raw.count(b"\n") == 2, raw
    _, done = pair(host, "weird", frames[-1]["call"])
    assert "h\u00e9llo" in json.dumps(done["output"], ensure_ascii=False), done
    log = (host.storage / "tool" / "raw.act.d" / "log").read_bytes()
    assert b"\x1b" not in log and b"\x00" not in log
    ran = host.terminal("raw.act", {"how": "weird"}, "weird")
    assert ran.returncode == 0, ran
    assert "h\u00e9llo w\u00f6rld \u2713 \u65e5\u672c\u8a9e \U0001f642" in ran.stdout.decode()


# ============================================================ traffic before the result


def test_progress_log_and_ping_before_the_result(host: Host) -> None:
    """M-1, M-4 step 5: progress and log notifications and a ``ping`` request of the server's
    own, sent while the call is in flight, delay nothing and break nothing: the ping is
    answered ``{}``, the notifications dropped, the result is the caller's, in both modes."""
    ran, frames = host.native("raw.act", {"how": "chatty"}, "chatty")
    assert ran.rc == 0, ran
    assert frames[-1]["output"]["content"] == [{"type": "text", "text": "pong {}"}]
    assert not [f for f in frames if f["type"] == "stderr"], frames
    ran = host.terminal("raw.act", {"how": "chatty"}, "chatty")
    assert (ran.returncode, ran.stdout) == (0, b"pong {}\n"), ran
    # Twenty thousand log notifications before the result: read and dropped, no hang.
    ran, frames = host.native("raw.act", {"how": "flood"}, "chatty")
    assert ran.rc == 0, ran
    assert frames[-1]["output"]["content"] == [{"type": "text", "text": "after the flood"}]


# ============================================================ results that break the protocol


@pytest.mark.parametrize(
    "how",
    [
        "wrong-id",
        "string-id",
        "null-id",
        "flag-string",
        "flag-null",
        "no-content",
        "item-string",
        "surrogate",
        "null-text",
        "object-text",
        "deep",
        "rpc-error-bare",
    ],
)
def test_a_broken_result_is_eproto_in_both_modes_and_recorded(host: Host, how: str) -> None:
    """M-4 step 5: a response to an id never asked (another number, the right number as a
    string), an ``isError`` that is not ``true`` or ``false``, no ``content`` list, a content
    item that is no object, a lone surrogate, a text item whose ``text`` is ``null`` or an
    object (which a terminal caller would be shown in a spelling the server never sent), a
    ``structuredContent`` 200 levels deep (deeper than a tool's output may be, which would
    reach a native caller as a string of JSON text): the server's fault, ``EPROTO``, exit 1
    in both modes, never a success with the data dropped and never a hang; the call is
    recorded as an error in the session and the log.  So is a JSON-RPC error that is not an
    object (``"error": "boom"``), which has neither the message nor the code to show."""
    session = f"broken-{how}"
    ran, frames = host.native("raw.act", {"how": how}, session)
    assert ran.rc == 1, ran
    error = error_of(frames[-1])
    assert (error["error"], error["errno"]) == ("EPROTO", errno.EPROTO), error
    assert "broke the protocol" in error["message"], error
    _, done = pair(host, session, frames[-1]["call"])
    assert done["status"] == "error", done
    assert logged(host, "raw.act", frames[-1]["call"])["status"] == "error"
    ran = host.terminal("raw.act", {"how": how}, session)
    assert ran.returncode == 1 and ran.stdout == b"", ran
    assert "EPROTO" in ran.stderr.decode(), ran.stderr


@pytest.mark.parametrize(("how", "redirect"), [("big", "| head -c 10"), ("media", "> /dev/full")])
def test_an_answer_the_callers_stdout_cannot_take_ends_without_a_traceback(
    host: Host, how: str, redirect: str
) -> None:
    """T-3, M-4 step 5: in terminal mode the tool writes on the stdout it was lent; what it
    cannot write there is its own business and shows in its exit status (docs/tools.md), but
    the bridge CortexFS ships must say so as a message (``EPIPE``, ``ENOSPC``), not crash
    with a Python traceback on the caller's terminal."""
    payload = json.dumps({"how": how})
    script = f"{VENV_BIN / 'ctx'} run --agent coder --session pipe raw.act '{payload}' {redirect}"
    ran = subprocess.run(["bash", "-c", script], capture_output=True, env=host.env,
                         timeout=120, stdin=subprocess.DEVNULL)  # fmt: skip
    [result] = [e for e in host.events("pipe") if e["type"] == "tool_result"][-1:]
    assert result["exit_status"] is not None, result
    assert b"Traceback" not in ran.stderr, ran.stderr.decode()[-600:]


# ============================================================ through a worker


def test_a_worker_finishes_exotic_results_with_the_right_state_and_reason(host: Host) -> None:
    """W-1, M-4 step 5, S-2, Q-4: jobs naming the MCP-backed tool, drained by ``ctx queue
    work``: media and a 1.5 MiB text finish in ``done/`` with the result's content whole; an
    ``isError`` result and a response to an unknown id finish in ``failed/`` with
    ``EREMOTEIO`` and ``EPROTO``; nothing stays claimed, every call is in the worker's
    session and the tool's log."""
    queue = QueueCLI(host.storage, "proj")
    jobs = {}
    for how in ("media", "big", "fail", "wrong-id", "empty"):
        req = request("raw.act")
        req["input"] = {"how": how}
        jobs[how] = queue.publish(req, name=f"job-{how}")
    drained = host.ctx("queue", "work", "--project", "proj", "--agent", "coder", "--drain",
                       "--json", "--timeout", "60", timeout=180)  # fmt: skip
    assert drained.rc == 0, drained
    stop = [json.loads(line) for line in drained.lines() if line.strip()][-1]
    assert stop["event"] == "stop" and (stop["done"], stop["failed"]) == (3, 2), stop

    state, media = queue.only_result(jobs["media"])
    assert state == "done" and media["output"] == {"content": MEDIA, "isError": False}, media
    state, big = queue.only_result(jobs["big"])
    text = "".join(f"line {n:06d} of the answer\n" for n in range(BIG_LINES))
    assert state == "done" and big["output"]["content"][0]["text"] == text
    state, empty = queue.only_result(jobs["empty"])
    assert state == "done" and empty["output"] == {"content": [], "isError": False}, empty
    state, failed = queue.only_result(jobs["fail"])
    assert state == "failed" and failed["reason"].startswith("EREMOTEIO"), failed
    assert "quota exceeded" in failed["reason"], failed
    state, broken = queue.only_result(jobs["wrong-id"])
    assert state == "failed" and broken["reason"].startswith("EPROTO"), broken
    queue.assert_settled()

    worker = [e for e in host.events("worker") if e["type"] == "tool_result"]
    by_job = {e.get("job"): e["status"] for e in worker}
    calls = {e["call"]: e.get("job") for e in host.events("worker") if e["type"] == "tool_call"}
    assert sorted(calls.values()) == sorted(jobs.values()), calls
    assert {calls[e["call"]]: e["status"] for e in worker} == {
        jobs["media"]: "ok",
        jobs["big"]: "ok",
        jobs["empty"]: "ok",
        jobs["fail"]: "error",
        jobs["wrong-id"]: "error",
    }, by_job
    for event in worker:
        logged(host, "raw.act", event["call"])
