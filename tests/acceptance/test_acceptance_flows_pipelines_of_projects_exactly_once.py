"""Pipelines across several project queues, each job exactly once end to end (SPEC §2 Q-1…Q-9,
I-1…I-5, §2.4, §3 W-1…W-4, §6 T-6, §9 X-1; docs/queue.md, docs/workers.md).

Three shared spaces of one group, ``stage-a``, ``stage-b`` and ``stage-c``, an agent of that
group granted all three, and one tool installed from a v2 manifest, ``relay.step``: run by the
``ctx queue work`` of one stage for a job, it publishes the follow-up jobs its input names into
the next stage's queue with ``ctx queue publish --name`` (a deterministic name, so that a run
done again meets ``EEXIST`` instead of publishing twice, and takes the follow-up as there only
when ``ctx queue show`` finds it in a state), or a ``--batch`` of them (fan-out), or collects
what a stage finished (fan-in); it notes every run and every publish in a trace file.  Workers
of each stage are SIGKILLed at chosen moments — before the follow-up is published, right after
it, while a post-hook holds the ended call, while the follow-up's publish is between its
staging file and its move, and (strace) as finish moves the result or the request, or as the
claim writes its lease — and each stage is put right with ``ctx queue recover`` and
``recover --reconcile``.

What is checked: every job of every stage ends exactly once in ``done/`` or ``failed/`` with
its result, nothing left pending, claimed, leased or staged, and recover then changes nothing;
no follow-up is lost and none is published twice (the repeated publish is refused ``EEXIST``
naming the state it found, and leaves the next queue as it was); a job whose result was in
place never runs again (I-3); each result pairs with its request and with the call its tool
recorded; the recover of one project never touches another's jobs; a failed, timed-out or
killed job is republished under a new name while its failed pair stays as it was; a worker
stopped with SIGTERM lets its job publish and finish; bad follow-ups (no such project, an
illegal name, a request over the next queue's limit, a bad batch line) fail their parent
with the reason and stage nothing; and ``ctx queue status``, ``list`` and ``show`` agree with
what the tools saw."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    SUFFIX,
    OnStorage,
    QueueCLI,
    alive,
    new_scratch_dir,
    processes_of,
    read_jsonl,
    requests_by_state,
    rfc3339,
    scratch_top,
    snapshot,
    tool_manifest,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.strace import can_inject
from tests.support.users import UnprivilegedUser, members_of, run_as

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the agent runs as another uid in the spaces' group: needs root"
)
needs_strace = pytest.mark.skipif(not can_inject(), reason="needs strace fault injection")

SCRATCH = scratch_top(__file__)
USER, GROUP = "ctxpipe-u", "ctxpipe-g"
AGENT, LABEL = "relay", "relay_t"
A, B, C = "stage-a", "stage-b", "stage-c"
STAGES = (A, B, C)
TOOL = "relay.step"
WAIT = 30.0
TRACEBACK = "Traceback (most recent call last)"

# The pipeline's tool (the storage root is the parent of its own tier, the trace directory
# beside the root).  It notes each run (``start``), each publish (``publish``, ``batch``)
# and its end (``end``, ``fail``) in TRACE/trace.jsonl, one line a write; while
# TRACE/hold-TAG-POINT exists it waits (30 s at most) at POINT (``before`` its publishes,
# ``after`` them), having written its pid to TRACE/at-TAG-POINT.  A follow-up refused with
# EEXIST counts as there only when ``ctx queue show`` finds it pending, claimed, done or
# failed; otherwise the run fails (status 4), as it does for any other refusal, so that the
# job can be run again.  While TRACE/stall-NAME exists, the publish of follow-up NAME runs
# under strace, held 20 s as it moves its staging file into pending/.
RELAY = r"""#!/usr/bin/python3
import json, os, subprocess, sys, time

CTX = @CTX@
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(sys.argv[0])))
TRACE = os.path.join(os.path.dirname(ROOT), "trace")


