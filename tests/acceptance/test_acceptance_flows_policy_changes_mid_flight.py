"""The host changes policy while something is in flight (SPEC P-5, P-6, T-5, T-6, F-1, W-1,
H-1, H-2, A-2, M-4; docs/tools.md "Running a tool", "Hooks (T-6)", "The agent terminal",
"MCP servers as tool sources"; docs/mount.md "What the mount promises"; docs/policy.md "What
the chain reads"): a tool switched ``disabled`` or a grant revoked while a native call waits
in the tool's pre-hook and while a worker's job sits between its claim and its run; an
agent's label, identity and status edited while its terminal (tsh) runs a long tool or waits
for the next command line; the mount of an MCP-backed tool's configuration taken out of the
agent's policy while a call of it waits on its server; the identity of an agent changed while
a process of its old uid holds a working directory and a file open in its FUSE view, and a
tool switched off while such a process stands in its control directory.

What must hold: what is already running ends as it started and is recorded whole; the next
operation meets the new policy (a FUSE view within the second it keeps its answers, the rest
at once), refused with the step or stage and the rule or control named; nothing crashes,
hangs, or keeps access it lost beyond those windows."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    QueueCLI,
    Run,
    clean_env,
    closing_all,
    ctx_run,
    kill_processes_of,
    new_scratch_dir,
    processes_of,
    read_jsonl,
    request,
    scratch_top,
    serving,
    wait_for,
    write_durably,
)
from tests.acceptance.terminalcli import AGENT_PROMPT, CoderHost, Raw, coder_host
from tests.acceptance.workercli import start_worker
from tests.support.mcp_wire import WIRE
from tests.support.users import find_or_create_user

SCRATCH = scratch_top(__file__)
AGENT, LABEL = "ci", "ci_t"  # the agent workers run as (tests/acceptance/workercli.py)
TOOL = "mid.probe"
# docs/mount.md: the mount keeps an answer half a second, the kernel half a second more.
WITHIN = 3.0

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: needs root")
needs_terminal = pytest.mark.skipif(
    shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs bubblewrap and /dev/fuse",
)
needs_fuse = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None,
    reason="needs /dev/fuse and fusermount3",
)

# The probe: with "hold": NAME in its input (native) or "hold NAME" as its argv (terminal)
# it leaves FLAGS/started-NAME and waits for FLAGS/go-NAME (or FLAGS/release, 30 s at most);
# it prints its uid and the targets of the mounts it was given.
PROBE = """\
#!/usr/bin/python3 -I
import json, os, sys, time
FLAGS = {flags!r}
hold = None
if os.environ.get("CTX_MODE") == "native":
    value = json.load(sys.stdin)
    hold = value.get("hold") if isinstance(value, dict) else None
elif sys.argv[1:2] == ["hold"]:
    hold = sys.argv[2]
if hold:
    open(os.path.join(FLAGS, "started-" + hold), "w").close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
        os.path.exists(os.path.join(FLAGS, name)) for name in ("go-" + hold, "release")
    ):
        time.sleep(0.02)
print(json.dumps({{"ran": True, "uid": os.getuid()}}))
"""

# A pre-hook that, for a call whose input or argv names "gate", leaves FLAGS/gated and waits
# for FLAGS/go-gate (or FLAGS/release, 8 s at most, well within a hook's ten seconds).
GATE = """\
#!/usr/bin/python3 -I
import json, os, sys, time
FLAGS = {flags!r}
call = json.load(sys.stdin)
if "gate" in json.dumps([call.get("input"), call.get("argv")]):
    open(os.path.join(FLAGS, "gated"), "w").close()
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and not any(
        os.path.exists(os.path.join(FLAGS, name)) for name in ("go-gate", "release")
    ):
        time.sleep(0.02)
