"""A day in the life of a multi-agent project (SPEC §2, §3, §4, §5, §6, §9), driven as its
operator drives it and then read back from every component at once.

Root makes the space ``day`` for the group ``ctxday-g`` (``ctx shared create --group``), whose
members are a human, ``ctxday-m``, and the uids of two agents made from request files with
``ctx agent create``: ``planner`` (``shell.exec``, the space's two tools, ``shared:day read
write``) and ``builder`` (``day.stamp`` and ``fs.stat``, ``shared:day read`` only).  The tools
``day.stamp`` and ``day.hold`` are installed from manifests into ``--tier shared:day``.  Jobs
are published by the planner's own ``shell.exec`` calls and by the member; ``ctx queue work``
runs them as each agent; in the middle of the day a grant is taken away, a worker is
SIGKILLed mid-job and recovered (by the member) and a tool is reinstalled while jobs flow.

At the end the components must agree: each job in exactly one terminal state, its result
naming the agent that ran it; ``ctx queue status --json`` and ``ctx queue list --json``
counting what was published; ``ctx session show``/``tail --json`` holding each call once,
``tool_call`` then ``tool_result``, between the job's ``queue.claim``/``queue.start`` and
``queue.finish``; the tool's ``log`` holding the same calls once, in the same order, with the
same status; a refusal naming its step, and the rule it quotes working when copied.  The
queue is also read while a job is moving (a member's finish by hand, a worker's finish), when
``status``, ``show`` and ``list`` must agree with ``recover``; and the command a refusal
suggests must act on the storage root the refused command was given."""

from __future__ import annotations

import json
import os
import re
import shlex
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
    alive,
    clean_env,
    ctx_run,
    new_scratch_dir,
    read_jsonl,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.support.strace import can_inject
from tests.support.users import UnprivilegedUser, members_of

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="agents and the member are other uids: root"),
    pytest.mark.skipif(shutil.which("jq") is None, reason="the space's tools are jq scripts"),
]

SCRATCH = scratch_top(__file__)
GROUP = "ctxday-g"
MEMBER, PLANNER_UID, BUILDER_UID = "ctxday-m", "ctxday-p", "ctxday-b"
SPACE = "day"
STAMP, HOLD = "day.stamp", "day.hold"
S2_KEYS = ("ts", "type", "agent", "session", "object", "status")  # S-2, in this order
RESULT_KEYS = {"status", "output", "worker", "started", "finished"}  # §2.1

# day.stamp: waits for its gate file when given one, notes which agent ran which version for
# which tag, then answers in JSON.
STAMP_PROGRAM = """#!/bin/sh
in=$(cat)
tag=$(printf '%s' "$in" | jq -r .tag)
out=$(printf '%s' "$in" | jq -r .out)
gate=$(printf '%s' "$in" | jq -r '.gate // empty')
if [ -n "$gate" ]; then until [ -e "$out/$gate" ]; do sleep 0.02; done; fi
echo "$CTX_AGENT $CTX_CALL $tag v@V@" >> "$out/stamps"
printf '{"tag": "%s", "by": "%s", "v": @V@}\\n' "$tag" "$CTX_AGENT"
"""
# day.hold: notes each run (and its pid), then waits for its go file.
HOLD_PROGRAM = """#!/bin/sh
in=$(cat)
tag=$(printf '%s' "$in" | jq -r .tag)
out=$(printf '%s' "$in" | jq -r .out)
echo "$CTX_AGENT $CTX_CALL $tag" >> "$out/runs"
echo $$ > "$out/pid-$tag"
until [ -e "$out/go-$tag" ]; do sleep 0.02; done
printf '{"tag": "%s", "by": "%s", "v": @V@}\\n' "$tag" "$CTX_AGENT"
"""
# A pre-hook the administrator adds to day.stamp: it notes each call it admits.
NOTE_HOOK = """#!/bin/sh
jq -c '{call, agent}' >> @OUT@/admitted
"""


# ------------------------------------------------------------------------------ the crew


@dataclass(frozen=True)
class Crew:
    member: UnprivilegedUser
    planner: UnprivilegedUser
    builder: UnprivilegedUser
    gid: int


@pytest.fixture(scope="module")
def crew() -> Crew:
    """The member and the agents' uids, all in ``ctxday-g`` (system accounts, kept)."""
    (member, planner, builder), gid = members_of(GROUP, MEMBER, PLANNER_UID, BUILDER_UID)
    return Crew(member, planner, builder, gid)