def note(**fields):
    fields.update(call=os.environ.get("CTX_CALL"), pid=os.getpid())
    line = (json.dumps(fields) + "\n").encode()
    fd = os.open(os.path.join(TRACE, "trace.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def gate(tag, point):
    hold = os.path.join(TRACE, "hold-%s-%s" % (tag, point))
    if not os.path.exists(hold):
        return
    with open(os.path.join(TRACE, "at-%s-%s" % (tag, point)), "w") as at:
        at.write(str(os.getpid()))
    for _ in range(1500):
        if not os.path.exists(hold):
            return
        time.sleep(0.02)


def ctx(args, data="", wrap=()):
    done = subprocess.run([*wrap, CTX, "--storage", ROOT, *args], input=data,
                          capture_output=True, text=True)
    try:
        answer = json.loads(done.stdout) if done.stdout.strip() else {}
    except ValueError:
        answer = {"stdout": done.stdout}
    return done.returncode, answer


def publish(follow):
    args = ["queue", "publish", "--project", follow["project"], "--json",
            "--name", follow["name"], "-"]
    wrap = ()
    if os.path.exists(os.path.join(TRACE, "stall-" + follow["name"])):
        inbox = os.path.join(ROOT, "shared", follow["project"], "queue", "inbox")
        wrap = ("strace", "-f", "-qq", "-o", "/dev/null", "-P", inbox, "-e", "trace=renameat2",
                "-e", "inject=renameat2:delay_enter=20000000:when=1")
    rc, answer = ctx(args, json.dumps(follow["request"]), wrap)
    got = {"rc": rc, "name": answer.get("name"), "error": answer.get("error"),
           "message": answer.get("message")}
    if answer.get("error") == "EEXIST":
        src, shown = ctx(["queue", "show", "--project", follow["project"], "--json",
                          follow["name"]])
        got["found"] = shown.get("state")
    return got


req = json.loads(sys.stdin.readline())
tag = req["tag"]
note(event="start", tag=tag, agent=os.environ.get("CTX_AGENT"), input=req)
gate(tag, "before")
out = {"tag": tag, "call": os.environ.get("CTX_CALL"), "value": req.get("value"),
       "published": []}
for follow in req.get("next", []):
    got = publish(follow)
    note(event="publish", tag=tag, asked=follow["name"], project=follow["project"], **got)
    out["published"].append(dict(asked=follow["name"], **got))
    there = got.get("found") in ("pending", "claimed", "done", "failed")
    if got["rc"] != 0 and not there:
        print("cannot publish %s: %s: %s" % (follow["name"], got["error"], got["message"]),
              file=sys.stderr)
        sys.exit(4)
fan = req.get("fan_out")
if fan:
    data = "".join(json.dumps(r) + "\n" for r in fan["requests"])
    rc, answer = ctx(["queue", "publish", "--project", fan["project"], "--batch", "--json", "-"],
                     data)
    got = {"rc": rc, "names": answer.get("names"), "error": answer.get("error"),
           "message": answer.get("message")}
    note(event="batch", tag=tag, project=fan["project"], **got)
    out["batch"] = got
    if rc != 0:
        print("cannot publish the batch: %s: %s" % (got["error"], got["message"]), file=sys.stderr)
        sys.exit(4)
collect = req.get("collect")
if collect:
    rc, listed = ctx(["queue", "list", "--project", collect, "--state", "done", "--json"])
    rc2, status = ctx(["queue", "status", "--project", collect, "--json"])
    done = os.path.join(ROOT, "shared", collect, "queue", "done")
    parts = {}
    for entry in listed:
        with open(os.path.join(done, entry["name"] + ".result")) as result:
            parts[entry["name"]] = json.load(result)["output"]["value"]
    out["collected"] = {"list_rc": rc, "status_rc": rc2, "status_done": status.get("done"),
                        "parts": parts}
gate(tag, "after")
if req.get("fail") or os.path.exists(os.path.join(TRACE, "fail-" + tag)):
    note(event="fail", tag=tag)
    print("relay.step: told to fail " + tag, file=sys.stderr)
    sys.exit(3)
note(event="end", tag=tag)
print(json.dumps(out))
"""

# A post-hook (T-6) of relay.step: while TRACE/hold-TAG-post exists it holds the ended call
# (9 s at most: a post-hook has ten), having written its pid to TRACE/at-TAG-post.
POST_HOLD = r"""#!/usr/bin/python3
import json, os, sys, time

TRACE = @TRACE@
tag = json.loads(sys.stdin.read())["input"]["tag"]
hold = os.path.join(TRACE, "hold-%s-post" % tag)
if os.path.exists(hold):
    with open(os.path.join(TRACE, "at-%s-post" % tag), "w") as at:
        at.write(str(os.getpid()))
    for _ in range(450):
        if not os.path.exists(hold):
            break
        time.sleep(0.02)
"""


# ------------------------------------------------------------------------------ the world


def job(tag: str, *follow: tuple[str, str, dict], **extra) -> dict:
    """A request of relay.step for ``tag`` publishing each ``(project, name, request)``."""
    data = {"tag": tag, **extra}
    if follow:
        data["next"] = [{"project": p, "name": n, "request": r} for p, n, r in follow]
    return {"tool": TOOL, "input": data}


def chain(tag: str, stages: int = 3) -> dict:
    """The job ``a-TAG`` of stage A whose follow-up is ``b-TAG`` in B, whose follow-up (with
    three stages) is ``c-TAG`` in C."""
    last = job(f"b-{tag}") if stages == 2 else job(f"b-{tag}", (C, f"c-{tag}", job(f"c-{tag}")))
    return job(f"a-{tag}", (B, f"b-{tag}", last))


def kill_on(directory: Path, call: str, when: int) -> tuple[str, ...]:
    """strace, killing the traced command on entering its ``when``-th ``call`` naming
    ``directory`` (by path or through a descriptor)."""
    return ("strace", "-f", "-qq", "-o", "/dev/null", "-P", str(directory), "-e", f"trace={call}",
            "-e", f"inject={call}:signal=KILL:when={when}")  # fmt: skip


def carriers(marker: str) -> list[int]:
    """Live processes whose environment holds ``marker`` (a worker, its orphan guard)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and alive(int(entry)):
            with contextlib.suppress(OSError):
                if marker.encode() in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(int(entry))
    return found


@dataclass
class Worker:
    """One ``ctx queue work --json`` process (maybe under strace), its output in files, and
    the variable its environment (and its orphan guard's) carries."""

    proc: subprocess.Popen
    out: Path
    err: Path
    marker: str

    def gone(self) -> None:
        """Nothing of the worker is left running: neither it nor its orphan guard."""
        assert wait_for(lambda: not carriers(self.marker), WAIT), carriers(self.marker)

    def events(self) -> list[dict]:
        lines = self.out.read_text().splitlines()
        if lines and not lines[-1].endswith("}"):
            lines = lines[:-1]  # a line cut by SIGKILL
        return [json.loads(line) for line in lines if line.strip()]

    def said(self) -> str:
        return self.err.read_text()

    def stop(self) -> list[dict]:
        """SIGTERM (W-4): it lets its jobs finish and exits 0; its events."""
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(timeout=WAIT) == 0, self.said()
        assert TRACEBACK not in self.said(), self.said()
        return self.events()

    def wait(self) -> list[dict]:
        """A ``--drain`` worker's end: exit 0, no traceback; its events."""
        assert self.proc.wait(timeout=WAIT) == 0, self.said()
        assert TRACEBACK not in self.said(), self.said()
        return self.events()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=WAIT)
        self.gone()


@dataclass
class World(OnStorage):
    top: Path
    user: UnprivilegedUser
    gid: int
    workers: list[Worker] = field(default_factory=list)

    @property
    def storage(self) -> Path:
        return self.top / "storage"

    @property
    def trace(self) -> Path:
        return self.top / "trace"

    def queue(self, stage: str) -> QueueCLI:
        return QueueCLI(self.storage, stage)

    def qdir(self, stage: str) -> Path:
        return self.storage / "shared" / stage / "queue"

    # -- workers

    def start(self, stage: str, *args: str, wrap: tuple[str, ...] = ()) -> Worker:
        """``ctx queue work --project STAGE --agent relay --json ARGS`` in a session of its own."""
        n = len(self.workers)
        out, err = self.top / f"worker{n}.out", self.top / f"worker{n}.err"
        argv = [*wrap, *CTX_ARGV, "queue", "work", "--project", stage, "--agent", AGENT,
                "--json", *args]  # fmt: skip
        marker = f"PIPELINE_WORKER={self.top.name}-{n}"
        env = {**self.env, "PIPELINE_WORKER": marker.split("=", 1)[1]}
        with open(out, "w") as o, open(err, "w") as e:
            proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=o,
                                    stderr=e, start_new_session=True)  # fmt: skip
        worker = Worker(proc, out, err, marker)
        self.workers.append(worker)
        return worker

    def drain(self, stage: str, *args: str) -> list[dict]:
        return self.start(stage, "--drain", *args).wait()

    def killed_at(self, stage: str, directory: Path, when: int, call: str = "renameat2") -> Worker:
        """A ``--drain`` worker of ``stage`` SIGKILLed (strace) on entering its ``when``-th
        ``call`` that names ``directory``: that call is not made."""
        worker = self.start(stage, "--drain", wrap=kill_on(directory, call, when))
        assert worker.proc.wait(timeout=WAIT) == -signal.SIGKILL, worker.said()
        worker.gone()
        return worker

    # -- the tool's trace

    def notes(self, event: str | None = None, tag: str | None = None) -> list[dict]:
        path = self.trace / "trace.jsonl"
        lines = path.read_text().split("\n")[:-1] if path.exists() else []
        found = [json.loads(line) for line in lines]
        return [
            n
            for n in found
            if (event is None or n["event"] == event) and (tag is None or n["tag"] == tag)
        ]

    def publishes(self, name: str) -> list[dict]:
        """The publishes of follow-up ``name`` (asked with the suffix or without)."""
        return [
            n
            for n in self.notes("publish")
            if n["asked"].removesuffix(SUFFIX) == name.removesuffix(SUFFIX)
        ]

    def hold(self, tag: str, point: str) -> None:
        (self.trace / f"hold-{tag}-{point}").touch()

    def release(self, tag: str, point: str) -> None:
        (self.trace / f"hold-{tag}-{point}").unlink(missing_ok=True)

    def held(self, tag: str, point: str) -> int:
        """The pid waiting at ``point`` of ``tag``, once it is there."""
        at = self.trace / f"at-{tag}-{point}"
        assert wait_for(lambda: at.exists() and at.read_text() != "", WAIT), (tag, point)
        return int(at.read_text())

    def as_member(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``ctx ARGS`` run by the agent's user with the projects' group: a member of the
        projects, not root."""
        env = {**self.env, "HOME": str(self.trace), "XDG_CACHE_HOME": str(self.trace / "cache")}
        return run_as(self.user, [*CTX_ARGV, *args], [self.gid], env=env, cwd=self.trace)

    def add_post_hook(self) -> None:
        post = self.storage / "tool" / f"{TOOL}.d" / "hooks" / "post.d"
        post.mkdir(parents=True, exist_ok=True)
        hook = post / "50-hold"
        hook.write_text(POST_HOLD.replace("@TRACE@", repr(str(self.trace))))
        hook.chmod(0o755)


@pytest.fixture(scope="module")
def template(_template: Path) -> Iterator[tuple[Path, list[str], UnprivilegedUser, int]]:
    """A world made once per process as a user would make it — ``ctx shared create`` of the
    three stages with their group, ``ctx object install`` of relay.step from its manifest, the
    tool's policy, ``ctx agent create`` — with the files in it that name its path."""
    (user,), gid = members_of(GROUP, USER)
    top = new_scratch_dir(SCRATCH, "template")
    w = World(top, user, gid)
    try:
        copy_of_root(_template, w.storage)
        for stage in STAGES:
            made = w.ctx("shared", "create", stage, "--group", str(gid))
            assert made.rc == 0, made
        program = RELAY.replace("@CTX@", repr(CTX_ARGV[0]))
        manifest = tool_manifest(top / "src", TOOL, program, side_effects=True)
        installed = w.ctx("object", "install", manifest, "--tier", "system")
        assert installed.rc == 0, installed
        w.allow_tool(LABEL, TOOL)
        agent = {"name": AGENT, "label": LABEL, "tools": [TOOL],
                 "shared": {s: ["read", "write"] for s in STAGES}}  # fmt: skip
        made = w.ctx("agent", "create", "--user", str(user.uid), "--groups", str(gid), "-",
                     input=json.dumps(agent))  # fmt: skip
        assert made.rc == 0, made
        naming = [
            str(path.relative_to(w.storage))
            for path in w.storage.rglob("*")
            if path.is_file() and not path.is_symlink() and str(top).encode() in path.read_bytes()
        ]
        yield top, naming, user, gid
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def world(template) -> Iterator[World]:
    """A copy of the template (owners, groups and modes kept, as ``cp -a`` keeps them), its
    files that name the template's path made to name the copy's; a trace directory every uid
    may write."""
    old, naming, user, gid = template
    top = new_scratch_dir(SCRATCH, "w")
    w = World(top, user, gid)
    try:
        copied = subprocess.run(["cp", "-a", str(old / "storage"), str(w.storage)])
        assert copied.returncode == 0
        for rel in naming:
            path = w.storage / rel
            path.write_bytes(path.read_bytes().replace(str(old).encode(), str(top).encode()))
        w.trace.mkdir()
        w.trace.chmod(0o1777)
        yield w
    finally:
        with contextlib.suppress(OSError):
            for hold in w.trace.glob("hold-*"):
                hold.unlink()
        for worker in w.workers:
            if worker.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.proc.pid, signal.SIGKILL)
                worker.proc.wait()
        shutil.rmtree(top, ignore_errors=True)


# ------------------------------------------------------------------------------ checks


def finished(queue: QueueCLI) -> set[str]:
    """Jobs whose finish has ended: the terminal pair in place and nothing of them elsewhere."""
    ended = set()
    for state in ("done", "failed"):
        for name in os.listdir(queue.dir / state):
            if name.endswith(SUFFIX) and (queue.dir / state / f"{name}.result").is_file():
                rest = [
                    s for s in ("pending", "claimed", "lease") if (queue.dir / s / name).exists()
                ]
                if not rest:
                    ended.add(name)
    return ended


def parts_of(printed: list[str], requests: list[dict]) -> list[tuple[str, int]]:
    """The batch's printed names, one a line in the order of its lines, with each line's
    value."""
    return [(name, r["input"]["value"]) for name, r in zip(printed, requests, strict=True)]


def names(*tags: str) -> set[str]:
    return {t + SUFFIX for t in tags}


def settled(q: QueueCLI) -> None:
    """Nothing in flight or staged, and ``recover --reconcile`` calls the queue consistent
    and changes nothing (I-5)."""
    for sub in ("pending", "claimed", "lease", "inbox"):
        assert q.entries(sub) == set(), (q.project, sub, q.entries(sub))
    before = snapshot(q.dir)
    r = q.run("recover", "--reconcile", "--json")
    assert r.rc == 0 and r.json()["consistent"] is True, r
    assert r.json()["requeued"] == r.json()["repaired"] == r.json()["removed_temps"] == [], r
    assert snapshot(q.dir) == before


