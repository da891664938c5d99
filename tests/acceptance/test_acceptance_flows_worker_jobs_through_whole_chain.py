"""Jobs run by real ``ctx queue work`` workers whose tools meet every stage of the tool runner
and every step of the authority chain: each job must end in the state SPEC gives it, its
result must say why (an errno-style ``reason`` naming the stage), the session and the tool's
log must record the call, and the worker must go on to the next job.

What is set up, with real processes, uids and files only: a bootstrapped storage root, agents
made with ``ctx agent create`` (running as ``nobody``, root's default, or as the test user when
that user owns its own root), tools installed from v2 manifests (T-8) — shell scripts, pre- and
post-hooks, a tool that never ends, a tool that prints text, a tool projected by ``ctxmcp``
from a scripted stdio MCP server — and controls changed by hand between publish and claim,
while a pre-hook holds a claimed job, and between two jobs of a worker that waits for work.

Requirements checked:

* W-1: a job whose call is denied at step 1, 2, 3, 4, 5 or 6 of the chain (P-5, P-6) ends in
  ``failed/`` with ``EACCES`` at stage ``authorize`` and the denying step; a later job the
  chain allows ends in ``done/``;
* W-1, T-6, docs/tools.md "Running a tool": input failing the tool's schema (``EINVAL``,
  stage ``schema``), a pre-hook veto (``EACCES``, stage ``hook``), a pre-hook that outlives
  the job's timeout, a tool removed (``ENOENT``, stage ``resolve``) or disabled (``EACCES``)
  after publish, a non-zero exit (stage ``exit``) fail the job; a failing post-hook changes
  nothing (``done/``, recorded in ``post_hooks``); output that is not JSON is kept as text;
* W-4: a job that exceeds the worker's ``--timeout`` is killed and failed with ``ETIMEDOUT``;
* T-8, docs/tools.md "How an install stays atomic": a tool reinstalled between publish and
  claim runs as its new version and keeps its policy; one reinstalled while a claimed job's
  pre-hook runs is admitted again by the new version's schema; one removed and installed
  afresh has a policy that grants nothing;
* P-6: the policy is read at every call: grants changed between two jobs of one running
  worker decide each job; an agent removed while the worker waits stops it (exit 1), its
  job left claimed for ``ctx queue recover``;
* M-4: an MCP-backed tool projected by ``ctxmcp`` runs under the same chain and schema, and
  its remote failures and timeouts fail the job with a reason;
* §2.4, S-2, S-5, T-7: every finished job has ``queue.claim``, ``queue.start``,
  ``tool_call``, ``tool_result`` and ``queue.finish`` in the worker's session and one line in
  the tool's log; ``ctx queue show --json`` reads the result on disk; ``ctx queue status``
  and the worker's summary count what the disk holds; ``--drain`` exits 0, SIGTERM exits 0;
* a non-root host administrator's worker (the test user on its own root) fails a job of an
  agent with another uid at step 1 and runs its own agent's; a worker of a uid that may not
  use the queue exits 1 having claimed nothing.
"""

from __future__ import annotations

import contextlib
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
    QueueCLI,
    clean_env,
    ctx_run,
    new_scratch_dir,
    processes_of,
    read_jsonl,
    scratch_top,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser
from tests.support.users import unprivileged_user as unprivileged_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as another uid than the host: needs root"
)

TOP = scratch_top(__file__)
TRACEBACK = "Traceback (most recent call last)"
SCRIPTED_SERVER = Path(__file__).resolve().parents[1] / "mcp" / "scripted_server.py"
HOST_PYTHON = shutil.which("python3", path="/usr/bin:/bin")
OK_TOOL = "#!/bin/sh\ncat >/dev/null\necho '{\"ran\": true}'\n"


# ------------------------------------------------------------------------------ helpers


