"""End-to-end flows of MCP stdio servers that change under CortexFS (SPEC §10: M-1, M-3, M-4,
with R-3, T-1, T-7, T-8): the server's tool list changes between two projections (a tool
added, one dropped, one renamed to a name no object may have, one listed twice), tools
already installed meet a server that dropped them, answers with an error or with megabytes,
dies in the middle of a call (by an exit status, by SIGKILL, at its start) and comes back
on the next call, is slow to list its tools or to answer a call, is removed from the
configuration while its tools stay installed, and is interrupted while ``ctxmcp project``
writes its candidates.

Every server is a real process written with the ``mcp`` SDK (its low-level ``Server``),
whose behaviour is read from a state file at each request, so that a test changes what the
server lists or does between two commands without touching the configuration.  Everything
runs through the installed ``ctxmcp`` and ``ctx`` as docs/tools.md ("MCP servers as tool
sources") describes; calls run as the agent's uid through ``ctx run --agent``."""

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
    REPO,
    OnStorage,
    Run,
    kill_processes_of,
    new_scratch_dir,
    processes_of,
    read_jsonl,
    scratch_top,
    wait_for,
)
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

# A stdio server written with the MCP SDK.  argv[1] is a state file (JSON), read again at
# every request, so that what the server lists and does can change while it is installed:
#   tools       the tools it lists (name, description, inputSchema)
#   generate    {"count", "pad"}: as many more tools, each schema holding ``pad`` bytes
#   page        tools per page of tools/list (cursors are offsets)
#   list_delay  seconds it takes before it answers tools/list
#   list_exit   exit with that status when asked tools/list
#   start_exit  exit with that status at start, before it reads anything
#   calls       {tool: how}: echo (default) | exit:N | kill | sleep:S | huge:N | error
#   trace       a file each start, listing and call is appended to ({"pid", ...})
# A call of a tool it does not list now is refused as the SDK's MCPServer refuses it.
SERVER = r"""
import json, os, signal, sys

STATE = sys.argv[1]

def state():
    with open(STATE) as f:
        return json.load(f)

def note(**fact):
    path = state().get("trace")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), **fact}) + "\n")

note(started=True)
if state().get("start_exit") is not None:
    sys.stderr.write("changing: cannot load its settings\n")
    sys.stderr.flush()
    os._exit(state()["start_exit"])

import anyio
import mcp_types as types
from mcp.server.lowlevel import Server
from mcp.server.stdio import stdio_server

def listed(s):
    tools = list(s.get("tools", []))
    generate = s.get("generate")
    if generate:
        pad = "p" * generate["pad"]
        tools += [{"name": f"g{i:04d}", "description": f"generated {i}",
                   "inputSchema": {"type": "object", "description": pad}}
                  for i in range(generate["count"])]
    return tools

async def list_tools(ctx, params):
    s = state()
    note(listed=True)
    if s.get("list_delay"):
        await anyio.sleep(s["list_delay"])
    if s.get("list_exit") is not None:
        sys.stderr.write("changing: giving up its listing\n")
        sys.stderr.flush()
        os._exit(s["list_exit"])
    tools = listed(s)
    page = s.get("page") or len(tools) or 1
    start = int(params.cursor) if params is not None and params.cursor else 0
    more = str(start + page) if start + page < len(tools) else None
    chunk = [types.Tool(**tool) for tool in tools[start:start + page]]
    return types.ListToolsResult(tools=chunk, nextCursor=more)

def text(words, failed=False):
    return types.CallToolResult(content=[types.TextContent(type="text", text=words)],
                                isError=failed)

async def call_tool(ctx, params):
    s = state()
    name = params.name
    how = s.get("calls", {}).get(name, "echo")
    note(called=name, how=how)
    if name not in [tool["name"] for tool in listed(s)]:
        return text(f"Unknown tool: {name}", failed=True)
    if how == "echo":
        return text(json.dumps({"tool": name, "arguments": params.arguments}))
    if how.startswith("exit:"):
        sys.stderr.write(f"{name}: giving up\n")
        sys.stderr.flush()
        os._exit(int(how[5:]))
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how.startswith("sleep:"):
        await anyio.sleep(float(how[6:]))
        return text("slept")
    if how.startswith("huge:"):
        return text("h" * int(how[5:]))
    if how == "error":
        return text(f"{name} failed: quota exceeded", failed=True)
    return text("unknown behaviour")

server = Server("changing", on_list_tools=list_tools, on_call_tool=call_tool)

async def main():
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())

anyio.run(main)
"""