def assert_once(w: World, stage: str, tags: list[str], state: str = "done") -> dict[str, dict]:
    """Stage's queue holds exactly ``tags``, each once in ``state`` with its result, which
    pairs with the request (tool, tag) and with the last run its tool noted for the tag; the
    queue is settled."""
    q = w.queue(stage)
    assert requests_by_state(q.dir) == {t + SUFFIX: [state] for t in tags}, stage
    results = {}
    for tag in tags:
        got, result = q.only_result(tag + SUFFIX)
        assert got == state, (stage, tag, result)
        req = json.loads((q.dir / state / (tag + SUFFIX)).read_text())
        assert req["tool"] == result["tool"] == TOOL and req["input"]["tag"] == tag, req
        assert result["agent"] == AGENT and result["status"] == (
            "ok" if state == "done" else "error"
        )
        runs = w.notes("start", tag)
        assert runs and result["call"] == runs[-1]["call"], (tag, result, runs)
        created, started = rfc3339(req["created"]), rfc3339(result["started"])
        assert created <= started <= rfc3339(result["finished"]), (req, result)
        if state == "done":
            assert result["output"]["tag"] == tag and result["output"]["call"] == result["call"]
        results[tag] = result
    settled(q)
    return results


def published_once(w: World, name: str) -> None:
    """Follow-up ``name`` was published by exactly one run; every other run's publish was
    refused EEXIST and found it in a state."""
    tries = w.publishes(name)
    assert [t["rc"] for t in tries].count(0) == 1, tries
    for t in tries:
        if t["rc"] != 0:
            assert (t["rc"], t["error"]) == (1, "EEXIST"), t
            assert t["found"] in ("pending", "claimed", "done", "failed"), t


def status(w: World, stage: str) -> dict:
    r = w.queue(stage).run("status", "--json")
    assert r.rc == 0, r
    return r.json()


def counts(w: World, stage: str) -> dict[str, int]:
    got = status(w, stage)["counts"]
    return {k: v for k, v in got.items() if v}


def recover(w: World, stage: str, *args: str, rc: int = 0) -> dict:
    r = w.queue(stage).run("recover", "--json", *args)
    assert r.rc == rc, r
    assert TRACEBACK not in r.err, r
    return r.json()


def jobs_of(entries: list[dict]) -> list[str]:
    return [e["job"] for e in entries]


def wait_dead(pid: int) -> None:
    """docs/workers.md: a killed worker's orphan guard kills its tool's whole group."""
    assert wait_for(lambda: not alive(pid), WAIT), f"pid {pid} outlived its killed worker"


# ===================================================================== whole pipelines


def test_a_three_stage_pipeline_runs_each_job_once_and_pairs_every_result(world: World):
    """Q-1, Q-4, W-1, W-3, I-1: four chains published into stage A, waiting workers of the
    three stages (two jobs at once each) running at the same time: every job of every stage
    ends once in done/ with its result, which pairs with its request and with the call its
    tool noted; each follow-up is published once, by the agent (``from``), with the fields its
    parent gave; the workers' ``claim``/``finish`` events and ``stop`` summaries match the
    queues; each job's claim, start and finish are recorded once in the worker session under
    its own queue's path."""
    w = world
    tags = [f"x{n}" for n in range(4)]
    for tag in tags:
        w.queue(A).publish(chain(tag), name=f"a-{tag}")
    workers = {s: w.start(s, "--concurrency", "2") for s in STAGES}
    assert wait_for(lambda: finished(w.queue(C)) == names(*(f"c-{t}" for t in tags)), WAIT)
    for stage, prefix in zip(STAGES, "abc", strict=True):
        events = workers[stage].stop()
        stop = events[-1]
        assert stop["event"] == "stop" and stop["stopped_by"] == "SIGTERM", stop
        assert (stop["done"], stop["failed"], stop["lost"]) == (4, 0, 0), stop
        claims = sorted(e["job"] for e in events if e["event"] == "claim")
        ends = sorted((e["job"], e["state"]) for e in events if e["event"] == "finish")
        assert claims == sorted(f"{prefix}-{t}{SUFFIX}" for t in tags), events
        assert ends == [(j, "done") for j in claims], events
    for stage, prefix in zip(STAGES, "abc", strict=True):
        assert_once(w, stage, [f"{prefix}-{t}" for t in tags])
        assert counts(w, stage) == {"done": 4}
    for tag in tags:
        for prefix in "abc":
            assert len(w.notes("start", f"{prefix}-{tag}")) == 1, tag
        for follow, stage in ((f"b-{tag}", B), (f"c-{tag}", C)):
            published_once(w, follow)
            stored = json.loads((w.qdir(stage) / "done" / (follow + SUFFIX)).read_text())
            assert stored["from"] == AGENT and stored["input"]["tag"] == follow, stored
        assert (
            w.notes("start", f"b-{tag}")[0]["input"]
            == chain(tag)["input"]["next"][0]["request"]["input"]
        )
    session = w.storage / "home" / str(w.user.uid) / "agent" / AGENT / "session" / "worker"
    events = read_jsonl(session / "events.jsonl")
    for stage, prefix in zip(STAGES, "abc", strict=True):
        for tag in tags:
            job_name = f"{prefix}-{tag}{SUFFIX}"
            kinds = [
                e["type"]
                for e in events
                if e.get("object") == f"queue/{job_name}"
                and e.get("queue") == f"shared/{stage}/queue"
            ]
            for kind in ("queue.claim", "queue.start", "queue.finish"):
                assert kinds.count(kind) == 1, (job_name, kinds)


def test_status_list_and_show_agree_with_what_the_tools_saw_mid_pipeline(world: World):
    """§2.4, Q-3, Q-5: while ``b-y`` is held in its tool, A's job is done and shown with the
    result its tool printed; B's status counts one claimed job, ``list --state claimed``
    names it, and ``show`` gives the request the tool read, a lease naming B's worker and a
    live holder, which a ``recover --reconcile`` run by a member of the projects' group (who
    may not signal root's worker) leaves alone; C is empty.  Let go, ``c-y`` is pending in
    C, shown with the agent as ``from``; drained, C's ``show`` gives the output its tool
    printed."""
    w = world
    w.hold("b-y", "before")
    w.queue(A).publish(chain("y"), name="a-y")
    wa, wb = w.start(A), w.start(B)
    w.held("b-y", "before")

    assert counts(w, A) == {"done": 1}
    shown = w.queue(A).run("show", "a-y", "--json")
    assert shown.rc == 0 and shown.json()["state"] == "done", shown
    result = shown.json()["result"]
    assert result["call"] == w.notes("start", "a-y")[0]["call"], result
    (told,) = result["output"]["published"]
    assert (told["asked"], told["rc"], told["name"]) == ("b-y", 0, "b-y" + SUFFIX), told

    assert counts(w, B) == {"claimed": 1}
    listed = w.queue(B).run("list", "--state", "claimed", "--json")
    assert listed.rc == 0 and [e["name"] for e in listed.json()] == ["b-y" + SUFFIX], listed
    shown = w.queue(B).run("show", "b-y", "--json").json()
    assert shown["state"] == "claimed" and shown["lease"]["pid"] == wb.proc.pid, shown
    assert shown["holder"]["state"] == "alive", shown
    assert shown["request"]["input"] == w.notes("start", "b-y")[0]["input"], shown
    by_member = w.as_member("queue", "recover", "--project", B, "--reconcile", "--json")
    assert by_member.returncode == 0, by_member
    report = json.loads(by_member.stdout)
    assert report["requeued"] == report["repaired"] == report["incomplete"] == [], report
    assert w.queue(B).state("b-y" + SUFFIX) == "claimed"
    assert counts(w, C) == {}
    assert w.queue(C).run("list", "--json").json() == []

    w.release("b-y", "before")
    assert wait_for(lambda: w.queue(B).state("b-y" + SUFFIX) == "done", WAIT)
    listed = w.queue(C).run("list", "--state", "pending")
    assert (listed.rc, listed.out) == (0, f"c-y{SUFFIX}\n"), listed
    shown = w.queue(C).run("show", "c-y", "--json").json()
    assert shown["state"] == "pending" and shown["request"]["from"] == AGENT, shown
    wa.stop()
    wb.stop()
    w.drain(C)
    shown = w.queue(C).run("show", "c-y", "--json").json()
    (end,) = w.notes("end", "c-y")
    assert shown["state"] == "done" and shown["result"]["call"] == end["call"], shown
    assert shown["result"]["output"]["tag"] == "c-y", shown
    for stage, tag in ((A, "a-y"), (B, "b-y"), (C, "c-y")):
        assert_once(w, stage, [tag])


def test_a_follow_up_name_taken_in_every_state_of_the_next_queue_is_refused_and_left(
    world: World, child: subprocess.Popen
):
    """Q-1: a follow-up whose name B already holds — pending, claimed, done or failed — is
    refused ``EEXIST`` (exit 1, ``--json`` error object) with a message naming that state;
    B's queue is left byte for byte as it was, and the parents end done (their tool finds
    the follow-up there)."""
    w = world
    qb = w.queue(B)
    for name, flag in (("b-d", "--ok"), ("b-f", "--error")):
        qb.publish(job(name), name=name)
        assert qb.claim("--pid", str(child.pid)) == name + SUFFIX
        qb.finish(name + SUFFIX, flag)
    qb.publish(job("b-c"), name="b-c")
    assert qb.claim("--pid", str(child.pid)) == "b-c" + SUFFIX
    qb.publish(job("b-p"), name="b-p")
    before = snapshot(qb.dir)
    states = {"b-p": "pending", "b-c": "claimed", "b-d": "done", "b-f": "failed"}
    for name in states:
        w.queue(A).publish(job(f"a-{name}", (B, name, job(name, extra="second"))), name=f"a-{name}")
    events = w.drain(A)
    assert events[-1]["done"] == 4, events
    for name, state in states.items():
        (tried,) = w.publishes(name)
        assert (tried["rc"], tried["error"], tried["found"]) == (1, "EEXIST", state), tried
        assert state in tried["message"] and name + SUFFIX in tried["message"], tried
    assert snapshot(qb.dir) == before
    assert_once(w, A, [f"a-{n}" for n in states])


