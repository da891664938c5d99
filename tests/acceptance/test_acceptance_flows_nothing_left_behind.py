"""Nothing is left behind (SPEC Q-1, Q-3, Q-5, Q-6, Q-7, I-5, W-2, W-4, T-6, A-1, A-2, M-1,
F-1; docs/queue.md "What a crash leaves, and what recover does with it", docs/workers.md
"Signals", docs/tools.md "Process group and bounds", "A terminal that was killed",
docs/mount.md ``ctx umount``): after a command ends — normally, refused, stopped by a signal,
or SIGKILLed where the queue's recover or a documented clean-up handles what it left — the
user looks for what should be gone and finds nothing:

* no process of a tool call, of its hooks, of the small guard that kills a call's group, of a
  terminal's sandbox or view, of a mount, or of an MCP server;
* no FUSE mount of a killed mount or terminal once ``ctx umount`` / ``ctx agent stop`` ran,
  and nothing of the terminal under ``/run/cortexfs/terminal``;
* no temp or staging file in the queue once ``ctx queue recover --reconcile`` ran, which
  reports exactly what a killed publish or claim left (and a plain ``recover`` changes
  nothing of it); a refused command leaves the storage root byte for byte as it was;
* no descriptor, thread or child piling up in a worker after 200 jobs, or in a mount after
  thousands of opens, successful or refused.

Only the processes, mounts and runtime directories of the storage roots and scratch
directories these tests make are looked at."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from tests.acceptance.ctxcli import (
    CTX_ARGV,
    REPO,
    QueueCLI,
    Run,
    alive,
    clean_env,
    ctx_run,
    mounted_at,
    new_scratch_dir,
    scratch_top,
    snapshot,
    wait_for,
)
from tests.acceptance.terminalcli import coder_host
from tests.acceptance.workercli import AGENT, allow_in_tool_policy, make_agent, shell_job
from tests.support.storage import copy_of_root
from tests.support.strace import can_inject

TOP = scratch_top(__file__)
WAIT = 15.0
CTXMCP = str(REPO / ".venv" / "bin" / "ctxmcp")
GUARD_MARK = b"kill -s KILL"  # the call-group guard's shell text (docs/tools.md)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="agents run as another uid: needs root")
needs_strace = pytest.mark.skipif(not can_inject(), reason="needs strace signal injection")
needs_fuse = pytest.mark.skipif(
    not os.path.exists("/dev/fuse") or os.geteuid() != 0, reason="needs /dev/fuse and root"
)
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")


# ------------------------------------------------------------------------------ helpers


@dataclass
class World:
    """A scratch directory below :data:`TOP`, a bootstrapped storage root in it holding the
    queue of project ``proj``, and a claim-order cache of its own (``XDG_CACHE_HOME``)."""

    top: Path
    storage: Path
    cache: Path

    @property
    def env(self) -> dict[str, str]:
        return clean_env(CTX_STORAGE=str(self.storage), XDG_CACHE_HOME=str(self.cache))

    @property
    def queue(self) -> QueueCLI:
        return QueueCLI(self.storage, "proj")

    def ctx(self, *args, **kw) -> Run:
        kw.setdefault("env", self.env)
        return ctx_run(*args, **kw)

    def q(self, command: str, *args, **kw) -> Run:
        return self.ctx("queue", command, "--project", "proj", *args, **kw)


@pytest.fixture
def world(_template: Path) -> Iterator[World]:
    top = new_scratch_dir(TOP)
    storage = copy_of_root(_template, top / "storage")
    cache = top / "cache"
    cache.mkdir(mode=0o700)
    try:
        yield World(top, storage, cache)
    finally:
        for pid in processes_naming(str(top).encode()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with open("/proc/self/mountinfo") as table:
            mine = [ln.split()[4] for ln in table if ln.split()[4].startswith(str(top))]
        for where in mine:
            subprocess.run(["umount", "-l", where], check=False)
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def worker_world(world: World) -> World:
    """:func:`world` with agent ``ci`` allowed ``shell.exec`` in both layers of P-6."""
    make_agent(world.storage, ["shell.exec"])
    allow_in_tool_policy(world.storage, "shell.exec")
    return world


def marker() -> str:
    """A number of seconds no other process on the machine sleeps: it names the processes a
    test starts (``sleep 4xxx.NNNNNN``)."""
    return f"{4000 + int.from_bytes(os.urandom(2)) % 1000}.{int.from_bytes(os.urandom(3)):06d}"


def processes_naming(text: bytes) -> list[int]:
    """Live processes (not zombies, not this one) whose command line holds ``text``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        if int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if text in Path(f"/proc/{entry}/cmdline").read_bytes() and alive(int(entry)):
                found.append(int(entry))
    return found