@dataclass
class World:
    """A bootstrapped storage root in a directory every uid may search."""

    top: Path
    storage: Path
    as_user: UnprivilegedUser | None = None

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    def ctx(self, *args, input: str = "", timeout: float = 60) -> subprocess.CompletedProcess:
        """``ctx ARGS`` as root, or as the test user when this root is that user's."""
        who = {}
        if self.as_user is not None:
            who = {"user": self.as_user.uid, "group": self.as_user.gid, "extra_groups": []}
        done = subprocess.run(
            [*CTX_ARGV, *map(str, args)],
            input=input, capture_output=True, text=True, env=self.env, cwd=self.top,
            timeout=timeout, **who,
        )  # fmt: skip
        assert TRACEBACK not in done.stderr, done.stderr
        return done

    def queue(self, project: str) -> QueueCLI:
        if not (self.storage / "shared" / project / "queue").is_dir():
            made = self.ctx("queue", "init", "--project", project)
            assert made.returncode == 0, made
        return QueueCLI(self.storage, project)

    def publish(self, project: str, name: str, tool: str, value: dict) -> str:
        done = self.ctx("queue", "publish", "--project", project, "--name", name, "-",
                        input=json.dumps({"tool": tool, "input": value}))  # fmt: skip
        assert done.returncode == 0, done
        return done.stdout.strip()

    def publish_batch(self, project: str, jobs: list[tuple[str, dict]]) -> list[str]:
        """``ctx queue publish --batch -`` of one request per ``(tool, input)``: their names,
        in order (one group commit instead of a process per job)."""
        lines = "".join(json.dumps({"tool": t, "input": v}) + "\n" for t, v in jobs)
        done = self.ctx("queue", "publish", "--project", project, "--batch", "-", input=lines)
        assert done.returncode == 0, done
        names = done.stdout.split()
        assert len(names) == len(jobs), done
        return names

    def agent(self, name: str, tools: list[str], **extra) -> dict:
        req = {"name": name, "label": f"{name}_t", "tools": tools, **extra}
        made = self.ctx("agent", "create", "-", "--json", input=json.dumps(req))
        assert made.returncode == 0, made
        return json.loads(made.stdout)

    def install(self, name: str, program: str, *, schema: dict | None = None,
                grant: tuple[str, ...] = ()) -> Path:  # fmt: skip
        """Tool ``name`` (a shell script) installed into the system tier, its own policy
        granting ``grant`` (labels); the install's answer must be success."""
        source = self.top / "src" / name
        source.mkdir(parents=True, exist_ok=True)
        source.chmod(0o755)
        (source / "prog").write_text(program)
        (source / "prog").chmod(0o755)
        manifest = source / "manifest.json"
        manifest.write_text(json.dumps({
            "manifest": 2, "kind": "tool", "name": name, "description": f"{name} for a test",
            "schema": schema or {"type": "object"},
            "cap": {"side_effects": False, "network": False}, "exec": "prog",
        }))  # fmt: skip
        done = self.ctx("object", "install", manifest, "--tier", "system")
        assert done.returncode == 0, done
        for label in grant:
            self.allow_in_tool(name, label)
        return self.storage / "tool" / name

    def allow_in_tool(self, tool: str, label: str) -> None:
        with open(self.storage / "tool" / f"{tool}.d" / "policy", "a") as policy:
            policy.write(f"allow {label} tool:{tool} execute\n")

    def hook(self, tool: str, when: str, name: str, program: str) -> None:
        hook = self.storage / "tool" / f"{tool}.d" / "hooks" / f"{when}.d" / name
        hook.write_text(program)
        hook.chmod(0o755)
        if self.as_user is not None:
            os.chown(hook, self.as_user.uid, self.as_user.gid)

    def drain(self, project: str, agent: str, *args: str) -> tuple[int, list[dict], str]:
        """``ctx queue work --drain --json`` to its end: exit status, events, stderr."""
        done = self.ctx("queue", "work", "--project", project, "--agent", agent, "--drain",
                        "--json", *args, timeout=90)  # fmt: skip
        return done.returncode, [json.loads(x) for x in done.stdout.splitlines()], done.stderr

    def session(self, uid: int, agent: str) -> list[dict]:
        return read_jsonl(self.storage / f"home/{uid}/agent/{agent}/session/worker/events.jsonl")

    def tool_log(self, tool: str) -> list[dict]:
        return read_jsonl(self.storage / "tool" / f"{tool}.d" / "log")


@contextlib.contextmanager
def world_at(template: Path, as_user: UnprivilegedUser | None = None) -> Iterator[World]:
    top = new_scratch_dir(TOP, "w-")
    try:
        storage = copy_of_root(template, top / "storage")
        if as_user is not None:
            for path in (top, storage, *storage.rglob("*")):
                os.chown(path, as_user.uid, as_user.gid, follow_symlinks=False)
        yield World(top, storage, as_user)
    finally:
        shutil.rmtree(top, ignore_errors=True)


# Tools for the ways a call can end (docs/tools.md "Running a tool"), installed once per
# test process into a template root (an install is a process; a copy of the root is cheap).
ABI_TOOLS = {
    "t.schema": (
        OK_TOOL,
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
    ),
    "t.veto": (OK_TOOL, None),
    "t.slowhook": (OK_TOOL, None),
    "t.post": (OK_TOOL, None),
    "t.slow": ("#!/bin/sh\nexec sleep 60\n", None),
    "t.text": ("#!/bin/sh\necho 'plain words, not JSON'\n", None),
    "t.exit": ("#!/bin/sh\necho 'it broke here' >&2\nexit 3\n", None),
    "t.errno": ('#!/bin/sh\necho \'{"errno": 2, "message": "no such page"}\'\nexit 1\n', None),
    "t.removed": (OK_TOOL, None),
    "t.disabled": (OK_TOOL, None),
    "t.ok": (OK_TOOL, None),
}
TEMPLATE_TOOLS = {**ABI_TOOLS, "t.closed": (OK_TOOL, None), "t.fresh": (OK_TOOL, None)}


