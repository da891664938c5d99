"""End-to-end flows of a user who upgrades CortexFS over a storage root an older version left
behind and goes on working: each older layout the docs name (home sessions readable by the
agent's group, a space's directories without their sticky bit, a queue made before its space,
leases in an older shape, an older shell ``finish`` cut short, core tools, agent entries and
manual pages of an older install, an administrator's tool under a name that became a core
tool's, an install an older ctx left half done, a terminal an older ctx still runs, a queue
config with a key this version does not know, claim-order hints an older version left) is
built on disk as described, then the commands a user runs next (``ctx bootstrap``, ``ctx
shared create``, ``ctx queue status|recover|claim|renew|finish|work``, ``ctx run``, ``ctx
object install``, ``ctx agent start|stop``, ``ctx session show|repair``) must accept or repair
it as documented, lose nothing, let the work continue, and find nothing left to do when run
again (R-5, I-5)."""

from __future__ import annotations

import contextlib
import grp
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psutil
import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    QUEUE_SUBDIRS,
    QueueCLI,
    Run,
    clean_env,
    ctx_run,
    rfc3339,
    snapshot,
    tool_manifest,
    wait_for,
)
from tests.acceptance.workercli import shell_job
from tests.support.users import UnprivilegedUser, find_or_create_user, run_as

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="agents run as other uids and older modes are root's to make"
)

needs_terminal = pytest.mark.skipif(
    shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"),
    reason="an agent terminal needs bubblewrap and /dev/fuse",
)

SPACE = "old-space"
OLDER_SPACE_MODE = 0o2770  # what older versions gave a space's own and session directories
RUNTIME = Path("/run/cortexfs/terminal")


# ------------------------------------------------------------------------------ the world


@dataclass
class World:
    """A bootstrapped root every uid may search, with the queue of project ``proj``."""

    storage: Path
    template: Path
    scratch: Path
    agents: dict[str, int] = field(default_factory=dict)  # name -> uid

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage))

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    def agent(self, name: str, tools: list[str], *, user: str | None = None, **extra) -> int:
        """``ctx agent create`` (A-3), each of ``tools`` also allowed by the tool's own policy
        in the system tier when it is there (P-6); the agent's uid."""
        req = {"name": name, "label": f"{name}_t", "tools": tools, **extra}
        options = ["--user", user] if user else []
        made = self.ctx("agent", "create", *options, "-", "--json", input=json.dumps(req))
        assert made.rc == 0, made
        for tool in tools:
            policy = self.storage / "tool" / f"{tool}.d" / "policy"
            if policy.exists():
                with policy.open("a") as rules:
                    rules.write(f"allow {name}_t tool:{tool} execute\n")
        self.agents[name] = made.json()["identity"]["uid"]
        return self.agents[name]

    def native(self, agent: str, tool: str, value: dict, *options: str) -> tuple[Run, dict]:
        """``ctx run --native``: the run and its ``result`` frame."""
        r = self.ctx("run", "--native", "--agent", agent, *options, tool, input=json.dumps(value))
        results = [f for f in map(json.loads, r.lines()) if f.get("type") == "result"]
        assert len(results) == 1, r
        return r, results[0]

    def home_sessions(self, agent: str) -> Path:
        return self.storage / "home" / str(self.agents[agent]) / "agent" / agent / "session"

    def work(self, project: str, agent: str, *args: str) -> Run:
        return self.ctx("queue", "work", "--project", project, "--agent", agent, "--drain", *args)


@pytest.fixture
def world(searchable_storage: Path, _template: Path) -> Iterator[World]:
    scratch = searchable_storage.parent / "scratch"
    scratch.mkdir(mode=0o755)
    settled = ctx_run("bootstrap", "--storage", searchable_storage)
    assert settled.rc == 0, settled  # the copied root's bin/ctxterm names the copy anew
    yield World(searchable_storage, _template, scratch)


@pytest.fixture
def member() -> UnprivilegedUser:
    """The second uid, a member of the spaces made with its group."""
    return find_or_create_user()


@pytest.fixture
def holder() -> Iterator[subprocess.Popen]:
    """A live process standing in as the lease holder an older worker was."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def mode(path: Path) -> int:
    return path.lstat().st_mode & 0o7777


def events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def jobs_file(jobs: list[dict], path: Path) -> Path:
    path.write_text("".join(json.dumps(job) + "\n" for job in jobs))
    return path


def publish(world: World, project: str, jobs: list[dict]) -> list[str]:
    batch = jobs_file(jobs, world.scratch / f"{project}-{uuid.uuid4().hex[:6]}.jsonl")
    r = world.ctx("queue", "publish", "--project", project, "--batch", batch)
    assert r.rc == 0, r
    return r.lines()


def result_of(queue: QueueCLI, job: str) -> dict:
    state = queue.state(job)
    assert state in ("done", "failed"), (job, state)
    return {"state": state, **json.loads((queue.dir / state / f"{job}.result").read_text())}


def strip_stamp(executable: Path) -> None:
    """A core tool as bootstrap copied it before core tools carried a stamp: the interpreter
    line, then the archive, without the ``#cortexfs-bundle`` second line."""
    first, second, rest = executable.read_bytes().split(b"\n", 2)
    assert second.startswith(b"#cortexfs-bundle "), second[:40]
    executable.write_bytes(first + b"\n" + rest)


# ------------------------------------------------------------------------- home sessions