def sleepers(mark: str) -> list[int]:
    """Live ``sleep MARK`` processes."""
    wanted = b"sleep\0" + mark.encode() + b"\0"
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{entry}/cmdline").read_bytes() == wanted and alive(int(entry)):
                found.append(int(entry))
    return found


def descendants(pid: int) -> list[int]:
    with contextlib.suppress(psutil.Error):
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    return []


def none_alive(pids: list[int], seconds: float = WAIT) -> bool:
    return wait_for(lambda: not any(alive(p) for p in pids), seconds)


def guards_of(pid: int) -> list[int]:
    """The call-group guards among ``pid``'s descendants."""
    found = []
    for child in descendants(pid):
        with contextlib.suppress(OSError):
            if GUARD_MARK in Path(f"/proc/{child}/cmdline").read_bytes():
                found.append(child)
    return found


def fd_targets(pid: int) -> list[str]:
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            found.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return sorted(found)


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def zombie_children(pid: int) -> list[int]:
    with contextlib.suppress(psutil.Error):
        return [c.pid for c in psutil.Process(pid).children() if not alive(c.pid)]
    return []


def killed_at(world: World, nth_rename: int, *args: str, input: bytes = b"") -> int:
    """``ctx ARGS`` SIGKILLed by strace as it enters its ``nth_rename``-th ``renameat2``:
    its exit status."""
    argv = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=renameat2",
            "-e", f"inject=renameat2:signal=KILL:when={nth_rename}", *CTX_ARGV, *args]  # fmt: skip
    done = subprocess.run(argv, input=input, capture_output=True, env=world.env, timeout=60)
    return done.returncode


def queue_files(queue: QueueCLI) -> set[str]:
    """Every path under the queue, relative to it."""
    return set(snapshot(queue.dir))


def temps_anywhere(top: Path) -> list[str]:
    """Names under ``top`` that look like a temp or staging file."""
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            if name.endswith((".tmp", ".part", "-tmp")) or "~" in name:
                found.append(os.path.join(dirpath, name))
    return found


def root_key(storage: Path) -> str:
    return hashlib.sha256(os.fsencode(os.path.realpath(storage))).hexdigest()[:16]


def mounts_under(prefix: str) -> list[str]:
    with open("/proc/self/mountinfo") as table:
        return [ln.split()[4] for ln in table if ln.split()[4].startswith(prefix)]


# ------------------------------------------------------------------------------ the queue


@needs_strace
def test_a_publish_killed_before_its_move_leaves_one_staging_file_that_reconcile_removes(world):
    """Q-1, Q-6, I-5: a publish SIGKILLed as it moves its staging file leaves exactly
    ``inbox/J.publish.tmp``.  While it is young, recover says nothing of it; with ``--grace 0``
    plain recover reports it and keeps it; ``--reconcile`` removes that one file and says
    so; a second run has nothing to remove, and J can then be published."""
    q = world.queue
    before = queue_files(q)
    request = json.dumps(shell_job("true")).encode()
    rc = killed_at(world, 1, "queue", "publish", "--project", "proj", "--name", "k1", "-",
                   input=request)  # fmt: skip
    assert rc in (-signal.SIGKILL, 128 + signal.SIGKILL)
    assert queue_files(q) - before == {"inbox/k1.req.json.publish.tmp"}

    young = world.q("recover", "--json")
    assert young.rc == 0 and young.json()["stale_temps"] == [], young
    plain = world.q("recover", "--json", "--grace", "0")
    assert plain.rc == 0, plain
    assert plain.json()["stale_temps"] == ["inbox/k1.req.json.publish.tmp"], plain
    assert plain.json()["removed_temps"] == [], plain
    assert queue_files(q) - before == {"inbox/k1.req.json.publish.tmp"}

    held = world.q("publish", "--name", "k1", "-", input=request)
    assert held.rc == 1 and "EEXIST" in held.err, held

    fixed = world.q("recover", "--json", "--grace", "0", "--reconcile")
    assert fixed.rc == 0 and fixed.json()["consistent"] is True, fixed
    assert fixed.json()["removed_temps"] == ["inbox/k1.req.json.publish.tmp"], fixed
    assert fixed.json()["requeued"] == [] and fixed.json()["repaired"] == [], fixed
    assert queue_files(q) == before

    again = world.q("recover", "--json", "--grace", "0", "--reconcile")
    assert again.rc == 0 and again.json()["removed_temps"] == [], again
    assert world.q("publish", "--name", "k1", "-", input=request).rc == 0
    assert q.entries("inbox") == set()


