"""Several shared spaces on one storage root, used at the same time (SPEC §9 X-1, §2 Q-1…Q-6,
§2.4, §3 W-1…W-3, §4 S-1/S-2/S-6, §5 P-3/P-5, §6 T-4/T-8): ``ctx shared create ml --group GA``
and ``ctx shared create ml2 --group GB`` (and ``a`` beside ``a.b``: names that are prefixes of
one another), each with its own queue, its own ``proj.echo`` installed into ``--tier
shared:<space>``, agents of each, and real ``ctx queue work`` processes running side by side.

What is checked: a worker of one project never claims, runs or finishes another's job, even
one of the same name; ``ctx queue status/list/show/recover --project P`` never reports or
changes anything of another project, also while that project's worker is mid-job; an agent
granted ``shared:ml`` but not ``shared:ml2`` — though its uid's groups would let it in — can
neither read, list, write nor run tools of ml2, through ``ctx run`` (both modes, and
``--project``) and through the fs.* tools given ml2's paths; a user of GA alone is refused
ml2 by the kernel; sessions recorded in one space stay there; and a project whose directory
is deleted while the others run leaves them working.  Real uids and groups
(tests/support/users.py), real processes, real directories."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    SUFFIX,
    OnStorage,
    QueueCLI,
    Run,
    read_jsonl,
    scratch_top,
    snapshot,
    tool_manifest,
    wait_for,
)
from tests.support.storage import copy_of_root
from tests.support.users import UnprivilegedUser, access_as, members_of, run_as

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs agents and users as other uids")

SCRATCH = scratch_top(__file__)
USER_A, GROUP_A = "ctxmp-ua", "ctxmp-ga"
USER_B, GROUP_B = "ctxmp-ub", "ctxmp-gb"
ML, ML2 = "ml", "ml2"
TOOL, SLOW, ONLY = "proj.echo", "proj.slow", "ml2.only"
FS_TOOLS = ("fs.read", "fs.write", "fs.list", "fs.stat")
WAIT = 20.0
# Long enough for a waiting worker to look at pending/ again (its wait is bounded by 2 s).
NOTICE = 5.0


def echo_program(space: str) -> str:
    """``proj.echo`` of ``space``: names its space and its uid, then echoes its input."""
    return f'#!/bin/sh\necho "{space}-echo $(id -u)"\ncat\n'


def slow_program(trace: Path) -> str:
    """A tool that says it started, then waits for ``go-<its input's tag>`` in ``trace``."""
    return (
        "#!/bin/sh\n"
        'tag=$(cat | sed -n \'s/.*"tag": *"\\([a-z0-9-]*\\)".*/\\1/p\')\n'
        f'touch "{trace}/started-$tag"\n'
        f'while [ ! -e "{trace}/go-$tag" ]; do sleep 0.02; done\n'
        'echo "slow $tag $(id -u)"\n'
    )


@pytest.fixture(scope="module")
def people() -> tuple[UnprivilegedUser, int, UnprivilegedUser, int]:
    """User A in group GA only, user B in group GB only."""
    (user_a,), gid_a = members_of(GROUP_A, USER_A)
    (user_b,), gid_b = members_of(GROUP_B, USER_B)
    if gid_b in user_a.groups or gid_a in user_b.groups:
        pytest.skip("the two test users share a project group")
    return user_a, gid_a, user_b, gid_b


