"""Acceptance tests of the authority chain of §5 (P-4 … P-7) and of tools as files (§6: T-1 …
T-3, T-5 … T-8), seen through the installed ``ctx``: tools installed from v2 manifests, run as
an agent with ``ctx run`` in both modes, their controls, hooks and logs on disk.  The policy
CLI of P-8 and the edge cases of ``ctx run`` live in test_acceptance_policy_cli.py and
test_acceptance_tools_edges.py."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import CTX_ARGV, OnStorage, Run, clean_env, ctx_run, snapshot
from tests.support.users import run_as
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs tools as another uid")

LABEL = "coder_t"
AGENT_UID = "65534"  # root's default agent user, nobody (docs/tools.md, "Agents, host side")

# A tool that leaves a trace of each run in its working directory (the agent's /workspace)
# and prints its argv and stdin back as one JSON object.
ECHO = """\
#!/bin/sh
echo "$CTX_TOOL" >> ran
python3 -c '
import json, sys
print(json.dumps({"argv": sys.argv[1:], "stdin": sys.stdin.read()}))
' "$@"
"""


@dataclass
class World(OnStorage):
    """A storage root every uid may search, a workspace the agent ``coder`` may write (mounted
    at /workspace) and that agent, whose policy grants the tools named when it was made."""

    top: Path
    storage: Path
    workspace: Path

    def manifest(self, name: str, program: str = ECHO, /, **fields) -> Path:
        """A v2 manifest of ``name`` (T-8) whose ``exec`` is ``program``; ``fields`` override."""
        program_path = self.top / f"{name}.sh"
        program_path.write_text(program)
        document = {
            "manifest": 2,
            "kind": "tool",
            "name": name,
            "description": f"The {name} test tool.",
            "schema": {"type": "object"},
            "cap": {"side_effects": False, "network": False},
            "exec": str(program_path),
        }
        document.update(fields)
        path = self.top / f"{name}.json"
        path.write_text(json.dumps(document))
        return path

    def install(self, name: str, program: str = ECHO, /, tier: str = "system", **fields) -> Path:
        r = self.ctx("object", "install", self.manifest(name, program, **fields), "--tier", tier)
        assert r.rc == 0, r
        return self.tier_dir(tier) / name

    def tier_dir(self, tier: str) -> Path:
        if tier == "system":
            return self.storage / "tool"
        if tier == "user":
            return self.storage / "home" / str(os.getuid()) / "tool"
        return self.storage / "shared" / tier.removeprefix("shared:") / "tool"

    def allow_in_tool(self, name: str, label: str = LABEL) -> None:
        """The tool's own half of P-6."""
        with (self.storage / "tool" / f"{name}.d" / "policy").open("a") as policy:
            policy.write(f"allow {label} tool:{name} execute\n")

    def agent_policy(self) -> Path:
        return self.storage / "agent" / "coder.d" / "policy"

    def allow_in_agent(self, rule: str) -> None:
        with self.agent_policy().open("a") as policy:
            policy.write(rule + "\n")

    def drop_from_agent(self, rule: str) -> None:
        text = self.agent_policy().read_text()
        assert rule in text
        self.agent_policy().write_text(text.replace(rule + "\n", ""))

    def run(self, tool: str, *argv: str, input: str = "", agent: str = "coder") -> Run:
        return self.ctx("run", "--agent", agent, tool, *argv, input=input)

    def native(self, tool: str, value=None, agent: str = "coder", **kw) -> tuple[Run, list]:
        text = json.dumps({} if value is None else value)
        r = self.ctx("run", "--native", "--agent", agent, *kw.get("options", ()), tool,
                     input=text)  # fmt: skip
        return r, [json.loads(line) for line in r.lines()]

    def ran(self) -> list[str]:
        """The tools that ran, in order (each ECHO tool appends its name)."""
        marker = self.workspace / "ran"
        return marker.read_text().split() if marker.exists() else []

    def events(self, session: str = "default") -> list[dict]:
        path = self.session_dir(session) / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    def session_dir(self, session: str = "default") -> Path:
        return self.storage / "home" / AGENT_UID / "agent" / "coder" / "session" / session


def make_world(tools: list[str]) -> World:
    """A new storage root, made with ``ctx bootstrap`` and ``ctx agent create``."""
    top = Path(tempfile.mkdtemp(prefix="cortexfs-chain-", dir="/tmp"))
    top.chmod(0o755)
    workspace = top / "ws"
    workspace.mkdir()
    workspace.chmod(0o777)
    world = World(top, top / "storage", workspace)
    assert ctx_run("bootstrap", "--storage", world.storage).rc == 0
    request = {"name": "coder", "label": LABEL, "tools": tools,
               "mount": [[str(workspace), "/workspace", "rw"]]}  # fmt: skip
    (top / "coder.json").write_text(json.dumps(request))
    r = world.ctx("agent", "create", top / "coder.json")
    assert r.rc == 0, r
    return world


def clone(template: World, top: Path | None = None) -> World:
    """A copy of ``template`` in a place of its own (``top``, else a new directory).  The
    agent's mount control names the storage root and the workspace by their real paths, so
    the copy's are written in."""
    if top is None:
        top = Path(tempfile.mkdtemp(prefix="cortexfs-chain-", dir="/tmp"))
    top.chmod(0o755)
    shutil.copytree(template.top, top, symlinks=True, dirs_exist_ok=True)
    world = World(top, top / "storage", top / "ws")
    mount = world.storage / "agent" / "coder.d" / "mount"
    moved = [
        [str(top / Path(source).relative_to(template.top)), target, mode]
        for source, target, mode in json.loads(mount.read_text())
    ]
    mount.write_text(json.dumps(moved))
    return world


@pytest.fixture(scope="session")
def _chain_template() -> Iterator[World]:
    """The agent ``coder`` whose policy grants demo.echo and fs.read, and demo.echo
    installed with its own policy granting it too: a call every step of the chain lets
    through.  Made once per test process; each test gets a copy."""
    template = make_world(["demo.echo", "fs.read"])
    try:
        template.install("demo.echo")
        template.allow_in_tool("demo.echo")
        yield template
    finally:
        shutil.rmtree(template.top)


