"""The command-line and on-disk contracts of SPEC.md, read literally, checked from outside.

Every test drives the installed ``ctx`` (and ``ctxmcp``, the storage root's ``bin/tsh``, the
terminal socket, a FUSE mount) as a user who knows only SPEC.md and the commands' ``--help``
would, and names the requirement it checks.  Each test works on its own copy of a storage root
made by ``ctx bootstrap`` and ``ctx queue init --project proj``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psutil
import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    MAN_PAGES,
    QUEUE_SUBDIRS,
    REPO,
    ROOT_ENTRIES,
    OnStorage,
    QueueCLI,
    age,
    alive,
    clean_env,
    ctx_run,
    kill_processes_of,
    mounted_at,
    needs_fuse_as_root,
    new_scratch_dir,
    request,
    result,
    rfc3339,
    scratch_top,
    serving,
    snapshot,
    wait_for,
)
from tests.support.users import UnprivilegedUser, run_as
from tests.support.users import unprivileged_user as unprivileged_user

TOP = scratch_top(__file__)
CTXMCP = str(REPO / ".venv" / "bin" / "ctxmcp")
CORE_TOOLS = ("fs.read", "fs.list", "fs.stat", "fs.write", "shell.exec", "tsh.config")
CONTROLS = ("name", "description", "schema", "cap", "policy", "status", "log")
SUFFIX = ".req.json"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (agents, other uids)")


# --------------------------------------------------------------------------------------------
# The world each test works in


class World(OnStorage):
    """A scratch directory ``top`` holding ``storage``, a copy of a bootstrapped root."""

    def __init__(self, top: Path, storage: Path) -> None:
        self.top = top
        self.storage = storage
        self.q = QueueCLI(storage, "proj")

    def dir(self, name: str, mode: int = 0o755) -> Path:
        path = self.top / name
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(mode)
        return path

    def agent(
        self,
        user: UnprivilegedUser,
        name: str,
        tools: tuple[str, ...] = (),
        tool_layer: tuple[str, ...] | None = None,
        **extra,
    ) -> None:
        """``ctx agent create`` of agent ``name`` (label ``<name>_t``) running as ``user``,
        its policy granting ``tools``; the tools' own policies allow ``tool_layer``
        (default: the same tools)."""
        req = {"name": name, "label": f"{name}_t", "tools": list(tools), **extra}
        self.create_agent(req, "--user", user.name)
        self.allow_tool(f"{name}_t", *(tools if tool_layer is None else tool_layer))


@pytest.fixture(scope="module")
def template() -> Iterator[Path]:
    top = new_scratch_dir(TOP, "template-")
    root = top / "storage"
    made = ctx_run("bootstrap", "--storage", root)
    assert made.rc == 0, made
    made = ctx_run("queue", "init", "--project", "proj", env=clean_env(CTX_STORAGE=str(root)))
    assert made.rc == 0, made
    yield root
    shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def world(template: Path) -> Iterator[World]:
    top = new_scratch_dir(TOP, "w-")
    storage = top / "storage"
    shutil.copytree(template, storage, symlinks=True)
    # bin/ctxterm names the root it was written for: what bootstrap would write here.
    ctxterm = storage / "bin" / "ctxterm"
    ctxterm.write_text(ctxterm.read_text().replace(repr(str(template)), repr(str(storage))))
    yield World(top, storage)
    kill_processes_of(top)
    shutil.rmtree(top, ignore_errors=True)


def root_entries(storage: Path) -> set[str]:
    return set(os.listdir(storage))


def without_locks(tree: dict[str, tuple]) -> dict[str, tuple]:
    """A snapshot without the empty lock files commands take (.install-lock)."""
    return {k: v for k, v in tree.items() if not k.endswith(".install-lock")}


def dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@contextlib.contextmanager
def live_process() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen(["sleep", "300"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


# --------------------------------------------------------------------------------------------
# §1 Storage root, root ABI and names


def test_r2_r5_bootstrap_makes_exactly_the_root_abi(template: Path) -> None:
    """R-2, R-5, H-1, H-4, D-1: a bootstrapped root holds exactly bin/ tool/ agent/ model/
    home/ shared/ (no mcp/, audit/, queue/), the core tools with their control directories,
    bin/ctxterm, bin/tsh and tool/tsh, tool/tsh.d/config with the three settings, and the
    manual bundle, its pages read-only."""
    assert set(os.listdir(template)) == ROOT_ENTRIES
    for name in ("mcp", "audit", "queue"):
        assert not (template / name).exists()
    for tool in CORE_TOOLS:
        exe = template / "tool" / tool
        assert exe.is_file() and not exe.is_symlink(), tool
        assert os.access(exe, os.X_OK), tool
        controls = template / "tool" / f"{tool}.d"
        for control in CONTROLS:
            assert (controls / control).exists(), (tool, control)
        assert (controls / "hooks" / "pre.d").is_dir() and (controls / "hooks" / "post.d").is_dir()
        assert (controls / "name").read_text().strip() == tool
    config = (template / "tool" / "tsh.d" / "config").read_text()
    settings = dict(
        line.split("=", 1)
        for line in config.splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    )
    assert set(settings) == {"max_loaded_tools", "cache_capacity", "window_percent"}
    for entry in ("bin/ctxterm", "bin/tsh", "tool/tsh"):
        assert os.access(template / entry, os.X_OK), entry
    docs = template / "shared" / "cortexfs-docs"
    assert (docs / "README.md").is_file()
    for page in MAN_PAGES.values():
        assert (docs / "man" / page).is_file(), page
    for path in (docs / "README.md", *(docs / "man" / page for page in MAN_PAGES.values())):
        assert path.stat().st_mode & 0o222 == 0, f"{path} is writable: manuals are read-only"


def test_r5_bootstrap_is_idempotent_and_keeps_user_data(world: World) -> None:
    """R-5: bootstrap run again on a root in use changes nothing the user made (a data file,
    a pending job, a tool policy rule, a tsh setting changed through tsh.config), and a second
    run has nothing left to create or repair."""
    job = world.q.publish(name="kept")
    data = world.storage / "shared" / "proj" / "data" / "notes.txt"
    data.write_text("mine\n")
    policy = world.storage / "tool" / "fs.read.d" / "policy"
    with policy.open("a") as f:
        f.write("allow coder_t tool:fs.read execute\n")
    changed = world.ctx("tool", "tsh.config", "cache_capacity=48")
    assert changed.rc == 0, changed
    before = without_locks(snapshot(world.storage))
    again = world.ctx("bootstrap", "--json")
    assert again.rc == 0, again
    assert again.json()["created"] == [] and again.json()["repaired"] == [], again
    assert without_locks(snapshot(world.storage)) == before
    assert (world.q.dir / "pending" / job).is_file()
    assert "cache_capacity=48" in (world.storage / "tool" / "tsh.d" / "config").read_text()


def test_r5_d1_bootstrap_repairs_a_damaged_root_and_a_stale_bundle(world: World) -> None:
    """R-5, D-1: bootstrap repairs a root missing an ABI directory and a core tool, rebuilds a
    stale manual page (read-only again), and keeps everything else."""
    page = world.storage / "shared" / "cortexfs-docs" / "man" / "ctx.tool.md"
    original = page.read_text()
    page.chmod(0o644)  # the bundle's pages are read-only documents
    page.write_text("stale\n")
    shutil.rmtree(world.storage / "model")
    (world.storage / "tool" / "fs.stat").unlink()
    shutil.rmtree(world.storage / "tool" / "fs.stat.d")
    job = world.q.publish(name="survivor")
    repaired = world.ctx("bootstrap")
    assert repaired.rc == 0, repaired
    assert (world.storage / "model").is_dir()
    assert os.access(world.storage / "tool" / "fs.stat", os.X_OK)
    assert (world.storage / "tool" / "fs.stat.d" / "policy").is_file()
    assert page.read_text() == original
    assert page.stat().st_mode & 0o222 == 0
    assert (world.q.dir / "pending" / job).is_file()
    assert root_entries(world.storage) == ROOT_ENTRIES


def test_r1_storage_option_overrides_the_environment(world: World) -> None:
    """R-1: CTX_STORAGE or --storage DIR choose the root; the option given on the command
    line is the one used, the root named by the environment is left alone."""
    other = world.top / "other"
    shutil.copytree(world.storage, other, symlinks=True)
    before = snapshot(world.storage)
    env = clean_env(CTX_STORAGE=str(world.storage))
    init = ctx_run("queue", "init", "--storage", other, "--project", "elsewhere", env=env)
    assert init.rc == 0, init
    assert {p.name for p in (other / "shared" / "elsewhere" / "queue").iterdir()} >= QUEUE_SUBDIRS
    assert snapshot(world.storage) == before
    via_env = ctx_run("queue", "status", "--project", "proj", env=env)
    assert via_env.rc == 0 and str(world.q.dir) in via_env.out, via_env


@needs_root
def test_r1_non_root_default_is_under_xdg_data_home(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """R-1 [decision]: for a non-root user with no configuration the root is
    $XDG_DATA_HOME/cortexfs/storage/current (and nothing is made under ~/.local then)."""
    home = world.dir("home")
    os.chown(home, unprivileged_user.uid, unprivileged_user.gid)
    xdg = home / "xdg"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "XDG_DATA_HOME": str(xdg)}
    done = run_as(unprivileged_user, [*CTX_ARGV, "bootstrap"], env=env)
    assert done.returncode == 0, done.stderr
    assert set(os.listdir(xdg / "cortexfs" / "storage" / "current")) == ROOT_ENTRIES
    assert not (home / ".local").exists()


def test_r3_illegal_job_names_are_einval_and_publish_nothing(world: World) -> None:
    """R-3, §2.1: J is an object name ending in .req.json (1 to 64 bytes of [A-Za-z0-9._-],
    first byte alphanumeric, no '/'); anything else is rejected with EINVAL and nothing is
    published or left in the staging directory."""
    before = snapshot(world.q.dir)
    for name in ("bad/name", ".hidden", "sp ace", "x" * 56):
        refused = world.q.run("publish", "--name", name, "-", input=json.dumps(request()))
        assert refused.rc in (1, 2) and "EINVAL" in refused.err, refused
        assert refused.out == ""
    assert snapshot(world.q.dir) == before


def test_r3_a_64_byte_job_name_is_legal(world: World) -> None:
    """R-3: 64 bytes is the longest object name; J of exactly 64 bytes is published."""
    base = "b" * (64 - len(SUFFIX))
    done = world.q.run("publish", "--name", base, "-", input=json.dumps(request()))
    assert done.rc == 0, done
    assert done.out == base + SUFFIX + "\n"
    assert (world.q.dir / "pending" / (base + SUFFIX)).is_file()


@needs_root
def test_r3_illegal_space_agent_and_model_names_change_nothing(world: World) -> None:
    """R-3, X-1, A-3: an illegal shared-space or agent name (ending in .d, holding '/'), or a
    model name that is not <provider>/<model>, is EINVAL (a usage error for shared create),
    and the storage root does not change."""
    before = snapshot(world.storage)
    for name in ("bad.d", "x/y"):
        space = world.ctx("shared", "create", name)
        assert space.rc == 2 and "EINVAL" in space.err, space
    for req in (
        {"name": "bad.d", "label": "x_t"},
        {"name": "modelled", "label": "m_t", "model": ["gpt"]},
    ):
        agent = world.ctx("agent", "create", "-", "--user", "nobody", input=json.dumps(req))
        assert agent.rc != 0 and "EINVAL" in agent.err, agent
    assert snapshot(world.storage) == before


# --------------------------------------------------------------------------------------------
# §2 The shared queue


def test_q_init_makes_exactly_the_six_queue_directories(world: World) -> None:
    """§2, X-1: queue init makes shared/<project>/queue/ with exactly inbox pending lease
    claimed done failed (its config is a data file), in a space with tool/ data/ queue/
    agent/; the root ABI keeps its six entries (no root queue/)."""
    made = world.ctx("queue", "init", "--project", "fresh")
    assert made.rc == 0, made
    space = world.storage / "shared" / "fresh"
    subdirs = {p.name for p in (space / "queue").iterdir() if p.is_dir()}
    assert subdirs == QUEUE_SUBDIRS
    assert not any(p.is_dir() for p in (space / "queue").iterdir() if p.name not in QUEUE_SUBDIRS)
    assert {"tool", "data", "queue", "agent"} <= set(os.listdir(space))
    assert root_entries(world.storage) == ROOT_ENTRIES
    again = world.ctx("queue", "init", "--project", "fresh")
    assert again.rc == 0, again


def test_q1_publish_prints_the_name_alone_and_the_request_is_pending(world: World) -> None:
    """Q-1, §2.4: in text mode publish (from - or FILE) prints J alone on its own line and
    nothing else on stdout; the request is pending/J, a regular file holding the JSON object
    given, and nothing stays in inbox/; --json gives JSON, and a --name already ending in
    .req.json is not suffixed twice."""
    req = request(extra_field="kept")
    done = world.q.run("publish", "--name", "first", "-", input=json.dumps(req))
    assert done.rc == 0, done
    assert done.out == "first.req.json\n"
    pending = world.q.dir / "pending" / "first.req.json"
    assert pending.is_file() and not pending.is_symlink()
    assert json.loads(pending.read_text()) == req
    assert world.q.entries("inbox") == set()
    path = world.top / "req.json"
    path.write_text(json.dumps(req))
    unnamed = world.q.run("publish", str(path))
    assert unnamed.rc == 0, unnamed
    assert len(unnamed.lines()) == 1 and unnamed.out.endswith(SUFFIX + "\n")
    assert (world.q.dir / "pending" / unnamed.out.strip()).is_file()
    suffixed = world.q.run("publish", "--json", "--name", "second.req.json", str(path))
    assert suffixed.rc == 0 and "second.req.json" in json.dumps(suffixed.json()), suffixed
    assert (world.q.dir / "pending" / "second.req.json").is_file()


def _evidence(q: QueueCLI, kind: str, job: str) -> None:
    d = q.dir
    if kind == "pending":
        (d / "pending" / job).write_text(json.dumps(request()))
    elif kind == "claimed":
        (d / "claimed" / job).mkdir()
        (d / "claimed" / job / job).write_text(json.dumps(request()))
    elif kind == "empty-claim":
        (d / "claimed" / job).mkdir()
    elif kind == "lease":
        (d / "lease" / job).mkdir()
        (d / "lease" / job / "worker").write_text("{}")
    elif kind in ("done", "failed"):
        (d / kind / job).write_text(json.dumps(request()))
        (d / kind / f"{job}.result").write_text(json.dumps(result(kind)))
    elif kind == "result-only":
        (d / "done" / f"{job}.result").write_text(json.dumps(result()))


def test_q1_publish_never_replaces_evidence(world: World) -> None:
    """Q-1, Q-6: publishing a name that has evidence anywhere (pending, claimed, lease, done,
    failed, a result alone) is refused with EEXIST (exit 1), and every piece of evidence stays
    as it was."""
    kinds = ("pending", "claimed", "empty-claim", "lease", "done", "failed", "result-only")
    for kind in kinds:
        _evidence(world.q, kind, f"{kind}.req.json")
    before = snapshot(world.q.dir)
    for kind in kinds:
        refused = world.q.run("publish", "--name", kind, "-", input=json.dumps(request(new=1)))
        assert refused.rc == 1 and "EEXIST" in refused.err, refused
        assert refused.out == ""
    assert snapshot(world.q.dir) == before


def test_q1_request_size_limit_and_its_config(world: World) -> None:
    """§2.1: requests over 1 MiB are refused with a clear error, nothing published; the limit
    is configurable per queue in queue/config (key=value)."""
    big = json.dumps(request(pad="x" * (1 << 20)))
    refused = world.q.run("publish", "--name", "big", "-", input=big)
    assert refused.rc == 1, refused
    assert re.search(r"E2BIG|EFBIG|too (large|big)|at most", refused.err), refused
    assert world.q.entries("pending") == set() and world.q.entries("inbox") == set()
    config = world.q.dir / "config"
    lines = [ln for ln in config.read_text().splitlines() if not ln.startswith("max_request")]
    config.write_text("\n".join([*lines, "max_request_bytes=300", ""]))
    small = json.dumps(request())
    assert len(small) < 300
    assert world.q.run("publish", "--name", "small", "-", input=small).rc == 0
    medium = json.dumps(request(pad="y" * 400))
    refused = world.q.run("publish", "--name", "medium", "-", input=medium)
    assert refused.rc == 1, refused
    assert world.q.entries("pending") == {"small.req.json"}
    assert world.q.entries("inbox") == set()


def test_q1_a_request_that_is_not_one_json_object_is_refused(world: World) -> None:
    """§2.1: a request file holds one JSON object; anything else is refused with an errno on
    stderr, and nothing is published or left behind."""
    for text in ("[1, 2]", "not json", "{"):
        refused = world.q.run("publish", "--name", "odd", "-", input=text)
        assert refused.rc in (1, 2) and refused.out == "", refused
        assert re.search(r"ctx: E[A-Z]+:", refused.err), refused
    assert world.q.entries("pending") == set() and world.q.entries("inbox") == set()


def test_q1_batch_prints_each_name_and_a_bad_line_publishes_nothing(world: World) -> None:
    """§2.4: publish --batch takes one request per line and prints each J on its own line;
    one bad line refuses the whole batch (ctx queue publish --help), nothing published."""
    lines = "".join(json.dumps(request(n=i)) + "\n" for i in range(3))
    done = world.q.run("publish", "--batch", "-", input=lines)
    assert done.rc == 0, done
    names = done.lines()
    assert len(names) == 3 and len(set(names)) == 3
    assert world.q.entries("pending") == set(names)
    before = snapshot(world.q.dir)
    bad = json.dumps(request()) + "\nnot json\n"
    refused = world.q.run("publish", "--batch", "-", input=bad)
    assert refused.rc != 0 and refused.out == "", refused
    assert snapshot(world.q.dir) == before


def test_q2_q3_claim_prints_the_name_and_leaves_claim_and_lease(world: World) -> None:
    """Q-2, Q-3, §2.4: claim prints J alone; afterwards claimed/J/J holds the request,
    lease/J/worker exists and pending/J is gone; the lease holder is the calling process."""
    req = request(tag="claim-me")
    job = world.q.drop("claim-me", req)
    done = world.q.run("claim", "--worker", "w-7", "--ttl", "120")
    assert done.rc == 0, done
    assert done.out == job + "\n"
    assert not (world.q.dir / "pending" / job).exists()
    assert json.loads((world.q.dir / "claimed" / job / job).read_text()) == req
    lease = world.q.lease(job)
    assert lease["worker"] == "w-7"
    assert lease["pid"] == os.getpid()
    assert lease["host"] == socket.gethostname()
    assert lease["boot_id"] == boot_id()
    assert lease["pid_ns"] == os.stat("/proc/self/ns/pid").st_ino
    claimed_at, expires_at = rfc3339(lease["claimed_at"]), rfc3339(lease["expires_at"])
    assert timedelta(seconds=110) < expires_at - claimed_at < timedelta(seconds=130)


def test_q2_claim_json_holds_name_and_request(world: World) -> None:
    """§2.4: with --json, claim prints one object with at least name and request; on an
    empty queue claim prints nothing and exits 3, in text and JSON mode, changing nothing."""
    req = request(tag="json")
    job = world.q.drop("as-json", req)
    done = world.q.run("claim", "--json")
    assert done.rc == 0, done
    document = done.json()
    assert document["name"] == job and document["request"] == req
    before = snapshot(world.q.dir)
    for extra in ((), ("--json",)):
        empty = world.q.run("claim", *extra)
        assert empty.rc == 3 and empty.out == "", empty
    assert snapshot(world.q.dir) == before


def test_q9_claims_take_the_oldest_pending_job_first(world: World) -> None:
    """Q-9 [decision]: claims take the oldest pending job first by publish time, whatever
    the names' order."""
    for name in ("zzz", "mmm", "aaa"):
        world.q.publish(name=name)
    order = [world.q.claim() for _ in range(3)]
    assert order == ["zzz.req.json", "mmm.req.json", "aaa.req.json"]