# A launcher of the kind that wraps a server: it starts a helper beside it (which inherits
# the server's standard output, as a shell's background job does) and becomes the server.
LAUNCHER = """#!/bin/sh
{python} -c 'import time; time.sleep(120)' "$0" &
exec {python} {server} {state}
"""

OPEN = {"type": "object"}


def tool(name: str, description: str = "A tool.", schema: dict | None = None) -> dict:
    return {"name": name, "description": description, "inputSchema": schema or OPEN}


# ---------------------------------------------------------------------------------- helpers


@dataclass
class Host(OnStorage):
    """A directory every uid may search: a bootstrapped storage root, ``mcp/`` (host-owned,
    holding the configuration, the server and its state, mounted read-only at the same path
    by the agent) and ``trace/``, where the servers note what they did."""

    top: Path
    storage: Path
    mcp: Path
    trace: Path
    uid: int = -1

    @property
    def config(self) -> Path:
        return self.mcp / "mcp.json"

    @property
    def state_file(self) -> Path:
        return self.mcp / "state.json"

    @property
    def notes(self) -> list[dict]:
        return read_jsonl(self.trace / "trace.jsonl")

    def starts(self) -> int:
        return sum(1 for note in self.notes if note.get("started"))

    def state(self, **state) -> None:
        """What the server lists and does from its next request on (replaced whole)."""
        state["trace"] = str(self.trace / "trace.jsonl")
        staged = self.mcp / ".state.json.new"
        staged.write_text(json.dumps(state))
        staged.chmod(0o644)
        staged.replace(self.state_file)

    def configure(self, servers: dict | None = None) -> None:
        """``mcp.json`` holding ``servers``; by default server ``ch`` running the SDK server."""
        if servers is None:
            args = [str(self.mcp / "server.py"), str(self.state_file)]
            servers = {"ch": {"command": str(PYTHON), "args": args}}
        staged = self.mcp / ".mcp.json.new"
        staged.write_text(json.dumps({"mcpServers": servers}))
        staged.chmod(0o644)
        staged.replace(self.config)

    def ctxmcp(self, *args: str | os.PathLike, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(CTXMCP), *map(str, args)], capture_output=True, text=True,
                              env=self.env, timeout=timeout)  # fmt: skip

    def project_argv(self, out: Path, *extra: str) -> list[str]:
        return [str(CTXMCP), "project", "--config", str(self.config), "--runtime-config",
                str(self.config), "--server", "ch", "--out", str(out), *extra]  # fmt: skip

    def project(self, out: Path, *extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.project_argv(out, *extra), capture_output=True, text=True,
                              env=self.env, timeout=60)  # fmt: skip

    def adopt(self, *names: str) -> None:
        """Project server ``ch``, install the candidates ``names`` in the system tier with
        their own policies allowing the label, and make agent ``coder`` holding them."""
        out = self.top / "adopted"
        projected = self.project(out, "--replace")
        assert projected.returncode in (0, 1), projected
        for name in names:
            installed = self.ctx("object", "install", out / f"{name}.manifest.json",
                                 "--tier", "system")  # fmt: skip
            assert installed.rc == 0, installed
            with (self.storage / "tool" / f"{name}.d" / "policy").open("a") as policy:
                policy.write(f"allow {LABEL} tool:{name} execute\n")
        req = {"name": "coder", "label": LABEL, "tools": list(names),
               "mount": [[str(self.mcp), str(self.mcp), "ro"]]}  # fmt: skip
        made = self.ctx("agent", "create", "-", "--json", input=json.dumps(req))
        assert made.rc == 0, made
        self.uid = made.json()["identity"]["uid"]

    def call(self, name: str, payload: dict, *opts: str) -> Run:
        return self.ctx("run", "--agent", "coder", *opts, name, json.dumps(payload))

    def native(self, name: str, payload: dict) -> tuple[Run, dict]:
        ran = self.ctx("run", "--agent", "coder", "--native", name, input=json.dumps(payload))
        frames = [json.loads(line) for line in ran.lines() if line.strip()]
        assert frames and frames[-1]["type"] == "result", ran
        return ran, frames[-1]

    def results(self, name: str) -> list[dict]:
        """The ``tool_result`` events of tool ``name`` in coder's default session."""
        session = (self.storage / "home" / str(self.uid) / "agent" / "coder" / "session" /
                   "default" / "events.jsonl")  # fmt: skip
        where = f"tool/{name}"
        return [e for e in read_jsonl(session) if e["type"] == "tool_result" and
                e["object"] == where]  # fmt: skip

    def no_server_left(self) -> bool:
        return wait_for(lambda: not processes_of(self.mcp), 10)