"""


def nobody_uid() -> int:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user nobody: root's default agent user (docs/tools.md)")


def without(path: Path, rule: str) -> None:
    """Take ``rule`` out of the file ``path`` as an editor saves it: a whole new file renamed
    into place (mode 0644, root's)."""
    kept = [line for line in path.read_text().splitlines() if line.strip() != rule]
    write_durably(path.parent, path.name, "".join(line + "\n" for line in kept).encode())
    path.chmod(0o644)


def add_line(path: Path, line: str) -> None:
    with path.open("a") as out:
        out.write(line + "\n")


def replace_text(path: Path, text: str) -> None:
    write_durably(path.parent, path.name, text.encode())
    path.chmod(0o644)


# ================================================================ native calls and workers


@dataclass
class World:
    """A bootstrapped root every uid may search with agent ``ci`` (uid nobody) allowed
    :data:`TOOL` in both layers of P-6, the tool's pre-hook :data:`GATE`, the queue of project
    ``proj`` and a directory of flags every uid may write."""

    storage: Path
    top: Path
    background: list[subprocess.Popen] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    @property
    def flags(self) -> Path:
        return self.top / "flags"

    @property
    def controls(self) -> Path:
        return self.storage / "tool" / f"{TOOL}.d"

    @property
    def agent_policy(self) -> Path:
        return self.storage / "agent" / f"{AGENT}.d" / "policy"

    @property
    def queue(self) -> QueueCLI:
        return QueueCLI(self.storage, "proj")

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    def start_native(self, value: dict) -> subprocess.Popen:
        proc = subprocess.Popen(
            [*CTX_ARGV, "run", "--native", "--agent", AGENT, TOOL],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env,
        )  # fmt: skip
        self.background.append(proc)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(value).encode())
        proc.stdin.close()
        proc.stdin = None
        return proc

    def result_of(self, proc: subprocess.Popen) -> tuple[int, dict]:
        out, err = proc.communicate(timeout=60)
        frames = [json.loads(line) for line in out.decode().splitlines()]
        results = [f for f in frames if f.get("type") == "result"]
        assert len(results) == 1, (proc.returncode, out, err)
        assert b"Traceback" not in err, err
        return proc.returncode, results[0]

    def native(self, value: dict) -> tuple[int, dict]:
        return self.result_of(self.start_native(value))

    def pair(self, result: dict) -> list[str]:
        events = read_jsonl(self.storage / result["session"] / "events.jsonl")
        return [e["type"] for e in events if e.get("call") == result["call"]]

    def gated(self) -> bool:
        return (self.flags / "gated").exists()

    def started(self, hold: str) -> bool:
        return (self.flags / f"started-{hold}").exists()


@pytest.fixture
def world(searchable_storage: Path) -> Iterator[World]:
    nobody_uid()
    top = new_scratch_dir(SCRATCH, "w")
    w = World(searchable_storage, top)
    w.flags.mkdir()
    w.flags.chmod(0o777)
    manifests = top / "manifest"
    manifests.mkdir()
    (manifests / "probe.py").write_text(PROBE.format(flags=str(w.flags)))
    (manifests / "probe.py").chmod(0o755)
    document = {
        "manifest": 2, "kind": "tool", "name": TOOL, "description": "A probe.",
        "schema": {"type": "object"}, "cap": {"side_effects": False, "network": False},
        "exec": "probe.py",
    }  # fmt: skip
    (manifests / "probe.json").write_text(json.dumps(document))
    installed = w.ctx("object", "install", manifests / "probe.json", "--tier", "system")
    assert installed.rc == 0, installed
    made = w.ctx("agent", "create", "-", input=json.dumps(
        {"name": AGENT, "label": LABEL, "tools": [TOOL]}))  # fmt: skip
    assert made.rc == 0, made
    add_line(w.controls / "policy", f"allow {LABEL} tool:{TOOL} execute")
    gate = w.controls / "hooks" / "pre.d" / "10-gate"
    gate.write_text(GATE.format(flags=str(w.flags)))
    gate.chmod(0o755)
    try:
        yield w
    finally:
        (w.flags / "release").touch()
        for proc in w.background:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=15)
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        shutil.rmtree(top, ignore_errors=True)