def test_parents_racing_to_publish_one_follow_up_name_publish_it_once(world: World):
    """Q-1, W-3, I-4, §2.4: six parents in A, run by two workers three at a time, each publish
    the same follow-up ``b-shared`` (half of them naming it with its ``.req.json`` suffix, as
    ``--name`` allows; B named by its name, its queue's absolute path or a path relative to
    the tool's working directory, as ``--project`` allows) and one of their own: exactly one
    publish of ``b-shared`` succeeds, the five others are refused ``EEXIST``; B holds it once
    and each own follow-up once; no parent runs twice."""
    w = world
    # B as a name, as the queue's absolute path, and relative to the tool's working
    # directory (docs/tools.md: the host directory behind the agent's home).
    spellings = [B, str(w.qdir(B)), "../../shared/stage-b/queue"]
    for n in range(6):
        shared = "b-shared" + (SUFFIX if n % 2 else "")
        project = spellings[n % 3]
        parent = job(
            f"a-{n}", (project, shared, job("b-shared")), (B, f"b-own{n}", job(f"b-own{n}"))
        )
        w.queue(A).publish(parent, name=f"a-{n}")
    first, second = w.start(A, "--concurrency", "3"), w.start(A, "--concurrency", "3")
    assert wait_for(lambda: len(finished(w.queue(A))) == 6, WAIT)
    done = first.stop()[-1]["done"] + second.stop()[-1]["done"]
    assert done == 6
    tries = w.publishes("b-shared")
    assert sorted(t["rc"] for t in tries) == [0, 1, 1, 1, 1, 1], tries
    published_once(w, "b-shared")
    assert requests_by_state(w.qdir(B)) == {
        n: ["pending"] for n in names("b-shared", *(f"b-own{n}" for n in range(6)))
    }
    for n in range(6):
        assert len(w.notes("start", f"a-{n}")) == 1
        published_once(w, f"b-own{n}")
    assert_once(w, A, [f"a-{n}" for n in range(6)])


def test_follow_ups_are_claimed_in_the_order_their_parent_published_them(world: World):
    """Q-9, §2.4 (``list --state``): a parent publishes four follow-ups one after the other,
    named in reverse alphabetical order; B's ``list --state pending`` names them in publish
    order, and B's worker, one job at a time, claims them in that order."""
    w = world
    order = ["b-z", "b-y", "b-x", "b-w"]
    w.queue(A).publish(job("a-o", *((B, n, job(n)) for n in order)), name="a-o")
    w.drain(A)
    assert [p["asked"] for p in w.notes("publish")] == order
    listed = w.queue(B).run("list", "--state", "pending")
    assert listed.lines() == [n + SUFFIX for n in order], listed
    events = w.drain(B)
    assert [e["job"] for e in events if e["event"] == "claim"] == [n + SUFFIX for n in order]
    assert [n["tag"] for n in w.notes("start")] == ["a-o", *order]
    assert_once(w, B, order)


def test_a_drained_worker_runs_a_chain_whose_jobs_publish_into_their_own_stage(world: World):
    """W-2, §2.4 (``--drain``): a job of C publishes its successor into C, which publishes
    the next, four deep; one ``--drain`` worker (three slots, so slots find the queue empty
    while a job that will publish still runs) runs the whole chain before it exits, each job
    once, and leaves nothing pending."""
    w = world
    request = job("c-s3")
    for n in (2, 1, 0):
        request = job(f"c-s{n}", (C, f"c-s{n + 1}", request))
    w.queue(C).publish(request, name="c-s0")
    stop = w.drain(C, "--concurrency", "3")[-1]
    assert (stop["done"], stop["left_pending"]) == (4, {}), stop
    assert [n["tag"] for n in w.notes("start")] == [f"c-s{n}" for n in range(4)]
    assert_once(w, C, [f"c-s{n}" for n in range(4)])


def test_the_whole_pipeline_triggered_again_under_a_new_name_publishes_nothing_twice(
    world: World,
):
    """Q-1, I-3: once a chain has run through the three stages, publishing its first job
    again under the same name is refused ``EEXIST`` (already done); under a new name it runs,
    its follow-up is refused ``EEXIST`` (done) and the later stages stay as they were: no job
    of B or C runs a second time."""
    w = world
    w.queue(A).publish(chain("r"), name="a-r")
    for stage in STAGES:
        w.drain(stage)
    again = w.queue(A).run("publish", "--name", "a-r", "--json", "-", input=json.dumps(chain("r")))
    assert again.rc == 1 and again.json()["error"] == "EEXIST", again
    assert "done" in again.json()["message"], again
    later = {s: snapshot(w.qdir(s)) for s in (B, C)}
    again = chain("r")
    again["input"]["tag"] = "a-r2"
    w.queue(A).publish(again, name="a-r2")
    for stage in STAGES:
        w.drain(stage)
    assert {s: snapshot(w.qdir(s)) for s in (B, C)} == later
    assert w.publishes("b-r")[-1]["found"] == "done"
    published_once(w, "b-r")
    assert [len(w.notes("start", t)) for t in ("b-r", "c-r")] == [1, 1]
    assert_once(w, A, ["a-r", "a-r2"])


# ===================================================================== bad follow-ups


def test_a_follow_up_into_a_project_that_does_not_exist_fails_its_parent_and_makes_nothing(
    world: World,
):
    """W-1, §2.4: a tool that publishes into a project with no queue is refused ``ENOENT``
    (exit 1); its parent is finished in failed/ with the tool's exit status and that reason,
    and no space or queue of that name appears."""
    w = world
    w.queue(A).publish(job("a-z", ("stage-z", "b-z", job("b-z"))), name="a-z")
    events = w.drain(A)
    assert (events[-1]["done"], events[-1]["failed"]) == (0, 1), events
    (tried,) = w.publishes("b-z")
    assert (tried["rc"], tried["error"]) == (1, "ENOENT"), tried
    (result,) = assert_once(w, A, ["a-z"], "failed").values()
    assert result["exit_status"] == 4 and "ENOENT" in result["reason"], result
    assert "b-z" in result["reason"] and result["reason"].endswith("[exit]"), result
    assert not (w.storage / "shared" / "stage-z").exists()


def test_follow_ups_with_illegal_names_are_refused_einval_and_stage_nothing(world: World):
    """R-3, §2.4: follow-up names that are no object names (a space, a slash, 61 letters
    before the suffix, a leading dot) are refused ``EINVAL`` (exit 2) before anything is
    written: B's inbox and pending stay empty, and each parent fails naming ``EINVAL``."""
    w = world
    bad = ["b y", "b/../../a-0", "b" * 61, ".b"]
    for n, name in enumerate(bad):
        w.queue(A).publish(job(f"a-{n}", (B, name, job("b"))), name=f"a-{n}")
    events = w.drain(A)
    assert (events[-1]["done"], events[-1]["failed"]) == (0, len(bad)), events
    for name in bad:
        (tried,) = w.publishes(name)
        assert (tried["rc"], tried["error"]) == (2, "EINVAL"), tried
    results = assert_once(w, A, [f"a-{n}" for n in range(len(bad))], "failed")
    assert all("EINVAL" in r["reason"] for r in results.values()), results
    for sub in ("inbox", "pending", "claimed", "lease", "done", "failed"):
        assert os.listdir(w.qdir(B) / sub) == [], sub
    assert os.listdir(w.qdir(A) / "pending") == []


def test_a_follow_up_over_the_next_queues_request_limit_is_refused_efbig(world: World):
    """§2.1, docs/queue.md (Configuration): B's ``max_request_bytes`` holds for a follow-up
    published by a tool of A: one over it is refused ``EFBIG`` with nothing staged, its
    parent fails with that reason; one within it is published."""
    w = world
    with open(w.qdir(B) / "config", "a") as config:
        config.write("max_request_bytes=600\n")
    big = job("b-big", pad="x" * 700)
    small = job("b-small", pad="x" * 100)
    w.queue(A).publish(job("a-big", (B, "b-big", big)), name="a-big")
    w.queue(A).publish(job("a-small", (B, "b-small", small)), name="a-small")
    w.drain(A)
    (tried,) = w.publishes("b-big")
    assert (tried["rc"], tried["error"]) == (1, "EFBIG"), tried
    assert "600" in tried["message"], tried
    state, result = w.queue(A).only_result("a-big" + SUFFIX)
    assert state == "failed" and "EFBIG" in result["reason"], result
    assert w.queue(A).only_result("a-small" + SUFFIX)[0] == "done"
    assert requests_by_state(w.qdir(B)) == {"b-small" + SUFFIX: ["pending"]}
    assert os.listdir(w.qdir(B) / "inbox") == []


def test_a_fan_out_batch_with_one_bad_line_publishes_none_and_fails_its_parent(world: World):
    """docs/queue.md (publish --batch): one bad line (no ``tool``) refuses the whole batch
    with ``EINVAL`` naming that line; B holds nothing, not even a staging file, and the
    parent fails with that reason."""
    w = world
    lines = [job(f"b-{n}", value=n) for n in range(5)]
    lines[3] = {"input": {"tag": "b-3"}}
    w.queue(A).publish(job("a-fan", fan_out={"project": B, "requests": lines}), name="a-fan")
    w.drain(A)
    (batch,) = w.notes("batch", "a-fan")
    assert (batch["rc"], batch["error"], batch["names"]) == (1, "EINVAL", None), batch
    assert "line 4" in batch["message"], batch
    state, result = w.queue(A).only_result("a-fan" + SUFFIX)
    assert state == "failed" and "EINVAL" in result["reason"], result
    for sub in ("inbox", "pending"):
        assert os.listdir(w.qdir(B) / sub) == [], sub