@dataclass
class Day:
    storage: Path
    top: Path
    crew: Crew
    procs: list[subprocess.Popen] = field(default_factory=list)

    @property
    def outbox(self) -> Path:
        return self.top / "outbox"

    @property
    def space(self) -> Path:
        return self.storage / "shared" / SPACE

    @property
    def queue(self) -> QueueCLI:
        return QueueCLI(self.storage, SPACE)

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    def as_member(self, *args: str | os.PathLike, stdin: str = "") -> Run:
        """``ctx ARGS`` as the member: its uid and the groups the group database gives it."""
        member = self.crew.member
        env = clean_env(
            CTX_STORAGE=str(self.storage), HOME=str(self.top / "home-m"), USER=MEMBER,
            LOGNAME=MEMBER,
        )  # fmt: skip
        done = subprocess.run(
            [*CTX_ARGV, *map(str, args)], input=stdin, capture_output=True, text=True,
            user=member.uid, group=member.gid, extra_groups=member.groups, env=env,
            cwd=self.top / "home-m", timeout=60,
        )  # fmt: skip
        return Run([str(a) for a in args], done.returncode, done.stdout, done.stderr)

    def member_publishes(self, name: str, tool: str, tag: str) -> str:
        req = {"tool": tool, "input": {"tag": tag, "out": str(self.outbox)}}
        r = self.as_member("queue", "publish", "-p", SPACE, "--name", name, "-",
                           stdin=json.dumps(req))  # fmt: skip
        assert r.rc == 0 and r.lines() == [f"{name}.req.json"], r
        return r.out.strip()

    def worker(self, agent: str, wid: str, *args: str) -> subprocess.Popen:
        """``ctx queue work --json`` as ``agent``, worker id and session ``wid``."""
        argv = [*CTX_ARGV, "queue", "work", "-p", SPACE, "--agent", agent, "--json",
                "--worker", wid, "--session", wid, *args]  # fmt: skip
        proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        self.procs.append(proc)
        return proc

    def install(self, manifest: Path) -> None:
        r = self.ctx("object", "install", manifest, "--tier", f"shared:{SPACE}")
        assert r.rc == 0, r

    def tool_dir(self, tool: str) -> Path:
        return self.space / "tool" / f"{tool}.d"

    def status(self) -> dict:
        r = self.ctx("queue", "status", "-p", SPACE, "--json")
        assert r.rc == 0, r
        report = r.json()
        assert report["incomplete"] == report["conflicts"] == [], report
        return report

    def session(self, agent: str, name: str, *args: str) -> list[dict]:
        """``ctx session show AGENT NAME --json``: JSON Lines, the file's events exactly."""
        r = self.ctx("session", "show", agent, name, *args, "--json")
        assert r.rc == 0, r
        return [json.loads(line) for line in r.lines()]

    def tool_log(self, tool: str) -> list[dict]:
        """The calls ``tool/<name>.d/log`` holds: the space's tool, else the system's."""
        where = self.tool_dir(tool)
        if not where.is_dir():
            where = self.storage / "tool" / f"{tool}.d"
        return read_jsonl(where / "log")


def write_manifest(directory: Path, name: str, program: str, version: int) -> Path:
    """A v2 manifest (T-8) of ``name`` whose executable is ``program`` at ``version``."""
    directory.mkdir(exist_ok=True)
    (directory / f"{name}-v{version}.sh").write_text(program.replace("@V@", str(version)))
    path = directory / f"{name}-v{version}.json"
    path.write_text(json.dumps({
        "manifest": 2, "kind": "tool", "name": name, "description": f"{name} v{version}",
        "schema": {"type": "object", "required": ["tag", "out"]},
        "cap": {"side_effects": True, "network": False}, "exec": f"{name}-v{version}.sh",
    }))  # fmt: skip
    return path


@pytest.fixture
def day(searchable_storage: Path, crew: Crew) -> Iterator[Day]:
    """The space, its two tools (v1), the two agents from request files, and the host's half
    of P-6 in each tool's own policy: planner day.stamp, day.hold and shell.exec; builder
    day.stamp and fs.stat."""
    top = new_scratch_dir(SCRATCH, "day-")
    d = Day(searchable_storage, top, crew)
    d.outbox.mkdir()
    d.outbox.chmod(0o1777)
    (top / "home-m").mkdir()
    os.chown(top / "home-m", crew.member.uid, crew.member.gid)
    try:
        r = d.ctx("shared", "create", SPACE, "--group", GROUP)
        assert r.rc == 0, r
        for tool, program in ((STAMP, STAMP_PROGRAM), (HOLD, HOLD_PROGRAM)):
            d.install(write_manifest(top / "manifests", tool, program, 1))
        requests = {
            "planner": ({"tools": ["shell.exec", STAMP, HOLD],
                         "shared": {SPACE: ["read", "write"]}}, PLANNER_UID),
            "builder": ({"tools": [STAMP, "fs.stat"], "shared": {SPACE: "read"}}, BUILDER_UID),
        }  # fmt: skip
        for agent, (grants, user) in requests.items():
            request = top / f"{agent}.json"
            request.write_text(json.dumps({"name": agent, "label": f"{agent}_t", **grants}))
            r = d.ctx("agent", "create", request, "--user", user)
            assert r.rc == 0, r
        for tool, labels in (
            (d.tool_dir(STAMP), ("planner_t", "builder_t")),
            (d.tool_dir(HOLD), ("planner_t",)),
            (d.storage / "tool" / "shell.exec.d", ("planner_t",)),
            (d.storage / "tool" / "fs.stat.d", ("builder_t",)),
        ):
            name = tool.name.removesuffix(".d")
            with open(tool / "policy", "a") as policy:
                policy.writelines(f"allow {label} tool:{name} execute\n" for label in labels)
        yield d
    finally:
        for proc in d.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------------------ reading back