def test_i4_concurrent_claims_take_each_job_once(world: World) -> None:
    """Q-2, I-4: many claims at once: each job is claimed by exactly one of them, the others
    lose (exit 3, not an error), and every claimed job has its claim and lease."""
    jobs = {world.q.drop(f"c{i}") for i in range(3)}
    env = clean_env(CTX_STORAGE=str(world.storage))
    with live_process() as holder:
        argv = [*CTX_ARGV, "queue", "claim", "--project", "proj", "--pid", str(holder.pid)]
        procs = [
            subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for _ in range(6)
        ]
        outcomes = [(p.wait(timeout=60), p.communicate()) for p in procs]
        winners = [out.decode().strip() for rc, (out, _) in outcomes if rc == 0]
        assert sorted(winners) == sorted(jobs), outcomes
        assert all(rc in (0, 3) for rc, _ in outcomes), outcomes
        assert all(world.q.state(job) == "claimed" for job in jobs)


def _at_once(world: World, commands: list[tuple[tuple[str, ...], str]]) -> list[int]:
    """Start every ``ctx queue`` command of ``commands`` (argv after ``queue``, stdin) at
    once; their exit statuses."""
    procs = []
    for args, stdin in commands:
        proc = subprocess.Popen([*CTX_ARGV, "queue", *args], env=world.env,
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)  # fmt: skip
        procs.append(proc)
        proc.stdin.write(stdin.encode())
    for proc in procs:
        proc.stdin.close()
    return [proc.wait(timeout=60) for proc in procs]


def test_q1_i1_concurrent_publishes_of_one_name_leave_exactly_one(world: World) -> None:
    """Q-1, I-1, I-2: publishes of one name at once: exactly one succeeds, the others are
    refused (exit 1); pending/J is one of the requests, whole; nothing stays in inbox/."""
    bodies = [json.dumps(request(v=i)) for i in range(6)]
    publish = ("publish", "--project", "proj", "--name", "race", "-")
    codes = _at_once(world, [(publish, body) for body in bodies])
    assert sorted(codes) == [0] + [1] * 5, codes
    assert world.q.entries("pending") == {"race.req.json"}
    stored = json.loads((world.q.dir / "pending" / "race.req.json").read_text())
    assert stored in [json.loads(body) for body in bodies]
    assert world.q.entries("inbox") == set()