def test_follow_ups_naming_a_missing_or_ungranted_tool_fail_in_their_stage_with_the_reason(
    world: World,
):
    """W-1, P-6: follow-ups published fine but naming a tool that does not exist, or one the
    agent's policy does not grant (``shell.exec``), are finished in B's failed/ with the
    errno and stage that refused them, and run nothing; their parents are done."""
    w = world
    nope = {"tool": "relay.nope", "input": {"tag": "b-nope"}}
    denied = {"tool": "shell.exec", "input": {"cmd": "true"}}
    w.queue(A).publish(job("a-n", (B, "b-nope", nope), (B, "b-denied", denied)), name="a-n")
    w.drain(A)
    events = w.drain(B)
    assert (events[-1]["done"], events[-1]["failed"]) == (0, 2), events
    _, missing = w.queue(B).only_result("b-nope" + SUFFIX)
    assert missing["error"]["error"] == "ENOENT" and "relay.nope" in missing["reason"], missing
    _, refused = w.queue(B).only_result("b-denied" + SUFFIX)
    assert refused["error"]["error"] == "EACCES", refused
    assert refused["error"]["stage"] == "authorize" and refused["error"]["step"] in (5, 6), refused
    assert requests_by_state(w.qdir(B)) == {n: ["failed"] for n in names("b-nope", "b-denied")}
    assert w.notes("start", "b-nope") == [] and len(w.notes("start")) == 1
    assert_once(w, A, ["a-n"])
    settled(w.queue(B))


# ===================================================================== fan-out, fan-in


def test_a_fan_out_of_fifty_and_a_fan_in_collector_see_each_part_exactly_once(world: World):
    """§2.4 (``--batch``), W-3, Q-1, Q-5: one job of A publishes a batch of 50 parts into B
    and a collector ``c-collect`` into C; the names the batch printed are exactly B's pending
    jobs.  Two B workers (three at a time each) run the parts; one of them is SIGKILLed while
    ``b-part07`` waits in its tool; ``recover --reconcile`` requeues what it held, and a
    drain runs the rest: every part ends once in done/, and only the parts the killed worker
    held ran twice.  The collector, run once B is drained, lists B's done jobs and reads
    their results: 50 parts, each its own value once, as B's ``status`` counts them."""
    w = world
    parts = [job(f"b-part{n:02}", value=n) for n in range(50)]
    collector = job("c-collect", collect=B)
    w.queue(A).publish(
        job("a-fan", (C, "c-collect", collector), fan_out={"project": B, "requests": parts}),
        name="a-fan",
    )
    w.drain(A)
    (batch,) = w.notes("batch", "a-fan")
    assert batch["rc"] == 0 and len(batch["names"]) == 50, batch
    assert len(set(batch["names"])) == 50
    assert set(os.listdir(w.qdir(B) / "pending")) == set(batch["names"])
    assert counts(w, B) == {"pending": 50}

    w.hold("b-part07", "before")
    pair = [w.start(B, "--concurrency", "3"), w.start(B, "--concurrency", "3")]
    pid = w.held("b-part07", "before")
    held = next(n for n, (_, v) in enumerate(parts_of(batch["names"], parts)) if v == 7)
    lease = w.queue(B).run("show", batch["names"][held], "--json").json()["lease"]
    (killed,) = [x for x in pair if x.proc.pid == lease["pid"]]
    (other,) = [x for x in pair if x is not killed]
    killed.kill()
    wait_dead(pid)
    w.release("b-part07", "before")
    assert wait_for(lambda: not os.listdir(w.qdir(B) / "pending"), WAIT)
    other.stop()
    report = recover(w, B, "--reconcile", "--grace", "0")
    again = jobs_of(report["requeued"]) + jobs_of(report["repaired"])
    assert 1 <= len(again) <= 3 and report["conflicts"] == [], report
    w.drain(B, "--concurrency", "3")
    by_tag = {}
    for name in batch["names"]:
        state, result = w.queue(B).only_result(name)
        assert state == "done", result
        by_tag[result["output"]["tag"]] = (name, result["output"]["value"])
    assert sorted(by_tag) == [f"b-part{n:02}" for n in range(50)]
    twice = {name for tag, (name, _) in by_tag.items() if len(w.notes("start", tag)) == 2}
    assert by_tag["b-part07"][0] in twice and twice <= set(again), (twice, again)
    assert all(len(w.notes("start", tag)) in (1, 2) for tag in by_tag)
    settled(w.queue(B))
    w.drain(C)
    (result,) = assert_once(w, C, ["c-collect"]).values()
    collected = result["output"]["collected"]
    assert collected["list_rc"] == collected["status_rc"] == 0, collected
    assert collected["status_done"] == 50, collected
    assert collected["parts"] == {name: value for name, value in by_tag.values()}


# ===================================================================== workers killed


@pytest.mark.parametrize("point", ["before", "after", "post"])
def test_a_worker_killed_at_each_point_of_a_job_reruns_it_and_publishes_the_follow_up_once(
    world: World, point: str
):
    """Q-5, I-1, W-1, docs/workers.md (SIGKILL): A's worker is SIGKILLed while its job's tool
    waits before publishing the follow-up, right after publishing it, or while a post-hook
    holds the ended call: the tool (or hook) dies with it; ``show`` calls the holder gone;
    a ``--drain`` worker leaves the dead claim alone; ``recover --dry-run`` predicts the
    requeue and changes nothing; ``recover`` requeues it; the run done again publishes the
    follow-up, or finds it pending (``EEXIST``) — B holds it once and runs it once."""
    w = world
    if point == "post":
        w.add_post_hook()
    tag = "a-k"
    w.hold(tag, point)
    w.queue(A).publish(chain("k", stages=2), name=tag)
    worker = w.start(A)
    pid = w.held(tag, point)
    worker.kill()
    wait_dead(pid)
    w.release(tag, point)

    shown = w.queue(A).run("show", tag, "--json").json()
    assert shown["state"] == "claimed" and shown["holder"]["state"] == "gone", shown
    assert shown["lease"]["pid"] == worker.proc.pid, shown
    expected_b = {} if point == "before" else {"b-k" + SUFFIX: ["pending"]}
    assert requests_by_state(w.qdir(B)) == expected_b
    assert w.drain(A)[-1]["done"] == 0
    assert len(w.notes("start", tag)) == 1
    before = snapshot(w.qdir(A))
    planned = recover(w, A, "--dry-run")
    assert jobs_of(planned["requeued"]) == [tag + SUFFIX], planned
    assert planned["requeued"][0]["applied"] is False, planned
    assert snapshot(w.qdir(A)) == before
    done = recover(w, A)
    assert jobs_of(done["requeued"]) == [tag + SUFFIX] and done["consistent"], done
    assert w.queue(A).state(tag + SUFFIX) == "pending"

    assert w.drain(A)[-1]["done"] == 1
    assert len(w.notes("start", tag)) == 2
    published_once(w, "b-k")
    if point != "before":
        assert w.publishes("b-k")[-1]["found"] == "pending"
    w.drain(B)
    (result,) = assert_once(w, A, [tag]).values()
    assert_once(w, B, ["b-k"])
    assert len(w.notes("start", "b-k")) == 1
    # T-7, S-2: both runs' calls are in the worker session, the result of the second alone.
    session = w.storage / "home" / str(w.user.uid) / "agent" / AGENT / "session" / "worker"
    events = read_jsonl(session / "events.jsonl")
    calls = [e["call"] for e in events if e["type"] == "tool_call" and e["job"] == tag + SUFFIX]
    assert calls == [r["call"] for r in w.notes("start", tag)], events
    ends = [e["call"] for e in events if e["type"] == "tool_result" and e["call"] in calls]
    assert ends == [result["call"]], events


def test_a_requeued_parent_is_claimed_next_by_a_worker_already_running(world: World):
    """Q-9, docs/queue.md (Scale: recover puts a job it moves back first in line): A's job
    ``a-0`` whose worker was killed is requeued while a second worker of A (one job at a
    time, started before) is busy with ``a-1``; ``list --state pending`` puts ``a-0`` ahead of
    the jobs published after it, and the running worker claims it next, before them; the
    follow-ups reach B in that order."""
    w = world
    w.hold("a-0", "before")
    w.hold("a-1", "before")
    w.queue(A).publish(chain("0", stages=2), name="a-0")
    first = w.start(A)
    pid = w.held("a-0", "before")
    for n in (1, 2, 3):
        w.queue(A).publish(chain(str(n), stages=2), name=f"a-{n}")
    second = w.start(A)
    w.held("a-1", "before")
    first.kill()
    wait_dead(pid)
    w.release("a-0", "before")
    assert jobs_of(recover(w, A)["requeued"]) == ["a-0" + SUFFIX]
    listed = w.queue(A).run("list", "--state", "pending")
    assert listed.lines() == [f"a-{n}{SUFFIX}" for n in (0, 2, 3)], listed
    w.release("a-1", "before")
    assert wait_for(lambda: len(finished(w.queue(A))) == 4, WAIT)
    claims = [e["job"] for e in second.stop() if e["event"] == "claim"]
    assert claims == [f"a-{n}{SUFFIX}" for n in (1, 0, 2, 3)], claims
    assert [p["asked"] for p in w.notes("publish")] == ["b-1", "b-0", "b-2", "b-3"]
    assert_once(w, A, [f"a-{n}" for n in range(4)])