def ended(proc: subprocess.Popen, timeout: float = 60) -> list[dict]:
    """The worker's JSON events; it must exit 0 with ``start`` first and ``stop`` last."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, (proc.args, proc.returncode, err)
    assert "Traceback" not in err, err
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert events[0]["event"] == "start" and events[-1]["event"] == "stop", events
    return events


def settled(queue: QueueCLI, job: str, states: tuple[str, ...] = ("done", "failed")) -> bool:
    """Whether J's finish is over: its terminal pair in place, its claim and lease gone."""
    return queue.state(job) in states and not any(
        (queue.dir / sub / job).exists() for sub in ("claimed", "lease")
    )


def finish_events(events: list[dict]) -> dict[str, dict]:
    done = [e for e in events if e["event"] == "finish"]
    assert len(done) == len({e["job"] for e in done}), done  # each job reported once
    return {e["job"]: e for e in done}


def terminal(queue: QueueCLI, job: str) -> tuple[str, dict, bytes]:
    """J's one terminal state (I-1), its §2.1 result and the result's bytes."""
    d = queue.dir
    held = [s for s in ("done", "failed") if (d / s / job).is_file()]
    results = [s for s in ("done", "failed") if (d / s / f"{job}.result").is_file()]
    assert held == results and len(held) == 1, (job, held, results)
    for sub in ("pending", "claimed", "lease"):
        assert not (d / sub / job).exists(), (job, sub)
    raw = (d / held[0] / f"{job}.result").read_bytes()
    res = json.loads(raw)
    assert res.keys() >= RESULT_KEYS and res["status"] == ("ok" if held[0] == "done" else "error")
    return held[0], res, raw


def calls_in(events: list[dict]) -> dict[str, list[str]]:
    """Call id -> the types of its events, in order."""
    calls: dict[str, list[str]] = {}
    for event in events:
        assert tuple(event)[:6] == S2_KEYS, event
        if event["type"] in ("tool_call", "tool_result"):
            calls.setdefault(event["call"], []).append(event["type"])
    return calls


def check_job_in_session(events: list[dict], job: str, res: dict, state: str) -> dict:
    """J's ``queue.claim``, ``queue.start``, its call's two events and ``queue.finish``, in that
    order, each once, in the session its result names; the ``tool_result`` event."""
    mine = [e for e in events if e["object"] == f"queue/{job}"]
    assert [e["type"] for e in mine] == ["queue.claim", "queue.start", "queue.finish"], mine
    assert mine[-1]["state"] == state, mine
    call = [e for e in events if e.get("call") == res["call"]]
    assert [e["type"] for e in call] == ["tool_call", "tool_result"], call
    order = [events.index(e) for e in (mine[0], mine[1], call[0], call[1], mine[2])]
    assert order == sorted(order), (job, order)
    assert {e["agent"] for e in mine + call} == {res["agent"]}, (mine, call)
    assert call[1]["status"] == res["status"], (call[1], res)
    return call[1]


def check_tool_log(day: Day, tool: str, results: list[dict], session_events: list[dict]):
    """T-7: the tool's log holds each of these calls once, in the order the session holds
    their results, with the result's status, agent, session and refusal."""
    log = day.tool_log(tool)
    logged = [line["call"] for line in log]
    assert len(logged) == len(set(logged)), logged
    by_call = {line["call"]: line for line in log}
    assert set(by_call) == {res["call"] for res in results}, (logged, results)
    in_session = [e["call"] for e in session_events
                  if e["type"] == "tool_result" and e["call"] in by_call]  # fmt: skip
    assert [c for c in logged if c in in_session] == in_session
    for res in results:
        line = by_call[res["call"]]
        assert (line["type"], line["status"], line["agent"]) == (
            "tool_result", res["status"], res["agent"],
        ), (line, res)  # fmt: skip
        assert line["session_dir"] == res["session"], (line, res)
        assert line["object"] == f"shared/{SPACE}/tool/{tool}", line
        if res["status"] == "error":
            assert (line["errno"], line["stage"], line["step"]) == (
                res["error"]["error"], res["error"]["stage"], res["error"]["step"],
            ), (line, res)  # fmt: skip
        else:
            assert line["output"] == res["output"], (line, res)


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def remove_rule(policy: Path, rule: str) -> None:
    """The administrator takes one grant away: the policy rewritten without that line."""
    lines = policy.read_text().splitlines(keepends=True)
    assert f"{rule}\n" in lines, (policy, rule)
    policy.write_text("".join(line for line in lines if line != f"{rule}\n"))


def publish_by_planner(day: Day, tags: list[str]) -> Run:
    """The planner's own tool call: ``shell.exec`` running ``ctx queue publish --batch``."""
    batch = "".join(
        json.dumps({"tool": STAMP, "input": {"tag": t, "out": str(day.outbox)}}) + "\n"
        for t in tags
    )
    publish = shlex.join([*CTX_ARGV, "queue", "publish", "--storage", str(day.storage),
                          "-p", SPACE, "--batch", "-"])  # fmt: skip
    cmd = f"printf %s {shlex.quote(batch)} | {publish}"
    return day.ctx("run", "--agent", "planner", "--native", "shell.exec",
                   input=json.dumps({"cmd": cmd}))  # fmt: skip


def last_frame(run: Run) -> dict:
    return json.loads(run.lines()[-1])