def test_home_sessions_an_older_version_made_group_readable_are_tightened_and_go_on(world):
    """S-1, S-5, R-5 (docs/sessions.md "Sessions made by older versions"): sessions 0750 with
    ``events.jsonl`` 0640 are tightened by ``ctx session repair`` (``tightened``) and
    ``ctx bootstrap`` (``repaired … (mode 0750 -> 0700)``), an ``events.jsonl`` with a second
    name is left and named in a warning; every event stays byte for byte, ``ctx session show``
    reads them, new calls append to the same timelines, and a second bootstrap has nothing to
    do."""
    world.agent("ci", ["shell.exec"])
    for session in ("default", "s2", "s3"):
        for n in range(2):
            r, result = world.native("ci", "shell.exec", {"cmd": f"echo {session}-{n}"},
                                     "--session", session)  # fmt: skip
            assert r.rc == 0 and result["output"] == f"{session}-{n}\n", r
    top = world.home_sessions("ci")
    backup = world.scratch / "s3-events-backup.jsonl"
    os.link(top / "s3" / "events.jsonl", backup)  # a second name a backup script gave it
    older = [top.parent.parent, top.parent, top, *(top / s for s in ("default", "s2", "s3"))]
    for directory in older:
        directory.chmod(0o750)
    for session in ("default", "s2", "s3"):
        (top / session / "events.jsonl").chmod(0o640)
    before = {s: (top / s / "events.jsonl").read_bytes() for s in ("default", "s2", "s3")}
    rel = f"home/{world.agents['ci']}/agent/ci/session"
    foreign = top / "s4"  # a session directory root made there by hand: not the home's
    foreign.mkdir(mode=0o750)
    (foreign / "events.jsonl").write_text("")

    repaired = world.ctx("session", "repair", "ci", "--session", "s2", "--json")
    assert repaired.rc == 0, repaired
    report = repaired.json()
    assert report["truncated_bytes"] == 0 and report["left"] == [], report
    assert report["tightened"] == [
        f"{top / 's2'} (mode 0750 -> 0700)",
        f"{top / 's2' / 'events.jsonl'} (mode 0640 -> 0600)",
    ], report

    boot = world.ctx("bootstrap", "--json")
    assert boot.rc == 0, boot
    report = boot.json()
    assert report["created"] == [] and report["problems"] == [], report
    assert report["repaired"] == [
        f"home/{world.agents['ci']}/agent (mode 0750 -> 0700)",
        f"home/{world.agents['ci']}/agent/ci (mode 0750 -> 0700)",
        f"{rel} (mode 0750 -> 0700)",
        f"{rel}/default (mode 0750 -> 0700)",
        f"{rel}/default/events.jsonl (mode 0640 -> 0600)",
        f"{rel}/s3 (mode 0750 -> 0700)",
    ], report
    assert len(report["warnings"]) == 3, report  # s3's events, s4 and its events
    linked = [w for w in report["warnings"] if w.startswith(f"{rel}/s3/events.jsonl ")]
    assert len(linked) == 1 and "has mode 0640" in linked[0], report
    assert "2 names (hard links)" in linked[0], report
    theirs = [w for w in report["warnings"] if w.startswith(f"{rel}/s4")]
    assert len(theirs) == 2 and all("belongs to uid 0, not to uid" in w for w in theirs), report
    assert mode(foreign) == 0o750 and foreign.stat().st_uid == 0

    assert [mode(d) for d in older] == [0o700] * len(older)
    assert mode(top / "default" / "events.jsonl") == mode(top / "s2" / "events.jsonl") == 0o600
    assert mode(top / "s3" / "events.jsonl") == 0o640 and os.path.samefile(
        backup, top / "s3" / "events.jsonl"
    )
    for session, data in before.items():
        assert (top / session / "events.jsonl").read_bytes() == data, session

    shown = world.ctx("session", "show", "ci", "--session", "default", "--json")
    assert shown.rc == 0, shown
    assert [json.loads(line) for line in shown.lines()] == events(top / "default" / "events.jsonl")
    r, result = world.native("ci", "shell.exec", {"cmd": "echo after"})
    assert r.rc == 0 and result["output"] == "after\n", r
    grown = (top / "default" / "events.jsonl").read_bytes()
    assert grown.startswith(before["default"]) and len(grown) > len(before["default"])
    assert [e["type"] for e in events(top / "default" / "events.jsonl")[-2:]] == [
        "tool_call",
        "tool_result",
    ]
    assert mode(top / "default" / "events.jsonl") == 0o600

    again = world.ctx("bootstrap", "--json")
    assert again.rc == 0 and again.json()["repaired"] == [], again
    assert again.json()["created"] == [] and len(again.json()["warnings"]) == 3, again


def test_a_root_an_older_bootstrap_made_0700_is_named_with_the_chmod_that_opens_it(world):
    """R-5, P-5 step 2 (docs/tools.md "Modes, whatever the umask": an older bootstrap under
    ``umask 077`` made the root and its six directories 0700): bootstrap never widens them
    but warns (exit 0) naming each with its mode and the ``chmod o+rx …`` that opens them;
    meanwhile every agent call is refused at step 2; once the user runs that very command,
    calls run, queued jobs are worked, and bootstrap warns no more."""
    world.agent("ci", ["shell.exec"])
    queue = QueueCLI(world.storage, "proj")
    (job,) = publish(world, "proj", [shell_job("echo reachable")])
    six = [world.storage, *(world.storage / d for d in ("bin", "tool", "agent", "model"))]
    six += [world.storage / "home", world.storage / "shared"]
    for directory in six:
        directory.chmod(0o700)

    boot = world.ctx("bootstrap", "--json")
    assert boot.rc == 0, boot
    (warning,) = [w for w in boot.json()["warnings"] if w.startswith("others may not read")]
    for directory in six:
        assert f"{directory} (0700)" in warning, warning
    assert [mode(d) for d in six] == [0o700] * 7  # never widened
    command = warning.split("to open them: ", 1)[1]
    assert command == "chmod o+rx " + " ".join(map(str, six)), warning

    r, result = world.native("ci", "shell.exec", {"cmd": "echo refused"})
    assert r.rc == 1 and (result["error"]["error"], result["error"]["step"]) == ("EACCES", 2), r
    assert f"search (x) on {world.storage} is denied" in result["error"]["message"], result

    subprocess.run(["/bin/sh", "-c", command], check=True)
    assert [mode(d) for d in six] == [0o705] * 7
    r, result = world.native("ci", "shell.exec", {"cmd": "echo reachable"})
    assert r.rc == 0 and result["output"] == "reachable\n", r
    worked = world.work("proj", "ci")
    assert worked.rc == 0 and result_of(queue, job)["output"] == "reachable\n", worked
    again = world.ctx("bootstrap", "--json")
    assert again.rc == 0 and again.json()["warnings"] == [], again
    assert (again.json()["repaired"], again.json()["created"]) == ([], []), again


# ---------------------------------------------------------------------------- shared spaces


def space_tool(world: World, name: str, output: dict) -> Path:
    program = f"#!/bin/sh\ncat >/dev/null\necho '{json.dumps(output)}'\n"
    manifest = tool_manifest(world.scratch / name, name, program)
    manifest.parent.chmod(0o755)  # a member installs from it too
    manifest.chmod(0o644)
    (manifest.parent / f"{name}.sh").chmod(0o755)
    return manifest