@dataclass
class World(OnStorage):
    """A copy of the bootstrapped root holding spaces ``ml`` (group GA) and ``ml2`` (group GB),
    each with its own ``proj.echo`` and ``proj.slow``, ``ml2`` also with ``ml2.only``."""

    top: Path
    user_a: UnprivilegedUser
    gid_a: int
    user_b: UnprivilegedUser
    gid_b: int
    workers: list[subprocess.Popen] = field(default_factory=list)

    @property
    def storage(self) -> Path:
        return self.top / "storage"

    @property
    def trace(self) -> Path:
        return self.top / "trace"

    def space(self, name: str) -> Path:
        return self.storage / "shared" / name

    def queue(self, name: str) -> QueueCLI:
        return QueueCLI(self.storage, name)

    def make_space(self, name: str, gid: int, *tools: tuple[str, str]) -> None:
        made = self.ctx("shared", "create", name, "--group", str(gid))
        assert made.rc == 0, made
        for tool, program in tools:
            manifest = tool_manifest(self.top / "src" / name, tool, program)
            installed = self.ctx("object", "install", manifest, "--tier", f"shared:{name}")
            assert installed.rc == 0, installed

    def agent(
        self,
        name: str,
        user: UnprivilegedUser,
        groups: list[int],
        grants: dict[str, list[str]],
        tools: tuple[str, ...] = (TOOL, SLOW, ONLY, *FS_TOOLS),
        mounts: list | None = None,
    ) -> None:
        """``ctx agent create`` of ``name``, then ``allow`` in the policy of each of ``tools``
        wherever it is installed (the tool layer of P-6)."""
        req = {"name": name, "label": f"{name}_t", "tools": list(tools), "shared": grants}
        if mounts:
            req["mount"] = mounts
        groups_arg = ",".join(map(str, groups))
        made = self.ctx("agent", "create", "--user", str(user.uid), "--groups", groups_arg,
                        "-", input=json.dumps(req))  # fmt: skip
        assert made.rc == 0, made
        tiers = [self.storage / "tool"]
        tiers += [p / "tool" for p in (self.storage / "shared").iterdir() if p.name != "proj"]
        for tool in tools:
            for tier in tiers:
                policy = tier / f"{tool}.d" / "policy"
                if policy.is_file():
                    with policy.open("a") as f:
                        f.write(f"allow {name}_t tool:{tool} execute\n")

    def native(self, agent: str, tool: str, value: dict, *args: str) -> tuple[Run, dict]:
        r = self.ctx("run", "--agent", agent, "--native", *args, tool, input=json.dumps(value),
                     timeout=WAIT)  # fmt: skip
        frames = [json.loads(line) for line in r.lines()]
        assert frames and frames[-1]["type"] == "result", r
        assert "Traceback" not in r.err, r
        return r, frames[-1]

    def ctx_path(self, agent: str) -> list[str]:
        shown = self.ctx("agent", "show", agent, "--json")
        assert shown.rc == 0, shown
        return shown.json()["ctx_path"].split(":")

    def human(self, user: UnprivilegedUser, groups: list[int], *args: str, stdin: str = ""):
        """``ctx ARGS`` as ``user`` with exactly ``groups``."""
        home = self.top / f"home-{user.name}"
        home.mkdir(exist_ok=True)
        os.chown(home, user.uid, user.gid)
        env = {k: v for k, v in self.env.items() if not k.startswith("XDG_")}
        env.update(HOME=str(home), USER=user.name)
        return run_as(user, [*CTX_ARGV, *args], groups, env=env, cwd=home, stdin=stdin)

    def start_worker(self, project: str, agent: str, *args: str) -> subprocess.Popen:
        """``ctx queue work --json`` of ``project`` as ``agent``, in a session of its own."""
        argv = [*CTX_ARGV, "queue", "work", "--project", project, "--agent", agent, "--json",
                *args]  # fmt: skip
        proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)  # fmt: skip
        self.workers.append(proc)
        return proc

    def stop_worker(self, proc: subprocess.Popen) -> tuple[list[dict], str]:
        """SIGTERM (W-4: it exits 0); its JSON events and its stderr."""
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=WAIT)
        assert proc.returncode == 0, (out, err)
        assert "Traceback" not in err, err
        return [json.loads(line) for line in out.splitlines() if line.strip()], err

    def dead_claim(self, project: str, name: str) -> str:
        """``NAME`` published in ``project`` and claimed for a process that has since exited:
        the claim recover must give back (Q-5)."""
        queue = self.queue(project)
        job = queue.publish({"tool": TOOL, "input": {"dead": project}}, name=name)
        holder = subprocess.Popen(["sleep", "300"])
        try:
            claimed = queue.run("claim", "--pid", str(holder.pid), "--worker", f"gone-{project}")
            assert (claimed.rc, claimed.out) == (0, f"{job}\n"), claimed
        finally:
            holder.kill()
            holder.wait()
        assert queue.state(job) == "claimed"
        return job


@pytest.fixture
def world(_template: Path, people) -> Iterator[World]:
    user_a, gid_a, user_b, gid_b = people
    SCRATCH.mkdir(exist_ok=True)
    SCRATCH.chmod(0o755)
    top = Path(tempfile.mkdtemp(prefix="w-", dir=SCRATCH))
    top.chmod(0o755)
    w = World(top, user_a, gid_a, user_b, gid_b)
    try:
        copy_of_root(_template, w.storage)
        w.trace.mkdir()
        w.trace.chmod(0o1777)
        slow = slow_program(w.trace)
        w.make_space(ML, gid_a, (TOOL, echo_program(ML)), (SLOW, slow))
        w.make_space(ML2, gid_b, (TOOL, echo_program(ML2)), (SLOW, slow),
                     (ONLY, '#!/bin/sh\necho "only ml2 $(id -u)"\n'))  # fmt: skip
        for space, gid in ((ML, gid_a), (ML2, gid_b)):
            data = w.space(space) / "data" / "plan.txt"
            data.write_text(f"the plan of {space}\n")
            os.chown(data, 0, gid)
            data.chmod(0o660)
        yield w
    finally:
        for proc in w.workers:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
        with contextlib.suppress(OSError):
            for name in os.listdir(w.trace):
                if name.startswith("started-"):  # let any tool still waiting end
                    (w.trace / name.replace("started-", "go-", 1)).touch()
        shutil.rmtree(top, ignore_errors=True)