# ------------------------------------------------------------------------------ the day


def test_jobs_of_an_agent_and_a_member_are_worked_then_a_revoked_grant_stops_later_calls_only(
    day: Day,
) -> None:
    """Q-1, W-1, P-5, P-6, S-2, S-5, S-6, T-7, X-1, §2.4: the planner publishes three jobs
    from its own ``shell.exec`` call (``from`` its name, the files its uid's and the space's
    group's), the member three more; a running builder worker finishes all six.  The
    administrator then takes ``builder_t`` out of day.stamp's own policy: the two jobs
    published next fail with EACCES at step 6 naming that policy and its missing rule, nothing
    of the tool runs, the six earlier results stay byte for byte.  The planner's shell.exec
    grant is taken away too: its next publishing call is refused at step 5 and publishes
    nothing; the builder, which may only read the space, is refused a session there and leaves
    nothing the member could see of it.  Status, list, session, tail, the tool's log and the
    worker's events all agree; the refused rule, copied back where the refusal says, lets the
    next job run."""
    queue, crew = day.queue, day.crew
    by_planner = publish_by_planner(day, ["p0", "p1", "p2"])
    frame = last_frame(by_planner)
    assert by_planner.rc == 0 and frame["status"] == "ok", by_planner
    planned = frame["output"].split()
    assert len(planned) == 3 and all(j.endswith(".req.json") for j in planned), frame
    for job in planned:
        stored = json.loads((queue.dir / "pending" / job).read_text())
        assert stored["from"] == "planner" and stored["tool"] == STAMP, stored
        info = (queue.dir / "pending" / job).stat()
        assert (info.st_uid, info.st_gid) == (crew.planner.uid, crew.gid), job
    by_member = [day.member_publishes(f"m{n}", STAMP, f"m{n}") for n in range(3)]
    for job in by_member:
        assert json.loads((queue.dir / "pending" / job).read_text())["from"] == MEMBER
    first = [*planned, *by_member]

    builder = day.worker("builder", "b1")
    assert wait_for(lambda: all(settled(queue, j) for j in first), 30), [
        queue.state(j) for j in first
    ]
    early = {job: terminal(queue, job) for job in first}
    assert {state for state, _, _ in early.values()} == {"done"}, early

    # The administrator takes builder_t out of the tool's own policy while the worker runs.
    stamp_policy = day.tool_dir(STAMP) / "policy"
    remove_rule(stamp_policy, f"allow builder_t tool:{STAMP} execute")
    refused = [day.member_publishes(f"late{n}", STAMP, f"late{n}") for n in range(2)]
    assert wait_for(lambda: all(settled(queue, j, ("failed",)) for j in refused), 30), [
        queue.state(j) for j in refused
    ]
    builder.send_signal(signal.SIGTERM)
    events = ended(builder)

    # The planner loses shell.exec (step 5): its next publishing call is refused, records
    # the refusal and publishes nothing.
    remove_rule(
        day.storage / "agent" / "planner.d" / "policy", "allow planner_t tool:shell.exec execute"
    )
    denied = publish_by_planner(day, ["p3"])
    denied_frame = last_frame(denied)
    assert denied.rc == 1 and denied_frame["output"] is None, denied
    assert (denied_frame["error"]["error"], denied_frame["error"]["step"]) == ("EACCES", 5)
    assert (
        "agent/planner.d/policy has no rule 'allow planner_t tool:shell.exec execute'"
        in (denied_frame["error"]["message"])
    ), denied_frame
    planner_session = day.session("planner", "default")
    assert calls_in(planner_session) == {
        by_planner_call: ["tool_call", "tool_result"]
        for by_planner_call in (frame["call"], denied_frame["call"])
    }
    shell_log = [line for line in day.tool_log("shell.exec") if line["agent"] == "planner"]
    assert [(line["call"], line["status"]) for line in shell_log] == [
        (frame["call"], "ok"), (denied_frame["call"], "error")
    ], shell_log  # fmt: skip
    assert shell_log[1]["step"] == 5 and shell_log[1]["errno"] == "EACCES", shell_log
    # The builder may only read the space (S-6): a call recording there is refused before it
    # records anything, and nothing of it appears where the member looks.
    stamp_log = (day.tool_dir(STAMP) / "log").read_bytes()
    into_space = day.ctx("run", "--agent", "builder", "--project", SPACE, "--native", STAMP,
                         input=json.dumps({"tag": "x", "out": str(day.outbox)}))  # fmt: skip
    error = last_frame(into_space)["error"]
    assert into_space.rc == 1 and (error["error"], error["stage"]) == ("EACCES", "session")
    assert f"step {error['step']} (" in error["message"], error
    assert not (day.space / "agent" / "builder").exists()
    assert (day.tool_dir(STAMP) / "log").read_bytes() == stamp_log
    seen = day.as_member("session", "list", "builder", "--project", SPACE)
    assert seen.rc == 0 and seen.out == "", seen

    # What every component says of the eight jobs.
    published = [*first, *refused]
    counts = day.status()
    assert (counts["pending"], counts["claimed"], counts["done"], counts["failed"]) == (0, 0, 6, 2)
    listed = day.ctx("queue", "list", "-p", SPACE, "--json")
    assert listed.rc == 0, listed
    assert {e["name"]: e["state"] for e in listed.json()} == {
        job: ("failed" if job in refused else "done") for job in published
    }
    for job, (_, _, raw) in early.items():
        assert terminal(queue, job)[2] == raw, job  # earlier results stay as they were
    reported = finish_events(events)
    assert set(reported) == set(published) and events[-1]["stopped_by"] == "SIGTERM"
    assert (events[-1]["done"], events[-1]["failed"], events[-1]["lost"]) == (6, 2, 0)
    session = day.session("builder", "b1")
    results = []
    for job in published:
        state, res, _ = terminal(queue, job)
        results.append(res)
        assert res["agent"] == "builder" and res["worker"]["id"] == "b1", res
        assert res["session"] == f"home/{crew.builder.uid}/agent/builder/session/b1"
        assert reported[job]["state"] == state and reported[job]["reason"] == res["reason"]
        event = check_job_in_session(session, job, res, state)
        if job in refused:
            error = res["error"]
            assert (error["error"], error["stage"], error["step"]) == ("EACCES", "authorize", 6)
            assert res["output"] is None and res["exit_status"] is None, res
            assert (event["errno"], event["step"]) == ("EACCES", 6), event
            assert f"shared/{SPACE}/tool/{STAMP}.d/policy has no rule" in res["reason"], res
        else:
            assert res["output"] == {"tag": res["output"]["tag"], "by": "builder", "v": 1}
    assert len(calls_in(session)) == len(published)
    tail = day.ctx("session", "tail", "builder", "b1", "-n", "7", "--json")
    assert tail.rc == 0 and [json.loads(x) for x in tail.lines()] == session[-7:], tail
    check_tool_log(day, STAMP, results, session)
    # The tool ran once per done job, as the builder; never for a refused call.
    stamps = lines_of(day.outbox / "stamps")
    assert sorted(s.split()[1] for s in stamps) == sorted(r["call"] for r in results[:6])
    assert {s.split()[0] for s in stamps} == {"builder"}

    # The refusal's own words, copied: the rule it quotes into the file it names.
    reason = terminal(queue, refused[0])[1]["reason"]
    found = re.search(r"(shared/\S+/policy) has no rule '([^']+)'", reason)
    assert found, reason
    with open(day.storage / found[1], "a") as policy:
        policy.write(found[2] + "\n")
    again = day.member_publishes("again", STAMP, "again")
    ended(day.worker("builder", "b1", "--drain"))
    assert terminal(queue, again)[0] == "done"
    counts = day.status()
    assert (counts["done"], counts["failed"]) == (7, 2), counts