def test_a_space_of_older_modes_is_named_by_bootstrap_repaired_by_shared_create_and_worked(
    world, member
):
    """X-1, S-6, P-5 step 6, T-8, W-1 (docs/sessions.md, docs/policy.md, docs/tools.md): a
    space whose own directories, ``tool/`` and session directories are 02770 as an older
    version made them is named once in a bootstrap warning, its tool runs for nobody (step 6
    names ``ctx shared create … --group G``), a member's install there is refused at the
    lock file; ``ctx shared create`` without ``--group`` leaves it, with ``--group`` it gives
    every directory its mode (``repaired``, ``sessions_repaired`` ``2770 -> 3770``) keeping
    every job, event, policy and log; the tool then runs, a worker drains the queue, and
    neither command finds anything left to do."""
    group = grp.getgrgid(member.gid).gr_name
    assert world.ctx("shared", "create", SPACE, "--group", group).rc == 0
    installed = world.ctx("object", "install", space_tool(world, "lab.probe", {"space": True}),
                          "--tier", f"shared:{SPACE}")  # fmt: skip
    assert installed.rc == 0, installed
    space = world.storage / "shared" / SPACE
    tool_policy = space / "tool" / "lab.probe.d" / "policy"
    with tool_policy.open("a") as rules:
        rules.write("allow al_t tool:lab.probe execute\n")
    world.agent("al", ["shell.exec", "lab.probe"], user=member.name,
                shared={SPACE: ["read", "write"]})  # fmt: skip
    for session in ("s1", "private"):
        r, result = world.native("al", "lab.probe", {}, "--project", SPACE, "--session", session)
        assert r.rc == 0 and result["output"] == {"space": True}, r
    queue = QueueCLI(world.storage, SPACE)
    jobs = publish(world, SPACE, [shell_job(f"echo job-{n}") for n in range(2)])

    older = [space, space / "agent", space / "queue", space / "tool"]
    sessions = [space / "agent" / "al", space / "agent" / "al" / "session"]
    sessions.append(sessions[-1] / "s1")
    for directory in older + sessions:
        directory.chmod(OLDER_SPACE_MODE)
    private = sessions[1] / "private"
    private.chmod(0o2750)  # the agent took its group's write away from this one
    timeline = sessions[-1] / "events.jsonl"
    kept = {p: p.read_bytes() for p in (timeline, tool_policy, tool_policy.parent / "log")}
    kept |= {queue.dir / "pending" / j: (queue.dir / "pending" / j).read_bytes() for j in jobs}

    boot = world.ctx("bootstrap", "--json")
    assert boot.rc == 0, boot
    warnings = [w for w in boot.json()["warnings"] if w.startswith(f"shared space {SPACE}:")]
    assert len(warnings) == 1, boot
    assert "as an older version made it" in warnings[0], warnings
    assert f"run 'ctx shared create {SPACE} --group {member.gid}'" in warnings[0], warnings

    r, result = world.native("al", "lab.probe", {}, "--project", SPACE, "--session", "s1")
    error = result["error"]
    assert r.rc == 1 and (error["error"], error["step"]) == ("EACCES", 6), r
    assert f"shared/{SPACE} is writable by its group or by others (mode 2770)" in error["message"]
    assert f"run 'ctx shared create {SPACE} --group {member.gid}'" in error["message"], error
    kept[timeline] = timeline.read_bytes()  # the refused call is recorded there too
    kept[tool_policy.parent / "log"] = (tool_policy.parent / "log").read_bytes()

    tool_tier = snapshot(space / "tool")
    env = {**world.env, "XDG_CACHE_HOME": str(world.scratch / "member-cache")}
    refused = run_as(member, [*CTX_ARGV, "object", "install", str(space_tool(world, "lab.mine",
                     {"mine": True})), "--tier", f"shared:{SPACE}"], env=env)  # fmt: skip
    assert refused.returncode == 1, refused
    assert "EACCES" in refused.stderr and ".install-lock cannot be opened" in refused.stderr
    assert snapshot(space / "tool") == tool_tier

    plain = world.ctx("shared", "create", SPACE, "--json")
    assert plain.rc == 0, plain
    assert (plain.json()["repaired"], plain.json()["sessions_repaired"]) == ([], []), plain
    assert [mode(d) for d in older + sessions] == [OLDER_SPACE_MODE] * 7
    assert mode(private) == 0o2750

    fixed = world.ctx("shared", "create", SPACE, "--group", group, "--json")
    assert fixed.rc == 0, fixed
    report = fixed.json()
    assert (report["created"], report["regrouped"]) == ([], 0), report
    assert report["repaired"] == [str(d) for d in older[:1] + older[3:] + older[1:3]], report
    assert sorted(report["sessions_repaired"]) == sorted(
        [f"{d} (mode 2770 -> 3770)" for d in sessions] + [f"{private} (mode 2750 -> 3750)"]
    ), report
    assert [mode(d) for d in older] == [0o3770, 0o3770, 0o3770, 0o2750]
    assert [mode(d) for d in sessions] == [0o3770] * 3
    assert mode(private) == 0o3750  # the bit the agent took away is not given back
    for path, data in kept.items():
        assert path.read_bytes() == data, path

    r, result = world.native("al", "lab.probe", {}, "--project", SPACE, "--session", "s1")
    assert r.rc == 0 and result["output"] == {"space": True}, r
    assert timeline.read_bytes().startswith(kept[timeline])
    assert [e["status"] for e in events(timeline)[-2:]] == ["ok", "ok"]
    worked = world.work(SPACE, "al")
    assert worked.rc == 0, worked
    assert [result_of(queue, j)["output"] for j in jobs] == ["job-0\n", "job-1\n"]

    again = world.ctx("shared", "create", SPACE, "--group", group, "--json")
    assert again.rc == 0, again
    assert [again.json()[k] for k in ("created", "repaired", "sessions_repaired")] == [[], [], []]
    boot = world.ctx("bootstrap", "--json")
    assert boot.rc == 0 and boot.json()["warnings"] == [] and boot.json()["repaired"] == [], boot