@pytest.fixture(scope="module")
def tooled_template(_template: Path) -> Iterator[Path]:
    """The bootstrapped root with :data:`TEMPLATE_TOOLS` installed, their policies granting
    nothing yet (T-8: installing grants nothing)."""
    with world_at(_template) as made:
        for name, (program, schema) in TEMPLATE_TOOLS.items():
            made.install(name, program, schema=schema)
        yield made.storage


@pytest.fixture
def world(tooled_template: Path) -> Iterator[World]:
    with world_at(tooled_template) as made:
        yield made


def nobody_uid(made: dict) -> int:
    return made["identity"]["uid"]


def finished(world: World, project: str, job: str, *, uid: int, agent: str, events: list[dict],
             state: str, errno: str | None, stage: str | None,
             step: int | None = None, show: bool = False) -> dict:  # fmt: skip
    """Check every record of one finished job and return its result: the one terminal pair
    (§2.1), the result's ``error`` and errno-style ``reason`` (docs/workers.md), what ``ctx
    queue show --json`` reads (when ``show``), the worker's ``finish`` event, the session's
    queue and call events (S-2, S-5) and the tool log's line (T-7)."""
    queue = QueueCLI(world.storage, project)
    got_state, result = queue.only_result(job)
    assert got_state == state, (job, result)
    assert result["status"] == ("ok" if state == "done" else "error"), result
    if state == "done":
        assert result["error"] is None and result["reason"] is None, result
    else:
        error = result["error"]
        assert (error["error"], error["stage"], error["step"]) == (errno, stage, step), result
        assert result["reason"].endswith(f"[{stage}]"), result["reason"]
        if errno is not None:
            assert result["reason"].startswith(f"{errno}: "), result["reason"]
            assert error["errno"] == getattr(__import__("errno"), errno), error
    if show:
        shown = world.ctx("queue", "show", "--project", project, job, "--json")
        assert shown.returncode == 0, shown
        assert json.loads(shown.stdout)["state"] == state
        assert json.loads(shown.stdout)["result"] == result
    (fin,) = [e for e in events if e.get("event") == "finish" and e["job"] == job]
    assert (fin["state"], fin["reason"]) == (state, result["reason"]), fin
    mine = [e for e in world.session(uid, agent)
            if e.get("object") == f"queue/{job}" or e.get("job") == job
            or e.get("call") == result["call"]]  # fmt: skip
    kinds = [e["type"] for e in mine]
    assert kinds == ["queue.claim", "queue.start", "tool_call", "tool_result", "queue.finish"], (
        kinds
    )
    tool_result, queue_finish = mine[3], mine[4]
    assert tool_result["call"] == mine[2]["call"] == result["call"]
    assert tool_result["status"] == result["status"]
    assert tool_result.get("errno") == errno and tool_result.get("stage") == stage, tool_result
    assert queue_finish["state"] == state and queue_finish["queue"] == f"shared/{project}/queue"
    if (world.storage / "tool" / f"{result['tool']}.d").is_dir():
        lines = [x for x in world.tool_log(result["tool"]) if x.get("call") == result["call"]]
        assert len(lines) == 1 and lines[0]["job"] == job, lines
        assert lines[0].get("errno") == errno and lines[0].get("stage") == stage, lines
    return result


def stop_event(events: list[dict]) -> dict:
    assert events[0]["event"] == "start" and events[-1]["event"] == "stop", events
    return events[-1]


def status_counts(world: World, project: str) -> dict:
    shown = world.ctx("queue", "status", "--project", project, "--json")
    assert shown.returncode == 0, shown
    return json.loads(shown.stdout)


# ---------------------------------------------------------------- the six steps of the chain


def deny_step_1(world: World, project: str) -> tuple[str, int]:
    """An agent whose identity is uid 0: never run as root (step 1)."""
    world.agent("s1", ["t.ok"])
    identity = world.storage / "agent" / "s1.d" / "identity"
    held = json.loads(identity.read_text())
    identity.write_text(json.dumps({**held, "uid": 0}))
    world.allow_in_tool("t.ok", "s1_t")
    return "s1", 0


def deny_step_2(world: World, project: str) -> tuple[str, int]:
    """A tool of mode 0750 root:root: no execute bit for the agent's uid (step 2)."""
    made = world.agent("s2", ["t.ok", "t.closed"])
    world.allow_in_tool("t.closed", "s2_t")
    (world.storage / "tool" / "t.closed").chmod(0o750)
    world.allow_in_tool("t.ok", "s2_t")
    return "s2", nobody_uid(made)


def deny_step_3(world: World, project: str) -> tuple[str, int]:
    """An agent whose mount table holds nothing: no tool is visible (step 3)."""
    made = world.agent("s3", ["t.ok"])
    (world.storage / "agent" / "s3.d" / "mount").write_text("[]\n")
    world.allow_in_tool("t.ok", "s3_t")
    return "s3", nobody_uid(made)