@needs_strace
def test_a_worker_killed_as_finish_moves_the_result_leaves_its_job_for_plain_recover(
    world: World,
):
    """Q-4, Q-5: SIGKILLed as its finish moves the result into done/, the worker leaves the
    job claimed and leased with no result and its follow-up pending in B; plain ``recover``
    requeues it; the run done again finds the follow-up pending (``EEXIST``) and B runs it
    once; the result's temp file the killed finish left in ``inbox/`` is listed by ``status``
    and removed by ``recover --reconcile --grace 0``."""
    w = world
    w.queue(A).publish(chain("f", stages=2), name="a-f")
    w.killed_at(A, w.qdir(A) / "done", 1)
    assert w.queue(A).state("a-f" + SUFFIX) == "claimed"
    assert os.listdir(w.qdir(A) / "done") == []
    assert len(w.notes("end", "a-f")) == 1
    assert requests_by_state(w.qdir(B)) == {"b-f" + SUFFIX: ["pending"]}
    assert jobs_of(recover(w, A)["requeued"]) == ["a-f" + SUFFIX]
    w.drain(A)
    assert len(w.notes("start", "a-f")) == 2
    published_once(w, "b-f")
    w.drain(B)
    (stray,) = os.listdir(w.qdir(A) / "inbox")  # the killed finish's result temp
    assert stray.startswith(f"a-f{SUFFIX}.result.") and stray.endswith(".tmp"), stray
    assert [t["path"] for t in status(w, A)["temps"]] == [f"inbox/{stray}"]
    removed = recover(w, A, "--reconcile", "--grace", "0")["removed_temps"]
    assert removed == [f"inbox/{stray}"], removed
    assert_once(w, A, ["a-f"])
    assert_once(w, B, ["b-f"])


@needs_strace
@pytest.mark.parametrize("outcome", ["done", "failed"])
def test_a_worker_killed_as_finish_moves_the_request_is_rolled_forward_never_run_again(
    world: World, outcome: str
):
    """Q-4, Q-6, I-3, I-5: SIGKILLed after its finish put the result in ``done/`` (or
    ``failed/``) and before the request followed, the worker leaves an incomplete pair:
    ``status`` and ``show`` name it with its roll-forward; plain ``recover`` reports it,
    exits 1 and changes nothing; a ``--drain`` worker does not run it; a ``finish`` by hand
    with another output is refused ``EEXIST`` naming ``recover --reconcile``; ``--reconcile
    --dry-run`` plans the roll-forward and changes nothing; ``--reconcile`` completes it,
    and a second run changes nothing.  The job ran once, its result is the one its tool's run
    gave, and its follow-up is in B once.  The roll-forward of root's worker's finish is run
    by a member of the projects' group."""
    w = world
    if outcome == "failed":
        (w.trace / "fail-a-g").touch()
    w.queue(A).publish(chain("g", stages=2), name="a-g")
    job_name = "a-g" + SUFFIX
    w.killed_at(A, w.qdir(A) / outcome, 2)
    assert (w.qdir(A) / outcome / f"{job_name}.result").is_file()
    assert (w.qdir(A) / "claimed" / job_name / job_name).is_file()

    got = status(w, A)
    assert [e["job"] for e in got["incomplete"]] == [job_name], got
    assert "roll-forward" in json.dumps(got["incomplete"]), got
    shown = w.queue(A).run("show", "a-g", "--json").json()
    assert (shown["state"], shown["repair"]) == ("incomplete", "roll-forward"), shown
    before = snapshot(w.qdir(A))
    plain = recover(w, A, rc=1)
    assert jobs_of(plain["incomplete"]) == [job_name] and plain["requeued"] == [], plain
    assert w.drain(A)[-1]["done"] == 0
    flag = "--ok" if outcome == "done" else "--error"
    by_hand = w.queue(A).run("finish", "a-g", flag, "--json", "-", input='{"by": "hand"}')
    assert (by_hand.rc, by_hand.json()["error"]) == (1, "EEXIST"), by_hand
    assert "recover --reconcile" in by_hand.json()["message"], by_hand
    planned = recover(w, A, "--reconcile", "--dry-run", rc=1)
    assert jobs_of(planned["repaired"]) == [job_name], planned
    assert snapshot(w.qdir(A)) == before
    by_member = w.as_member("queue", "recover", "--project", A, "--reconcile", "--json")
    assert by_member.returncode == 0, by_member
    fixed = json.loads(by_member.stdout)
    assert jobs_of(fixed["repaired"]) == [job_name] and fixed["consistent"], fixed

    assert len(w.notes("start", "a-g")) == 1
    assert_once(w, A, ["a-g"], outcome)
    assert requests_by_state(w.qdir(B)) == {"b-g" + SUFFIX: ["pending"]}
    published_once(w, "b-g")


@needs_strace
def test_a_worker_killed_between_claim_and_lease_leaves_an_unrun_claim_reconcile_requeues(
    world: World,
):
    """Q-3, Q-6: SIGKILLed as the claim moves its lease into place, the worker leaves the
    request claimed without a lease and its tool never started; plain ``recover`` reports
    the pair (exit 1) and changes nothing; ``--reconcile`` (grace 0 for the lease's temp
    file) puts it back in pending; it then runs once and its follow-up is published once."""
    w = world
    w.queue(A).publish(chain("l", stages=2), name="a-l")
    job_name = "a-l" + SUFFIX
    w.killed_at(A, w.qdir(A) / "inbox", 1)
    assert (w.qdir(A) / "claimed" / job_name / job_name).is_file()
    assert not (w.qdir(A) / "lease" / job_name / "worker").exists()
    assert w.notes() == []
    got = status(w, A)
    assert [(e["job"], e["repair"]) for e in got["incomplete"]] == [(job_name, "requeue-unleased")]
    assert got["counts"]["claimed"] == 0, got
    shown = w.queue(A).run("show", "a-l", "--json").json()
    assert (shown["state"], shown["repair"]) == ("incomplete", "requeue-unleased"), shown
    before = snapshot(w.qdir(A))
    plain = recover(w, A, rc=1)
    assert jobs_of(plain["incomplete"]) == [job_name], plain
    assert snapshot(w.qdir(A)) == before
    fixed = recover(w, A, "--reconcile", "--grace", "0")
    assert jobs_of(fixed["repaired"]) == [job_name] and fixed["consistent"], fixed
    assert w.queue(A).state(job_name) == "pending"
    w.drain(A)
    w.drain(B)
    assert len(w.notes("start", "a-l")) == 1
    published_once(w, "b-l")
    assert_once(w, A, ["a-l"])
    assert_once(w, B, ["b-l"])


def test_a_middle_stage_killed_after_its_publish_never_reruns_the_first_stage(world: World):
    """I-3, Q-5, X-1, docs/queue.md (A queue shared by a group): B's worker (root's) is
    SIGKILLed while ``b-m`` waits after publishing ``c-m``, which C's worker then runs;
    ``recover`` of A and of C finds nothing to do and leaves the dead claim of B alone; B's
    recover, run by a member of the projects' group (not root), requeues it; run again, its
    publish finds ``c-m`` done (``EEXIST``): A's job ran once, B's twice, C's once."""
    w = world
    w.hold("b-m", "after")
    w.queue(A).publish(chain("m"), name="a-m")
    wa, wb, wc = w.start(A), w.start(B), w.start(C)
    pid = w.held("b-m", "after")
    assert wait_for(lambda: finished(w.queue(C)) == names("c-m"), WAIT)
    wb.kill()
    wait_dead(pid)
    w.release("b-m", "after")
    for other in (A, C):
        report = recover(w, other, "--reconcile")
        assert report["requeued"] == report["repaired"] == [] and report["consistent"], report
    assert w.queue(B).state("b-m" + SUFFIX) == "claimed"
    by_member = w.as_member("queue", "recover", "--project", B, "--json")
    assert by_member.returncode == 0, by_member
    assert jobs_of(json.loads(by_member.stdout)["requeued"]) == ["b-m" + SUFFIX]
    wb2 = w.start(B)
    assert wait_for(lambda: finished(w.queue(B)) == names("b-m"), WAIT)
    for worker in (wa, wb2, wc):
        worker.stop()
    assert w.publishes("c-m")[-1]["found"] == "done"
    published_once(w, "c-m")
    assert [len(w.notes("start", t)) for t in ("a-m", "b-m", "c-m")] == [1, 2, 1]
    for stage, tag in ((A, "a-m"), (B, "b-m"), (C, "c-m")):
        assert_once(w, stage, [tag])


def test_every_stage_killed_at_once_mid_flight_then_recovered_ends_each_job_once(world: World):
    """I-1, Q-5, W-3: six chains, workers of the three stages (four jobs at once each), jobs
    held in every stage before their publish, after it and in a post-hook; once every job the
    holds do not stop has finished, the three workers are SIGKILLed at once; each stage's
    ``recover`` requeues exactly its own held jobs; drained stage by stage, every job of
    every stage ends once in done/ and every follow-up was published once."""
    w = world
    w.add_post_hook()
    holds = [("a-t0", "before"), ("a-t1", "after"), ("b-t2", "before"), ("b-t3", "after"),
             ("b-t5", "post"), ("c-t4", "after")]  # fmt: skip
    for tag, point in holds:
        w.hold(tag, point)
    tags = [f"t{n}" for n in range(6)]
    for tag in tags:
        w.queue(A).publish(chain(tag), name=f"a-{tag}")
    workers = [w.start(s, "--concurrency", "4") for s in STAGES]
    pids = [w.held(tag, point) for tag, point in holds]
    # Every job the holds do not stop is finished before the kill: only the held are in flight.
    free = {A: names("a-t2", "a-t3", "a-t4", "a-t5"), B: names("b-t1", "b-t4"),
            C: names("c-t1", "c-t3", "c-t5")}  # fmt: skip
    for stage, ended in free.items():
        assert wait_for(lambda s=stage, e=ended: finished(w.queue(s)) == e, WAIT), stage
    for worker in workers:
        worker.proc.kill()
    for worker in workers:
        worker.proc.wait(timeout=WAIT)
        worker.gone()
    for pid in pids:
        wait_dead(pid)
    for tag, point in holds:
        w.release(tag, point)
    for stage, prefix in zip(STAGES, "abc", strict=True):
        held = sorted(t + SUFFIX for t, _ in holds if t.startswith(prefix))
        assert sorted(jobs_of(recover(w, stage)["requeued"])) == held, stage
    for stage in STAGES:
        w.drain(stage, "--concurrency", "3")
    for stage, prefix in zip(STAGES, "abc", strict=True):
        assert_once(w, stage, [f"{prefix}-{t}" for t in tags])
    for tag in tags:
        published_once(w, f"b-{tag}")
        published_once(w, f"c-{tag}")
    ends = [n["tag"] for n in w.notes("end")]  # b-t5's tool ended before its post-hook held
    assert len(ends) == 19 and ends.count("b-t5") == 2 and len(set(ends)) == 18, ends