@needs_strace
def test_a_claim_killed_before_its_lease_move_is_put_back_and_its_lease_temp_removed(world):
    """Q-3, Q-6, I-5: a claim SIGKILLed as it moves its lease into place leaves the claimed
    request and a lease temp in ``inbox/``.  Plain recover reports the incomplete pair (exit
    1) and changes nothing; ``--reconcile --grace 0`` puts J back in ``pending/`` and removes
    the temp, leaving the queue as it was before the claim; a second run changes nothing."""
    q = world.queue
    job = q.publish(shell_job("true"), name="c1")
    before = snapshot(q.dir)
    rc = killed_at(world, 2, "queue", "claim", "--project", "proj")
    assert rc in (-signal.SIGKILL, 128 + signal.SIGKILL)
    left = queue_files(q) - set(before)
    assert f"claimed/{job}/{job}" in left, left
    temps = [p for p in left if p.startswith("inbox/")]
    assert len(temps) == 1 and temps[0].endswith(".tmp"), left
    assert not (q.dir / "lease" / job / "worker").exists()

    mid = snapshot(q.dir)
    plain = world.q("recover", "--json", "--grace", "0")
    assert plain.rc == 1 and plain.json()["consistent"] is False, plain
    assert job in json.dumps(plain.json()["incomplete"]), plain
    assert snapshot(q.dir) == mid

    fixed = world.q("recover", "--json", "--grace", "0", "--reconcile")
    assert fixed.rc == 0 and fixed.json()["consistent"] is True, fixed
    assert fixed.json()["removed_temps"] == temps, fixed
    assert snapshot(q.dir) == before  # J pending again, byte for byte; nothing else left
    settled = snapshot(q.dir)
    again = world.q("recover", "--json", "--grace", "0", "--reconcile")
    assert again.rc == 0 and again.json()["removed_temps"] == [], again
    assert again.json()["repaired"] == [] and again.json()["requeued"] == [], again
    assert snapshot(q.dir) == settled


def test_refused_commands_leave_the_storage_root_and_the_cache_as_they_were(world):
    """Q-1, Q-6, T-8, A-3: commands that are refused (a name already pending, a request too
    large or not JSON, a batch with a bad line, a finish or renew of no job, a bad manifest,
    an agent request with an illegal name, a space with an illegal name) change nothing in the
    storage root and leave no temp file in the claim-order cache."""
    q = world.queue
    q.publish(shell_job("true"), name="dup")
    bad = world.top / "bad.json"
    bad.write_text(json.dumps({"manifest": 2, "kind": "tool", "name": "x..d"}))
    before = snapshot(world.storage)
    refusals = [
        world.q("publish", "--name", "dup", "-", input=json.dumps(shell_job("true"))),
        world.q("publish", "-", input=json.dumps(shell_job("x" * (1 << 20)))),
        world.q("publish", "-", input="not json"),
        world.q("publish", "--batch", "-", input=json.dumps(shell_job("true")) + "\nbad\n"),
        world.q("finish", "nope", "--ok", "-", input="{}"),
        world.q("renew", "nope"),
        world.ctx("object", "install", bad, "--tier", "system"),
        world.ctx("agent", "create", "-", input=json.dumps({"name": "../x", "label": "x_t"})),
        world.ctx("shared", "create", ".hidden"),
    ]
    for refused in refusals:
        assert refused.rc in (1, 2) and "Traceback" not in refused.err, refused
    assert snapshot(world.storage) == before
    assert temps_anywhere(world.cache) == []