def test_a_queue_an_older_queue_init_made_before_its_space_is_completed_for_its_members(
    world, member
):
    """X-1, Q-2, Q-4, §2.1 (docs/sessions.md "completes a space whose queue came first"):
    ``shared/P/queue`` alone, its directories 0755 of root's group with a pending job and a
    finished one, refuses a member's claim (EACCES) and is named by bootstrap; ``ctx shared
    create P --group G`` makes the missing ``tool/``, ``data/``, ``agent/``, regroups the queue
    and gives it its modes, every job byte for byte; the member then claims and finishes the
    job, and the command run again has nothing to do."""
    space = world.storage / "shared" / "qfirst"
    queue = QueueCLI(world.storage, "qfirst")
    (space / "queue").mkdir(parents=True, mode=0o755)
    space.chmod(0o755)
    for sub in QUEUE_SUBDIRS:
        (queue.dir / sub).mkdir(mode=0o755)
    shutil.copyfile(world.storage / "shared" / "proj" / "queue" / "config", queue.dir / "config")
    pending = queue.drop("older-pending", shell_job("echo pending"))
    finished = queue.terminal("older-done")
    before = snapshot(queue.dir)
    env = {**world.env, "XDG_CACHE_HOME": str(world.scratch / "member-cache")}
    argv = [*CTX_ARGV, "queue", "claim", "--project", "qfirst", "--pid", str(os.getpid())]

    refused = run_as(member, argv, env=env)
    assert refused.returncode == 1 and "EACCES" in refused.stderr, refused
    assert snapshot(queue.dir) == before

    boot = world.ctx("bootstrap", "--json")
    assert boot.rc == 0, boot
    assert any(w.startswith("shared space qfirst:") for w in boot.json()["warnings"]), boot

    group = grp.getgrgid(member.gid).gr_name
    made = world.ctx("shared", "create", "qfirst", "--group", group, "--json")
    assert made.rc == 0, made
    report = made.json()
    assert report["created"] == [str(space / d) for d in ("tool", "data", "agent")], report
    assert (report["regrouped_from"], report["gid"]) == (0, member.gid), report
    assert report["regrouped"] == len(before) + 2, report  # with the space and its queue/
    assert {space, queue.dir} <= set(map(Path, report["repaired"])), report
    assert {e.lstat().st_gid for e in [space, *space.rglob("*")]} == {member.gid}
    assert [mode(space / d) for d in (".", "agent", "queue", "data", "tool")] == [
        0o3770, 0o3770, 0o3770, 0o2770, 0o2750,
    ]  # fmt: skip
    assert {mode(queue.dir / sub) for sub in QUEUE_SUBDIRS} == {0o2770}
    after = snapshot(queue.dir)
    assert {k: v for k, v in after.items() if v[0] == "file"} == {
        k: v for k, v in before.items() if v[0] == "file"
    }

    claimed = run_as(member, argv, env=env)
    assert (claimed.returncode, claimed.stdout.strip()) == (0, pending), claimed
    done = run_as(member, [*CTX_ARGV, "queue", "finish", "--project", "qfirst", pending, "--ok",
                  "-"], env=env, stdin='"pending done"')  # fmt: skip
    assert done.returncode == 0, done
    assert result_of(queue, pending)["output"] == "pending done"
    assert (queue.dir / "done" / f"{pending}.result").stat().st_gid == member.gid
    assert result_of(queue, finished)["output"] == {"answer": 42}
    status = world.ctx("queue", "status", "--project", "qfirst", "--json")
    assert status.rc == 0 and (status.json()["done"], status.json()["pending"]) == (2, 0), status

    again = world.ctx("shared", "create", "qfirst", "--group", group, "--json")
    assert again.rc == 0, again
    assert [again.json()[k] for k in ("created", "repaired", "regrouped")] == [[], [], 0], again


# ---------------------------------------------------------------------------------- leases


def zoneless(seconds: float) -> str:
    """RFC 3339 without a zone (UTC), to the second."""
    return datetime.fromtimestamp(int(seconds), UTC).replace(tzinfo=None).isoformat()


def older_lease(queue: QueueCLI, name: str, pid: int, start_time: float) -> str:
    """Claim ``name`` as an older worker did: ``claimed/J/J`` and a lease with the start time
    under ``start_time``, no ``job``, ``pid_ns`` as ``readlink`` shows it and zone-less RFC 3339
    times (docs/queue.md: how a lease is read)."""
    job = queue.drop(name, shell_job(f"echo {name}"))
    (queue.dir / "claimed" / job).mkdir()
    os.rename(queue.dir / "pending" / job, queue.dir / "claimed" / job / job)
    (queue.dir / "lease" / job).mkdir()
    now = time.time()
    lease = {
        "worker": "old-w1",
        "host": os.uname().nodename,
        "boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        "pid_ns": os.readlink("/proc/self/ns/pid"),
        "pid": pid,
        "start_time": start_time,
        "claimed_at": zoneless(now - 60),
        "expires_at": zoneless(now + 3600),
    }
    queue.write_lease(job, lease)
    return job