def test_q4_concurrent_finishes_leave_exactly_one_terminal_pair(world: World) -> None:
    """Q-4, Q-6, I-3: finish --ok and finish --error of one claimed job at once: exactly one
    succeeds, J ends in exactly one terminal state with its one result, claim and lease
    gone."""
    job = world.q.drop("contested")
    world.q.claim()
    finish = ("finish", "--project", "proj", job)
    commands = [((*finish, flag, "-"), '"x"') for flag in ("--ok", "--error") * 3]
    codes = _at_once(world, commands)
    assert sorted(codes) == [0] + [1] * 5, codes
    world.q.only_result(job)
    assert world.q.entries("claimed") == set() and world.q.entries("lease") == set()


def test_q4_finish_ok_makes_the_done_pair_and_clears_claim_and_lease(world: World) -> None:
    """Q-4, §2.1: finish --ok leaves done/J and done/J.result (status ok, output, worker,
    started, finished as RFC 3339 times) and removes lease/J and claimed/J; finish --error
    (J given without .req.json) leaves the failed/ pair with status error; the queue is then
    settled (recover changes nothing)."""
    req = request(tag="finish")
    job = world.q.drop("fin", req)
    world.q.claim()
    done = world.q.run("finish", job, "--ok", "-", input=json.dumps({"answer": 42}))
    assert done.rc == 0, done
    state, res = world.q.only_result(job)
    assert state == "done"
    assert json.loads((world.q.dir / "done" / job).read_text()) == req
    assert res["status"] == "ok" and res["output"] == {"answer": 42}
    assert {"worker", "started", "finished"} <= set(res)
    assert rfc3339(res["started"]) <= rfc3339(res["finished"])
    assert world.q.entries("claimed") == set() and world.q.entries("lease") == set()
    broken = world.q.drop("broken")
    world.q.claim()
    failed = world.q.run("finish", "broken", "--error", "-", input='{"why": "no"}')
    assert failed.rc == 0, failed
    state, res = world.q.only_result(broken)
    assert state == "failed" and res["status"] == "error" and res["output"] == {"why": "no"}
    world.q.assert_settled()


def test_q4_finish_of_a_job_not_claimed_changes_nothing(world: World) -> None:
    """Q-4, §2.4: finishing a pending job, or one finished already, is refused (exit 1) and
    changes nothing."""
    world.q.drop("waiting")
    before = snapshot(world.q.dir)
    refused = world.q.run("finish", "waiting", "--ok", "-", input="{}")
    assert refused.rc == 1, refused
    assert snapshot(world.q.dir) == before
    world.q.terminal("over")
    before = snapshot(world.q.dir)
    refused = world.q.run("finish", "over", "--error", "-", input="{}")
    assert refused.rc == 1 and "EEXIST" in refused.err, refused
    assert snapshot(world.q.dir) == before


def test_q6_finish_never_overwrites_a_result(world: World) -> None:
    """Q-4, Q-6: finish moves the result into place without replacing; an existing
    done/J.result stays byte for byte, finish reports the refusal (exit 1)."""
    job = world.q.drop("twice")
    world.q.claim()
    earlier = world.q.dir / "done" / f"{job}.result"
    earlier.write_text(json.dumps(result(output="EARLIER")))
    original = earlier.read_bytes()
    refused = world.q.run("finish", job, "--ok", "-", input='"LATER"')
    assert refused.rc == 1, refused
    assert earlier.read_bytes() == original
    assert not (world.q.dir / "failed" / f"{job}.result").exists()
    assert (world.q.dir / "claimed" / job / job).is_file()


def test_q3_renew_extends_only_the_callers_own_lease(world: World) -> None:
    """Q-3, §2.4: renew extends the caller's own lease (expires_at later); a renew by another
    process is refused and the lease stays byte for byte (no other process renews)."""
    mine = world.q.drop("mine")
    world.q.claim("--ttl", "60")
    first = world.q.lease(mine)
    renewed = world.q.run("renew", mine, "--ttl", "600")
    assert renewed.rc == 0, renewed
    after = world.q.lease(mine)
    assert rfc3339(after["expires_at"]) > rfc3339(first["expires_at"])
    assert after["pid"] == first["pid"]
    theirs = world.q.drop("theirs")
    with live_process() as holder:
        world.q.claim("--pid", str(holder.pid))
        lease = world.q.dir / "lease" / theirs / "worker"
        before = lease.read_bytes()
        refused = world.q.run("renew", theirs, "--ttl", "600")
        assert refused.rc == 1 and "EACCES" in refused.err, refused
        assert lease.read_bytes() == before


def test_q5_i5_recover_requeues_a_dead_holder_and_converges(world: World) -> None:
    """Q-5, I-5: a claim whose holder is dead goes back to pending (claim and lease removed);
    recover exits 0, and a second run changes nothing."""
    req = request(tag="orphaned")
    job = world.q.drop("orphaned", req)
    world.q.claim("--pid", str(dead_pid()))
    done = world.q.run("recover")
    assert done.rc == 0, done
    assert world.q.state(job) == "pending"
    assert json.loads((world.q.dir / "pending" / job).read_text()) == req
    assert world.q.entries("claimed") == set() and world.q.entries("lease") == set()
    before = snapshot(world.q.dir)
    again = world.q.run("recover", "--reconcile", "--json")
    assert again.rc == 0 and again.json()["requeued"] == [], again
    assert snapshot(world.q.dir) == before


def test_q5_recover_never_touches_a_live_holder(world: World) -> None:
    """Q-5, Q-6: neither recover nor recover --reconcile touches a job whose lease holder is
    alive (here: this process, the caller of claim)."""
    job = world.q.drop("busy")
    world.q.claim()
    before = snapshot(world.q.dir)
    for args in ((), ("--reconcile",)):
        done = world.q.run("recover", *args)
        assert done.rc == 0, done
        assert snapshot(world.q.dir) == before
    assert world.q.state(job) == "claimed"


def _rewrite_lease(q: QueueCLI, job: str, **changes) -> None:
    lease = q.lease(job)
    lease.update(changes)
    q.write_lease(job, lease)


FAR_FUTURE = "2999-01-01T00:00:00Z"
LONG_AGO = "2000-01-01T00:00:00Z"
OTHER_BOOT = "00000000-0000-4000-8000-000000000001"


def test_q5_a_pid_alone_is_never_proof_but_a_reboot_or_expiry_is(world: World) -> None:
    """Q-5, N-1: a lease taken on another host, or in another pid namespace of this boot,
    whose pid is not running here, is not proof that its holder is gone while the lease has
    not expired: recover leaves it; once expired, recover requeues it.  The same host with
    another boot id is proof, even with an unexpired lease."""
    jobs = {where: world.q.drop(where) for where in ("host", "pidns", "reboot")}
    for _ in jobs:
        world.q.claim("--pid", str(dead_pid()))
    elsewhere = {"host": "elsewhere.invalid", "boot_id": OTHER_BOOT, "pid_ns": 1}
    if "machine_id" in world.q.lease(jobs["host"]):
        elsewhere["machine_id"] = "0" * 32
    _rewrite_lease(world.q, jobs["host"], expires_at=FAR_FUTURE, **elsewhere)
    _rewrite_lease(world.q, jobs["pidns"], expires_at=FAR_FUTURE, pid_ns=1)
    _rewrite_lease(world.q, jobs["reboot"], expires_at=FAR_FUTURE, boot_id=OTHER_BOOT)
    done = world.q.run("recover")
    assert done.rc == 0, done
    assert world.q.state(jobs["reboot"]) == "pending"
    before = snapshot(world.q.dir)
    again = world.q.run("recover", "--reconcile")
    assert again.rc == 0, again
    assert snapshot(world.q.dir) == before
    assert world.q.state(jobs["host"]) == world.q.state(jobs["pidns"]) == "claimed"
    for where in ("host", "pidns"):
        _rewrite_lease(world.q, jobs[where], expires_at=LONG_AGO)
    done = world.q.run("recover")
    assert done.rc == 0, done
    assert world.q.entries("pending") == set(jobs.values())


def test_q5_a_live_pid_with_another_start_time_is_gone(world: World) -> None:
    """Q-5, Q-3, §2.4: claim --pid PID makes PID the lease holder; same boot and pid
    namespace, the pid running with the start time the lease recorded: alive, left alone;
    with another start time: provably gone, the job is requeued."""
    job = world.q.drop("reused")
    with live_process() as holder:
        world.q.claim("--pid", str(holder.pid))
        assert world.q.lease(job)["pid"] == holder.pid
        started = psutil.Process(holder.pid).create_time()
        lease = world.q.lease(job)
        keys = [k for k, v in lease.items() if isinstance(v, float) and abs(v - started) < 1]
        assert len(keys) == 1, ("the lease records the holder's start time", lease)
        kept = world.q.run("recover")
        assert kept.rc == 0 and world.q.state(job) == "claimed", kept
        _rewrite_lease(world.q, job, **{keys[0]: started - 1000.0})
        done = world.q.run("recover")
        assert done.rc == 0, done
        assert world.q.state(job) == "pending"


def test_q5_a_dead_claim_with_pending_evidence_is_not_requeued(world: World) -> None:
    """Q-5, Q-6: a claim whose holder is dead goes back to pending only when there is no
    pending or terminal evidence for J: with pending/J (another request) or done/J present,
    recover and --reconcile report a conflict (exit 1) and change nothing."""
    for name, extra in (("twice", "pending"), ("after", "done")):
        job = world.q.drop(name)
        world.q.claim("--pid", str(dead_pid()))
        (world.q.dir / extra / job).write_text(json.dumps(request(other=True)))
    before = snapshot(world.q.dir)
    for args in ((), ("--reconcile",)):
        done = world.q.run("recover", *args)
        assert done.rc == 1, done
        assert snapshot(world.q.dir) == before


def test_q6_claim_without_lease_needs_reconcile(world: World) -> None:
    """Q-6, §2.4: claimed/J/J without lease/J/worker is an incomplete pair: plain recover,
    and --reconcile --dry-run, report it and change nothing (plain: exit 1); recover
    --reconcile puts it back to pending, exit 0."""
    job = "nolease.req.json"
    _evidence(world.q, "claimed", job)
    before = snapshot(world.q.dir)
    dry = world.q.run("recover", "--reconcile", "--dry-run")
    assert job in dry.out, dry
    assert snapshot(world.q.dir) == before
    plain = world.q.run("recover")
    assert plain.rc == 1 and job in plain.out + plain.err, plain
    assert snapshot(world.q.dir) == before
    fixed = world.q.run("recover", "--reconcile")
    assert fixed.rc == 0, fixed
    assert world.q.state(job) == "pending"
    assert world.q.entries("claimed") == set()


def test_q6_a_result_with_its_claim_rolls_forward(world: World) -> None:
    """Q-6: done/J.result with claimed/J/J (a finish cut short, holder gone) rolls forward
    under --reconcile: done/J appears beside the result, which stays as it was; claim and
    lease are cleaned.  Plain recover changes nothing (exit 1)."""
    req = request(tag="half")
    job = world.q.drop("half", req)
    world.q.claim("--pid", str(dead_pid()))
    res = world.q.dir / "done" / f"{job}.result"
    res.write_text(json.dumps(result(output="RAN")))
    proof = res.read_bytes()
    before = snapshot(world.q.dir)
    plain = world.q.run("recover")
    assert plain.rc == 1, plain
    assert snapshot(world.q.dir) == before
    fixed = world.q.run("recover", "--reconcile")
    assert fixed.rc == 0, fixed
    state, _ = world.q.only_result(job)
    assert state == "done"
    assert res.read_bytes() == proof
    assert json.loads((world.q.dir / "done" / job).read_text()) == req
    assert world.q.entries("claimed") == set() and world.q.entries("lease") == set()
    assert world.q.entries("pending") == set()