@pytest.fixture
def manifests(tmp_path: Path) -> World:
    """A place for manifests and nothing else (``ctx object check`` needs no storage root)."""
    return World(tmp_path, tmp_path / "no-storage", tmp_path / "no-workspace")


@pytest.fixture
def world(_chain_template: World) -> Iterator[World]:
    world = clone(_chain_template)
    try:
        yield world
    finally:
        shutil.rmtree(world.top)


def result_frame(frames: list[dict]) -> dict:
    assert frames and frames[-1]["type"] == "result", frames
    return frames[-1]


def denied(r: Run, frames: list[dict]) -> dict:
    """The error of a refused native call, checked to be a refusal."""
    result = result_frame(frames)
    assert r.rc == 1 and result["status"] == "error", r
    assert result["exit_status"] is None, result
    return result["error"]


# ------------------------------------------------------------------ P-4: missing objects


def test_p4_a_missing_tool_is_enoent_or_eacces_in_both_modes(world):
    """P-4: "a missing object → ENOENT or EACCES", whichever mode asks."""
    r = world.run("demo.ghost")
    assert r.rc != 0, r
    assert "ENOENT" in r.err or "EACCES" in r.err, r
    r, frames = world.native("demo.ghost")
    assert denied(r, frames)["error"] in ("ENOENT", "EACCES")
    assert world.ran() == []


def test_p4_a_missing_agent_is_enoent_or_eacces(world):
    """P-4: the agent is an object of the request too; one that does not exist denies."""
    r = world.run("demo.echo", agent="ghost")
    assert r.rc != 0, r
    assert "ENOENT" in r.err or "EACCES" in r.err, r
    r, frames = world.native("demo.echo", agent="ghost")
    assert denied(r, frames)["error"] in ("ENOENT", "EACCES")
    assert world.ran() == []


@pytest.mark.parametrize(
    ("obj", "perm"),
    [
        ("tool:demo.ghost", "execute"),
        ("model:nobody/nothing", "use"),
        ("shared:no-such-space", "read"),
        ("agent:ghost", "start"),
        ("session:no-such-session", "read"),
    ],
)
def test_p4_a_missing_object_of_any_class_is_denied_with_enoent_or_eacces(world, obj, perm):
    """P-4: whatever the class, a missing object is denied with ENOENT or EACCES, never
    allowed — even when both policies name it."""
    cls = obj.split(":")[0]
    world.allow_in_agent(f"allow {LABEL} {obj} {perm}")
    where = ("--location", f"home/{AGENT_UID}/agent/coder/session") if cls == "session" else ()
    r = world.ctx("policy", "explain", "coder", obj, perm, *where, "--json")
    assert r.rc == 1, r
    answer = r.json()
    assert answer["allowed"] is False
    assert answer["errno"] in ("ENOENT", "EACCES", 2, 13), answer


@pytest.mark.parametrize(
    ("obj", "perm"), [("gadget:x", "execute"), ("tool:demo.echo", "fly"), ("tool:demo.echo", "use")]
)
def test_p4_an_unknown_class_or_permission_is_einval_not_a_decision(world, obj, perm):
    """P-4: unknown class → EINVAL; unknown permission → EINVAL — for a request against the
    storage root as for a policy file."""
    r = world.ctx("policy", "explain", "coder", obj, perm)
    assert r.rc == 2 and "EINVAL" in r.err, r


class Listener:
    """A TCP listener on the host's loopback, counting the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


CONNECT = """\
#!/bin/sh
python3 -c '
import json, socket, sys
request = json.load(sys.stdin)
port = request.get("input", request)["port"]  # a hook reads the call, the tool its input
try:
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    print(json.dumps({"connected": True}))
except OSError as error:
    print(json.dumps({"connected": False, "error": str(error)}))
'
"""


def test_p4_without_network_default_connect_there_is_no_network(world):
    """P-4: "without allow X network:default connect there is no network access" — not even
    the host's loopback, in either mode, for the tool or its hooks, whatever its ``cap``
    declares (T-8: cap declares facts); with the rule in the agent's policy the same tool
    connects."""
    world.install("demo.connect", CONNECT, cap={"side_effects": False, "network": True})
    world.allow_in_tool("demo.connect")
    world.allow_in_agent(f"allow {LABEL} tool:demo.connect execute")
    listener = Listener()
    try:
        r, frames = world.native("demo.connect", {"port": listener.port})
        assert r.rc == 0, r
        assert result_frame(frames)["output"]["connected"] is False, frames
        assert listener.accepted == 0

        terminal = world.run("demo.connect", input=json.dumps({"port": listener.port}))
        assert json.loads(terminal.out)["connected"] is False, terminal
        writes_a_file = CONNECT.replace("print(", 'open("hook-net", "w").write(')
        hook(world, "demo.connect", "pre", "10-connect", writes_a_file.split("\n", 1)[1])
        r, frames = world.native("demo.connect", {"port": listener.port})
        assert json.loads((world.workspace / "hook-net").read_text())["connected"] is False
        assert listener.accepted == 0

        world.allow_in_agent(f"allow {LABEL} network:default connect")
        r, frames = world.native("demo.connect", {"port": listener.port})
        assert r.rc == 0, r
        assert result_frame(frames)["output"]["connected"] is True, frames
    finally:
        listener.close()


def test_p4_network_default_is_decided_by_the_agent_policy(world):
    """P-4, P-5: ``network:default connect`` is denied until the agent's policy allows it."""
    r = world.ctx("policy", "explain", "coder", "network:default", "connect", "--json")
    assert r.rc == 1 and r.json()["allowed"] is False, r
    world.allow_in_agent(f"allow {LABEL} network:default connect")
    r = world.ctx("policy", "explain", "coder", "network:default", "connect", "--json")
    assert r.rc == 0 and r.json()["allowed"] is True, r