def test_leases_an_older_worker_wrote_are_judged_renewed_finished_and_requeued(world, holder):
    """Q-3, Q-5, Q-4, W-1, I-5 (README "Leases … written by older versions are read as they
    are"): leases naming their start time ``start_time`` (or none), without ``job``, with
    ``pid_ns`` as ``pid:[N]`` and times without a zone (UTC, whatever ``TZ`` says) or in epoch
    seconds: live holders' jobs are left alone; one whose pid now runs another process, one
    whose pid is gone and one whose lease expired (its holder alive) are requeued; the live
    one is renewed from its holder and finished from a shell (its result naming the lease's
    holder), a worker runs the requeued ones, and a last recover has nothing to do."""
    world.agent("ci", ["shell.exec"])
    queue = QueueCLI(world.storage, "proj")
    started = psutil.Process(holder.pid).create_time()
    gone = subprocess.Popen(["true"])
    gone.wait()
    live = older_lease(queue, "live", holder.pid, started)
    reused = older_lease(queue, "reused", holder.pid, started - 1000)
    dead = older_lease(queue, "dead", gone.pid, started)
    lapsed = older_lease(queue, "lapsed", holder.pid, started)  # expired: proof
    queue.write_lease(lapsed, queue.lease(lapsed) | {"expires_at": zoneless(time.time() - 600)})
    unstamped = older_lease(queue, "unstamped", holder.pid, started)
    bare = queue.lease(unstamped)  # no start time at all, times in seconds since the epoch
    del bare["start_time"]
    bare |= {"claimed_at": time.time() - 60, "expires_at": time.time() + 3600}
    queue.write_lease(unstamped, bare)
    claimed_at = rfc3339(queue.lease(live)["claimed_at"] + "+00:00")
    requests = {
        j: (queue.dir / "claimed" / j / j).read_bytes()
        for j in (live, reused, dead, lapsed, unstamped)
    }

    status = queue.run("status", "--json")
    assert status.rc == 0, status
    assert (status.json()["claimed"], status.json()["conflict"]) == (5, 0), status
    assert status.json()["ignored"] == [] and status.json()["incomplete"] == [], status

    for zone in ("Etc/GMT-5", "Etc/GMT+5"):  # a time without a zone is UTC on any machine
        env = {**world.env, "TZ": zone}
        dry = queue.run("recover", "--dry-run", "--json", env=env).json()
        assert sorted(r["job"] for r in dry["requeued"]) == sorted([reused, dead, lapsed]), dry
    recovered = queue.run("recover", "--json")
    assert recovered.rc == 0, recovered
    report = recovered.json()
    assert sorted(r["job"] for r in report["requeued"]) == sorted([reused, dead, lapsed]), report
    assert sorted(u["job"] for u in report["untouched"]) == sorted([live, unstamped]), report
    assert report["consistent"] is True and report["conflicts"] == [], report
    assert queue.state(live) == "claimed"
    for job in (reused, dead, lapsed):
        assert (queue.dir / "pending" / job).read_bytes() == requests[job]
    again = queue.run("recover", "--reconcile", "--json")
    assert again.rc == 0 and again.json()["requeued"] == [], again
    assert queue.state(live) == "claimed"

    renewed = queue.run("renew", live, "--pid", str(holder.pid), "--ttl", "900")
    assert renewed.rc == 0, renewed
    lease = queue.lease(live)
    assert lease["pid"] == holder.pid and lease["worker"] == "old-w1", lease
    assert abs(lease["create_time"] - started) < 0.01, lease  # the start time it was given
    assert rfc3339(lease["claimed_at"]) == claimed_at, lease
    left = rfc3339(lease["expires_at"]).timestamp() - time.time()
    assert 880 < left <= 900, lease

    worked = world.work("proj", "ci")
    assert worked.rc == 0, worked
    assert result_of(queue, reused)["output"] == "reused\n"
    assert result_of(queue, dead)["output"] == "dead\n"
    assert result_of(queue, lapsed)["output"] == "lapsed\n"
    assert queue.state(live) == "claimed"

    assert queue.state(unstamped) == "claimed"
    assert queue.run("finish", unstamped, "--error", "-", input='"given up"').rc == 0
    assert result_of(queue, unstamped)["state"] == "failed"
    finished = queue.run("finish", live, "--ok", "-", input='{"by": "hand"}')
    assert finished.rc == 0, finished
    outcome = result_of(queue, live)
    assert (outcome["state"], outcome["output"]) == ("done", {"by": "hand"}), outcome
    assert (outcome["worker"]["id"], outcome["worker"]["pid"]) == ("old-w1", holder.pid), outcome
    assert rfc3339(outcome["started"]) == claimed_at, outcome
    assert (queue.dir / "done" / live).read_bytes() == requests[live]

    last = queue.run("recover", "--reconcile", "--json")
    assert last.rc == 0, last
    assert [last.json()[k] for k in ("requeued", "repaired", "untouched", "incomplete")] == [
        [],
        [],
        [],
        [],
    ]
    for sub in ("pending", "claimed", "lease", "inbox"):
        assert queue.entries(sub) == set(), sub


def test_a_finish_an_older_shell_left_cut_short_waits_for_its_holder_then_rolls_forward(
    world, holder
):
    """Q-4, Q-6, I-3, I-5 (docs/queue.md: "a finish an older release's shell ``finish`` left
    interrupted, which recorded the finishing shell as ``worker``"): finishing again with the
    same outcome is refused with EEXIST naming ``recover --reconcile`` and the holder, plain
    and reconciling recover leave it while the holder lives (exit 1), and once the holder is
    gone ``--reconcile`` completes it with the result byte for byte; run again, nothing."""
    queue = QueueCLI(world.storage, "proj")
    job = queue.publish(shell_job("echo cut"), name="cut")
    assert queue.claim("--pid", str(holder.pid), "--worker", "w-old") == job
    lease = queue.lease(job)
    shell = subprocess.Popen(["true"])
    shell.wait()
    written = json.dumps({
        "status": "ok", "output": {"n": 7},
        "worker": {"id": "w-old", "host": lease["host"], "pid": shell.pid,
                   "boot_id": lease["boot_id"], "pid_ns": lease["pid_ns"]},
        "started": lease["claimed_at"], "finished": "2026-12-01T10:00:00.000000Z",
    }).encode()  # fmt: skip
    (queue.dir / "done" / f"{job}.result").write_bytes(written)
    request = (queue.dir / "claimed" / job / job).read_bytes()
    before = snapshot(queue.dir)

    refused = queue.run("finish", job, "--ok", "-", input='{"n": 7}')
    assert refused.rc == 1 and refused.err.startswith("ctx: EEXIST:"), refused
    assert "'ctx queue recover --reconcile --project proj' completes it" in refused.err, refused
    assert f"once its lease holder (pid {holder.pid} on {lease['host']})" in refused.err
    assert snapshot(queue.dir) == before

    for args in ((), ("--reconcile",)):
        r = queue.run("recover", *args, "--json")
        assert r.rc == 1, r
        assert [i["job"] for i in r.json()["incomplete"]] == [job], r
        assert r.json()["repaired"] == [] and r.json()["consistent"] is False, r
        assert snapshot(queue.dir) == before

    holder.kill()
    holder.wait()
    rolled = queue.run("recover", "--reconcile", "--json")
    assert rolled.rc == 0, rolled
    assert [(r["job"], r["applied"]) for r in rolled.json()["repaired"]] == [(job, True)], rolled
    assert queue.state(job) == "done"
    assert (queue.dir / "done" / f"{job}.result").read_bytes() == written
    assert (queue.dir / "done" / job).read_bytes() == request
    for sub in ("claimed", "lease"):
        assert queue.entries(sub) == set(), sub
    last = queue.run("recover", "--reconcile", "--json")
    assert last.rc == 0 and last.json()["repaired"] == [], last


# ------------------------------------------------------------------- what bootstrap replaces