def test_a_tool_disabled_while_a_call_waits_in_its_pre_hook(world: World):
    """T-1 (``status``), T-6, T-7: a call admitted and waiting in its pre-hook when the
    administrator writes ``disabled`` to the tool's status runs as admitted and is recorded
    as one ``tool_call``/``tool_result`` pair; the next call is refused at stage
    ``resolve`` with EACCES naming the status, its program never started; ``available``
    again, the next call runs."""
    proc = world.start_native({"gate": True, "hold": "first"})
    assert wait_for(world.gated, 20), "the pre-hook never ran"
    replace_text(world.controls / "status", "disabled\n")
    (world.flags / "go-gate").touch()
    (world.flags / "go-first").touch()
    rc, first = world.result_of(proc)
    # Admitted before the switch (stages resolve and authorize come before the hooks), it
    # runs: only a reinstall has a call admitted again (docs/tools.md "Hooks").
    assert rc == 0 and first["output"]["ran"] is True, first
    assert world.pair(first) == ["tool_call", "tool_result"], first

    rc, refused = world.native({"hold": "second"})
    error = refused["error"]
    assert rc == 1 and (error["error"], error["stage"]) == ("EACCES", "resolve"), refused
    assert "disabled" in error["message"], error
    assert refused["exit_status"] is None and not world.started("second"), refused
    assert world.pair(refused) == ["tool_call", "tool_result"]

    replace_text(world.controls / "status", "available\n")
    rc, again = world.native({})
    assert rc == 0 and again["output"]["ran"] is True, again


def test_a_grant_revoked_while_a_call_waits_in_its_pre_hook(world: World):
    """P-5, P-6, T-6: the tool's own rule revoked while a call waits in the pre-hook; the call
    runs as admitted and is recorded whole; the next call is refused at stage ``authorize``,
    step 6 named with the missing rule, and ``ctx policy explain`` agrees; the rule put back,
    the next call runs."""
    rule = f"allow {LABEL} tool:{TOOL} execute"
    proc = world.start_native({"gate": True})
    assert wait_for(world.gated, 20), "the pre-hook never ran"
    without(world.controls / "policy", rule)
    (world.flags / "go-gate").touch()
    rc, first = world.result_of(proc)
    assert rc == 0 and first["output"]["ran"] is True, first  # admitted before the revoke
    assert world.pair(first) == ["tool_call", "tool_result"], first

    rc, refused = world.native({})
    error = refused["error"]
    assert rc == 1 and (error["error"], error["stage"], error["step"]) == (
        "EACCES", "authorize", 6), refused  # fmt: skip
    assert error["step_name"] == "tool/model policy", error
    assert f"tool/{TOOL}.d/policy has no rule '{rule}'" in error["message"], error
    explained = world.ctx("policy", "explain", AGENT, f"tool:{TOOL}", "execute")
    assert explained.rc == 1 and "step 6" in explained.out, explained
    add_line(world.controls / "policy", rule)
    rc, again = world.native({})
    assert rc == 0 and again["status"] == "ok", again


