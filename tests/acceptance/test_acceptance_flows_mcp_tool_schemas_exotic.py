"""End-to-end flows of a user who projects the tools of MCP stdio servers whose tools are
unusual (SPEC §10 M-1, M-3, M-4 with R-3, T-1, T-3, T-7, T-8, C-1, S-4, W-1, W-4;
docs/tools.md "MCP servers as tool sources", "How an input is checked", "Running a tool").

The servers list tools whose ``inputSchema`` is remote (``https:``/``file:`` ``$ref``),
recursive, cyclic, a boolean, a string, missing, of a type that admits no object, of an
unknown or an old ``$schema`` draft, an enum of tens of thousands of names, a pattern that
backtracks, deeper or larger than a manifest holds; names that differ only in case, repeat
across pages or run past 64 bytes; descriptions with control characters or megabytes of
text; tools that disappear between the projection and the call; and results holding binary
content, structured content that ignores the tool's ``outputSchema``, text that is not a
string or a lone surrogate.  Everything runs through the installed ``ctxmcp list`` /
``project``, ``ctx object check`` / ``install``, ``ctx run --agent`` in both modes and
``ctx queue work`` draining jobs as the agent.

What must hold: a tool whose schema cannot serve is skipped with the documented reason and
the rest are written; a usable one judges an input as an installed tool with the same schema
does; names are taken exactly; no traceback; no call outlives its timeout; results are
passed on whole and recorded bounded."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    OnStorage,
    QueueCLI,
    Run,
    kill_processes_of,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    snapshot,
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

# A stdio MCP server on raw pipes whose behaviour is read, at every request, from the JSON
# file named by argv[1] (so a test changes it between two calls):
#   pages     the tools/list pages (a list of lists of entries); "tools": one page
#   announce  send notifications/tools/list_changed before every page
#   answers   tool name -> the tools/call result to send; else the params are echoed as text
#   trace     a file each tools/call is appended to ({"call", "arguments"})
# A tools/call of a name the current listing does not hold is a JSON-RPC error, as SDK
# servers answer an unknown tool.
SERVER = (
    WIRE
    + r"""
SCRIPT = sys.argv[1]

def script():
    with open(SCRIPT) as f:
        return json.load(f)

def pages(s):
    return s.get("pages") or [s.get("tools", [])]

while True:
    message = receive()
    if "id" not in message:
        continue
    method, ident, s = message.get("method"), message["id"], script()
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {"listChanged": True}},
            "serverInfo": {"name": "exotic", "version": "0"}}})
    elif method == "tools/list":
        cursor = (message.get("params") or {}).get("cursor")
        index = int(cursor) if cursor else 0
        if s.get("announce"):
            send({"jsonrpc": "2.0", "method": "notifications/tools/list_changed"})
        result = {"tools": pages(s)[index]}
        if index + 1 < len(pages(s)):
            result["nextCursor"] = str(index + 1)
        send({"jsonrpc": "2.0", "id": ident, "result": result})
    elif method == "tools/call":
        name, arguments = message["params"]["name"], message["params"].get("arguments")
        if s.get("trace"):
            fd = os.open(s["trace"], os.O_WRONLY | os.O_APPEND)
            os.write(fd, json.dumps({"call": name, "arguments": arguments}).encode() + b"\n")
            os.close(fd)
        listed = {t.get("name") for page in pages(s) for t in page if isinstance(t, dict)}
        if name not in listed:
            send({"jsonrpc": "2.0", "id": ident,
                  "error": {"code": -32602, "message": "Unknown tool: " + name}})
        elif name in s.get("answers", {}):
            send({"jsonrpc": "2.0", "id": ident, "result": s["answers"][name]})
        else:
            text = json.dumps(message["params"])
            send({"jsonrpc": "2.0", "id": ident,
                  "result": {"content": [{"type": "text", "text": text}], "isError": False}})
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}})
"""
)

# The program of an ordinary installed tool: echoes its native input, prints its argv.
ECHO = """\
#!/bin/sh
if [ "$#" -gt 0 ]; then
  printf '%s\\n' "$*"
else
  cat