def test_q6_orphan_claim_and_lease_directories_are_removed(world: World) -> None:
    """Q-6: an empty claimed/J and an orphan lease/J with no request anywhere in claimed are
    removed by --reconcile only."""
    _evidence(world.q, "empty-claim", "empty.req.json")
    lease = world.q.dir / "lease" / "orphan.req.json"
    lease.mkdir()
    (lease / "worker").write_text(json.dumps({"pid": dead_pid(), "host": "x"}))
    before = snapshot(world.q.dir)
    plain = world.q.run("recover")
    assert plain.rc == 1, plain
    assert snapshot(world.q.dir) == before
    fixed = world.q.run("recover", "--reconcile")
    assert fixed.rc == 0, fixed
    assert world.q.entries("claimed") == set() and world.q.entries("lease") == set()


def test_q6_stray_inbox_temps_older_than_the_grace_period_are_removed(world: World) -> None:
    """Q-6, §2.4: --reconcile removes temp files in inbox/ older than --grace SECONDS and
    keeps younger ones; plain recover removes none."""
    old = world.q.dir / "inbox" / "old.tmp"
    young = world.q.dir / "inbox" / "young.tmp"
    old.write_text("{")
    young.write_text("{")
    age(old, 3600)
    plain = world.q.run("recover", "--grace", "600")
    assert plain.rc == 0 and world.q.entries("inbox") == {"old.tmp", "young.tmp"}, plain
    done = world.q.run("recover", "--reconcile", "--grace", "600")
    assert done.rc == 0, done
    assert world.q.entries("inbox") == {"young.tmp"}


def test_q6_conflicts_are_reported_with_their_evidence_and_never_resolved(world: World) -> None:
    """Q-6, §2.4: J both pending and done, and a claim with two results (done and failed),
    are conflicts: recover and recover --reconcile report them with every piece of evidence,
    change nothing and exit 1; status and show exit 1 too."""
    job = "both.req.json"
    _evidence(world.q, "pending", job)
    _evidence(world.q, "done", job)
    two = world.q.drop("tworesults")
    world.q.claim("--pid", str(dead_pid()))
    for state in ("done", "failed"):
        (world.q.dir / state / f"{two}.result").write_text(json.dumps(result(state)))
    before = snapshot(world.q.dir)
    for args in ((), ("--reconcile",)):
        done = world.q.run("recover", *args)
        assert done.rc == 1, done
        said = done.out + done.err
        for piece in (f"pending/{job}", f"done/{job}", f"done/{job}.result"):
            assert piece in said, (piece, done)
        for piece in (f"done/{two}.result", f"failed/{two}.result"):
            assert piece in said, (piece, done)
        assert snapshot(world.q.dir) == before
    status = world.q.run("status", "--json")
    assert status.rc == 1 and status.json()["conflict"] == 2, status
    shown = world.q.run("show", job)
    assert shown.rc == 1, shown


def test_q8_entries_that_are_not_jobs_are_listed_ignored_and_never_moved(world: World) -> None:
    """Q-8: a symlink, a dot-file, an illegal name, a directory and a FIFO in pending/ are not
    jobs: status lists each as ignored with a reason, claim finds nothing (exit 3), recover
    leaves them, and the symlink's target is never touched."""
    outside = world.dir("outside")
    target = outside / "secret.req.json"
    target.write_text(json.dumps(request(tag="outside")))
    pending = world.q.dir / "pending"
    (pending / "link.req.json").symlink_to(target)
    (pending / ".dot.req.json").write_text(json.dumps(request()))
    (pending / "bad name.req.json").write_text(json.dumps(request()))
    (pending / "dir.req.json").mkdir()
    os.mkfifo(pending / "fifo.req.json")
    before = snapshot(world.storage)
    status = world.q.run("status", "--json")
    assert status.rc == 0, status
    ignored = {entry["path"]: entry["reason"] for entry in status.json()["ignored"]}
    for name in ("link", ".dot", "bad name", "dir", "fifo"):
        path = f"pending/{name}.req.json"
        assert ignored.get(path), (path, ignored)
    assert status.json()["pending"] == 0
    text = world.q.run("status")
    assert "ignored" in text.out and "link.req.json" in text.out, text
    assert world.q.run("claim").rc == 3
    world.q.run("recover", "--reconcile")
    assert snapshot(world.storage) == before
    assert snapshot(outside) == {"secret.req.json": ("file", target.read_bytes())}


def test_q8_a_symlinked_claim_directory_is_not_followed(world: World) -> None:
    """Q-8: claimed/J swapped for a symlink to a directory outside the queue is never
    followed: recover --reconcile does not bring the outside request into pending/, and the
    outside directory stays as it was."""
    job = world.q.drop("swapped")
    world.q.claim("--pid", str(dead_pid()))
    outside = world.dir("outside")
    shutil.move(str(world.q.dir / "claimed" / job), str(outside / job))
    (world.q.dir / "claimed" / job).symlink_to(outside / job)
    before = snapshot(outside)
    world.q.run("recover", "--reconcile")
    assert snapshot(outside) == before
    assert world.q.entries("pending") == set()
    assert (world.q.dir / "claimed" / job).is_symlink()


def test_q8_a_state_directory_swapped_for_a_symlink_redirects_nothing(world: World) -> None:
    """Q-8: a state directory (pending/, claimed/, done/, inbox/) swapped for a symlink to an
    outside directory redirects nothing: claim takes nothing from there and makes nothing
    there, finish and publish write nothing there, and the jobs stay where they were."""
    claimed = world.q.drop("held")
    world.q.claim()
    waiting = world.q.drop("waiting")
    outside = world.dir("outside")
    (outside / "lure.req.json").write_text(json.dumps(request(tag="lure")))
    expected = snapshot(outside)
    attempts = {
        "pending": [("claim",), ("publish", "--name", "into", "-")],
        "claimed": [("claim",)],
        "done": [("finish", claimed, "--ok", "-")],
        "inbox": [("publish", "--name", "into", "-")],
    }
    for sub, commands in attempts.items():
        real = world.q.dir / sub
        aside = world.q.dir / f"{sub}.real"
        real.rename(aside)
        real.symlink_to(outside)
        try:
            for command in commands:
                done = world.q.run(*command, input=json.dumps(request()))
                assert done.rc not in (0, 3) and done.out == "", (sub, done)
                assert snapshot(outside) == expected, sub
        finally:
            real.unlink()
            aside.rename(real)
    assert world.q.state(claimed) == "claimed" and world.q.state(waiting) == "pending"
    assert world.q.entries("done") == set() and world.q.entries("inbox") == set()


def test_q_project_may_name_a_queue_path(world: World) -> None:
    """§2.4: --project NAME or a queue path: a value holding '/' is the queue directory."""
    path = str(world.q.dir)
    env = clean_env(CTX_STORAGE=str(world.storage))
    done = ctx_run("queue", "publish", "--project", path, "--name", "bypath", "-",
                   input=json.dumps(request()), env=env)  # fmt: skip
    assert done.rc == 0 and done.out == "bypath.req.json\n", done
    listed = ctx_run("queue", "list", "--project", path, "--state", "pending", env=env)
    assert listed.rc == 0 and listed.lines() == ["bypath.req.json"], listed


def test_usage_errors_exit_2_and_change_nothing(world: World) -> None:
    """§2.4, P-8: a usage error (no project, both --ok and --error, a policy query without
    --policy) is exit 2, with nothing on stdout and nothing changed."""
    env = clean_env(CTX_STORAGE=str(world.storage))
    before = snapshot(world.storage)
    for args in (
        ("queue", "claim"),
        ("queue", "finish", "--project", "proj", "x", "--ok", "--error"),
        ("policy", "query", "a_t", "tool:x", "execute"),
    ):
        done = ctx_run(*args, env=env)
        assert done.rc == 2 and done.out == "", done
    assert snapshot(world.storage) == before


# --------------------------------------------------------------------------------------------
# §3 Workers