def test_a_label_changed_while_a_worker_job_waits_between_claim_and_run(world: World):
    """W-1, P-5 step 5: a worker's job waits in the tool's pre-hook (claimed and leased, its
    program not started) while the agent's label is changed to one no rule names.  The worker
    neither crashes nor leaves the job claimed; the next job fails with its reason naming
    step 5 and stage ``authorize``; the label put back, a later job is done; the worker is
    still running at the end and the queue settles."""
    label = world.storage / "agent" / f"{AGENT}.d" / "label"
    gated = world.queue.publish({**request(TOOL), "input": {"gate": True}})
    proc = start_worker(world.queue, "--json")
    world.background.append(proc)
    try:
        assert wait_for(world.gated, 20), "the worker never reached the pre-hook"
        assert world.queue.state(gated) == "claimed"
        replace_text(label, "other_t\n")
        refused = world.queue.publish({**request(TOOL), "input": {}})
        (world.flags / "go-gate").touch()
        assert wait_for(lambda: world.queue.state(refused) in ("done", "failed"), 30), (
            world.queue.requests()
        )
        replace_text(label, f"{LABEL}\n")
        later = world.queue.publish({**request(TOOL), "input": {}})
        assert wait_for(lambda: world.queue.state(later) in ("done", "failed"), 30)
        assert proc.poll() is None, proc.communicate()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
    assert world.queue.state(gated) in ("done", "failed"), world.queue.requests()
    state, result = world.queue.only_result(refused)
    assert state == "failed" and result["error"]["step"] == 5, result
    assert result["reason"].startswith("EACCES: step 5 (object policy)"), result
    assert "other_t" in result["reason"] and result["reason"].endswith("[authorize]"), result
    assert world.queue.only_result(later)[0] == "done"
    world.queue.assert_settled()


# ========================================================================= the agent terminal

TERMINAL_TOOLS = ["term.probe"]


@pytest.fixture
def term_host(_template: Path) -> Iterator[tuple[CoderHost, Path]]:
    """Agent ``coder`` (uid nobody) allowed ``term.probe`` in both layers; the flags
    directory every uid may write."""
    with coder_host(_template, SCRATCH, TERMINAL_TOOLS, {}) as host:
        flags = host.top / "flags"
        flags.mkdir()
        flags.chmod(0o777)
        host.install("term.probe", PROBE.format(flags=str(flags)))
        host.grant_in_tool("term.probe")
        try:
            yield host, flags
        finally:
            (flags / "release").touch()


def attach(listening_at: Path, opened: list) -> Raw:
    typist = Raw(listening_at, b"attach\n")
    opened.append(typist)
    assert typist.shows(AGENT_PROMPT), typist.text()
    return typist


@needs_terminal
def test_a_label_changed_while_tsh_runs_a_tool_refuses_the_next_command_line(term_host):
    """H-1, H-2, P-5 step 5: while tsh runs a long tool, the agent's label is changed to one no
    rule names.  The running tool finishes and prints its answer; the next command line typed
    is refused by the host with the step and the missing rule (``tsh: term.probe: EACCES:
    step 5 …``), the terminal still answering; the label put back, the next one runs."""
    host, flags = term_host
    label = host.storage / "agent" / "coder.d" / "label"
    term = host.start()
    with closing_all() as opened:
        typist = attach(term.listening_at, opened)
        prompts = typist.count(AGENT_PROMPT)
        typist.type("term.probe hold long")
        assert wait_for(lambda: (flags / "started-long").exists(), 20), typist.text()[-500:]
        replace_text(label, "other_t\n")
        (flags / "go-long").touch()
        assert typist.shows(AGENT_PROMPT, prompts + 1), typist.text()[-500:]
        assert '"ran": true' in typist.text().split(AGENT_PROMPT)[prompts], typist.text()

        shown = typist.answer("term.probe")
        assert shown == (
            "tsh: term.probe: EACCES: step 5 (object policy): agent/coder.d/policy has no rule "
            "'allow other_t tool:term.probe execute'\n"
        ), shown
        replace_text(label, "coder_t\n")
        assert '"ran": true' in typist.answer("term.probe")
    results = [e for e in host.calls(term.session, "term.probe") if e["type"] == "tool_result"]
    assert [(e["status"], e.get("step")) for e in results] == [
        ("ok", None), ("error", 5), ("ok", None)], results  # fmt: skip