def test_a_worker_killed_mid_job_is_recovered_by_the_member_and_each_job_runs_once_more_at_most(
    day: Day,
) -> None:
    """Q-3, Q-5, Q-6, I-1, I-3, I-4, I-5, W-1, W-3, S-5, T-7: a planner worker holding two
    day.hold jobs at once is SIGKILLed; its tools die with it.  ``ctx queue show`` calls both
    holders gone and ``recover --dry-run`` plans exactly those two requeues; the member (not
    the worker's uid) runs ``ctx queue recover``, which requeues them; ``--reconcile`` then
    changes nothing.  A second worker finishes everything: the two held jobs ran twice, every
    other job once; the killed worker's session keeps its two calls without results and no
    ``queue.finish``, the tool's log holds only the calls that finished."""
    queue, crew = day.queue, day.crew
    holds = [day.member_publishes(f"k{n}", HOLD, f"k{n}") for n in range(2)]
    stamps = [day.member_publishes(f"s{n}", STAMP, f"s{n}") for n in range(3)]
    killed = day.worker("planner", "pa", "--concurrency", "2")
    pid_files = [day.outbox / f"pid-k{n}" for n in range(2)]
    assert wait_for(lambda: all(p.exists() and p.read_text().endswith("\n") for p in pid_files),
                    30), killed.poll()  # fmt: skip
    tools = [int(p.read_text()) for p in pid_files]
    assert {queue.lease(job)["pid"] for job in holds} == {killed.pid}
    killed.kill()
    killed.communicate()
    assert wait_for(lambda: not any(alive(pid) for pid in tools), 10), "a held tool survived"

    for job in holds:
        shown = day.ctx("queue", "show", "-p", SPACE, job, "--json")
        assert shown.rc == 0 and shown.json()["state"] == "claimed", shown
        assert shown.json()["holder"]["state"] == "gone", shown.json()
    counts = day.status()
    assert (counts["pending"], counts["claimed"]) == (3, 2), counts
    plan = day.ctx("queue", "recover", "-p", SPACE, "--dry-run", "--json")
    assert plan.rc == 0, plan
    assert sorted((x["job"], x["applied"]) for x in plan.json()["requeued"]) == [
        (job, False) for job in sorted(holds)
    ], plan.json()
    by_member = day.as_member("queue", "recover", "-p", SPACE, "--json")
    assert by_member.rc == 0, by_member
    report = json.loads(by_member.out)
    assert sorted(x["job"] for x in report["requeued"]) == sorted(holds) and report["consistent"]
    before = snapshot(queue.dir)
    settled = day.ctx("queue", "recover", "-p", SPACE, "--reconcile", "--json")
    assert settled.rc == 0 and settled.json()["requeued"] == settled.json()["repaired"] == []
    assert snapshot(queue.dir) == before
    counts = day.status()
    assert (counts["pending"], counts["claimed"]) == (5, 0), counts

    for n in range(2):
        (day.outbox / f"go-k{n}").touch()
    events = ended(day.worker("planner", "pb", "--drain"))
    published = [*holds, *stamps]
    assert set(finish_events(events)) == set(published), events
    results = {job: terminal(queue, job)[1] for job in published}
    for res in results.values():
        assert res["status"] == "ok" and res["worker"]["id"] == "pb", res
        assert res["agent"] == "planner" and res["output"]["by"] == "planner", res
    counts = day.status()
    assert (counts["done"], counts["failed"], counts["pending"], counts["claimed"]) == (5, 0, 0, 0)

    # Each held job ran twice (a call of the killed worker, then one of pb), each other once.
    runs = [line.split() for line in lines_of(day.outbox / "runs")]
    assert sorted(tag for _, _, tag in runs) == ["k0", "k0", "k1", "k1"], runs
    assert len(lines_of(day.outbox / "stamps")) == 3
    finished_calls = {res["call"] for res in results.values()}
    first_calls = {call for _, call, _ in runs} - finished_calls
    assert len(first_calls) == 2, runs

    home = f"home/{crew.planner.uid}/agent/planner/session"
    killed_session = day.session("planner", "pa")
    assert calls_in(killed_session) == {call: ["tool_call"] for call in first_calls}
    assert [e["type"] for e in killed_session if e["type"].startswith("queue.")] == [
        "queue.claim", "queue.start", "queue.claim", "queue.start"
    ], killed_session  # fmt: skip
    session = day.session("planner", "pb")
    for job, res in results.items():
        assert res["session"] == f"{home}/pb", res
        check_job_in_session(session, job, res, "done")
    assert set(calls_in(session)) == finished_calls
    check_tool_log(day, HOLD, [results[j] for j in holds], session)
    check_tool_log(day, STAMP, [results[j] for j in stamps], session)

    # I-3: finished stays finished; nothing runs again.
    before = snapshot(queue.dir)
    for args in ((), ("--reconcile",)):
        r = day.ctx("queue", "recover", "-p", SPACE, "--json", *args)
        assert r.rc == 0 and r.json()["requeued"] == [], r
    late = ended(day.worker("planner", "pc", "--drain"))
    assert finish_events(late) == {} and snapshot(queue.dir) == before
    assert len(lines_of(day.outbox / "runs")) == 4