def deny_step_4(world: World, project: str) -> tuple[str, int]:
    """An agent policy others may write (step 4, StrictModes)."""
    made = world.agent("s4", ["t.ok"])
    (world.storage / "agent" / "s4.d" / "policy").chmod(0o666)
    world.allow_in_tool("t.ok", "s4_t")
    return "s4", nobody_uid(made)


def deny_step_5(world: World, project: str) -> tuple[str, int]:
    """The tool's policy grants it, the agent's does not (step 5)."""
    made = world.agent("s5", ["t.ok"])
    world.allow_in_tool("t.closed", "s5_t")
    world.allow_in_tool("t.ok", "s5_t")
    return "s5", nobody_uid(made)


def deny_step_6(world: World, project: str) -> tuple[str, int]:
    """The agent's policy grants it, the tool's does not (step 6)."""
    made = world.agent("s6", ["t.ok", "t.closed"])
    world.allow_in_tool("t.ok", "s6_t")
    return "s6", nobody_uid(made)


# step -> (set-up, the tool the denied job calls, whether the agent itself is refused)
STEPS = {
    1: (deny_step_1, "t.ok", True),
    2: (deny_step_2, "t.closed", False),
    3: (deny_step_3, "t.ok", True),
    4: (deny_step_4, "t.ok", True),
    5: (deny_step_5, "t.closed", False),
    6: (deny_step_6, "t.closed", False),
}


@pytest.mark.parametrize("step", sorted(STEPS))
def test_a_job_denied_at_each_step_of_the_chain_fails_with_that_step(
    world: World, step: int
) -> None:
    """W-1, P-5, P-6: the denied job ends in ``failed/`` with ``EACCES`` at stage
    ``authorize`` naming the step; the worker goes on: the next job ends ``done/`` when only
    the tool was refused, ``failed/`` at the same step when the agent itself is; ``--drain``
    exits 0 and its summary and ``ctx queue status`` count what the disk holds."""
    set_up, tool, agent_wide = STEPS[step]
    agent, uid = set_up(world, "proj")
    world.queue("proj")
    denied, after = world.publish_batch("proj", [(tool, {}), ("t.ok", {})])
    rc, events, err = world.drain("proj", agent)
    assert rc == 0, err
    finished(world, "proj", denied, uid=uid, agent=agent, events=events,
             state="failed", errno="EACCES", stage="authorize", step=step,
             show=True)  # fmt: skip
    if agent_wide:
        finished(world, "proj", after, uid=uid, agent=agent, events=events,
                 state="failed", errno="EACCES", stage="authorize", step=step)  # fmt: skip
    else:
        result = finished(world, "proj", after, uid=uid, agent=agent, events=events,
                          state="done", errno=None, stage=None)  # fmt: skip
        assert result["output"] == {"ran": True}
    summary = stop_event(events)
    done_count = 0 if agent_wide else 1
    assert (summary["done"], summary["failed"], summary["lost"]) == (done_count, 2 - done_count, 0)
    counts = status_counts(world, "proj")
    assert (counts["done"], counts["failed"], counts["pending"], counts["claimed"]) == (
        done_count, 2 - done_count, 0, 0,
    ), counts  # fmt: skip


# ---------------------------------------------------------- the tool ABI, one worker, all jobs


@pytest.fixture
def abi_world(world: World) -> tuple[World, int]:
    """Agent ``ci`` granted (both layers) a tool for each way a call can end."""
    names = sorted(ABI_TOOLS)
    made = world.agent("ci", names)
    for name in names:
        world.allow_in_tool(name, "ci_t")
    world.hook("t.veto", "pre", "10-guard", "#!/bin/sh\necho 'not on my watch' >&2\nexit 3\n")
    world.hook("t.slowhook", "pre", "10-slow", "#!/bin/sh\nexec sleep 60\n")
    world.hook("t.post", "post", "10-after", "#!/bin/sh\necho 'post complains' >&2\nexit 4\n")
    return world, nobody_uid(made)


# job -> (tool, input, state, errno, stage)
ABI_JOBS = {
    "schema": ("t.schema", {"n": "seven"}, "failed", "EINVAL", "schema"),
    "veto": ("t.veto", {}, "failed", "EACCES", "hook"),
    "slowhook": ("t.slowhook", {}, "failed", "EACCES", "hook"),
    "post": ("t.post", {}, "done", None, None),
    "timeout": ("t.slow", {}, "failed", "ETIMEDOUT", "run"),
    "text": ("t.text", {}, "done", None, None),
    "exit": ("t.exit", {}, "failed", None, "exit"),
    "errno": ("t.errno", {}, "failed", "ENOENT", "exit"),
    "removed": ("t.removed", {}, "failed", "ENOENT", "resolve"),
    "disabled": ("t.disabled", {}, "failed", "EACCES", "resolve"),
    "last": ("t.ok", {"after": "all the others"}, "done", None, None),
}