@needs_terminal
def test_an_identity_changed_under_a_running_terminal_refuses_its_next_command_line(term_host):
    """H-2, A-2, P-5 step 1 (docs/tools.md "the run socket": the peer's uid must be the
    agent's): the agent's identity is moved to another uid while its terminal waits at the
    prompt.  tsh still runs as the uid it started with, so its next command line is no longer
    the agent's: it is refused (exit status 126, the reason naming step 1 or the identity)
    rather than run with the old uid, and the terminal neither hangs nor dies; ``ctx agent
    stop`` still stops it."""
    host, _flags = term_host
    user = find_or_create_user()
    identity = host.storage / "agent" / "coder.d" / "identity"
    term = host.start()
    with closing_all() as opened:
        typist = attach(term.listening_at, opened)
        assert f'"uid": {nobody_uid()}' in typist.answer("term.probe")
        replace_text(identity, json.dumps({"uid": user.uid, "gid": user.gid, "groups": []}))
        shown = typist.answer("term.probe")
        assert '"ran": true' not in shown, shown
        assert shown.startswith("tsh: term.probe: EACCES: "), shown
        assert typist.answer("help") != ""
    stopped = host.ctx("agent", "stop", "coder", "--session", term.session)
    assert stopped.rc == 0, stopped
    host.started.remove(term.session)


@needs_terminal
def test_a_pinned_tool_disabled_under_a_running_terminal(term_host):
    """H-4, T-1 (``status``), T-5: a tool tsh has pinned, switched ``disabled`` while the
    terminal runs, leaves ``tools`` and ``which`` within the view's second without a
    ``rehash``, and typing it runs nothing; ``available`` again, it is found and runs with no
    ``rehash`` either."""
    host, _flags = term_host
    status = host.storage / "tool" / "term.probe.d" / "status"
    term = host.start()
    with closing_all() as opened:
        typist = attach(term.listening_at, opened)
        assert typist.answer("pin term.probe").startswith("term.probe: ")
        assert '"ran": true' in typist.answer("term.probe")
        replace_text(status, "disabled\n")

        def gone() -> bool:
            return "term.probe" not in typist.answer("tools").splitlines() and (
                typist.answer("which term.probe") == "tsh: term.probe: not on CTX_PATH\n"
            )

        assert wait_for(gone, 10, step=0.2), typist.text()[-500:]
        shown = typist.answer("term.probe")
        assert '"ran"' not in shown and shown.startswith("tsh: term.probe: "), shown
        replace_text(status, "available\n")

        def back() -> bool:
            return typist.answer("which term.probe") == "/ctx/tool/term.probe\n"

        assert wait_for(back, 10, step=0.2), typist.text()[-500:]
        assert '"ran": true' in typist.answer("term.probe")
    results = [e for e in host.calls(term.session, "term.probe") if e["type"] == "tool_result"]
    assert results[0]["status"] == "ok" and results[-1]["status"] == "ok", results
    assert all(e["status"] == "error" for e in results[1:-1]), results


# ================================================================================ MCP-backed

MCP_SERVER = (
    WIRE
    + r"""
STATE = sys.argv[1]
while True:
    message = receive()
    method, ident = message.get("method"), message.get("id")
    if ident is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "mf", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": [
            {"name": "echo", "description": "Echo.", "inputSchema": {"type": "object"}}]}})
    elif method == "tools/call":
        arguments = message["params"].get("arguments") or {}
        hold = arguments.get("hold")
        if hold:
            flags = json.load(open(STATE))["flags"]
            open(os.path.join(flags, "started-" + hold), "w").close()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any(
                os.path.exists(os.path.join(flags, n)) for n in ("go-" + hold, "release")
            ):
                time.sleep(0.02)
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "content": [{"type": "text", "text": "echoed " + json.dumps(arguments)}],
            "isError": False}})
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no"}})
"""
)