@pytest.fixture
def host(_template: Path) -> Iterator[Host]:
    top = new_scratch_dir(SCRATCH, "host-")
    try:
        storage = copy_of_root(_template, top / "storage")
        mcp = top / "mcp"
        mcp.mkdir(mode=0o755)
        mcp.chmod(0o755)
        (mcp / "server.py").write_text(SERVER)
        (mcp / "server.py").chmod(0o644)
        trace = top / "trace"
        trace.mkdir()
        trace.chmod(0o1777)
        (trace / "trace.jsonl").touch()
        (trace / "trace.jsonl").chmod(0o666)
        made = Host(top, storage, mcp, trace)
        made.state(tools=[tool("alpha"), tool("beta")])
        made.configure()
        yield made
    finally:
        kill_processes_of(top)
        shutil.rmtree(top, ignore_errors=True)


def hidden(out: Path) -> list[str]:
    return sorted(name for name in os.listdir(out) if name.startswith("."))


def candidate(out: Path, name: str) -> dict:
    return json.loads((out / f"{name}.manifest.json").read_text())


# ================================================ the tool list changes between projections


def test_tools_added_changed_dropped_renamed_and_doubled_between_two_projections(
    host: Host,
) -> None:
    """M-1, M-3, R-3: a second projection of a server whose list changed (a description
    changed, a tool added, one dropped, one renamed to a name with a space, one listed twice)
    refuses, without ``--replace``, naming every earlier candidate in the way and writing
    none of the new ones; with ``--replace`` it reports what it replaced and wrote, skips the
    illegal and the doubled names (exit 1) and leaves the candidates of tools the server no
    longer offers as they were, with no hidden file left in OUT."""
    out = host.top / "candidates"
    first = host.project(out, "--json")
    assert first.returncode == 0, first
    assert sorted(os.listdir(out)) == ["ch.alpha.manifest.json", "ch.beta.manifest.json"]
    beta_before = (out / "ch.beta.manifest.json").read_bytes()

    host.state(tools=[tool("alpha", "Alpha, second edition.", {"type": "object",
                                                               "required": ["q"]}),
                      tool("gamma", "New."), tool("beta two"),
                      tool("delta"), tool("delta", "Another delta.")])  # fmt: skip
    refused = host.project(out)
    assert refused.returncode == 1, refused
    assert "EEXIST" in refused.stderr and str(out / "ch.alpha.manifest.json") in refused.stderr
    assert sorted(os.listdir(out)) == ["ch.alpha.manifest.json", "ch.beta.manifest.json"]
    assert candidate(out, "ch.alpha")["description"] == "A tool."

    again = host.project(out, "--replace", "--json")
    assert again.returncode == 1, again  # tools were skipped
    report = json.loads(again.stdout)
    assert report["replaced"] == [str(out / "ch.alpha.manifest.json")], report
    assert sorted(report["written"]) == [str(out / "ch.alpha.manifest.json"),
                                         str(out / "ch.gamma.manifest.json")]  # fmt: skip
    problems = {entry["tool"]: entry["problem"] for entry in report["skipped"]}
    assert set(problems) == {"beta two", "delta"}, report
    assert "' '" in problems["beta two"] and "M-3" in problems["beta two"], problems
    assert "2 tools named 'delta'" in problems["delta"], problems
    assert candidate(out, "ch.alpha")["description"] == "Alpha, second edition."
    assert candidate(out, "ch.alpha")["schema"]["required"] == ["q"]
    assert (out / "ch.beta.manifest.json").read_bytes() == beta_before  # left alone
    assert not (out / "ch.delta.manifest.json").exists()
    assert hidden(out) == []
    assert host.no_server_left(), processes_of(host.mcp)


# ======================================================== installed tools, server changes