def results(queue: QueueCLI) -> dict[str, tuple[str, dict]]:
    """Every finished job of ``queue``: its state and its result."""
    found = {}
    for state in ("done", "failed"):
        for name in os.listdir(queue.dir / state):
            if name.endswith(SUFFIX):
                found[name] = (state, queue.only_result(name)[1])
    return found


def finished(queue: QueueCLI) -> set[str]:
    """The jobs of ``queue`` whose finish has ended: request and result in their terminal
    state and nothing of the job left elsewhere.  One whose finish is under way (its request
    moved, ``claimed/J`` not yet removed: docs/queue.md) is not one yet."""
    ended = set()
    for state in ("done", "failed"):
        for name in os.listdir(queue.dir / state):
            leftover = any((queue.dir / s / name).exists() for s in ("pending", "claimed", "lease"))
            if name.endswith(SUFFIX) and not leftover:
                ended.add(name)
    return ended


def job(tag: str, tool: str = TOOL) -> dict:
    return {"tool": tool, "input": {"tag": tag}}


# ===================================================================== workers side by side


def test_each_projects_worker_takes_only_its_own_jobs_even_those_named_alike(world: World):
    """Q-2, W-1, W-3, X-1: a waiting worker of ml (agent alpha, GA) and one of ml2 (agent beta,
    GB) run at once while jobs of the same names are published into both queues; each job is
    finished in its own queue, by its own project's worker (the lease's pid), with its own
    space's ``proj.echo`` run under its own agent's uid; neither worker's claims name a job
    of the other's input; both queues end settled."""
    w = world
    w.agent("alpha", w.user_a, [w.gid_a], {ML: ["read", "write"]})
    w.agent("beta", w.user_b, [w.gid_b], {ML2: ["read", "write"]})
    ml, ml2 = w.queue(ML), w.queue(ML2)
    worker_ml = w.start_worker(ML, "alpha", "--concurrency", "2")
    worker_ml2 = w.start_worker(ML2, "beta", "--concurrency", "2")
    names = [f"job-{n}" for n in range(6)]
    for name in names:
        ml.publish(job(f"{ML}-{name}"), name=name)
        ml2.publish(job(f"{ML2}-{name}"), name=name)
    jobs = {name + SUFFIX for name in names}
    for queue in (ml, ml2):
        assert wait_for(lambda q=queue: finished(q) == jobs, WAIT), finished(queue)
    events_ml, _ = w.stop_worker(worker_ml)
    events_ml2, _ = w.stop_worker(worker_ml2)

    for queue, proc, uid, agent in ((ml, worker_ml, w.user_a.uid, "alpha"),
                                    (ml2, worker_ml2, w.user_b.uid, "beta")):  # fmt: skip
        for name, (state, result) in results(queue).items():
            tag = f"{queue.project}-{name.removesuffix(SUFFIX)}"
            assert state == "done", (queue.project, name, result)
            assert result["agent"] == agent and result["worker"]["pid"] == proc.pid, result
            assert result["output"] == f'{queue.project}-echo {uid}\n{{"tag": "{tag}"}}\n'
            request = json.loads((queue.dir / "done" / name).read_text())
            assert request["input"] == {"tag": tag}, request
        queue.assert_settled()
    for events, project in ((events_ml, ML), (events_ml2, ML2)):
        claimed = sorted(e["job"] for e in events if e["event"] == "claim")
        assert claimed == sorted(jobs), (project, events)
        stop = events[-1]
        assert stop["event"] == "stop" and stop["done"] == len(jobs), stop


def test_a_drained_worker_of_a_prefix_named_project_leaves_the_longer_names_jobs_alone(
    world: World,
):
    """R-3, X-1, Q-2, §2.4: spaces ``a`` and ``a.b`` (and ``ml`` and ``ml2``) hold jobs of
    the same names; ``ctx queue work --project a --drain`` (and ``--project ml``) finishes
    exactly its own and exits 0 with nothing left pending; the other space's queue is byte for
    byte as it was, and ``status --project a.b`` still counts all its jobs pending."""
    w = world
    w.make_space("a", w.gid_a, (TOOL, echo_program("a")))
    w.make_space("a.b", w.gid_b, (TOOL, echo_program("a.b")))
    w.agent("pa", w.user_a, [w.gid_a], {"a": ["read", "write"]}, tools=(TOOL,))
    w.agent("pml", w.user_a, [w.gid_a], {ML: ["read", "write"]}, tools=(TOOL,))
    for short, long, agent in (("a", "a.b", "pa"), (ML, ML2, "pml")):
        for space in (short, long):
            for n in range(3):
                w.queue(space).publish(job(f"{space}-{n}"), name=f"j{n}")
        before = snapshot(w.queue(long).dir)
        r = w.ctx("queue", "work", "--project", short, "--agent", agent, "--drain", "--json",
                  timeout=WAIT)  # fmt: skip
        assert r.rc == 0, r
        stop = [json.loads(line) for line in r.lines()][-1]
        assert (stop["event"], stop["done"], stop["left_pending"]) == ("stop", 3, {}), stop
        finished = results(w.queue(short))
        assert {name: state for name, (state, _) in finished.items()} == {
            f"j{n}{SUFFIX}": "done" for n in range(3)
        }, finished
        for _, result in finished.values():
            assert result["output"].startswith(f"{short}-echo {w.user_a.uid}\n"), result
        assert snapshot(w.queue(long).dir) == before, long
        status = w.ctx("queue", "status", "--project", long, "--json")
        assert status.rc == 0, status
        counts = status.json()["counts"]
        assert (counts["pending"], counts["claimed"], counts["done"]) == (3, 0, 0), status