# ------------------------------------------------------------------ P-5: the order of the steps


def break_step(world: World, step: int) -> None:
    """Make step ``step`` of P-5 deny the call of demo.echo, and no other step."""
    tool = world.storage / "tool" / "demo.echo"
    if step == 1:  # exec uid/gid: an agent whose identity is root's is no agent identity
        identity = world.storage / "agent" / "coder.d" / "identity"
        identity.write_text(json.dumps({"uid": 0, "gid": 0, "groups": []}))
    elif step == 2:  # mode bits: only root may execute it
        tool.chmod(0o700)
    elif step == 3:  # visibility: the agent's mount table no longer holds the storage root
        mount = world.storage / "agent" / "coder.d" / "mount"
        mount.write_text(json.dumps([[str(world.workspace), "/workspace", "rw"]]))
    elif step == 4:  # agent label: not a subject type
        (world.storage / "agent" / "coder.d" / "label").write_text("not a label!\n")
    elif step == 5:  # object policy: the agent's policy lacks the rule
        world.drop_from_agent(f"allow {LABEL} tool:demo.echo execute")
    elif step == 6:  # tool policy: the tool's own policy lacks the rule
        policy = world.storage / "tool" / "demo.echo.d" / "policy"
        policy.write_text(policy.read_text().replace(f"allow {LABEL} tool:demo.echo execute\n", ""))


@pytest.mark.parametrize("step", [1, 2, 3, 4, 5, 6])
def test_p5_each_step_alone_denies_and_the_decision_names_it(world, step):
    """P-5: "any denial denies, and the decision records which step denied" — in the result
    of the call and in ``ctx policy explain``; the tool never runs."""
    break_step(world, step)
    r, frames = world.native("demo.echo")
    error = denied(r, frames)
    assert error["step"] == step, error
    assert error["error"] in ("EACCES", "ENOENT"), error
    assert f"step {step}" in error["message"], error
    assert world.ran() == []
    terminal = world.run("demo.echo")
    assert terminal.rc != 0 and f"step {step}" in terminal.err, terminal
    r = world.ctx("policy", "explain", "coder", "tool:demo.echo", "execute", "--json")
    assert r.rc == 1, r
    assert r.json()["step"] == step, r


@pytest.mark.parametrize("first", [1, 2, 3, 4, 5])
def test_p5_when_several_steps_would_deny_the_earliest_is_named(world, first):
    """P-5: the steps run in the order 1 … 6; with every step from ``first`` on broken, the
    decision names ``first``."""
    for step in range(first, 7):
        break_step(world, step)
    r, frames = world.native("demo.echo")
    assert denied(r, frames)["step"] == first
    r = world.ctx("policy", "explain", "coder", "tool:demo.echo", "execute", "--json")
    assert (r.rc, r.json()["step"]) == (1, first), r


def test_p5_the_caller_is_checked_first(world):
    """P-5 step 1: the explained request of a process with other credentials than the agent's
    is denied at step 1, whatever the later steps would say."""
    for step in (2, 5, 6):
        break_step(world, step)
    r = world.ctx("policy", "explain", "coder", "tool:demo.echo", "execute",
                  "--peer", "4321:4321", "--json")  # fmt: skip
    assert (r.rc, r.json()["step"]) == (1, 1), r


def test_p5_a_caller_that_is_not_the_host_cannot_run_as_the_agent(world, unprivileged_user):
    """P-5 step 1 (peer credentials or exec uid/gid): a process of another uid asking to
    run a tool as the agent is denied at step 1 (docs/tools.md: only the host administrator,
    root or the storage root's owner, may), and the tool never runs."""
    r = run_as(unprivileged_user, [*CTX_ARGV, "run", "--native", "--agent", "coder", "demo.echo"],
               env=world.env, stdin="{}")  # fmt: skip
    frames = [json.loads(line) for line in r.stdout.splitlines()]
    error = denied(Run([], r.returncode, "", ""), frames)
    assert (error["error"], error["step"]) == ("EACCES", 1), error
    assert world.ran() == []


def test_p5_the_tool_runs_with_exactly_the_agents_uid_gid_and_groups(world):
    """P-5 step 1 "exec uid/gid": the tool process has the agent's identity, so the kernel
    judges what it touches by the agent's uid, gid and groups (T-5), never the host's."""
    identity = json.loads((world.storage / "agent" / "coder.d" / "identity").read_text())
    world.install("demo.id", "#!/bin/sh\nid -u; id -g; id -G\n")
    world.allow_in_tool("demo.id")
    world.allow_in_agent(f"allow {LABEL} tool:demo.id execute")
    r = world.run("demo.id")
    assert r.rc == 0, r
    uid, gid, groups = r.lines()
    assert (int(uid), int(gid)) == (identity["uid"], identity["gid"]), r
    assert {int(g) for g in groups.split()} <= {identity["gid"], *identity["groups"]}, r


def test_p5_a_denied_call_is_recorded_with_its_step(world):
    """P-5, T-7: the decision, with its denying step, is what the session records."""
    break_step(world, 6)
    _, frames = world.native("demo.echo")
    call = result_frame(frames)["call"]
    [event] = [e for e in world.events() if e.get("call") == call and e["type"] == "tool_result"]
    assert event["status"] == "error"
    assert "step 6" in json.dumps(event), event


# ------------------------------------------------------------------ P-6: two layers


@pytest.mark.parametrize(
    ("in_agent", "in_tool"), [(True, True), (True, False), (False, True), (False, False)]
)
def test_p6_a_tool_runs_only_when_agent_and_tool_policy_both_allow(world, in_agent, in_tool):
    """P-6: both ``agent/<name>.d/policy`` and ``tool/<name>.d/policy`` must hold the rule;
    otherwise EACCES, in terminal and native mode alike."""
    if not in_agent:
        break_step(world, 5)
    if not in_tool:
        break_step(world, 6)
    terminal = world.run("demo.echo")
    r, frames = world.native("demo.echo")
    if in_agent and in_tool:
        assert terminal.rc == 0 and r.rc == 0, (terminal, r)
        assert world.ran() == ["demo.echo", "demo.echo"]
        return
    assert terminal.rc != 0 and "EACCES" in terminal.err, terminal
    assert denied(r, frames)["error"] == "EACCES"
    assert world.ran() == []