def test_installed_tools_meet_a_server_that_dropped_one_refuses_or_answers_megabytes(
    host: Host,
) -> None:
    """M-4, T-7: installed ``ch.alpha`` and ``ch.beta`` run; once the server no longer lists
    ``beta`` its call fails with EREMOTEIO and the server's words, exit 1, while ``alpha``
    still runs; a result marked ``isError`` is EREMOTEIO too, with the server's text and
    nothing on stdout, and a result of 2 MiB arrives whole in the native result frame.  Each
    call is one server, gone when the call ends, and each is recorded with its status."""
    host.adopt("ch.alpha", "ch.beta")
    ran = host.call("ch.beta", {"k": 1})
    assert ran.rc == 0 and json.loads(ran.out) == {"tool": "beta", "arguments": {"k": 1}}, ran

    host.state(tools=[tool("alpha")])  # beta is dropped by the server
    gone = host.call("ch.beta", {"k": 2})
    assert gone.rc == 1, gone
    assert gone.err.strip() == "ch.beta: EREMOTEIO: Unknown tool: beta", gone
    still = host.call("ch.alpha", {"k": 4})
    assert still.rc == 0 and json.loads(still.out)["tool"] == "alpha", still

    host.state(tools=[tool("alpha")], calls={"alpha": "error"})
    failed = host.call("ch.alpha", {})
    assert (failed.rc, failed.out) == (1, ""), failed
    assert failed.err.strip() == "ch.alpha: EREMOTEIO: alpha failed: quota exceeded", failed
    host.state(tools=[tool("alpha")], calls={"alpha": "huge:2097152"})
    _, frame = host.native("ch.alpha", {})
    assert frame["status"] == "ok", {k: v for k, v in frame.items() if k != "output"}
    assert frame["output"]["content"] == [{"type": "text", "text": "h" * 2097152}]

    assert [e["status"] for e in host.results("ch.beta")] == ["ok", "error"]
    assert [e["status"] for e in host.results("ch.alpha")] == ["ok", "error", "ok"]
    assert host.no_server_left(), processes_of(host.mcp)


def test_a_server_removed_from_the_configuration_fails_its_tools_until_it_returns(
    host: Host,
) -> None:
    """M-4: with ``ch.alpha`` installed, the administrator removes server ``ch`` from the
    configuration: each call fails with ENOENT naming the server and the configuration
    (exit 1) and no server starts; a configuration removed altogether is ENOENT too.  The
    tool stays listed as available meanwhile (its controls are intact; the server is the
    configuration's), and once the entry is back the tool runs again: nothing of the server
    was kept anywhere but in the configuration."""
    host.adopt("ch.alpha")
    started = host.starts()
    host.configure({"other": {"command": "/bin/false"}})
    missing = host.call("ch.alpha", {"k": 1})
    assert missing.rc == 1, missing
    assert missing.err.strip() == (
        f"ch.alpha: ENOENT: {host.config} has no server 'ch' (servers: other)"
    ), missing
    host.config.unlink()
    no_file = host.call("ch.alpha", {"k": 1})
    assert no_file.rc == 1 and no_file.err.startswith("ch.alpha: ENOENT: "), no_file
    assert str(host.config) in no_file.err, no_file
    assert host.starts() == started  # no server was started for any of them

    listed = host.ctx("object", "list", "--tier", "system", "--json")
    assert listed.rc == 0, listed
    assert {t["name"]: t["status"] for t in listed.json()}["ch.alpha"] == "available"

    host.configure()
    back = host.call("ch.alpha", {"k": 5})
    assert back.rc == 0 and json.loads(back.out)["arguments"] == {"k": 5}, back
    assert [e["status"] for e in host.results("ch.alpha")] == ["error"] * 2 + ["ok"]