fi
"""

OPEN = {"type": "object"}
# A tree whose every level is a reference, through in-place applicators, back to the node:
# recursive, but every round consumes a level of the input (no cycle, T-1).
TREE = {
    "$ref": "#/$defs/node",
    "$defs": {
        "node": {"allOf": [{"$ref": "#/$defs/kind"}]},
        "kind": {"anyOf": [{"$ref": "#/$defs/body"}]},
        "body": {"oneOf": [{
            "type": "object",
            "properties": {"v": {"type": "integer"},
                           "k": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "additionalProperties": False,
        }]},
    },
}  # fmt: skip
CHOICES = [f"choice-{i:05d}" for i in range(5_000)]
# ^(a+)+$ is the documented form of a pattern that may backtrack for ever; ^(a|a?)+$ is
# another (an alternation of overlapping branches under a repeat): 2^n ways to fail on n a's.
NESTED_REPEAT = "^(a+)+$"
OVERLAPPING_BRANCHES = "^(a|a?)+$"
ALMOST = "a" * 40 + "!"
# How long a call given --timeout 1 may take, on a loaded machine, before it counts as hung.
HANG_DEADLINE = 3.5


# ---------------------------------------------------------------------------------- helpers


@dataclass
class Host(OnStorage):
    """A directory every uid may search: a bootstrapped storage root, ``mcp/`` (host-owned,
    holding the configuration, the server and its script; agents mount it read-only at the
    same path) and ``trace/``, where the server, running as the agent, notes its calls."""

    top: Path
    storage: Path
    mcp: Path
    trace: Path
    uid: int = -1

    @property
    def config(self) -> Path:
        return self.mcp / "mcp.json"

    @property
    def calls(self) -> list[dict]:
        return read_jsonl(self.trace / "calls.jsonl")

    def serve(self, **script) -> None:
        """The server ``s`` of ``mcp.json`` behaves as ``script`` says from its next request."""
        script["trace"] = str(self.trace / "calls.jsonl")
        path = self.mcp / "script.json"
        path.write_text(json.dumps(script))
        path.chmod(0o644)

    def ctxmcp(self, *args, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(CTXMCP), *map(str, args)], capture_output=True, text=True,
                              env=self.env, timeout=timeout)  # fmt: skip

    def listing(self) -> dict[str, dict]:
        """``ctxmcp list --json``: each remote tool's entry by its name (the last of a name)."""
        listed = self.ctxmcp("list", "--config", self.config, "--server", "s", "--json")
        assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed
        return {entry["tool"]: entry for entry in json.loads(listed.stdout)["tools"]}

    def project(self, out: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
        done = self.ctxmcp("project", "--config", self.config, "--runtime-config",
                           self.config, "--server", "s", "--out", out, "--json",
                           *extra)  # fmt: skip
        assert "Traceback" not in done.stderr, done
        return done, json.loads(done.stdout)

    def grant(self, tool: str) -> None:
        """``allow coder_t tool:TOOL execute`` in the tool's own policy (P-6)."""
        with (self.storage / "tool" / f"{tool}.d" / "policy").open("a") as policy:
            policy.write(f"allow {LABEL} tool:{tool} execute\n")

    def install(self, manifest: Path) -> None:
        installed = self.ctx("object", "install", manifest, "--tier", "system")
        assert installed.rc == 0 and "Traceback" not in installed.err, installed

    def exec_tool(self, name: str, schema: object) -> None:
        """An ordinary installed tool ``name`` (no MCP) taking input by ``schema``."""
        src = self.top / "src"
        src.mkdir(mode=0o755, exist_ok=True)
        (src / "echo.sh").write_text(ECHO)
        manifest = src / f"{name}.json"
        manifest.write_text(json.dumps({
            "manifest": 2, "kind": "tool", "name": name, "description": f"The {name} tool.",
            "schema": schema, "cap": {"side_effects": False, "network": False},
            "exec": "echo.sh",
        }))  # fmt: skip
        self.install(manifest)
        self.grant(name)

    def adopt(self, out: Path, tools: list[str], exec_tools: tuple[str, ...] = ()) -> None:
        """Install each candidate ``OUT/T.manifest.json`` of ``tools`` in the system tier, with
        its own policy allowing the label, and make agent ``coder`` granted them all (and the
        ordinary tools ``exec_tools``), mounting ``mcp/`` read-only."""
        for tool in tools:
            self.install(out / f"{tool}.manifest.json")
            self.grant(tool)
        req = {"name": "coder", "label": LABEL, "tools": [*tools, *exec_tools],
               "mount": [[str(self.mcp), str(self.mcp), "ro"]]}  # fmt: skip
        self.uid = self.create_agent(req)["identity"]["uid"]

    def native(self, tool: str, payload: object, *opts: str, **kw) -> tuple[Run, dict]:
        ran = self.ctx("run", "--agent", "coder", "--native", *opts, tool,
                       input=json.dumps(payload), **kw)  # fmt: skip
        assert "Traceback" not in ran.err, ran
        frames = [json.loads(line) for line in ran.lines() if line.strip()]
        assert frames and frames[-1]["type"] == "result", ran
        return ran, frames[-1]

    def terminal(self, tool: str, *argv: str, **kw) -> Run:
        return self.ctx("run", "--agent", "coder", tool, *argv, **kw)

    @property
    def session(self) -> Path:
        return self.storage / "home" / str(self.uid) / "agent" / "coder" / "session"

    def events(self, session: str = "default") -> list[dict]:
        return read_jsonl(self.session / session / "events.jsonl")


@pytest.fixture
def host(_template: Path) -> Iterator[Host]:
    top = new_scratch_dir(SCRATCH, "host-")
    try:
        storage = copy_of_root(_template, top / "storage")
        mcp = top / "mcp"
        mcp.mkdir(mode=0o755)
        (mcp / "server.py").write_text(SERVER)
        (mcp / "server.py").chmod(0o644)
        entry = {"command": str(PYTHON), "args": [str(mcp / "server.py"), str(mcp / "script.json")]}
        (mcp / "mcp.json").write_text(json.dumps({"mcpServers": {"s": entry}}))
        (mcp / "mcp.json").chmod(0o644)
        trace = top / "trace"
        trace.mkdir(mode=0o755)
        (trace / "calls.jsonl").touch()
        (trace / "calls.jsonl").chmod(0o666)
        host = Host(top, storage, mcp, trace)
        host.serve(tools=[])
        yield host
    finally:
        kill_processes_of(top)
        shutil.rmtree(top, ignore_errors=True)


def tool(name: str, schema: object = OPEN, **extra) -> dict:
    return {"name": name, "description": f"The remote {name}.", "inputSchema": schema, **extra}


def nested(depth: int) -> dict:
    """An object schema nested ``depth`` levels of ``properties``/``x`` deep."""
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


def tree_input(levels: int) -> dict:
    """An input of TREE ``levels`` levels deep (two JSON levels each: an object, a list)."""
    value: dict = {"v": 0}
    for _ in range(levels):
        value = {"v": 1, "k": [value]}
    return value


def echoed(result: dict) -> dict:
    """The params the echoing server received, from a native call's ``result`` frame."""
    return json.loads(result["output"]["content"][0]["text"])


def longest_line(path: Path) -> int:
    return max((len(line) for line in path.read_bytes().splitlines()), default=0)


def bounded(argv: list[str], env: dict[str, str], data: bytes, deadline: float) -> Run | None:
    """``argv`` run with ``data`` on stdin in a process group of its own; None (the group
    killed) when it has not ended within ``deadline`` seconds."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(data, timeout=deadline)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return None
    return Run(argv[len(CTX_ARGV) :], proc.returncode, out.decode(errors="replace"),
               err.decode(errors="replace"))  # fmt: skip


def job(tool_name: str, payload: dict) -> dict:
    return {"tool": tool_name, "input": payload, "from": "tester",
            "created": "2026-06-22T12:00:00Z"}  # fmt: skip


# ======================================================== schemas that cannot serve


# remote tool -> (inputSchema, what the reason of its skip says)
UNUSABLE = {
    "https-ref": ({"type": "object", "properties": {"x": {"$ref": "https://example.com/s.json"}}},
                  "outside itself: nothing is fetched"),
    "file-ref": ({"type": "object", "properties": {"x": {"$ref": "file:///etc/passwd"}}},
                 "outside itself: nothing is fetched"),
    "dangling": ({"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}},
                 "which it does not hold"),
    "self": ({"$ref": "#"}, "refers to itself without end"),
    "cycle": ({"type": "object", "properties": {"x": {"$ref": "#/$defs/a"}},
               "$defs": {"a": {"allOf": [{"$ref": "#/$defs/b"}]},
                         "b": {"anyOf": [{"$ref": "#/$defs/a"}]}}},
              "refers to itself without end"),
    "inner-id": ({"type": "object", "properties": {"x": {"$id": "https://e.com/x",
                                                         "$ref": "#/$defs/s"}},
                  "$defs": {"s": {"type": "string"}}}, "below its top"),
    "true": (True, "must be a JSON Schema object, not a boolean"),
    "false": (False, "must be a JSON Schema object, not a boolean"),
    "word": ("object", "must be a JSON Schema object, not a string"),
    "nothing": (None, "must be a JSON Schema object, not null"),
    "string-type": ({"type": "string"}, "has type 'string', but MCP passes"),
    "scalar-types": ({"type": ["string", "null"]}, "but MCP passes a tool's arguments"),
    "numbered-draft": ({"$schema": 7, "type": "object"}, "$schema must be a string"),
    "bad-regex": ({"type": "object", "properties": {"s": {"pattern": "(unclosed"}}},
                  "is not a 'regex'"),
    "too-deep": (nested(70), "nests deeper than 127 levels"),
    "too-big": ({"type": "object", "properties": {"c": {"enum": [f"{i:07d}" for i in
                                                                 range(80_000)]}}},
                "its candidate would be"),
}  # fmt: skip
USABLE = {
    "tree": TREE,
    "anchored": {"type": "object", "properties": {"x": {"$ref": "#word"}},
                 "$defs": {"w": {"$anchor": "word", "type": "string"}}},
    "dynamic": {"$dynamicAnchor": "n", "type": "object",
                "properties": {"k": {"$dynamicRef": "#n"}, "v": {"type": "integer"}}},
    "recursive-2019": {"$schema": "https://json-schema.org/draft/2019-09/schema",
                       "$recursiveAnchor": True, "type": "object",
                       "properties": {"k": {"$recursiveRef": "#"}}},
    "unknown-draft": {"$schema": "https://example.com/draft/2099-01/schema", "type": "object",
                      "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    "draft-04": {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
                 "properties": {"n": {"type": "number", "minimum": 0,
                                      "exclusiveMinimum": True}}},
    "object-or-null": {"type": ["object", "null"]},
    "booleans": {"type": "object", "properties": {"yes": True, "no": False}},
    "no-type": {},
    "never": {"type": "object", "not": {"type": "object"}},
    "enum": {"type": "object", "properties": {"c": {"enum": CHOICES}}, "required": ["c"]},
}  # fmt: skip


def test_schemas_that_cannot_serve_are_skipped_with_their_reason_and_the_others_written(
    host: Host,
) -> None:
    """M-3, M-1, T-8 (docs/tools.md "Names (M-3)"): a server lists, among usable tools, tools
    whose ``inputSchema`` refers outside itself (https, file), to a place it does not hold
    or to itself without end, declares an ``$id`` below its top, is a boolean, a string or
    null, admits no object, names its draft by a number, holds a pattern that does not
    compile, nests deeper than a manifest holds or makes a candidate over 1 MiB, plus
    entries that are no tool at all and one with no schema.  ``ctxmcp list`` and ``project``
    agree: each unusable one is reported with its reason and skipped (exit 1), every usable
    one is written and passes ``ctx object check``, and nothing is written under the storage
    root; the listing's ``(not projectable: …)`` lines say the same."""
    listed_tools: list[object] = [tool(name, schema) for name, (schema, _) in UNUSABLE.items()]
    listed_tools += [tool(name, schema) for name, schema in USABLE.items()]
    listed_tools += [1, "x", None, {"name": "schemaless", "description": "none"}]
    host.serve(tools=listed_tools)
    before = snapshot(host.storage)

    listing = host.listing()
    out = host.top / "out"
    projected, report = host.project(out)

    assert projected.returncode == 1, projected
    skipped = {entry["tool"]: entry["problem"] for entry in report["skipped"]}
    assert set(skipped) == {*UNUSABLE, "1", '"x"', "null", "schemaless"}, skipped
    for name, (_, reason) in UNUSABLE.items():
        assert reason in skipped[name], (name, skipped[name])
        assert listing[name]["name"] is None and reason in listing[name]["problem"], name
    assert "gave no inputSchema" in skipped["schemaless"]
    assert all("not a tool object" in skipped[k] for k in ("1", '"x"', "null")), skipped
    assert sorted(report["written"]) == sorted(str(out / f"s.{n}.manifest.json") for n in USABLE)
    assert sorted(os.listdir(out)) == sorted(f"s.{n}.manifest.json" for n in USABLE)
    for name, schema in USABLE.items():
        candidate = json.loads((out / f"s.{name}.manifest.json").read_text())
        assert candidate["schema"] == schema and listing[name]["name"] == f"s.{name}"
    checked = host.ctx("object", "check", *sorted(out.iterdir()))
    assert checked.rc == 0 and checked.err == "", checked
    assert snapshot(host.storage) == before  # M-1: nothing under the root

    text = host.ctxmcp("list", "--config", host.config, "--server", "s")
    assert text.returncode == 0, text
    lines = dict(line.split("\t", 1) for line in text.stdout.splitlines())
    assert lines["https-ref"].startswith("(not projectable: ") and lines["s.tree"], lines


def test_usable_exotic_schemas_judge_inputs_as_an_installed_tool_with_the_same_schema(
    host: Host,
) -> None:
    """M-4, T-1, T-3 (docs/tools.md "How an input is checked"): a projected tool whose schema
    is a recursive tree of references through in-place applicators, draft 4's boolean
    ``exclusiveMinimum``, an enum of 5 000 names or boolean subschemas (``"no": false``)
    refuses each input in native mode exactly as an ordinary installed tool with the same
    schema does (EINVAL at stage ``schema``, the same message, the enum's choices cut
    short, the server never called), and hands an accepted input to the remote tool
    unchanged; a terminal call breaking ``"no": false`` is refused by the bridge (exit 2)
    before the server starts.  (The runner judges the other usable schemas of USABLE the
    same way; test_acceptance_flows_manifest_schemas_exotic.py calls such ordinary tools.)"""
    cases = {  # tool -> (refused input, the place named, accepted input)
        "tree": ({"v": 1, "k": [{"v": "x"}]}, None, tree_input(5)),
        "draft-04": ({"n": 0}, "at /n: ", {"n": 0.5}),
        "enum": ({"c": "nope"}, "at /c: 'nope' is not one of", {"c": CHOICES[-1]}),
        "booleans": ({"no": 1}, "at /no: False schema does not allow 1", {"yes": {"d": [1]}}),
    }
    host.serve(tools=[tool(name, USABLE[name]) for name in cases])
    out = host.top / "out"
    projected, _ = host.project(out)
    assert projected.returncode == 0, projected
    for name in cases:
        host.exec_tool(f"x.{name}", USABLE[name])
    host.adopt(out, [f"s.{name}" for name in cases], tuple(f"x.{name}" for name in cases))

    for name, (refused, place, accepted) in cases.items():
        said = {}
        for prefix in ("s", "x"):
            ran, result = host.native(f"{prefix}.{name}", refused)
            assert ran.rc == 2 and result["error"]["error"] == "EINVAL", result
            assert result["error"]["stage"] == "schema", result
            said[prefix] = result["error"]["message"].replace(f"{prefix}.{name}", "T")
        assert said["s"] == said["x"], said
        assert place is None or place in said["s"], (name, said["s"])
        assert len(said["s"]) < 400, said["s"]  # the enum's 5 000 choices are not repeated
        ran, result = host.native(f"s.{name}", accepted)
        assert ran.rc == 0 and result["status"] == "ok", result
        assert echoed(result) == {"name": name, "arguments": accepted}, result
    # The bridge checks a schema of common keywords whole in terminal mode too (step 2).
    said = host.terminal("s.booleans", '{"no": "x"}')
    assert said.rc == 2 and said.err.startswith("s.booleans: EINVAL: "), said
    assert "at /no: False schema does not allow 'x'" in said.err, said
    assert [c["call"] for c in host.calls] == list(cases)


@pytest.mark.parametrize(
    ("schema", "payload"),
    [
        pytest.param(
            {"type": "object", "properties": {"any": True, "none": False,
                                              "r": {"$ref": "#/$defs/s"}},
             "$defs": {"s": {"type": "string"}}},
            {"any": [1, {"2": 3}], "r": "fine"},
            id="boolean-subschema",
        ),
        pytest.param(
            {"$schema": "http://json-schema.org/draft-03/schema#", "type": "object",
             "properties": {"a": {"type": "any"}}},
            {"a": 1},
            id="draft-03-any",
        ),
        pytest.param(
            {"$schema": "http://json-schema.org/draft-03/schema#", "type": "object",
             "required": True, "properties": {"a": {"type": "string"}}},
            {"a": "x"},
            id="draft-03-required-flag",
        ),
    ],
)  # fmt: skip
def test_valid_inputs_reach_a_remote_tool_whose_schema_uses_booleans_or_draft_3(
    host: Host, schema: dict, payload: dict
) -> None:
    """M-4, T-3, T-8 (docs/tools.md, the bridge's step 2): ``ctxmcp project`` writes and
    ``ctx object install`` installs a tool whose schema holds a boolean subschema (valid since
    draft 6) or draft 3's ``"type": "any"`` / ``"required": true``; the runner accepts a
    valid input in native mode, so the call reaches the remote tool in native mode, in
    terminal mode and as a worker's job, each without a traceback."""
    host.serve(tools=[tool("t", schema)])
    out = host.top / "out"
    projected, _ = host.project(out)
    assert projected.returncode == 0, projected
    host.adopt(out, ["s.t"])

    ran, result = host.native("s.t", payload)
    assert "Traceback" not in result.get("stderr", ""), result
    assert ran.rc == 0 and result["status"] == "ok", result
    assert echoed(result)["arguments"] == payload
    said = host.terminal("s.t", json.dumps(payload))
    assert said.rc == 0 and "Traceback" not in said.err, said
    queue = QueueCLI(host.storage, "proj")
    name = queue.publish(job("s.t", payload), name="valid")
    drained = host.ctx("queue", "work", "--project", "proj", "--agent", "coder", "--drain")
    assert drained.rc == 0 and queue.state(name) == "done", drained


def test_a_deep_valid_input_of_a_recursive_schema_is_judged_not_called_damage(
    host: Host,
) -> None:
    """T-1, T-3, M-4 (docs/tools.md "How an input is checked": a cycle is refused at install;
    ENOEXEC is for a schema installed before that check): TREE passed ``ctxmcp project``,
    ``ctx object check`` and install — every reference consumes a level of the input — so
    an input nested 63 levels (126 JSON levels, under the 128 an input may have) is judged,
    not reported as a damaged tool to reinstall."""
    host.serve(tools=[tool("tree", TREE)])
    out = host.top / "out"
    assert host.project(out)[0].returncode == 0
    host.adopt(out, ["s.tree"])
    ran, deep = host.native("s.tree", tree_input(63))
    assert deep["error"] is None or deep["error"]["error"] != "ENOEXEC", deep
    assert ran.rc == 0 and deep["status"] == "ok", deep


# ======================================================== patterns that backtrack


def test_a_backtracking_pattern_is_bounded_by_the_calls_timeout_in_every_entry_point(
    host: Host,
) -> None:
    """T-1, T-3, W-1, W-4 (docs/tools.md "How an input is checked": a nested repeat is judged
    in a child within the call's timeout): ``^(a+)+$`` on an input that almost matches ends
    at ``--timeout`` in terminal mode (the bridge's own check is killed with its group,
    ETIMEDOUT); a worker with ``--timeout 2`` fails that job at stage ``schema`` with
    ETIMEDOUT, then finishes a matching job and a refused one; nothing stays claimed and the
    server is called only for the matching input.  (A native call of an ordinary tool is
    bounded the same way: test_acceptance_flows_manifest_schemas_exotic.py.)"""
    host.serve(tools=[tool("t", {"type": "object",
                                 "properties": {"s": {"type": "string",
                                                      "pattern": NESTED_REPEAT}}})])  # fmt: skip
    out = host.top / "out"
    assert host.project(out)[0].returncode == 0
    host.adopt(out, ["s.t"])

    argv = [*CTX_ARGV, "run", "--agent", "coder", "--timeout", "1", "s.t",
            json.dumps({"s": ALMOST})]  # fmt: skip
    said = bounded(argv, host.env, b"", HANG_DEADLINE)
    assert said is not None, "a terminal call outlived its timeout"
    assert said.rc != 0 and "ETIMEDOUT" in said.err and "Traceback" not in said.err, said

    queue = QueueCLI(host.storage, "proj")
    slow = queue.publish(job("s.t", {"s": ALMOST}), name="slow")
    fine = queue.publish(job("s.t", {"s": "aaaa"}), name="fine")
    wrong = queue.publish(job("s.t", {"s": 4}), name="wrong")
    argv = [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", "coder", "--drain",
            "--timeout", "2", "--json"]  # fmt: skip
    drained = bounded(argv, host.env, b"", 3 * HANG_DEADLINE)
    assert drained is not None and drained.rc == 0, drained
    assert [queue.state(j) for j in (slow, fine, wrong)] == ["failed", "done", "failed"]
    _, reason = queue.only_result(slow)
    assert reason["error"]["stage"] == "schema" and reason["reason"].startswith("ETIMEDOUT")
    assert queue.only_result(wrong)[1]["reason"].startswith("EINVAL"), queue.only_result(wrong)
    for sub in ("pending", "claimed", "lease"):
        assert queue.entries(sub) == set(), sub
    assert [c["arguments"] for c in host.calls] == [{"s": "aaaa"}]


def test_an_overlapping_alternation_under_a_repeat_is_bounded_by_the_calls_timeout(
    host: Host,
) -> None:
    """T-3, W-4 (docs/tools.md "How an input is checked" and "Process group and bounds": a
    call with a timeout has its input judged within that time): ``^(a|a?)+$`` fails on
    ``a…a!`` after trying 2^n ways, as ``^(a+)+$`` does; a native call given ``--timeout 1``
    must end within seconds, refused, not hold the runner (and a worker's threads with it)."""
    pattern = {"type": "string", "pattern": OVERLAPPING_BRANCHES}
    host.serve(tools=[tool("t", {"type": "object", "properties": {"s": pattern}})])
    out = host.top / "out"
    assert host.project(out)[0].returncode == 0
    host.adopt(out, ["s.t"])

    argv = [*CTX_ARGV, "run", "--agent", "coder", "--native", "--timeout", "1", "s.t"]
    ran = bounded(argv, host.env, json.dumps({"s": ALMOST}).encode(), HANG_DEADLINE)
    assert ran is not None, f"ctx run --native --timeout 1 still ran after {HANG_DEADLINE} s"
    assert json.loads(ran.lines()[-1])["status"] == "error", ran


# ======================================================== names and descriptions


def test_names_are_taken_exactly_case_and_all_and_repeats_across_pages_are_refused(
    host: Host,
) -> None:
    """M-3, R-3, T-4: a server whose listing runs over three pages, announcing
    ``tools/list_changed`` before each, lists ``Read`` and ``read`` (distinct names, each
    its own candidate and tool, each calling its own remote tool), ``twice`` on the first and
    the last page (neither copy written: which one ``s.twice`` runs cannot be told), a name
    that makes ``s.`` + 62 bytes (64, legal) and one byte more (skipped), and ``a.b`` (legal:
    ``s.a.b``).  ``ctx object list`` shows the two case variants apart."""
    longest, too_long = "n" * 62, "n" * 63
    host.serve(announce=True, pages=[
        [tool("Read"), tool("twice")],
        [tool("read"), tool(longest), tool(too_long)],
        [tool("a.b"), tool("twice", {"type": "object", "required": ["z"]})],
    ])  # fmt: skip
    out = host.top / "out"
    projected, report = host.project(out)
    assert projected.returncode == 1, projected
    written = {"s.Read", "s.read", f"s.{longest}", "s.a.b"}
    assert sorted(report["written"]) == sorted(str(out / f"{n}.manifest.json") for n in written)
    skipped = [(e["tool"], e["problem"]) for e in report["skipped"]]
    assert sorted(name for name, _ in skipped) == sorted(["twice", "twice", too_long]), skipped
    assert all("lists 2 tools named 'twice'" in p for n, p in skipped if n == "twice"), skipped
    host.adopt(out, sorted(written))

    listed = host.ctx("object", "list", "--tier", "system")
    names = {line.split()[0] for line in listed.lines() if line.startswith("s.")}
    assert names == written, listed
    for name, remote in (("s.Read", "Read"), ("s.read", "read"), ("s.a.b", "a.b"),
                         (f"s.{longest}", longest)):  # fmt: skip
        ran, result = host.native(name, {"who": name})
        assert ran.rc == 0, result
        assert echoed(result) == {"name": remote, "arguments": {"who": name}}, result
    assert (host.storage / "tool" / "s.Read.d" / "mcp").read_text() != (
        host.storage / "tool" / "s.read.d" / "mcp"
    ).read_text()


def test_descriptions_of_megabytes_and_control_characters_are_cut_and_shown_escaped(
    host: Host,
) -> None:
    """M-3, M-4, T-1 (docs/tools.md "Names (M-3)": a description is cut to 8192 characters
    with a note; "Arguments in terminal mode": ``--help`` prints it from the controls and
    starts no server): a description of 2 MB that opens with an OSC title, a clear-screen,
    a BEL, a NUL and a right-to-left override is listed escaped (no control byte reaches the
    terminal), projected with the note ``its description of N characters was cut to its
    first 8192``, installed, and shown by ``s.t --help`` escaped without a call."""
    head = "Title\x1b]0;PWNED\x07\x1b[2J\x00\u202eexe.\n"
    description = head + "y" * 2_000_000
    host.serve(tools=[{"name": "t", "description": description, "inputSchema": OPEN}])
    listed = host.ctxmcp("list", "--config", host.config, "--server", "s")
    assert listed.returncode == 0, listed
    assert listed.stdout.startswith("s.t\tTitle\\x1b]0;PWNED\\x07\\x1b[2J\\x00\\u202eexe."), listed
    assert len(listed.stdout) < 1000, len(listed.stdout)  # the first line only
    out = host.top / "out"
    projected = host.ctxmcp("project", "--config", host.config, "--runtime-config",
                            host.config, "--server", "s", "--out", out)  # fmt: skip
    assert projected.returncode == 0, projected
    note = f"ctxmcp: note: s.t: its description of {len(description)} characters was cut to "
    assert projected.stderr.startswith(note) and "first 8192" in projected.stderr, projected
    assert "\x1b" not in projected.stderr and "\x1b" not in projected.stdout
    candidate = json.loads((out / "s.t.manifest.json").read_text())
    assert candidate["description"] == description[:8192], len(candidate["description"])
    host.adopt(out, ["s.t"])

    helped = host.terminal("s.t", "--help")
    assert helped.rc == 0, helped
    assert helped.out.startswith("Title\\x1b]0;PWNED\\x07\\x1b[2J\\x00\\u202eexe.\n"), helped
    for control in ("\x1b", "\x07", "\x00", "\u202e"):
        assert control not in helped.out, helped
    assert host.calls == []  # --help starts no server
    listed = host.ctx("object", "list", "--tier", "system")
    [line] = [line for line in listed.lines() if line.startswith("s.t ")]
    assert "\x1b" not in line and "\\x1b]0;PWNED" in line, line


# ======================================================== tools that come and go


def test_tools_that_appear_and_disappear_between_listings_are_projected_as_listed_now(
    host: Host,
) -> None:
    """M-3, M-4, T-7, S-2 (docs/tools.md "Candidates of tools the server dropped"): the
    server lists ``a`` and ``b``; both are projected and installed; then it lists ``b`` and
    ``c``: ``ctxmcp list`` shows the new listing, ``project --replace`` into the same OUT
    writes ``b`` and ``c`` and leaves ``a``'s earlier candidate alone; the installed ``s.a``
    whose remote tool is gone fails with the server's refusal (EREMOTEIO, exit 1, recorded
    so in the session and the tool's log), while ``s.b`` still answers; and when ``a``
    comes back the same installed tool reaches it again."""
    host.serve(tools=[tool("a"), tool("b")])
    out = host.top / "out"
    assert host.project(out)[0].returncode == 0
    host.adopt(out, ["s.a", "s.b"])
    ran, result = host.native("s.a", {"n": 1})
    assert ran.rc == 0 and echoed(result)["name"] == "a", result

    host.serve(tools=[tool("b"), tool("c")])
    assert set(host.listing()) == {"b", "c"}
    projected, report = host.project(out, "--replace")
    assert projected.returncode == 0, projected
    assert sorted(report["written"]) == [str(out / "s.b.manifest.json"),
                                         str(out / "s.c.manifest.json")]  # fmt: skip
    assert report["replaced"] == [str(out / "s.b.manifest.json")], report
    assert (out / "s.a.manifest.json").is_file()

    ran, result = host.native("s.a", {"n": 2})
    assert ran.rc == 1 and result["status"] == "error", result
    assert result["error"]["error"] == "EREMOTEIO", result
    assert "Unknown tool: a" in result["error"]["message"], result
    said = host.terminal("s.a", '{"n": 3}')
    assert said.rc == 1 and said.err.startswith("s.a: EREMOTEIO: "), said
    assert "Unknown tool: a" in said.err and "Traceback" not in said.err, said
    ran, result = host.native("s.b", {"n": 4})
    assert ran.rc == 0 and echoed(result)["name"] == "b", result
    results = [e for e in host.events() if e["type"] == "tool_result"]
    assert [(e["object"], e["status"], e.get("errno")) for e in results] == [
        ("tool/s.a", "ok", None),
        ("tool/s.a", "error", "EREMOTEIO"),
        ("tool/s.a", "error", None),  # terminal mode: the bridge's text, no errno object
        ("tool/s.b", "ok", None),
    ], results
    logged = read_jsonl(host.storage / "tool" / "s.a.d" / "log")
    assert [e["status"] for e in logged] == ["ok", "error", "error"], logged

    host.serve(tools=[tool("a"), tool("b")])
    ran, result = host.native("s.a", {"n": 5})
    assert ran.rc == 0 and echoed(result) == {"name": "a", "arguments": {"n": 5}}, result


# ======================================================== results with odd content


def test_results_with_binary_structured_and_odd_content_are_passed_on_and_recorded_bounded(
    host: Host,
) -> None:
    """M-4, C-1, T-3, T-7, S-4 (docs/tools.md, the bridge's step 5): a tool whose listing
    gives an ``outputSchema`` is projected without it (a tool's ``schema`` is its input's
    only; no output schema, no ``program``); its result of a 512 KB base64 image, a binary
    resource blob and a caption reaches a native caller whole and a terminal as the
    caption alone; structured content that ignores the ``outputSchema`` is passed on as the
    server gave it; text items whose ``text`` is null, an object or a number, which a
    terminal caller could only be shown in a spelling the server never sent, and a result
    holding a lone surrogate are the server's EPROTO in both modes (docs/tools.md); each call
    is recorded in a line of a few hundred bytes."""
    blob = "QUJD" * 128_000  # 512 KB of base64
    out_schema = {"type": "object", "properties": {"n": {"type": "number"}}, "required": ["n"]}
    answers = {
        "pic": {"content": [{"type": "image", "data": blob, "mimeType": "image/png"},
                            {"type": "resource", "resource": {"uri": "file:///x.bin",
                                                              "blob": "AAEC",
                                                              "mimeType": "application/x"}},
                            {"type": "text", "text": "caption"}], "isError": False},
        "typed": {"content": [{"type": "text", "text": "ok"}],
                  "structuredContent": {"n": "not a number", "extra": [1, 2]},
                  "isError": False},
        "loose": {"content": [{"type": "text", "text": None}, {"type": "text", "text": {"a": 1}},
                              {"type": "text", "text": 12}], "isError": False},
        "odd": {"content": [{"type": "text", "text": "half \udc80"}], "isError": False},
    }  # fmt: skip
    host.serve(tools=[tool("pic"), tool("typed", outputSchema=out_schema), tool("loose"),
                      tool("odd")], answers=answers)  # fmt: skip
    out = host.top / "out"
    assert host.project(out)[0].returncode == 0
    candidate = json.loads((out / "s.typed.manifest.json").read_text())
    assert candidate["schema"] == OPEN and "program" not in candidate, candidate
    assert "outputSchema" not in json.dumps(candidate), candidate
    host.adopt(out, ["s.pic", "s.typed", "s.loose", "s.odd"])
    assert not (host.storage / "tool" / "s.typed.d" / "program").exists()

    ran, result = host.native("s.pic", {})
    assert ran.rc == 0 and result["output"] == answers["pic"], result["status"]
    said = host.terminal("s.pic", "{}")
    assert (said.rc, said.out) == (0, "caption\n"), said
    ran, result = host.native("s.typed", {})
    assert ran.rc == 0 and result["output"] == answers["typed"], result
    said = host.terminal("s.typed", "{}")
    assert (said.rc, said.out) == (0, "ok\n"), said
    for name, why in (("s.loose", "whose text is null, not a string"), ("s.odd", "lone surrogate")):
        ran, result = host.native(name, {})
        assert ran.rc == 1 and result["error"]["error"] == "EPROTO", result
        assert why in result["error"]["message"], result
        said = host.terminal(name, "{}")
        assert said.rc == 1 and said.err.startswith(f"{name}: EPROTO: "), said
        assert said.out == "" and "Traceback" not in said.err, said

    statuses = [(e["object"], e["status"]) for e in host.events() if e["type"] == "tool_result"]
    assert statuses == [
        *[("tool/s.pic", "ok")] * 2,
        *[("tool/s.typed", "ok")] * 2,
        *[("tool/s.loose", "error")] * 2,
        *[("tool/s.odd", "error")] * 2,
    ], statuses
    assert longest_line(host.session / "default" / "events.jsonl") < 2048
    for name in ("s.pic", "s.typed", "s.loose", "s.odd"):
        assert longest_line(host.storage / "tool" / f"{name}.d" / "log") < 2048, name