def test_core_tools_agent_entries_and_pages_of_an_older_install_wait_for_bootstrap(world):
    """R-5, W-1, A-3, D-1, T-7 (README "Upgrading", docs/workers.md "After an upgrade of
    ctx"): core tools without this version's stamp make a worker exit 1 (EINVAL, no job
    claimed) and ``ctx run`` refuse them (EINVAL, the tool did not run); an agent entry naming
    an older install's interpreter does not run, another names the root's former path; a page
    an older release had sits in the bundle.  ``ctx bootstrap`` repairs all of them, keeps the
    tools' policy and log byte for byte, an administrator's own entry and a note beside the
    pages, the worker then runs the jobs, and a second bootstrap
    has nothing to do."""
    world.agent("ci", ["shell.exec", "fs.read"])
    r, _ = world.native("ci", "shell.exec", {"cmd": "echo before"})
    assert r.rc == 0, r
    queue = QueueCLI(world.storage, "proj")
    jobs = publish(world, "proj", [shell_job(f"echo upgraded-{n}") for n in range(3)])
    tools = world.storage / "tool"
    for name in ("shell.exec", "fs.read"):
        strip_stamp(tools / name)
    entry = world.storage / "agent" / "ci"
    current_entry = entry.read_bytes()
    _, rest = current_entry.split(b"\n", 1)
    entry.write_bytes(b"#!/opt/cortexfs-0.3/venv/bin/python -I\n" + rest)
    world.agent("moved", [])  # its root was at another path when the entry was written
    moved = world.storage / "agent" / "moved"
    moved_entry = moved.read_bytes()
    moved.write_bytes(moved_entry.replace(repr(str(world.storage)).encode(), b"'/srv/old-root'"))
    assert moved.read_bytes() != moved_entry
    world.agent("own", [])  # the administrator's own program at the entry: theirs
    own = world.storage / "agent" / "own"
    own.write_text("#!/bin/sh\necho 'my own entry'\n")
    docs = world.storage / "shared" / "cortexfs-docs"
    legacy = docs / "man" / "ctx.legacy.md"
    legacy.write_text("# ctx.legacy: a page of an older release\n")
    legacy.chmod(0o444)
    (docs / "NOTES.txt").write_text("kept by the administrator\n")

    worker = world.work("proj", "ci")
    assert worker.rc == 1, worker
    assert (
        f"EINVAL: the core tools in {world.storage} were installed by another version of ctx; "
        "run 'ctx bootstrap' (the worker claimed no job)"
    ) in worker.err, worker
    assert [queue.state(j) for j in jobs] == ["pending"] * 3

    r, result = world.native("ci", "shell.exec", {"cmd": "echo refused"})
    assert r.rc == 1 and (result["error"]["error"], result["error"]["stage"]) == (
        "EINVAL",
        "resolve",
    ), r
    assert result["error"]["message"].endswith(
        "installed by another version of ctx; run 'ctx bootstrap' (the tool did not run)"
    ), result
    term = world.ctx("run", "--agent", "ci", "shell.exec", '{"cmd": "echo refused"}')
    assert term.rc == 126 and "installed by another version of ctx" in term.err, term
    old_entry = subprocess.run(["/bin/sh", "-c", '"$0" --help', entry], capture_output=True)
    assert old_entry.returncode == 127, old_entry  # its interpreter is gone
    kept = {
        path: path.read_bytes()
        for name in ("shell.exec", "fs.read")
        for path in (tools / f"{name}.d" / "policy", tools / f"{name}.d" / "log")
        if path.exists()
    }
    assert tools / "shell.exec.d" / "log" in kept

    boot = world.ctx("bootstrap", "--json")
    assert boot.rc == 0, boot
    report = boot.json()
    assert (report["created"], report["problems"]) == ([], []), report
    assert sorted(report["repaired"]) == [
        "agent/ci",
        "agent/moved",
        "shared/cortexfs-docs/man/ctx.legacy.md (removed: not a page of this version)",
        "tool/fs.read",
        "tool/shell.exec",
    ], report
    for name in ("shell.exec", "fs.read"):
        assert (tools / name).read_bytes() == (world.template / "tool" / name).read_bytes()
    for path, data in kept.items():
        assert path.read_bytes() == data, path
    assert entry.read_bytes() == current_entry
    assert moved.read_bytes() == moved_entry
    assert own.read_text() == "#!/bin/sh\necho 'my own entry'\n"
    assert subprocess.run([entry, "--help"], capture_output=True, env=world.env).returncode == 0
    assert not legacy.exists()
    assert (docs / "NOTES.txt").read_text() == "kept by the administrator\n"

    worked = world.work("proj", "ci")
    assert worked.rc == 0, worked
    assert [result_of(queue, j)["output"] for j in jobs] == [f"upgraded-{n}\n" for n in range(3)]
    r, result = world.native("ci", "fs.read", {"path": "/ctx/shared/cortexfs-docs/README.md"})
    assert r.rc == 0 and "CortexFS" in json.dumps(result["output"]), r
    log = (tools / "shell.exec.d" / "log").read_bytes()
    assert log.startswith(kept[tools / "shell.exec.d" / "log"])

    again = world.ctx("bootstrap")
    assert again.rc == 0 and "nothing to do: the storage root is complete" in again.out, again


def test_an_install_an_older_ctx_left_half_done_is_finished_by_bootstrap(world):
    """T-8, T-7, R-5 (cortexfs/tools/pairs.py: an older install's previous entry moved aside to
    ``~old-entry``): while the entry is missing the tool is not found (ENOENT) and records
    nothing; ``ctx bootstrap`` finishes the install (``repaired …: finished an interrupted
    install``), the new version runs with the old policy and log carried over byte for byte,
    no staged name is left, and a second bootstrap has nothing to do."""
    tools = world.storage / "tool"
    v1 = tool_manifest(world.scratch / "v1", "lab.probe",
                       "#!/bin/sh\ncat >/dev/null\necho '{\"version\": 1}'\n")  # fmt: skip
    assert world.ctx("object", "install", v1, "--tier", "system").rc == 0
    world.agent("ci", ["lab.probe"])
    r, result = world.native("ci", "lab.probe", {})
    assert r.rc == 0 and result["output"] == {"version": 1}, r

    token = "0123456789ab"
    os.rename(tools / "lab.probe", tools / f".lab.probe~{token}~old-entry")
    staged_entry = tools / f".lab.probe~{token}~entry"
    staged_entry.write_text("#!/bin/sh\ncat >/dev/null\necho '{\"version\": 2}'\n")
    staged_entry.chmod(0o755)
    staged = tools / f".lab.probe~{token}~controls"
    staged.mkdir()
    for control in ("name", "description", "schema", "cap"):
        shutil.copyfile(tools / "lab.probe.d" / control, staged / control)
    (staged / "description").write_text("lab.probe version 2\n")
    kept = {c: (tools / "lab.probe.d" / c).read_bytes() for c in ("policy", "log")}

    r, result = world.native("ci", "lab.probe", {})
    assert r.rc == 1 and result["error"]["error"] == "ENOENT", r
    assert (tools / "lab.probe.d" / "log").read_bytes() == kept["log"]

    boot = world.ctx("bootstrap", "--json")
    assert boot.rc == 0, boot
    assert boot.json()["repaired"] == [
        f"{world.storage}/tool/lab.probe: finished an interrupted install"
    ], boot
    assert [n for n in os.listdir(tools) if n.startswith(".")] == [".install-lock"]
    assert (tools / "lab.probe.d" / "description").read_text() == "lab.probe version 2\n"
    assert (tools / "lab.probe.d" / "policy").read_bytes() == kept["policy"]
    assert (tools / "lab.probe.d" / "log").read_bytes() == kept["log"]

    r, result = world.native("ci", "lab.probe", {})
    assert r.rc == 0 and result["output"] == {"version": 2}, r
    assert (tools / "lab.probe.d" / "log").read_bytes().startswith(kept["log"])
    again = world.ctx("bootstrap", "--json")
    assert again.rc == 0 and (again.json()["repaired"], again.json()["created"]) == ([], []), again