@pytest.mark.parametrize(
    "rule",
    [
        "allow reviewer_t tool:demo.echo execute",  # another label
        f"allow {LABEL} tool:demo.other execute",  # another tool
        f"allow {LABEL} tool:demo.ech execute",  # a prefix of the name
    ],
)
def test_p6_the_tool_policy_must_hold_the_agents_label_and_the_tools_name(world, rule):
    """P-6: the tool's policy must hold ``allow <label> tool:<name> execute`` itself: a rule
    of another label or another tool is not it."""
    break_step(world, 6)
    with (world.storage / "tool" / "demo.echo.d" / "policy").open("a") as policy:
        policy.write(rule + "\n")
    r, frames = world.native("demo.echo")
    assert (denied(r, frames)["step"], world.ran()) == (6, [])


def test_p6_the_agents_label_is_the_subject_of_both_layers(world):
    """P-6: the rule is of the agent's label: an agent whose label is reviewer_t does not
    get coder_t's grants."""
    (world.storage / "agent" / "coder.d" / "label").write_text("reviewer_t\n")
    r, frames = world.native("demo.echo")
    assert (denied(r, frames)["error"], world.ran()) == ("EACCES", [])


def test_p6_a_tool_without_a_policy_runs_for_nobody(world):
    """P-6: the tool's own policy must hold the rule; a tool with no policy holds none."""
    (world.storage / "tool" / "demo.echo.d" / "policy").unlink()
    r, frames = world.native("demo.echo")
    error = denied(r, frames)
    assert (error["error"], error["step"], world.ran()) == ("EACCES", 6, []), error


def test_p5_a_model_needs_the_agent_policy_and_its_own_policy(world):
    """P-5 step 6 is the tool/model policy: a model the agent's policy lets it use is still
    denied at step 6 until ``model/<provider>/<model>.d/policy`` allows it too."""
    model = world.storage / "model" / "openai" / "gpt-5.6"
    (model.parent / "gpt-5.6.d").mkdir(parents=True)
    model.write_text("{}\n")
    world.allow_in_agent(f"allow {LABEL} model:openai/gpt-5.6 use")
    explain = ("policy", "explain", "coder", "model:openai/gpt-5.6", "use", "--json")
    r = world.ctx(*explain)
    assert (r.rc, r.json()["step"]) == (1, 6), r
    (model.parent / "gpt-5.6.d" / "policy").write_text(f"allow {LABEL} model:openai/gpt-5.6 use\n")
    r = world.ctx(*explain)
    assert (r.rc, r.json()["allowed"]) == (0, True), r


def test_p6_no_tool_control_and_no_prompt_grants_a_tool(world):
    """P-6: "There is no agent/<name>.d/tool"; prompts and system prompts never grant."""
    controls = world.storage / "agent" / "coder.d"
    assert not (controls / "tool").exists()
    world.install("demo.other")
    world.allow_in_tool("demo.other")
    rule = f"allow {LABEL} tool:demo.other execute\n"
    (controls / "tool").write_text("demo.other\n")
    for prompt in ("system.md", "prompt.template.md"):
        with (controls / prompt).open("a") as text:
            text.write(rule)
    r, frames = world.native("demo.other", {"policy": rule, "tools": ["demo.other"]})
    assert denied(r, frames)["error"] == "EACCES"
    assert world.ran() == []


# ------------------------------------------------------------------ P-7: concrete names


def test_p7_a_rule_grants_exactly_the_name_it_holds(world):
    """P-7: a rule names one object; a longer name, a shorter one or another case is
    another object."""
    for name in ("demo.echo2", "demo", "Demo.echo"):
        world.install(name)
        world.allow_in_tool(name)
        r, frames = world.native(name)
        error = denied(r, frames)
        assert (error["error"], error["step"]) == ("EACCES", 5), error
    assert world.ran() == []


def test_p7_agent_permissions_are_per_child_name(world):
    """P-7: ``allow parent_t agent:review-1 create`` grants creating review-1 only."""
    world.allow_in_agent(f"allow {LABEL} agent:review-1 create")
    one = world.ctx("policy", "explain", "coder", "agent:review-1", "create", "--json")
    two = world.ctx("policy", "explain", "coder", "agent:review-2", "create", "--json")
    assert one.rc == 0 and one.json()["allowed"] is True, one
    assert two.rc == 1 and two.json()["step"] == 5, two


# ------------------------------------------------------------------ T-1: the controls


CONTROLS = {"name", "description", "schema", "cap", "policy", "status", "log", "hooks"}


def test_t1_an_installed_tool_is_an_executable_and_every_control(world):
    """T-1: ``tool/<name>`` (executable) plus ``tool/<name>.d/`` with name, description,
    schema, cap, policy, status, log, hooks/pre.d/ and hooks/post.d/, holding the manifest's
    facts."""
    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    cap = {"side_effects": True, "network": False}
    tool = world.install("demo.full", schema=schema, cap=cap, description="Full of controls.")
    assert tool.is_file() and os.access(tool, os.X_OK)
    controls = tool.parent / "demo.full.d"
    assert set(os.listdir(controls)) >= CONTROLS
    assert (controls / "hooks" / "pre.d").is_dir() and (controls / "hooks" / "post.d").is_dir()
    assert (controls / "name").read_text().strip() == "demo.full"
    assert (controls / "description").read_text().strip() == "Full of controls."
    assert json.loads((controls / "schema").read_text()) == schema
    assert json.loads((controls / "cap").read_text()) == cap