def test_every_way_a_call_ends_is_one_finished_job_with_its_reason(
    abi_world: tuple[World, int],
) -> None:
    """W-1, W-4, T-6, T-7, S-2: one worker runs a job for each way the runner ends a call;
    each ends in the state and with the errno and stage docs/tools.md gives it, recorded in
    the session and the tool's log, and the worker reaches the last job and exits 0."""
    world, uid = abi_world
    world.queue("abi")
    names = world.publish_batch("abi", [(tool, value) for tool, value, *_ in ABI_JOBS.values()])
    jobs = dict(zip(ABI_JOBS, names, strict=True))
    # Between publish and claim: one tool removed, one switched off by the administrator.
    shutil.rmtree(world.storage / "tool" / "t.removed.d")
    (world.storage / "tool" / "t.removed").unlink()
    (world.storage / "tool" / "t.disabled.d" / "status").write_text("disabled\n")
    rc, events, err = world.drain("abi", "ci", "--timeout", "1")
    assert rc == 0, err
    results = {}
    for key, (_tool, _value, state, errno, stage) in ABI_JOBS.items():
        results[key] = finished(world, "abi", jobs[key], uid=uid, agent="ci", events=events,
                                state=state, errno=errno, stage=stage,
                                show=key in ("timeout", "text"))  # fmt: skip
    assert "not on my watch" in results["veto"]["reason"]
    assert "timeout" in results["slowhook"]["reason"], results["slowhook"]
    assert results["timeout"]["exit_status"] == 137  # its process group was SIGKILLed
    assert results["text"]["output"] == "plain words, not JSON\n"
    assert "it broke here" in results["exit"]["reason"]
    assert results["exit"]["exit_status"] == 3
    assert "no such page" in results["errno"]["reason"]
    assert results["last"]["output"] == {"ran": True}
    # The failing post-hook changed nothing but is recorded with the call (T-6).
    (posted,) = [
        e
        for e in world.session(uid, "ci")
        if e["type"] == "tool_result" and e["call"] == results["post"]["call"]
    ]
    assert posted["post_hooks"] == [
        {"hook": "hooks/post.d/10-after", "exit_status": 4, "message": "post complains"}
    ]
    # The job's own result says it too: a reader of done/ need not find the session.
    assert results["post"]["post_hooks"] == posted["post_hooks"], results["post"]
    assert results["last"]["post_hooks"] == [], results["last"]
    summary = stop_event(events)
    failed = sum(1 for spec in ABI_JOBS.values() if spec[2] == "failed")
    assert (summary["done"], summary["failed"], summary["lost"]) == (
        len(ABI_JOBS) - failed, failed, 0,
    )  # fmt: skip
    assert summary["left_pending"] == {} and summary["left_claimed"] == []
    QueueCLI(world.storage, "abi").assert_settled()


# ----------------------------------------------------- tools changed between publish and run


def test_a_tool_reinstalled_between_publish_and_claim_runs_as_its_new_version(
    world: World,
) -> None:
    """T-8, W-1: jobs published for version 1 run version 2, judged by version 2's schema,
    with the policy the reinstall kept; a tool removed and installed afresh grants nothing
    (step 6) until the administrator grants it again."""
    made = world.agent("ci", ["t.up", "t.fresh"])
    uid = nobody_uid(made)
    world.install("t.up", "#!/bin/sh\necho '{\"version\": 1}'\n", grant=("ci_t",))
    world.allow_in_tool("t.fresh", "ci_t")
    world.queue("proj")
    fits = world.publish("proj", "fits", "t.up", {"n": 1})
    old_input = world.publish("proj", "old-input", "t.up", {})
    fresh = world.publish("proj", "fresh", "t.fresh", {})
    world.install("t.up", "#!/bin/sh\necho '{\"version\": 2}'\n",
                  schema={"type": "object", "required": ["n"]})  # fmt: skip
    shutil.rmtree(world.storage / "tool" / "t.fresh.d")
    (world.storage / "tool" / "t.fresh").unlink()
    world.install("t.fresh", OK_TOOL)
    rc, events, err = world.drain("proj", "ci")
    assert rc == 0, err
    result = finished(world, "proj", fits, uid=uid, agent="ci", events=events,
                      state="done", errno=None, stage=None)  # fmt: skip
    assert result["output"] == {"version": 2}
    finished(world, "proj", old_input, uid=uid, agent="ci", events=events,
             state="failed", errno="EINVAL", stage="schema")  # fmt: skip
    finished(world, "proj", fresh, uid=uid, agent="ci", events=events,
             state="failed", errno="EACCES", stage="authorize", step=6)  # fmt: skip