@pytest.fixture
def mcp_host(searchable_storage: Path) -> Iterator[tuple[World, Path]]:
    """Server ``mf``'s tool ``echo`` projected and installed as ``mf.echo``, allowed to agent
    ``coder`` in both layers; its configuration in ``mcp/`` (host-owned, mounted read-only
    by the agent at the same path)."""
    top = new_scratch_dir(SCRATCH, "mcp")
    w = World(searchable_storage, top)
    w.flags.mkdir()
    w.flags.chmod(0o777)
    mcp = top / "mcp"
    mcp.mkdir(mode=0o755)
    mcp.chmod(0o755)
    (mcp / "server.py").write_text(MCP_SERVER)
    (mcp / "state.json").write_text(json.dumps({"flags": str(w.flags)}))
    python = REPO / ".venv" / "bin" / "python"
    config = {
        "mcpServers": {
            "mf": {
                "command": str(python),
                "args": [str(mcp / "server.py"), str(mcp / "state.json")],
            }
        }
    }
    (mcp / "mcp.json").write_text(json.dumps(config))
    for name in ("server.py", "state.json", "mcp.json"):
        (mcp / name).chmod(0o644)
    out = top / "out"
    projected = subprocess.run(
        [str(REPO / ".venv" / "bin" / "ctxmcp"), "project", "--config", str(mcp / "mcp.json"),
         "--runtime-config", str(mcp / "mcp.json"), "--server", "mf", "--out", str(out)],
        capture_output=True, text=True, env=w.env, timeout=60,
    )  # fmt: skip
    assert projected.returncode == 0, projected
    installed = w.ctx("object", "install", out / "mf.echo.manifest.json", "--tier", "system")
    assert installed.rc == 0, installed
    add_line(w.storage / "tool" / "mf.echo.d" / "policy", "allow coder_t tool:mf.echo execute")
    req = {"name": "coder", "label": "coder_t", "tools": ["mf.echo"],
           "mount": [[str(mcp), str(mcp), "ro"]]}  # fmt: skip
    made = w.ctx("agent", "create", "-", input=json.dumps(req))
    assert made.rc == 0, made
    try:
        yield w, mcp
    finally:
        (w.flags / "release").touch()
        for proc in w.background:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=15)
        kill_processes_of(top)
        shutil.rmtree(top, ignore_errors=True)


def mcp_native(w: World, value: dict) -> subprocess.Popen:
    proc = subprocess.Popen(
        [*CTX_ARGV, "run", "--native", "--agent", "coder", "mf.echo"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=w.env,
    )  # fmt: skip
    w.background.append(proc)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(value).encode())
    proc.stdin.close()
    proc.stdin = None
    return proc


def test_an_mcp_call_in_flight_when_its_configurations_mount_is_revoked(mcp_host):
    """M-4, P-5 step 5 (a mount the policy does not grant is not given to the tool), docs
    "MCP servers as tool sources" step 3: while a call of ``mf.echo`` waits on its server,
    ``mount:mcp read`` is taken out of the agent's policy.  The call in flight gets its
    answer; the next call is refused with EACCES before any server starts (the configuration
    is outside the agent's view), naming the configuration; no server process is left; the
    rule put back, the next call is answered again; the tool switched ``disabled``, the next
    call is refused at stage ``resolve`` with no server started."""
    w, mcp = mcp_host
    policy = w.storage / "agent" / "coder.d" / "policy"
    rule = "allow coder_t mount:mcp read"
    assert rule in policy.read_text().splitlines(), policy.read_text()
    proc = mcp_native(w, {"hold": "m"})
    assert wait_for(lambda: w.started("m"), 30), "the server never got the call"
    without(policy, rule)
    (w.flags / "go-m").touch()
    rc, first = w.result_of(proc)
    assert rc == 0 and "echoed" in json.dumps(first["output"]), first

    rc, refused = w.result_of(mcp_native(w, {"hold": "n"}))
    assert rc == 1 and refused["status"] == "error", refused
    assert refused["error"]["error"] == "EACCES", refused
    assert str(mcp / "mcp.json") in refused["error"]["message"], refused
    assert not w.started("n"), "a server was given a call the agent may no longer make"
    assert wait_for(lambda: not processes_of(mcp), 10), processes_of(mcp)

    add_line(policy, rule)
    rc, again = w.result_of(mcp_native(w, {}))
    assert rc == 0 and "echoed" in json.dumps(again["output"]), again

    # Switched off, the tool is refused at stage resolve before any server starts.
    replace_text(w.storage / "tool" / "mf.echo.d" / "status", "disabled\n")
    rc, off = w.result_of(mcp_native(w, {"hold": "o"}))
    assert rc == 1 and (off["error"]["error"], off["error"]["stage"]) == ("EACCES", "resolve")
    assert not w.started("o") and off["exit_status"] is None, off