@needs_root
def test_w1_w2_worker_drains_to_done_and_failed(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """W-1, W-2, §2.4: ctx queue work runs each job's tool as the agent through the
    authorization chain, finishes done/ on success and failed/ with the reason on denial;
    --max-jobs 1 exits after one job, --drain once the queue is empty."""
    data = world.dir("data")
    (data / "hello.txt").write_text("hello from data\n")
    world.agent(unprivileged_user, "wk", tools=("fs.read", "shell.exec"),
                tool_layer=("fs.read",), mount=[[str(data), "/data", "ro"]])  # fmt: skip
    ok = world.q.publish({"tool": "fs.read", "input": {"path": "/data/hello.txt"}}, name="ok")
    denied = world.q.publish({"tool": "shell.exec", "input": {"cmd": "true"}}, name="denied")
    one = world.q.run("work", "--max-jobs", "1", "--agent", "wk", timeout=120)
    assert one.rc == 0, one
    assert world.q.entries("pending") == {denied}
    run = world.q.run("work", "--drain", "--agent", "wk", timeout=120)
    assert run.rc == 0, run
    state, res = world.q.only_result(ok)
    assert state == "done" and "hello from data" in json.dumps(res["output"]), res
    state, res = world.q.only_result(denied)
    assert state == "failed" and "EACCES" in json.dumps(res), res
    for sub in ("pending", "claimed", "lease", "inbox"):
        assert world.q.entries(sub) == set(), sub
    assert root_entries(world.storage) == ROOT_ENTRIES


@needs_root
def test_w4_a_job_over_its_timeout_is_killed_and_failed(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """W-4: SIGTERM to a worker lets the running job finish, then the worker exits cleanly
    (exit 0, the job done); a job that exceeds the per-job timeout is killed with its process
    group and finished as failed, the reason recorded."""
    work = world.dir("work", 0o777)
    world.agent(unprivileged_user, "slow", tools=("shell.exec",),
                mount=[[str(work), "/work", "rw"]])  # fmt: skip
    running = world.q.publish(
        {"tool": "shell.exec", "input": {"cmd": "sleep 0.5; echo finished", "cwd": "/work"}}, "term"
    )
    argv = [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", "slow"]
    worker = subprocess.Popen(argv, env=world.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert wait_for(lambda: (world.q.dir / "lease" / running).exists(), 30)
        worker.terminate()
        worker.communicate(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0
    state, res = world.q.only_result(running)
    assert state == "done" and "finished" in json.dumps(res["output"]), res
    cmd = "sleep 120 & echo $! > child; wait"
    job = world.q.publish({"tool": "shell.exec", "input": {"cmd": cmd, "cwd": "/work"}}, "slow")
    run = world.q.run("work", "--drain", "--agent", "slow", "--timeout", "1", timeout=120)
    assert run.rc == 0, run
    state, res = world.q.only_result(job)
    assert state == "failed" and re.search(r"time|ETIME", json.dumps(res)), res
    child = int((work / "child").read_text())
    assert wait_for(lambda: not alive(child), 30), "the job's process group was not killed"


@needs_root
def test_w3_two_workers_execute_each_job_once(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """W-3, I-4: two workers draining one queue at once finish every job exactly once."""
    data = world.dir("data")
    (data / "x.txt").write_text("x\n")
    world.agent(unprivileged_user, "pair", tools=("fs.read",),
                mount=[[str(data), "/data", "ro"]])  # fmt: skip
    jobs = {
        world.q.publish({"tool": "fs.read", "input": {"path": "/data/x.txt"}}, name=f"j{i}")
        for i in range(4)
    }
    env = clean_env(CTX_STORAGE=str(world.storage))
    argv = [*CTX_ARGV, "queue", "work", "--project", "proj", "--drain", "--agent", "pair"]
    procs = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]  # fmt: skip
    for proc in procs:
        proc.communicate(timeout=120)
        assert proc.returncode == 0
    for job in jobs:
        assert world.q.only_result(job)[0] == "done"
    events = world.storage / "home" / str(unprivileged_user.uid) / "agent" / "pair" / "session"
    calls = [
        json.loads(line)
        for path in events.glob("*/events.jsonl")
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    assert len([e for e in calls if e["type"] == "tool_call"]) == len(jobs)


# --------------------------------------------------------------------------------------------
# §4 Sessions, logs and events


EVENT_KEYS = {"ts", "type", "agent", "session", "object", "status"}


@needs_root
def test_s1_s2_t7_a_tool_call_is_recorded_in_the_home_session_and_the_tool_log(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """S-1, S-2, S-3, S-5, T-7: a call made as agent A is recorded in
    home/<uid>/agent/A/session/default/events.jsonl as tool_call and tool_result events of
    the minimal shape, one JSON object a line, and in tool/<name>.d/log; no root audit/;
    concurrent calls in one session never interleave inside a line."""
    data = world.dir("data")
    (data / "f.txt").write_text("content\n")
    world.agent(unprivileged_user, "coder", tools=("fs.read",),
                mount=[[str(data), "/data", "ro"]])  # fmt: skip
    log = world.storage / "tool" / "fs.read.d" / "log"
    log_before = log.read_bytes()
    ran = world.ctx("run", "--agent", "coder", "fs.read", "/data/f.txt")
    assert ran.rc == 0 and ran.out == "content\n", ran
    events_path = (
        world.storage / "home" / str(unprivileged_user.uid) / "agent" / "coder" / "session"
        / "default" / "events.jsonl"
    )  # fmt: skip
    lines = events_path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    events = [json.loads(line) for line in lines[:-1]]
    assert all(isinstance(e, dict) and set(e) >= EVENT_KEYS for e in events), events
    assert [e["type"] for e in events] == ["tool_call", "tool_result"]
    for event in events:
        assert event["agent"] == "coder" and event["session"] == "default"
        assert event["object"] == "tool/fs.read"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", event["ts"]), event
    assert events[-1]["status"] == "ok"
    assert len(log.read_bytes()) > len(log_before)
    argv = [*CTX_ARGV, "run", "--agent", "coder", "--session", "many", "fs.read", "/data/f.txt"]
    procs = [subprocess.Popen(argv, env=world.env, stdout=subprocess.DEVNULL) for _ in range(6)]
    assert [proc.wait(timeout=60) for proc in procs] == [0] * 6
    many = (events_path.parent.parent / "many" / "events.jsonl").read_bytes()
    assert many.endswith(b"\n")
    types = [json.loads(line)["type"] for line in many.splitlines()]
    assert sorted(types) == ["tool_call"] * 6 + ["tool_result"] * 6
    assert root_entries(world.storage) == ROOT_ENTRIES


@needs_root
def test_s1_a_shared_session_lives_in_the_space(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """S-1, S-6, X-1: a call recorded in shared space P goes to
    shared/P/agent/A/session/S/events.jsonl, not to the home; an agent of the same uid and
    group whose policy grants no shared:P is refused (EACCES) and leaves no session there."""
    made = world.ctx("shared", "create", "team", "--group", str(unprivileged_user.gid))
    assert made.rc == 0, made
    data = world.dir("data")
    (data / "f.txt").write_text("team\n")
    world.agent(unprivileged_user, "member", tools=("fs.read",),
                shared={"team": ["read", "write"]},
                mount=[[str(data), "/data", "ro"]])  # fmt: skip
    ran = world.ctx("run", "--agent", "member", "--project", "team", "--session", "s1",
                    "fs.read", "/data/f.txt")  # fmt: skip
    assert ran.rc == 0, ran
    path = world.storage / "shared" / "team" / "agent" / "member" / "session" / "s1"
    events = [json.loads(line) for line in (path / "events.jsonl").read_text().splitlines()]
    assert [e["type"] for e in events] == ["tool_call", "tool_result"]
    assert not (world.storage / "home" / str(unprivileged_user.uid) / "agent" / "member"
                / "session" / "s1").exists()  # fmt: skip
    world.agent(unprivileged_user, "stranger", tools=("fs.read",),
                mount=[[str(data), "/data", "ro"]])  # fmt: skip
    refused = world.ctx("run", "--agent", "stranger", "--project", "team", "fs.read",
                        "/data/f.txt")  # fmt: skip
    assert refused.rc != 0 and "EACCES" in refused.err, refused
    assert not (world.storage / "shared" / "team" / "agent" / "stranger").exists()


@needs_root
def test_s5_a_torn_last_line_is_skipped_and_repaired(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """S-5: readers ignore a torn last line and ctx session repair truncates it; complete
    lines are never touched and a second repair has nothing to do."""
    data = world.dir("data")
    (data / "f.txt").write_text("x\n")
    world.agent(unprivileged_user, "torn", tools=("fs.read",),
                mount=[[str(data), "/data", "ro"]])  # fmt: skip
    assert world.ctx("run", "--agent", "torn", "fs.read", "/data/f.txt").rc == 0
    events = (
        world.storage / "home" / str(unprivileged_user.uid) / "agent" / "torn" / "session"
        / "default" / "events.jsonl"
    )  # fmt: skip
    whole = events.read_bytes()
    with events.open("ab") as f:
        f.write(b'{"ts":"2026-06-22T12:00')
    shown = world.ctx("session", "show", "torn", "--json")
    assert shown.rc == 0, shown
    assert [json.loads(line) for line in shown.lines()] == [
        json.loads(line) for line in whole.splitlines()
    ]
    repaired = world.ctx("session", "repair", "torn", "--json")
    assert repaired.rc == 0 and repaired.json()["truncated_bytes"] > 0, repaired
    assert events.read_bytes() == whole
    again = world.ctx("session", "repair", "torn", "--json")
    assert again.rc == 0 and again.json()["truncated_bytes"] == 0, again


# --------------------------------------------------------------------------------------------
# §5 Policy v0


ALL_PAIRS = [
    ("tool", "fs.read", "execute"),
    ("model", "openai/gpt-5", "use"),
    ("shared", "proj", "read"),
    ("shared", "proj", "write"),
    ("session", "default", "read"),
    ("session", "default", "write"),
    ("session", "default", "resume"),
    ("mount", "ctx", "read"),
    ("mount", "ctx", "write"),
    ("agent", "review-1", "create"),
    ("agent", "review-1", "start"),
    ("agent", "review-1", "stop"),
    ("agent", "review-1", "read"),
    ("agent", "review-1", "write"),
    ("network", "default", "connect"),
]


def test_p1_p3_every_class_and_permission_of_the_table_is_valid(world: World) -> None:
    """P-1, P-3, P-4, P-7: every class/permission pair of the table is a valid rule; blank
    lines and lines whose first non-blank character is # are ignored; policy check exits 0
    and says nothing on stderr."""
    lines = ["# a comment", "", "   # an indented comment", "\t"]
    lines += [f"allow coder_t {cls}:{name} {perm}" for cls, name, perm in ALL_PAIRS]
    path = world.top / "policy"
    path.write_text("\n".join(lines) + "\n")
    done = ctx_run("policy", "check", path)
    assert done.rc == 0 and done.err == "", done


def test_p2_p8_each_invalid_line_is_reported_as_file_line_einval(world: World) -> None:
    """P-2, P-3, P-4, P-8: policy check FILE... exits 1 and prints one
    `FILE:LINE: EINVAL: <reason>` line on stderr for each invalid line (glob, deny, unknown
    class, unknown permission, a permission of another class), and none for the valid lines
    or the valid file given with it."""
    lines = [
        "allow coder_t tool:fs.read execute",  # 1 valid
        "allow coder_t agent:* create",  # 2 glob (the SPEC's own example)
        "deny coder_t tool:fs.read execute",  # 3 no deny
        "allow coder_t widget:x read",  # 4 unknown class
        "allow coder_t tool:fs.read launch",  # 5 unknown permission
        "",  # 6 blank
        "allow coder_t tool:fs.read read",  # 7 permission of another class
        "# allow coder_t agent:* create",  # 8 comment
        "allow coder_t network:default connect",  # 9 valid
    ]
    path = world.top / "bad.policy"
    path.write_text("\n".join(lines) + "\n")
    valid = world.top / "good.policy"
    valid.write_text("allow coder_t tool:fs.read execute\n")
    done = ctx_run("policy", "check", valid, path)
    assert done.rc == 1, done
    errors = [line for line in done.err.splitlines() if line.strip()]
    assert len(errors) == 5, done
    for line, number in zip(errors, (2, 3, 4, 5, 7), strict=True):
        assert line.startswith(f"{path}:{number}: EINVAL: ") and len(line) > len(
            f"{path}:{number}: EINVAL: "
        ), line


def test_p6_p8_query_needs_every_policy_to_allow(world: World) -> None:
    """P-6, P-8: policy query prints allow (exit 0) only when every --policy holds the rule,
    else deny (exit 1); a malformed query or policy is exit 2 with EINVAL."""
    agent = world.top / "agent.policy"
    tool = world.top / "tool.policy"
    empty = world.top / "empty.policy"
    agent.write_text("allow coder_t tool:fs.read execute\n")
    tool.write_text("# tool layer\nallow coder_t tool:fs.read execute\n")
    empty.write_text("")
    both = ["--policy", agent, "--policy", tool]
    allowed = ctx_run("policy", "query", *both, "coder_t", "tool:fs.read", "execute")
    assert allowed.rc == 0 and allowed.out == "allow\n", allowed
    one = ["--policy", agent, "--policy", empty]
    denied = ctx_run("policy", "query", *one, "coder_t", "tool:fs.read", "execute")
    assert denied.rc == 1 and denied.out == "deny\n", denied
    other = ctx_run("policy", "query", *both, "coder_t", "tool:fs.write", "execute")
    assert other.rc == 1 and other.out == "deny\n", other
    for query in (("coder_t", "widget:x", "read"), ("coder_t", "tool:fs.read", "read")):
        bad = ctx_run("policy", "query", *both, *query)
        assert bad.rc == 2 and "EINVAL" in bad.err, bad
    broken = world.top / "broken.policy"
    broken.write_text("allow coder_t agent:* create\n")
    bad = ctx_run("policy", "query", "--policy", broken, "coder_t", "tool:fs.read", "execute")
    assert bad.rc == 2 and "EINVAL" in bad.err, bad


@needs_root
def test_p6_a_tool_runs_only_when_both_policies_allow_it(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """P-6, P-5, P-4, T-8: installing grants nothing; a tool runs only when the agent's
    policy and the tool's own policy both hold allow <label> tool:<name> execute, otherwise
    EACCES, and the recorded decision names the step that denied (6: tool policy; 2: mode
    bits, for a tool its uid may not execute); a missing tool is ENOENT or EACCES."""
    marks = world.dir("marks", 0o777)
    manifest = _manifest(world, "probe", f"#!/bin/sh\necho ran >> {marks}/log\necho probed\n")
    installed = world.ctx("object", "install", "--source", world.storage, manifest,
                          "--tier", "system")  # fmt: skip
    assert installed.rc == 0, installed
    world.agent(unprivileged_user, "gated", tools=("probe",), tool_layer=())
    events = (
        world.storage / "home" / str(unprivileged_user.uid) / "agent" / "gated" / "session"
        / "default" / "events.jsonl"
    )  # fmt: skip
    refused = world.ctx("run", "--agent", "gated", "probe")
    assert refused.rc != 0 and "EACCES" in refused.err, refused
    assert not (marks / "log").exists()
    assert _denying_step(events) == 6
    world.allow_tool("gated_t", "probe")
    exe = world.storage / "tool" / "probe"
    exe.chmod(0o700)
    refused = world.ctx("run", "--agent", "gated", "probe")
    assert refused.rc != 0 and "EACCES" in refused.err, refused
    assert _denying_step(events) == 2
    exe.chmod(0o755)
    missing = world.ctx("run", "--agent", "gated", "no.such.tool")
    assert missing.rc != 0 and re.search("ENOENT|EACCES", missing.err), missing
    ran = world.ctx("run", "--agent", "gated", "probe")
    assert ran.rc == 0 and ran.out == "probed\n", ran
    world.agent(unprivileged_user, "ungated", tools=(), tool_layer=("probe",))
    refused = world.ctx("run", "--agent", "ungated", "probe")
    assert refused.rc != 0 and "EACCES" in refused.err, refused
    assert (marks / "log").read_text() == "ran\n"


def _denying_step(events: Path) -> int | None:
    """The step number the last tool_result event of ``events`` records as denying."""
    last = [json.loads(line) for line in events.read_text().splitlines()][-1]
    assert last["type"] == "tool_result" and last["status"] != "ok", last
    steps = [value for key, value in last.items() if "step" in key and isinstance(value, int)]
    return steps[0] if steps else None


# --------------------------------------------------------------------------------------------
# §6 Tools as files


def _manifest(world: World, name: str, script: str, **fields) -> Path:
    directory = world.dir(f"src-{name}")
    (directory / f"{name}.sh").write_text(script)
    (directory / f"{name}.sh").chmod(0o755)
    document = {
        "manifest": 2,
        "kind": "tool",
        "name": name,
        "description": f"The {name} tool.",
        "schema": {"type": "object"},
        "cap": {"side_effects": False, "network": False},
        "exec": f"{name}.sh",
        **fields,
    }
    path = directory / f"{name}.json"
    path.write_text(json.dumps(document))
    return path


def test_t1_t8_install_makes_the_tool_and_its_controls_and_grants_nothing(world: World) -> None:
    """T-1, T-8, R-4: object install puts tool/<name> (executable) and tool/<name>.d/ with
    name, description, schema, cap, policy, status, log, hooks/pre.d, hooks/post.d; the
    tool's policy allows nobody, no agent's policy changes; --tier user installs into
    home/<uid>/tool/ and --tier shared:<name> into shared/<name>/tool/."""
    manifest = _manifest(world, "hello", "#!/bin/sh\necho hello\n")
    checked = ctx_run("object", "check", manifest)
    assert checked.rc == 0, checked
    agents = snapshot(world.storage / "agent")
    done = world.ctx("object", "install", "--source", world.storage, manifest, "--tier", "system")
    assert done.rc == 0, done
    exe = world.storage / "tool" / "hello"
    assert exe.is_file() and os.access(exe, os.X_OK)
    controls = world.storage / "tool" / "hello.d"
    for control in CONTROLS:
        assert (controls / control).exists(), control
    assert (controls / "hooks" / "pre.d").is_dir() and (controls / "hooks" / "post.d").is_dir()
    assert (controls / "name").read_text().strip() == "hello"
    assert json.loads((controls / "schema").read_text()) == {"type": "object"}
    rules = [
        line
        for line in (controls / "policy").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert rules == []
    assert snapshot(world.storage / "agent") == agents
    user = world.ctx("object", "install", manifest, "--tier", "user")
    assert user.rc == 0, user
    assert (world.storage / "home" / str(os.geteuid()) / "tool" / "hello").is_file()
    shared = world.ctx("object", "install", manifest, "--tier", "shared:proj")
    assert shared.rc == 0, shared
    assert (world.storage / "shared" / "proj" / "tool" / "hello.d" / "policy").is_file()
    assert root_entries(world.storage) == ROOT_ENTRIES


def test_t8_object_check_reports_manifest_einval(world: World) -> None:
    """T-8, C-2: an invalid v2 manifest (another manifest version, kind or an illegal name,
    neither exec nor mcp, a non-boolean cap fact, a non-object program) makes object check
    exit 1 with `MANIFEST: EINVAL: <reason>` on stderr, and object install installs nothing."""
    path = _manifest(world, "bad", "#!/bin/sh\n")
    good = json.loads(path.read_text())
    before = snapshot(world.storage)
    for change in (
        {"manifest": 1},
        {"name": "bad.d"},
        {"exec": None},
        {"program": "not an object"},
    ):
        document = {**good, **change}
        if document["exec"] is None:
            del document["exec"]
        path.write_text(json.dumps(document))
        checked = ctx_run("object", "check", path)
        assert checked.rc == 1, (change, checked)
        assert checked.err.startswith(f"{path}: EINVAL: "), (change, checked)
    refused = world.ctx("object", "install", path, "--tier", "system")
    assert refused.rc != 0, refused
    assert snapshot(world.storage) == before


def test_t4_t8a_ctx_path_is_searched_left_to_right_for_executables(world: World) -> None:
    """T-4, T-8a: object which prints where CTX_PATH resolves NAME, the first directory holding
    an executable file of that name; a non-executable file is not a hit; exit 1 when none."""
    first, second = world.dir("first"), world.dir("second")
    (first / "dup").write_text("#!/bin/sh\n")
    (first / "dup").chmod(0o644)
    (second / "dup").write_text("#!/bin/sh\n")
    (second / "dup").chmod(0o755)
    env = clean_env(CTX_STORAGE=str(world.storage), CTX_PATH=f"{first}:{second}")
    found = ctx_run("object", "which", "dup", env=env)
    assert found.rc == 0 and found.out == f"{second / 'dup'}\n", found
    (first / "dup").chmod(0o755)
    found = ctx_run("object", "which", "dup", env=env)
    assert found.rc == 0 and found.out == f"{first / 'dup'}\n", found
    missing = ctx_run("object", "which", "absent", env=env)
    assert missing.rc == 1 and missing.out == "", missing


def test_t4_tshrc_path_comes_first_and_is_data(world: World) -> None:
    """T-4: CTX_PATH= in $CTX_HOME/.tshrc wins over the process CTX_PATH; .tshrc is data,
    never code (a command substitution in it is not run)."""
    first, second = world.dir("first"), world.dir("second")
    for d in (first, second):
        (d / "t").write_text("#!/bin/sh\n")
        (d / "t").chmod(0o755)
    home = world.dir("ctxhome")
    marker = world.top / "ran"
    (home / ".tshrc").write_text(f"$(touch {marker})\n`touch {marker}`\nCTX_PATH={second}\n")
    env = clean_env(CTX_STORAGE=str(world.storage), CTX_PATH=str(first), CTX_HOME=str(home))
    found = ctx_run("object", "which", "t", env=env)
    assert found.rc == 0 and found.out == f"{second / 't'}\n", found
    assert not marker.exists()


@needs_root
def test_t6_pre_hooks_run_in_name_order_and_veto_post_hooks_see_the_result(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """T-6: executables in hooks/pre.d run in name order before the tool and a non-zero exit
    vetoes it; hooks/post.d run after it."""
    marks = world.dir("marks", 0o777)
    log = marks / "log"
    manifest = _manifest(world, "hooked", f"#!/bin/sh\necho tool >> {log}\n")
    assert world.ctx("object", "install", manifest, "--tier", "system").rc == 0
    world.agent(unprivileged_user, "hk", tools=("hooked",))
    hooks = world.storage / "tool" / "hooked.d" / "hooks"
    for where, name, text in (
        ("pre.d", "20-second", f"echo pre-20 >> {log}"),
        ("pre.d", "10-first", f"echo pre-10 >> {log}"),
        ("post.d", "10-after", f"echo post >> {log}; cat > {marks}/post-input"),
    ):
        (hooks / where / name).write_text(f"#!/bin/sh\n{text}\n")
        (hooks / where / name).chmod(0o755)
    ran = world.ctx("run", "--agent", "hk", "hooked")
    assert ran.rc == 0, ran
    assert log.read_text().split() == ["pre-10", "pre-20", "tool", "post"]
    assert (marks / "post-input").stat().st_size > 0
    log.write_text("")
    veto = hooks / "pre.d" / "15-veto"
    veto.write_text("#!/bin/sh\nexit 3\n")
    veto.chmod(0o755)
    refused = world.ctx("run", "--agent", "hk", "hooked")
    assert refused.rc != 0, refused
    assert "tool" not in log.read_text().split()


@needs_root
def test_c2_a_malformed_program_control_makes_the_tool_unavailable(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """C-2: a malformed or non-object program control makes the tool unavailable: listed so,
    and a call does not run it."""
    marks = world.dir("marks", 0o777)
    manifest = _manifest(world, "prog", f"#!/bin/sh\necho ran >> {marks}/log\n",
                         program={"type": "object", "additionalProperties": False})  # fmt: skip
    assert world.ctx("object", "install", manifest, "--tier", "system").rc == 0
    world.agent(unprivileged_user, "pg", tools=("prog",))
    assert world.ctx("run", "--agent", "pg", "prog").rc == 0
    (world.storage / "tool" / "prog.d" / "program").write_text("[1, 2]")
    listed = world.ctx("object", "list", "--tier", "system", "--json")
    assert listed.rc == 0, listed
    entry = next(t for t in listed.json() if t["name"] == "prog")
    assert entry["status"] == "unavailable", entry
    refused = world.ctx("run", "--agent", "pg", "prog")
    assert refused.rc != 0, refused
    assert (marks / "log").read_text() == "ran\n"


def test_c1_no_programmatic_tool_calling_is_announced(template: Path) -> None:
    """C-1: no programmatic_tool_calling tool and no allowed_callers in any tool's controls."""
    listed = ctx_run("object", "list", "--json", env=clean_env(CTX_STORAGE=str(template)))
    assert listed.rc == 0, listed
    assert "programmatic_tool_calling" not in {t["name"] for t in listed.json()}
    for path in (template / "tool").rglob("*"):
        if path.is_file() and not path.is_symlink() and path.parent.name.endswith(".d"):
            assert b"allowed_callers" not in path.read_bytes(), path


# --------------------------------------------------------------------------------------------
# §7 tsh, its configuration and ctx tool


def test_h3_ctx_tool_runs_only_safe_core_clis(world: World) -> None:
    """H-3: ctx tool runs tsh.config; it refuses the permission-bearing core tools (fs.write,
    shell.exec) and ordinary visible tools with EACCES; a name not on CTX_PATH (an unknown
    one, or tsh.config with a CTX_PATH that does not show it) is ENOENT."""
    manifest = _manifest(world, "plain", "#!/bin/sh\necho plain\n")
    assert world.ctx("object", "install", manifest, "--tier", "system").rc == 0
    shown = world.ctx("tool", "tsh.config")
    assert shown.rc == 0, shown
    for key in ("max_loaded_tools", "cache_capacity", "window_percent"):
        assert key in shown.out
    for name in ("fs.write", "shell.exec", "plain"):
        refused = world.ctx("tool", name, "{}")
        assert refused.rc == 1 and "EACCES" in refused.err and refused.out == "", refused
    missing = world.ctx("tool", "no.such.tool")
    assert missing.rc == 1 and "ENOENT" in missing.err, missing
    nowhere = clean_env(CTX_STORAGE=str(world.storage), CTX_PATH=str(world.dir("empty")))
    hidden = ctx_run("tool", "tsh.config", env=nowhere)
    assert hidden.rc == 1 and "ENOENT" in hidden.err and hidden.out == "", hidden


def test_h4_tsh_config_updates_the_data_file_and_refuses_bad_settings(world: World) -> None:
    """H-4: tsh.config updates tool/tsh.d/config (data; comments kept); an unknown key or a
    bad value is refused and leaves the file as it was."""
    config = world.storage / "tool" / "tsh.d" / "config"
    comments = [line for line in config.read_text().splitlines() if line.startswith("#")]
    done = world.ctx("tool", "tsh.config", "cache_capacity=64", "window_percent=2")
    assert done.rc == 0, done
    text = config.read_text()
    assert "cache_capacity=64" in text.splitlines() and "window_percent=2" in text.splitlines()
    assert all(comment in text.splitlines() for comment in comments)
    before = config.read_bytes()
    for bad in ("bogus=1", "cache_capacity=-5", "max_loaded_tools=many"):
        refused = world.ctx("tool", "tsh.config", bad)
        assert refused.rc != 0 and "EINVAL" in refused.err, refused
        assert config.read_bytes() == before


def test_h1_h2_a_standalone_tsh_runs_no_tool_and_no_host_command(world: World) -> None:
    """H-1, H-2: the root's bin/tsh run by a human outside an agent terminal discovers tools
    but runs none (EACCES), and never runs a host command from PATH."""
    marker = world.top / "host-command-ran"
    tsh = world.storage / "bin" / "tsh"
    env = clean_env(CTX_STORAGE=str(world.storage), CTX_PATH=str(world.storage / "tool"))
    script = f"which fs.read\nfs.read /etc/hostname\ntouch {marker}\n"
    done = subprocess.run([str(tsh)], input=script, capture_output=True, text=True, env=env,
                          timeout=60, cwd=world.top)  # fmt: skip
    assert str(world.storage / "tool" / "fs.read") in done.stdout, done
    assert "EACCES" in done.stderr, done
    assert not marker.exists()
    assert done.returncode != 0


# --------------------------------------------------------------------------------------------
# §8 Agents and the terminal socket


@needs_root
def test_a3_agent_create_makes_its_entry_and_controls_and_grants_by_name(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """A-3, P-7, P-6, S-6, R-3: agent create makes an executable agent/<name> and
    agent/<name>.d/ controls (label, policy); the policy grants exactly the tools and spaces
    listed, by concrete name; there is no agent/<name>.d/tool nor .d/shared, and no new root
    entry; an illegal session name for a call is EINVAL (exit 2) and records nothing."""
    world.agent(unprivileged_user, "rev", tools=("fs.read",), shared={"proj": ["read"]})
    entry = world.storage / "agent" / "rev"
    assert entry.is_file() and os.access(entry, os.X_OK)
    controls = world.storage / "agent" / "rev.d"
    assert (controls / "label").read_text().strip() == "rev_t"
    rules = {
        line.strip()
        for line in (controls / "policy").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    }
    assert "allow rev_t tool:fs.read execute" in rules
    assert "allow rev_t shared:proj read" in rules
    assert not any(":*" in rule or "shell.exec" in rule or "proj write" in rule for rule in rules)
    assert ctx_run("policy", "check", controls / "policy").rc == 0
    assert not (controls / "tool").exists() and not (controls / "shared").exists()
    for session in ("x.d", "a/b", ".."):
        bad = world.ctx("run", "--agent", "rev", "--session", session, "fs.read", "/etc/hostname")
        assert bad.rc == 2 and "EINVAL" in bad.err, bad
    assert not (world.storage / "home" / str(unprivileged_user.uid)).exists()
    assert root_entries(world.storage) == ROOT_ENTRIES


@needs_root
def test_a3_an_existing_agent_is_never_overwritten(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """A-3: creating an agent whose name exists is refused (EEXIST) and its entry and
    controls stay byte for byte."""
    world.agent(unprivileged_user, "once", tools=("fs.read",))
    before = snapshot(world.storage / "agent")
    again = world.ctx("agent", "create", "-", "--user", unprivileged_user.name,
                      input=json.dumps({"name": "once", "label": "evil_t",
                                        "tools": ["shell.exec"]}))  # fmt: skip
    assert again.rc != 0 and "EEXIST" in again.err, again
    assert snapshot(world.storage / "agent") == before


@needs_root
def test_a4_agent_create_attenuates_by_concrete_child_name(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """A-4, P-7: agent.create, run by a parent agent, needs agent:<child> create for that
    very child name, and the child's permissions must be a subset of the parent's; a refused
    create makes nothing."""
    world.agent(unprivileged_user, "parent", tools=("agent.create", "fs.read"))
    with (world.storage / "agent" / "parent.d" / "policy").open("a") as policy:
        policy.write("allow parent_t agent:kid create\n")
    before = snapshot(world.storage / "agent")
    for child in (
        {"name": "other", "label": "other_t", "tools": ["fs.read"]},
        {"name": "kid", "label": "kid_t", "tools": ["shell.exec"]},
    ):
        refused = world.ctx("run", "--agent", "parent", "agent.create", json.dumps(child))
        assert refused.rc != 0 and "EACCES" in refused.err, refused
        assert without_locks(snapshot(world.storage / "agent")) == without_locks(before)
    child = {"name": "kid", "label": "kid_t", "tools": ["fs.read"]}
    made = world.ctx("run", "--agent", "parent", "agent.create", json.dumps(child))
    assert made.rc == 0, made
    rules = (world.storage / "agent" / "kid.d" / "policy").read_text()
    assert "allow kid_t tool:fs.read execute" in rules
    assert "agent.create" not in rules and "shell.exec" not in rules
    assert root_entries(world.storage) == ROOT_ENTRIES


@needs_root
def test_a5_agent_update_replaces_only_its_own_prompt_files(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """A-5: agent.update replaces the caller's own system.md or prompt.template.md; any other
    control is EINVAL and a payload over 8 KiB is refused, each leaving the file as it was; the
    call is recorded as tool_call/tool_result events."""
    world.agent(unprivileged_user, "self", tools=("agent.update",))
    controls = world.storage / "agent" / "self.d"
    done = world.ctx("run", "--agent", "self", "agent.update",
                     json.dumps({"control": "system.md", "content": "Be brief.\n"}))  # fmt: skip
    assert done.rc == 0, done
    assert (controls / "system.md").read_text() == "Be brief.\n"
    before = snapshot(controls)
    for request_ in (
        {"control": "policy", "content": "allow self_t tool:shell.exec execute\n"},
        {"control": "identity", "content": "{}"},
        {"control": "system.md", "content": "x" * 8193},
        {"control": "prompt.template.md", "content": "é" * 4097},
    ):
        refused = world.ctx("run", "--agent", "self", "agent.update", json.dumps(request_))
        assert refused.rc != 0, refused
        assert snapshot(controls) == before, request_["control"]
    events = (
        world.storage / "home" / str(unprivileged_user.uid) / "agent" / "self" / "session"
        / "default" / "events.jsonl"
    )  # fmt: skip
    kinds = [json.loads(line)["type"] for line in events.read_text().splitlines()]
    assert kinds.count("tool_call") == 5 and kinds.count("tool_result") == 5, kinds


def _terminal_io(path: Path, mode: bytes, send: bytes, want: bytes | None) -> bytes:
    """Connect to the terminal socket at ``path`` (a link followed: the socket's own path may
    be too long to connect to), send the mode line and then ``send``, and read until ``want``
    shows up (30 s at most); with ``want`` None, read for a moment only."""
    seen = b""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(os.path.realpath(path))
        conn.sendall(mode + send)
        conn.settimeout(0.2)
        deadline = time.monotonic() + (30 if want is not None else 0.5)
        while time.monotonic() < deadline and (want is None or want not in seen):
            with contextlib.suppress(TimeoutError):
                chunk = conn.recv(65536)
                if not chunk:
                    break
                seen += chunk
    return seen


@needs_root
def test_a1_a2_h1_the_terminal_starts_in_the_workspace_and_runs_only_tools(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """A-1, A-2, H-1: ctx agent start mounts the current directory at /workspace and starts
    tsh there; its socket is home/<uid>/agent/<agent>/session/<session>/terminal/main.sock
    (or a link to it); attach runs what is typed (a tool with an empty argv runs too, in
    /workspace), watch only reads, and a host command is not run."""
    if shutil.which("bwrap") is None or not os.path.exists("/dev/fuse"):
        pytest.skip("needs bubblewrap and /dev/fuse")
    workspace = world.dir("workspace", 0o755)
    (workspace / "here.txt").write_text("in the workspace\n")
    world.agent(unprivileged_user, "term", tools=("fs.read", "fs.list"))
    started = world.ctx("agent", "start", "term", "--session", "s1", cwd=workspace)
    assert started.rc == 0, started
    try:
        sock = (
            world.storage / "home" / str(unprivileged_user.uid) / "agent" / "term" / "session"
            / "s1" / "terminal" / "main.sock"
        )  # fmt: skip
        assert sock.is_socket(), sock
        watched = _terminal_io(sock, b"watch\n", b"fs.read here.txt\n", None)
        assert b"in the workspace" not in watched
        seen = _terminal_io(sock, b"attach\n", b"fs.read here.txt\n", b"in the workspace")
        assert b"in the workspace" in seen, seen
        seen = _terminal_io(sock, b"attach\n", b"fs.list\n", b"here.txt")
        assert b"here.txt" in seen, seen
        seen = _terminal_io(sock, b"attach\n", b"touch /tmp/x\n", b"not a tool")
        assert b"not a tool" in seen, seen
        events = sock.parent.parent / "events.jsonl"
        calls = [e for e in map(json.loads, events.read_text().splitlines())
                 if e["type"] == "tool_call"]  # fmt: skip
        assert [c["object"] for c in calls] == ["tool/fs.read", "tool/fs.list"], calls
    finally:
        stopped = world.ctx("agent", "stop", "term", "--session", "s1")
    assert stopped.rc == 0, stopped


# --------------------------------------------------------------------------------------------
# §9 Shared spaces


@needs_root
def test_x1_a_shared_space_is_a_group_space_members_can_use(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """X-1: shared create makes shared/<name>/ with tool/ data/ queue/ agent/ for its group;
    a member publishes into its queue, a user outside the group is refused by Linux
    permissions and leaves nothing behind."""
    made = world.ctx("shared", "create", "team", "--group", str(unprivileged_user.gid))
    assert made.rc == 0, made
    space = world.storage / "shared" / "team"
    assert {"tool", "data", "queue", "agent"} <= set(os.listdir(space))
    assert {p.name for p in (space / "queue").iterdir() if p.is_dir()} == QUEUE_SUBDIRS
    for path in (space, space / "data", space / "queue", space / "queue" / "pending"):
        st = path.stat()
        assert st.st_gid == unprivileged_user.gid, path
        assert not st.st_mode & stat.S_IRWXO, path
    env = {"PATH": "/usr/bin:/bin", "CTX_STORAGE": str(world.storage), "LANG": "C.UTF-8"}
    argv = [*CTX_ARGV, "queue", "publish", "--project", "team", "--name", "m", "-"]
    done = run_as(unprivileged_user, argv, env=env, stdin=json.dumps(request()))
    assert done.returncode == 0 and done.stdout == "m.req.json\n", done.stderr
    pending = space / "queue" / "pending" / "m.req.json"
    assert pending.stat().st_gid == unprivileged_user.gid
    before = snapshot(space)
    outsider = UnprivilegedUser("nobody", 65534, 65534)
    argv[-2] = "o"
    refused = run_as(outsider, argv, env=env, stdin=json.dumps(request()))
    assert refused.returncode != 0 and "EACCES" in refused.stderr, refused.stderr
    assert snapshot(space) == before


def test_x2_the_manual_bundle_is_not_a_space(world: World) -> None:
    """X-2, X-1: shared/cortexfs-docs is the system's manual bundle, not a space: shared
    create, queue init and object install --tier shared:cortexfs-docs refuse it (EINVAL,
    exit 2) and leave the bundle alone."""
    manifest = _manifest(world, "docs", "#!/bin/sh\n")
    before = snapshot(world.storage / "shared" / "cortexfs-docs")
    for args in (
        ("shared", "create", "cortexfs-docs"),
        ("queue", "init", "--project", "cortexfs-docs"),
        ("object", "install", manifest, "--tier", "shared:cortexfs-docs"),
    ):
        refused = world.ctx(*args)
        assert refused.rc == 2 and "EINVAL" in refused.err, refused
    assert snapshot(world.storage / "shared" / "cortexfs-docs") == before


# --------------------------------------------------------------------------------------------
# §10 ctxmcp


MCP_SERVER = r"""
import json, os, sys
version = os.environ.get("MCP_VERSION")
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    if msg["method"] == "initialize":
        with open(os.environ["MCP_SEEN"], "w") as seen:
            json.dump(msg["params"], seen)
        res = {"protocolVersion": version or msg["params"]["protocolVersion"],
               "capabilities": {"tools": {}}, "serverInfo": {"name": "demo", "version": "1"}}
    elif msg["method"] == "tools/list":
        res = {"tools": [
            {"name": "search_issues", "description": "Search issues",
             "inputSchema": {"type": "object", "properties": {"q": {"type": "string"}}}},
            {"name": "bad/tool", "description": "x", "inputSchema": {"type": "object"}},
        ]}
    else:
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"],
                          "error": {"code": -32601, "message": "no"}}), flush=True)
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": res}), flush=True)
"""


def _mcp_config(world: World, version: str | None) -> tuple[Path, Path]:
    directory = world.dir("mcp")
    (directory / "server.py").write_text(MCP_SERVER)
    env = {"MCP_SEEN": str(directory / "seen.json"), "SECRET_TOKEN": "s3cr3t-value"}
    if version:
        env["MCP_VERSION"] = version
    config = directory / "config.json"
    server = {"command": sys.executable, "args": [str(directory / "server.py")], "env": env}
    config.write_text(json.dumps({"mcpServers": {"github": server}}))
    return config, directory / "seen.json"


def test_m1_m3_m4_projection_writes_candidates_only(world: World) -> None:
    """M-1, M-2, M-3, M-4, R-2: ctxmcp announces 2025-11-25 and project writes a v2 manifest
    candidate named exactly <server>.<remote_tool> with an mcp locator (transport, the runtime
    config path, server, tool), skips and reports a tool whose projected name is illegal,
    copies no secret, and writes nothing in the storage root; installed, it is an ordinary
    tool with an mcp control, and no root mcp/ appears."""
    config, seen = _mcp_config(world, None)
    out = world.top / "out"
    before = snapshot(world.storage)
    env = clean_env(CTX_STORAGE=str(world.storage))
    done = subprocess.run(
        [CTXMCP, "project", "--config", str(config), "--runtime-config", "/workspace/.mcp.json",
         "--server", "github", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done
    assert "bad/tool" in done.stderr
    assert sorted(os.listdir(out)) == ["github.search_issues.manifest.json"]
    candidate = out / "github.search_issues.manifest.json"
    document = json.loads(candidate.read_text())
    assert document["manifest"] == 2 and document["kind"] == "tool"
    assert document["name"] == "github.search_issues"
    assert document["mcp"]["transport"] == "stdio"
    assert document["mcp"]["config"] == "/workspace/.mcp.json"
    assert document["mcp"]["server"] == "github" and document["mcp"]["tool"] == "search_issues"
    assert "s3cr3t-value" not in candidate.read_text()
    assert ctx_run("object", "check", candidate).rc == 0
    assert snapshot(world.storage) == before
    assert json.loads(seen.read_text())["protocolVersion"] == "2025-11-25"
    installed = world.ctx("object", "install", candidate, "--tier", "system")
    assert installed.rc == 0, installed
    locator = json.loads((world.storage / "tool" / "github.search_issues.d" / "mcp").read_text())
    assert locator["transport"] == "stdio" and locator["config"] == "/workspace/.mcp.json"
    assert locator["server"] == "github" and locator["tool"] == "search_issues"
    assert root_entries(world.storage) == ROOT_ENTRIES


def test_m2_only_the_stable_protocol_versions_are_accepted(world: World) -> None:
    """M-2: ctxmcp accepts a server that negotiates 2025-11-25, 2025-06-18, 2025-03-26 or
    2024-11-05, and refuses draft, unknown or future versions."""
    for version, accepted in (
        ("2025-11-25", True),
        ("2025-06-18", True),
        ("2025-03-26", True),
        ("2024-11-05", True),
        ("2099-01-01", False),
    ):
        config, _ = _mcp_config(world, version)
        done = subprocess.run(
            [CTXMCP, "list", "--config", str(config), "--server", "github"],
            capture_output=True, text=True, env=clean_env(), timeout=60,
        )  # fmt: skip
        if accepted:
            assert done.returncode == 0 and "github.search_issues" in done.stdout, done
        else:
            assert done.returncode == 1 and "github.search_issues" not in done.stdout, done


def test_m1_ctxmcp_refuses_an_output_inside_the_storage_root(world: World) -> None:
    """M-1: ctxmcp writes nothing under the storage root: an OUT there is refused."""
    config, _ = _mcp_config(world, None)
    before = snapshot(world.storage)
    out = world.storage / "tool" / "candidates"
    done = subprocess.run(
        [CTXMCP, "project", "--config", str(config), "--runtime-config", "/workspace/.mcp.json",
         "--server", "github", "--out", str(out), "--storage", str(world.storage)],
        capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    assert done.returncode != 0, done
    assert snapshot(world.storage) == before


# --------------------------------------------------------------------------------------------
# §12 Manual bundle


def test_d1_ctx_man_reads_the_installed_pages_and_aliases(world: World) -> None:
    """D-1: ctx man TOPIC prints the installed page; agent, model, … are aliases of
    ctx.agent.md, …; README is the bundle's README.md; an unknown topic is ENOENT."""
    docs = world.storage / "shared" / "cortexfs-docs"
    for topic, page in MAN_PAGES.items():
        shown = world.ctx("man", topic)
        assert shown.rc == 0 and shown.out == (docs / "man" / page).read_text(), topic
    alias = world.ctx("man", "ctx.agent.md")
    assert alias.rc == 0 and alias.out == (docs / "man" / "ctx.agent.md").read_text()
    readme = world.ctx("man", "README")
    assert readme.rc == 0 and readme.out == (docs / "README.md").read_text()
    unknown = world.ctx("man", "no-such-topic")
    assert unknown.rc == 1 and "ENOENT" in unknown.err and unknown.out == "", unknown


def test_d1_without_the_bundle_ctx_man_falls_back_to_its_copy(world: World) -> None:
    """D-1: ctx man reads the installed file (an edited page is what it prints); without the
    installed bundle it falls back to the built-in copy (the text bootstrap installs), with a
    note on stderr."""
    page = world.storage / "shared" / "cortexfs-docs" / "man" / "ctx.tool.md"
    original = page.read_text()
    page.chmod(0o644)  # the bundle's pages are read-only documents
    page.write_text("# ctx.tool\n\nedited locally\n")
    edited = world.ctx("man", "tool")
    assert edited.rc == 0 and edited.out == page.read_text(), edited
    shutil.rmtree(world.storage / "shared" / "cortexfs-docs")
    fallback = world.ctx("man", "tool")
    assert fallback.rc == 0 and fallback.out == original, fallback
    assert fallback.err != ""


# --------------------------------------------------------------------------------------------
# §13 Mounting /ctx


@needs_fuse_as_root
def test_f1_the_mount_shows_exactly_the_root_abi(world: World) -> None:
    """F-1, R-2: ctx mount shows the six root entries and nothing else may be created at
    the root; a write through the mount lands in the storage root; ctx umount ends it."""
    where = world.dir("mnt")
    with serving(world.storage, where) as mount:
        assert set(os.listdir(where)) == ROOT_ENTRIES
        for name in ("audit", "mcp", "queue"):
            with pytest.raises(OSError):
                (where / name).mkdir()
        with (where / "shared" / "proj" / "data" / "via-mount").open("w") as f:
            f.write("written\n")
            f.flush()
            os.fsync(f.fileno())
        direct = world.storage / "shared" / "proj" / "data" / "via-mount"
        assert direct.read_text() == "written\n"
        gone = ctx_run("umount", where)
        assert gone.rc == 0, gone
        assert mount.proc.wait(timeout=30) == 0
    assert root_entries(world.storage) == ROOT_ENTRIES


@needs_fuse_as_root
def test_f1_t5_an_agent_view_lists_only_what_it_may_execute(
    world: World, unprivileged_user: UnprivilegedUser
) -> None:
    """F-1, T-5: ctx mount --as AGENT lists only the tools that pass both policy layers;
    listing creates no persistent file in the storage root; SIGTERM unmounts cleanly."""
    world.agent(unprivileged_user, "viewer", tools=("fs.read", "shell.exec"),
                tool_layer=("fs.read",))  # fmt: skip
    where = world.dir("mnt")
    before = snapshot(world.storage)
    with serving(world.storage, where, "--as", "viewer") as mount:
        tools = set(os.listdir(where / "tool"))
        assert "fs.read" in tools
        for hidden in ("shell.exec", "fs.write", "tsh.config"):
            assert hidden not in tools, tools
        assert set(os.listdir(where)) <= ROOT_ENTRIES
        mount.proc.terminate()
        assert mount.proc.wait(timeout=30) == 0
        assert not mounted_at(where)
    assert snapshot(world.storage) == before