def test_a_tool_reinstalled_while_jobs_flow_keeps_grants_hooks_and_log_and_runs_each_job_once(
    day: Day,
) -> None:
    """T-8, T-1, T-6, T-7, W-1, W-3, I-4: while a planner worker (two slots) holds a day.hold call
    and works ten day.stamp jobs (four before, six after the reinstalls, one admitted across
    them), the administrator reinstalls day.stamp three
    times (v2, v1, v2) and day.hold once.  Every job ends done once; each call's output, its
    line in the log and the tool's own note agree on the version that ran it; the held call
    ends with the version it started with; the grants, the revoked one included, the
    administrator's pre-hook and the log (one line per call, none lost or doubled) carry over
    every reinstall; ``ctx object list`` ends with the last version, available."""
    queue = day.queue
    hook = day.tool_dir(STAMP) / "hooks" / "pre.d" / "10-note"
    hook.write_text(NOTE_HOOK.replace("@OUT@", str(day.outbox)))
    hook.chmod(0o755)
    remove_rule(day.tool_dir(STAMP) / "policy", f"allow builder_t tool:{STAMP} execute")
    policies = {t: (day.tool_dir(t) / "policy").read_bytes() for t in (STAMP, HOLD)}
    held = day.member_publishes("long", HOLD, "long")
    # t0..t3 run at once; t4..t9, published after them, wait for the gate, which opens
    # after the reinstalls.
    jobs = []
    for tags, gate in ((range(4), {}), (range(4, 10), {"gate": "open"})):
        lines = "".join(
            json.dumps({"tool": STAMP, "input": {"tag": f"t{n}", "out": str(day.outbox), **gate}})
            + "\n"
            for n in tags
        )
        batch = day.as_member("queue", "publish", "-p", SPACE, "--batch", "-", stdin=lines)
        assert batch.rc == 0 and len(batch.lines()) == len(tags), batch
        jobs += batch.lines()

    worker = day.worker("planner", "pr", "--concurrency", "2")

    def flowing() -> bool:
        """The held call runs, t0..t3 are done and a gated job is claimed."""
        return (
            (day.outbox / "pid-long").exists()
            and all(queue.state(j) == "done" for j in jobs[:4])
            and any(queue.state(j) == "claimed" for j in jobs[4:])
        )

    assert wait_for(flowing, 30), [queue.state(j) for j in jobs]
    in_flight = next(j for j in jobs[4:] if queue.state(j) == "claimed")
    manifests = day.top / "manifests"
    for version in (2, 1, 2):
        day.install(write_manifest(manifests, STAMP, STAMP_PROGRAM, version))
    day.install(write_manifest(manifests, HOLD, HOLD_PROGRAM, 2))
    (day.outbox / "open").touch()
    (day.outbox / "go-long").touch()
    assert wait_for(lambda: all(settled(queue, j) for j in [held, *jobs]),
                    30), [queue.state(j) for j in jobs]  # fmt: skip
    worker.send_signal(signal.SIGTERM)
    events = ended(worker)
    assert events[-1]["done"] == 11 and events[-1]["failed"] == events[-1]["lost"] == 0

    results = {job: terminal(queue, job)[1] for job in jobs}
    assert terminal(queue, held)[1]["output"] == {"tag": "long", "by": "planner", "v": 1}
    stamped = {line.split()[1]: line.split() for line in lines_of(day.outbox / "stamps")}
    assert len(stamped) == len(lines_of(day.outbox / "stamps")) == 10
    log = {line["call"]: line for line in day.tool_log(STAMP)}
    assert len(log) == len(day.tool_log(STAMP)) == 10
    for n, job in enumerate(jobs):
        res = results[job]
        version = res["output"]["v"]
        # Before the reinstalls v1 ran, after them v2; the call admitted across them, either.
        assert version == (1 if n < 4 else 2) or job == in_flight, (n, res)
        assert res["output"]["tag"] == stamped[res["call"]][2], res
        assert stamped[res["call"]][3] == f"v{version}", (res, stamped[res["call"]])
        assert log[res["call"]]["output"] == res["output"], (res, log[res["call"]])
    hold_log = day.tool_log(HOLD)
    assert [line["output"]["v"] for line in hold_log] == [1], hold_log
    admitted = {json.loads(line)["call"] for line in lines_of(day.outbox / "admitted")}
    assert admitted == {res["call"] for res in results.values()}
    session = day.session("planner", "pr")
    for job, res in results.items():
        check_job_in_session(session, job, res, "done")

    for tool, policy in policies.items():
        assert (day.tool_dir(tool) / "policy").read_bytes() == policy, tool
    assert hook.read_text() == NOTE_HOOK.replace("@OUT@", str(day.outbox))
    assert os.access(hook, os.X_OK)
    listed = day.ctx("object", "list", "--tier", f"shared:{SPACE}", "--json")
    assert listed.rc == 0, listed
    assert {(t["name"], t["status"], t["description"]) for t in listed.json()} == {
        (STAMP, "available", f"{STAMP} v2"), (HOLD, "available", f"{HOLD} v2")
    }  # fmt: skip
    # The revoked grant stayed revoked through the reinstalls.
    late = day.member_publishes("late", STAMP, "late")
    ended(day.worker("builder", "bl", "--drain"))
    _, res, _ = terminal(queue, late)
    assert (res["error"]["error"], res["error"]["step"]) == ("EACCES", 6), res
    counts = day.status()
    assert (counts["done"], counts["failed"]) == (11, 1), counts