def test_an_administrators_tool_under_a_name_this_version_made_core_is_kept_until_moved(world):
    """R-5, T-8, P-6, W-1 (README "Upgrading" step 2, docs/workers.md): a tool the
    administrator installed as ``fs.stat`` before that name became a core tool's is left as it
    is by bootstrap, which names it and the remedy (exit 1) and still settles the rest; a
    worker starts all the same and the agent keeps running the administrator's tool.  Once
    the user follows the remedy (reinstall under another name, move the grants, remove the
    old pair), bootstrap installs the core ``fs.stat`` and both run; then nothing is left."""
    tools = world.storage / "tool"
    shutil.rmtree(tools / "fs.stat.d")
    (tools / "fs.stat").unlink()
    program = "#!/bin/sh\ncat >/dev/null\necho '{\"mine\": true}'\n"
    manifest = tool_manifest(world.scratch / "mine", "my.stat", program)
    assert world.ctx("object", "install", manifest, "--tier", "system").rc == 0
    os.rename(tools / "my.stat", tools / "fs.stat")  # as an older ctx installed it
    os.rename(tools / "my.stat.d", tools / "fs.stat.d")
    (tools / "fs.stat.d" / "name").write_text("fs.stat\n")
    world.agent("ci", ["fs.stat", "shell.exec"])
    r, result = world.native("ci", "fs.stat", {})
    assert r.rc == 0 and result["output"] == {"mine": True}, r
    theirs = snapshot(tools / "fs.stat.d") | {"entry": ("file", (tools / "fs.stat").read_bytes())}
    (tools / "tsh.d" / "config").unlink()  # something else for bootstrap to settle

    boot = world.ctx("bootstrap", "--json")
    assert boot.rc == 1, boot
    report = boot.json()
    assert report["created"] == ["tool/tsh.d/config"], report
    assert len(report["problems"]) == 1, report
    problem = report["problems"][0]
    assert problem.startswith("tool/fs.stat is an administrator's tool (installed from"), report
    assert "with the name of a core tool of this version" in problem, report
    assert "reinstall it under another name ('ctx object install')" in problem, report
    assert f"remove {tools / 'fs.stat'} and {tools / 'fs.stat.d'}" in problem, report
    assert (
        snapshot(tools / "fs.stat.d") | {"entry": ("file", (tools / "fs.stat").read_bytes())}
        == theirs
    )

    r, result = world.native("ci", "fs.stat", {})
    assert r.rc == 0 and result["output"] == {"mine": True}, r
    queue = QueueCLI(world.storage, "proj")
    (job,) = publish(world, "proj", [shell_job("echo still working")])
    worked = world.work("proj", "ci")
    assert worked.rc == 0 and result_of(queue, job)["output"] == "still working\n", worked

    reinstalled = world.ctx("object", "install", manifest, "--tier", "system")
    assert reinstalled.rc == 0, reinstalled
    for policy in (tools / "my.stat.d" / "policy", world.storage / "agent" / "ci.d" / "policy"):
        with policy.open("a") as rules:
            rules.write("allow ci_t tool:my.stat execute\n")
    shutil.rmtree(tools / "fs.stat.d")
    (tools / "fs.stat").unlink()
    fixed = world.ctx("bootstrap", "--json")
    assert fixed.rc == 0, fixed
    assert (fixed.json()["created"], fixed.json()["problems"]) == (["tool/fs.stat"], []), fixed
    assert (tools / "fs.stat").read_bytes() == (world.template / "tool" / "fs.stat").read_bytes()

    r, result = world.native("ci", "my.stat", {})
    assert r.rc == 0 and result["output"] == {"mine": True}, r
    with (tools / "fs.stat.d" / "policy").open("a") as rules:
        rules.write("allow ci_t tool:fs.stat execute\n")
    r, result = world.native("ci", "fs.stat", {"path": "/ctx/shared/cortexfs-docs/README.md"})
    assert r.rc == 0 and result["output"] != {"mine": True}, r
    again = world.ctx("bootstrap")
    assert again.rc == 0 and "nothing to do: the storage root is complete" in again.out, again


# -------------------------------------------------------------------------------- terminals


OLDER_TERMINAL = """
import fcntl, os, socket, sys
d = sys.argv[1]
os.makedirs(d, mode=0o711)
fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
fcntl.flock(fd, fcntl.LOCK_EX)
s = socket.socket(socket.AF_UNIX)
s.bind(os.path.join(d, "main.sock"))
os.chmod(os.path.join(d, "main.sock"), 0o666)
s.listen()
with open(os.path.join(d, "pid"), "w") as f:
    f.write(str(os.getpid()))
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"older terminal: " + c.recv(16))
    c.close()
"""