# ===================================================================== the queue CLI per project


def test_status_list_show_and_recover_of_one_project_never_report_or_touch_another(world: World):
    """§2.4, Q-5, Q-6, Q-8, I-5: ml2 holds a claim of a gone holder, a claim without its lease,
    a conflict (pending and done at once), an ignored dot-file and an old temp file; ml holds
    a gone holder's claim of the same name and pending jobs.  ``status``, ``list``, ``show`` and
    ``recover [--reconcile]`` with ``--project ml`` report ml's jobs only, and requeue ml's
    claim, leaving ml2 byte for byte; ``show --project ml`` of a job only ml2 has is ENOENT;
    then ``--project ml2`` reports ml2's trouble (exit 1) and names nothing of ml."""
    w = world
    ml, ml2 = w.queue(ML), w.queue(ML2)
    stuck = w.dead_claim(ML2, "stuck")
    (ml2.dir / "claimed" / "nolease.req.json").mkdir()
    (ml2.dir / "claimed" / "nolease.req.json" / "nolease.req.json").write_text(
        json.dumps(job("nolease"))
    )
    both = ml2.drop("both")
    ml2.terminal("both")
    (ml2.dir / "pending" / ".hidden.req.json").write_text("{}")
    temp = ml2.dir / "inbox" / "tmp-old"
    temp.write_text("partial")
    old = 10**6
    os.utime(temp, (os.path.getmtime(temp) - old, os.path.getmtime(temp) - old))
    only_ml2 = ml2.publish(job("only"), name="only-in-ml2")

    mine = w.dead_claim(ML, "stuck")
    pending = [ml.publish(job(f"ml-{n}"), name=f"p{n}") for n in range(2)]
    before_ml2 = snapshot(ml2.dir)

    status = ml.run("status", "--json")
    assert status.rc == 0, status
    seen = status.json()
    assert seen["counts"]["pending"] == 2 and seen["counts"]["claimed"] == 1, seen
    for key in ("ignored", "incomplete", "conflicts", "temps"):
        assert seen[key] == [], (key, seen)
    listed = ml.run("list", "--json")
    assert listed.rc == 0, listed
    assert ML2 not in listed.out and "only-in-ml2" not in listed.out, listed
    assert sorted(e["name"] for e in listed.json()) == sorted([mine, *pending]), listed
    shown = ml.run("show", only_ml2, "--json")
    assert shown.rc == 1 and "ENOENT" in shown.err and "Traceback" not in shown.err, shown

    for args in (("--dry-run",), (), ("--reconcile",)):
        r = ml.run("recover", "--json", *args, "--grace", "1")
        assert r.rc == 0 and r.json()["consistent"] is True, r
        assert ML2 not in r.out and "nolease" not in r.out and "both" not in r.out, r
    assert ml.state(mine) == "pending"
    assert snapshot(ml2.dir) == before_ml2

    r = ml2.run("recover", "--json")
    assert r.rc == 1 and r.json()["consistent"] is False, r
    assert "nolease" in r.out and both in r.out and stuck in r.out, r
    for name in pending:
        assert name not in r.out, r
    assert ml.state(mine) == "pending"
    assert sorted(ml.entries("pending")) == sorted([mine, *pending])