# ================================================================================ the FUSE view

# A program of one uid, driven line by line on its stdin: each line a JSON list [verb, *args],
# each answer a JSON line (the value, or the errno's name).
DRIVER = r"""
import errno, json, os, sys
held = {}
for line in sys.stdin:
    verb, *args = json.loads(line)
    try:
        if verb == "chdir":
            os.chdir(args[0]); answer = True
        elif verb == "open":
            held[args[0]] = os.open(args[1], os.O_RDONLY); answer = True
        elif verb == "pread":
            answer = os.pread(held[args[0]], 4096, 0).decode()
        elif verb == "fstat":
            answer = os.fstat(held[args[0]]).st_size
        elif verb == "read":
            with open(args[0]) as f:
                answer = f.read()
        elif verb == "listdir":
            answer = sorted(os.listdir(args[0]))
        else:
            answer = "unknown verb"
    except OSError as exc:
        answer = errno.errorcode.get(exc.errno, str(exc.errno))
    print(json.dumps(answer), flush=True)
"""


class Driver:
    def __init__(self, uid: int, gid: int, groups: list[int]) -> None:
        self.proc = subprocess.Popen(
            ["/usr/bin/python3", "-I", "-c", DRIVER], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, user=uid, group=gid, extra_groups=groups,
            cwd="/",
        )  # fmt: skip

    def __call__(self, *words):
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps([str(w) for w in words]) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def view_world(_template: Path) -> Iterator[tuple[Path, Path, object]]:
    """A root with space ``team`` (the test user's group) that agent ``coder``, running as the
    test user, may read and write, and an installed tool ``view.tool`` both policies allow."""
    user = find_or_create_user()
    top = new_scratch_dir(SCRATCH, "v")
    storage = top / "storage"
    shutil.copytree(_template, storage, symlinks=True)
    env = clean_env(CTX_STORAGE=str(storage))
    r = ctx_run("shared", "create", "team", "--group", str(user.gid), env=env)
    assert r.rc == 0, r
    src = top / "src"
    src.mkdir()
    (src / "t.sh").write_text("#!/bin/sh\necho hi\n")
    (src / "t.json").write_text(json.dumps({
        "manifest": 2, "kind": "tool", "name": "view.tool", "description": "Shown.",
        "schema": {"type": "object"}, "cap": {"side_effects": False, "network": False},
        "exec": "t.sh"}))  # fmt: skip
    r = ctx_run("object", "install", src / "t.json", "--tier", "system", env=env)
    assert r.rc == 0, r
    add_line(storage / "tool" / "view.tool.d" / "policy", "allow coder_t tool:view.tool execute")
    req = {"name": "coder", "label": "coder_t", "tools": ["view.tool"],
           "shared": {"team": ["read", "write"]}}  # fmt: skip
    r = ctx_run("agent", "create", "--user", user.name, "-", input=json.dumps(req), env=env)
    assert r.rc == 0, r
    try:
        yield top, storage, user
    finally:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            where = line.split()[4]
            if where.startswith(str(top) + "/"):
                subprocess.run(["umount", "-l", where], check=False)
        shutil.rmtree(top, ignore_errors=True)