def ask(path: str | Path, mode: bytes, until: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(20)
        client.connect(str(path))
        client.sendall(mode)
        data = b""
        while until not in data:
            chunk = client.recv(4096)
            if not chunk:
                break
            data += chunk
        return data


@contextlib.contextmanager
def older_terminal(directory: Path) -> Iterator[subprocess.Popen]:
    """A terminal an older ctx started: its own directory at A-2's older place, holding its
    lock while it runs, its socket answering."""
    proc = subprocess.Popen([sys.executable, "-c", OLDER_TERMINAL, str(directory)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        shutil.rmtree(directory, ignore_errors=True)
        for level in (directory.parent, directory.parent.parent):
            with contextlib.suppress(OSError):
                level.rmdir()


@needs_terminal
def test_a_terminal_an_older_ctx_runs_keeps_its_place_while_this_one_links_its_own(world):
    """A-1, A-2 (docs/tools.md: "a terminal a ctx without the root key started, in
    /run/cortexfs/terminal/<uid>/…, is not found by this one"): ``ctx agent stop`` does not
    find it (ENOENT); ``ctx agent start`` of the same agent and session links the session
    straight to its own root-keyed socket, answers ``watch`` there, and ``stop`` leaves the
    older terminal's directory, socket and pid file as they were; once the older one is gone,
    a new start takes A-2's place again and its stop removes it."""
    uid = world.agent("ci", ["fs.read"])
    session = f"s{uuid.uuid4().hex[:10]}"
    key = hashlib.sha256(os.path.realpath(world.storage).encode()).hexdigest()[:16]
    ours = RUNTIME / key / str(uid) / "ci" / session / "main.sock"
    place = RUNTIME / str(uid) / "ci" / session
    link = world.home_sessions("ci") / session / "terminal" / "main.sock"
    try:
        with older_terminal(place) as old:
            before = snapshot(place)
            stop = world.ctx("agent", "stop", "ci", "--session", session)
            assert stop.rc == 1 and "ENOENT" in stop.err, stop
            assert ask(place / "main.sock", b"watch\n", b"\n") == b"older terminal: watch\n"

            started = world.ctx("agent", "start", "ci", "--session", session, "--no-workspace",
                                "--json")  # fmt: skip
            assert started.rc == 0, started
            assert started.json()["listening_at"] == str(ours), started
            assert os.readlink(link) == str(ours)
            assert b"ci$ " in ask(ours, b"watch\n", b"ci$ ")
            assert ask(place / "main.sock", b"watch\n", b"\n") == b"older terminal: watch\n"

            stopped = world.ctx("agent", "stop", "ci", "--session", session)
            assert stopped.rc == 0 and stopped.out.startswith(f"stopped ci, session {session}")
            assert not os.path.lexists(link) and not os.path.lexists(ours)
            assert snapshot(place) == before and old.poll() is None

        started = world.ctx("agent", "start", "ci", "--session", session, "--no-workspace")
        assert started.rc == 0, started
        assert os.readlink(place / "main.sock") == str(ours)
        assert os.path.samefile(link, ours)
        assert b"ci$ " in ask(ours, b"watch\n", b"ci$ ")
        stopped = world.ctx("agent", "stop", "ci", "--session", session)
        assert stopped.rc == 0, stopped
        assert wait_for(lambda: not os.path.lexists(place / "main.sock"), 10)
    finally:
        world.ctx("agent", "stop", "ci", "--session", session)


# ------------------------------------------------------------------------------ queue config


def test_a_queue_config_with_a_key_this_version_does_not_know_is_refused_until_edited(
    world, holder
):
    """§2.1 ``queue/config``, Q-1, Q-3 (docs/queue.md "Configuration"): a config an older
    setup left with a key this version does not know is refused by every command that opens
    the queue (EINVAL naming ``config:LINE``, exit 1), ``init`` and ``shared create`` included,
    and nothing is changed or replaced by defaults; once the user removes that line and
    appends a ``lease_ttl``, the pending job is claimed with that lease and finished."""
    queue = QueueCLI(world.storage, "proj")
    job = queue.publish(shell_job("echo cfg"), name="cfg")
    config = queue.dir / "config"
    lines = config.read_text().splitlines()
    config.write_text("\n".join([*lines, "visibility_timeout=30"]) + "\n")
    before = snapshot(queue.dir)
    said = f"EINVAL: {config}:{len(lines) + 1}: unknown key 'visibility_timeout'"

    commands = [
        ("queue", "status", "--project", "proj"),
        ("queue", "list", "--project", "proj"),
        ("queue", "claim", "--project", "proj", "--pid", str(holder.pid)),
        ("queue", "recover", "--project", "proj", "--reconcile"),
        ("queue", "init", "--project", "proj"),
        ("shared", "create", "proj"),
    ]
    for command in commands:
        r = world.ctx(*command)
        assert r.rc == 1 and said in r.err, r
    r = world.ctx("queue", "publish", "--project", "proj", "-", input=json.dumps(shell_job("x")))
    assert r.rc == 1 and said in r.err, r
    r = world.ctx("queue", "status", "--project", "proj", "--json")
    assert r.rc == 1 and r.json()["error"] == "EINVAL", r
    assert snapshot(queue.dir) == before

    config.write_text("\n".join([*lines, "lease_ttl=900"]) + "\n")
    assert queue.claim("--pid", str(holder.pid)) == job
    lease = queue.lease(job)
    ttl = rfc3339(lease["expires_at"]) - rfc3339(lease["claimed_at"])
    assert ttl.total_seconds() == pytest.approx(900, abs=1), lease
    queue.finish(job)
    assert queue.state(job) == "done"
    assert queue.run("status").rc == 0


# ------------------------------------------------------------------------ claim-order hints


def test_claim_order_hints_an_older_version_left_are_made_private_and_pruned(world, holder):
    """Q-9, Q-10 (docs/queue.md "The hints are private and do not pile up"): a hint an older
    version left readable by others is made 0600 by the next claim, which still hands out
    the oldest job; a file of an older format an hour old is removed by the next claim that
    lists ``pending/`` (after a job was put there by hand, which is claimed by its age), and
    the jobs are claimed in publish order until the queue is empty (exit 3)."""
    queue = QueueCLI(world.storage, "proj")
    cache = world.scratch / "cache"
    env = {**world.env, "XDG_CACHE_HOME": str(cache)}
    for name in ("first", "second", "third"):
        queue.publish(shell_job(f"echo {name}"), name=name)

    def claim() -> Run:
        return queue.run("claim", "--pid", str(holder.pid), env=env)

    assert claim().out.strip() == "first.req.json"
    hints = cache / "cortexfs" / "claim-order"
    (hint,) = [p for p in hints.iterdir() if not p.name.startswith(".")]
    hint.chmod(0o644)  # as an older version left it
    older = hints / "0123abcd"
    older.write_bytes(b"00000000000000000021 - older format\nx.req.json\n")
    older.chmod(0o644)
    hour_ago = time.time() - 7200
    for path in (older, hints / ".pruned"):
        os.utime(path, (hour_ago, hour_ago))

    served = claim()
    assert (served.rc, served.out) == (0, "second.req.json\n"), served
    assert mode(hint) == 0o600
    assert older.exists()  # a claim served from its hint never looks at the cache directory

    by_hand = queue.drop("by-hand", shell_job("echo by hand"))
    os.utime(queue.dir / "pending" / by_hand, (hour_ago, hour_ago))
    listed = claim()
    assert (listed.rc, listed.out) == (0, f"{by_hand}\n"), listed
    assert not older.exists()
    assert sorted(p.name for p in hints.iterdir()) == sorted([".pruned", hint.name])
    assert {mode(p) for p in hints.iterdir()} == {0o600}
    assert {mode(d) for d in (cache / "cortexfs", hints)} == {0o700}

    last = claim()
    assert (last.rc, last.out) == (0, "third.req.json\n"), last
    empty = claim()
    assert (empty.rc, empty.out) == (3, ""), empty
    status = queue.run("status", "--json")
    assert status.rc == 0 and status.json()["claimed"] == 4, status