def test_recover_of_one_project_while_anothers_worker_is_mid_job(world: World):
    """Q-5, I-4, W-1, W-3: beta's worker of ml2 is running job ``build`` (its tool waits);
    ml holds a claim named ``build`` too, of a holder that is gone.  ``recover --reconcile
    --project ml`` requeues ml's claim only; ``recover --project ml2`` (both forms) leaves the
    live worker's claim and lease as they are; a drained worker of ml runs ml's ``build`` to
    done meanwhile; then ml2's tool is let go and its job is finished once, by beta's worker,
    with ml2's program."""
    w = world
    w.agent("alpha", w.user_a, [w.gid_a], {ML: ["read", "write"]})
    w.agent("beta", w.user_b, [w.gid_b], {ML2: ["read", "write"]})
    ml, ml2 = w.queue(ML), w.queue(ML2)
    running = ml2.publish(job("b-build", SLOW), name="build")
    worker = w.start_worker(ML2, "beta")
    assert wait_for(lambda: (w.trace / "started-b-build").exists(), WAIT), ml2.state(running)
    lease = ml2.lease(running)
    assert lease["pid"] == worker.pid, lease

    mine = w.dead_claim(ML, "build")
    before_ml2 = snapshot(ml2.dir)
    r = ml.run("recover", "--reconcile", "--json")
    assert r.rc == 0 and [e["job"] for e in r.json()["requeued"]] == [mine], r
    assert ml.state(mine) == "pending"
    for args in ((), ("--reconcile",)):
        r = ml2.run("recover", "--json", *args)
        assert r.rc == 0 and r.json()["requeued"] == [] and r.json()["repaired"] == [], r
    assert snapshot(ml2.dir) == before_ml2
    drained = w.ctx("queue", "work", "--project", ML, "--agent", "alpha", "--drain",
                    timeout=WAIT)  # fmt: skip
    assert drained.rc == 0, drained
    state, result = ml.only_result(mine)
    assert state == "done" and result["output"].startswith(f"ml-echo {w.user_a.uid}\n"), result
    assert ml2.state(running) == "claimed" and ml2.lease(running) == lease

    (w.trace / "go-b-build").touch()
    assert wait_for(lambda: ml2.state(running) == "done", WAIT), ml2.state(running)
    events, _ = w.stop_worker(worker)
    assert [e["job"] for e in events if e["event"] == "claim"] == [running], events
    state, result = ml2.only_result(running)
    assert result["output"] == f"slow b-build {w.user_b.uid}\n", result
    assert result["worker"]["pid"] == worker.pid
    ml.assert_settled()
    ml2.assert_settled()


# ===================================================================== agents and grants


def test_an_agent_granted_one_project_cannot_reach_another_through_any_tool_call(world: World):
    """X-1, P-3, P-5, S-6, T-4: gamma runs as user A with groups GA *and* GB (the kernel would
    let it into both) but holds only ``shared:ml read write``.  ml's data and tool work for
    it; for ml2 every fs.* call on its paths is EACCES and nothing is written; ``ml2.only``
    (installed only in ml2) is not on its CTX_PATH: 127 in terminal mode, ENOENT native;
    ``proj.echo`` runs ml's program, never ml2's; ``ctx run --project ml2`` is refused (126)
    and makes nothing under ``shared/ml2/agent``; ``ctx policy explain`` denies shared:ml2;
    ml2's tree is byte for byte as it was."""
    w = world
    w.agent("gamma", w.user_a, [w.gid_a, w.gid_b], {ML: ["read", "write"]})
    other = w.space(ML2)
    assert access_as(w.user_a, [(str(other / "data" / "plan.txt"), "rw")],
                     [w.gid_a, w.gid_b]) == [True]  # fmt: skip
    before = snapshot(other)

    r, frame = w.native("gamma", "fs.read", {"path": f"/ctx/shared/{ML}/data/plan.txt"})
    assert r.rc == 0 and frame["output"]["content"] == f"the plan of {ML}\n", frame
    r, frame = w.native("gamma", "fs.list", {"path": "/ctx/shared"})
    assert r.rc == 0, r
    assert ML in {e["name"] for e in frame["output"]["entries"]}
    assert ML2 not in {e["name"] for e in frame["output"]["entries"]}, frame

    base = f"/ctx/shared/{ML2}"
    for tool, value in (
        ("fs.read", {"path": f"{base}/data/plan.txt"}),
        ("fs.stat", {"path": f"{base}/data/plan.txt"}),
        ("fs.list", {"path": base}),
        ("fs.list", {"path": f"{base}/tool"}),
        ("fs.list", {"path": f"{base}/queue/pending"}),
        ("fs.write", {"path": f"{base}/data/planted", "content": "x"}),
        ("fs.write", {"path": f"{base}/queue/pending/planted.req.json", "content": "{}"}),
        ("fs.read", {"path": f"{w.storage}/shared/{ML2}/data/plan.txt"}),
    ):
        r, frame = w.native("gamma", tool, value)
        assert r.rc == 1 and frame["status"] == "error", (tool, value, frame)
        assert frame["error"]["error"] == "EACCES", (tool, value, frame)

    path = w.ctx_path("gamma")
    assert f"/ctx/shared/{ML}/tool" in path and f"/ctx/shared/{ML2}/tool" not in path, path
    r = w.ctx("run", "--agent", "gamma", ONLY, timeout=WAIT)
    assert r.rc == 127 and "ENOENT" in r.err, r
    r, frame = w.native("gamma", ONLY, {})
    assert frame["error"]["error"] == "ENOENT", frame
    r, frame = w.native("gamma", TOOL, {"n": 1})
    assert frame["output"] == f'{ML}-echo {w.user_a.uid}\n{{"n": 1}}\n', frame
    for mode in ((), ("--native",)):
        r = w.ctx("run", "--agent", "gamma", *mode, "--project", ML2, TOOL, input="{}",
                  timeout=WAIT)  # fmt: skip
        assert r.rc == (1 if mode else 126), r
        assert "EACCES" in r.out + r.err, r
    explained = w.ctx("policy", "explain", "gamma", f"shared:{ML2}", "read", "--json")
    assert explained.rc == 1 and explained.json()["allowed"] is False, explained
    assert snapshot(other) == before
    assert os.listdir(other / "agent") == []