class Gate:
    """A pre-hook that reports it started and then waits for ``open()``, holding a claimed
    job between its admission by the chain and the start of its tool."""

    def __init__(self, world: World, tool: str) -> None:
        self.dir = world.top / "gate"
        self.dir.mkdir(mode=0o1777, exist_ok=True)
        self.dir.chmod(0o1777)
        world.hook(tool, "pre", "10-gate",
                   f"#!/bin/sh\ntouch {self.dir}/waiting\n"
                   f"while [ ! -e {self.dir}/open ]; do sleep 0.02; done\n")  # fmt: skip

    def wait_until_held(self, worker: subprocess.Popen) -> None:
        assert wait_for(lambda: (self.dir / "waiting").exists() or worker.poll() is not None)
        assert worker.poll() is None, worker.communicate()

    def open(self) -> None:
        (self.dir / "open").touch()


def start_worker(world: World, project: str, agent: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [*CTX_ARGV, "queue", "work", "--project", project, "--agent", agent, "--json", *args],
        env=world.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


@contextlib.contextmanager
def worker_running(world: World, project: str, agent: str, *args: str):
    proc = start_worker(world, project, agent, *args)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_a_tool_reinstalled_while_its_claimed_job_is_in_pre_hooks_is_judged_again(
    world: World,
) -> None:
    """docs/tools.md "Hooks", "How an install stays atomic": the job is admitted again by
    the new version: its input fails the new schema, so neither version's program runs and
    the job fails with ``EINVAL`` at stage ``schema``."""
    made = world.agent("ci", ["t.gate"])
    marks = world.top / "marks"
    marks.mkdir(mode=0o1777)
    marks.chmod(0o1777)
    world.install("t.gate", f"#!/bin/sh\ntouch {marks}/v1\necho '{{}}'\n", grant=("ci_t",))
    gate = Gate(world, "t.gate")
    world.queue("proj")
    job = world.publish("proj", "gated", "t.gate", {})
    with worker_running(world, "proj", "ci", "--drain", "--timeout", "20") as worker:
        gate.wait_until_held(worker)
        world.install("t.gate", f"#!/bin/sh\ntouch {marks}/v2\necho '{{}}'\n",
                      schema={"type": "object", "required": ["n"]})  # fmt: skip
        gate.open()
        out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    events = [json.loads(x) for x in out.splitlines()]
    finished(world, "proj", job, uid=nobody_uid(made), agent="ci", events=events,
             state="failed", errno="EINVAL", stage="schema")  # fmt: skip
    assert sorted(os.listdir(marks)) == []


def test_a_grant_revoked_while_a_claimed_job_is_in_pre_hooks_then_decides_the_next(
    world: World,
) -> None:
    """P-6, W-1: the agent's grant is taken away while a claimed job waits in its pre-hook.
    That job ends in one terminal state with consistent records (run, or refused at step 5);
    the next job, claimed after the change, fails at step 5, and the worker exits 0."""
    made = world.agent("ci", ["t.gate", "t.ok"])
    uid = nobody_uid(made)
    world.install("t.gate", OK_TOOL, grant=("ci_t",))
    world.allow_in_tool("t.ok", "ci_t")
    gate = Gate(world, "t.gate")
    world.queue("proj")
    first = world.publish("proj", "first", "t.gate", {})
    with worker_running(world, "proj", "ci", "--drain", "--timeout", "20") as worker:
        gate.wait_until_held(worker)
        policy = world.storage / "agent" / "ci.d" / "policy"
        kept = [x for x in policy.read_text().splitlines() if "tool:" not in x]
        policy.write_text("\n".join(kept) + "\n")
        second = world.publish("proj", "second", "t.ok", {})
        gate.open()
        out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    events = [json.loads(x) for x in out.splitlines()]
    state, _result = QueueCLI(world.storage, "proj").only_result(first)
    if state == "done":
        finished(world, "proj", first, uid=uid, agent="ci", events=events,
                 state="done", errno=None, stage=None)  # fmt: skip
    else:
        finished(world, "proj", first, uid=uid, agent="ci", events=events,
                 state="failed", errno="EACCES", stage="authorize", step=5)  # fmt: skip
    finished(world, "proj", second, uid=uid, agent="ci", events=events,
             state="failed", errno="EACCES", stage="authorize", step=5)  # fmt: skip


def test_policy_changes_between_jobs_of_a_waiting_worker_decide_each_job(world: World) -> None:
    """P-6 (the policy is read at every call), W-2, §2.4: a worker waiting for work runs a
    granted job, fails one published after the grant was taken away, runs one published
    after it was given back, and exits 0 on SIGTERM with a summary counting the three."""
    made = world.agent("ci", ["t.ok"])
    uid = nobody_uid(made)
    world.allow_in_tool("t.ok", "ci_t")
    queue = world.queue("proj")
    policy = world.storage / "agent" / "ci.d" / "policy"
    granted = policy.read_text()
    with worker_running(world, "proj", "ci") as worker:
        one = world.publish("proj", "one", "t.ok", {})
        assert wait_for(lambda: queue.state(one) == "done"), queue.requests()
        policy.write_text(granted.replace("allow ci_t tool:t.ok execute\n", ""))
        two = world.publish("proj", "two", "t.ok", {})
        assert wait_for(lambda: queue.state(two) == "failed"), queue.requests()
        policy.write_text(granted)
        three = world.publish("proj", "three", "t.ok", {})
        assert wait_for(lambda: queue.state(three) == "done"), queue.requests()
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err
    events = [json.loads(x) for x in out.splitlines()]
    for job, state in ((one, "done"), (three, "done")):
        finished(world, "proj", job, uid=uid, agent="ci", events=events,
                 state=state, errno=None, stage=None)  # fmt: skip
    finished(world, "proj", two, uid=uid, agent="ci", events=events,
             state="failed", errno="EACCES", stage="authorize", step=5)  # fmt: skip
    summary = stop_event(events)
    assert (summary["done"], summary["failed"], summary["stopped_by"]) == (2, 1, "SIGTERM")
    queue.assert_settled()


def test_an_agent_removed_while_its_worker_waits_stops_it_leaving_the_job_claimed(
    world: World,
) -> None:
    """docs/workers.md "A host that runs short": a call refused at stage ``agent`` judges
    the worker's agent, not the job: the worker exits 1 with ``ENOENT``, the job is left
    claimed (``ctx queue show`` says its holder is gone, ``status`` exits 0) and ``ctx queue
    recover`` puts it back in ``pending/`` for another worker."""
    world.agent("ci", ["t.ok"])
    world.allow_in_tool("t.ok", "ci_t")
    queue = world.queue("proj")
    with worker_running(world, "proj", "ci") as worker:
        one = world.publish("proj", "one", "t.ok", {})
        assert wait_for(lambda: queue.state(one) == "done"), queue.requests()
        shutil.rmtree(world.storage / "agent" / "ci.d")
        (world.storage / "agent" / "ci").unlink()
        two = world.publish("proj", "two", "t.ok", {})
        out, err = worker.communicate(timeout=60)
    assert worker.returncode == 1, err
    assert "ENOENT" in err and two in err and TRACEBACK not in err, err
    events = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    summary = next(e for e in events if e.get("event") == "stop")
    assert summary["left_claimed"] == [two] and summary["done"] == 1, summary
    assert events[-1]["error"] == "ENOENT", events[-1]
    assert queue.state(two) == "claimed"
    shown = world.ctx("queue", "show", "--project", "proj", two, "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["state"] == "claimed", shown
    counts = status_counts(world, "proj")
    assert (counts["claimed"], counts["done"]) == (1, 1), counts
    recovered = world.ctx("queue", "recover", "--project", "proj", "--json")
    assert recovered.returncode == 0, recovered
    assert [r["job"] for r in json.loads(recovered.stdout)["requeued"]] == [two]
    assert queue.state(two) == "pending"


# ------------------------------------------------------------------ an MCP-backed tool


def test_mcp_backed_jobs_go_through_the_same_chain_and_schema(world: World) -> None:
    """M-1, M-4, W-1, W-4: tools projected by ``ctxmcp`` from a stdio server run as jobs:
    a call the server answers is done, input the remote schema refuses fails at stage
    ``schema`` before the server starts, a remote error fails at stage ``exit`` with its
    errno, a server slower than the timeout is killed (``ETIMEDOUT``), a tool the agent is
    not granted fails at step 5, and the worker goes on to the next job each time."""
    if HOST_PYTHON is None or not SCRIPTED_SERVER.is_file():
        pytest.skip("needs python3 in /usr/bin or /bin and tests/mcp/scripted_server.py")
    mcp = world.top / "mcp"
    mcp.mkdir(mode=0o755)
    server = mcp / "server.py"
    shutil.copyfile(SCRIPTED_SERVER, server)
    script = mcp / "script.json"
    tools = [
        {"name": "echo", "description": "Echo",
         "inputSchema": {"type": "object", "properties": {"x": {"type": "integer"}}}},
        {"name": "fail", "description": "Fails", "inputSchema": {"type": "object"}},
        {"name": "hidden", "description": "Not granted", "inputSchema": {"type": "object"}},
    ]  # fmt: skip
    script.write_text(json.dumps({"tools": tools}))
    config = mcp / "mcp.json"
    config.write_text(json.dumps(
        {"mcpServers": {"scr": {"command": HOST_PYTHON, "args": [str(server), str(script)]}}}
    ))  # fmt: skip
    for path in (server, script, config):
        path.chmod(0o644)
    out = world.top / "candidates"
    projected = subprocess.run(
        [str(Path(CTX_ARGV[0]).with_name("ctxmcp")), "project", "--config", str(config),
         "--runtime-config", str(config), "--server", "scr", "--out", str(out)],
        capture_output=True, text=True, env=world.env, timeout=60,
    )  # fmt: skip
    assert projected.returncode == 0, projected
    for name in ("scr.echo", "scr.fail", "scr.hidden"):
        done = world.ctx("object", "install", out / f"{name}.manifest.json", "--tier", "system")
        assert done.returncode == 0, done
        world.allow_in_tool(name, "mc_t")
    made = world.agent("mc", ["scr.echo", "scr.fail"], mount=[[str(mcp), str(mcp), "ro"]])
    uid = nobody_uid(made)
    world.queue("mcp")
    keys = ("echo", "bad", "fail", "hidden", "missing")
    names = world.publish_batch("mcp", [
        ("scr.echo", {"x": 5}), ("scr.echo", {"x": "five"}), ("scr.fail", {}),
        ("scr.hidden", {}), ("scr.missing", {}),
    ])  # fmt: skip
    jobs = dict(zip(keys, names, strict=True))
    rc, events, err = world.drain("mcp", "mc")
    assert rc == 0, err
    echo = finished(world, "mcp", jobs["echo"], uid=uid, agent="mc", events=events,
                    state="done", errno=None, stage=None, show=True)  # fmt: skip
    assert echo["output"]["structuredContent"]["echo"] == {"x": 5}
    assert echo["output"]["structuredContent"]["uid"] == uid  # the server ran as the agent
    finished(world, "mcp", jobs["bad"], uid=uid, agent="mc", events=events,
             state="failed", errno="EINVAL", stage="schema")  # fmt: skip
    failed = finished(world, "mcp", jobs["fail"], uid=uid, agent="mc", events=events,
                      state="failed", errno="EREMOTEIO", stage="exit")  # fmt: skip
    assert "failed on purpose" in failed["reason"]
    finished(world, "mcp", jobs["hidden"], uid=uid, agent="mc", events=events,
             state="failed", errno="EACCES", stage="authorize", step=5)  # fmt: skip
    finished(world, "mcp", jobs["missing"], uid=uid, agent="mc", events=events,
             state="failed", errno="ENOENT", stage="resolve")  # fmt: skip

    # A server slower than the job's timeout: the call and its server are killed (W-4).
    script.write_text(json.dumps({"tools": tools, "call_seconds": 30}))
    (slow,) = world.publish_batch("mcp", [("scr.echo", {"x": 1})])
    rc, events, err = world.drain("mcp", "mc", "--timeout", "1")
    assert rc == 0, err
    finished(world, "mcp", slow, uid=uid, agent="mc", events=events,
             state="failed", errno="ETIMEDOUT", stage="run")  # fmt: skip
    assert wait_for(lambda: not processes_of(mcp), 5), processes_of(mcp)
    QueueCLI(world.storage, "mcp").assert_settled()


# ------------------------------------------------------------------ a non-root administrator


def test_a_non_root_administrators_worker_fails_a_foreign_uid_agent_at_step_1(
    _template: Path, unprivileged_user: UnprivilegedUser
) -> None:
    """P-5 step 1, W-1 (docs/tools.md "Identity"): on a root the test user owns, its worker
    runs jobs of its own agent (as its uid) and fails, at step 1, the job of an agent whose
    identity names another uid, then goes on; the drain exits 0."""
    with world_at(_template, as_user=unprivileged_user) as world:
        world.agent("me", ["t.ok"])
        world.agent("other", ["t.ok"])
        identity = world.storage / "agent" / "other.d" / "identity"
        identity.write_text(json.dumps({"uid": 65534, "gid": 65534, "groups": []}))
        os.chown(identity, unprivileged_user.uid, unprivileged_user.gid)
        world.install("t.ok", "#!/bin/sh\ncat >/dev/null\nid -u\n", grant=("me_t", "other_t"))
        world.queue("proj")
        foreign = world.publish("proj", "foreign", "t.ok", {})
        rc, events, err = world.drain("proj", "other")
        assert rc == 0, err
        finished(world, "proj", foreign, uid=65534, agent="other", events=events,
                 state="failed", errno="EACCES", stage="authorize", step=1)  # fmt: skip
        own = world.publish("proj", "own", "t.ok", {})
        rc, events, err = world.drain("proj", "me")
        assert rc == 0, err
        result = finished(world, "proj", own, uid=unprivileged_user.uid, agent="me",
                          events=events, state="done", errno=None, stage=None)  # fmt: skip
        assert result["output"] == unprivileged_user.uid


def test_a_worker_of_a_uid_that_may_not_use_the_queue_claims_nothing(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """§2.4, docs/workers.md "Who may start one": a worker started by a uid that neither is
    root nor owns the storage root exits 1 with ``EACCES`` and leaves the job pending."""
    world.agent("ci", ["t.ok"])
    world.allow_in_tool("t.ok", "ci_t")
    queue = world.queue("proj")
    job = world.publish("proj", "job", "t.ok", {})
    done = subprocess.run(
        [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", "ci", "--drain"],
        capture_output=True, text=True, env=world.env, timeout=60,
        user=unprivileged_user.uid, group=unprivileged_user.gid, extra_groups=[],
    )  # fmt: skip
    assert done.returncode == 1, done
    assert "EACCES" in done.stderr and TRACEBACK not in done.stderr, done.stderr
    assert queue.state(job) == "pending"
    assert ctx_run("queue", "status", "--project", "proj", env=world.env).rc == 0