def test_a_server_that_dies_mid_call_is_named_and_the_next_call_starts_it_afresh(
    host: Host,
) -> None:
    """M-4, T-7: a server that exits with a status in the middle of a call, one killed by
    SIGKILL, and one that exits at its start each fail the call with EIO, exit 1, naming how
    the server ended and the tail of its stderr; the next call starts a new server and
    runs; no server process is left behind, and every call is recorded."""
    host.adopt("ch.alpha")
    host.state(tools=[tool("alpha")], calls={"alpha": "exit:3"})
    exited = host.call("ch.alpha", {})
    assert exited.rc == 1, exited
    assert exited.err.strip() == (
        "ch.alpha: EIO: server 'ch' exited (status 3) before answering tools/call; "
        "its stderr ends: alpha: giving up"
    ), exited
    host.state(tools=[tool("alpha")], calls={"alpha": "kill"})
    _, frame = host.native("ch.alpha", {})
    assert frame["output"]["error"] == "EIO", frame
    message = frame["output"]["message"]
    assert "was killed by SIGKILL (exit status 137) before answering tools/call" in message
    host.state(tools=[tool("alpha")], start_exit=4)
    at_start = host.call("ch.alpha", {})
    assert at_start.rc == 1, at_start
    assert "EIO: server 'ch' exited (status 4) before answering initialize" in at_start.err
    assert "cannot load its settings" in at_start.err, at_start

    host.state(tools=[tool("alpha")])
    again = host.call("ch.alpha", {"after": "restart"})
    assert again.rc == 0 and json.loads(again.out)["arguments"] == {"after": "restart"}, again
    pids = [note["pid"] for note in host.notes if note.get("started")]
    assert len(pids) == len(set(pids)), pids  # one server per call
    assert [e["status"] for e in host.results("ch.alpha")] == ["error"] * 3 + ["ok"]
    assert host.no_server_left(), processes_of(host.mcp)


# ====================================================================== slow servers


def test_a_server_slow_to_list_is_cut_off_at_the_timeout_and_a_stopped_projection_makes_nothing(
    host: Host,
) -> None:
    """M-1: a server that takes a minute to answer tools/list ends ``ctxmcp list --timeout
    4`` with ETIMEDOUT naming the request, exit 1, its server stopped; ``ctxmcp project``
    stopped with SIGTERM while it waits ends by that signal, makes no OUT and takes its
    server with it."""
    host.state(tools=[tool("alpha")], list_delay=60)
    listed = host.ctxmcp("list", "--config", host.config, "--server", "ch", "--timeout", "4")
    assert listed.returncode == 1, listed
    assert listed.stderr.strip() == (
        "ctxmcp: ETIMEDOUT: server 'ch' did not answer tools/list within 4 s"
    ), listed
    assert host.no_server_left(), processes_of(host.mcp)

    out = host.top / "slow"
    listings = sum(1 for note in host.notes if note.get("listed"))
    proc = subprocess.Popen(host.project_argv(out), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=host.env)  # fmt: skip
    try:
        assert wait_for(lambda: sum(1 for n in host.notes if n.get("listed")) > listings, 20)
        proc.send_signal(signal.SIGTERM)
        _, complaint = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGTERM, complaint
    assert b"Traceback" not in complaint, complaint
    assert not out.exists()
    assert host.no_server_left(), processes_of(host.mcp)


def test_a_call_slower_than_its_timeout_is_etimedout_and_leaves_no_server(host: Host) -> None:
    """M-4, T-7: a remote tool that sleeps for a minute, called with ``--timeout 1``, ends
    with ETIMEDOUT (exit 137, the process group killed), is recorded as an error with that
    errno at stage ``run``, and its server is gone."""
    host.adopt("ch.alpha")
    host.state(tools=[tool("alpha")], calls={"alpha": "sleep:60"})
    slow = host.call("ch.alpha", {}, "--timeout", "1")
    assert slow.rc == 137, slow
    assert "ETIMEDOUT" in slow.err, slow
    [record] = host.results("ch.alpha")
    assert (record["status"], record["errno"], record["stage"]) == ("error", "ETIMEDOUT", "run")
    assert host.no_server_left(), processes_of(host.mcp)


# ======================================================================= names


def test_odd_but_legal_remote_names_are_projected_and_called_by_their_exact_name(
    host: Host,
) -> None:
    """M-3, R-3: the candidate of remote tool ``t`` is ``ch.t`` exactly, so the remote names
    ``.``, ``-x`` and ``.hidden`` give the legal object names ``ch..``, ``ch.-x`` and
    ``ch..hidden``; installed, ``ch..`` and ``ch.-x`` call the remote tool by its own name;
    names that make
    no object name (empty, ending in ``.d``, holding ``/`` or a non-ASCII letter, 65 bytes
    long) are reported and skipped, exit 1, and nothing else is written."""
    legal = [".", "-x", ".hidden"]
    illegal = ["", "x.d", "a/b", "\u00fc", "n" * 62]
    host.state(tools=[tool(name) for name in legal + illegal])
    out = host.top / "names"
    projected = host.project(out, "--json")
    assert projected.returncode == 1, projected
    report = json.loads(projected.stdout)
    assert sorted(report["written"]) == sorted(str(out / f"ch.{n}.manifest.json") for n in legal)
    assert sorted(entry["tool"] for entry in report["skipped"]) == sorted(illegal), report
    assert sorted(os.listdir(out)) == sorted(f"ch.{n}.manifest.json" for n in legal)

    called = [".", "-x"]
    host.adopt(*(f"ch.{n}" for n in called))
    for name in called:
        ran = host.call(f"ch.{name}", {"k": name})
        assert ran.rc == 0, ran
        assert json.loads(ran.out) == {"tool": name, "arguments": {"k": name}}, ran
        locator = json.loads((host.storage / "tool" / f"ch.{name}.d" / "mcp").read_text())
        assert locator == {"transport": "stdio", "config": str(host.config), "server": "ch",
                           "tool": name}  # fmt: skip