def test_a_mount_target_that_is_a_prefix_of_another_path_opens_nothing_beyond_it(world: World):
    """X-1, P-5 step 3, R-3: agent pa holds ``shared:a`` and a mount of ``host/m`` at
    ``/mnt/m``; ``a.b`` (a space whose name starts with ``a``) and ``/mnt/m2`` (a path that
    starts with the mount's target) are out of its view: EACCES for each, while ``a`` and
    ``/mnt/m`` work; ``shared:a.b`` is denied by ``ctx policy query`` of its policy."""
    w = world
    w.make_space("a", w.gid_a, (TOOL, echo_program("a")))
    w.make_space("a.b", w.gid_b, (TOOL, echo_program("a.b")))
    host = w.top / "host"
    for sub in ("m", "m2"):
        (host / sub).mkdir(parents=True)
        (host / sub / "f").write_text(f"{sub}\n")
    os.symlink(host / "m2", host / "m" / "to-m2")
    for p in (host, host / "m", host / "m2"):
        p.chmod(0o755)
    (w.space("a.b") / "data" / "x").write_text("a.b data\n")
    (w.space("a") / "data" / "x").write_text("a data\n")
    w.agent("pa", w.user_a, [w.gid_a, w.gid_b], {"a": ["read", "write"]},
            tools=(TOOL, *FS_TOOLS), mounts=[[str(host / "m"), "/mnt/m", "ro"]])  # fmt: skip

    for value, want in (({"path": "/ctx/shared/a/data/x"}, "a data\n"),
                        ({"path": "/mnt/m/f"}, "m\n")):  # fmt: skip
        r, frame = w.native("pa", "fs.read", value)
        assert r.rc == 0 and frame["output"]["content"] == want, frame
    for value in ({"path": "/ctx/shared/a.b/data/x"}, {"path": "/mnt/m2/f"},
                  {"path": "/mnt/m/to-m2/f"}, {"path": str(host / "m2" / "f")}):  # fmt: skip
        r, frame = w.native("pa", "fs.read", value)
        assert r.rc == 1 and frame["error"]["error"] in ("EACCES", "ELOOP"), (value, frame)
        assert "a.b data" not in r.out and "m2\n" not in json.dumps(frame["output"]), frame
    r, frame = w.native("pa", "fs.write", {"path": "/ctx/shared/a.b/data/y", "content": "z"})
    assert frame["error"]["error"] == "EACCES", frame
    assert sorted(os.listdir(w.space("a.b") / "data")) == ["x"]
    path = w.ctx_path("pa")
    assert "/ctx/shared/a/tool" in path and "/ctx/shared/a.b/tool" not in path, path
    r, frame = w.native("pa", TOOL, {})
    assert frame["output"].startswith(f"a-echo {w.user_a.uid}\n"), frame
    policy = w.storage / "agent" / "pa.d" / "policy"
    for obj, want in (("shared:a", 0), ("shared:a.b", 1)):
        q = w.ctx("policy", "query", "--policy", policy, "pa_t", obj, "read")
        assert q.rc == want, (obj, q)
    listed = w.ctx("object", "list", "--tier", "shared:a", "--json")
    assert listed.rc == 0 and [o["path"] for o in listed.json()] == [
        str(w.space("a") / "tool" / TOOL)
    ], listed


# ===================================================================== humans and the kernel