@pytest.mark.parametrize("name", ["fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec"])
def test_t1_every_core_tool_has_every_control(world, name):
    """T-1, R-5: the core tools bootstrap installs are tools like any other."""
    tool = world.storage / "tool" / name
    assert tool.is_file() and os.access(tool, os.X_OK)
    assert set(os.listdir(world.storage / "tool" / f"{name}.d")) >= CONTROLS
    assert json.loads((world.storage / "tool" / f"{name}.d" / "schema").read_text())


def test_t1_the_schema_is_not_an_output_schema(world):
    """T-1: ``schema`` is the input's schema; output it does not describe is still a result."""
    world.install("demo.echo", schema={"type": "object", "required": ["text"],
                                       "properties": {"text": {"type": "string"}}})  # fmt: skip
    r, frames = world.native("demo.echo", {"text": "x"})
    assert r.rc == 0, r
    assert json.loads(result_frame(frames)["output"]["stdin"]) == {"text": "x"}


def test_t1_schema_grants_nothing(world):
    """T-1: a schema accepting the input grants nothing: without the rule the call is
    refused for want of it, not judged on its input."""
    break_step(world, 6)
    r, frames = world.native("demo.echo", ["not", "an", "object"])
    assert denied(r, frames)["error"] == "EACCES"


@pytest.mark.parametrize("status", ["disabled\n", "unavailable: maintenance\n"])
def test_t1_a_tool_whose_status_is_not_available_does_not_run(world, status):
    """T-1: ``status`` is a control of the tool; one that does not say available keeps it
    from running (docs/tools.md: the call is refused)."""
    (world.storage / "tool" / "demo.echo.d" / "status").write_text(status)
    assert world.run("demo.echo").rc != 0
    r, frames = world.native("demo.echo")
    assert denied(r, frames)["error"] == "EACCES"
    assert world.ran() == []


# ------------------------------------------------------------------ T-2, T-3: invocation


def test_t2_a_core_tool_takes_its_json_on_argv_or_on_stdin(world):
    """T-2: ``fs.read '{"path": …}'`` and ``echo '{…}' | shell.exec``: stdin/stdout are the
    interface."""
    (world.workspace / "README.md").write_text("read me\n")
    world.allow_in_tool("fs.read")
    r = world.run("fs.read", '{"path":"README.md"}')
    assert (r.rc, r.out) == (0, "read me\n"), r
    world.allow_in_agent(f"allow {LABEL} tool:shell.exec execute")
    world.allow_in_tool("shell.exec")
    r = world.run("shell.exec", input='{"cmd":"cat README.md; echo done"}')
    assert r.rc == 0 and r.out.endswith("read me\ndone\n"), r


def test_t3_terminal_mode_keeps_the_argv_exactly(world):
    """T-3: argv is kept — empty words, spaces, option-like words and UTF-8 included."""
    argv = ["", "a b", "--native", "--", "-x", "ü", "'quoted'"]
    r = world.run("demo.echo", *argv)
    assert r.rc == 0, r
    assert json.loads(r.out)["argv"] == argv


def test_t3_terminal_mode_never_rejects_an_empty_argv(world):
    """T-3: an empty argv reaches the tool; the tool judges its own arguments."""
    r = world.run("demo.echo")
    assert r.rc == 0, r
    assert json.loads(r.out)["argv"] == []
    assert world.ran() == ["demo.echo"]


def test_t3_terminal_mode_inherits_the_standard_streams(world):
    """T-3: stdin/stdout/stderr are the tool's, plain text both ways, and the exit status is
    the tool's."""
    world.install("demo.cat", "#!/bin/sh\ncat\necho to-stderr >&2\nexit 7\n")
    world.allow_in_tool("demo.cat")
    world.allow_in_agent(f"allow {LABEL} tool:demo.cat execute")
    r = world.run("demo.cat", input="plain text, not JSON\n")
    assert r.rc == 7, r
    assert r.out == "plain text, not JSON\n"
    assert "to-stderr\n" in r.err


FDS = """\
#!/bin/sh
for fd in 0 1 2; do echo "$fd=$(readlink /proc/$$/fd/$fd)" >> fds; done
"""


def test_t3_terminal_mode_hands_the_tool_the_callers_own_descriptors(world):
    """T-3: stdin/stdout/stderr are inherited, not relayed: the tool's descriptors are the
    very pipe and files the caller gave ``ctx run``."""
    world.install("demo.fds", FDS)
    world.allow_in_tool("demo.fds")
    world.allow_in_agent(f"allow {LABEL} tool:demo.fds execute")
    out, err = world.workspace / "out", world.workspace / "err"
    read_end, write_end = os.pipe()
    os.close(write_end)
    try:
        with out.open("w") as stdout, err.open("w") as stderr:
            proc = subprocess.run([*CTX_ARGV, "run", "--agent", "coder", "demo.fds"],
                                  stdin=read_end, stdout=stdout, stderr=stderr, env=world.env,
                                  timeout=60)  # fmt: skip
        pipe = f"pipe:[{os.fstat(read_end).st_ino}]"
    finally:
        os.close(read_end)
    assert proc.returncode == 0, err.read_text()
    fds = (world.workspace / "fds").read_text().splitlines()
    assert fds == [f"0={pipe}", f"1={out}", f"2={err}"]


def test_t3_native_mode_gives_json_input_and_jsonl_frames(world):
    """T-3: native mode: structured JSON input, JSONL frames out — one JSON object a line,
    ``call`` first, the tool's stderr as frames, ``result`` last."""
    world.install("demo.loud", "#!/bin/sh\necho one >&2\necho two >&2\ncat\n")
    world.allow_in_tool("demo.loud")
    world.allow_in_agent(f"allow {LABEL} tool:demo.loud execute")
    r, frames = world.native("demo.loud", {"text": "ü"})
    assert r.rc == 0, r
    assert all(isinstance(frame, dict) and "type" in frame for frame in frames)
    assert frames[0]["type"] == "call"
    assert [f["text"] for f in frames if f["type"] == "stderr"] == ["one", "two"]
    result = result_frame(frames)
    assert result["status"] == "ok" and result["output"] == {"text": "ü"}, result
    assert [f["type"] for f in frames].count("result") == 1