@needs_fuse
def test_an_identity_moved_out_of_the_group_hides_the_space_under_a_working_directory(
    view_world,
):
    """F-1, X-1, P-5 step 2, docs/mount.md "Open files": a process of the test user stands in
    ``shared/team/data`` of the view ``ctx mount --as coder`` (coder runs as that user, a
    member of the space's group) with a file open when the agent's identity is moved to
    another uid outside the group.  The view follows the agent's identity: within its second
    the space is hidden from it (root, who mounted it, lists the agent's view without it), and
    the process, no longer of the agent's uid, is refused by full path, relative to its working
    directory and in the directory it stands in (EACCES, P-5 step 1: the view serves its
    agent's uid); the descriptor it opened before goes on reading; the identity put back, it
    opens again."""
    top, storage, user = view_world
    data_disk = storage / "shared" / "team" / "data"
    (data_disk / "spec").write_text("the spec\n")
    os.chown(data_disk / "spec", 0, user.gid)
    (data_disk / "spec").chmod(0o664)
    identity = storage / "agent" / "coder.d" / "identity"
    original = identity.read_text()
    view = top / "view"
    view.mkdir(mode=0o755)
    data = view / "shared" / "team" / "data"
    prog = Driver(user.uid, user.gid, [user.gid])
    try:
        with serving(storage, view, "--as", "coder"):
            assert prog("chdir", data) is True
            assert prog("open", "r", "spec") is True
            assert prog("read", "spec") == "the spec\n"
            nobody = pwd.getpwuid(nobody_uid())
            moved = {"uid": nobody.pw_uid, "gid": nobody.pw_gid, "groups": []}
            replace_text(identity, json.dumps(moved))

            assert wait_for(lambda: prog("read", data / "spec") == "EACCES", WITHIN)
            assert wait_for(lambda: prog("read", "spec") == "EACCES", WITHIN)
            assert prog("listdir", ".") == "EACCES"
            assert wait_for(lambda: "team" not in os.listdir(view / "shared"), WITHIN)
            # Past the second the mount and the kernel keep the file's attributes: a read then
            # asks for them again (getattr), in the reader's name.
            time.sleep(1.1)
            assert prog("pread", "r") == "the spec\n"
            assert prog("fstat", "r") == len("the spec\n")

            replace_text(identity, original)
            assert wait_for(lambda: prog("read", "spec") == "the spec\n", WITHIN)
            prog.close()  # its working directory would keep the mount busy
    finally:
        prog.close()


@needs_fuse
def test_a_tool_disabled_while_a_process_stands_in_its_control_directory(view_world):
    """F-1, T-5, T-1 (``status``): a process of the agent's uid has its working directory in
    ``tool/view.tool.d`` of the agent's view and reads ``description`` there.  Once the tool
    is switched ``disabled``, within the view's second the tool leaves the listing and the
    next read of ``description`` — by full path and relative to the working directory — is
    ENOENT; switched back, it reads again."""
    top, storage, user = view_world
    status = storage / "tool" / "view.tool.d" / "status"
    view = top / "view"
    view.mkdir(mode=0o755)
    controls = view / "tool" / "view.tool.d"
    prog = Driver(user.uid, user.gid, [user.gid])
    try:
        with serving(storage, view, "--as", "coder"):
            assert wait_for(lambda: "view.tool" in prog("listdir", view / "tool"), WITHIN)
            assert prog("chdir", controls) is True
            assert prog("read", "description") == "Shown.\n"
            replace_text(status, "disabled\n")
            assert wait_for(lambda: "view.tool" not in prog("listdir", view / "tool"), WITHIN)
            assert wait_for(lambda: prog("read", controls / "description") == "ENOENT", WITHIN)
            assert wait_for(lambda: prog("read", "description") == "ENOENT", WITHIN)
            replace_text(status, "available\n")
            assert wait_for(lambda: prog("read", "description") == "Shown.\n", WITHIN)
            prog.close()  # its working directory would keep the mount busy
    finally:
        prog.close()