def test_a_user_of_one_projects_group_works_there_and_the_kernel_refuses_the_other(
    world: World,
):
    """X-1, P-5 step 2, §2.4: user A (group GA only) publishes, lists and reads status in ml;
    the same commands for ml2 are EACCES (exit 1, nothing on stdout, no traceback, ml2
    unchanged), and the kernel itself refuses A to read, enter or write ml2's directories;
    user B, the other way round."""
    w = world
    for user, gid, mine, theirs in ((w.user_a, w.gid_a, ML, ML2),
                                    (w.user_b, w.gid_b, ML2, ML)):  # fmt: skip
        before = snapshot(w.space(theirs))
        for project, ok in ((mine, True), (theirs, False)):
            for verb, args, stdin in (
                ("publish", ["--name", f"by-{user.name}", "-"], json.dumps(job(user.name))),
                ("status", ["--json"], ""),
                ("list", ["--json"], ""),
            ):
                done = w.human(user, [gid], "queue", verb, "--project", project, *args,
                               stdin=stdin)  # fmt: skip
                assert "Traceback" not in done.stderr, done
                if ok:
                    assert done.returncode == 0, (verb, project, done)
                else:
                    assert done.returncode == 1, (verb, project, done)
                    if "--json" in args:  # the error object on stdout
                        assert json.loads(done.stdout)["error"] == "EACCES", done
                    else:
                        assert done.stdout == "", done
                        assert done.stderr.startswith("ctx: EACCES: "), (verb, project, done)
                    assert f"group {w.gid_b if gid == w.gid_a else w.gid_a}" in (
                        done.stdout + done.stderr
                    ), done
        assert snapshot(w.space(theirs)) == before
        assert w.queue(mine).state(f"by-{user.name}{SUFFIX}") == "pending"
        other = w.space(theirs)
        questions = [(str(other), "r"), (str(other), "x"), (str(other / "queue" / "pending"), "w"),
                     (str(other / "data" / "plan.txt"), "r")]  # fmt: skip
        assert access_as(user, questions, [gid]) == [False] * len(questions)


# ===================================================================== sessions


def test_sessions_recorded_in_one_space_stay_in_that_space(world: World):
    """S-1, S-2, S-6, X-1, T-7: agent ``both`` (granted both spaces) records session ``s1`` in
    ml and in ml2, gamma (ml only) in ml; each ``events.jsonl`` holds its own space's calls
    only, belongs to that space's group; ``ctx session show/list --project P`` reads that
    space's only; gamma has no session in ml2 (list empty, show ENOENT); the tool's log names
    each call's ``session_dir`` in its space.  With both spaces on its CTX_PATH, ``both`` finds
    ml's ``proj.echo`` first (T-4, name order) even in ml2's session, and the event's
    ``object`` says so."""
    w = world
    grants = {ML: ["read", "write"], ML2: ["read", "write"]}
    w.agent("both", w.user_a, [w.gid_a, w.gid_b], grants)
    w.agent("gamma", w.user_a, [w.gid_a, w.gid_b], {ML: ["read", "write"]})
    calls = []
    for agent, space in (("both", ML), ("both", ML2), ("gamma", ML), ("both", ML)):
        tag = f"{agent}-{space}-{len(calls)}"
        r, frame = w.native(agent, TOOL, {"tag": tag}, "--project", space, "--session", "s1")
        assert r.rc == 0, r
        assert frame["session"] == f"shared/{space}/agent/{agent}/session/s1", frame
        calls.append((agent, space, tag))

    for agent, space, gid in (("both", ML, w.gid_a), ("both", ML2, w.gid_b),
                              ("gamma", ML, w.gid_a)):  # fmt: skip
        session = w.space(space) / "agent" / agent / "session" / "s1"
        assert (session / "events.jsonl").stat().st_gid == gid
        tags = [e["input"]["tag"] for e in read_jsonl(session / "events.jsonl")
                if e["type"] == "tool_call"]  # fmt: skip
        assert tags == [t for a, s, t in calls if (a, s) == (agent, space)], (agent, space)
        shown = w.ctx("session", "show", agent, "s1", "--project", space, "--json")
        assert shown.rc == 0, shown
        shown_tags = [json.loads(line)["input"]["tag"] for line in shown.lines()
                      if json.loads(line)["type"] == "tool_call"]  # fmt: skip
        assert shown_tags == tags, shown
        for event in read_jsonl(session / "events.jsonl"):
            assert event["object"] == f"shared/{ML}/tool/{TOOL}", event
    listed = w.ctx("session", "list", "gamma", "--project", ML2)
    assert listed.out.strip() == "", listed
    shown = w.ctx("session", "show", "gamma", "s1", "--project", ML2)
    assert shown.rc == 1 and "ENOENT" in shown.err, shown
    assert not (w.space(ML2) / "agent" / "gamma").exists()
    log = read_jsonl(w.space(ML) / "tool" / f"{TOOL}.d" / "log")
    dirs = [(e["input"]["tag"], e["session_dir"]) for e in log]
    assert dirs == [(t, f"shared/{s}/agent/{a}/session/s1") for a, s, t in calls], dirs
    assert read_jsonl(w.space(ML2) / "tool" / f"{TOOL}.d" / "log") == []