def test_t3_native_mode_reports_a_failing_tool_in_its_result(world):
    """T-3: in native mode the outcome is a frame: a tool that exits non-zero gives a
    ``result`` of status error with its exit status, and ``ctx run`` fails."""
    world.install("demo.fail", "#!/bin/sh\necho partial\nexit 5\n")
    world.allow_in_tool("demo.fail")
    world.allow_in_agent(f"allow {LABEL} tool:demo.fail execute")
    r, frames = world.native("demo.fail")
    result = result_frame(frames)
    assert r.rc != 0, r
    assert (result["status"], result["exit_status"]) == ("error", 5), result


def test_t3_native_mode_refuses_input_that_is_not_json(world):
    """T-3: native input is structured JSON; text that is not is refused, not run."""
    r = world.ctx("run", "--native", "--agent", "coder", "demo.echo", input="not json")
    assert r.rc != 0, r
    assert world.ran() == []


# ------------------------------------------------------------------ T-5: visibility


def test_t5_a_file_without_an_execute_bit_is_not_a_tool(world):
    """T-5, T-4: the execute bit decides; without it the tool neither runs nor is found."""
    (world.storage / "tool" / "demo.echo").chmod(0o644)
    r, frames = world.native("demo.echo")
    assert denied(r, frames)["error"] in ("ENOENT", "EACCES")
    assert world.run("demo.echo").rc != 0
    assert world.ran() == []


@pytest.mark.parametrize("in_group", [True, False])
def test_t5_the_agents_groups_decide_a_group_executable_tool(world, in_group):
    """T-5: visibility comes from the agent's uid/gid/groups: a tool executable by its
    group alone runs for an agent in that group, and is refused to one outside it."""
    group = 4242
    if in_group:
        identity = world.storage / "agent" / "coder.d" / "identity"
        identity.write_text(json.dumps({**json.loads(identity.read_text()), "groups": [group]}))
    tool = world.storage / "tool" / "demo.echo"
    os.chown(tool, 0, group)
    tool.chmod(0o750)
    r, frames = world.native("demo.echo")
    if in_group:
        assert r.rc == 0, r
        assert world.ran() == ["demo.echo"]
    else:
        error = denied(r, frames)
        assert (error["error"], error["step"]) == ("EACCES", 2), error
        assert world.ran() == []


@pytest.fixture
def noexec_world(_chain_template: World) -> Iterator[World]:
    """The world on a tmpfs mounted noexec."""
    top = Path(tempfile.mkdtemp(prefix="cortexfs-chain-noexec-", dir="/tmp"))
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec,mode=0755", "tmpfs", top],
                             capture_output=True, text=True)  # fmt: skip
    if mounted.returncode != 0:
        top.rmdir()
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        yield clone(_chain_template, top)
    finally:
        subprocess.run(["umount", "-l", top], check=True)
        top.rmdir()


def test_t5_a_tool_on_a_noexec_filesystem_does_not_run(noexec_world):
    """T-5: "the agent's mount table and noexec" decide too: a tool the kernel would not
    execute is refused by the chain, with EACCES naming the step (P-5), not run."""
    r, frames = noexec_world.native("demo.echo")
    error = denied(r, frames)
    assert error["error"] == "EACCES" and error["step"] in (2, 3), error
    assert noexec_world.ran() == []


def durable_tree(storage: Path) -> dict[str, tuple]:
    """Every entry of the storage root but the records a call appends (logs, sessions)."""
    return {
        path: entry
        for path, entry in snapshot(storage).items()
        if not path.startswith("home/")
        and not path.endswith("/log")
        and not path.endswith(".install-lock")
    }


@pytest.mark.parametrize("allowed", [True, False])
def test_t5_authorization_makes_no_persistent_copy(world, allowed):
    """T-5: the agent sees a projection, "never a persistent copy created as a side effect of
    authorization": a call, allowed or refused, adds nothing to the storage root but its
    records (the session under home/, the tool's log)."""
    if not allowed:
        break_step(world, 6)
    before = durable_tree(world.storage)
    world.native("demo.echo")
    world.run("demo.echo")
    assert durable_tree(world.storage) == before
    home = world.storage / "home"
    made = {str(p.relative_to(home)) for p in home.rglob("*")}
    above = {AGENT_UID, f"{AGENT_UID}/agent", f"{AGENT_UID}/agent/coder"}
    session = f"{AGENT_UID}/agent/coder/session"
    assert all(p in above or p.startswith(session) for p in made), made


# ------------------------------------------------------------------ T-6: hooks


def hook(world: World, tool: str, kind: str, name: str, body: str) -> None:
    path = world.storage / "tool" / f"{tool}.d" / "hooks" / f"{kind}.d" / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def test_t6_pre_hooks_run_in_name_order_before_the_tool(world):
    """T-6: every executable of hooks/pre.d/ runs, in name order, before the tool; a file
    that is not executable is no hook."""
    for name in ("20-b", "10-a", "30-c"):
        hook(world, "demo.echo", "pre", name, f"echo {name} >> ran\n")
    readme = world.storage / "tool" / "demo.echo.d" / "hooks" / "pre.d" / "15-README"
    readme.write_text("#!/bin/sh\nexit 1\n")  # no execute bit: not an executable, no hook
    r = world.run("demo.echo")
    assert r.rc == 0, r
    assert world.ran() == ["10-a", "20-b", "30-c", "demo.echo"]


@pytest.mark.parametrize("native", [False, True])
def test_t6_a_pre_hook_that_exits_non_zero_vetoes_the_call(world, native):
    """T-6: a pre-hook's non-zero exit vetoes: the tool does not run (nor the hooks after the
    veto), and the call fails."""
    hook(world, "demo.echo", "pre", "10-ok", "echo 10-ok >> ran\n")
    hook(world, "demo.echo", "pre", "20-veto", "echo 20-veto >> ran\nexit 3\n")
    hook(world, "demo.echo", "pre", "30-after", "echo 30-after >> ran\n")
    if native:
        r, frames = world.native("demo.echo")
        assert r.rc == 1 and result_frame(frames)["status"] == "error", r
    else:
        r = world.run("demo.echo")
        assert r.rc != 0, r
    assert world.ran() == ["10-ok", "20-veto"]