@needs_strace
def test_a_worker_killed_while_its_follow_ups_publish_is_staged_blocks_the_name_until_reconcile(
    world: World,
):
    """Q-1, Q-6, docs/queue.md (publish step 2): A's worker is SIGKILLed while its tool's
    publish of ``b-s`` has written its staging file and not yet moved it: the whole call dies,
    the staging file stays.  B's ``status`` and ``show`` list it (no state); the requeued
    parent's publish is refused ``EEXIST`` saying it is being published and how
    ``recover --reconcile`` (with this ``--storage``) removes it, so that run fails rather than
    take the follow-up as there; once B's ``recover --reconcile --grace 0`` removed it, the
    parent republished under a new name publishes ``b-s`` once."""
    w = world
    (w.trace / "stall-b-s").touch()
    w.queue(A).publish(chain("s", stages=2), name="a-s")
    worker = w.start(A)
    staged = w.qdir(B) / "inbox" / f"b-s{SUFFIX}.publish.tmp"
    assert wait_for(staged.exists, WAIT)
    (w.trace / "stall-b-s").unlink()
    (run,) = w.notes("start", "a-s")
    worker.kill()
    wait_dead(run["pid"])
    publishers = [
        pid
        for pid in processes_of(w.storage)
        if b"publish" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert publishers == [], publishers
    assert staged.is_file() and os.listdir(w.qdir(B) / "pending") == []
    temps = status(w, B)["temps"]
    assert [t["path"] for t in temps] == [f"inbox/b-s{SUFFIX}.publish.tmp"], temps
    shown = w.queue(B).run("show", "b-s", "--json").json()
    assert shown["state"] == "none" and len(shown["temps"]) == 1, shown

    assert jobs_of(recover(w, A)["requeued"]) == ["a-s" + SUFFIX]
    w.drain(A)
    refused = w.publishes("b-s")[-1]
    assert (refused["rc"], refused["error"], refused["found"]) == (1, "EEXIST", "none"), refused
    assert "being published" in refused["message"], refused
    assert "recover --reconcile" in refused["message"], refused
    assert f"--storage {w.storage}" in refused["message"], refused
    assert w.queue(A).only_result("a-s" + SUFFIX)[0] == "failed"
    assert os.listdir(w.qdir(B) / "pending") == []

    removed = recover(w, B, "--reconcile", "--grace", "0")
    assert removed["removed_temps"] == [f"inbox/{staged.name}"], removed
    again = chain("s", stages=2)
    again["input"]["tag"] = "a-s2"
    w.queue(A).publish(again, name="a-s2")
    w.drain(A)
    w.drain(B)
    tries = [(t["tag"], t["rc"], t.get("found")) for t in w.publishes("b-s")]
    assert tries == [("a-s", 1, "none"), ("a-s2", 0, None)], tries
    assert_once(w, B, ["b-s"])
    assert w.queue(A).only_result("a-s2" + SUFFIX)[0] == "done"


@needs_strace
def test_a_worker_killed_as_finish_cleans_up_leaves_a_done_job_that_never_runs_again(
    world: World,
):
    """Q-4, Q-6, I-3: SIGKILLed as its finish removes ``lease/J`` (the terminal pair in place),
    the worker leaves the job done with an empty claim and lease directory: ``status`` and
    ``show`` call it incomplete with ``remove-orphans``; publishing it again is refused
    ``EEXIST``; a ``--drain`` worker does not run it; plain ``recover`` reports it (exit 1);
    ``--reconcile`` removes the leftovers.  The job ran once, its follow-up is in B once."""
    w = world
    w.queue(A).publish(chain("u", stages=2), name="a-u")
    job_name = "a-u" + SUFFIX
    w.killed_at(A, w.qdir(A) / "lease", 1, "unlinkat")
    assert (w.qdir(A) / "done" / job_name).is_file()
    assert (w.qdir(A) / "done" / f"{job_name}.result").is_file()
    leftovers = [sub for sub in ("claimed", "lease") if (w.qdir(A) / sub / job_name).is_dir()]
    assert leftovers == ["claimed", "lease"], leftovers
    got = status(w, A)
    assert [(e["job"], e["repair"]) for e in got["incomplete"]] == [(job_name, "remove-orphans")]
    shown = w.queue(A).run("show", "a-u", "--json").json()
    assert (shown["state"], shown["repair"]) == ("incomplete", "remove-orphans"), shown
    again = w.queue(A).run("publish", "--name", "a-u", "--json", "-", input=json.dumps(chain("u")))
    assert (again.rc, again.json()["error"]) == (1, "EEXIST") and job_name in again.out, again
    assert w.drain(A)[-1]["done"] == 0
    before = snapshot(w.qdir(A))
    assert jobs_of(recover(w, A, rc=1)["incomplete"]) == [job_name]
    assert snapshot(w.qdir(A)) == before
    assert jobs_of(recover(w, A, "--reconcile")["repaired"]) == [job_name]
    assert len(w.notes("start", "a-u")) == 1
    assert_once(w, A, ["a-u"])
    assert requests_by_state(w.qdir(B)) == {"b-u" + SUFFIX: ["pending"]}
    published_once(w, "b-u")


@needs_strace
def test_a_recover_killed_mid_requeue_is_completed_by_the_next_and_the_job_runs_once(
    world: World,
):
    """I-5, Q-6, docs/workers.md (``--drain``): A's worker is SIGKILLed before its job's
    publish; the host's ``recover`` is itself SIGKILLed as it removes the requeued job's lease
    directory: the job is pending with a leftover claim and lease, which ``status`` and
    ``list --state incomplete`` name as incomplete, not pending.  A ``--drain`` worker
    leaves it pending, exits 0 and names it (``left_pending``, a note naming the repair);
    plain ``recover`` reports it (exit 1); ``--reconcile`` removes the leftovers; the job then
    runs once more and its follow-up is published once."""
    w = world
    w.hold("a-v", "before")
    w.queue(A).publish(chain("v", stages=2), name="a-v")
    job_name = "a-v" + SUFFIX
    worker = w.start(A)
    pid = w.held("a-v", "before")
    worker.kill()
    wait_dead(pid)
    w.release("a-v", "before")
    argv = [*kill_on(w.qdir(A) / "lease", "unlinkat", 1), *CTX_ARGV, "queue", "recover", "-p", A]
    cut = subprocess.run(argv, env=w.env, capture_output=True, timeout=WAIT)
    assert cut.returncode == -signal.SIGKILL, cut
    assert (w.qdir(A) / "pending" / job_name).is_file()
    got = status(w, A)
    assert [(e["job"], e["repair"]) for e in got["incomplete"]] == [(job_name, "remove-orphans")]
    assert got["counts"]["pending"] == 0, got
    for state, listed in (("incomplete", [job_name]), ("pending", [])):
        shown = w.queue(A).run("list", "--state", state)
        assert (shown.rc, shown.lines()) == (0, listed), shown
    drained = w.start(A, "--drain")
    stop = drained.wait()[-1]
    assert stop["done"] == 0 and stop["left_pending"] == {job_name: "claimed"}, stop
    assert job_name in drained.said() and "recover --reconcile" in drained.said()
    assert jobs_of(recover(w, A, rc=1)["incomplete"]) == [job_name]
    assert jobs_of(recover(w, A, "--reconcile")["repaired"]) == [job_name]
    w.drain(A)
    assert len(w.notes("start", "a-v")) == 2
    published_once(w, "b-v")
    assert_once(w, A, ["a-v"])


def test_a_job_killed_twice_at_two_points_publishes_its_follow_up_once(world: World):
    """Q-5, I-1: the same job's worker is SIGKILLed twice — first before its publish, then,
    requeued, right after it — and requeued by ``recover`` each time; its third run finds the
    follow-up pending (``EEXIST``): A's job ran three times and ended once, B's once."""
    w = world
    w.queue(A).publish(chain("w2", stages=2), name="a-w2")
    for point in ("before", "after"):
        w.hold("a-w2", point)
        worker = w.start(A)
        pid = w.held("a-w2", point)
        worker.kill()
        wait_dead(pid)
        w.release("a-w2", point)
        (w.trace / f"at-a-w2-{point}").unlink()
        assert jobs_of(recover(w, A)["requeued"]) == ["a-w2" + SUFFIX]
    w.drain(A)
    w.drain(B)
    assert len(w.notes("start", "a-w2")) == 3
    assert [(p["rc"], p.get("found")) for p in w.publishes("b-w2")] == [(0, None), (1, "pending")]
    assert_once(w, A, ["a-w2"])
    assert_once(w, B, ["b-w2"])


def test_recover_run_on_every_stage_while_the_pipeline_runs_touches_no_live_job(world: World):
    """Q-5, Q-6, I-4: while waiting workers of the three stages run four chains, the host runs
    ``recover`` and ``recover --reconcile`` on every stage again and again: no run requeues,
    repairs or reports anything as incomplete or in conflict, each exits 0; every job of every
    stage runs once and ends once."""
    w = world
    tags = [f"q{n}" for n in range(4)]
    for tag in tags:
        w.queue(A).publish(chain(tag), name=f"a-{tag}")
    workers = [w.start(s, "--concurrency", "2") for s in STAGES]
    reports = []
    last = names(*(f"c-{t}" for t in tags))
    while finished(w.queue(C)) != last:
        stage = STAGES[len(reports) % 3]
        args = ("--reconcile",) if len(reports) % 2 else ()
        reports.append((stage, recover(w, stage, *args)))
        assert len(reports) < 300, "the pipeline did not end"
    for worker in workers:
        worker.stop()
    assert reports
    for stage, report in reports:
        bad = {k: report[k] for k in ("requeued", "repaired", "incomplete", "conflicts", "errors")}
        assert not any(bad.values()), (stage, report)
    for stage, prefix in zip(STAGES, "abc", strict=True):
        assert_once(w, stage, [f"{prefix}-{t}" for t in tags])
        for tag in tags:
            assert len(w.notes("start", f"{prefix}-{tag}")) == 1


def test_status_and_list_polled_while_the_pipeline_runs_never_show_a_move_as_incomplete(
    world: World,
):
    """§2.4, docs/queue.md (``status``, ``list`` and ``show`` read without locks; a job a
    transition is moving is reported where the transition takes it, never incomplete):
    ``status --json`` and ``list --json`` of every stage, polled again and again while four
    chains run through waiting workers, never report an incomplete pair or a conflict
    and always exit 0; each count stays within the jobs published to that stage."""
    w = world
    tags = [f"p{n}" for n in range(4)]
    for tag in tags:
        w.queue(A).publish(chain(tag), name=f"a-{tag}")
    workers = [w.start(s, "--concurrency", "2") for s in STAGES]
    polls = 0
    last = names(*(f"c-{t}" for t in tags))
    while finished(w.queue(C)) != last:
        stage = STAGES[polls % 3]
        got = status(w, stage)
        assert got["incomplete"] == got["conflicts"] == [], got
        assert sum(got["counts"][k] for k in ("pending", "claimed", "done")) <= 4, got
        listed = w.queue(stage).run("list", "--json")
        assert listed.rc == 0, listed
        assert {e["state"] for e in listed.json()} <= {"pending", "claimed", "done"}, listed
        polls += 1
        assert polls < 300, "the pipeline did not end"
    for worker in workers:
        worker.stop()
    assert polls
    for stage, prefix in zip(STAGES, "abc", strict=True):
        assert_once(w, stage, [f"{prefix}-{t}" for t in tags])


# ===================================================================== failures, republished


def test_a_timed_out_middle_job_fails_without_its_follow_up_and_a_new_name_completes(
    world: World,
):
    """W-4, Q-1, Q-6: ``b-t`` held past B's ``--timeout 2`` is killed (its whole process
    group) and finished in failed/ with ``ETIMEDOUT``, having published nothing; publishing it
    again under its name is refused ``EEXIST`` (failed) and leaves the failed pair as it was;
    republished as ``b-t.again`` it publishes ``c-t`` once, and C runs it once."""
    w = world
    w.hold("b-t", "before")
    w.queue(B).publish(job("b-t", (C, "c-t", job("c-t"))), name="b-t")
    events = w.start(B, "--drain", "--timeout", "2").wait()
    w.release("b-t", "before")
    for run in w.notes("start", "b-t"):
        wait_dead(run["pid"])
    assert (events[-1]["done"], events[-1]["failed"]) == (0, 1), events
    state, result = w.queue(B).only_result("b-t" + SUFFIX)
    assert state == "failed" and result["error"]["error"] == "ETIMEDOUT", result
    assert "ETIMEDOUT" in result["reason"], result
    assert w.publishes("c-t") == [] and os.listdir(w.qdir(C) / "pending") == []
    pair = snapshot(w.qdir(B) / "failed")
    again = w.queue(B).run("publish", "--name", "b-t", "--json", "-", input=json.dumps(job("b-t")))
    assert (again.rc, again.json()["error"]) == (1, "EEXIST") and "failed" in again.out, again
    assert snapshot(w.qdir(B) / "failed") == pair
    w.queue(B).publish(job("b-t", (C, "c-t", job("c-t"))), name="b-t.again")
    assert w.drain(B)[-1]["done"] == 1
    w.drain(C)
    assert snapshot(w.qdir(B) / "failed") == pair
    published_once(w, "c-t")
    assert_once(w, C, ["c-t"])
    assert requests_by_state(w.qdir(B)) == {
        "b-t" + SUFFIX: ["failed"],
        "b-t.again" + SUFFIX: ["done"],
    }


def test_a_post_hook_longer_than_the_job_timeout_does_not_fail_the_job(world: World):
    """W-4, T-6, docs/workers.md (``--timeout`` bounds the job with its pre-hooks) and
    docs/tools.md (post-hooks see a result already decided and keep their own ten seconds):
    under B's ``--timeout 1``, a post-hook held 2 s after ``b-h`` published ``c-h`` and ended
    leaves the job done with its tool's output; ``c-h`` is in C once."""
    w = world
    w.add_post_hook()
    w.hold("b-h", "post")
    w.queue(B).publish(job("b-h", (C, "c-h", job("c-h"))), name="b-h")
    worker = w.start(B, "--drain", "--timeout", "1")
    hook = w.held("b-h", "post")
    assert wait_for(lambda: not alive(hook), 2.0) is False
    w.release("b-h", "post")
    stop = worker.wait()[-1]
    assert (stop["done"], stop["failed"]) == (1, 0), stop
    (result,) = assert_once(w, B, ["b-h"]).values()
    assert result["output"]["published"][0]["rc"] == 0, result
    assert requests_by_state(w.qdir(C)) == {"c-h" + SUFFIX: ["pending"]}
    published_once(w, "c-h")


def test_a_job_that_failed_after_its_publish_is_republished_and_meets_its_follow_up(
    world: World,
):
    """W-1, Q-1: ``b-e`` publishes ``c-e`` and then fails (exit 3): failed/ holds it with
    ``exit_status`` 3 and the tool's last stderr line as reason; republished as ``b-e.2``
    (fixed), its publish of ``c-e`` is refused ``EEXIST`` (pending): C holds ``c-e`` once,
    runs it once, and the failed pair stays as it was."""
    w = world
    (w.trace / "fail-b-e").touch()
    w.queue(B).publish(job("b-e", (C, "c-e", job("c-e"))), name="b-e")
    w.drain(B)
    state, result = w.queue(B).only_result("b-e" + SUFFIX)
    assert state == "failed" and result["exit_status"] == 3, result
    assert result["reason"] == f"{TOOL} exited with status 3: relay.step: told to fail b-e [exit]"
    pair = snapshot(w.qdir(B) / "failed")
    (w.trace / "fail-b-e").unlink()
    w.queue(B).publish(job("b-e", (C, "c-e", job("c-e"))), name="b-e.2")
    w.drain(B)
    assert w.publishes("c-e")[-1]["found"] == "pending"
    published_once(w, "c-e")
    w.drain(C)
    assert_once(w, C, ["c-e"])
    assert snapshot(w.qdir(B) / "failed") == pair
    assert w.queue(B).only_result("b-e.2" + SUFFIX)[0] == "done"


def test_a_tool_killed_mid_job_fails_it_and_the_republished_job_publishes_once(world: World):
    """W-1: the tool of ``b-x`` SIGKILLed (not its worker) before it published: the job is
    finished in failed/ with the signal's exit status and no follow-up; the worker goes on;
    republished as ``b-x.2`` it publishes ``c-x`` once."""
    w = world
    w.hold("b-x", "before")
    w.queue(B).publish(job("b-x", (C, "c-x", job("c-x"))), name="b-x")
    worker = w.start(B)
    pid = w.held("b-x", "before")
    os.kill(pid, signal.SIGKILL)
    w.release("b-x", "before")
    assert wait_for(lambda: finished(w.queue(B)) == names("b-x"), WAIT)
    state, result = w.queue(B).only_result("b-x" + SUFFIX)
    assert state == "failed" and result["exit_status"] == 137, result
    assert w.publishes("c-x") == []
    w.queue(B).publish(job("b-x", (C, "c-x", job("c-x"))), name="b-x.2")
    assert wait_for(lambda: finished(w.queue(B)) == names("b-x", "b-x.2"), WAIT)
    stop = worker.stop()[-1]
    assert (stop["done"], stop["failed"]) == (1, 1), stop
    published_once(w, "c-x")
    w.drain(C)
    assert_once(w, C, ["c-x"])


# ===================================================================== stopping a stage


def test_sigterm_to_a_middle_stage_worker_lets_its_job_publish_and_finish(world: World):
    """W-4, docs/workers.md (Signals): B's worker, one job at a time, gets SIGTERM while
    ``b-1`` waits in its tool; it claims nothing more, lets ``b-1`` publish ``c-1`` and
    finish in done/, and exits 0 with ``stopped_by`` SIGTERM; ``b-2`` stays pending, untouched,
    until the next worker runs it once."""
    w = world
    w.hold("b-1", "before")
    w.queue(B).publish(job("b-1", (C, "c-1", job("c-1"))), name="b-1")
    worker = w.start(B)
    w.held("b-1", "before")
    w.queue(B).publish(job("b-2", (C, "c-2", job("c-2"))), name="b-2")
    worker.proc.send_signal(signal.SIGTERM)
    w.release("b-1", "before")
    assert worker.proc.wait(timeout=WAIT) == 0, worker.said()
    stop = worker.events()[-1]
    assert (stop["event"], stop["stopped_by"], stop["done"]) == ("stop", "SIGTERM", 1), stop
    assert w.queue(B).state("b-1" + SUFFIX) == "done"
    assert w.queue(B).state("b-2" + SUFFIX) == "pending"
    assert w.notes("start", "b-2") == []
    assert requests_by_state(w.qdir(C)) == {"c-1" + SUFFIX: ["pending"]}
    w.drain(B)
    w.drain(C)
    assert_once(w, B, ["b-1", "b-2"])
    assert_once(w, C, ["c-1", "c-2"])
    published_once(w, "c-1")
    published_once(w, "c-2")