# ------------------------------------------------------------------------------ looking on


needs_strace = pytest.mark.skipif(
    not can_inject("--seccomp-bpf", "-e", "trace=getpid"), reason="needs strace injection"
)
# openat(2) by architecture, to tell a traced process stopped in it (/proc/PID/syscall).
OPENAT = {"x86_64": 257, "aarch64": 56}


def traced(*argv: str, options: list[str], env: dict[str, str], **kw) -> subprocess.Popen:
    """``argv`` under strace with ``options`` (an injected delay), as ``kw`` says."""
    return subprocess.Popen(
        ["strace", "-f", "-qq", "--seccomp-bpf", "-o", "/dev/null", *options, *argv], env=env,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw,
    )  # fmt: skip


def stopped_in_openat(tracer: subprocess.Popen, directory: Path) -> bool:
    """Whether the process strace runs is held in an ``openat`` relative to ``directory``."""
    try:
        children = Path(f"/proc/{tracer.pid}/task/{tracer.pid}/children").read_text().split()
        for child in children:
            call = Path(f"/proc/{child}/syscall").read_text().split()
            if (
                call
                and call[0] == str(OPENAT[os.uname().machine])
                and os.readlink(f"/proc/{child}/fd/{int(call[1], 16)}") == str(directory)
            ):
                return True
    except (OSError, ValueError, IndexError):
        return False
    return False