def test_t6_post_hooks_run_after_the_tool_and_see_its_result(world):
    """T-6: hooks/post.d/ run after the tool, in name order, and see the result."""
    hook(world, "demo.echo", "post", "20-b", "echo 20-b >> ran\n")
    hook(world, "demo.echo", "post", "10-a", "echo 10-a >> ran\ncat > post-input\n")
    r, frames = world.native("demo.echo", {"text": "seen"})
    assert r.rc == 0, r
    assert world.ran() == ["demo.echo", "10-a", "20-b"]
    seen = (world.workspace / "post-input").read_text()
    assert '{\\"text\\": \\"seen\\"}' in seen or "seen" in json.dumps(json.loads(seen)), seen
    document = json.loads(seen)
    output = result_frame(frames)["output"]
    assert output in [v for v in walk(document)], document


def test_t6_post_hooks_see_the_result_of_a_terminal_call(world):
    """T-6: in terminal mode too the post-hooks run after the tool and see its result (the
    tool's stdout went to the caller; its exit status is the result)."""
    world.install("demo.fail", "#!/bin/sh\necho demo.fail >> ran\nexit 5\n")
    world.allow_in_tool("demo.fail")
    world.allow_in_agent(f"allow {LABEL} tool:demo.fail execute")
    hook(world, "demo.fail", "post", "10-a", "echo 10-a >> ran\ncat > post-input\n")
    r = world.run("demo.fail")
    assert r.rc == 5, r
    assert world.ran() == ["demo.fail", "10-a"]
    seen = json.loads((world.workspace / "post-input").read_text())
    assert 5 in list(walk(seen)), seen


def walk(value):
    """Every value nested in a parsed JSON document, itself included."""
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk(item)


# ------------------------------------------------------------------ T-7: logs


def test_t7_a_call_is_logged_in_the_tool_log_and_the_session_events(world):
    """T-7, S-2: one call adds to ``tool/<name>.d/log`` and to the session's events.jsonl,
    whose events have the S-2 shape."""
    log = world.storage / "tool" / "demo.echo.d" / "log"
    before = log.read_text()
    r = world.ctx("run", "--native", "--agent", "coder", "--session", "s1", "demo.echo",
                  input="{}")  # fmt: skip
    assert r.rc == 0, r
    call = json.loads(r.lines()[-1])["call"]
    added = log.read_text()[len(before) :]
    assert call in added, added
    events = [e for e in world.events("s1") if e.get("call") == call]
    assert {e["type"] for e in events} >= {"tool_call", "tool_result"}, events
    for event in events:
        assert {"ts", "type", "agent", "session", "object", "status"} <= set(event), event
        assert (event["agent"], event["object"]) == ("coder", "tool/demo.echo"), event
    [outcome] = [e for e in events if e["type"] == "tool_result"]
    assert outcome["status"] == "ok"


def test_t7_a_refused_call_is_logged_too(world):
    """T-7: a call the chain refused is a tool call: it is in the session and the tool's log."""
    break_step(world, 5)
    _, frames = world.native("demo.echo")
    call = result_frame(frames)["call"]
    assert call in (world.storage / "tool" / "demo.echo.d" / "log").read_text()
    assert any(e.get("call") == call and e["type"] == "tool_result" for e in world.events())


def test_t7_a_terminal_call_is_logged_too(world):
    """T-7: the terminal mode records its calls as the native mode does."""
    r = world.run("demo.echo", "x")
    assert r.rc == 0, r
    types = [e["type"] for e in world.events() if e.get("object") == "tool/demo.echo"]
    assert types.count("tool_call") == 1 and types.count("tool_result") == 1, types
    assert (world.storage / "tool" / "demo.echo.d" / "log").read_text().strip()


# ------------------------------------------------------------------ T-8: check and install


def test_t8_check_accepts_a_valid_manifest(manifests):
    """T-8: a v2 manifest, with or without the optional ``program`` (C-2), is valid."""
    r = manifests.ctx("object", "check", manifests.manifest("demo.valid"))
    assert r.rc == 0, r
    program = {"type": "object", "additionalProperties": False}
    r = manifests.ctx("object", "check", manifests.manifest("demo.program", program=program))
    assert r.rc == 0, r


def test_t8_check_lists_every_reason_a_manifest_is_invalid(manifests):
    """T-8: every reason is listed, one per line, and the exit status is 1."""
    path = manifests.manifest("demo.bad", manifest=1, kind="agent", name="../bad",
                          cap="yes", schema=[])  # fmt: skip
    document = json.loads(path.read_text())
    del document["description"]
    path.write_text(json.dumps(document))
    r = manifests.ctx("object", "check", path)
    assert r.rc == 1, r
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert all(line.startswith(f"{path}: EINVAL: ") for line in lines), r
    for field in ("manifest", "kind", "name", "description", "cap", "schema"):
        assert any(field in line.removeprefix(f"{path}: EINVAL: ") for line in lines), field


