"""The host administrator changes things while agents use them: a tool reinstalled (a new
program, a new schema) while ``ctx run`` calls and ``ctx queue work`` jobs of it are admitted
or running; policy lines revoked and granted by hand between and during calls; an agent's
identity, policy and mount controls edited, or the agent deleted, while its calls and its
worker run; a shared space given another group under a running call (SPEC T-1, T-6, T-7,
T-8, T-8a, P-5, P-6, A-3, W-1, X-1, S-2; docs/tools.md "How an install stays atomic",
"Hooks (T-6)", "Running a tool"; docs/policy.md "What the chain reads"; docs/workers.md).

What must hold: a call is admitted and run by one version of a tool (a reinstall during its
admission has it admitted again by the new version's controls); a running call ends under
the version it started with and is recorded like any other; every grant is read again at the
next call, so a revocation refuses the next call with the step that denied it named; a
control that an edit leaves half-written or unsafe refuses calls (fail closed) with a reason
naming the file; nothing of a call is left half-recorded."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    request,
    scratch_top,
    wait_for,
)
from tests.acceptance.workercli import AGENT, LABEL, start_worker
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: needs root")

TOOL = "ver.probe"
SHARED_TOOL = "team.probe"
SPACE = "team"
# Two gids no group of the host is likely to hold: a space's group and the one it is given.
TEAM_GID, OTHER_GID = 47011, 47012

# The probe: reads its JSON input; with "hold": NAME it leaves FLAGS/started-NAME and waits
# for FLAGS/go-NAME (or FLAGS/release, 30 s at most) before it answers; it prints its
# version, its uid, groups and the mounts it was given.
PROGRAM = """\
#!/usr/bin/python3 -I
import json, os, sys, time
FLAGS = {flags!r}
value = json.load(sys.stdin)
hold = value.get("hold") if isinstance(value, dict) else None
if hold:
    open(os.path.join(FLAGS, "started-" + hold), "w").close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not any(
        os.path.exists(os.path.join(FLAGS, name)) for name in ("go-" + hold, "release")
    ):
        time.sleep(0.02)
print(json.dumps({{
    "version": {version},
    "uid": os.getuid(),
    "groups": sorted(os.getgroups()),
    "targets": [m[1] for m in json.loads(os.environ.get("CTX_MOUNTS", "[]"))],
}}))
"""

# A pre-hook that notes each call id it sees in FLAGS/hook-seen and, the first time it sees a
# call whose input holds "gate", leaves FLAGS/gated and waits for FLAGS/go-gate.
GATE = """\
#!/usr/bin/python3 -I
import json, os, sys, time
FLAGS = {flags!r}
call = json.load(sys.stdin)
seen = os.path.join(FLAGS, "hook-seen")
with open(seen, "a") as out:
    out.write(call["call"] + "\\n")
with open(seen) as back:
    times = back.read().split().count(call["call"])
if times == 1 and "gate" in (call.get("input") or {{}}):
    open(os.path.join(FLAGS, "gated"), "w").close()
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and not any(
        os.path.exists(os.path.join(FLAGS, name)) for name in ("go-gate", "release")
    ):
        time.sleep(0.02)