@needs_strace
def test_the_queue_as_status_and_recover_see_it_while_a_member_finishes_a_job_by_hand(
    day: Day,
) -> None:
    """Q-4, Q-6, §2.4 (docs/queue.md "What a crash leaves"): the member claims a job for a
    process of its own and finishes it by hand; the finish is slowed (strace) right after its
    result lands in ``done/``, while it holds ``claimed/J`` locked.  ``ctx queue recover``
    then says ``untouched …: left alone, another process is moving this job`` and the queue
    consistent; ``status``, ``show`` and ``list``, asked at that same moment, must not call
    the job an interrupted finish for ``recover --reconcile`` to roll forward."""
    queue, member = day.queue, day.crew.member
    job = day.member_publishes("by-hand", STAMP, "by-hand")
    holder = subprocess.Popen(["sleep", "300"], user=member.uid, group=member.gid,
                              extra_groups=member.groups)  # fmt: skip
    day.procs.append(holder)
    claimed = day.as_member("queue", "claim", "-p", SPACE, "--pid", str(holder.pid))
    assert claimed.rc == 0 and claimed.lines() == [job], claimed
    env = clean_env(CTX_STORAGE=str(day.storage), HOME=str(day.top / "home-m"))
    outcome = day.top / "home-m" / "outcome.json"
    outcome.write_text('{"checked": true}')
    finishing = traced(
        *CTX_ARGV, "queue", "finish", "-p", SPACE, job, "--ok", outcome,
        options=["-e", "trace=renameat2", "-e", "inject=renameat2:delay_exit=1500000:when=1"],
        env=env, user=member.uid, group=member.gid, extra_groups=member.groups,
    )  # fmt: skip
    day.procs.append(finishing)
    assert wait_for(lambda: (queue.dir / "done" / f"{job}.result").exists(), 30)
    assert (queue.dir / "claimed" / job / job).is_file()  # the request has not moved yet

    recovered = day.ctx("queue", "recover", "-p", SPACE, "--json")
    status = day.ctx("queue", "status", "-p", SPACE, "--json")
    shown = day.ctx("queue", "show", "-p", SPACE, job, "--json")
    listed = day.ctx("queue", "list", "-p", SPACE)
    assert finishing.poll() is None, "the finish was no longer under way"
    report = recovered.json()
    assert recovered.rc == 0 and report["consistent"], recovered
    assert [u["job"] for u in report["untouched"]] == [job], report
    assert finishing.wait(timeout=30) == 0, finishing.communicate()
    assert terminal(queue, job)[0] == "done"

    assert status.rc == 0 and status.json()["incomplete"] == [], status
    assert shown.json()["state"] != "incomplete" and shown.json()["repair"] is None, shown
    assert f"incomplete {job}" not in listed.lines(), listed


@needs_strace
@pytest.mark.skipif(os.uname().machine not in OPENAT, reason="openat's number is not known here")
def test_status_asked_while_a_worker_finishes_a_job_reports_no_conflict(day: Day) -> None:
    """Q-6, §2.4, I-1: an operator's ``ctx queue status`` meets a job the moment its worker
    finishes it: its scan finds the job claimed and leased, and by the time it reads the lease
    (held back with strace until then) the worker has finished the job and removed the lease.
    A job that was claimed and is now done is no conflict: status must exit 0 (exit 1 says
    a conflict was found), and never tell the operator to repair that lease by hand."""
    queue = day.queue
    job = day.member_publishes("k0", HOLD, "k0")
    worker = day.worker("planner", "pw")
    assert wait_for(lambda: (day.outbox / "pid-k0").exists(), 30), worker.poll()
    lease_dir = queue.dir / "lease" / job
    looking = traced(
        *CTX_ARGV, "queue", "status", "-p", SPACE, "--json",
        options=["-P", str(lease_dir), "-e", "trace=openat",
                 "-e", "inject=openat:delay_enter=1500000"],
        env=day.env,
    )  # fmt: skip
    day.procs.append(looking)
    assert wait_for(lambda: stopped_in_openat(looking, lease_dir), 30), looking.poll()
    (day.outbox / "go-k0").touch()
    assert wait_for(lambda: queue.state(job) == "done", 30), queue.state(job)
    assert looking.poll() is None, "status did not wait for its lease read"
    out, err = looking.communicate(timeout=60)
    worker.send_signal(signal.SIGTERM)
    ended(worker)
    assert "repair the lease by hand" not in out, out
    assert looking.returncode == 0 and json.loads(out)["conflicts"] == [], (out, err)


def test_the_listing_a_missing_sessions_refusal_suggests_lists_this_roots_sessions(
    day: Day,
) -> None:
    """S-1 (docs/sessions.md "Commands"): an operator who names the storage root with
    ``--storage`` asks for a session that does not exist, in the agent's home and in the space;
    each refusal names the ``ctx session list`` command that lists the sessions there are.
    Copied into a shell as it is, that command must list this root's sessions of the agent
    there (as a ``ctx queue`` suggestion names the queue the command was told, docs/queue.md)."""
    shell_env = clean_env()  # a shell without CTX_STORAGE, as the operator's next one
    copied = []
    for project in ([], ["--project", SPACE]):
        ran = day.ctx("run", "--agent", "planner", *project, "--session", "s1", "--native",
                      STAMP, input=json.dumps({"tag": "x", "out": str(day.outbox)}))  # fmt: skip
        assert ran.rc == 0, ran
        missing = ctx_run("--storage", day.storage, "session", "show", "planner", "nosuch",
                          *project, env=shell_env)  # fmt: skip
        assert missing.rc == 1 and missing.err.startswith("ctx: ENOENT: "), missing
        found = re.search(r"'(ctx session list [^']*)' lists the sessions there are", missing.err)
        assert found, missing
        argv = shlex.split(found[1])
        listing = subprocess.run([*CTX_ARGV, *argv[1:]], env=shell_env, capture_output=True,
                                 text=True, timeout=60)  # fmt: skip
        copied.append((found[1], listing.returncode, listing.stdout.split(), listing.stderr))
    assert [(rc, out) for _, rc, out, _ in copied] == [(0, ["s1"]), (0, ["s1"])], copied