def test_a_workers_session_tells_which_projects_queue_each_job_came_from(world: World):
    """S-2, X-1, W-1: agent ``both`` works the queues of ml and ml2, one after the other, in
    its default worker session; each project had a job named ``same``.  The session must let
    a reader tell which queue each ``queue.claim`` and ``queue.finish`` was for (S-2: the
    history is auditable): the object is the job as its queue names it (``queue/J``, as
    docs/sessions.md shows), and ``queue`` names the queue from the storage root."""
    w = world
    w.agent("both", w.user_a, [w.gid_a, w.gid_b], {ML: ["read", "write"], ML2: ["read", "write"]})
    for space in (ML, ML2):
        w.queue(space).publish(job(space, "fs.stat"), name="same")
        r = w.ctx("queue", "work", "--project", space, "--agent", "both", "--drain",
                  timeout=WAIT)  # fmt: skip
        assert r.rc == 0, r
    session = w.storage / "home" / str(w.user_a.uid) / "agent" / "both" / "session" / "worker"
    events = read_jsonl(session / "events.jsonl")
    for kind in ("queue.claim", "queue.start", "queue.finish"):
        seen = [(e.get("queue"), e["object"]) for e in events if e["type"] == kind]
        assert seen == [
            (f"shared/{ML}/queue", "queue/same.req.json"),
            (f"shared/{ML2}/queue", "queue/same.req.json"),
        ], (kind, seen)


# ===================================================================== a project removed


def test_a_project_deleted_while_another_works_leaves_the_other_working(world: World):
    """X-1, W-1, W-2, §2.4: ml's worker is mid-job and ml2's worker waits when ml2's whole
    directory is deleted.  ml's job then finishes done, a job published afterwards to ml is
    taken and done, and ``ctx run`` of ml's tool still works; ``ctx queue status --project
    ml2`` is ENOENT naming the fix (exit 1, no traceback), while ml's status is exit 0."""
    w = world
    w.agent("alpha", w.user_a, [w.gid_a], {ML: ["read", "write"]})
    w.agent("beta", w.user_b, [w.gid_b], {ML2: ["read", "write"]})
    ml = w.queue(ML)
    worker_ml = w.start_worker(ML, "alpha")
    w.start_worker(ML2, "beta")
    first = ml.publish(job("a-first", SLOW), name="first")
    assert wait_for(lambda: (w.trace / "started-a-first").exists(), WAIT), ml.state(first)
    shutil.rmtree(w.space(ML2))
    (w.trace / "go-a-first").touch()
    assert wait_for(lambda: ml.state(first) == "done", WAIT), ml.state(first)
    after = ml.publish(job("after"), name="after")
    assert wait_for(lambda: ml.state(after) == "done", WAIT), ml.state(after)
    _, result = ml.only_result(after)
    assert result["output"] == f'{ML}-echo {w.user_a.uid}\n{{"tag": "after"}}\n', result
    r, _ = w.native("alpha", TOOL, {"n": 2})
    assert r.rc == 0, r
    gone = w.ctx("queue", "status", "--project", ML2)
    assert gone.rc == 1 and "ENOENT" in gone.err and "Traceback" not in gone.err, gone
    assert f"--project {ML2}" in gone.err, gone
    assert ml.run("status").rc == 0
    events, _ = w.stop_worker(worker_ml)
    assert [e["job"] for e in events if e["event"] == "claim"] == [first, after], events
    ml.assert_settled()


def test_a_worker_of_a_deleted_project_does_not_wait_on_it_unnoticed(world: World):
    """W-2, X-1 (docs/workers.md stops a worker whose storage root's path changed, for the
    same reason): ml2's waiting worker, once ml2 is deleted and created again with a job in
    its queue, either takes that job or stops with an error naming the queue; it never waits
    on the deleted directory while the new queue's jobs stay pending."""
    w = world
    w.agent("beta", w.user_b, [w.gid_b], {ML2: ["read", "write"]})
    worker = w.start_worker(ML2, "beta")
    warm = w.queue(ML2).publish(job("warm"), name="warm")
    assert wait_for(lambda: w.queue(ML2).state(warm) == "done", WAIT)
    shutil.rmtree(w.space(ML2))
    w.make_space(ML2, w.gid_b, (TOOL, echo_program(ML2)))
    with (w.space(ML2) / "tool" / f"{TOOL}.d" / "policy").open("a") as f:
        f.write(f"allow beta_t tool:{TOOL} execute\n")
    again = w.queue(ML2).publish(job("again"), name="again")

    def noticed() -> bool:
        return worker.poll() is not None or w.queue(ML2).state(again) in ("done", "failed")

    wait_for(noticed, NOTICE)
    if worker.poll() is None:
        assert w.queue(ML2).state(again) == "done", w.queue(ML2).state(again)
        return
    err = worker.communicate(timeout=WAIT)[1]
    assert worker.returncode not in (0, None) and f"shared/{ML2}/queue" in err, err
    assert "Traceback" not in err, err