@pytest.mark.parametrize(
    "fault",
    [
        {"manifest": 1},
        {"manifest": "2"},
        {"kind": "agent"},
        {"name": "bad/name"},
        {"name": "demo.d"},
        {"name": ""},
        {"description": 5},
        {"schema": "object"},
        {"schema": {"type": 5}},
        {"cap": ["network"]},
        {"cap": {"side_effects": "no", "network": False}},
        {"cap": {"side_effects": False, "network": "no"}},
        {"mcp": {"transport": "stdio", "config": "/c.json", "server": "s", "tool": "t"}},
        {"exec": "/no/such/program"},
        {"policy": "allow coder_t tool:demo.fault execute"},
        {"program": "read-only"},
        {"program": {"type": 5}},
    ],
    ids=lambda fault: json.dumps(fault)[:40],
)
def test_t8_check_refuses_a_manifest_with_one_fault(manifests, fault):
    """T-8: the v2 manifest is exactly ``{"manifest": 2, "kind": "tool", "name",
    "description", "schema", "cap", "exec" | "mcp", "program"?}``, ``cap`` boolean facts."""
    path = manifests.manifest("demo.fault", **fault)
    r = manifests.ctx("object", "check", path)
    assert r.rc == 1, r
    assert "EINVAL" in r.err or "ENOENT" in r.err, r


@pytest.mark.parametrize("missing", ["manifest", "kind", "name", "description", "schema", "cap",
                                     "exec"])  # fmt: skip
def test_t8_each_required_field_is_required(manifests, missing):
    path = manifests.manifest("demo.fault")
    document = json.loads(path.read_text())
    del document[missing]
    path.write_text(json.dumps(document))
    r = manifests.ctx("object", "check", path)
    assert r.rc == 1 and "EINVAL" in r.err, r


def test_t8_install_puts_the_tool_in_the_tier_named(world):
    """T-8: ``--tier system|user|shared:<name>``."""
    assert world.ctx("shared", "create", "proj").rc == 0
    for tier in ("system", "user", "shared:proj"):
        name = "demo.tier-" + tier.replace(":", "-")
        r = world.ctx("object", "install", "--source", world.storage, world.manifest(name),
                      "--tier", tier, env=clean_env())  # fmt: skip
        assert r.rc == 0, r
        tool = world.tier_dir(tier) / name
        assert tool.is_file() and os.access(tool, os.X_OK), tool
        assert (tool.parent / f"{name}.d" / "policy").is_file()


def test_t8_install_grants_no_agent_any_permission(world):
    """T-8: "Installing grants no agent any permission": no agent's control changes, the
    tool's policy allows nothing, and an agent whose own policy names the tool is refused."""
    agents = snapshot(world.storage / "agent")
    world.allow_in_agent(f"allow {LABEL} tool:demo.fresh execute")
    agents = snapshot(world.storage / "agent")
    tool = world.install("demo.fresh")
    assert snapshot(world.storage / "agent") == agents
    policy = (tool.parent / "demo.fresh.d" / "policy").read_text()
    assert [line for line in policy.splitlines() if line.strip().startswith("allow")] == []
    r, frames = world.native("demo.fresh")
    error = denied(r, frames)
    assert (error["error"], error["step"]) == ("EACCES", 6), error


def test_t8_a_refused_install_leaves_the_storage_root_as_it_was(world):
    before = durable_tree(world.storage)
    path = world.manifest("demo.bad", kind="agent")
    r = world.ctx("object", "install", path, "--tier", "system")
    assert r.rc != 0, r
    assert durable_tree(world.storage) == before


VERSION = "#!/bin/sh\necho {version}\n"
DESCRIPTIONS = {"The demo.v test tool."} | {f"The demo.v test tool {n}." for n in range(1, 4)}


def test_t8_a_reinstall_replaces_the_tool_atomically(world):
    """T-8: while a tool is reinstalled over and over, readers always find its executable and
    a complete control directory, and calls always run one version or the other."""
    world.install("demo.v", VERSION.format(version="v0"))
    world.allow_in_tool("demo.v")
    world.allow_in_agent(f"allow {LABEL} tool:demo.v execute")
    tool = world.storage / "tool" / "demo.v"
    controls = world.storage / "tool" / "demo.v.d"
    stop = threading.Event()
    problems: list[str] = []

    def look() -> None:
        while not stop.is_set():
            try:
                if not os.stat(tool).st_mode & stat.S_IXUSR:
                    problems.append("executable without x")
                named = os.stat(controls).st_ino
                listed = set(os.listdir(controls))
                if os.stat(controls).st_ino != named:
                    continue  # the listing began in the directory a swap then retired
                missing = CONTROLS - listed
                if missing:
                    problems.append(f"controls missing: {missing}")
                description = (controls / "description").read_text().strip()
                if description not in DESCRIPTIONS:
                    problems.append(f"description {description!r}")
            except OSError as error:
                problems.append(repr(error))

    reader = threading.Thread(target=look)
    reader.start()
    outputs = []
    try:
        for n in range(1, 4):
            path = world.manifest("demo.v", VERSION.format(version=f"v{n}"),
                                  description=f"The demo.v test tool {n}.")  # fmt: skip
            r = world.ctx("object", "install", path, "--tier", "system")
            assert r.rc == 0, r
            call = world.run("demo.v")
            assert call.rc == 0, call
            outputs.append(call.out.strip())
    finally:
        stop.set()
        reader.join()
    assert problems == []
    assert outputs == ["v1", "v2", "v3"]
    leftovers = [n for n in os.listdir(world.storage / "tool") if n.startswith(".demo.v")]
    assert leftovers == []


def test_t8_a_call_during_reinstalls_runs_a_whole_version(world):
    """T-8: calls made while the tool is being replaced each run a complete version: old or
    new, never a mix or a missing tool."""
    world.install("demo.v", VERSION.format(version="v0"))
    world.allow_in_tool("demo.v")
    world.allow_in_agent(f"allow {LABEL} tool:demo.v execute")
    stop = threading.Event()
    calls: list[Run] = []

    def call() -> None:
        while not stop.is_set():
            calls.append(world.run("demo.v"))

    caller = threading.Thread(target=call)
    caller.start()
    try:
        for n in range(1, 5):
            path = world.manifest("demo.v", VERSION.format(version=f"v{n}"))
            assert world.ctx("object", "install", path, "--tier", "system").rc == 0
            time.sleep(0.05)
    finally:
        stop.set()
        caller.join()
    assert calls
    for r in calls:
        assert r.rc == 0 and r.out.strip() in {f"v{n}" for n in range(5)}, r