"""


@dataclass
class World:
    """A bootstrapped root every uid may search, agent ``ci`` (uid nobody) allowed ``ver.probe``
    and ``shell.exec`` in both layers of P-6 with ``ws`` mounted read-write at /workspace, the
    queue of project ``proj``, and a scratch directory of flags every uid may write."""

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
    def ws(self) -> Path:
        return self.top / "ws"

    @property
    def queue(self) -> QueueCLI:
        return QueueCLI(self.storage, "proj")

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    def controls(self, tool: str = TOOL, tier: str = "tool") -> Path:
        return self.storage / tier / f"{tool}.d"

    def agent_control(self, name: str, agent: str = AGENT) -> Path:
        return self.storage / "agent" / f"{agent}.d" / name

    def manifest(self, version: int, *, name: str = TOOL, strict: bool = True) -> Path:
        """Version ``version`` of the probe; ``strict``: its schema takes ``"v"`` only equal
        to the version, else any object."""
        directory = self.top / "manifests" / f"{name}-v{version}"
        directory.mkdir(parents=True, exist_ok=True)
        program = directory / "probe.py"
        program.write_text(PROGRAM.format(flags=str(self.flags), version=version))
        program.chmod(0o755)
        schema: dict = {"type": "object"}
        if strict:
            schema["properties"] = {"v": {"const": version}}
        document = {
            "manifest": 2,
            "kind": "tool",
            "name": name,
            "description": f"{name} version {version}",
            "schema": schema,
            "cap": {"side_effects": False, "network": False},
            "exec": "probe.py",
        }
        path = directory / "manifest.json"
        path.write_text(json.dumps(document))
        return path

    def install(self, version: int, *, name: str = TOOL, tier: str = "system", **kw) -> None:
        r = self.ctx("object", "install", self.manifest(version, name=name, **kw), "--tier", tier)
        assert r.rc == 0, r

    def allow(self, policy: Path, rule: str) -> None:
        with policy.open("a") as out:
            out.write(rule + "\n")

    def revoke(self, policy: Path, rule: str) -> None:
        """Take ``rule`` out of ``policy`` as an editor does: the new text written to a file
        beside it, renamed over it (mode 0644, root's)."""
        kept = [line for line in policy.read_text().splitlines() if line.strip() != rule]
        temp = policy.with_name(policy.name + ".new")
        temp.write_text("".join(line + "\n" for line in kept))
        temp.chmod(0o644)
        os.rename(temp, policy)

    def native(self, value, *, tool: str = TOOL, options: tuple = ()) -> tuple[Run, dict]:
        r = self.ctx("run", "--native", "--agent", AGENT, *options, tool, input=json.dumps(value))
        frames = [json.loads(line) for line in r.lines()]
        results = [f for f in frames if f.get("type") == "result"]
        assert len(results) == 1, r
        return r, results[0]

    def start_native(self, value, *, tool: str = TOOL, options: tuple = ()) -> subprocess.Popen:
        """``ctx run --native`` in the background (its output read by :meth:`result_of`)."""
        argv = ["run", "--native", "--agent", AGENT, *options, tool]
        proc = subprocess.Popen(
            [*CTX_ARGV, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
        )
        self.background.append(proc)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps(value).encode())
        proc.stdin.close()
        proc.stdin = None  # written and closed: communicate() must not flush it
        return proc

    def result_of(self, proc: subprocess.Popen) -> tuple[int, dict, str]:
        out, err = proc.communicate(timeout=60)
        frames = [json.loads(line) for line in out.decode().splitlines()]
        results = [f for f in frames if f.get("type") == "result"]
        assert len(results) == 1, (proc.returncode, out, err)
        return proc.returncode, results[0], err.decode()

    def started(self, hold: str) -> bool:
        return (self.flags / f"started-{hold}").exists()

    def go(self, hold: str) -> None:
        (self.flags / f"go-{hold}").touch()

    def log(self, tool: str = TOOL, tier: str = "tool") -> dict[str, dict]:
        """The tool's log lines by call id (T-7)."""
        lines = read_jsonl(self.controls(tool, tier) / "log")
        return {line["call"]: line for line in lines if line.get("call")}

    def events(self, session: str) -> list[dict]:
        """The events of ``session``, a path relative to the storage root."""
        return read_jsonl(self.storage / session / "events.jsonl")

    def pair(self, session: str, call: str) -> list[str]:
        """The event types the session holds for ``call``."""
        return [e["type"] for e in self.events(session) if e.get("call") == call]


def nobody_uid() -> int:
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user nobody: root's default agent user (docs/tools.md)")


@pytest.fixture
def world(searchable_storage: Path) -> Iterator[World]:
    nobody_uid()
    top = new_scratch_dir(scratch_top(__file__), "w")
    w = World(searchable_storage, top)
    w.flags.mkdir()
    w.flags.chmod(0o777)
    w.ws.mkdir()
    w.ws.chmod(0o777)
    w.install(1)
    agent = {
        "name": AGENT,
        "label": LABEL,
        "tools": [TOOL, "shell.exec"],
        "mount": [[str(w.ws), "/workspace", "rw"]],
    }
    made = w.ctx("agent", "create", "-", input=json.dumps(agent))
    assert made.rc == 0, made
    for tool in (TOOL, "shell.exec"):
        w.allow(w.controls(tool) / "policy", f"allow {LABEL} tool:{tool} execute")
    try:
        yield w
    finally:
        (w.flags / "release").touch()
        for proc in w.background:
            if proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.communicate(timeout=10)
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        shutil.rmtree(top, ignore_errors=True)


@contextlib.contextmanager
def worker(w: World) -> Iterator[subprocess.Popen]:
    """``ctx queue work --json`` for agent ``ci`` until the block ends (SIGTERM, then SIGKILL)."""
    proc = start_worker(w.queue, "--json")
    try:
        yield proc
    finally:
        (w.flags / "release").touch()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


def job_of(w: World, value: dict, tool: str = TOOL) -> str:
    req = request(tool)
    req["input"] = value
    return w.queue.publish(req)


def outcome(w: World, job: str) -> tuple[str, dict]:
    state = w.queue.state(job)
    assert state in ("done", "failed"), (job, state)
    return state, json.loads((w.queue.dir / state / f"{job}.result").read_text())


def settled(w: World, *jobs: str) -> bool:
    return all(w.queue.state(job) in ("done", "failed") for job in jobs)


def hidden_names(w: World) -> list[str]:
    """Names an install left in the system tier besides its lock (staging, commit marker)."""
    return sorted(n for n in os.listdir(w.storage / "tool") if n.startswith("."))


# ========================================================================= reinstalls (T-8)


def test_a_reinstall_while_a_call_is_admitted_has_it_judged_again_by_the_new_schema(world):
    """docs/tools.md "Hooks": a call whose tool is reinstalled while it is admitted (its
    pre-hook running) is admitted again by the new version.  Its input, which only the old
    schema took, is refused at stage ``schema`` by the new one (EINVAL, exit 2): it is never
    run, by the old program or the new one, and the refusal is recorded (session, tool log)."""
    gate = world.controls() / "hooks" / "pre.d" / "10-gate"
    gate.write_text(GATE.format(flags=str(world.flags)))
    gate.chmod(0o755)
    proc = world.start_native({"v": 1, "gate": True, "hold": "never"})
    assert wait_for(lambda: (world.flags / "gated").exists(), 20), "the pre-hook never ran"
    world.install(2)
    world.go("gate")
    rc, result, _ = world.result_of(proc)

    assert rc == 2 and result["status"] == "error", result
    error = result["error"]
    assert (error["error"], error["stage"]) == ("EINVAL", "schema"), error
    assert "schema of ver.probe" in error["message"] and "/v" in error["message"], error
    assert result["exit_status"] is None and result["output"] is None, result
    assert not world.started("never"), "the program ran for an input the new schema refuses"
    call = result["call"]
    assert world.pair(result["session"], call) == ["tool_call", "tool_result"]
    assert world.log()[call]["stage"] == "schema", world.log()[call]
    # Nothing of the install is left half-done: the tool is listed whole, as version 2.
    listed = {o["name"]: o for o in world.ctx("object", "list", "--json").json()}
    assert listed[TOOL]["status"] == "available", listed[TOOL]
    assert listed[TOOL]["description"] == f"{TOOL} version 2", listed[TOOL]
    assert hidden_names(world) == [".install-lock"]


def test_a_reinstall_while_a_call_is_admitted_runs_the_new_version_after_its_hooks_again(world):
    """docs/tools.md "Hooks": admitted again by the new version, the call's pre-hooks see it a
    second time (the same call id), and the program run is the new one: one version for the
    whole call, never the old version's admission with the new program."""
    world.install(1, strict=False)
    gate = world.controls() / "hooks" / "pre.d" / "10-gate"
    gate.write_text(GATE.format(flags=str(world.flags)))
    gate.chmod(0o755)
    proc = world.start_native({"gate": True})
    assert wait_for(lambda: (world.flags / "gated").exists(), 20), "the pre-hook never ran"
    world.install(2, strict=False)
    world.go("gate")
    rc, result, _ = world.result_of(proc)

    assert rc == 0 and result["status"] == "ok", result
    assert result["output"]["version"] == 2, result
    seen = (world.flags / "hook-seen").read_text().split()
    assert seen == [result["call"], result["call"]], seen
    assert world.pair(result["session"], result["call"]) == ["tool_call", "tool_result"]
    assert world.log()[result["call"]]["status"] == "ok"


def test_a_running_call_ends_under_its_version_and_the_next_call_meets_the_new_one(world):
    """T-8, T-7, T-1: a call running while its tool is reinstalled ends as the version it
    started (its program is already running), recorded in the log the new version keeps; the
    policy, status and log are kept as the very same files; the next call is judged by the new
    schema and runs the new program."""
    before = {n: (world.controls() / n).stat().st_ino for n in ("policy", "status", "log")}
    proc = world.start_native({"v": 1, "hold": "a"})
    assert wait_for(lambda: world.started("a"), 20), "the call never started its program"
    world.install(2)
    world.go("a")
    rc, result, _ = world.result_of(proc)

    assert rc == 0 and result["status"] == "ok", result
    assert result["output"]["version"] == 1, result
    after = {n: (world.controls() / n).stat().st_ino for n in ("policy", "status", "log")}
    assert after == before
    assert world.log()[result["call"]]["status"] == "ok", "the running call's line is lost"
    assert world.pair(result["session"], result["call"]) == ["tool_call", "tool_result"]

    r, old_input = world.native({"v": 1})
    assert r.rc == 2 and old_input["error"]["stage"] == "schema", old_input
    r, new_input = world.native({"v": 2})
    assert r.rc == 0 and new_input["output"]["version"] == 2, new_input
    assert hidden_names(world) == [".install-lock"]


def test_worker_jobs_across_a_reinstall_each_run_whole_under_one_version(world):
    """W-1, T-8: a worker running while the tool is reinstalled with a new schema finishes the
    job it is running under the old version (done, version 1), fails a later job whose input
    only the old schema took with the new schema's EINVAL [schema], runs a job for the new
    schema under version 2, and keeps running: no job lost, none left claimed."""
    running = job_of(world, {"v": 1, "hold": "job"})
    with worker(world) as proc:
        assert wait_for(lambda: world.started("job"), 20), "the worker never ran the job"
        world.install(2)
        old = job_of(world, {"v": 1})
        new = job_of(world, {"v": 2})
        world.go("job")
        assert wait_for(lambda: settled(world, running, old, new), 30), world.queue.requests()
        assert proc.poll() is None, proc.communicate()

    state, result = outcome(world, running)
    assert (state, result["output"]["version"]) == ("done", 1), result
    state, result = outcome(world, old)
    assert state == "failed" and result["error"]["stage"] == "schema", result
    assert result["reason"].startswith("EINVAL: ") and result["reason"].endswith("[schema]")
    state, result = outcome(world, new)
    assert (state, result["output"]["version"]) == ("done", 2), result
    assert world.queue.entries("claimed") == set() and world.queue.entries("pending") == set()


# ================================================================ revocations and grants (P-*)


def test_a_revocation_during_a_call_refuses_the_next_call_naming_the_step(world):
    """P-5, P-6: the grant is read at every call.  A call running when the tool's own rule is
    revoked ends as it started; the next call is refused at stage ``authorize``, step 6 named
    (``ctx run`` exits 126, native mode gives the step in the result), and ``ctx policy
    explain`` says the same; revoking the agent's own rule instead names step 5; the grant put
    back in both layers admits the next call again."""
    rule = f"allow {LABEL} tool:{TOOL} execute"
    tool_policy, agent_policy = world.controls() / "policy", world.agent_control("policy")
    proc = world.start_native({"hold": "r"})
    assert wait_for(lambda: world.started("r"), 20)
    world.revoke(tool_policy, rule)
    world.go("r")
    rc, running, _ = world.result_of(proc)
    assert rc == 0 and running["status"] == "ok", running

    r, refused = world.native({})
    error = refused["error"]
    assert r.rc == 1 and (error["error"], error["stage"]) == ("EACCES", "authorize"), refused
    assert (error["step"], error["step_name"]) == (6, "tool/model policy"), error
    assert f"tool/{TOOL}.d/policy has no rule '{rule}'" in error["message"], error
    assert world.log()[refused["call"]]["step"] == 6
    term = world.ctx("run", "--agent", AGENT, TOOL)
    assert term.rc == 126 and "step 6 (tool/model policy)" in term.err, term
    explained = world.ctx("policy", "explain", AGENT, f"tool:{TOOL}", "execute")
    assert explained.rc == 1 and "deny: EACCES: step 6" in explained.out, explained

    world.allow(tool_policy, rule)
    world.revoke(agent_policy, rule)
    r, refused = world.native({})
    assert (refused["error"]["step"], refused["error"]["step_name"]) == (5, "object policy")
    assert f"agent/{AGENT}.d/policy has no rule '{rule}'" in refused["error"]["message"]

    world.allow(agent_policy, rule)
    r, admitted = world.native({})
    assert r.rc == 0 and admitted["output"]["version"] == 1, admitted


def test_hand_edits_that_leave_a_policy_unsafe_or_invalid_refuse_the_next_call(world):
    """P-1, P-5 step 4 and 6, docs/policy.md: a policy an editor leaves group-writable (mode
    0664) refuses the next call as not host-owned, naming the file and ``chmod go-w``; a rule
    given a trailing comment makes the agent's policy invalid, which grants nothing (step 5,
    the line named); each put right, the next call is admitted."""
    agent_policy, tool_policy = world.agent_control("policy"), world.controls() / "policy"
    agent_policy.chmod(0o664)
    _, refused = world.native({})
    error = refused["error"]
    assert (error["error"], error["step"]) == ("EACCES", 4), error
    assert f"agent/{AGENT}.d/policy is not host-owned" in error["message"], error
    assert "chmod go-w" in error["message"], error
    agent_policy.chmod(0o644)

    tool_policy.chmod(0o664)
    _, refused = world.native({})
    assert refused["error"]["step"] == 6, refused
    assert f"tool/{TOOL}.d/policy is not host-owned" in refused["error"]["message"], refused
    tool_policy.chmod(0o644)

    original = agent_policy.read_text()
    world.allow(agent_policy, f"allow {LABEL} tool:{TOOL} execute  # keep")
    _, refused = world.native({})
    assert refused["error"]["step"] == 5, refused
    assert "an invalid policy grants nothing" in refused["error"]["message"], refused
    agent_policy.write_text(original)

    r, admitted = world.native({})
    assert r.rc == 0 and admitted["status"] == "ok", admitted


def test_a_worker_meets_each_revocation_grant_and_switch_at_its_next_job(world):
    """W-1, P-6, docs/tools.md "status": a worker reads the grants at every job.  The job it
    is running when the tool's rule is revoked finishes done; the next one fails, its reason
    naming step 6 and stage ``authorize``; after the rule is put back a job is done again; a
    tool the administrator switches ``disabled`` fails the next job at stage ``resolve``
    (EACCES), and switched back on, runs the next; a pre-hook added by hand vetoes the next
    job, its message quoted (T-6).  The worker keeps running throughout."""
    rule = f"allow {LABEL} tool:{TOOL} execute"
    policy, status = world.controls() / "policy", world.controls() / "status"
    first = job_of(world, {"hold": "w"})
    with worker(world) as proc:
        assert wait_for(lambda: world.started("w"), 20)
        world.revoke(policy, rule)
        world.go("w")
        refused = job_of(world, {})
        assert wait_for(lambda: settled(world, first, refused), 20), world.queue.requests()
        world.allow(policy, rule)
        granted = job_of(world, {})
        assert wait_for(lambda: settled(world, granted), 20), world.queue.requests()
        status.write_text("disabled\n")
        disabled = job_of(world, {})
        assert wait_for(lambda: settled(world, disabled), 20), world.queue.requests()
        status.write_text("available\n")
        enabled = job_of(world, {})
        assert wait_for(lambda: settled(world, enabled), 20), world.queue.requests()
        veto = world.controls() / "hooks" / "pre.d" / "20-veto"
        veto.write_text("#!/bin/sh\necho 'frozen for the upgrade' >&2\nexit 3\n")
        veto.chmod(0o755)
        vetoed = job_of(world, {})
        assert wait_for(lambda: settled(world, vetoed), 20), world.queue.requests()
        assert proc.poll() is None, proc.communicate()

    assert outcome(world, first)[0] == "done"
    state, result = outcome(world, refused)
    assert state == "failed" and result["error"]["step"] == 6, result
    assert result["reason"].startswith("EACCES: step 6 (tool/model policy)"), result
    assert result["reason"].endswith("[authorize]"), result
    assert outcome(world, granted)[0] == "done"
    state, result = outcome(world, disabled)
    assert state == "failed", result
    assert (result["error"]["error"], result["error"]["stage"]) == ("EACCES", "resolve"), result
    assert "disabled" in result["reason"], result
    assert outcome(world, enabled)[0] == "done"
    state, result = outcome(world, vetoed)
    assert state == "failed" and result["error"]["stage"] == "hook", result
    assert (
        "hooks/pre.d/20-veto vetoed the call (exit 3): frozen for the upgrade" in result["reason"]
    )


# ================================================================== agents' controls (A-3)


def test_identity_and_mount_edits_hold_from_the_next_call(world, unprivileged_user):
    """A-3, P-5 step 1, docs/policy.md "What the chain reads": an agent's controls are read
    at every call.  A call running when its identity is edited keeps its uid; the next runs as
    the new uid and is recorded in that uid's home; an identity of uid 0 is refused at step 1;
    one an editor has truncated, or left half-written, refuses the call naming the file and
    what is wrong; a mount taken out of the mount control is not given to the next call."""
    identity = world.agent_control("identity")
    original = identity.read_text()
    user = unprivileged_user
    proc = world.start_native({"hold": "i"})
    assert wait_for(lambda: world.started("i"), 20)
    identity.write_text(json.dumps({"uid": user.uid, "gid": user.gid, "groups": [user.gid]}))
    world.go("i")
    rc, running, _ = world.result_of(proc)
    assert rc == 0 and running["output"]["uid"] == nobody_uid(), running

    r, moved = world.native({})
    assert r.rc == 0 and moved["output"]["uid"] == user.uid, moved
    assert moved["session"] == f"home/{user.uid}/agent/{AGENT}/session/default", moved
    assert world.pair(moved["session"], moved["call"]) == ["tool_call", "tool_result"]

    identity.write_text(json.dumps({"uid": 0, "gid": 0, "groups": []}))
    term = world.ctx("run", "--agent", AGENT, TOOL)
    assert term.rc == 126 and "step 1 (peer credentials)" in term.err, term
    assert "never runs as root" in term.err, term
    identity.write_text("")
    term = world.ctx("run", "--agent", AGENT, TOOL)
    assert term.rc == 126, term
    assert f"agent/{AGENT}.d/identity is invalid" in term.err and "empty" in term.err, term
    identity.write_text(original[: len(original) // 2])
    term = world.ctx("run", "--agent", AGENT, TOOL)
    assert term.rc == 126 and f"agent/{AGENT}.d/identity is invalid: not JSON" in term.err, term
    assert "Traceback" not in term.err, term

    identity.write_text(original)
    r, back = world.native({})
    assert r.rc == 0 and "/workspace" in back["output"]["targets"], back
    mounts = world.agent_control("mount")
    kept = [m for m in json.loads(mounts.read_text()) if m[1] != "/workspace"]
    mounts.write_text(json.dumps(kept))
    r, narrowed = world.native({})
    assert r.rc == 0 and narrowed["output"]["uid"] == nobody_uid(), narrowed
    assert "/workspace" not in narrowed["output"]["targets"], narrowed


def test_an_agent_deleted_while_its_call_runs(world):
    """A-3, S-2, T-7: the agent's entry and controls removed while its call runs: the running
    call ends and is recorded whole (session and tool log); the next call is refused at stage
    ``agent`` with ENOENT naming ``ctx agent list`` (terminal mode: exit 126, native: 1);
    ``ctx agent list`` no longer shows it; created again, it runs the next call."""
    agent_dir = world.storage / "agent"
    saved = world.top / "saved-agent"
    saved.mkdir()
    proc = world.start_native({"hold": "d"})
    assert wait_for(lambda: world.started("d"), 20)
    shutil.copytree(agent_dir / f"{AGENT}.d", saved / f"{AGENT}.d")
    shutil.copy2(agent_dir / AGENT, saved / AGENT)
    (agent_dir / AGENT).unlink()
    shutil.rmtree(agent_dir / f"{AGENT}.d")
    world.go("d")
    rc, running, _ = world.result_of(proc)
    assert rc == 0 and running["status"] == "ok", running
    assert world.pair(running["session"], running["call"]) == ["tool_call", "tool_result"]
    assert world.log()[running["call"]]["status"] == "ok"

    r, refused = world.native({})
    assert r.rc == 1 and (refused["error"]["error"], refused["error"]["stage"]) == (
        "ENOENT",
        "agent",
    ), refused
    assert "ctx agent list" in refused["error"]["message"], refused
    term = world.ctx("run", "--agent", AGENT, TOOL)
    assert term.rc == 126 and f"there is no agent '{AGENT}'" in term.err, term
    listed = world.ctx("agent", "list")
    assert listed.rc == 0 and AGENT not in listed.out.split(), listed

    shutil.copytree(saved / f"{AGENT}.d", agent_dir / f"{AGENT}.d")
    shutil.copy2(saved / AGENT, agent_dir / AGENT)
    r, again = world.native({})
    assert r.rc == 0 and again["status"] == "ok", again


def test_a_worker_whose_agent_is_deleted_stops_and_leaves_the_other_jobs_pending(world):
    """W-1, docs/workers.md: a worker refuses to start for an agent that does not exist and
    leaves the jobs pending ("a worker nobody may run would claim every job only to fail it").
    An agent deleted while its worker runs is the same: no later job can run as it, none by
    its own fault, and another worker (of another agent) could run them.  The job running at
    the deletion finishes; the worker stops (exit 1, naming the agent's absence and what
    requeues the job it had claimed) rather than drain the queue into failed/, and after
    ``ctx queue recover`` every later job is pending."""
    running = job_of(world, {"hold": "x"})
    with worker(world) as proc:
        assert wait_for(lambda: world.started("x"), 20)
        later = [job_of(world, {}) for _ in range(3)]
        (world.storage / "agent" / AGENT).unlink()
        shutil.rmtree(world.storage / "agent" / f"{AGENT}.d")
        world.go("x")
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 1, stderr
    assert "no job can run as this worker's agent" in stderr and "[agent]" in stderr, stderr
    assert "ctx queue recover" in stderr, stderr
    assert outcome(world, running)[0] == "done"
    states = [world.queue.state(job) for job in later]
    assert sorted(states) == ["claimed", "pending", "pending"], states
    recovered = world.queue.run("recover")
    assert recovered.rc == 0, recovered
    states = {job: world.queue.state(job) for job in later}
    assert set(states.values()) == {"pending"}, states


# ====================================================================== shared spaces


def test_a_space_given_another_group_under_a_running_call(world):
    """X-1, S-6, P-5 step 2: an agent in the group of space ``team`` runs the space's tool
    with its session in the space.  ``ctx shared create team --group`` gives the space another
    group while the call runs: the running call ends and its events reach the space's session;
    the next call with its session there is refused at stage ``session``, step 2 (mode bits)
    named, and creates nothing; a call of the space's tool from the agent's home session is
    refused at step 2 as well; the group given back, the next call runs."""
    made = world.ctx("shared", "create", SPACE, "--group", str(TEAM_GID))
    assert made.rc == 0, made
    world.install(1, name=SHARED_TOOL, tier=f"shared:{SPACE}", strict=False)
    tier = f"shared/{SPACE}/tool"
    world.allow(
        world.controls(SHARED_TOOL, tier) / "policy", f"allow mate_t tool:{SHARED_TOOL} execute"
    )
    mate = {
        "name": "mate",
        "label": "mate_t",
        "tools": [SHARED_TOOL],
        "shared": {SPACE: ["read", "write"]},
        "mount": [[str(world.ws), "/workspace", "rw"]],
    }
    created = world.ctx("agent", "create", "-", "--groups", str(TEAM_GID), input=json.dumps(mate))
    assert created.rc == 0, created
    session = f"shared/{SPACE}/agent/mate/session/default"

    def call(*options: str, hold: str | None = None) -> subprocess.Popen:
        argv = ["run", "--native", "--agent", "mate", *options, SHARED_TOOL]
        proc = subprocess.Popen(
            [*CTX_ARGV, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=world.env,
        )  # fmt: skip
        world.background.append(proc)
        assert proc.stdin is not None
        proc.stdin.write(json.dumps({"hold": hold} if hold else {}).encode())
        proc.stdin.close()
        proc.stdin = None  # written and closed: communicate() must not flush it
        return proc

    proc = call("--project", SPACE, hold="g")
    assert wait_for(lambda: world.started("g"), 20)
    regrouped = world.ctx("shared", "create", SPACE, "--group", str(OTHER_GID))
    assert regrouped.rc == 0 and "regrouped" in regrouped.out, regrouped
    world.go("g")
    rc, running, _ = world.result_of(proc)
    assert rc == 0 and running["session"] == session, running
    assert TEAM_GID in running["output"]["groups"], running
    assert world.pair(session, running["call"]) == ["tool_call", "tool_result"]
    before = sorted(os.listdir(world.storage / "shared" / SPACE / "agent" / "mate" / "session"))

    rc, refused, _ = world.result_of(call("--project", SPACE))
    error = refused["error"]
    assert rc == 1 and (error["error"], error["stage"]) == ("EACCES", "session"), refused
    assert (error["step"], error["step_name"]) == (2, "mode bits"), error
    assert f"shared/{SPACE}" in error["message"], error
    after = sorted(os.listdir(world.storage / "shared" / SPACE / "agent" / "mate" / "session"))
    assert after == before
    rc, refused, _ = world.result_of(call())
    assert rc == 1 and refused["error"]["error"] in ("EACCES", "ENOENT"), refused
    assert refused["error"]["step"] in (2, None) and refused["exit_status"] is None, refused

    back = world.ctx("shared", "create", SPACE, "--group", str(TEAM_GID))
    assert back.rc == 0, back
    rc, again, _ = world.result_of(call("--project", SPACE))
    assert rc == 0 and again["status"] == "ok", again