# ============================================================= what a failure leaves behind


def test_a_projection_stopped_while_it_writes_leaves_no_hidden_temporaries(host: Host) -> None:
    """M-1 (docs/tools.md "Candidates"): candidates are written "all or none", each under a
    temporary name first, and ctxmcp unwinds on SIGTERM like ^C.  Stopped by SIGTERM while
    it stages 62 large candidates, it must leave OUT with no temporary file: either nothing
    or every candidate."""
    host.state(tools=[tool("alpha"), tool("beta")], generate={"count": 60, "pad": 900000},
               page=5)  # fmt: skip
    out = host.top / "big"
    proc = subprocess.Popen(host.project_argv(out), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=host.env)  # fmt: skip

    def staging() -> bool:
        try:
            return sum(1 for n in os.listdir(out) if n.endswith(".tmp")) >= 3
        except FileNotFoundError:
            return False

    try:
        assert wait_for(lambda: staging() or proc.poll() is not None, 60, step=0.001)
        proc.send_signal(signal.SIGTERM)
        _, complaint = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == -signal.SIGTERM, complaint
    left = os.listdir(out) if out.exists() else []
    assert [name for name in left if name.startswith(".")] == [], left
    candidates = [name for name in left if name.endswith(".manifest.json")]
    assert len(candidates) in (0, 62), candidates


def launch_with_helper(host: Host) -> None:
    """Server ``ch`` started through a launcher that leaves a helper holding its output."""
    launcher = host.mcp / "launch.sh"
    launcher.write_text(LAUNCHER.format(python=PYTHON, server=host.mcp / "server.py",
                                        state=host.state_file))  # fmt: skip
    launcher.chmod(0o755)
    host.configure({"ch": {"command": str(launcher)}})


def test_ctxmcp_names_a_server_that_exited_mid_listing_while_a_helper_holds_its_output(
    host: Host,
) -> None:
    """M-1 (docs/tools.md "Exit statuses": the server "exited" and "fell silent past
    --timeout" are told apart, each with its errno and the tail of its stderr): a server
    started by a launcher that left a helper behind exits with status 5 while it lists its
    tools.  ``ctxmcp list`` must say that it exited (EIO, its status), not wait out
    ``--timeout`` and call it silent."""
    launch_with_helper(host)
    host.state(tools=[tool("alpha")], list_exit=5)
    listed = host.ctxmcp("list", "--config", host.config, "--server", "ch", "--timeout", "3")
    assert "giving up its listing" in listed.stderr, listed  # it got as far as the listing
    assert listed.returncode == 1, listed
    assert "EIO" in listed.stderr and "exited (status 5)" in listed.stderr, listed


def test_a_call_whose_server_exits_while_a_helper_holds_its_output_fails_with_eio(
    host: Host,
) -> None:
    """M-4 (docs/tools.md, the bridge's steps 4 and 5; "a server that exited" is EIO with
    its status): a server started by a launcher that left a helper behind exits with status
    7 in the middle of a call.  The call must fail with EIO naming that exit, exit 1, not
    wait until the call's timeout kills it and report a timeout."""
    host.adopt("ch.alpha")
    launch_with_helper(host)
    host.state(tools=[tool("alpha")], calls={"alpha": "exit:7"})
    ran = host.call("ch.alpha", {}, "--timeout", "3")
    assert {"called": "alpha", "how": "exit:7"}.items() <= host.notes[-1].items(), host.notes
    assert ran.rc == 1, ran
    assert "EIO" in ran.err and "exited (status 7)" in ran.err, ran