@needs_root
def test_a_worker_killed_mid_job_leaves_no_process_and_recover_requeues_exactly_that_job(
    worker_world,
):
    """W-4, Q-5, I-5, docs/tools.md "Process group and bounds": a worker SIGKILLed while its
    tool runs (with a child in the background) takes the tool, the child and its call-group
    guard with it; ``ctx queue recover`` requeues exactly that job, leaves no claim, lease or
    temp, and a second run has nothing to do."""
    world = worker_world
    q = world.queue
    mark = marker()
    job = q.publish(shell_job(f"sleep {mark} & sleep {mark}; echo never"), name="w1")
    worker = subprocess.Popen(
        [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", AGENT],
        env=world.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert wait_for(lambda: len(sleepers(mark)) >= 2, WAIT)
        tools = descendants(worker.pid)
        guards = guards_of(worker.pid)
        assert guards, "no call-group guard found beside the tool"
    finally:
        worker.kill()
        worker.wait()
    assert none_alive(tools + guards), [p for p in tools + guards if alive(p)]
    assert processes_naming(mark.encode()) == []

    first = world.q("recover", "--json")
    assert first.rc == 0 and first.json()["consistent"] is True, first
    assert [entry["job"] for entry in first.json()["requeued"]] == [job], first
    assert first.json()["repaired"] == [] and first.json()["removed_temps"] == [], first
    assert q.state(job) == "pending"
    for sub in ("claimed", "lease", "inbox"):
        assert q.entries(sub) == set(), (sub, q.entries(sub))
    again = world.q("recover", "--json", "--reconcile")
    assert again.rc == 0 and again.json()["requeued"] == [], again
    assert again.json()["repaired"] == [] and again.json()["removed_temps"] == [], again


@needs_root
def test_a_worker_told_to_stop_finishes_its_job_and_leaves_no_child_guard_or_temp(
    worker_world,
):
    """W-2, W-4: SIGTERM to a worker whose job runs lets the job finish, then the worker exits
    0; none of its children (tool, background child, guard) is left, and the queue holds the
    finished pair and nothing in flight."""
    world = worker_world
    q = world.queue
    mark = marker()
    gate = world.top / "gate"
    cmd = f"sleep {mark} & while [ ! -e {gate} ]; do sleep 0.05; done; echo finished"
    job = q.publish(shell_job(cmd), name="w2")
    worker = subprocess.Popen(
        [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", AGENT],
        env=world.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert wait_for(lambda: sleepers(mark), WAIT)
        children = descendants(worker.pid)
        worker.send_signal(signal.SIGTERM)
        gate.touch(mode=0o644)
        _, err = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0, err
    assert "Traceback" not in err.decode()
    assert none_alive(children), [p for p in children if alive(p)]
    assert q.state(job) == "done"
    q.assert_settled()


@needs_root
def test_a_worker_after_two_hundred_jobs_keeps_its_descriptors_threads_and_children(
    worker_world,
):
    """W-1, W-2: a long-running worker that has finished 200 jobs, refused by policy, naming
    no tool, or failing its schema, holds the same descriptors and threads as after its
    first 20, has no child and no zombie, and has left nothing in ``inbox/``."""
    world = worker_world
    q = world.queue
    kinds = [
        {"tool": "fs.read", "input": {"path": "/"}},  # not granted to ci_t: EACCES
        {"tool": "no.such-tool", "input": {}},
        {"tool": "shell.exec", "input": {"path": "/"}},  # schema: cmd missing
    ]

    def batch(n: int, start: int) -> None:
        lines = "".join(json.dumps(kinds[(start + i) % 3]) + "\n" for i in range(n))
        assert world.q("publish", "--batch", "-", input=lines).rc == 0

    def finished() -> int:
        return sum(1 for n in q.entries("failed") if not n.endswith(".result")) + sum(
            1 for n in q.entries("done") if not n.endswith(".result")
        )

    def idle(total: int) -> bool:
        return finished() == total and not (q.entries("claimed") | q.entries("lease"))

    worker = subprocess.Popen(
        [*CTX_ARGV, "queue", "work", "--project", "proj", "--agent", AGENT],
        env=world.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        batch(20, 0)
        assert wait_for(lambda: idle(20), 30)
        assert wait_for(lambda: not descendants(worker.pid) or not guards_of(worker.pid), 5)
        fds_after_20, threads_after_20 = fd_targets(worker.pid), threads(worker.pid)
        batch(180, 20)
        assert wait_for(lambda: idle(200), 60)
        assert wait_for(lambda: fd_targets(worker.pid) == fds_after_20, 5), (
            fds_after_20,
            fd_targets(worker.pid),
        )
        assert wait_for(lambda: threads(worker.pid) <= threads_after_20, 5)
        assert zombie_children(worker.pid) == []
        assert q.entries("inbox") == set()
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    assert worker.returncode == 0


# ------------------------------------------------------------------------------ tool calls


def install_hooks(world: World, mark: str, *, slow_pre: bool = False) -> None:
    """A pre- and a post-hook of ``shell.exec`` that each leave ``sleep MARK`` running in the
    background (the pre-hook also sleeps itself when ``slow_pre``)."""
    hooks = world.storage / "tool" / "shell.exec.d" / "hooks"
    stay = f"sleep {mark} >/dev/null 2>&1 </dev/null &\n"
    pre = "#!/bin/sh\ncat >/dev/null\n" + stay + (f"sleep {mark}\n" if slow_pre else "")
    post = "#!/bin/sh\ncat >/dev/null\n" + stay
    for where, text in (("pre.d/10-bg", pre), ("post.d/10-bg", post)):
        (hooks / where).write_text(text + "exit 0\n")
        (hooks / where).chmod(0o755)


@needs_root
def test_a_tool_call_that_ended_leaves_no_process_of_its_hooks_or_its_tool(worker_world):
    """T-6, W-4, docs/tools.md "Process group and bounds": a call whose pre-hook, tool and
    post-hook each leave a process running in the background returns, and none of those
    processes outlives it."""
    world = worker_world
    mark = marker()
    install_hooks(world, mark)
    cmd = f"sleep {mark} >/dev/null 2>&1 </dev/null & echo ran"
    ran = world.ctx("run", "--agent", AGENT, "shell.exec", json.dumps({"cmd": cmd}))
    assert ran.rc == 0 and "ran" in ran.out, ran
    assert wait_for(lambda: processes_naming(mark.encode()) == [], WAIT), processes_naming(
        mark.encode()
    )


@needs_root
@pytest.mark.parametrize("stage", ["pre-hook", "tool"])
def test_ctx_run_killed_by_sigkill_takes_its_hook_or_tool_and_their_children_along(
    worker_world, stage
):
    """docs/tools.md "Process group and bounds" (I-4's reason): ``ctx run`` SIGKILLed while a
    pre-hook or the tool runs, each with a child in the background, leaves none of them, nor
    the call-group guard."""
    world = worker_world
    mark = marker()
    if stage == "pre-hook":
        install_hooks(world, mark, slow_pre=True)
        cmd = "echo ran"
    else:
        cmd = f"sleep {mark} & sleep {mark}"
    run = subprocess.Popen(
        [*CTX_ARGV, "run", "--agent", AGENT, "shell.exec", json.dumps({"cmd": cmd})],
        env=world.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert wait_for(lambda: len(sleepers(mark)) >= 2, WAIT)
        started = descendants(run.pid)
    finally:
        run.kill()
        run.wait()
    assert none_alive(started), [p for p in started if alive(p)]
    assert processes_naming(mark.encode()) == []


# ------------------------------------------------------------------------------ mounts


def start_mount(world: World, where: Path, *args: str) -> subprocess.Popen:
    where.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [*CTX_ARGV, "mount", *args, str(where)],
        env=world.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    assert wait_for(lambda: mounted_at(where) or proc.poll() is not None, WAIT)
    assert mounted_at(where), proc.communicate()[1]
    return proc


@needs_fuse
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_mount_ended_by_a_signal_leaves_no_mount_once_umount_ran_and_no_process(world, signum):
    """F-1, docs/mount.md: a mount told to stop (SIGTERM, Ctrl-C) unmounts and its process
    ends; one SIGKILLed leaves a dead mount that ``ctx mount`` there names with its remedy and
    ``ctx umount`` removes.  Either way the mount point is an empty directory again and no
    process of the mount is left."""
    where = world.top / "mnt"
    mount = start_mount(world, where)
    family = [mount.pid, *descendants(mount.pid)]
    try:
        os.kill(mount.pid, signum)
        mount.wait(timeout=30)
    finally:
        if mount.poll() is None:
            mount.kill()
            mount.wait()
    if signum == signal.SIGKILL:
        assert mounted_at(where)
        again = world.ctx("mount", where)
        assert again.rc == 1 and "ENOTCONN" in again.err and "ctx umount" in again.err, again
        gone = world.ctx("umount", where)
        assert gone.rc == 0, gone
    else:
        assert mount.returncode in (0, 130), mount.communicate()[1]
    assert not mounted_at(where)
    assert os.listdir(where) == []
    assert none_alive(family)
    assert processes_naming(str(where).encode()) == []


@needs_fuse
def test_a_mount_after_thousands_of_opens_keeps_its_descriptors_and_threads(world):
    """F-1: opens through the mount that succeed, are refused (``ENOENT``, ``EISDIR``) or
    open directories, and listings, leave the daemon with the descriptors and threads it had
    after the first round; its ``ctx umount`` then ends it with nothing left."""
    where = world.top / "mnt"
    mount = start_mount(world, where)
    attempts = [
        (where / "tool" / "fs.read.d" / "name", os.O_RDONLY),
        (where / "tool" / "no-such-tool", os.O_RDONLY),
        (where / "tool", os.O_RDONLY | os.O_DIRECTORY),
        (where / "tool" / "fs.read.d", os.O_WRONLY),
        (where / "shared" / "proj" / "queue" / "config", os.O_RDONLY),
    ]

    def rounds(n: int) -> None:
        for i in range(n):
            for path, flags in attempts:
                with contextlib.suppress(OSError):
                    os.close(os.open(path, flags))
            if i % 50 == 0:
                os.listdir(where / "tool")

    try:
        rounds(50)
        inside = str(world.storage) + "/"
        # A close through FUSE reaches the daemon a moment later (RELEASE is asynchronous).
        assert wait_for(lambda: not any(t.startswith(inside) for t in fd_targets(mount.pid)), 5)
        fds, tasks = fd_targets(mount.pid), threads(mount.pid)
        rounds(400)
        assert wait_for(lambda: fd_targets(mount.pid) == fds, 5), (fds, fd_targets(mount.pid))
        assert wait_for(lambda: threads(mount.pid) <= tasks, 5)
        assert zombie_children(mount.pid) == []
        gone = world.ctx("umount", where)
        assert gone.rc == 0, gone
        mount.wait(timeout=30)
    finally:
        if mount.poll() is None:
            mount.kill()
            mount.wait()
    assert not mounted_at(where)


# ------------------------------------------------------------------------------ terminals


@needs_root
@needs_fuse
@needs_bwrap
def test_a_terminal_killed_by_sigkill_is_cleaned_up_by_stop_leaving_nothing_of_it(_template):
    """A-1, A-2, docs/tools.md "A terminal that was killed": after ``kill -9`` of ctxterm its
    view and mount process stay, as documented; ``ctx agent stop`` says it cleaned up, and then
    no process of the terminal (sandbox, tsh, view) is left, the view is unmounted, nothing of
    it stays under ``/run/cortexfs/terminal`` and the session's link is gone."""
    with coder_host(_template, TOP, [], {}) as host:
        term = host.start()
        rundir = term.rundir
        key_dir = Path("/run/cortexfs/terminal") / root_key(host.storage)
        alias = Path("/run/cortexfs/terminal") / str(host.uid) / "coder" / term.session
        ctxterm = int((rundir / "pid").read_text())
        family = [ctxterm, *descendants(ctxterm)]
        assert len(family) >= 3, family  # the view's mount process, the sandbox, tsh
        os.kill(ctxterm, signal.SIGKILL)
        assert wait_for(lambda: not alive(ctxterm), WAIT)
        assert mounts_under(str(rundir)), "the killed terminal's view is not mounted"

        stopped = host.ctx("agent", "stop", "coder", "--session", term.session)
        host.started.remove(term.session)
        assert stopped.rc == 0 and "cleaned up" in stopped.out, stopped
        assert none_alive(family), [p for p in family if alive(p)]
        assert mounts_under(str(key_dir)) == []
        assert not rundir.exists()
        assert not os.path.lexists(alias)
        assert not os.path.lexists(term.link)
        assert not key_dir.exists() or list(key_dir.rglob("*")) == []
        assert processes_naming(str(host.storage).encode()) == []


@needs_root
@needs_fuse
@needs_bwrap
def test_a_terminal_whose_sandbox_fails_to_start_leaves_nothing_running_or_mounted(_template):
    """A-1, docs/tools.md ("a sandbox that ends before tsh runs fails the start … with nothing
    left running or mounted"): a start refused by bubblewrap (a read-write mount target
    inside a read-only one) exits 1 naming the cause, and leaves no process, no view mount, no
    runtime directory of the root, no A-2 alias and no session link."""
    with coder_host(_template, TOP, [], {}) as host:
        outer, inner = host.top / "outer", host.top / "inner"
        outer.mkdir(mode=0o755)
        inner.mkdir(mode=0o755)
        request = {
            "name": "boxed",
            "label": "boxed_t",
            "mount": [[str(outer), "/outer", "ro"], [str(inner), "/outer/x", "rw"]],
        }
        made = host.ctx("agent", "create", "-", input=json.dumps(request))
        assert made.rc == 0, made
        key_dir = Path("/run/cortexfs/terminal") / root_key(host.storage)
        started = host.ctx("agent", "start", "boxed", "--session", "s1", cwd=host.ws)
        assert started.rc == 1 and "did not start" in started.err, started
        assert "Traceback" not in started.err
        assert processes_naming(str(host.storage).encode()) == []
        assert mounts_under(str(key_dir)) == []
        assert not key_dir.exists()
        alias = Path("/run/cortexfs/terminal") / str(host.uid) / "boxed" / "s1"
        assert not os.path.lexists(alias)
        session = host.storage / "home" / str(host.uid) / "agent" / "boxed" / "session" / "s1"
        assert not os.path.lexists(session / "terminal" / "main.sock")
        assert os.listdir(outer) == []  # nothing made in the read-only source either


# ------------------------------------------------------------------------------ ctxmcp

HANGING_SERVER = """\
import json, os, sys, time
for line in sys.stdin:
    message = json.loads(line)
    if message.get("method") == "initialize":
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": {
            "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
            "serverInfo": {"name": "hang", "version": "1"}}}), flush=True)
    elif message.get("method") == "tools/list":
        with open(sys.argv[1] + ".tmp", "w") as note:
            note.write(str(os.getpid()))
        os.rename(sys.argv[1] + ".tmp", sys.argv[1])
        time.sleep(3600)
"""


@pytest.mark.parametrize(
    "signum",
    [
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGINT,
        signal.SIGKILL,
    ],
)
def test_ctxmcp_ended_by_a_signal_leaves_no_server_running(world, signum):
    """M-1, docs/tools.md (ctxmcp: "SIGTERM or SIGHUP: it stops its server"): a ``ctxmcp
    list`` ended by a signal while its server hangs in ``tools/list`` leaves no server
    process behind, as a tool call's server never outlives the process that started it."""
    server = world.top / "hang.py"
    server.write_text(HANGING_SERVER)
    note = world.top / f"listing-{uuid.uuid4().hex}"
    config = world.top / "mcp.json"
    entry = {"command": sys.executable, "args": [str(server), str(note)]}
    config.write_text(json.dumps({"mcpServers": {"h": entry}}))
    client = subprocess.Popen(
        [CTXMCP, "list", "--config", str(config), "--server", "h"],
        env=world.env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    pid = None
    try:
        assert wait_for(note.exists, WAIT), client.poll()
        pid = int(note.read_text())
        os.kill(client.pid, signum)
        client.wait(timeout=30)
        assert "Traceback" not in client.stderr.read().decode()
        assert wait_for(lambda: not alive(pid), 3), f"server pid {pid} still runs"
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
        client.stderr.close()
        if pid is not None and alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert processes_naming(str(server).encode()) == []
